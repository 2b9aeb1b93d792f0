//! The outbox (issue 37, item 6): a record the relay could not store (a database restarting)
//! is tried again within a bound, then kept on the site and stored by the next ledger opened
//! with it; never dropped, never decided around. Rules D1 (the fence's record of an attempt),
//! D2 (no run left in doubt by a blip) and R1 (a damaged file loses nothing).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencepost::clock::ManualClock;
use fencepost::dispatch::{dispatch_effect, DispatchOptions, EffectOutcome};
use fencepost::keeper::{KeeperConfig, LeaseKeeper};
use fencepost::lease::{InMemoryLeaseCoordinator, IntentStatus};
use fencepost::ledger::{Ledger, LedgerError, LedgerOptions};
use fencepost::oplog::OpRecord;
use fencepost::relay::{
    Appended, Frontier, InMemoryRelay, MakeRecords, PullBatch, PushReport, Relay, RelayError,
};

/// A relay whose database is away for the next `failures` appends (a transient error, as
/// PostgreSQL's relay reports a restart), or for good with a failure that does not pass.
struct Blinking {
    inner: InMemoryRelay,
    failures: AtomicUsize,
    permanent: std::sync::atomic::AtomicBool,
}

impl Blinking {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: InMemoryRelay::new(),
            failures: AtomicUsize::new(0),
            permanent: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn down_for(&self, appends: usize) {
        self.failures.store(appends, Ordering::SeqCst);
    }

    fn failure(&self) -> Option<RelayError> {
        if self.permanent.load(Ordering::SeqCst) {
            return Some(RelayError::Database {
                operation: "append to",
                message: "permission denied for table relay_records (42501)".into(),
                may_have_applied: false,
                transient: false,
            });
        }
        let left = self.failures.load(Ordering::SeqCst);
        if left == 0 {
            return None;
        }
        self.failures.store(left - 1, Ordering::SeqCst);
        Some(RelayError::Database {
            operation: "append to",
            message: "server login has been failing, try again later (server_login_retry) (08P01)".into(),
            may_have_applied: false,
            transient: true,
        })
    }
}

impl Relay for Blinking {
    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
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
        match self.failure() {
            Some(error) => Err(error),
            None => self.inner.append(device_id, since_seq, make),
        }
    }
}

struct Site {
    clock: ManualClock,
    coordinator: Arc<InMemoryLeaseCoordinator>,
    relay: Arc<Blinking>,
    folder: tempfile::TempDir,
}

impl Site {
    fn new() -> Self {
        let clock = ManualClock::new(1_000_000);
        Self {
            coordinator: Arc::new(InMemoryLeaseCoordinator::new(clock.wall_clock())),
            clock,
            relay: Blinking::new(),
            folder: tempfile::tempdir().unwrap(),
        }
    }

    fn outbox(&self) -> std::path::PathBuf {
        self.folder.path().join("outbox.jsonl")
    }

    fn open(&self, device: &str) -> Result<Ledger, LedgerError> {
        Ledger::open_with(
            device,
            self.clock.wall_clock(),
            self.relay.clone(),
            LedgerOptions::default().outbox(self.outbox()),
        )
    }

    /// Another site's ledger, without an outbox.
    fn reader(&self, device: &str) -> Ledger {
        Ledger::open(device, self.clock.wall_clock(), self.relay.clone()).unwrap()
    }

    fn keeper(&self, device: &str) -> LeaseKeeper {
        LeaseKeeper::builder(self.coordinator.clone(), "reports", device)
            .config(KeeperConfig::new(60_000))
            .acquire()
            .unwrap()
    }

    /// Runs `run` on `device`; the relay is away for `down` appends once the effect ran.
    fn run_then_blink(&self, ledger: &mut Ledger, device: &str, run: &str, down: usize) {
        let keeper = self.keeper(device);
        let relay = self.relay.clone();
        let outcome = dispatch_effect(
            &keeper,
            ledger,
            &self::run(run),
            DispatchOptions::default(),
            |_| {
                relay.down_for(down);
                EffectOutcome::<(), String>::Succeeded(())
            },
        )
        .unwrap();
        assert!(outcome.executed(), "{outcome:?}");
        keeper.shutdown().unwrap();
    }
}

/// The outcome of a command that ran while the relay was away is tried again within the
/// bound, and stored when the relay comes back inside it.
#[test]
fn d2_an_outcome_is_stored_when_the_relay_comes_back_within_the_bound() {
    let site = Site::new();
    let mut ledger = site.open("laptop").unwrap();
    site.run_then_blink(&mut ledger, "laptop", "run-a", 3);
    assert_eq!(ledger.unsent(), 1, "the outcome could not be stored at once");
    assert_eq!(ledger.flush_within(Duration::from_secs(10)).unwrap(), 1);
    assert_eq!(ledger.unsent(), 0);
    assert!(site.reader("phone").committed_run("reports", "run-a").is_some());
}

/// A failure that does not pass by itself is not tried again.
#[test]
fn d2_a_failure_that_does_not_pass_is_not_tried_again() {
    let site = Site::new();
    let mut ledger = site.open("laptop").unwrap();
    site.run_then_blink(&mut ledger, "laptop", "run-a", 1);
    site.relay.permanent.store(true, Ordering::SeqCst);
    let started = fencepost::clock::Stopwatch::start();
    let error = ledger.flush_within(Duration::from_secs(30)).unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ledger.unsent(), 1);
}

/// Past the bound, the outcome goes into the outbox (synced), the next ledger opened with it
/// stores it before it returns (and cannot open while it cannot), and a site that reads the
/// ledger then finds the run committed.
#[test]
fn d2_r1_an_outcome_queued_on_the_site_is_stored_by_the_next_open_and_never_decided_around() {
    let site = Site::new();
    let mut ledger = site.open("laptop").unwrap();
    site.run_then_blink(&mut ledger, "laptop", "run-a", 1_000);
    assert!(ledger
        .flush_within(Duration::from_millis(300))
        .unwrap_err()
        .is_transient());
    assert_eq!(ledger.queue_unsent().unwrap(), 1);
    assert_eq!(ledger.unsent(), 0);
    drop(ledger);
    let queued = fencepost::ledger::read_outbox(&site.outbox()).unwrap();
    assert_eq!(queued.len(), 1);
    let intent = queued[0].intent().unwrap();
    assert_eq!(
        (intent.run_id.as_str(), intent.status),
        ("run-a", IntentStatus::Committed)
    );

    // Still away: the open fails with the real cause, and the queue stays.
    let refused = site.open("laptop").unwrap_err();
    assert!(refused.is_transient(), "{refused}");
    assert!(
        refused.to_string().contains("server login has been failing"),
        "{refused}"
    );
    assert!(
        matches!(refused, LedgerError::Queued { count: 1, .. }),
        "{refused:?}"
    );
    assert_eq!(fencepost::ledger::read_outbox(&site.outbox()).unwrap().len(), 1);

    site.relay.down_for(0);
    let ledger = site.open("laptop").unwrap();
    assert_eq!(ledger.stored_from_outbox(), 1);
    assert!(!site.outbox().exists(), "emptied once stored");
    assert!(site.reader("phone").committed_run("reports", "run-a").is_some());
    assert_eq!(
        site.open("laptop").unwrap().stored_from_outbox(),
        0,
        "stored once"
    );
}

/// A `pending` that could not be stored (nothing ran) gets a `failed` queued behind it, so that
/// wherever the `pending` got to, the attempt is settled and the run is not left in doubt.
#[test]
fn d1_d2_a_pending_that_could_not_be_stored_is_settled_by_a_failed_queued_behind_it() {
    let site = Site::new();
    let mut ledger = site.open("laptop").unwrap();
    let keeper = site.keeper("laptop");
    site.relay.down_for(1_000);
    let ran = std::cell::Cell::new(false);
    let error = dispatch_effect(
        &keeper,
        &mut ledger,
        &run("run-a"),
        DispatchOptions::default(),
        |_| {
            ran.set(true);
            EffectOutcome::<(), String>::Succeeded(())
        },
    )
    .unwrap_err();
    assert!(!ran.get(), "nothing runs without its pending stored");
    assert!(error.is_transient(), "{error}");
    assert_eq!(ledger.unsent(), 2, "the pending and the failed behind it");
    site.relay.down_for(0);
    assert_eq!(ledger.flush().unwrap(), 2);
    let reader = site.reader("phone");
    assert!(reader.in_doubt("reports", u64::MAX).is_empty(), "settled");
    assert!(reader.state().committed_run("reports", "run-a").is_none());
}

/// A damaged line is an error that names the line and removes nothing; a last line cut short
/// (a crash while it was written, before anyone was told it was queued) is left out; another
/// device's lines stay for that device's ledger.
#[test]
fn r1_a_damaged_outbox_loses_nothing_and_a_last_line_cut_short_is_left_out() {
    let site = Site::new();
    let mut ledger = site.open("laptop").unwrap();
    site.run_then_blink(&mut ledger, "laptop", "run-a", 1_000);
    ledger.queue_unsent().unwrap();
    drop(ledger);
    site.relay.down_for(0);
    let good = std::fs::read_to_string(site.outbox()).unwrap();
    let other = good.replace("\"laptop\"", "\"phone\"");
    assert_ne!(other, good);

    let damaged = format!("{{\"device_id\": \"laptop\", \"surface\": 7}}\n{good}");
    std::fs::write(site.outbox(), &damaged).unwrap();
    let refused = site.open("laptop").unwrap_err();
    assert!(refused.to_string().contains("line 1 is damaged"), "{refused}");
    assert_eq!(
        std::fs::read_to_string(site.outbox()).unwrap(),
        damaged,
        "nothing removed"
    );

    let forged = good.replace("\"epoch\":1", "\"epoch\":0");
    assert_ne!(forged, good);
    std::fs::write(site.outbox(), &forged).unwrap();
    let refused = site.open("laptop").unwrap_err();
    assert!(refused.to_string().contains("epoch 0"), "{refused}");

    std::fs::write(site.outbox(), format!("{other}{good}{}", &good[..good.len() / 2])).unwrap();
    let ledger = site.open("laptop").unwrap();
    assert_eq!(ledger.stored_from_outbox(), 1);
    assert!(site.reader("phone").committed_run("reports", "run-a").is_some());
    assert_eq!(
        std::fs::read_to_string(site.outbox()).unwrap(),
        other,
        "the other device's line stays; the half line is gone"
    );
}

/// A FIFO where the outbox or its lock should be is an error, never a hang; a last line cut
/// short goes when the next record is queued, so that it never becomes a damaged line in the
/// middle (both found by an adversarial test).
#[test]
fn r1_an_outbox_that_is_not_a_file_is_an_error_and_a_line_cut_short_never_blocks_the_queue() {
    let site = Site::new();
    let fifo = |path: &std::path::Path| {
        let made = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(made.success());
    };
    fifo(&site.outbox());
    let refused = site.open("laptop").unwrap_err();
    assert!(refused.to_string().contains("not a regular file"), "{refused}");
    std::fs::remove_file(site.outbox()).unwrap();
    let mut ledger = site.open("laptop").unwrap();
    let mut lock = site.outbox().into_os_string();
    lock.push(".lock");
    std::fs::remove_file(&lock).unwrap();
    fifo(std::path::Path::new(&lock));
    site.run_then_blink(&mut ledger, "laptop", "run-a", 1_000);
    let refused = ledger.queue_unsent().unwrap_err();
    assert!(refused.to_string().contains("not a regular file"), "{refused}");
    std::fs::remove_file(&lock).unwrap();
    std::fs::write(site.outbox(), b"{\"device_id\":\"laptop\",\"surf").unwrap();
    assert_eq!(ledger.queue_unsent().unwrap(), 1);
    drop(ledger);
    site.relay.down_for(0);
    let ledger = site.open("laptop").unwrap();
    assert_eq!(ledger.stored_from_outbox(), 1);
    assert!(site.reader("phone").committed_run("reports", "run-a").is_some());
}

/// A run id of the tests' own (valid).
fn run(id: &str) -> fencepost::id::RunId {
    fencepost::id::RunId::new(id).unwrap()
}
