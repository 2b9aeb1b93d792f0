//! Guarded dispatch across sites: once-only execution through the ledger's oracle, zombies at the
//! fence and at a resource that checks tokens, in-doubt runs after a fail-over.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::dispatch::{
    dispatch, dispatch_effect, dispatch_with, DispatchError, DispatchOptions, DispatchOutcome, EffectOutcome,
};
use fencepost::keeper::{KeeperClock, KeeperConfig, LeaseKeeper};
use fencepost::lease::{InMemoryLeaseCoordinator, Intent, IntentStatus, LeaseCoordinator};
use fencepost::ledger::{Ledger, LedgerError};
use fencepost::oplog::OpRecord;
use fencepost::relay::{
    Appended, Frontier, InMemoryRelay, MakeRecords, PullBatch, PushReport, Relay, RelayError,
};
use fencepost::resource::{FencedResource, ResourceRefusal};

const START_MS: u64 = 1_000_000;
const TTL_MS: u64 = 1_000;

/// A relay that can be cut off: pushes fail while `partitioned` is set.
struct Partitionable {
    inner: InMemoryRelay,
    partitioned: AtomicBool,
}

impl Relay for Partitionable {
    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        if self.partitioned.load(Ordering::SeqCst) {
            return Err(RelayError::Io {
                operation: "push to",
                path: "partitioned".into(),
                source: std::io::Error::other("the network is partitioned"),
            });
        }
        self.inner.push(ops)
    }
    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        self.inner.pull(since)
    }
    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError> {
        if self.partitioned.load(Ordering::SeqCst) {
            return Err(RelayError::Io {
                operation: "append to",
                path: "partitioned".into(),
                source: std::io::Error::other("the network is partitioned"),
            });
        }
        self.inner.append(device_id, since_seq, make)
    }
}

/// Two sites, a shared coordinator (with its own clock) and a shared relay.
struct World {
    coordinator_clock: ManualClock,
    coordinator: Arc<InMemoryLeaseCoordinator>,
    relay: Arc<Partitionable>,
}

impl World {
    fn new() -> Self {
        let coordinator_clock = ManualClock::new(START_MS);
        Self {
            coordinator: Arc::new(InMemoryLeaseCoordinator::new(coordinator_clock.wall_clock())),
            coordinator_clock,
            relay: Arc::new(Partitionable {
                inner: InMemoryRelay::new(),
                partitioned: AtomicBool::new(false),
            }),
        }
    }

    fn ledger(&self, device: &str) -> Ledger {
        Ledger::open(device, self.coordinator_clock.wall_clock(), self.relay.clone()).unwrap()
    }

    /// A keeper for `device` whose own clock is `clock` (a paused site's clock does not move).
    fn keeper(&self, device: &str, clock: &ManualClock, ledger: &Ledger) -> LeaseKeeper {
        LeaseKeeper::builder(self.coordinator.clone(), "milo", device)
            .config(KeeperConfig::new(TTL_MS))
            .clock(KeeperClock::manual(clock))
            .ledger_epoch(ledger.state().fencing_epoch("milo"))
            .acquire()
            .unwrap()
    }
}

fn counting(
    counter: &AtomicUsize,
) -> impl FnOnce(&fencepost::fence::FencingToken) -> Result<u64, String> + '_ {
    move |token| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(token.epoch)
    }
}

#[test]
fn dispatch_runs_a_run_once_across_two_sites_that_share_a_coordinator_and_exchange_ledgers() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    let laptop_keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let outcome = dispatch(&laptop_keeper, &mut laptop, &run("run-1"), counting(&effects)).unwrap();
    assert_eq!(
        outcome,
        DispatchOutcome::Executed {
            epoch: 1,
            result: Ok(1)
        }
    );
    // Again on the same site: the oracle refuses, nothing is written.
    let again = dispatch(&laptop_keeper, &mut laptop, &run("run-1"), counting(&effects)).unwrap();
    assert!(matches!(again, DispatchOutcome::AlreadyCommitted { .. }));
    laptop_keeper.shutdown().unwrap();

    phone.sync().unwrap();
    let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    assert_eq!(phone_keeper.epoch(), 2);
    assert_eq!(
        phone.in_doubt("milo", 2),
        vec![],
        "the laptop finished what it started"
    );
    let elsewhere = dispatch(&phone_keeper, &mut phone, &run("run-1"), counting(&effects)).unwrap();
    assert!(matches!(elsewhere, DispatchOutcome::AlreadyCommitted { .. }));
    let new_run = dispatch(&phone_keeper, &mut phone, &run("run-2"), counting(&effects)).unwrap();
    assert_eq!(
        new_run,
        DispatchOutcome::Executed {
            epoch: 2,
            result: Ok(2)
        }
    );
    assert_eq!(effects.load(Ordering::SeqCst), 2, "run-1 once, run-2 once");
    laptop.sync().unwrap();
    assert_eq!(
        laptop.state().state_hash(),
        phone.state().state_hash(),
        "both sites fold the same state"
    );
}

#[test]
fn dispatch_runs_once_when_the_commit_reaches_the_successor_only_after_it_acquired() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    let laptop_keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    // The laptop acts, then the relay is cut before its commit can be pushed.
    let outcome = dispatch(&laptop_keeper, &mut laptop, &run("run-1"), |token| {
        effects.fetch_add(1, Ordering::SeqCst);
        world.relay.partitioned.store(true, Ordering::SeqCst);
        Ok::<_, String>(token.epoch)
    })
    .unwrap();
    assert!(outcome.executed());
    assert_eq!(laptop.unsent(), 1, "the commit waits for the relay");
    laptop_keeper.shutdown().unwrap();

    // The phone takes over and sees only the laptop's pending: the run is in doubt.
    phone.sync().unwrap();
    let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    let in_doubt = phone.in_doubt("milo", phone_keeper.epoch());
    assert_eq!(in_doubt.len(), 1);
    assert_eq!(
        (
            in_doubt[0].run_id.as_str(),
            in_doubt[0].epoch,
            in_doubt[0].device_id.as_str()
        ),
        ("run-1", 1, "laptop")
    );

    // The relay heals; the commit arrives after the phone acquired; the phone's dispatch refuses.
    world.relay.partitioned.store(false, Ordering::SeqCst);
    assert_eq!(laptop.sync().unwrap().pushed, 1);
    phone.sync().unwrap();
    assert_eq!(phone.in_doubt("milo", phone_keeper.epoch()), vec![]);
    let outcome = dispatch(&phone_keeper, &mut phone, &run("run-1"), counting(&effects)).unwrap();
    assert!(matches!(outcome, DispatchOutcome::AlreadyCommitted { .. }));
    assert_eq!(effects.load(Ordering::SeqCst), 1, "executed once");
}

#[test]
fn dispatch_refuses_a_zombie_paused_past_its_ttl_at_the_fence() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    // The laptop's process is paused: its own clock stands still, so it still believes it holds.
    let paused = ManualClock::new(0);
    let zombie = world.keeper("laptop", &paused, &laptop);
    world.coordinator_clock.advance(TTL_MS);
    let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    assert!(
        dispatch(&phone_keeper, &mut phone, &run("run-2"), counting(&effects))
            .unwrap()
            .executed()
    );

    // The laptop resumes and dispatches: refused at the fence, the effect never runs.
    assert!(zombie.holds(), "the zombie believes it holds");
    let outcome = dispatch(&zombie, &mut laptop, &run("run-3"), counting(&effects)).unwrap();
    assert_eq!(
        outcome,
        DispatchOutcome::StaleEpoch {
            claimed_epoch: 1,
            current_epoch: 2,
            current_holder: "phone".into()
        }
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "only the phone's run ran");
    let record = laptop.state().intent("milo", "run-3").unwrap();
    assert_eq!(
        (record.status, record.epoch),
        (IntentStatus::Failed, 1),
        "the refusal is recorded"
    );
}

#[test]
fn dispatch_a_zombie_that_passed_the_fence_before_pausing_is_rejected_by_a_fenced_resource() {
    let world = World::new();
    let resource: FencedResource<&str> = FencedResource::new();
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    let zombie = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let outcome = dispatch(&zombie, &mut laptop, &run("charge-1"), |token| {
        // Past the fence, the laptop pauses; meanwhile its lease expires and the phone acts.
        world.coordinator_clock.advance(TTL_MS);
        let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
        // Rule H3: the phone has everything the laptop published (its `pending`) first.
        phone.sync().unwrap();
        let phone_outcome = dispatch(&phone_keeper, &mut phone, &run("charge-2"), |token| {
            resource.apply(token, "phone")
        });
        assert!(phone_outcome.unwrap().executed());
        phone_keeper.shutdown().unwrap();
        // The laptop resumes and writes with its old token.
        resource.apply(token, "laptop")
    })
    .unwrap();
    match outcome {
        DispatchOutcome::Executed {
            epoch: 1,
            result:
                Err(ResourceRefusal::StaleEpoch {
                    epoch: 1,
                    highest_epoch: 2,
                    ..
                }),
        } => {}
        other => panic!("{other:?}"),
    }
    let applied: Vec<_> = resource
        .applied()
        .into_iter()
        .map(|(token, who)| (token.epoch, who))
        .collect();
    assert_eq!(applied, vec![(2, "phone")], "the resource rejected the zombie");
    let record = laptop.state().intent("milo", "charge-1").unwrap();
    assert_eq!(
        record.status,
        IntentStatus::Failed,
        "the failed effect is recorded as failed"
    );
}

/// D1 with a cooperating resource (issue 13, item 2): a zombie whose effect lands *first*, and
/// then the successor's retry of the in-doubt run under a newer epoch: the resource's idempotency
/// key (the run id) refuses the second, so the effect happens once. Checking only the epoch
/// applied it twice (`[(run-a, 1), (run-a, 2)]`).
#[test]
fn d1_a_fenced_resource_refuses_a_run_it_applied_even_under_a_newer_epoch() {
    let world = World::new();
    let resource: FencedResource<&str> = FencedResource::new();
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    let zombie = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let outcome = dispatch_effect(
        &zombie,
        &mut laptop,
        &run("charge-1"),
        DispatchOptions::default(),
        |token| {
            // The laptop's effect lands, and the laptop dies before it can record the outcome.
            resource.apply(token, "laptop").unwrap();
            EffectOutcome::<(), &str>::Unknown("the laptop died")
        },
    )
    .unwrap();
    assert!(
        matches!(outcome, DispatchOutcome::Interrupted { epoch: 1, .. }),
        "{outcome:?}"
    );
    world.coordinator_clock.advance(TTL_MS);
    phone.sync().unwrap();
    let successor = world.keeper("phone", &ManualClock::new(0), &phone);
    assert_eq!(successor.epoch(), 2);
    let retried = dispatch_with(
        &successor,
        &mut phone,
        &run("charge-1"),
        DispatchOptions::default().retry_in_doubt(true),
        |token| resource.apply(token, "phone"),
    )
    .unwrap();
    match retried {
        DispatchOutcome::Executed {
            epoch: 2,
            result: Err(ResourceRefusal::AlreadyApplied { applied_epoch: 1, .. }),
        } => {}
        other => panic!("the retry must reach the resource and be refused: {other:?}"),
    }
    let applied: Vec<_> = resource
        .applied()
        .into_iter()
        .map(|(token, who)| (token.run_id, token.epoch, who))
        .collect();
    assert_eq!(
        applied,
        vec![("charge-1".to_owned(), 1, "laptop")],
        "D1: one run, one effect, whoever sends it"
    );
    successor.shutdown().unwrap();
}

#[test]
fn dispatch_lists_in_doubt_runs_after_a_fail_over_and_a_retry_settles_them() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    let laptop_keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    assert!(
        dispatch(&laptop_keeper, &mut laptop, &run("done"), counting(&effects))
            .unwrap()
            .executed()
    );
    // The laptop writes its pending for "charge-7" and dies before it knows the outcome.
    laptop
        .record(&Intent::new(
            "milo",
            "charge-7",
            laptop_keeper.epoch(),
            IntentStatus::Pending,
        ))
        .unwrap();
    laptop.flush().unwrap();
    drop(laptop);
    world.coordinator_clock.advance(TTL_MS); // its lease runs out; no release
    let laptop_epoch = laptop_keeper.epoch();
    std::mem::forget(laptop_keeper); // a dead process neither renews nor releases

    phone.sync().unwrap();
    let phone_keeper = world.keeper("phone", &ManualClock::new(0), &phone);
    let in_doubt = phone.in_doubt("milo", phone_keeper.epoch());
    let runs: Vec<_> = in_doubt
        .iter()
        .map(|run| (run.run_id.as_str(), run.epoch, run.device_id.as_str()))
        .collect();
    assert_eq!(
        runs,
        vec![("charge-7", laptop_epoch, "laptop")],
        "only the unfinished run"
    );
    // D2: without an explicit choice, the phone does not run it.
    let refused = dispatch(&phone_keeper, &mut phone, &run("charge-7"), counting(&effects)).unwrap();
    assert!(
        matches!(&refused, DispatchOutcome::InDoubt { run } if run.epoch == laptop_epoch),
        "{refused:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "nothing ran");
    // The phone retries it under its own epoch (the resource dedupes by run id).
    let retried = dispatch_with(
        &phone_keeper,
        &mut phone,
        &run("charge-7"),
        DispatchOptions::default().retry_in_doubt(true),
        counting(&effects),
    )
    .unwrap();
    assert_eq!(
        retried,
        DispatchOutcome::Executed {
            epoch: 2,
            result: Ok(2)
        }
    );
    assert_eq!(phone.in_doubt("milo", phone_keeper.epoch()), vec![]);
    // The laptop's log is continued, not forked, when it comes back.
    let mut back = world.ledger("laptop");
    back.sync().unwrap();
    assert!(back.state().committed_run("milo", "charge-7").is_some());
}

#[test]
fn dispatch_refuses_to_write_below_the_known_fencing_epoch_and_checks_its_input() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let mut laptop = world.ledger("laptop");
    // The ledger has seen epoch 5; the keeper was started without raising the floor from it.
    laptop
        .record(&Intent::new("milo", "old", 5, IntentStatus::Committed))
        .unwrap();
    let keeper = LeaseKeeper::builder(world.coordinator.clone(), "milo", "laptop")
        .config(KeeperConfig::new(TTL_MS))
        .clock(KeeperClock::manual(&ManualClock::new(0)))
        .acquire()
        .unwrap();
    let unsent = laptop.unsent();
    let refused = dispatch(&keeper, &mut laptop, &run("run-1"), counting(&effects));
    assert!(
        matches!(
            refused,
            Err(DispatchError::BelowFencingEpoch {
                epoch: 1,
                fencing_epoch: 5,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(laptop.unsent(), unsent, "nothing written");
    // Rule L8: a run id with a control character is refused when built, before any dispatch.
    assert!(fencepost::id::RunId::new("run\u{1}").is_err());
    let mut phone = world.ledger("phone");
    let mismatch = dispatch(&keeper, &mut phone, &run("run-1"), counting(&effects));
    assert!(matches!(mismatch, Err(DispatchError::DeviceMismatch { .. })));
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}

#[test]
fn dispatch_runs_nothing_when_the_pending_cannot_be_shared_or_the_lease_is_gone() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let mut laptop = world.ledger("laptop");
    let keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    world.relay.partitioned.store(true, Ordering::SeqCst);
    let cut_off = dispatch(&keeper, &mut laptop, &run("run-1"), counting(&effects));
    assert!(
        matches!(cut_off, Err(DispatchError::Ledger(LedgerError::Relay(_)))),
        "{cut_off:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "no effect before its pending is shared"
    );
    world.relay.partitioned.store(false, Ordering::SeqCst);

    keeper.shutdown().unwrap();
    let outcome = dispatch(&keeper, &mut laptop, &run("run-1"), counting(&effects)).unwrap();
    assert_eq!(outcome, DispatchOutcome::NotHeld { claimed_epoch: 1 });
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    assert_eq!(world.coordinator.current("milo").unwrap(), None);
}

/// One device's log of intents for `run` of "milo", as (epoch, status) pairs.
fn device_log(device: &str, intents: &[(u64, IntentStatus)]) -> Vec<OpRecord> {
    let mut log = fencepost::oplog::DeviceLog::new(device, ManualClock::new(START_MS).wall_clock()).unwrap();
    intents
        .iter()
        .map(|(epoch, status)| {
            log.append(
                fencepost::oplog::Surface::Intent,
                Intent::new("milo", "run-d2", *epoch, *status).payload(),
            )
        })
        .collect()
}

/// D2: a run is in doubt when some `pending` has no outcome of its own epoch; an older `failed`
/// (attempt 1, or a contender refused at the fence writing at its older epoch after a newer
/// holder's `pending`) never settles a newer attempt, whatever the order the logs arrive in.
#[test]
fn d2_an_older_failed_never_settles_a_newer_pending_in_any_arrival_order() {
    use IntentStatus::{Committed, Failed, Pending};
    let logs = [
        device_log("laptop", &[(1, Pending), (1, Failed)]),
        device_log("phone", &[(2, Pending)]),
        device_log("server", &[(1, Failed)]),
    ];
    let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    for order in orders {
        let relay = Arc::new(InMemoryRelay::new());
        let mut ledger =
            Ledger::open("reader", ManualClock::new(START_MS).wall_clock(), relay.clone()).unwrap();
        for index in order {
            relay.push(&logs[index]).unwrap();
            ledger.sync().unwrap();
        }
        let in_doubt = ledger.in_doubt("milo", 3);
        assert_eq!(in_doubt.len(), 1, "{order:?}: {in_doubt:?}");
        assert_eq!(
            (in_doubt[0].epoch, in_doubt[0].device_id.as_str()),
            (2, "phone"),
            "{order:?}"
        );
        assert_eq!(
            ledger.in_doubt_run("milo", "run-d2", 2).map(|run| run.epoch),
            Some(2)
        );
        // The fold's view (F5) is unchanged: the terminal record wins.
        assert_eq!(ledger.state().intent("milo", "run-d2").unwrap().status, Failed);
    }
    // Its own outcome settles the attempt; a commit at any epoch settles the run.
    for (settle, expected) in [
        ((2, Failed), 0),
        ((3, Committed), 0),
        ((1, Committed), 0),
        ((4, Failed), 1),
    ] {
        let relay = Arc::new(InMemoryRelay::new());
        for log in &logs {
            relay.push(log).unwrap();
        }
        relay.push(&device_log("fixer", &[settle])).unwrap();
        let ledger = Ledger::open("reader", ManualClock::new(START_MS).wall_clock(), relay).unwrap();
        assert_eq!(
            ledger.in_doubt("milo", u64::MAX).len(),
            expected,
            "after {settle:?}"
        );
    }
}

/// R1: two `Ledger`s of one device in one process (two worker threads) never produce one record for
/// two executions: each append continues the chain the other just wrote.
#[test]
fn r1_two_ledgers_of_one_device_interleave_and_never_merge_two_records() {
    let folder = tempfile::tempdir().unwrap();
    let relay: Arc<dyn Relay> = Arc::new(fencepost::relay::FsRelay::open(folder.path()).unwrap());
    let clock = ManualClock::new(START_MS); // one millisecond for both: identical stamps if unserialized
    let mut first = Ledger::open("laptop", clock.wall_clock(), relay.clone()).unwrap();
    let mut second = Ledger::open("laptop", clock.wall_clock(), relay.clone()).unwrap();
    for round in 0..3 {
        for ledger in [&mut first, &mut second] {
            ledger
                .record(&Intent::new("milo", "run-a", 1, IntentStatus::Pending))
                .unwrap_or_else(|error| panic!("round {round}: {error}"));
        }
    }
    let stored = relay.pull(&Frontier::new()).unwrap();
    assert!(stored.problems.is_empty(), "{:?}", stored.problems);
    assert_eq!(stored.ops.len(), 6, "six appends, six records");
    fencepost::oplog::verify_log(&stored.ops).unwrap();
}

/// A relay that hands over, for one device, a forged twin of each record: the same `op_id`, other
/// content (as a buggy or hostile relay could).
struct Forging {
    inner: InMemoryRelay,
    device: &'static str,
}

impl Relay for Forging {
    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        self.inner.push(ops)
    }
    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        let mut batch = self.inner.pull(since)?;
        for op in batch.ops.iter_mut().filter(|op| &*op.device_id == self.device) {
            if let Some(mut intent) = op.payload.intent() {
                intent.status = IntentStatus::Pending;
                intent.epoch += 5;
                op.payload = intent.payload().into(); // the op_id stays: a forged twin
            }
        }
        Ok(batch)
    }
    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError> {
        self.inner.append(device_id, since_seq, make)
    }
}

/// O1 before the fold (issue 13, item 8): a record whose `op_id` does not match its content never
/// reaches the ledger's fold. The forged twin of the phone's `committed` would otherwise have
/// hidden the commit (the oracle) and raised the fencing epoch; instead the phone's device is
/// damage, and nothing is dispatched on it.
#[test]
fn o1_a_record_whose_id_does_not_match_its_content_never_reaches_the_fold() {
    let inner = InMemoryRelay::new();
    let clock = ManualClock::new(START_MS);
    let mut phone = Ledger::open("phone", clock.wall_clock(), Arc::new(inner.clone())).unwrap();
    phone
        .record(&Intent::new("milo", "run-1", 1, IntentStatus::Committed))
        .unwrap();
    let forging = Arc::new(Forging {
        inner,
        device: "phone",
    });
    let laptop = Ledger::open("laptop", clock.wall_clock(), forging).unwrap();
    assert_eq!(
        laptop.state().intent("milo", "run-1"),
        None,
        "O1: the twin is not folded"
    );
    assert_eq!(laptop.state().fencing_epoch("milo"), 0, "O1: nor its epoch");
    let damage = laptop.damage();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert_eq!(damage[0].device_id.as_deref(), Some("phone"));
    assert!(
        damage[0].detail.contains("does not match"),
        "{}",
        damage[0].detail
    );
}

/// Rule L8 at the fence, and the epoch domain at the ledger (issue 13, item 9): an empty run id is
/// never a `Proceed` (the fold would ignore its records as malformed), and an intent at an epoch
/// no coordinator mints is refused before it is written.
#[test]
fn l8_the_fence_refuses_an_empty_run_id_and_the_ledger_an_epoch_out_of_range() {
    let world = World::new();
    let mut laptop = world.ledger("laptop");
    let keeper = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let decision = fencepost::fence::check_dispatch(
        &*world.coordinator,
        laptop.state(),
        "milo",
        "",
        "laptop",
        keeper.epoch(),
    );
    assert!(
        matches!(decision, Err(fencepost::lease::LeaseError::InvalidId(_))),
        "L8: {decision:?}"
    );
    for epoch in [0, fencepost::lease::MAX_EPOCH + 1, u64::MAX] {
        match laptop.record(&Intent::new("milo", "run-1", epoch, IntentStatus::Pending)) {
            Err(LedgerError::InvalidEpoch { epoch: refused }) => assert_eq!(refused, epoch),
            other => panic!("epoch {epoch}: {other:?}"),
        }
    }
    assert_eq!(laptop.unsent(), 0, "nothing queued");
    assert!(laptop.state().agent("milo").is_none(), "nothing written");
    keeper.shutdown().unwrap();
}

/// R1 and D1 (issue 13, item 1): two worker threads share one keeper, each with its own `Ledger`
/// of the same device, and dispatch the same run at the same instant, 200 times. Every trial runs
/// the effect once, and the ledger shows every attempt (no two executions recorded as one).
/// Before issue 12's serialized appends the effect ran twice in 196 of 200 trials with one
/// `pending` and one `committed` in the relay; with them but without the concurrent-attempt check
/// it still ran twice (visibly) in some trials.
#[test]
fn r1_two_ledgers_of_one_device_sharing_a_keeper_run_a_run_once() {
    let mut twice = 0;
    for trial in 0..200 {
        let world = World::new();
        let clock = fencepost::clock::system_clock();
        let open = || Ledger::open("laptop", clock.clone(), world.relay.clone()).unwrap();
        let (mut first, mut second) = (open(), open());
        let keeper = world.keeper("laptop", &ManualClock::new(0), &first);
        let effects = AtomicUsize::new(0);
        let barrier = std::sync::Barrier::new(2);
        let outcomes: Vec<DispatchOutcome<u64, String>> = std::thread::scope(|scope| {
            let workers: Vec<_> = [&mut first, &mut second]
                .into_iter()
                .map(|ledger| {
                    let (keeper, effects, barrier) = (&keeper, &effects, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        dispatch(keeper, ledger, &run("run-a"), counting(effects)).unwrap()
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).collect()
        });
        let ran = effects.load(Ordering::SeqCst);
        if ran != 1 {
            twice += 1;
        }
        let executed = outcomes.iter().filter(|outcome| outcome.executed()).count();
        assert_eq!(executed, ran, "trial {trial}: {outcomes:?}");
        let stored = world.relay.pull(&Frontier::new()).unwrap().ops;
        fencepost::oplog::verify_log(&stored).unwrap();
        let statuses: Vec<IntentStatus> = stored
            .iter()
            .filter_map(|op| op.payload.intent())
            .map(|intent| intent.status)
            .collect();
        let count = |status| statuses.iter().filter(|found| **found == status).count();
        assert_eq!(
            count(IntentStatus::Committed),
            ran,
            "trial {trial}: every execution is recorded: {statuses:?}"
        );
        assert_eq!(
            count(IntentStatus::Pending),
            2,
            "trial {trial}: both attempts show"
        );
        keeper.shutdown().unwrap();
    }
    assert_eq!(twice, 0, "D1: the effect ran twice in {twice} of 200 trials");
}

/// D2 (found by an adversarial run): a record of another surface that carries an intent's fields
/// (an audit mirror, say) settles no attempt: the run stays in doubt, as the fold says. It used to
/// hide the in-doubt run, and the effect ran twice.
#[test]
fn d2_a_record_of_another_surface_never_settles_an_attempt() {
    let world = World::new();
    let effects = AtomicUsize::new(0);
    let (mut laptop, mut phone) = (world.ledger("laptop"), world.ledger("phone"));
    let first = world.keeper("laptop", &ManualClock::new(0), &laptop);
    let outcome = dispatch_effect(
        &first,
        &mut laptop,
        &run("run-r"),
        DispatchOptions::default(),
        |_| {
            effects.fetch_add(1, Ordering::SeqCst);
            EffectOutcome::<(), &str>::Unknown("the laptop died")
        },
    )
    .unwrap();
    assert!(matches!(outcome, DispatchOutcome::Interrupted { .. }));
    drop(first);
    let mut mirror =
        fencepost::oplog::DeviceLog::new("auditor", world.coordinator_clock.wall_clock()).unwrap();
    let mirrored = mirror.append(
        fencepost::oplog::Surface::log("audit"),
        Intent::new("milo", "run-r", 1, IntentStatus::Failed).payload(),
    );
    world.relay.push(&[mirrored]).unwrap();
    world.coordinator_clock.advance(TTL_MS);
    phone.sync().unwrap();
    let second = world.keeper("phone", &ManualClock::new(0), &phone);
    assert_eq!(
        phone.in_doubt("milo", second.epoch()).len(),
        1,
        "D2: still in doubt"
    );
    let outcome = dispatch(&second, &mut phone, &run("run-r"), counting(&effects)).unwrap();
    assert!(matches!(outcome, DispatchOutcome::InDoubt { .. }), "{outcome:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    second.shutdown().unwrap();
}

/// A coordinator whose `current` waits while `gate` is held (a fence check that hangs).
struct SlowFence {
    inner: Arc<InMemoryLeaseCoordinator>,
    gate: std::sync::Mutex<()>,
    entered: AtomicBool,
}

impl LeaseCoordinator for SlowFence {
    fn acquire(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<fencepost::lease::Lease, fencepost::lease::LeaseError> {
        self.inner.acquire(agent_id, device_id, ttl_ms)
    }
    fn renew(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<fencepost::lease::Lease, fencepost::lease::LeaseError> {
        self.inner.renew(agent_id, device_id, epoch, ttl_ms)
    }
    fn release(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
    ) -> Result<(), fencepost::lease::LeaseError> {
        self.inner.release(agent_id, device_id, epoch)
    }
    fn current(
        &self,
        agent_id: &str,
    ) -> Result<Option<fencepost::lease::Lease>, fencepost::lease::LeaseError> {
        self.entered.store(true, Ordering::SeqCst);
        drop(self.gate.lock().unwrap());
        self.inner.current(agent_id)
    }
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), fencepost::lease::LeaseError> {
        self.inner.raise_epoch_floor(agent_id, floor)
    }
    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &fencepost::relay::Frontier,
    ) -> Result<(), fencepost::lease::LeaseError> {
        // The fence's coordinator call: the `pending`'s publication (rule H2).
        self.entered.store(true, Ordering::SeqCst);
        drop(self.gate.lock().unwrap());
        self.inner.publish_frontier(agent_id, device_id, epoch, frontier)
    }
    fn published_frontier(
        &self,
        agent_id: &str,
    ) -> Result<fencepost::relay::Frontier, fencepost::lease::LeaseError> {
        self.inner.published_frontier(agent_id)
    }
}

/// D1 with the keeper's clock (found by an adversarial run): a fence check that answers after the
/// keeper's renew deadline does not authorize the effect, even when the coordinator (whose lease
/// had not yet been taken) said `Proceed`. The effect ran after the loss had been reported.
#[test]
fn d1_no_effect_runs_once_the_keeper_has_lost_the_lease_during_the_fence() {
    let world = World::new();
    let slow = Arc::new(SlowFence {
        inner: world.coordinator.clone(),
        gate: std::sync::Mutex::new(()),
        entered: AtomicBool::new(false),
    });
    let mut laptop = world.ledger("laptop");
    let keeper_clock = ManualClock::new(0);
    let keeper = LeaseKeeper::builder(slow.clone(), "milo", "laptop")
        .config(KeeperConfig::new(TTL_MS))
        .clock(KeeperClock::manual(&keeper_clock))
        .acquire()
        .unwrap();
    let effects = AtomicUsize::new(0);
    let gate = slow.gate.lock().unwrap();
    let outcome = std::thread::scope(|scope| {
        let dispatching = scope.spawn(|| dispatch(&keeper, &mut laptop, &run("run-1"), counting(&effects)));
        while !slow.entered.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        keeper_clock.advance(TTL_MS); // past the renew deadline while the fence waits
        assert!(keeper.wait_lost(std::time::Duration::from_secs(10)).is_some());
        drop(gate);
        dispatching.join().unwrap().unwrap()
    });
    assert!(matches!(outcome, DispatchOutcome::NotHeld { .. }), "{outcome:?}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "D1: nothing ran after the loss"
    );
}

/// D1 at the resource (found by an adversarial run): a token whose epoch no coordinator mints
/// (0, or above the range) is refused and changes nothing; it used to make every real epoch stale.
#[test]
fn d1_a_fenced_resource_refuses_an_epoch_out_of_range() {
    let resource: FencedResource<&str> = FencedResource::new();
    let token = |epoch| fencepost::fence::FencingToken {
        agent_id: "milo".into(),
        run_id: format!("run-{epoch}"),
        epoch,
    };
    for epoch in [0, fencepost::lease::MAX_EPOCH + 1, u64::MAX] {
        assert!(matches!(
            resource.apply(&token(epoch), "x"),
            Err(ResourceRefusal::EpochOutOfRange { .. })
        ));
    }
    assert_eq!(resource.highest_epoch("milo"), 0, "nothing remembered");
    resource.apply(&token(1), "x").unwrap();
}

/// A holder without a keeper (as the simulator and an async runtime have): a lease the test
/// acquired itself, and a switch for the holder's own timing.
struct StepHolder {
    coordinator: Arc<InMemoryLeaseCoordinator>,
    device: &'static str,
    epoch: u64,
    holds: bool,
}

impl fencepost::fence::Holder for StepHolder {
    fn agent_id(&self) -> &str {
        "milo"
    }
    fn device_id(&self) -> &str {
        self.device
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn holds(&self) -> bool {
        self.holds
    }
    fn coordinator(&self) -> &dyn LeaseCoordinator {
        &*self.coordinator
    }
}

/// Issue 15, item 2 (rules D1, D2): dispatch in steps, with time passing between them. `begin`
/// stores the `pending` before it lets the effect run, so another site that syncs sees the run in
/// doubt while the effect is under way, and refuses it; `finish` records the outcome, which the
/// other site's oracle then refuses; `abandon` records nothing. A holder whose own timing says
/// the lease is gone gets nothing, and writes nothing.
#[test]
fn d1_d2_dispatch_in_steps_shares_the_pending_before_the_effect_and_the_outcome_after() {
    use fencepost::dispatch::{Refusal, RunOutcome};
    let world = World::new();
    let mut laptop = world.ledger("laptop");
    let mut phone = world.ledger("phone");
    let lease = world.coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    let mut holder = StepHolder {
        coordinator: world.coordinator.clone(),
        device: "laptop",
        epoch: lease.epoch,
        holds: false,
    };
    assert!(matches!(
        laptop.begin(&holder, &run("report-1"), DispatchOptions::default()),
        Err(Refusal::NotHeld { claimed_epoch: 1 })
    ));
    phone.sync().unwrap();
    assert!(
        phone.in_doubt("milo", u64::MAX).is_empty(),
        "a refused begin writes nothing"
    );

    holder.holds = true;
    let permit = laptop
        .begin(&holder, &run("report-1"), DispatchOptions::default())
        .unwrap();
    assert_eq!(
        (permit.token().run_id.as_str(), permit.token().epoch),
        ("report-1", 1)
    );
    // The effect is under way; the laptop's lease runs out and the phone takes over.
    world.coordinator_clock.advance(TTL_MS + 1);
    let taken = world.coordinator.acquire("milo", "phone", TTL_MS).unwrap();
    let successor = StepHolder {
        coordinator: world.coordinator.clone(),
        device: "phone",
        epoch: taken.epoch,
        holds: true,
    };
    phone.sync().unwrap();
    match phone.begin(&successor, &run("report-1"), DispatchOptions::default()) {
        Err(Refusal::InDoubt { run }) => assert_eq!((run.epoch, run.device_id.as_str()), (1, "laptop")),
        other => panic!("the phone must see the run in doubt: {other:?}"),
    }
    // The outcome goes to the ledger that began it, only.
    let permit = match permit.finish(&mut phone, RunOutcome::Committed) {
        Err(DispatchError::DeviceMismatch { .. }) => {
            laptop.begin(&holder, &run("report-2"), DispatchOptions::default())
        }
        other => panic!("another device's ledger must be refused: {other:?}"),
    };
    // (The permit of report-1 was consumed by the refused finish; its run stays in doubt, as an
    // interrupted one does. report-2 is begun by a holder the coordinator no longer knows.)
    assert!(matches!(
        permit,
        Err(Refusal::StaleEpoch {
            claimed_epoch: 1,
            current_epoch: 2,
            ..
        })
    ));
    let permit = phone
        .begin(&successor, &run("report-3"), DispatchOptions::default())
        .unwrap();
    permit.finish(&mut phone, RunOutcome::Committed).unwrap();
    laptop.sync().unwrap();
    let laptop_again = StepHolder {
        coordinator: world.coordinator.clone(),
        device: "laptop",
        epoch: 1,
        holds: true,
    };
    assert!(matches!(
        laptop.begin(&laptop_again, &run("report-3"), DispatchOptions::default()),
        Err(Refusal::AlreadyCommitted { .. })
    ));
    // An abandoned permit leaves its run in doubt, to be retried only on purpose.
    let abandoned = phone
        .begin(&successor, &run("report-4"), DispatchOptions::default())
        .unwrap();
    let token = abandoned.abandon();
    assert_eq!(token.epoch, 2);
    assert_eq!(
        phone.in_doubt_run("milo", "report-4", 2).map(|run| run.epoch),
        Some(2)
    );
    assert!(matches!(
        phone.begin(&successor, &run("report-4"), DispatchOptions::default()),
        Err(Refusal::InDoubt { .. })
    ));
    let retried = phone
        .begin(
            &successor,
            &run("report-4"),
            DispatchOptions::default().retry_in_doubt(true),
        )
        .unwrap();
    retried.finish(&mut phone, RunOutcome::Failed).unwrap();
    assert!(phone.in_doubt_run("milo", "report-4", 2).is_none());
}

/// Rule L5 at the dispatch: a coordinator that lost its state (restored from a backup, failed
/// over to a stale copy) can grant an epoch a second time. The floor the keeper raised before its
/// first acquire was lost with that state. The ledger still shows the first holder's `pending` at
/// that epoch, so the second holder dispatches nothing (`EpochReused`) until it acquires again
/// above the ledger's epoch.
#[test]
fn l5_an_epoch_granted_twice_after_a_coordinator_state_loss_is_refused_at_dispatch() {
    use fencepost::dispatch::{Refusal, RunOutcome};
    let world = World::new();
    let mut laptop = world.ledger("laptop");
    let mut phone = world.ledger("phone");
    let first = world.coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    let holder = StepHolder {
        coordinator: world.coordinator.clone(),
        device: "laptop",
        epoch: first.epoch,
        holds: true,
    };
    let permit = laptop
        .begin(&holder, &run("report-a"), DispatchOptions::default())
        .unwrap();
    // The coordinator loses its state while the laptop's effect is under way.
    let restored = Arc::new(InMemoryLeaseCoordinator::new(
        world.coordinator_clock.wall_clock(),
    ));
    let again = restored.acquire("milo", "phone", TTL_MS).unwrap();
    assert_eq!(
        again.epoch, first.epoch,
        "the restored coordinator grants the same epoch again"
    );
    phone.sync().unwrap();
    let twin = StepHolder {
        coordinator: restored.clone(),
        device: "phone",
        epoch: again.epoch,
        holds: true,
    };
    match phone.begin(&twin, &run("report-b"), DispatchOptions::default()) {
        Err(Refusal::Error(DispatchError::EpochReused {
            epoch, other_device, ..
        })) => assert_eq!((epoch, other_device.as_str()), (1, "laptop")),
        other => panic!("two holders would share epoch 1: {other:?}"),
    }
    assert_eq!(
        phone.epoch_used_by_another(&claim("milo", 1, "laptop")),
        None,
        "the laptop's own epoch"
    );
    // Acquiring again above the ledger's epoch gives a token of its own.
    restored.release("milo", "phone", again.epoch).unwrap();
    restored
        .raise_epoch_floor("milo", phone.state().fencing_epoch("milo"))
        .unwrap();
    let third = restored.acquire("milo", "phone", TTL_MS).unwrap();
    assert_eq!(third.epoch, 2);
    let fresh = StepHolder {
        coordinator: restored,
        device: "phone",
        epoch: third.epoch,
        holds: true,
    };
    let permit_b = phone
        .begin(&fresh, &run("report-b"), DispatchOptions::default())
        .unwrap();
    permit_b.finish(&mut phone, RunOutcome::Committed).unwrap();
    permit.finish(&mut laptop, RunOutcome::Committed).unwrap();
}

/// Issue 15, item 2 (rules D2, O1): what a ledger knows is a value with no I/O (`LedgerState`):
/// fed records directly, it verifies them, folds them and answers the in-doubt questions exactly
/// as a `Ledger` over a relay does; a record whose id does not match its content is rejected, not
/// folded, and stays damage until a valid one takes its place.
#[test]
fn d2_o1_the_ledger_state_answers_without_a_relay_as_the_ledger_does() {
    use fencepost::ledger::LedgerState;
    let records = device_log(
        "laptop",
        &[
            (1, IntentStatus::Pending),
            (2, IntentStatus::Pending),
            (2, IntentStatus::Failed),
        ],
    );
    let mut view = LedgerState::new();
    assert_eq!(view.absorb(&records).len(), 3);
    assert_eq!(
        view.absorb(&records).len(),
        0,
        "records already folded are skipped"
    );
    let relay = Arc::new(InMemoryRelay::new());
    relay.push(&records).unwrap();
    let ledger = Ledger::open("phone", ManualClock::new(START_MS).wall_clock(), relay).unwrap();
    assert_eq!(view.in_doubt("milo", u64::MAX), ledger.in_doubt("milo", u64::MAX));
    assert_eq!(
        view.in_doubt("milo", u64::MAX).len(),
        1,
        "the pending@1 is in doubt; @2 is settled"
    );
    assert_eq!(view.state().state_hash(), ledger.state().state_hash());
    // A forged record: its content changed, its id kept.
    let forged = device_log("phone", &[(3, IntentStatus::Committed)]);
    let mut tampered = forged[0].clone();
    tampered.payload = Intent::new("milo", "run-d2", 3, IntentStatus::Failed)
        .payload()
        .into();
    assert!(view.absorb(std::slice::from_ref(&tampered)).is_empty());
    assert_eq!(view.rejected().count(), 1);
    assert_eq!(view.absorb(&forged).len(), 1, "the valid record takes its place");
    assert_eq!(view.rejected().count(), 0);
}

/// Rule L5 at acquisition: a fresh grant is above every epoch the ledger has seen; the ledger
/// names why one is not (below its epoch, another device's `pending` at it, or only this device
/// id's own records at it), which is what `fencepost run` acquires again on.
#[test]
fn l5_the_ledger_names_a_grant_that_is_not_fresh() {
    use fencepost::ledger::StaleGrant;
    let relay = Arc::new(InMemoryRelay::new());
    relay
        .push(&device_log(
            "laptop",
            &[(1, IntentStatus::Pending), (2, IntentStatus::Pending)],
        ))
        .unwrap();
    let ledger = Ledger::open("phone", ManualClock::new(START_MS).wall_clock(), relay).unwrap();
    assert_eq!(ledger.stale_grant(&claim("milo", 3, "phone")), None);
    assert_eq!(
        ledger.stale_grant(&claim("milo", 1, "phone")),
        Some(StaleGrant::BelowLedger { fencing_epoch: 2 })
    );
    assert_eq!(
        ledger.stale_grant(&claim("milo", 2, "phone")),
        Some(StaleGrant::HeldBy {
            device_id: "laptop".into()
        })
    );
    assert_eq!(
        ledger.stale_grant(&claim("milo", 2, "laptop")),
        Some(StaleGrant::UsedBefore)
    );
    assert_eq!(ledger.stale_grant(&claim("other-agent", 1, "phone")), None);
}

/// The claim of `agent` by `device` at `epoch`.
fn claim(agent: &str, epoch: u64, device: &str) -> fencepost::id::Claim {
    fencepost::id::Claim {
        agent: fencepost::id::AgentId::new(agent).unwrap(),
        device: fencepost::id::DeviceId::new(device).unwrap(),
        epoch: fencepost::id::Epoch::new(epoch).unwrap(),
    }
}

/// A run id of the tests' own (valid).
fn run(id: &str) -> fencepost::id::RunId {
    fencepost::id::RunId::new(id).unwrap()
}
