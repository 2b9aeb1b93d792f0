//! The conformance suite: the contract (rules L1–L8, D1, H1, H4) that every [`LeaseCoordinator`]
//! must pass,
//! and in [`relay`] rule R1, which every [`Relay`](crate::relay::Relay) must pass.
//!
//! Enabled by the `conformance` feature. A backend's test file implements [`Harness`] (how to make a
//! fresh store and how to move its clock) and calls every rule function; each panics, with a message
//! naming the rule, when the coordinator breaks it.
//!
//! ```
//! use fencepost::clock::ManualClock;
//! use fencepost::conformance::{self, Harness, Opener};
//! use fencepost::lease::{InMemoryLeaseCoordinator, LeaseCoordinator};
//!
//! struct Memory(ManualClock);
//! impl Harness for Memory {
//!     fn fresh_store(&self) -> Opener {
//!         let coordinator = InMemoryLeaseCoordinator::new(self.0.wall_clock());
//!         Box::new(move || Box::new(coordinator.clone()) as Box<dyn LeaseCoordinator>)
//!     }
//!     fn advance(&self, ms: u64) { self.0.advance(ms) }
//!     fn now_ms(&self) -> Option<u64> { Some(self.0.now_ms()) }
//!     fn durable(&self) -> bool { false }
//! }
//! conformance::run_all(&Memory(ManualClock::new(1_000)));
//! ```
//!
//! Rule L6 is checked twice: directly (concurrent acquires have one winner) and by recording real
//! concurrent histories and checking them against the sequential model of a lease register with
//! `todc-utils`' implementation of the Wing–Gong–Lowe linearizability checker
//! ([`check_history`]). Rule L7 needs a coordinator whose storage fails, which only the backend can
//! build: [`l7_a_backend_failure_is_an_error_not_a_verdict`].

use std::collections::BTreeSet;
use std::sync::{Barrier, Mutex, PoisonError};

use crate::fence::{check_dispatch, FenceDecision};
use crate::fold::{fold, SyncState};
use crate::id::MAX_ID_BYTES;
use crate::lease::{
    expiry_after, Intent, IntentStatus, Lease, LeaseCoordinator, LeaseError, MAX_EPOCH, MAX_EPOCH_FLOOR,
    MAX_TTL_MS,
};
use crate::oplog::{DeviceLog, Surface};

mod handoff;
mod linearizability;
pub use handoff::{
    h1_the_holder_publishes_a_monotone_cumulative_frontier, h1_the_published_heads_name_the_records,
    h2_h3_the_combined_calls_act_as_their_parts, h4_the_published_frontier_survives_reopening,
};
pub use linearizability::*;

pub mod relay;

/// Opens a coordinator on one store; every call gives another handle (connection) on the same store.
pub type Opener = Box<dyn Fn() -> Box<dyn LeaseCoordinator> + Send + Sync>;

/// What the suite needs from a backend.
pub trait Harness: Sync {
    /// A new, empty store, and the way to open coordinators on it.
    fn fresh_store(&self) -> Opener;
    /// Moves the coordinator's clock forward by `ms`.
    fn advance(&self, ms: u64);
    /// The coordinator clock's reading, when the harness knows it exactly (to check
    /// `expires_at_ms = now + ttl_ms`).
    fn now_ms(&self) -> Option<u64>;
    /// Whether the store keeps its leases when every handle is dropped (durable backends).
    fn durable(&self) -> bool;
    /// The TTL the suite gives leases; every wait is expressed in fractions and multiples of it.
    fn ttl_ms(&self) -> u64 {
        10_000
    }
}

/// Runs every rule function that applies to any backend (all but L7).
pub fn run_all(harness: &dyn Harness) {
    l1_acquire_grants_a_free_or_expired_agent_and_refuses_a_valid_lease(harness);
    l2_renew_extends_the_holders_lease_until_stolen(harness);
    l3_release_clears_the_holder_and_keeps_the_epoch(harness);
    l4_current_reports_the_holder_expired_or_not(harness);
    l5_epochs_never_repeat_or_regress(harness);
    l5_the_last_epoch_is_minted_once_and_never_clamped(harness);
    l6_concurrent_acquires_have_exactly_one_winner(harness);
    l6_recorded_histories_are_linearizable(harness, &HistoryConfig::default());
    l8_bad_input_is_a_clear_error_and_changes_nothing(harness);
    d1_the_fence_reads_the_oracle_then_the_coordinator(harness);
    h1_the_holder_publishes_a_monotone_cumulative_frontier(harness);
    h1_the_published_heads_name_the_records(harness);
    h2_h3_the_combined_calls_act_as_their_parts(harness);
    h4_the_published_frontier_survives_reopening(harness);
}

fn open_one(harness: &dyn Harness) -> Box<dyn LeaseCoordinator> {
    (harness.fresh_store())()
}

fn expect_held(result: Result<Lease, LeaseError>, rule: &str) -> (String, u64, u64) {
    match result {
        Err(LeaseError::Held {
            holder,
            epoch,
            expires_at_ms,
            ..
        }) => (holder, epoch, expires_at_ms),
        other => panic!("{rule}: expected Held, got {other:?}"),
    }
}

fn expect_lost(result: Result<impl std::fmt::Debug, LeaseError>, rule: &str) -> (u64, u64) {
    match result {
        Err(LeaseError::Lost {
            claimed_epoch,
            current_epoch,
            ..
        }) => (claimed_epoch, current_epoch),
        other => panic!("{rule}: expected Lost, got {other:?}"),
    }
}

/// L1: a free agent is granted (epoch 1 from the reference, at least 1 from any backend) with
/// expiry `now + ttl`; a still-valid lease (the caller's own included) is `Held` with the holder's
/// details; an expired one is granted again with a higher epoch; expiry saturates.
pub fn l1_acquire_grants_a_free_or_expired_agent_and_refuses_a_valid_lease(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    let lease = coordinator
        .acquire("l1", "laptop", ttl)
        .expect("L1: a free agent is granted");
    assert_eq!(
        (lease.agent_id.as_str(), lease.holder.as_str()),
        ("l1", "laptop"),
        "L1"
    );
    assert!(lease.epoch >= 1, "L1: epoch {}", lease.epoch);
    if let Some(now) = harness.now_ms() {
        assert_eq!(lease.expires_at_ms, now + ttl, "L1: expires_at_ms = now + ttl_ms");
    }
    for device in ["laptop", "phone"] {
        let (holder, epoch, expires_at_ms) = expect_held(coordinator.acquire("l1", device, ttl), "L1");
        assert_eq!(
            (holder.as_str(), epoch, expires_at_ms),
            ("laptop", lease.epoch, lease.expires_at_ms),
            "L1"
        );
    }
    harness.advance(ttl / 2);
    expect_held(
        coordinator.acquire("l1", "phone", ttl),
        "L1: still valid half-way",
    );
    harness.advance(ttl);
    let stolen = coordinator
        .acquire("l1", "phone", ttl)
        .expect("L1: an expired lease is granted again");
    assert_eq!(stolen.holder.as_str(), "phone", "L1");
    assert!(stolen.epoch > lease.epoch, "L1: a higher epoch");
    let long = coordinator
        .acquire("l1-long", "laptop", MAX_TTL_MS)
        .expect("L1: the longest TTL");
    if let Some(now) = harness.now_ms() {
        assert_eq!(
            long.expires_at_ms,
            expiry_after(now, MAX_TTL_MS),
            "L1: saturating expiry"
        );
    }
}

/// L2: renew succeeds for the holder at its epoch, even past expiry while nobody took the lease,
/// extends the expiry and never bumps the epoch; any other caller, epoch, or a stolen, released or
/// never-held lease is `Lost` (with `current_epoch` 0 when never held), and changes nothing.
pub fn l2_renew_extends_the_holders_lease_until_stolen(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    assert_eq!(
        expect_lost(coordinator.renew("l2", "laptop", 1, ttl), "L2: never held"),
        (1, 0)
    );
    let lease = coordinator.acquire("l2", "laptop", ttl).expect("L2 setup");
    expect_lost(
        coordinator.renew("l2", "phone", lease.epoch, ttl),
        "L2: another device",
    );
    assert_eq!(
        expect_lost(
            coordinator.renew("l2", "laptop", lease.epoch + 1, ttl),
            "L2: another epoch"
        ),
        (lease.epoch + 1, lease.epoch)
    );
    assert_eq!(
        coordinator.current("l2").expect("L2"),
        Some(lease.clone()),
        "L2: a failed renew changes nothing"
    );
    harness.advance(ttl * 2); // expired, but nobody took it
    let renewed = coordinator
        .renew("l2", "laptop", lease.epoch, ttl)
        .expect("L2: renew past expiry");
    assert_eq!(renewed.epoch, lease.epoch, "L2: renew never bumps the epoch");
    assert!(
        renewed.expires_at_ms > lease.expires_at_ms,
        "L2: renew extends the expiry"
    );
    if let Some(now) = harness.now_ms() {
        assert_eq!(
            renewed.expires_at_ms,
            now + ttl,
            "L2: expires_at_ms = now + ttl_ms"
        );
    }
    harness.advance(ttl / 2);
    expect_held(
        coordinator.acquire("l2", "phone", ttl),
        "L2: the renewed lease is valid",
    );
    harness.advance(ttl);
    let stolen = coordinator.acquire("l2", "phone", ttl).expect("L2 setup: steal");
    assert_eq!(
        expect_lost(coordinator.renew("l2", "laptop", lease.epoch, ttl), "L2: stolen"),
        (lease.epoch, stolen.epoch)
    );
}

/// L3: release by the holder at its epoch clears the holder and keeps the epoch, so the next
/// acquire succeeds at once with the next epoch; any other release is `Lost` and changes nothing.
pub fn l3_release_clears_the_holder_and_keeps_the_epoch(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    expect_lost(coordinator.release("l3", "laptop", 1), "L3: never held");
    let lease = coordinator.acquire("l3", "laptop", ttl).expect("L3 setup");
    expect_lost(
        coordinator.release("l3", "phone", lease.epoch),
        "L3: another device",
    );
    expect_lost(
        coordinator.release("l3", "laptop", lease.epoch + 1),
        "L3: another epoch",
    );
    assert_eq!(
        coordinator.current("l3").expect("L3"),
        Some(lease.clone()),
        "L3: nothing changed"
    );
    coordinator
        .release("l3", "laptop", lease.epoch)
        .expect("L3: the holder releases");
    assert_eq!(
        coordinator.current("l3").expect("L3"),
        None,
        "L3: no holder after release"
    );
    assert_eq!(
        expect_lost(
            coordinator.release("l3", "laptop", lease.epoch),
            "L3: released twice"
        ),
        (lease.epoch, lease.epoch),
        "L3: the epoch is kept"
    );
    let next = coordinator
        .acquire("l3", "phone", ttl)
        .expect("L3: acquire right after release");
    assert!(
        next.epoch > lease.epoch,
        "L3: a new epoch, without waiting out the TTL"
    );
}

/// L4: `current` is `None` for an agent never held or released, and `Some(lease)` while a holder
/// is set, expired or not.
pub fn l4_current_reports_the_holder_expired_or_not(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    assert_eq!(coordinator.current("l4").expect("L4"), None, "L4: never held");
    let lease = coordinator.acquire("l4", "laptop", ttl).expect("L4 setup");
    assert_eq!(
        coordinator.current("l4").expect("L4"),
        Some(lease.clone()),
        "L4: the holder"
    );
    harness.advance(ttl * 2);
    assert_eq!(
        coordinator.current("l4").expect("L4"),
        Some(lease.clone()),
        "L4: expired but not taken"
    );
    coordinator
        .release("l4", "laptop", lease.epoch)
        .expect("L4 setup");
    assert_eq!(coordinator.current("l4").expect("L4"), None, "L4: released");
}

/// L5 at the top of the epoch range: the last epoch ([`MAX_EPOCH`]) is granted once, the next
/// acquire is refused with [`LeaseError::EpochsExhausted`] (never the same epoch again), and a
/// claimed epoch above the range is `Lost` without touching the real holder's lease.
pub fn l5_the_last_epoch_is_minted_once_and_never_clamped(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    coordinator
        .raise_epoch_floor("l5-top", MAX_EPOCH_FLOOR)
        .expect("L5 setup");
    let last = coordinator.acquire("l5-top", "laptop", ttl).expect("L5");
    assert_eq!(last.epoch, MAX_EPOCH, "L5: the last epoch is granted");
    for claimed in [MAX_EPOCH + 1, u64::MAX] {
        assert!(
            matches!(
                coordinator.renew("l5-top", "laptop", claimed, ttl * 10),
                Err(LeaseError::Lost { .. })
            ),
            "L5: renew of epoch {claimed}, above the range, is Lost"
        );
        assert!(
            matches!(
                coordinator.release("l5-top", "laptop", claimed),
                Err(LeaseError::Lost { .. })
            ),
            "L5: release of epoch {claimed}, above the range, is Lost"
        );
    }
    assert_eq!(
        coordinator.current("l5-top").expect("L5"),
        Some(last.clone()),
        "L5: a claim above the range changed nothing"
    );
    coordinator.release("l5-top", "laptop", last.epoch).expect("L5");
    match coordinator.acquire("l5-top", "phone", ttl) {
        Err(LeaseError::EpochsExhausted { last_epoch, .. }) => assert_eq!(last_epoch, MAX_EPOCH),
        other => panic!("L5: no epoch after the last one, got {other:?}"),
    }
}

/// L5: epochs increase and never repeat across steals and releases (the reference counts 1, 2,
/// 3, …; a durable backend may mint at its epoch clock, above the last); agents are independent;
/// the epoch floor is monotone and idempotent and makes the next grant `floor + 1` (a floor above
/// any clock); for durable backends, epochs and floors survive reopening the store.
pub fn l5_epochs_never_repeat_or_regress(harness: &dyn Harness) {
    let open = harness.fresh_store();
    let ttl = harness.ttl_ms();
    let coordinator = open();
    let mut epochs = Vec::new();
    for round in 0..8u64 {
        let device = if round % 2 == 0 { "laptop" } else { "phone" };
        let lease = coordinator.acquire("l5", device, ttl).expect("L5");
        epochs.push(lease.epoch);
        if round % 3 == 0 {
            coordinator.release("l5", device, lease.epoch).expect("L5");
        } else {
            harness.advance(ttl + 1);
        }
    }
    assert!(
        epochs.windows(2).all(|pair| pair[0] < pair[1]) && epochs[0] >= 1,
        "L5: increasing, never repeated: {epochs:?}"
    );
    // Far above any clock in milliseconds (about 300 years from 1970), so the floor decides.
    let floor = 10_000_000_000_000 + epochs[7];
    coordinator.raise_epoch_floor("l5-floor", floor).expect("L5");
    coordinator
        .raise_epoch_floor("l5-floor", floor)
        .expect("L5: idempotent");
    coordinator
        .raise_epoch_floor("l5-floor", 3)
        .expect("L5: a lower floor is accepted");
    let other = coordinator.acquire("l5-other", "laptop", ttl).expect("L5").epoch;
    assert!(
        other < floor,
        "L5: agents are independent (another agent's floor is not this one's)"
    );
    let first = coordinator.acquire("l5-floor", "laptop", ttl).expect("L5");
    assert_eq!(first.epoch, floor + 1, "L5: the next grant is floor + 1");
    coordinator.raise_epoch_floor("l5-floor", 10).expect("L5");
    harness.advance(ttl + 1);
    assert_eq!(
        coordinator.acquire("l5-floor", "phone", ttl).expect("L5").epoch,
        floor + 2,
        "L5: never lowered"
    );
    coordinator
        .raise_epoch_floor("l5-floor", floor + 100)
        .expect("L5");
    assert_eq!(
        coordinator.current("l5-floor").expect("L5").map(|l| l.epoch),
        Some(floor + 2),
        "L5: the holder keeps its lease"
    );
    assert!(
        matches!(
            coordinator.raise_epoch_floor("l5-floor", MAX_EPOCH_FLOOR + 1),
            Err(LeaseError::InvalidEpochFloor { .. })
        ),
        "L5: a floor above MAX_EPOCH_FLOOR is refused"
    );

    if harness.durable() {
        drop(coordinator);
        let reopened = open();
        harness.advance(ttl + 1);
        let again = reopened.acquire("l5", "laptop", ttl).expect("L5").epoch;
        assert!(
            again > epochs[7],
            "L5: durable epochs ({again} after {})",
            epochs[7]
        );
        assert_eq!(
            reopened.acquire("l5-floor", "laptop", ttl).expect("L5").epoch,
            floor + 101,
            "L5: durable floor"
        );
    }
}

/// L6: of concurrent acquires on a free agent (each thread with its own handle), exactly one wins;
/// and sixteen threads contending in rounds never see two holders and get unique epochs.
pub fn l6_concurrent_acquires_have_exactly_one_winner(harness: &dyn Harness) {
    let open = harness.fresh_store();
    let ttl = harness.ttl_ms();
    for round in 0..10 {
        let agent = format!("l6-{round}");
        let barrier = Barrier::new(8);
        let winners = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|thread| {
                    let coordinator = open();
                    let (barrier, agent) = (&barrier, &agent);
                    scope.spawn(move || {
                        barrier.wait();
                        coordinator.acquire(agent, &format!("d{thread}"), ttl).is_ok()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("L6 thread"))
                .filter(|won| *won)
                .count()
        });
        assert_eq!(
            winners, 1,
            "L6: exactly one of 8 concurrent acquires wins (round {round})"
        );
    }

    const THREADS: usize = 16;
    const ROUNDS: usize = 25;
    let granted: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    // Threads report violations here instead of panicking, so that none is left waiting at the
    // barrier for a thread that died.
    let violations: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let coordinator = open();
            let (granted, violations, barrier) = (&granted, &violations, &barrier);
            scope.spawn(move || {
                let device = format!("device-{thread}");
                let report = |violation: String| {
                    violations
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(violation)
                };
                for _ in 0..ROUNDS {
                    barrier.wait();
                    if let Ok(lease) = coordinator.acquire("l6-contended", &device, ttl) {
                        match coordinator.current("l6-contended") {
                            Ok(Some(current)) if current.holder == device => {}
                            other => report(format!(
                                "L6: {device} holds epoch {} but current() is {other:?}",
                                lease.epoch
                            )),
                        }
                        granted
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(lease.epoch);
                        if let Err(error) = coordinator.release("l6-contended", &device, lease.epoch) {
                            report(format!(
                                "L6: {device} could not release epoch {}: {error}",
                                lease.epoch
                            ));
                        }
                    }
                    barrier.wait();
                }
            });
        }
    });
    let violations = violations.into_inner().unwrap_or_else(PoisonError::into_inner);
    assert!(violations.is_empty(), "L6: {violations:?}");
    let granted = granted.into_inner().unwrap_or_else(PoisonError::into_inner);
    let unique: BTreeSet<u64> = granted.iter().copied().collect();
    assert_eq!(unique.len(), granted.len(), "L6: an epoch was granted twice");
    assert!(granted.len() >= ROUNDS, "L6: at least one grant per round");
}

/// L7: on a coordinator whose storage fails, every operation returns [`LeaseError::Backend`] (never
/// a verdict: not `Held`, not `Lost`, not a lease), with a message that says what failed and whether
/// the operation may have taken effect.
pub fn l7_a_backend_failure_is_an_error_not_a_verdict(failing: &dyn LeaseCoordinator) {
    let results: Vec<(&str, Result<String, LeaseError>)> = vec![
        (
            "acquire",
            failing.acquire("l7", "laptop", 1_000).map(|l| format!("{l:?}")),
        ),
        (
            "renew",
            failing.renew("l7", "laptop", 1, 1_000).map(|l| format!("{l:?}")),
        ),
        (
            "release",
            failing.release("l7", "laptop", 1).map(|()| "released".to_owned()),
        ),
        ("current", failing.current("l7").map(|l| format!("{l:?}"))),
        (
            "raise_epoch_floor",
            failing.raise_epoch_floor("l7", 5).map(|()| "raised".to_owned()),
        ),
    ];
    for (operation, result) in results {
        match result {
            Err(LeaseError::Backend(error)) => {
                let message = error.to_string();
                assert!(
                    !error.message.is_empty(),
                    "L7: {operation}: the error says what failed"
                );
                assert!(
                    message.contains("effect"),
                    "L7: {operation}: the error says whether it may have applied: {message}"
                );
            }
            other => panic!("L7: {operation} on failing storage must be a Backend error, got {other:?}"),
        }
    }
}

/// L8: empty, over-long or control-character ids, and TTLs of 0 or above [`MAX_TTL_MS`], are clear
/// errors on every method, and change nothing.
pub fn l8_bad_input_is_a_clear_error_and_changes_nothing(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    let long = "x".repeat(MAX_ID_BYTES + 1);
    for bad in ["", "tab\t", "line\n", "nul\0", long.as_str()] {
        let invalid = |result: Result<(), LeaseError>, what: &str| {
            assert!(
                matches!(result, Err(LeaseError::InvalidId(_))),
                "L8: {what} with {bad:?} must be InvalidId, got {result:?}"
            );
        };
        invalid(coordinator.acquire(bad, "laptop", ttl).map(drop), "acquire agent");
        invalid(coordinator.acquire("l8", bad, ttl).map(drop), "acquire device");
        invalid(coordinator.renew(bad, "laptop", 1, ttl).map(drop), "renew agent");
        invalid(coordinator.renew("l8", bad, 1, ttl).map(drop), "renew device");
        invalid(coordinator.release(bad, "laptop", 1), "release agent");
        invalid(coordinator.release("l8", bad, 1), "release device");
        invalid(coordinator.current(bad).map(drop), "current");
        invalid(coordinator.raise_epoch_floor(bad, 1), "raise_epoch_floor");
    }
    for bad_ttl in [0, MAX_TTL_MS + 1, u64::MAX] {
        let error = coordinator
            .acquire("l8", "laptop", bad_ttl)
            .expect_err("L8: bad TTL");
        assert!(
            matches!(error, LeaseError::InvalidTtl { .. }),
            "L8: TTL {bad_ttl}: {error:?}"
        );
        assert!(
            error.to_string().contains("ttl_ms"),
            "L8: the error names the TTL"
        );
    }
    assert_eq!(
        coordinator.current("l8").expect("L8"),
        None,
        "L8: nothing was granted"
    );
    let lease = coordinator
        .acquire("l8", "laptop", ttl)
        .expect("L8: valid input still works");
    for bad_ttl in [0, MAX_TTL_MS + 1] {
        assert!(matches!(
            coordinator.renew("l8", "laptop", lease.epoch, bad_ttl),
            Err(LeaseError::InvalidTtl { .. })
        ));
    }
    assert_eq!(
        coordinator.current("l8").expect("L8"),
        Some(lease),
        "L8: a refused renew changed nothing"
    );
    let held = coordinator
        .acquire("l8", "phone", ttl)
        .expect_err("L8 setup")
        .to_string();
    assert!(
        held.contains("held by \"laptop\""),
        "L8: Held says who holds it: {held}"
    );
}

/// D1: with this coordinator, the fence answers `Proceed` only to the holder at its epoch,
/// `AlreadyCommitted` whenever the ledger has the run's commit, `NotHeld` without a holder, and
/// `StaleEpoch` to a zombie.
pub fn d1_the_fence_reads_the_oracle_then_the_coordinator(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    let empty = SyncState::new();
    assert_eq!(
        check_dispatch(&*coordinator, &empty, "d1", "run-1", "laptop", 1).expect("D1"),
        FenceDecision::NotHeld { claimed_epoch: 1 },
        "D1: no holder"
    );
    let zombie = coordinator.acquire("d1", "laptop", ttl).expect("D1 setup");
    assert_eq!(
        check_dispatch(&*coordinator, &empty, "d1", "run-1", "laptop", zombie.epoch).expect("D1"),
        FenceDecision::Proceed,
        "D1: the holder at its epoch"
    );
    harness.advance(ttl + 1);
    let holder = coordinator.acquire("d1", "phone", ttl).expect("D1 setup");
    assert_eq!(
        check_dispatch(&*coordinator, &empty, "d1", "run-1", "laptop", zombie.epoch).expect("D1"),
        FenceDecision::StaleEpoch {
            claimed_epoch: zombie.epoch,
            current_epoch: holder.epoch,
            current_holder: "phone".to_owned()
        },
        "D1: a zombie"
    );
    let clock = crate::clock::ManualClock::new(1);
    let mut log = DeviceLog::new("phone", clock.wall_clock()).expect("D1 setup");
    let commit = log.append(
        Surface::Intent,
        Intent::new("d1", "run-1", holder.epoch, IntentStatus::Committed).payload(),
    );
    let state = fold(std::slice::from_ref(&commit));
    for (device, epoch) in [("phone", holder.epoch), ("laptop", zombie.epoch)] {
        assert_eq!(
            check_dispatch(&*coordinator, &state, "d1", "run-1", device, epoch).expect("D1"),
            FenceDecision::AlreadyCommitted {
                committed_op_id: commit.op_id
            },
            "D1: the oracle answers first"
        );
    }
    coordinator
        .release("d1", "phone", holder.epoch)
        .expect("D1 setup");
    assert_eq!(
        check_dispatch(&*coordinator, &state, "d1", "run-2", "phone", holder.epoch).expect("D1"),
        FenceDecision::NotHeld {
            claimed_epoch: holder.epoch
        },
        "D1: released"
    );
}

/// L6: `config.histories` recorded concurrent histories, with leases expiring mid-run, are all
/// linearizable.
pub fn l6_recorded_histories_are_linearizable(harness: &dyn Harness, config: &HistoryConfig) {
    for history in 0..config.histories {
        let events = record_thread_history(harness, config, history as u64);
        let operations = events.len() / 2;
        assert!(
            operations >= config.threads * config.operations_per_thread,
            "L6: the history is complete"
        );
        assert!(
            check_history(events.clone()),
            "L6: history {history} ({operations} operations) is not linearizable: {events:?}"
        );
    }
}
