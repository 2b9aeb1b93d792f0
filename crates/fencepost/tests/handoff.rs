//! The hand-off between holders (rules H2 and H3) through the library's dispatch and keeper: a
//! holder publishes its `pending` before the effect and its outcome at the next renewal or at the
//! release; a new holder whose ledger lacks what was published dispatches nothing.

// The test harness waits in real time for the keeper's thread.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencepost::clock::ManualClock;
use fencepost::dispatch::{dispatch, DispatchOutcome};
use fencepost::keeper::{
    AcquirePlan, AcquireStep, Acquisition, KeeperClock, KeeperConfig, LeaseKeeper, LossReason, Renewal,
    RenewalStep,
};
use fencepost::lease::{InMemoryLeaseCoordinator, Lease, LeaseCoordinator, LeaseError};
use fencepost::ledger::{Ledger, MissingRecords};
use fencepost::relay::{Frontier, InMemoryRelay, Relay};

const START_MS: u64 = 1_000_000;
const TTL_MS: u64 = 1_000;

/// Two sites on one coordinator, each with a relay of its own that the test syncs by hand.
struct World {
    clock: ManualClock,
    coordinator: Arc<InMemoryLeaseCoordinator>,
    relays: [Arc<InMemoryRelay>; 2],
}

impl World {
    fn new() -> Self {
        let clock = ManualClock::new(START_MS);
        Self {
            coordinator: Arc::new(InMemoryLeaseCoordinator::new(clock.wall_clock())),
            clock,
            relays: [Arc::new(InMemoryRelay::new()), Arc::new(InMemoryRelay::new())],
        }
    }

    fn ledger(&self, site: usize, device: &str) -> Ledger {
        Ledger::open(device, self.clock.wall_clock(), self.relays[site].clone()).unwrap()
    }

    fn keeper(&self, device: &str, clock: &ManualClock, ledger: &Ledger) -> LeaseKeeper {
        LeaseKeeper::builder(self.coordinator.clone(), "milo", device)
            .config(KeeperConfig::new(TTL_MS))
            .clock(KeeperClock::manual(clock))
            .ledger_epoch(ledger.state().fencing_epoch("milo"))
            .acquire()
            .unwrap()
    }

    /// Copies everything relay `from` holds into relay `to`.
    fn copy(&self, from: usize, to: usize) {
        let batch = self.relays[from].pull(&Frontier::new()).unwrap();
        self.relays[to].push(&batch.ops).unwrap();
    }

    fn published(&self) -> Frontier {
        self.coordinator.published_frontier("milo").unwrap()
    }
}

#[test]
fn h2_the_pending_is_published_before_the_effect_runs() {
    let world = World::new();
    let mut laptop = world.ledger(0, "laptop");
    let keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let outcome = dispatch(&keeper, &mut laptop, &run("run-1"), |_| {
        // The `pending` is record 0 of the laptop's log: published before the effect.
        let published = world.published();
        Ok::<_, String>(published.next_seq("laptop"))
    })
    .unwrap();
    assert_eq!(
        outcome,
        DispatchOutcome::Executed {
            epoch: 1,
            result: Ok(1)
        }
    );
    keeper.shutdown().unwrap();
}

#[test]
fn h2_the_outcome_is_published_at_the_release() {
    let world = World::new();
    let mut laptop = world.ledger(0, "laptop");
    let keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    dispatch(&keeper, &mut laptop, &run("run-1"), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(
        world.published().next_seq("laptop"),
        1,
        "only the pending, so far"
    );
    keeper.shutdown().unwrap();
    assert_eq!(
        world.published().next_seq("laptop"),
        2,
        "the commit (record 1) is published before the release"
    );
}

#[test]
fn h2_the_outcome_is_published_after_the_next_renewal() {
    let world = World::new();
    let mut laptop = world.ledger(0, "laptop");
    let keeper_clock = ManualClock::new(0);
    let keeper = world.keeper("laptop", &keeper_clock, &laptop);
    dispatch(&keeper, &mut laptop, &run("run-1"), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(world.published().next_seq("laptop"), 1);
    // The next renewal is due a third of the TTL after the grant.
    keeper_clock.set(TTL_MS / 3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while world.published().next_seq("laptop") < 2 {
        assert!(Instant::now() < deadline, "the outcome was never published");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(keeper.holds());
    keeper.shutdown().unwrap();
}

#[test]
fn h3_a_new_holder_whose_ledger_lacks_the_commit_dispatches_nothing_until_it_arrives() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let mut laptop = world.ledger(0, "laptop");
    let laptop_keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    dispatch(&laptop_keeper, &mut laptop, &run("run-1"), |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .unwrap();
    laptop_keeper.shutdown().unwrap();

    // The phone's relay has none of it; the phone acquires and reads what the laptop published.
    let mut phone = world.ledger(1, "phone");
    let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    let handed_over = phone_keeper.handed_over().expect("read after the grant");
    assert_eq!(handed_over.next_seq("laptop"), 2);
    let missing = vec![MissingRecords {
        device_id: "laptop".into(),
        has: 0,
        needs: 2,
        differs: false,
    }];
    assert_eq!(phone.behind(&handed_over), missing);
    assert_eq!(missing[0].to_string(), "laptop records 0..=1");
    let outcome = dispatch(&phone_keeper, &mut phone, &run("run-1"), |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .unwrap();
    assert_eq!(outcome, DispatchOutcome::LedgerBehind { missing });
    assert_eq!(phone.pushed(), Frontier::new(), "nothing was written");

    // Only the pending arrives: still behind (the commit was published).
    let pending = world.relays[0].pull(&Frontier::new()).unwrap().ops;
    world.relays[1].push(&pending[..1]).unwrap();
    phone.sync().unwrap();
    assert_eq!(
        phone.behind(&handed_over),
        vec![MissingRecords {
            device_id: "laptop".into(),
            has: 1,
            needs: 2,
            differs: false,
        }]
    );
    world.copy(0, 1);
    phone.sync().unwrap();
    assert_eq!(phone.behind(&handed_over), vec![]);
    let outcome = dispatch(&phone_keeper, &mut phone, &run("run-1"), |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .unwrap();
    assert!(
        matches!(outcome, DispatchOutcome::AlreadyCommitted { .. }),
        "{outcome:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "once");
    phone_keeper.shutdown().unwrap();
}

#[test]
fn h3_the_frontier_is_cumulative_over_every_earlier_holder() {
    let world = World::new();
    // The laptop, then the phone (whose relay got the laptop's records), then the laptop again
    // on a relay that has only its own: it still waits for the phone's records, and the phone's
    // publication did not drop the laptop's.
    let mut laptop = world.ledger(0, "laptop");
    let keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    dispatch(&keeper, &mut laptop, &run("run-1"), |_| Ok::<_, String>(())).unwrap();
    keeper.shutdown().unwrap();
    world.copy(0, 1);
    let mut phone = world.ledger(1, "phone");
    let keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    dispatch(&keeper, &mut phone, &run("run-2"), |_| Ok::<_, String>(())).unwrap();
    keeper.shutdown().unwrap();
    let keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let handed_over = keeper.handed_over().unwrap();
    assert_eq!(
        (handed_over.next_seq("laptop"), handed_over.next_seq("phone")),
        (2, 2)
    );
    let outcome = dispatch(&keeper, &mut laptop, &run("run-2"), |_| Ok::<_, String>(())).unwrap();
    assert!(
        matches!(outcome, DispatchOutcome::LedgerBehind { ref missing } if missing.len() == 1 && missing[0].device_id == "phone"),
        "{outcome:?}"
    );
    keeper.shutdown().unwrap();
}

#[test]
fn h2_a_zombie_publishes_nothing_and_its_dispatch_is_refused() {
    let world = World::new();
    let mut laptop = world.ledger(0, "laptop");
    let keeper_clock = ManualClock::new(0);
    let keeper = world.keeper("laptop", &keeper_clock, &laptop);
    // The phone takes the lease once the laptop's has expired (the laptop's keeper clock stands
    // still, so it still believes it holds).
    world.clock.advance(TTL_MS + 1);
    let phone = world.ledger(0, "phone");
    let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    let before = world.published();
    let effects = AtomicUsize::new(0);
    let outcome = dispatch(&keeper, &mut laptop, &run("run-1"), |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .unwrap();
    assert!(
        matches!(outcome, DispatchOutcome::StaleEpoch { current_epoch: 2, ref current_holder, .. } if current_holder == "phone"),
        "{outcome:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    assert_eq!(
        world.published(),
        before,
        "the zombie's pending was not published"
    );
    drop(phone_keeper);
    drop(keeper);
}

#[test]
fn h2_the_renewal_machine_sends_outcomes_with_the_next_renewal_and_again_until_published() {
    let config = KeeperConfig::new(900); // renew every 300
    let lease = Lease {
        agent_id: "milo".into(),
        holder: "laptop".into(),
        epoch: 1,
        expires_at_ms: 900,
    };
    let mut renewal = Renewal::new(config, &lease, 0);
    let mut pushed = Frontier::new();
    pushed.raise("laptop", 2);
    renewal.pushed(&pushed);
    // Nothing is sent before the renewal is due; then the renewal carries the publication.
    assert_eq!(renewal.step(10), RenewalStep::WaitUntil { at_ms: 300 });
    let with_publication = RenewalStep::RenewAndPublish {
        epoch: 1,
        ttl_ms: 900,
        frontier: pushed.clone(),
    };
    assert_eq!(renewal.step(300), with_publication);
    // Renewed, not published: kept for the next renewal.
    renewal.answered_publishing(301, Ok((lease.clone(), false)));
    assert_eq!(renewal.unpublished(), &pushed);
    assert_eq!(renewal.step(302), RenewalStep::WaitUntil { at_ms: 600 });
    assert_eq!(renewal.step(600), with_publication);
    renewal.answered_publishing(601, Ok((lease.clone(), true)));
    assert_eq!(renewal.unpublished(), &Frontier::new());
    assert_eq!(
        renewal.step(900),
        RenewalStep::Renew {
            epoch: 1,
            ttl_ms: 900
        }
    );
    renewal.answered(901, Ok(lease.clone()));
    // A renewal (and its publication) refused: the lease is lost at once, as for any renewal.
    renewal.pushed(&pushed);
    assert_eq!(renewal.step(1_201), with_publication);
    renewal.answered_publishing(
        1_202,
        Err(LeaseError::Lost {
            agent_id: "milo".into(),
            claimed_epoch: 1,
            current_epoch: 2,
        }),
    );
    assert_eq!(
        renewal.step(1_203),
        RenewalStep::Lost(LossReason::Stolen { current_epoch: 2 })
    );
}

#[test]
fn h3_the_acquisition_keeps_what_the_predecessors_published_with_the_grant() {
    let config = KeeperConfig::new(900);
    let plan = AcquirePlan {
        agent_id: "milo".into(),
        ledger_epoch: 0,
        started_ms: 0,
        max_wait_ms: 0,
    };
    let lease = Lease {
        agent_id: "milo".into(),
        holder: "laptop".into(),
        epoch: 1,
        expires_at_ms: 900,
    };
    let mut published = Frontier::new();
    published.raise("phone", 4);
    // Read with the grant: the renewal carries it.
    let mut acquisition = Acquisition::new(config, plan.clone());
    assert_eq!(acquisition.step(0), AcquireStep::Acquire { ttl_ms: 900 });
    acquisition.acquired_handing_over(1, Ok((lease.clone(), Some(published.clone()))));
    let AcquireStep::Granted(renewal) = acquisition.step(1) else {
        panic!("granted")
    };
    assert_eq!(renewal.handed_over(), Some(&published));
    // Not read (a plain acquire, or the read failed): the lease is held all the same.
    let mut acquisition = Acquisition::new(config, plan);
    assert_eq!(acquisition.step(0), AcquireStep::Acquire { ttl_ms: 900 });
    acquisition.acquired(1, Ok(lease));
    let AcquireStep::Granted(renewal) = acquisition.step(1) else {
        panic!("granted")
    };
    assert_eq!(renewal.handed_over(), None);
    // Every coordinator reads it with the grant.
    let coordinator = InMemoryLeaseCoordinator::new(ManualClock::new(0).wall_clock());
    let lease = coordinator.acquire("milo", "phone", 900).unwrap();
    coordinator
        .publish_frontier("milo", "phone", lease.epoch, &published)
        .unwrap();
    coordinator.release("milo", "phone", lease.epoch).unwrap();
    let (_, read) = coordinator.acquire_handing_over("milo", "laptop", 900).unwrap();
    assert_eq!(read, Some(published));
}

/// H3 with a broken setup (found by an adversarial run): two sites that use one device id with
/// ledgers of their own. Site Y's records of another agent fill its ledger to the count that site
/// X published for `milo`; a frontier of counts alone read as caught up, and Y ran X's committed
/// run again. The published head names X's record, so Y's ledger differs and is refused.
#[test]
fn h3_a_ledger_that_counts_other_records_under_the_device_id_is_not_caught_up() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    // Y (device "h1", relay 1) runs another agent once: records 0 and 1 of its "h1".
    let mut y = world.ledger(1, "h1");
    let other = LeaseKeeper::builder(world.coordinator.clone(), "other", "h1")
        .config(KeeperConfig::new(TTL_MS))
        .clock(KeeperClock::manual(&ManualClock::new(0)))
        .acquire()
        .unwrap();
    dispatch(&other, &mut y, &run("run-b"), |_| Ok::<_, String>(())).unwrap();
    other.shutdown().unwrap();
    // X (device "h1" too, relay 0) runs milo's run-1: records 0 and 1 of its "h1", published.
    let mut x = world.ledger(0, "h1");
    let x_keeper = world.keeper("h1", &ManualClock::new(0), &x);
    dispatch(&x_keeper, &mut x, &run("run-1"), |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .unwrap();
    x_keeper.shutdown().unwrap();
    assert_eq!(world.published().next_seq("h1"), 2);
    assert!(world.published().head("h1").is_some(), "the head is published");

    // Y takes milo: its ledger has two records of "h1", but not X's.
    y.sync().unwrap();
    let y_keeper = world.keeper("h1", &ManualClock::new(0), &y);
    let handed_over = y_keeper.handed_over().expect("read after the grant");
    let missing = y.behind(&handed_over);
    assert_eq!(
        missing,
        vec![MissingRecords {
            device_id: "h1".into(),
            has: 2,
            needs: 2,
            differs: true,
        }]
    );
    assert!(
        missing[0].to_string().contains("another record there"),
        "{}",
        missing[0]
    );
    let outcome = dispatch(&y_keeper, &mut y, &run("run-1"), |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .unwrap();
    assert_eq!(outcome, DispatchOutcome::LedgerBehind { missing });
    assert_eq!(effects.load(Ordering::SeqCst), 1, "run-1 ran once");
    y_keeper.shutdown().unwrap();
}

/// A run id of the tests' own (valid).
fn run(id: &str) -> fencepost::id::RunId {
    fencepost::id::RunId::new(id).unwrap()
}
