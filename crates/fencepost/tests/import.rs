//! Rule S4: an unprotected ledger imported into a protected one (`Ledger::import`) keeps the
//! oracle, the fencing epochs and the runs in doubt, and hands every agent over to the
//! importing device's log; an import is made once, and refused where it would mix ledgers.

use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::id::DeviceId;
use fencepost::identity::DeviceKey;
use fencepost::lease::{InMemoryLeaseCoordinator, Intent, IntentStatus, Lease, LeaseCoordinator, LeaseError};
use fencepost::ledger::{ImportError, ImportSource, Ledger, LedgerError, LedgerOptions, IMPORT_REGISTRY};
use fencepost::oplog::OpRecord;
use fencepost::protected::Origin;
use fencepost::relay::{Frontier, FsRelay, Relay};

const NOW_MS: u64 = 1_764_400_000_000;

fn relay(folder: &std::path::Path) -> Arc<dyn Relay> {
    Arc::new(FsRelay::open(folder).unwrap())
}

/// An unprotected ledger of two hosts: `send` committed at epochs 1 and 3, a run of `charge`
/// in doubt at epoch 4 and a failed one; returns its records as the relay holds them.
fn old_ledger(folder: &std::path::Path) -> Vec<OpRecord> {
    let clock = ManualClock::new(NOW_MS - 60_000);
    let mut laptop = Ledger::open("laptop", clock.wall_clock(), relay(folder)).unwrap();
    let mut server = Ledger::open("server", clock.wall_clock(), relay(folder)).unwrap();
    let write = |ledger: &mut Ledger, agent: &str, run: &str, epoch: u64, statuses: &[IntentStatus]| {
        for status in statuses {
            ledger.record(&Intent::new(agent, run, epoch, *status)).unwrap();
            clock.advance(1);
        }
    };
    use IntentStatus::{Committed, Failed, Pending};
    write(&mut laptop, "send", "monday", 1, &[Pending, Committed]);
    write(&mut server, "send", "tuesday", 3, &[Pending, Committed]);
    write(&mut server, "charge", "invoice-7", 4, &[Pending]);
    write(&mut laptop, "charge", "invoice-6", 2, &[Pending, Failed]);
    relay(folder).pull(&Frontier::new()).unwrap().ops
}

struct Founded {
    folder: tempfile::TempDir,
    key: Arc<DeviceKey>,
    origin: Origin,
    ledger: fencepost::identity::LedgerId,
}

/// A new protected ledger founded by `laptop`.
fn found() -> (Founded, Ledger) {
    let folder = tempfile::tempdir().unwrap();
    let key = Arc::new(DeviceKey::from_secrets(
        DeviceId::new("laptop").unwrap(),
        [1; 32],
        [2; 32],
    ));
    let clock = ManualClock::new(NOW_MS);
    let (ledger, founded) = Ledger::found(
        Arc::clone(&key),
        clock.wall_clock(),
        relay(folder.path()),
        LedgerOptions::default(),
    )
    .unwrap();
    let founded = Founded {
        folder,
        key,
        ledger: founded.genesis.ledger_id(),
        origin: Origin::Genesis(founded.genesis),
    };
    (founded, ledger)
}

impl Founded {
    /// The founder's ledger, opened again from the folder.
    fn reopen(&self) -> Ledger {
        let protected = fencepost::ledger::Protected {
            ledger: self.ledger,
            device_key: Arc::clone(&self.key),
            origin: self.origin.clone(),
            keys: Vec::new(),
            members: Vec::new(),
        };
        Ledger::open_with(
            "laptop",
            ManualClock::new(NOW_MS).wall_clock(),
            relay(self.folder.path()),
            LedgerOptions::default().protected(protected),
        )
        .unwrap()
    }
}

/// `records` as a source whose coordinator knows their agents and published nothing.
fn source(records: &[OpRecord]) -> ImportSource {
    let mut agents: Vec<String> = records
        .iter()
        .filter_map(|op| op.payload.intent().map(|intent| intent.agent_id))
        .collect();
    agents.sort();
    agents.dedup();
    ImportSource {
        records: records.to_vec(),
        published: agents.into_iter().map(|agent| (agent, Frontier::new())).collect(),
    }
}

fn coordinator() -> InMemoryLeaseCoordinator {
    InMemoryLeaseCoordinator::new(ManualClock::new(NOW_MS).wall_clock())
}

/// S4: the imported ledger, read again from its folder, holds every commit, the fencing epoch of
/// every agent and the run in doubt; its folder names none of them; every agent's frontier names
/// the importer's log through the import, and the next grant is above the fencing epoch.
#[test]
fn s4_an_import_keeps_the_oracle_the_fencing_epochs_and_the_hand_off() {
    let old = tempfile::tempdir().unwrap();
    let records = old_ledger(old.path());
    let old_reading =
        Ledger::open("reader", ManualClock::new(NOW_MS).wall_clock(), relay(old.path())).unwrap();
    let (founded, mut ledger) = found();
    let coordinator = coordinator();
    let imported = ledger.import(source(&records), &coordinator, 10_000).unwrap();
    assert_eq!(imported.records, 7);
    assert!(!imported.already);
    assert_eq!(imported.agents, vec!["charge", "send"]);

    let reopened = founded.reopen();
    for ledger in [&ledger, &reopened] {
        let state = ledger.state();
        for (agent, run) in [("send", "monday"), ("send", "tuesday")] {
            assert_eq!(
                state.committed_run(agent, run).map(|record| record.epoch),
                old_reading
                    .state()
                    .committed_run(agent, run)
                    .map(|record| record.epoch),
                "S4: the commit of {agent}/{run} is kept"
            );
        }
        assert_eq!(state.fencing_epoch("send"), 3);
        assert_eq!(state.fencing_epoch("charge"), 4);
        let in_doubt: Vec<String> = ledger
            .in_doubt("charge", 5)
            .into_iter()
            .map(|run| run.run_id)
            .collect();
        assert_eq!(in_doubt, vec!["invoice-7"], "S4: the run in doubt stays in doubt");
        assert_eq!(
            state.intent("charge", "invoice-6").map(|record| record.status),
            Some(IntentStatus::Failed)
        );
        assert!(state.registry(IMPORT_REGISTRY, &imported.digest).is_some());
    }
    let head = reopened.view().frontier().next_seq("laptop");
    for agent in ["send", "charge"] {
        let published = coordinator.published_frontier(agent).unwrap();
        assert_eq!(
            published.iter().collect::<Vec<_>>(),
            vec![("laptop", head)],
            "S4: {agent} is handed over to the importer's log through the import"
        );
        assert!(
            coordinator.current(agent).unwrap().is_none(),
            "the lease was given back"
        );
        let grant = coordinator.acquire(agent, "phone", 10_000).unwrap();
        assert!(grant.epoch > reopened.state().fencing_epoch(agent));
    }
    let file = std::fs::read_to_string(
        founded
            .folder
            .path()
            .join("devices")
            .join(fencepost::relay::device_file_name("laptop")),
    )
    .unwrap();
    for secret in ["send", "charge", "monday", "invoice", "committed", "pending"] {
        assert!(!file.contains(secret), "S4: {secret:?} in the protected folder");
    }
}

/// S4: run again (a crash after the copy, before the frontiers), an import copies nothing and
/// publishes again; into a ledger that holds other runs, from a protected ledger, or onto a
/// coordinator that holds another ledger's frontiers or a live lease, it copies nothing.
#[test]
fn s4_an_import_is_made_once_and_never_mixes_two_ledgers() {
    let old = tempfile::tempdir().unwrap();
    let records = old_ledger(old.path());

    let (founded, mut ledger) = found();
    ledger.import(source(&records), &coordinator(), 10_000).unwrap();
    let head = ledger.view().frontier().next_seq("laptop");
    let fresh = coordinator();
    let again = founded.reopen().import(source(&records), &fresh, 10_000).unwrap();
    assert!(again.already, "S4: the import is found whole");
    assert_eq!(again.records, 0);
    assert_eq!(founded.reopen().view().frontier().next_seq("laptop"), head);
    assert_eq!(fresh.published_frontier("send").unwrap().next_seq("laptop"), head);

    let refused = |ledger: &mut Ledger, records: Vec<OpRecord>, coordinator: &dyn LeaseCoordinator| {
        let before = ledger.view().frontier().next_seq("laptop");
        let error = ledger.import(source(&records), coordinator, 10_000).unwrap_err();
        assert_eq!(
            ledger.view().frontier().next_seq("laptop"),
            before,
            "S4: nothing copied when refused ({error})"
        );
        error
    };
    // Other records: the import of the old ledger's first records only is another import.
    let error = refused(&mut founded.reopen(), records[..2].to_vec(), &coordinator());
    assert!(
        matches!(error, LedgerError::Import(ImportError::NotEmpty { .. })),
        "{error}"
    );

    // The old ledger's coordinator: its frontiers name the old logs.
    let (_, mut empty) = found();
    let old_coordinator = coordinator();
    let lease = old_coordinator.acquire("send", "server", 10_000).unwrap();
    let mut old_frontier = Frontier::new();
    old_frontier.raise("server", 4);
    old_coordinator
        .release_publishing("send", "server", lease.epoch, &old_frontier)
        .unwrap();
    let error = refused(&mut empty, records.clone(), &old_coordinator);
    assert!(
        matches!(error, LedgerError::Import(ImportError::FrontierPublished { .. })),
        "{error}"
    );
    // A host holds an agent.
    let busy = coordinator();
    busy.acquire("charge", "server", 10_000).unwrap();
    let error = refused(&mut empty, records.clone(), &busy);
    assert!(
        matches!(error, LedgerError::Import(ImportError::Held { .. })),
        "{error}"
    );
    // A protected ledger's records.
    let sealed = fencepost::relay::FsRelay::open(founded.folder.path())
        .unwrap()
        .pull(&Frontier::new())
        .unwrap()
        .ops;
    let error = refused(&mut empty, sealed, &coordinator());
    assert!(
        matches!(error, LedgerError::Import(ImportError::SourceProtected)),
        "{error}"
    );
    // An unprotected ledger imports nothing.
    let plain = tempfile::tempdir().unwrap();
    let mut plain = Ledger::open(
        "laptop",
        ManualClock::new(NOW_MS).wall_clock(),
        relay(plain.path()),
    )
    .unwrap();
    assert!(matches!(
        plain.import(source(&records), &coordinator(), 10_000),
        Err(LedgerError::NotProtected)
    ));
}

/// S4 (found by an adversary): a copy of the old ledger that lacks records its coordinator
/// published (a sync that lags) is refused; an import stopped after it took the leases leaves
/// every agent's frontier at the count the import was to reach, so a host waits (rule H3) and
/// never runs an imported occurrence meanwhile; and while one import holds the leases, another
/// is refused.
#[test]
fn s4_an_import_from_a_lagging_copy_or_stopped_midway_runs_nothing_again() {
    let old = tempfile::tempdir().unwrap();
    let records = old_ledger(old.path());
    let (_, ledger_to_refuse) = found();
    let mut ledger = ledger_to_refuse;
    let mut published = Frontier::new();
    published.raise("server", 6); // the server's log holds 3 records
    let mut behind = source(&records);
    behind.published[1].1 = published; // send
                                       // A coordinator that knows none of the agents is not the old ledger's (found by an
                                       // adversary: a misspelt path made an empty one, and a lagging copy was imported).
    let error = ledger
        .import(
            ImportSource {
                records: records.clone(),
                published: Vec::new(),
            },
            &coordinator(),
            10_000,
        )
        .unwrap_err();
    assert!(
        matches!(error, LedgerError::Import(ImportError::SourceAgentUnknown { .. })),
        "S4: {error}"
    );
    let error = ledger.import(behind, &coordinator(), 10_000).unwrap_err();
    assert!(
        matches!(
            error,
            LedgerError::Import(ImportError::SourceBehind {
                has: 3,
                published: 6,
                ..
            })
        ),
        "S4: {error}"
    );

    // A record no log holds is refused before anything is written or published.
    let mut refused = records.clone();
    let mut huge = records[0].clone();
    huge.surface = fencepost::oplog::Surface::log("notes");
    huge.payload = fencepost::oplog::Payload::new(serde_json::json!({"note": "x".repeat(2_000_000)}));
    refused.push(huge);
    let untouched = coordinator();
    let before = ledger.view().frontier().next_seq("laptop");
    assert!(ledger.import(source(&refused), &untouched, 10_000).is_err());
    assert_eq!(
        ledger.view().frontier().next_seq("laptop"),
        before,
        "nothing copied"
    );
    assert!(
        untouched.published_frontier("send").unwrap().is_empty(),
        "nothing published"
    );

    // Stopped after the copy, before the hand-off (the coordinator fails a renewal): the
    // frontier published first names the import's end, so a host whose copy lags waits.
    let (founded, mut ledger) = found();
    let lagging = founded.reopen();
    let stopping = RenewalsFail {
        inner: coordinator(),
        renewals_left: std::sync::atomic::AtomicU32::new(2), // one per agent, then none
        acquires_fail: false,
    };
    assert!(ledger.import(source(&records), &stopping, 10_000).is_err());
    let reach = ledger.view().frontier().next_seq("laptop");
    for agent in ["send", "charge"] {
        let published = stopping.published_frontier(agent).unwrap();
        assert_eq!(
            published.next_seq("laptop"),
            reach,
            "S4: the import's end, published first"
        );
        assert!(
            !lagging.behind(&published).is_empty(),
            "S4: a lagging host waits for it"
        );
    }
    // Run again, the import is found whole and hands over.
    let again = founded
        .reopen()
        .import(source(&records), &stopping.inner, 10_000)
        .unwrap();
    assert!(again.already);
    assert!(stopping
        .inner
        .published_frontier("send")
        .unwrap()
        .head("laptop")
        .is_some());

    // Another import holds the leases: this one is refused.
    let (_, mut other) = found();
    let busy = coordinator();
    busy.acquire("charge", "laptop", 10_000).unwrap();
    let error = other.import(source(&records), &busy, 10_000).unwrap_err();
    assert!(
        matches!(error, LedgerError::Import(ImportError::Held { .. })),
        "{error}"
    );
}

/// A coordinator whose renewals fail once `renewals_left` is spent, and whose grants fail
/// with `acquires_fail`.
struct RenewalsFail {
    inner: InMemoryLeaseCoordinator,
    renewals_left: std::sync::atomic::AtomicU32,
    acquires_fail: bool,
}

fn failed() -> LeaseError {
    LeaseError::Backend(fencepost::lease::BackendError {
        backend: "test",
        message: "it fails".to_owned(),
        may_have_applied: false,
        transient: false,
        source: None,
    })
}

impl LeaseCoordinator for RenewalsFail {
    fn acquire(&self, agent: &str, device: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        if self.acquires_fail {
            return Err(failed());
        }
        self.inner.acquire(agent, device, ttl_ms)
    }
    fn renew(&self, agent: &str, device: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        let left = self.renewals_left.load(std::sync::atomic::Ordering::SeqCst);
        if left == 0 {
            return Err(failed());
        }
        self.renewals_left
            .store(left - 1, std::sync::atomic::Ordering::SeqCst);
        self.inner.renew(agent, device, epoch, ttl_ms)
    }
    fn release(&self, agent: &str, device: &str, epoch: u64) -> Result<(), LeaseError> {
        self.inner.release(agent, device, epoch)
    }
    fn current(&self, agent: &str) -> Result<Option<Lease>, LeaseError> {
        self.inner.current(agent)
    }
    fn raise_epoch_floor(&self, agent: &str, floor: u64) -> Result<(), LeaseError> {
        self.inner.raise_epoch_floor(agent, floor)
    }
    fn publish_frontier(
        &self,
        agent: &str,
        device: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        self.inner.publish_frontier(agent, device, epoch, frontier)
    }
    fn published_frontier(&self, agent: &str) -> Result<Frontier, LeaseError> {
        self.inner.published_frontier(agent)
    }
}

/// S4 (found by an adversary): the import's beginning is its first record, before any lease:
/// stopped right after it (the coordinator fails its grants), every hand-off of the ledger
/// waits for the import, whatever the coordinator published; run again, it completes. A member
/// whose log is empty imports too (its record 0 counted: it failed after copying everything).
#[test]
fn s4_an_import_that_began_is_waited_for_and_a_new_members_import_completes() {
    let old = tempfile::tempdir().unwrap();
    let records = old_ledger(old.path());
    let (founded, mut founder) = found();
    let phone = Arc::new(DeviceKey::from_secrets(
        DeviceId::new("phone").unwrap(),
        [11; 32],
        [12; 32],
    ));
    founder.admit(phone.device(), &phone.public()).unwrap();
    let on_phone = |founded: &Founded| {
        let protected = fencepost::ledger::Protected {
            ledger: founded.ledger,
            device_key: Arc::clone(&phone),
            origin: Origin::Identity(phone.public()),
            keys: Vec::new(),
            members: Vec::new(),
        };
        Ledger::open_with(
            "phone",
            ManualClock::new(NOW_MS).wall_clock(),
            relay(founded.folder.path()),
            LedgerOptions::default().protected(protected),
        )
        .unwrap()
    };
    let refusing = RenewalsFail {
        inner: coordinator(),
        renewals_left: std::sync::atomic::AtomicU32::new(u32::MAX),
        acquires_fail: true,
    };
    let mut importer = on_phone(&founded);
    assert!(importer.import(source(&records), &refusing, 10_000).is_err());
    let waiting = founded.reopen().behind(&Frontier::new());
    assert_eq!(waiting.len(), 1, "S4: the import is waited for: {waiting:?}");
    assert_eq!(waiting[0].device_id, "phone");

    let coordinator = coordinator();
    let imported = on_phone(&founded)
        .import(source(&records), &coordinator, 10_000)
        .unwrap();
    assert_eq!(imported.records, 7);
    let reader = founded.reopen();
    assert!(reader.behind(&Frontier::new()).is_empty(), "S4: the import ended");
    assert!(reader
        .behind(&coordinator.published_frontier("send").unwrap())
        .is_empty());
    assert!(reader.state().committed_run("send", "monday").is_some());
}
