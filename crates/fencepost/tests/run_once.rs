//! `run_once` (issue 38): one occurrence from two devices through the library's run session,
//! showing what `fencepost run` shows: a lagging relay makes the second device wait for the
//! ledger (rule H3) and then find the run committed; a coordinator that forgot its state grants
//! above the ledger's epoch (rule L5). Never a second effect, never a reused epoch.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fencepost::clock::system_clock;
use fencepost::lease::{InMemoryLeaseCoordinator, Lease, LeaseCoordinator, LeaseError};
use fencepost::ledger::{Ledger, StaleGrant};
use fencepost::oplog::OpRecord;
use fencepost::relay::{
    Appended, Frontier, InMemoryRelay, MakeRecords, PullBatch, PushReport, Relay, RelayError,
};
use fencepost::run::{run_once, run_once_with, Occurrence, Outcome, RunHooks, RunOptions};
use fencepost::session::Stage;
use fencepost::session::FRESH_GRANT_ATTEMPTS;

/// One device's view of a shared relay, which does not bring `hidden`'s records while `lagging`
/// is set (a synced folder still copying them).
struct Lagging {
    shared: Arc<InMemoryRelay>,
    hidden: &'static str,
    lagging: AtomicBool,
}

impl Lagging {
    fn new(shared: &Arc<InMemoryRelay>, hidden: &'static str) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::clone(shared),
            hidden,
            lagging: AtomicBool::new(true),
        })
    }

    fn catch_up(&self) {
        self.lagging.store(false, Ordering::SeqCst);
    }
}

impl Relay for Lagging {
    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        self.shared.push(ops)
    }
    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        let mut batch = self.shared.pull(since)?;
        if self.lagging.load(Ordering::SeqCst) {
            batch.ops.retain(|op| &*op.device_id != self.hidden);
        }
        Ok(batch)
    }
    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError> {
        self.shared.append(device_id, since_seq, make)
    }
}

/// Counts the effects of each run, and the epochs they ran under.
#[derive(Default)]
struct Effects {
    runs: Mutex<Vec<(String, u64)>>,
}

impl Effects {
    fn effect(&self) -> impl FnOnce(&fencepost::run::EffectContext<'_>) -> Result<u64, std::io::Error> + '_ {
        move |context| {
            let token = context.token();
            self.runs
                .lock()
                .unwrap()
                .push((token.run_id.clone(), token.epoch));
            Ok(token.epoch)
        }
    }

    fn assert_once_each(&self) {
        let runs = self.runs.lock().unwrap();
        let ids: BTreeSet<_> = runs.iter().map(|(run, _)| run).collect();
        assert_eq!(ids.len(), runs.len(), "a run ran twice: {runs:?}");
        let epochs: BTreeSet<_> = runs.iter().map(|(_, epoch)| epoch).collect();
        assert_eq!(epochs.len(), runs.len(), "an epoch was used twice: {runs:?}");
    }
}

fn options(wait_ms: u64) -> RunOptions {
    RunOptions::new(5_000).wait_ms(wait_ms).poll_ms(20)
}

#[test]
fn h3_a_lagging_relay_makes_the_second_device_wait_then_find_the_run_committed() {
    let coordinator: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let shared = Arc::new(InMemoryRelay::new());
    let mut laptop = Ledger::open("laptop", system_clock(), shared.clone()).unwrap();
    let phone_view = Lagging::new(&shared, "laptop");
    let mut phone = Ledger::open("phone", system_clock(), phone_view.clone()).unwrap();
    let effects = Effects::default();
    let report = Occurrence::new("milo", "send the weekly report", "2026-12-06").unwrap();

    let first = run_once(
        coordinator.clone(),
        &mut laptop,
        &report,
        &options(0),
        effects.effect(),
    )
    .unwrap();
    assert!(
        matches!(first, Outcome::Committed { epoch, value: 1 } if epoch == 1),
        "{first:?}"
    );

    // The phone's copy lacks the laptop's records, which the laptop published at its release:
    // with no wait, the phone does not run it (exit 7 in the CLI).
    let behind = run_once(
        coordinator.clone(),
        &mut phone,
        &report,
        &options(0),
        effects.effect(),
    )
    .unwrap();
    let Outcome::LedgerBehind { missing } = &behind else {
        panic!("expected LedgerBehind, got {behind:?}");
    };
    assert_eq!(missing[0].device_id, "laptop");

    // With a wait, it waits; the relay catches up meanwhile; the fence finds the commit.
    let catching_up = std::thread::spawn({
        let phone_view = phone_view.clone();
        move || {
            std::thread::sleep(std::time::Duration::from_millis(150));
            phone_view.catch_up();
        }
    });
    let waited = run_once(
        coordinator.clone(),
        &mut phone,
        &report,
        &options(5_000),
        effects.effect(),
    )
    .unwrap();
    catching_up.join().unwrap();
    assert!(
        matches!(
            waited,
            Outcome::AlreadyCommitted {
                before_lease: false,
                ..
            }
        ),
        "{waited:?}"
    );
    // And from now on the oracle says so before any lease.
    let again = run_once(
        coordinator.clone(),
        &mut phone,
        &report,
        &options(0),
        effects.effect(),
    )
    .unwrap();
    assert!(
        matches!(
            again,
            Outcome::AlreadyCommitted {
                before_lease: true,
                ..
            }
        ),
        "{again:?}"
    );
    assert_eq!(effects.runs.lock().unwrap().len(), 1);
    effects.assert_once_each();
    assert!(
        coordinator.current("milo").unwrap().is_none(),
        "every session released its lease"
    );
}

#[test]
fn l5_a_coordinator_that_forgot_its_state_grants_above_an_up_to_date_ledgers_epoch() {
    let shared = Arc::new(InMemoryRelay::new());
    let mut laptop = Ledger::open("laptop", system_clock(), shared.clone()).unwrap();
    let mut phone = Ledger::open("phone", system_clock(), shared.clone()).unwrap();
    let effects = Effects::default();
    let monday = Occurrence::new("milo", "back up", "monday").unwrap();
    let tuesday = Occurrence::new("milo", "back up", "tuesday").unwrap();

    let before: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let ran = run_once(before, &mut laptop, &monday, &options(0), effects.effect()).unwrap();
    assert!(
        matches!(ran, Outcome::Committed { epoch, .. } if epoch == 1),
        "{ran:?}"
    );

    // The coordinator is replaced by one with no state (a database restored from nothing); the
    // phone's ledger is up to date.
    phone.sync().unwrap();
    let forgot: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let again = run_once(forgot.clone(), &mut phone, &monday, &options(0), effects.effect()).unwrap();
    assert!(
        matches!(
            again,
            Outcome::AlreadyCommitted {
                before_lease: true,
                ..
            }
        ),
        "{again:?}"
    );
    let next = run_once(forgot, &mut phone, &tuesday, &options(0), effects.effect()).unwrap();
    assert!(
        matches!(next, Outcome::Committed { epoch, .. } if epoch == 2),
        "above the ledger's epoch 1: {next:?}"
    );
    effects.assert_once_each();
}

/// What the hooks saw.
#[derive(Default)]
struct Seen {
    stale: Vec<(u64, StaleGrant)>,
    acquiring: usize,
}

struct Catching<'a> {
    seen: &'a mut Seen,
    view: Arc<Lagging>,
}

impl RunHooks for Catching<'_> {
    fn acquiring(&mut self) {
        self.seen.acquiring += 1;
        // The copy catches up between the oracle and the grant's check: the floor was raised from
        // a ledger that did not know the laptop's epoch yet.
        self.view.catch_up();
    }
    fn stale_grant(&mut self, epoch: fencepost::id::Epoch, why: &StaleGrant) {
        self.seen.stale.push((epoch.get(), why.clone()));
    }
}

#[test]
fn l5_a_grant_the_ledger_has_seen_is_given_back_and_acquired_again_above_it() {
    let shared = Arc::new(InMemoryRelay::new());
    let mut laptop = Ledger::open("laptop", system_clock(), shared.clone()).unwrap();
    let effects = Effects::default();
    let monday = Occurrence::new("milo", "back up", "monday").unwrap();
    let tuesday = Occurrence::new("milo", "back up", "tuesday").unwrap();
    let before: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    run_once(before, &mut laptop, &monday, &options(0), effects.effect()).unwrap();

    // A coordinator that forgot its state, and a phone whose copy lags at first.
    let forgot: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let view = Lagging::new(&shared, "laptop");
    let mut phone = Ledger::open("phone", system_clock(), view.clone()).unwrap();
    let mut seen = Seen::default();
    let mut hooks = Catching {
        seen: &mut seen,
        view,
    };
    let ran = run_once_with(
        forgot.clone(),
        &mut phone,
        &tuesday,
        &options(0),
        &mut hooks,
        |context| fencepost::dispatch::EffectOutcome::<u64, std::io::Error>::Succeeded(context.token().epoch),
    )
    .unwrap();
    assert_eq!(
        seen.stale,
        vec![(
            1,
            StaleGrant::HeldBy {
                device_id: "laptop".into()
            }
        )],
        "epoch 1 was the laptop's: given back"
    );
    assert_eq!(seen.acquiring, 1, "one acquisition, two grants");
    assert!(
        matches!(ran, Outcome::Committed { epoch, .. } if epoch == 2),
        "{ran:?}"
    );
    assert!(forgot.current("milo").unwrap().is_none(), "released");
    effects.assert_once_each();
}

/// A coordinator that forgets its state before every grant (and the floor raised before it):
/// it grants epoch 1 each time.
struct Amnesiac {
    inner: Mutex<Arc<InMemoryLeaseCoordinator>>,
    grants: AtomicUsize,
}

impl Amnesiac {
    fn inner(&self) -> Arc<InMemoryLeaseCoordinator> {
        self.inner.lock().unwrap().clone()
    }
}

impl LeaseCoordinator for Amnesiac {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        self.grants.fetch_add(1, Ordering::SeqCst);
        *self.inner.lock().unwrap() = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
        self.inner().acquire(agent_id, device_id, ttl_ms)
    }
    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        self.inner().renew(agent_id, device_id, epoch, ttl_ms)
    }
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        self.inner().release(agent_id, device_id, epoch)
    }
    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        self.inner().current(agent_id)
    }
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        self.inner().raise_epoch_floor(agent_id, floor)
    }
    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        self.inner()
            .publish_frontier(agent_id, device_id, epoch, frontier)
    }
    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError> {
        self.inner().published_frontier(agent_id)
    }
}

#[test]
fn l5_a_coordinator_that_keeps_granting_a_seen_epoch_is_given_up_on_and_nothing_runs() {
    let shared = Arc::new(InMemoryRelay::new());
    let mut laptop = Ledger::open("laptop", system_clock(), shared.clone()).unwrap();
    let mut phone = Ledger::open("phone", system_clock(), shared.clone()).unwrap();
    let effects = Effects::default();
    let before: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let monday = Occurrence::new("milo", "back up", "monday").unwrap();
    run_once(before, &mut laptop, &monday, &options(0), effects.effect()).unwrap();

    let amnesiac = Arc::new(Amnesiac {
        inner: Mutex::new(Arc::new(InMemoryLeaseCoordinator::new(system_clock()))),
        grants: AtomicUsize::new(0),
    });
    let tuesday = Occurrence::new("milo", "back up", "tuesday").unwrap();
    let error = run_once(
        amnesiac.clone(),
        &mut phone,
        &tuesday,
        &options(0),
        effects.effect(),
    )
    .unwrap_err();
    assert!(
        matches!(error, fencepost::run::RunError::StaleGrants { epoch, .. } if epoch == 1),
        "{error}"
    );
    assert_eq!(
        amnesiac.grants.load(Ordering::SeqCst),
        FRESH_GRANT_ATTEMPTS as usize
    );
    assert_eq!(effects.runs.lock().unwrap().len(), 1, "tuesday did not run");
}

#[test]
fn a_stop_while_waiting_for_the_ledger_gives_the_lease_back() {
    let coordinator: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let shared = Arc::new(InMemoryRelay::new());
    let mut laptop = Ledger::open("laptop", system_clock(), shared.clone()).unwrap();
    let mut phone = Ledger::open("phone", system_clock(), Lagging::new(&shared, "laptop")).unwrap();
    let effects = Effects::default();
    let report = Occurrence::new("milo", "send", "1").unwrap();
    run_once(
        coordinator.clone(),
        &mut laptop,
        &report,
        &options(0),
        effects.effect(),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = std::thread::spawn({
        let stop = stop.clone();
        move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            stop.store(true, Ordering::SeqCst);
        }
    });
    let when = stop.clone();
    let options = options(10_000).stop_when(Arc::new(move || when.load(Ordering::SeqCst)));
    let stopped = run_once(
        coordinator.clone(),
        &mut phone,
        &report,
        &options,
        effects.effect(),
    )
    .unwrap();
    stopping.join().unwrap();
    assert!(
        matches!(
            stopped,
            Outcome::Stopped {
                stage: Stage::WaitingForLedger
            }
        ),
        "{stopped:?}"
    );
    assert!(coordinator.current("milo").unwrap().is_none(), "given back");
    assert_eq!(effects.runs.lock().unwrap().len(), 1);
}
