//! The lease keeper: background renewal, the renew deadline, one loss signal, shutdown and
//! hand-over. Time is a `ManualClock`; failures come from a coordinator wrapper.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencepost::clock::ManualClock;
use fencepost::keeper::{KeeperClock, KeeperConfig, KeeperError, LeaseKeeper, LossReason, Shutdown};
use fencepost::lease::{BackendError, InMemoryLeaseCoordinator, Lease, LeaseCoordinator, LeaseError};

const START_MS: u64 = 1_000_000;

/// An in-memory coordinator whose renewals can be made to fail or to hang.
struct Flaky {
    inner: InMemoryLeaseCoordinator,
    fail_renewals: AtomicBool,
    renewals: AtomicUsize,
    /// While locked by the test, renewals wait.
    gate: Mutex<()>,
}

impl Flaky {
    fn new(clock: &ManualClock) -> Arc<Self> {
        Arc::new(Self {
            inner: InMemoryLeaseCoordinator::new(clock.wall_clock()),
            fail_renewals: AtomicBool::new(false),
            renewals: AtomicUsize::new(0),
            gate: Mutex::new(()),
        })
    }

    fn renewals(&self) -> usize {
        self.renewals.load(Ordering::SeqCst)
    }
}

impl LeaseCoordinator for Flaky {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        self.inner.acquire(agent_id, device_id, ttl_ms)
    }
    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        drop(self.gate.lock().unwrap());
        let outcome = if self.fail_renewals.load(Ordering::SeqCst) {
            Err(LeaseError::Backend(BackendError {
                backend: "flaky",
                message: "connection reset".into(),
                may_have_applied: false,
                source: None,
            }))
        } else {
            self.inner.renew(agent_id, device_id, epoch, ttl_ms)
        };
        self.renewals.fetch_add(1, Ordering::SeqCst);
        outcome
    }
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        self.inner.release(agent_id, device_id, epoch)
    }
    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        self.inner.current(agent_id)
    }
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        self.inner.raise_epoch_floor(agent_id, floor)
    }
}

/// TTL 1000, renew every 300, deadline 700, retry every 100, acquire every 100.
fn config() -> KeeperConfig {
    KeeperConfig {
        ttl_ms: 1_000,
        renew_every_ms: 300,
        renew_deadline_ms: 700,
        retry_every_ms: 100,
        acquire_every_ms: 100,
    }
}

/// Waits (real time, at most 10 s) until `condition` holds.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn keeper(coordinator: Arc<Flaky>, clock: &ManualClock, losses: &Arc<AtomicUsize>) -> LeaseKeeper {
    let losses = Arc::clone(losses);
    LeaseKeeper::builder(coordinator, "milo", "laptop")
        .config(config())
        .clock(KeeperClock::manual(clock))
        .on_lost(move |_| {
            losses.fetch_add(1, Ordering::SeqCst);
        })
        .acquire()
        .unwrap()
}

#[test]
fn keeper_config_is_validated_with_clear_errors() {
    let cases = [
        (
            KeeperConfig {
                renew_deadline_ms: 1_000,
                ..config()
            },
            "below ttl_ms",
        ),
        (
            KeeperConfig {
                renew_every_ms: 650,
                ..config()
            },
            "no room for one retry",
        ),
        (
            KeeperConfig {
                retry_every_ms: 0,
                ..config()
            },
            "retry_every_ms must be at least 1",
        ),
        (
            KeeperConfig {
                ttl_ms: 0,
                ..config()
            },
            "not a TTL",
        ),
    ];
    for (bad, expected) in cases {
        let message = bad.validate().unwrap_err().to_string();
        assert!(message.contains(expected), "{bad:?}: {message}");
        let clock = ManualClock::new(START_MS);
        let refused = LeaseKeeper::builder(Flaky::new(&clock), "milo", "laptop")
            .config(bad)
            .acquire();
        assert!(matches!(refused, Err(KeeperError::InvalidConfig(_))));
    }
    assert!(config().validate().is_ok() && KeeperConfig::new(30_000).validate().is_ok());
    let clock = ManualClock::new(START_MS);
    let refused = LeaseKeeper::builder(Flaky::new(&clock), "milo\n", "laptop")
        .config(config())
        .acquire();
    assert!(
        matches!(refused, Err(KeeperError::Lease(LeaseError::InvalidId(_)))),
        "L8"
    );
}

#[test]
fn keeper_renews_in_the_background_and_transient_errors_shorter_than_the_deadline_keep_the_lease() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &clock, &losses);
    assert_eq!((keeper.epoch(), keeper.expires_at_ms()), (1, START_MS + 1_000));

    clock.advance(300);
    eventually("the first renewal", || keeper.expires_at_ms() == START_MS + 1_300);
    assert_eq!(coordinator.renewals(), 1);

    // Renewals fail from 300 to 500 ms after the last success (deadline 700): retried every
    // 100 ms, the lease is kept.
    coordinator.fail_renewals.store(true, Ordering::SeqCst);
    for (step, expected_renewals) in [(300, 2), (100, 3), (100, 4)] {
        clock.advance(step);
        eventually("a retry", || coordinator.renewals() == expected_renewals);
        assert!(keeper.holds(), "within the deadline");
    }
    coordinator.fail_renewals.store(false, Ordering::SeqCst);
    clock.advance(100);
    eventually("the renewal after the errors", || coordinator.renewals() == 5);
    eventually("the new expiry", || {
        keeper.expires_at_ms() == clock.now_ms() + 1_000
    });
    assert!(keeper.holds());
    assert_eq!(keeper.loss(), None);
    assert_eq!(losses.load(Ordering::SeqCst), 0);
    assert_eq!(
        coordinator.current("milo").unwrap().unwrap().epoch,
        1,
        "the same epoch throughout"
    );
    assert_eq!(keeper.shutdown().unwrap(), Shutdown::Released { epoch: 1 });
}

#[test]
fn keeper_errors_longer_than_the_deadline_lose_the_lease_once() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &clock, &losses);
    coordinator.fail_renewals.store(true, Ordering::SeqCst);
    clock.advance(300);
    eventually("the failed renewal", || coordinator.renewals() == 1);
    for _ in 0..3 {
        clock.advance(100);
        assert!(keeper.holds());
    }
    clock.advance(100); // 700 ms after the last success
    assert!(
        !keeper.holds(),
        "held by the keeper's clock, not the coordinator's TTL"
    );
    assert!(keeper.guard().is_none());
    let loss = keeper.wait_lost(Duration::from_secs(10)).expect("lost");
    assert!(
        matches!(&loss.reason, LossReason::DeadlinePassed { last_error: Some(error) } if error.contains("connection reset")),
        "{loss:?}"
    );
    assert_eq!(loss.epoch, 1);
    clock.advance(10_000);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        losses.load(Ordering::SeqCst),
        1,
        "the loss is signalled exactly once"
    );
    assert!(matches!(keeper.shutdown().unwrap(), Shutdown::Lost(_)));
    assert_eq!(losses.load(Ordering::SeqCst), 1);
}

#[test]
fn keeper_holds_by_its_own_clock_even_while_a_renewal_hangs() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &clock, &losses);
    let gate = coordinator.gate.lock().unwrap();
    clock.advance(300); // the renewal is sent and hangs
    std::thread::sleep(Duration::from_millis(20));
    clock.advance(400);
    assert!(!keeper.holds(), "the deadline passed while the renewal hung");
    drop(gate); // the renewal now succeeds, too late
    let loss = keeper.wait_lost(Duration::from_secs(10)).expect("lost");
    assert!(
        matches!(loss.reason, LossReason::DeadlinePassed { last_error: None }),
        "{loss:?}"
    );
    assert_eq!(losses.load(Ordering::SeqCst), 1);
}

/// A steal: the coordinator's clock steps past the TTL (its keeper cannot see that) and the phone
/// acquires.
fn steal(coordinator: &Flaky, coordinator_clock: &ManualClock) -> u64 {
    coordinator_clock.advance(5_000);
    coordinator.acquire("milo", "phone", 1_000).unwrap().epoch
}

#[test]
fn keeper_detects_a_steal_on_the_next_renewal() {
    let (keeper_clock, coordinator_clock) = (ManualClock::new(START_MS), ManualClock::new(START_MS));
    let coordinator = Flaky::new(&coordinator_clock);
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &keeper_clock, &losses);
    let stolen = steal(&coordinator, &coordinator_clock);
    assert!(keeper.holds(), "nothing tells the keeper before it renews");
    keeper_clock.advance(300);
    let loss = keeper.wait_lost(Duration::from_secs(10)).expect("lost");
    assert_eq!(
        loss.reason,
        LossReason::Stolen {
            current_epoch: stolen
        }
    );
    assert!(!keeper.holds());
    assert_eq!(losses.load(Ordering::SeqCst), 1);
    assert!(matches!(keeper.shutdown().unwrap(), Shutdown::Lost(_)));
    assert_eq!(
        coordinator.current("milo").unwrap().unwrap().holder,
        "phone",
        "shutdown released nothing"
    );
}

#[test]
fn keeper_lost_signal_fires_once_under_concurrent_renewal_and_shutdown() {
    for round in 0..40 {
        let (keeper_clock, coordinator_clock) = (ManualClock::new(START_MS), ManualClock::new(START_MS));
        let coordinator = Flaky::new(&coordinator_clock);
        let losses = Arc::new(AtomicUsize::new(0));
        let keeper = keeper(Arc::clone(&coordinator), &keeper_clock, &losses);
        let stolen = steal(&coordinator, &coordinator_clock);
        let shutdown = std::thread::scope(|scope| {
            scope.spawn(|| keeper_clock.advance(300)); // the renewal that finds the steal
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            scope.spawn(|| keeper.shutdown()).join().unwrap()
        });
        let expected = LossReason::Stolen {
            current_epoch: stolen,
        };
        match shutdown.unwrap() {
            Shutdown::Lost(loss) => assert_eq!(loss.reason, expected),
            other => panic!("round {round}: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            losses.load(Ordering::SeqCst),
            1,
            "round {round}: the loss signalled once"
        );
        assert_eq!(keeper.loss().map(|loss| loss.reason), Some(expected));
    }
}

#[test]
fn keeper_shutdown_waits_for_guarded_work_then_releases_and_a_waiting_keeper_takes_over_at_once() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let config = KeeperConfig {
        ttl_ms: 10_000,
        renew_every_ms: 3_000,
        renew_deadline_ms: 7_000,
        retry_every_ms: 1_000,
        acquire_every_ms: 100,
    };
    let first = LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
        .config(config)
        .clock(KeeperClock::manual(&clock))
        .acquire()
        .unwrap();
    let first_expiry = first.expires_at_ms();
    let released = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            LeaseKeeper::builder(coordinator.clone(), "milo", "phone")
                .config(config)
                .clock(KeeperClock::manual(&clock))
                .wait_to_acquire(60_000)
        });
        clock.advance(100);
        std::thread::sleep(Duration::from_millis(20)); // the phone is refused (Held) meanwhile
        let guard = first.guard().expect("held");
        let shutting_down = scope.spawn(|| {
            let outcome = first.shutdown();
            released.store(true, Ordering::SeqCst);
            outcome
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !released.load(Ordering::SeqCst),
            "shutdown waits for guarded work"
        );
        assert_eq!(coordinator.current("milo").unwrap().unwrap().holder, "laptop");
        drop(guard);
        assert_eq!(
            shutting_down.join().unwrap().unwrap(),
            Shutdown::Released { epoch: 1 }
        );
        // The phone's next try, 100 ms later: far before the laptop's lease would have expired.
        clock.advance(100);
        let second = waiting.join().unwrap().unwrap();
        assert_eq!(second.epoch(), 2, "the next epoch");
        assert!(
            clock.now_ms() < first_expiry,
            "taken over without waiting out the TTL"
        );
        assert_eq!(second.shutdown().unwrap(), Shutdown::Released { epoch: 2 });
    });
    assert_eq!(first.shutdown().unwrap(), Shutdown::AlreadyShutDown);
}

#[test]
fn keeper_wait_to_acquire_gives_up_with_the_last_refusal() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let _holder = coordinator.acquire("milo", "laptop", 60_000).unwrap();
    let outcome = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            LeaseKeeper::builder(coordinator.clone(), "milo", "phone")
                .config(config())
                .clock(KeeperClock::manual(&clock))
                .wait_to_acquire(500)
        });
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(5));
            clock.advance(100);
        }
        waiting.join().unwrap()
    });
    assert!(
        matches!(
            outcome,
            Err(KeeperError::Lease(LeaseError::Held { epoch: 1, .. }))
        ),
        "{outcome:?}"
    );
}

#[test]
fn l5_keeper_raises_the_epoch_floor_from_the_ledger_before_acquiring() {
    // A coordinator that lost its state (a fresh one) and a ledger that has seen epoch 41.
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let keeper = LeaseKeeper::builder(coordinator, "milo", "laptop")
        .config(config())
        .clock(KeeperClock::manual(&clock))
        .ledger_epoch(41)
        .acquire()
        .unwrap();
    assert_eq!(keeper.epoch(), 42);
}
