//! The lease keeper: background renewal, the renew deadline, one loss signal, shutdown and
//! hand-over. Time is a `ManualClock`; failures come from a coordinator wrapper.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

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
    /// While locked by the test, releases wait.
    release_gate: Mutex<()>,
}

impl Flaky {
    fn new(clock: &ManualClock) -> Arc<Self> {
        Arc::new(Self {
            inner: InMemoryLeaseCoordinator::new(clock.wall_clock()),
            fail_renewals: AtomicBool::new(false),
            renewals: AtomicUsize::new(0),
            gate: Mutex::new(()),
            release_gate: Mutex::new(()),
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
                transient: true,
                source: None,
            }))
        } else {
            self.inner.renew(agent_id, device_id, epoch, ttl_ms)
        };
        self.renewals.fetch_add(1, Ordering::SeqCst);
        outcome
    }
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        drop(self.release_gate.lock().unwrap());
        self.inner.release(agent_id, device_id, epoch)
    }
    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        self.inner.current(agent_id)
    }
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        self.inner.raise_epoch_floor(agent_id, floor)
    }
    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &fencepost::relay::Frontier,
    ) -> Result<(), fencepost::lease::LeaseError> {
        self.inner.publish_frontier(agent_id, device_id, epoch, frontier)
    }
    fn published_frontier(
        &self,
        agent_id: &str,
    ) -> Result<fencepost::relay::Frontier, fencepost::lease::LeaseError> {
        self.inner.published_frontier(agent_id)
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
    std::thread::sleep(Duration::from_millis(50)); // its answer reaches the keeper
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
    eventually("on_lost ran", || losses.load(Ordering::SeqCst) >= 1);
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
    eventually("on_lost ran once", || losses.load(Ordering::SeqCst) == 1);
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
    eventually("on_lost ran once", || losses.load(Ordering::SeqCst) == 1);
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
        eventually("the loss signalled", || losses.load(Ordering::SeqCst) >= 1);
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

/// A wait to acquire stops when its caller says so (`stop_waiting_when`: `fencepost run` got
/// SIGTERM), with `Interrupted`, and without taking the lease; before the first attempt, it
/// takes nothing even from a free coordinator.
#[test]
fn keeper_wait_to_acquire_stops_when_the_caller_says_so() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let holder = coordinator.acquire("milo", "laptop", 60_000).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let stop = Arc::clone(&stop);
            LeaseKeeper::builder(coordinator.clone(), "milo", "phone")
                .config(config())
                .clock(KeeperClock::manual(&clock))
                .stop_waiting_when(move || stop.load(Ordering::SeqCst))
                .wait_to_acquire(600_000)
        });
        std::thread::sleep(Duration::from_millis(50)); // refused (Held), waiting for the next try
        stop.store(true, Ordering::SeqCst);
        waiting.join().unwrap() // the clock never moves: only the stop ends the wait
    });
    assert!(matches!(outcome, Err(KeeperError::Interrupted)), "{outcome:?}");
    coordinator.release("milo", "laptop", holder.epoch).unwrap();

    let outcome = LeaseKeeper::builder(coordinator.clone(), "milo", "phone")
        .config(config())
        .clock(KeeperClock::manual(&clock))
        .stop_waiting_when(|| true)
        .wait_to_acquire(600_000);
    assert!(matches!(outcome, Err(KeeperError::Interrupted)), "{outcome:?}");
    assert_eq!(coordinator.current("milo").unwrap(), None, "nothing was taken");
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

/// Issue 13, item 5: a renewal that hangs in the coordinator does not hide the loss. It is
/// delivered at the deadline (to `wait_lost` and `on_lost`) while the renewal is still hanging,
/// and `shutdown` returns at once. Before, `wait_lost` returned `None`, `on_lost` never fired and
/// `shutdown` hung until the renewal returned.
#[test]
fn keeper_a_hung_renewal_is_lost_at_the_deadline_and_shutdown_is_bounded() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &clock, &losses);
    let gate = coordinator.gate.lock().unwrap(); // held to the end: the renewal never answers
    clock.advance(300); // the renewal is sent and hangs
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        keeper.wait_lost(Duration::from_millis(50)),
        None,
        "not before the deadline"
    );
    clock.advance(400); // the deadline
    let loss = keeper
        .wait_lost(Duration::from_secs(10))
        .expect("lost at the deadline, the renewal still hanging");
    assert!(
        matches!(loss.reason, LossReason::DeadlinePassed { .. }),
        "{loss:?}"
    );
    eventually("on_lost ran", || losses.load(Ordering::SeqCst) == 1);
    let started = Instant::now();
    assert!(matches!(keeper.shutdown().unwrap(), Shutdown::Lost(_)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "shutdown did not wait for the renewal"
    );
    drop(gate);
}

/// Issue 13, item 5: a release that hangs is waited for until the renew deadline, then reported:
/// the lease ends by its TTL.
#[test]
fn keeper_a_hung_release_ends_the_shutdown_at_the_deadline_with_an_error() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &clock, &losses);
    let gate = coordinator.release_gate.lock().unwrap();
    std::thread::scope(|scope| {
        let shutting_down = scope.spawn(|| keeper.shutdown());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!shutting_down.is_finished(), "the release is awaited");
        clock.advance(700); // the renew deadline of the last renewal (at acquire)
        match shutting_down.join().unwrap() {
            Err(KeeperError::ReleaseUnanswered { epoch: 1, waited_ms }) => assert!(waited_ms >= 700),
            other => panic!("{other:?}"),
        }
    });
    assert!(!keeper.holds());
    assert_eq!(
        losses.load(Ordering::SeqCst),
        0,
        "a release that times out is no loss"
    );
    drop(gate);
}

/// Issue 13, item 4: `shutdown` during a long guarded effect keeps the lease renewed until the
/// guard drops; meanwhile no other site acquires it, however long the effect runs. Before, the
/// renewals stopped at `shutdown`, and another site acquired epoch 2 while the guard was held.
#[test]
fn keeper_shutdown_keeps_renewing_until_the_last_guard_drops() {
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock); // one clock for keeper and coordinator
    let losses = Arc::new(AtomicUsize::new(0));
    let keeper = keeper(Arc::clone(&coordinator), &clock, &losses);
    let guard = keeper.guard().expect("held");
    std::thread::scope(|scope| {
        let shutting_down = scope.spawn(|| keeper.shutdown());
        std::thread::sleep(Duration::from_millis(20));
        assert!(keeper.guard().is_none(), "no new work once shutdown began");
        for step in 0..20 {
            // 20 × 100 ms: twice the TTL.
            let renewals = coordinator.renewals();
            clock.advance(100);
            if step % 3 == 2 {
                eventually("a renewal", || coordinator.renewals() > renewals);
            }
            assert!(
                matches!(
                    coordinator.acquire("milo", "phone", 1_000),
                    Err(LeaseError::Held { .. })
                ),
                "step {step}: the lease stays with the guarded work"
            );
            assert!(guard.holds(), "step {step}");
        }
        assert!(!shutting_down.is_finished(), "shutdown waits for the guard");
        drop(guard);
        assert_eq!(
            shutting_down.join().unwrap().unwrap(),
            Shutdown::Released { epoch: 1 }
        );
    });
    assert_eq!(coordinator.acquire("milo", "phone", 1_000).unwrap().epoch, 2);
    assert_eq!(losses.load(Ordering::SeqCst), 0);
}

/// Issue 13, item 6: an `on_lost` that panics does not keep the loss from anyone: `wait_lost`
/// returns it at once (before, it waited for its whole timeout), and the panic is contained.
#[test]
fn keeper_a_panicking_on_lost_is_contained_and_waiters_still_learn_the_loss() {
    let (keeper_clock, coordinator_clock) = (ManualClock::new(START_MS), ManualClock::new(START_MS));
    let coordinator = Flaky::new(&coordinator_clock);
    let keeper = LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
        .config(config())
        .clock(KeeperClock::manual(&keeper_clock))
        .on_lost(|_| panic!("a callback bug"))
        .acquire()
        .unwrap();
    let stolen = steal(&coordinator, &coordinator_clock);
    keeper_clock.advance(300);
    let started = Instant::now();
    let loss = keeper.wait_lost(Duration::from_secs(30)).expect("lost");
    assert!(started.elapsed() < Duration::from_secs(5), "woken, not timed out");
    assert_eq!(
        loss.reason,
        LossReason::Stolen {
            current_epoch: stolen
        }
    );
    assert!(!keeper.holds());
    assert!(matches!(keeper.shutdown().unwrap(), Shutdown::Lost(_)));
}

/// Issue 13, item 6: an `on_lost` that blocks delays nothing but itself: waiters learn the loss,
/// and `shutdown` returns, while it is still blocked.
#[test]
fn keeper_a_blocking_on_lost_delays_no_waiter_and_no_shutdown() {
    let (keeper_clock, coordinator_clock) = (ManualClock::new(START_MS), ManualClock::new(START_MS));
    let coordinator = Flaky::new(&coordinator_clock);
    let blocker = Arc::new(Mutex::new(()));
    let held = blocker.lock().unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let keeper = {
        let (blocker, finished) = (Arc::clone(&blocker), Arc::clone(&finished));
        LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
            .config(config())
            .clock(KeeperClock::manual(&keeper_clock))
            .on_lost(move |_| {
                drop(blocker.lock().unwrap());
                finished.store(true, Ordering::SeqCst);
            })
            .acquire()
            .unwrap()
    };
    steal(&coordinator, &coordinator_clock);
    keeper_clock.advance(300);
    assert!(keeper.wait_lost(Duration::from_secs(10)).is_some());
    let started = Instant::now();
    assert!(matches!(keeper.shutdown().unwrap(), Shutdown::Lost(_)));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!finished.load(Ordering::SeqCst), "the callback is still blocked");
    drop(held);
    eventually("the callback ends", || finished.load(Ordering::SeqCst));
}

/// Issue 13, item 6: `shutdown` from inside `on_lost` (on the keeper's own thread) returns the
/// loss instead of joining itself; from a thread that holds a guard (inside an effect) it is an
/// error instead of waiting for itself.
#[test]
fn keeper_shutdown_from_on_lost_or_under_a_guard_never_deadlocks() {
    let (keeper_clock, coordinator_clock) = (ManualClock::new(START_MS), ManualClock::new(START_MS));
    let coordinator = Flaky::new(&coordinator_clock);
    let slot: Arc<std::sync::OnceLock<Arc<LeaseKeeper>>> = Arc::new(std::sync::OnceLock::new());
    let (sender, receiver) = std::sync::mpsc::channel();
    let keeper = {
        let slot = Arc::clone(&slot);
        Arc::new(
            LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
                .config(config())
                .clock(KeeperClock::manual(&keeper_clock))
                .on_lost(move |_| {
                    let keeper = slot.get().expect("set before the loss");
                    sender
                        .send(keeper.shutdown().map_err(|error| error.to_string()))
                        .unwrap();
                })
                .acquire()
                .unwrap(),
        )
    };
    slot.set(Arc::clone(&keeper)).unwrap();

    let guard = keeper.guard().expect("held");
    assert!(
        matches!(keeper.shutdown(), Err(KeeperError::ShutdownWhileGuarding)),
        "inside guarded work"
    );
    assert!(guard.holds(), "the refused shutdown changed nothing");
    drop(guard);

    steal(&coordinator, &coordinator_clock);
    keeper_clock.advance(300);
    match receiver.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(Shutdown::Lost(_))) => {}
        other => panic!("shutdown inside on_lost: {other:?}"),
    }
}

/// L5 at the top of the epoch domain (issue 13, item 3): a ledger that has seen the last epoch
/// there is leaves nothing to grant. Before, the keeper clamped the floor to one below, and the
/// coordinator granted that last epoch a second time.
#[test]
fn l5_keeper_never_regrants_the_last_epoch_a_ledger_has_seen() {
    use fencepost::lease::{MAX_EPOCH, MAX_EPOCH_FLOOR};
    let clock = ManualClock::new(START_MS);
    let coordinator = Flaky::new(&clock);
    let builder = |ledger_epoch| {
        LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
            .config(config())
            .clock(KeeperClock::manual(&clock))
            .ledger_epoch(ledger_epoch)
    };
    for seen in [MAX_EPOCH, u64::MAX] {
        match builder(seen).acquire() {
            Err(KeeperError::Lease(LeaseError::EpochsExhausted { last_epoch, .. })) => {
                assert_eq!(last_epoch, seen)
            }
            other => panic!("ledger epoch {seen}: {other:?}"),
        }
    }
    assert_eq!(coordinator.current("milo").unwrap(), None, "nothing granted");
    let last = builder(MAX_EPOCH_FLOOR).acquire().unwrap();
    assert_eq!(last.epoch(), MAX_EPOCH);
}

/// Issue 13, item 6 (found by an adversarial run): when a shutdown's release finds the lease
/// lost, a blocking `on_lost` runs on a thread of its own: the shutdown returns at once (it hung).
#[test]
fn keeper_a_blocking_on_lost_found_by_the_release_does_not_hold_up_shutdown() {
    let (keeper_clock, coordinator_clock) = (ManualClock::new(START_MS), ManualClock::new(START_MS));
    let coordinator = Flaky::new(&coordinator_clock);
    let blocker = Arc::new(Mutex::new(()));
    let held = blocker.lock().unwrap();
    let called = Arc::new(AtomicBool::new(false));
    let keeper = {
        let (blocker, called) = (Arc::clone(&blocker), Arc::clone(&called));
        LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
            .config(config())
            .clock(KeeperClock::manual(&keeper_clock))
            .on_lost(move |_| {
                called.store(true, Ordering::SeqCst);
                drop(blocker.lock().unwrap());
            })
            .acquire()
            .unwrap()
    };
    steal(&coordinator, &coordinator_clock); // the keeper has not renewed since: it cannot know
    let started = Instant::now();
    assert!(matches!(keeper.shutdown().unwrap(), Shutdown::Lost(_)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "shutdown returned while on_lost blocks"
    );
    eventually("on_lost ran", || called.load(Ordering::SeqCst));
    drop(held);
}

/// The renewal machine (issue 15, item 1) on its own, with no thread and no clock: the timing the
/// keeper runs, step by step. TTL 1000, renew every 300, deadline 700, retry every 100.
#[test]
fn renewal_machine_renews_retries_and_loses_by_the_config_alone() {
    use fencepost::keeper::{Renewal, RenewalStep};
    let lease = Lease {
        agent_id: "milo".into(),
        holder: "laptop".into(),
        epoch: 4,
        expires_at_ms: 1_000,
    };
    let transient = || {
        Err(LeaseError::Backend(BackendError {
            backend: "test",
            message: "connection reset".into(),
            may_have_applied: false,
            transient: true,
            source: None,
        }))
    };
    let renew = || RenewalStep::Renew {
        epoch: 4,
        ttl_ms: 1_000,
    };
    let mut renewal = Renewal::new(config(), &lease, 0);
    assert_eq!(renewal.step(0), RenewalStep::WaitUntil { at_ms: 300 });
    assert_eq!(renewal.step(300), renew());
    // In flight: nothing more is sent; the next thing due is the deadline.
    assert_eq!(renewal.step(350), RenewalStep::WaitUntil { at_ms: 700 });
    renewal.answered(
        360,
        Ok(Lease {
            expires_at_ms: 1_300,
            ..lease.clone()
        }),
    );
    assert_eq!((renewal.deadline_ms(), renewal.expires_at_ms()), (1_000, 1_300));
    assert_eq!(renewal.step(360), RenewalStep::WaitUntil { at_ms: 600 });
    // Transient errors are retried every 100 ms after each failed renewal was sent.
    assert_eq!(renewal.step(600), renew());
    renewal.answered(650, transient());
    assert_eq!(renewal.step(650), RenewalStep::WaitUntil { at_ms: 700 });
    assert_eq!(renewal.step(700), renew());
    renewal.answered(990, transient());
    assert!(renewal.holds(999));
    match renewal.step(1_000) {
        RenewalStep::Lost(LossReason::DeadlinePassed {
            last_error: Some(error),
        }) => {
            assert!(error.contains("connection reset"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!renewal.holds(1_000));
    // An answer after the deadline changes nothing.
    renewal.answered(1_001, Ok(lease.clone()));
    assert!(matches!(renewal.step(1_001), RenewalStep::Lost(_)));

    // A `Lost` verdict loses at once; a renewal that hangs is lost at the deadline.
    let mut stolen = Renewal::new(config(), &lease, 0);
    assert_eq!(stolen.step(300), renew());
    stolen.answered(
        301,
        Err(LeaseError::Lost {
            agent_id: "milo".into(),
            claimed_epoch: 4,
            current_epoch: 5,
        }),
    );
    assert_eq!(
        stolen.step(301),
        RenewalStep::Lost(LossReason::Stolen { current_epoch: 5 })
    );
    let mut hung = Renewal::new(config(), &lease, 0);
    assert_eq!(hung.step(300), renew());
    assert_eq!(hung.step(699), RenewalStep::WaitUntil { at_ms: 700 });
    assert_eq!(
        hung.step(700),
        RenewalStep::Lost(LossReason::DeadlinePassed { last_error: None })
    );
}

/// The acquisition machine (issue 15, item 1; rule L5) on its own: the floor is raised once,
/// before the first acquire; `Held` and transient errors are retried every `acquire_every_ms`
/// within the wait; the wait's end reports the refusal seen during it; an error retrying cannot
/// fix ends it at once; a ledger that has seen the last epoch never asks for a grant.
#[test]
fn l5_acquisition_machine_raises_the_floor_once_then_retries_within_the_wait() {
    use fencepost::keeper::{AcquirePlan, AcquireStep, Acquisition, KeeperError};
    let transient = || {
        LeaseError::Backend(BackendError {
            backend: "test",
            message: "connection reset".into(),
            may_have_applied: false,
            transient: true,
            source: None,
        })
    };
    let held = || LeaseError::Held {
        agent_id: "milo".into(),
        holder: "phone".into(),
        epoch: 3,
        expires_at_ms: 5_000,
    };
    let plan = |ledger_epoch, max_wait_ms| AcquirePlan {
        agent_id: "milo".into(),
        ledger_epoch,
        started_ms: 1_000,
        max_wait_ms,
    };
    let acquire = AcquireStep::Acquire { ttl_ms: 1_000 };
    // acquire_every_ms is 250 here.
    let every_250 = KeeperConfig {
        acquire_every_ms: 250,
        ..config()
    };
    let mut machine = Acquisition::new(every_250, plan(2, 600));
    assert_eq!(machine.step(1_000), AcquireStep::RaiseFloor { floor: 2 });
    assert_eq!(
        machine.step(1_001),
        AcquireStep::WaitUntil { at_ms: 1_001 },
        "one call at a time"
    );
    machine.floor_raised(1_005, Ok(()));
    assert_eq!(machine.step(1_005), acquire);
    machine.acquired(1_010, Err(held()));
    assert_eq!(machine.step(1_010), AcquireStep::WaitUntil { at_ms: 1_260 });
    assert_eq!(machine.step(1_260), acquire, "the floor is not raised again");
    machine.acquired(1_270, Err(transient()));
    assert_eq!(machine.step(1_520), acquire);
    machine.acquired(1_530, Err(held()));
    // The next try is clamped to the end of the wait, then the wait is over.
    assert_eq!(machine.step(1_530), AcquireStep::WaitUntil { at_ms: 1_600 });
    assert_eq!(machine.step(1_600), acquire);
    machine.acquired(1_601, Err(transient()));
    match machine.step(1_601) {
        AcquireStep::GaveUp(KeeperError::HeldThenFailed { held, .. }) => {
            assert!(matches!(*held, LeaseError::Held { epoch: 3, .. }))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(machine.step(1_602), AcquireStep::Spent);

    // A floor that cannot be raised (its error is not transient) ends it at once.
    let mut refused = Acquisition::new(config(), plan(9, 60_000));
    assert_eq!(refused.step(1_000), AcquireStep::RaiseFloor { floor: 9 });
    refused.floor_raised(
        1_001,
        Err(LeaseError::InvalidEpochFloor {
            floor: 9,
            max_floor: 8,
        }),
    );
    assert!(matches!(
        refused.step(1_001),
        AcquireStep::GaveUp(KeeperError::Lease(LeaseError::InvalidEpochFloor { .. }))
    ));

    // No ledger epoch: no floor to raise. A grant starts the renewal from when it was sent.
    let mut granted = Acquisition::new(config(), plan(0, 0));
    assert_eq!(granted.step(1_000), acquire);
    granted.acquired(
        1_040,
        Ok(Lease {
            agent_id: "milo".into(),
            holder: "laptop".into(),
            epoch: 1,
            expires_at_ms: 2_000,
        }),
    );
    match granted.step(1_040) {
        AcquireStep::Granted(renewal) => {
            assert_eq!((renewal.epoch(), renewal.deadline_ms()), (1, 1_700));
        }
        other => panic!("{other:?}"),
    }

    // The last epoch there is was seen: nothing is asked of the coordinator.
    let mut exhausted = Acquisition::new(config(), plan(fencepost::lease::MAX_EPOCH, 60_000));
    assert!(matches!(
        exhausted.step(1_000),
        AcquireStep::GaveUp(KeeperError::Lease(LeaseError::EpochsExhausted { .. }))
    ));
}
