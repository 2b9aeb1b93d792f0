//! Rule D1: the dispatch fence reads the oracle first, then the coordinator.

use fencepost::clock::ManualClock;
use fencepost::fence::{check_dispatch, FenceDecision};
use fencepost::fold::{fold, SyncState};
use fencepost::lease::{
    BackendError, InMemoryLeaseCoordinator, Intent, IntentStatus, Lease, LeaseCoordinator, LeaseError,
};
use fencepost::oplog::{DeviceLog, Surface};

const TTL_MS: u64 = 10_000;

#[test]
fn d1_the_holder_at_its_epoch_may_proceed() {
    let clock = ManualClock::new(0);
    let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    let decision = check_dispatch(
        &coordinator,
        &SyncState::new(),
        "milo",
        "run-1",
        "laptop",
        lease.epoch,
    )
    .unwrap();
    assert_eq!(decision, FenceDecision::Proceed);
    assert!(decision.may_dispatch());
}

#[test]
fn d1_a_committed_run_is_refused_before_the_coordinator_is_asked() {
    let clock = ManualClock::new(0);
    let mut log = DeviceLog::new("phone", clock.wall_clock()).unwrap();
    let commit = log.append(
        Surface::Intent,
        Intent::new("milo", "run-1", 1, IntentStatus::Committed).payload(),
    );
    let state = fold(std::slice::from_ref(&commit));
    // A coordinator that fails on every call: the oracle answers first, so it is never reached.
    let decision = check_dispatch(&FailingCoordinator, &state, "milo", "run-1", "laptop", 2).unwrap();
    assert_eq!(
        decision,
        FenceDecision::AlreadyCommitted {
            committed_op_id: commit.op_id
        }
    );
    assert!(!decision.may_dispatch());
    // Another run of the same agent does reach the coordinator, whose failure is an error.
    assert!(matches!(
        check_dispatch(&FailingCoordinator, &state, "milo", "run-2", "laptop", 2),
        Err(LeaseError::Backend(BackendError {
            may_have_applied: false,
            ..
        }))
    ));
}

#[test]
fn d1_no_holder_is_not_held() {
    let coordinator = InMemoryLeaseCoordinator::new(ManualClock::new(0).wall_clock());
    let decision = check_dispatch(&coordinator, &SyncState::new(), "milo", "run-1", "laptop", 3).unwrap();
    assert_eq!(decision, FenceDecision::NotHeld { claimed_epoch: 3 });
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    coordinator.release("milo", "laptop", lease.epoch).unwrap();
    let decision = check_dispatch(
        &coordinator,
        &SyncState::new(),
        "milo",
        "run-1",
        "laptop",
        lease.epoch,
    )
    .unwrap();
    assert_eq!(decision, FenceDecision::NotHeld { claimed_epoch: 1 });
    assert!(!decision.may_dispatch());
}

#[test]
fn d1_a_zombie_after_a_steal_gets_stale_epoch() {
    let clock = ManualClock::new(0);
    let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
    let zombie = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    clock.advance(TTL_MS); // the laptop pauses past its TTL
    let thief = coordinator.acquire("milo", "phone", TTL_MS).unwrap();
    let decision = check_dispatch(
        &coordinator,
        &SyncState::new(),
        "milo",
        "run-1",
        "laptop",
        zombie.epoch,
    )
    .unwrap();
    assert_eq!(
        decision,
        FenceDecision::StaleEpoch {
            claimed_epoch: 1,
            current_epoch: thief.epoch,
            current_holder: "phone".into()
        }
    );
    // The right device with a wrong epoch is stale too.
    let decision = check_dispatch(
        &coordinator,
        &SyncState::new(),
        "milo",
        "run-1",
        "phone",
        zombie.epoch,
    )
    .unwrap();
    assert!(
        matches!(decision, FenceDecision::StaleEpoch { current_holder, .. } if current_holder == "phone")
    );
}

/// A coordinator whose storage is down.
struct FailingCoordinator;

impl FailingCoordinator {
    fn failure() -> LeaseError {
        LeaseError::Backend(BackendError {
            backend: "test",
            message: "storage is down".into(),
            may_have_applied: false,
            transient: true,
            source: None,
        })
    }
}

impl LeaseCoordinator for FailingCoordinator {
    fn acquire(&self, _: &str, _: &str, _: u64) -> Result<Lease, LeaseError> {
        Err(Self::failure())
    }
    fn renew(&self, _: &str, _: &str, _: u64, _: u64) -> Result<Lease, LeaseError> {
        Err(Self::failure())
    }
    fn release(&self, _: &str, _: &str, _: u64) -> Result<(), LeaseError> {
        Err(Self::failure())
    }
    fn current(&self, _: &str) -> Result<Option<Lease>, LeaseError> {
        Err(Self::failure())
    }
    fn raise_epoch_floor(&self, _: &str, _: u64) -> Result<(), LeaseError> {
        Err(Self::failure())
    }
    fn publish_frontier(
        &self,
        _: &str,
        _: &str,
        _: u64,
        _: &fencepost::relay::Frontier,
    ) -> Result<(), LeaseError> {
        Err(Self::failure())
    }
    fn published_frontier(&self, _: &str) -> Result<fencepost::relay::Frontier, LeaseError> {
        Err(Self::failure())
    }
}
