//! Every coordinator passes the conformance suite (L1–L8, D1), and the linearizability check both
//! accepts real histories of the real coordinators and rejects a broken one.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencepost::backend::sqlite::SqliteLeaseCoordinator;
use fencepost::clock::{system_clock, ManualClock, WallClock};
use fencepost::conformance::{
    self, check_history, record_thread_history, Event, Harness, HistoryConfig, LeaseOp, Opener, Worker,
    HISTORY_START_MS,
};
#[macro_use]
mod common;

use fencepost::lease::{expiry_after, InMemoryLeaseCoordinator, Lease, LeaseCoordinator, LeaseError};

// ---------------------------------------------------------------------------------------------
// Harnesses.

struct MemoryHarness {
    clock: ManualClock,
}

impl MemoryHarness {
    fn new() -> Self {
        Self {
            clock: ManualClock::new(HISTORY_START_MS),
        }
    }
}

impl Harness for MemoryHarness {
    fn fresh_store(&self) -> Opener {
        let coordinator = InMemoryLeaseCoordinator::new(self.clock.wall_clock());
        Box::new(move || Box::new(coordinator.clone()))
    }
    fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }
    fn now_ms(&self) -> Option<u64> {
        Some(self.clock.now_ms())
    }
    fn durable(&self) -> bool {
        false
    }
}

struct SqliteHarness {
    clock: ManualClock,
    folder: tempfile::TempDir,
    stores: AtomicUsize,
}

impl SqliteHarness {
    fn new() -> Self {
        Self {
            clock: ManualClock::new(HISTORY_START_MS),
            folder: tempfile::tempdir().unwrap(),
            stores: AtomicUsize::new(0),
        }
    }
}

impl Harness for SqliteHarness {
    fn fresh_store(&self) -> Opener {
        let store = self.stores.fetch_add(1, Ordering::SeqCst);
        let path = self.folder.path().join(format!("store-{store}.db"));
        let clock = self.clock.wall_clock();
        Box::new(move || Box::new(SqliteLeaseCoordinator::open(&path, clock.clone()).unwrap()))
    }
    fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }
    fn now_ms(&self) -> Option<u64> {
        Some(self.clock.now_ms())
    }
    fn durable(&self) -> bool {
        true
    }
}

// L7 does not apply to the in-memory coordinator: it has no storage that can fail.
conformance_tests!(in_memory, MemoryHarness::new());
conformance_tests!(sqlite, SqliteHarness::new());

#[test]
fn conformance_run_all_runs_the_whole_suite() {
    conformance::run_all(&MemoryHarness::new());
}

#[test]
fn l7_sqlite_failures_are_backend_errors_not_verdicts() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("leases.db");
    let coordinator = SqliteLeaseCoordinator::open(&path, ManualClock::new(1).wall_clock()).unwrap();
    // Another connection holds the write lock longer than the busy timeout allows.
    let blocked = SqliteLeaseCoordinator::open_with(
        &path,
        ManualClock::new(1).wall_clock(),
        fencepost::backend::sqlite::SqliteConfig {
            busy_timeout_ms: 50,
            ..Default::default()
        },
    )
    .unwrap();
    coordinator.with_connection(|connection| connection.execute_batch("BEGIN EXCLUSIVE").unwrap());
    // Reads are not blocked in WAL mode; every write is a backend error that did not apply.
    for (operation, result) in [
        ("acquire", blocked.acquire("l7", "laptop", 1_000).map(drop)),
        ("renew", blocked.renew("l7", "laptop", 1, 1_000).map(drop)),
        ("release", blocked.release("l7", "laptop", 1)),
        ("raise_epoch_floor", blocked.raise_epoch_floor("l7", 3)),
    ] {
        match result {
            Err(LeaseError::Backend(error)) => {
                assert!(
                    !error.may_have_applied,
                    "{operation}: a busy database did not apply the write"
                );
                assert!(error.to_string().contains("busy timeout"), "{operation}: {error}");
            }
            other => panic!("L7: {operation} must be a Backend error, got {other:?}"),
        }
    }
    coordinator.with_connection(|connection| connection.execute_batch("ROLLBACK").unwrap());
    assert_eq!(blocked.current("l7").unwrap(), None, "nothing was applied before");
    blocked.acquire("l7", "laptop", 1_000).unwrap();

    // Storage that fails on every call: the table is gone.
    coordinator
        .with_connection(|connection| connection.execute_batch("DROP TABLE fencepost_leases").unwrap());
    conformance::l7_a_backend_failure_is_an_error_not_a_verdict(&coordinator);
}

// ---------------------------------------------------------------------------------------------
// Linearizability of thread histories, and the checker's power to reject.

#[test]
fn l6_histories_exercise_expiry_steals_and_every_outcome() {
    // Over a few histories: threads interleave as the machine schedules them, and one history
    // of a loaded machine had 2 grants (CI's run of the main pass).
    let events: Vec<_> = (7..10)
        .flat_map(|seed| record_thread_history(&MemoryHarness::new(), &HistoryConfig::default(), seed))
        .collect();
    let returns: Vec<&LeaseOp> = events
        .iter()
        .filter(|event| event.is_return)
        .map(|event| &event.op)
        .collect();
    let count = |matches: &dyn Fn(&LeaseOp) -> bool| returns.iter().filter(|op| matches(op)).count();
    let grants = count(&|op| {
        matches!(
            op,
            LeaseOp::Acquire {
                outcome: conformance::Outcome::Lease { .. },
                ..
            }
        )
    });
    let held = count(&|op| {
        matches!(
            op,
            LeaseOp::Acquire {
                outcome: conformance::Outcome::Held { .. },
                ..
            }
        )
    });
    let lost = count(&|op| {
        matches!(
            op,
            LeaseOp::Renew {
                outcome: conformance::Outcome::Lost { .. },
                ..
            }
        )
    });
    let renewed = count(&|op| {
        matches!(
            op,
            LeaseOp::Renew {
                outcome: conformance::Outcome::Lease { .. },
                ..
            }
        )
    });
    let advances = count(&|op| matches!(op, LeaseOp::Advance { .. }));
    assert!(
        grants > 3 && held > 3 && lost > 3 && renewed > 0 && advances > 10,
        "{grants} {held} {lost} {renewed} {advances}"
    );
    // H1 in the histories (over a few, since workers interleave as the threads run): publishes
    // that took effect, zombies' that were refused, and reads of a frontier that is not empty.
    let (mut published, mut refused, mut read) = (0, 0, 0);
    for seed in 7..13 {
        for event in record_thread_history(&MemoryHarness::new(), &HistoryConfig::default(), seed) {
            match event.op {
                _ if !event.is_return => {}
                LeaseOp::Publish {
                    outcome: conformance::Outcome::Done,
                    ..
                } => published += 1,
                LeaseOp::Publish {
                    outcome: conformance::Outcome::Lost { .. },
                    ..
                } => refused += 1,
                LeaseOp::Published {
                    outcome: conformance::Outcome::Frontier { next_seq },
                } if next_seq.iter().any(|seq| *seq > 0) => read += 1,
                _ => {}
            }
        }
    }
    assert!(
        published > 3 && refused > 3 && read > 3,
        "{published} {refused} {read}"
    );
}

/// H1 in the model: a publish by a device that does not hold the lease at the epoch it claims, or
/// a read of a frontier nobody published, makes a history non-linearizable.
#[test]
fn h1_the_model_rejects_a_zombies_publish_and_an_invented_frontier() {
    let event = |process: usize, at: u64, is_return: bool, op: &LeaseOp| Event {
        process,
        at,
        is_return,
        op: op.clone(),
    };
    let acquire = LeaseOp::Acquire {
        device: 0,
        ttl_ms: 1_000,
        outcome: conformance::Outcome::Lease {
            device: 0,
            epoch: 1,
            expires_at_ms: conformance::HISTORY_START_MS + 1_000,
        },
    };
    let publish = |device: u8, outcome: conformance::Outcome| LeaseOp::Publish {
        device,
        epoch: 1,
        next_seq: 5,
        outcome,
    };
    let mut five = [0; conformance::HISTORY_DEVICES];
    five[0] = 5;
    let read = |next_seq| LeaseOp::Published {
        outcome: conformance::Outcome::Frontier { next_seq },
    };
    let history = |ops: &[LeaseOp]| {
        let mut events = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            events.push(event(0, 2 * index as u64, false, op));
            events.push(event(0, 2 * index as u64 + 1, true, op));
        }
        events
    };
    let holder = publish(0, conformance::Outcome::Done);
    assert!(
        check_history(history(&[acquire.clone(), holder.clone(), read(five)])),
        "the holder's publish, then the read of it"
    );
    assert!(
        !check_history(history(&[
            acquire.clone(),
            publish(1, conformance::Outcome::Done)
        ])),
        "H1: a publish by a device that does not hold the lease was accepted"
    );
    assert!(
        !check_history(history(&[acquire.clone(), read(five)])),
        "H1: a frontier nobody published was read"
    );
    assert!(
        !check_history(history(&[
            acquire,
            holder,
            read([0; conformance::HISTORY_DEVICES])
        ])),
        "H1: a published frontier fell back"
    );
}

/// A register of the racy coordinator: holder, epoch, expiry.
type RacyRegister = (Option<String>, u64, u64);

/// A coordinator that reads, lets go of its lock, then writes: the race the checker must catch.
#[derive(Clone)]
struct RacyCoordinator {
    clock: WallClock,
    registers: Arc<Mutex<BTreeMap<String, RacyRegister>>>,
}

impl RacyCoordinator {
    fn read(&self, agent_id: &str) -> RacyRegister {
        let snapshot = self
            .registers
            .lock()
            .unwrap()
            .get(agent_id)
            .cloned()
            .unwrap_or_default();
        std::thread::sleep(Duration::from_micros(200)); // the window a lock would close
        snapshot
    }

    fn write(&self, agent_id: &str, value: RacyRegister) {
        self.registers.lock().unwrap().insert(agent_id.to_owned(), value);
    }
}

impl LeaseCoordinator for RacyCoordinator {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        let now = (self.clock)();
        let (holder, epoch, expires_at_ms) = self.read(agent_id);
        if let Some(holder) = holder {
            if now < expires_at_ms {
                return Err(LeaseError::Held {
                    agent_id: agent_id.into(),
                    holder,
                    epoch,
                    expires_at_ms,
                });
            }
        }
        let lease = Lease {
            agent_id: agent_id.into(),
            holder: device_id.into(),
            epoch: epoch + 1,
            expires_at_ms: expiry_after(now, ttl_ms),
        };
        self.write(
            agent_id,
            (Some(device_id.into()), lease.epoch, lease.expires_at_ms),
        );
        Ok(lease)
    }
    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        let now = (self.clock)();
        let (holder, current, _) = self.read(agent_id);
        if holder.as_deref() != Some(device_id) || current != epoch {
            return Err(LeaseError::Lost {
                agent_id: agent_id.into(),
                claimed_epoch: epoch,
                current_epoch: current,
            });
        }
        self.write(agent_id, (holder, epoch, expiry_after(now, ttl_ms)));
        Ok(Lease {
            agent_id: agent_id.into(),
            holder: device_id.into(),
            epoch,
            expires_at_ms: expiry_after(now, ttl_ms),
        })
    }
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        let (holder, current, expires_at_ms) = self.read(agent_id);
        if holder.as_deref() != Some(device_id) || current != epoch {
            return Err(LeaseError::Lost {
                agent_id: agent_id.into(),
                claimed_epoch: epoch,
                current_epoch: current,
            });
        }
        self.write(agent_id, (None, current, expires_at_ms));
        Ok(())
    }
    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        let (holder, epoch, expires_at_ms) = self
            .registers
            .lock()
            .unwrap()
            .get(agent_id)
            .cloned()
            .unwrap_or_default();
        Ok(holder.map(|holder| Lease {
            agent_id: agent_id.into(),
            holder,
            epoch,
            expires_at_ms,
        }))
    }
    fn raise_epoch_floor(&self, _: &str, _: u64) -> Result<(), LeaseError> {
        Ok(())
    }
    // Not what the checker demonstration is about.
    fn publish_frontier(
        &self,
        _: &str,
        _: &str,
        _: u64,
        _: &fencepost::relay::Frontier,
    ) -> Result<(), LeaseError> {
        Ok(())
    }
    fn published_frontier(&self, _: &str) -> Result<fencepost::relay::Frontier, LeaseError> {
        Ok(fencepost::relay::Frontier::new())
    }
}

struct RacyHarness {
    clock: ManualClock,
}

impl Harness for RacyHarness {
    fn fresh_store(&self) -> Opener {
        let coordinator = RacyCoordinator {
            clock: self.clock.wall_clock(),
            registers: Arc::default(),
        };
        Box::new(move || Box::new(coordinator.clone()))
    }
    fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }
    fn now_ms(&self) -> Option<u64> {
        Some(self.clock.now_ms())
    }
    fn durable(&self) -> bool {
        false
    }
}

#[test]
fn l6_the_checker_rejects_a_read_then_write_coordinator() {
    let harness = RacyHarness {
        clock: ManualClock::new(HISTORY_START_MS),
    };
    let config = HistoryConfig {
        histories: 5,
        threads: 6,
        ..HistoryConfig::default()
    };
    let rejected = (0..config.histories)
        .filter(|seed| !check_history(record_thread_history(&harness, &config, *seed as u64)))
        .count();
    assert!(
        rejected >= 1,
        "the racy coordinator's histories were all accepted"
    );
    // And the suite's direct check catches it too.
    let caught =
        std::panic::catch_unwind(|| conformance::l6_concurrent_acquires_have_exactly_one_winner(&harness));
    assert!(caught.is_err(), "L6's direct check accepted the racy coordinator");
}

// ---------------------------------------------------------------------------------------------
// SQLite across processes: histories, crashes, durability.

const CHILD_ROLE: &str = "FENCEPOST_TEST_CHILD_ROLE";
const CHILD_DB: &str = "FENCEPOST_TEST_CHILD_DB";
const CHILD_CLOCK: &str = "FENCEPOST_TEST_CHILD_CLOCK";
const CHILD_EVENTS: &str = "FENCEPOST_TEST_CHILD_EVENTS";
const CHILD_WORKER: &str = "FENCEPOST_TEST_CHILD_WORKER";

/// A coordinator clock shared by processes: `HISTORY_START_MS` plus `TICK_MS` per byte of a file
/// that only grows by appends, so that concurrent steps by several processes are never lost.
fn ticks_clock(path: PathBuf) -> WallClock {
    Arc::new(move || HISTORY_START_MS + TICK_MS * std::fs::metadata(&path).unwrap().len())
}

const TICK_MS: u64 = 10;

fn tick(path: &Path) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(b".").unwrap();
}

fn spawn_child(role: &str, variables: &[(&str, String)]) -> std::process::Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([
        "--ignored",
        "--exact",
        "sqlite_child_process",
        "--quiet",
        "--nocapture",
    ]);
    command.env(CHILD_ROLE, role).stdout(Stdio::piped());
    for (name, value) in variables {
        command.env(name, value);
    }
    command.spawn().unwrap()
}

#[test]
#[ignore = "a child process of the SQLite multi-process tests; run by them"]
fn sqlite_child_process() {
    let role = std::env::var(CHILD_ROLE).expect("run by a parent test");
    let database = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    match role.as_str() {
        "history" => {
            let ticks = PathBuf::from(std::env::var(CHILD_CLOCK).unwrap());
            let coordinator = SqliteLeaseCoordinator::open(&database, ticks_clock(ticks.clone())).unwrap();
            let worker: Vec<u64> = std::env::var(CHILD_WORKER)
                .unwrap()
                .split(',')
                .map(|n| n.parse().unwrap())
                .collect();
            let worker = Worker {
                process: worker[0] as usize,
                device: worker[0] as u8,
                operations: worker[1] as usize,
                ttl_ms: worker[2],
                seed: worker[3],
                advance_every: 3,
                advance_ms: TICK_MS,
            };
            let mut events = Vec::new();
            conformance::run_history_worker(
                &coordinator,
                &worker,
                &common::nanos,
                &|_| tick(&ticks),
                &mut |event| events.push(event),
            );
            let mut file = std::fs::File::create(std::env::var(CHILD_EVENTS).unwrap()).unwrap();
            for event in events {
                writeln!(file, "{}", serde_json::to_string(&event).unwrap()).unwrap();
            }
        }
        "crash" => {
            // Acquire and release as fast as possible, reporting each epoch, until killed.
            let coordinator = counting(&database, system_clock());
            let mut stdout = std::io::stdout();
            loop {
                let lease = coordinator.acquire("crash", "child", 200).unwrap();
                writeln!(stdout, "epoch {}", lease.epoch).unwrap();
                stdout.flush().unwrap();
                coordinator.release("crash", "child", lease.epoch).unwrap();
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn l6_sqlite_histories_from_four_processes_are_linearizable() {
    const PROCESSES: usize = 4;
    const OPERATIONS: u64 = 50;
    for history in 0..5u64 {
        let folder = tempfile::tempdir().unwrap();
        let database = folder.path().join("leases.db");
        let ticks = folder.path().join("ticks");
        std::fs::write(&ticks, b"").unwrap();
        // Create the database before the children race to.
        drop(SqliteLeaseCoordinator::open(&database, ticks_clock(ticks.clone())).unwrap());
        // Each child also moves the shared clock every few operations, so leases expire mid-run
        // however fast the children are.
        let mut children: Vec<_> = (0..PROCESSES)
            .map(|process| {
                spawn_child(
                    "history",
                    &[
                        (CHILD_DB, database.display().to_string()),
                        (CHILD_CLOCK, ticks.display().to_string()),
                        (
                            CHILD_EVENTS,
                            folder
                                .path()
                                .join(format!("events-{process}"))
                                .display()
                                .to_string(),
                        ),
                        (
                            CHILD_WORKER,
                            format!("{process},{OPERATIONS},40,{}", history * 100 + process as u64),
                        ),
                    ],
                )
            })
            .collect();
        for child in &mut children {
            assert!(child.wait().unwrap().success(), "a history process failed");
        }
        let mut events: Vec<Event> = Vec::new();
        let mut operations = 0;
        for process in 0..PROCESSES {
            let text = std::fs::read_to_string(folder.path().join(format!("events-{process}"))).unwrap();
            for line in text.lines() {
                events.push(serde_json::from_str(line).unwrap());
                operations += 1;
            }
        }
        let steps = std::fs::metadata(&ticks).unwrap().len();
        let advances = events
            .iter()
            .filter(|event| matches!(event.op, LeaseOp::Advance { .. }))
            .count()
            / 2;
        assert_eq!(advances as u64, steps, "every clock step is in the history");
        assert_eq!(operations / 2 - advances, PROCESSES * OPERATIONS as usize);
        assert!(
            steps * TICK_MS > 4 * 40,
            "the clock moved past the TTL several times during the history"
        );
        assert!(
            check_history(events),
            "L6: multi-process SQLite history {history} is not linearizable"
        );
    }
}

/// A SQLite coordinator whose epochs count 1, 2, 3, … (no epoch clock), for the tests of the
/// floor's arithmetic and of what survives a crash.
fn counting(path: &Path, clock: WallClock) -> SqliteLeaseCoordinator {
    let config = fencepost::backend::sqlite::SqliteConfig {
        epoch_clock: None,
        ..Default::default()
    };
    SqliteLeaseCoordinator::open_with(path, clock, config).unwrap()
}

#[test]
fn l5_sqlite_epochs_survive_a_sigkill_and_never_repeat() {
    let folder = tempfile::tempdir().unwrap();
    let database = folder.path().join("leases.db");
    drop(counting(&database, system_clock()));
    let mut child = spawn_child("crash", &[(CHILD_DB, database.display().to_string())]);
    let epoch_of = |line: String| {
        line.strip_prefix("epoch ")
            .and_then(|epoch| epoch.parse::<u64>().ok())
    };
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let mut epochs = Vec::new();
    while epochs.len() < 50 {
        let line = lines.next().expect("the child stopped early");
        epochs.extend(epoch_of(line));
    }
    child.kill().unwrap(); // SIGKILL, in the middle of its acquire/release loop
    child.wait().unwrap();
    epochs.extend(lines.filter_map(epoch_of));
    assert!(
        epochs.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "the child saw dense epochs"
    );
    std::thread::sleep(Duration::from_millis(250)); // past the child's TTL, if it died holding the lease
    let coordinator = counting(&database, system_clock());
    let next = coordinator.acquire("crash", "parent", 1_000).unwrap();
    let last = *epochs.last().unwrap();
    assert!(
        next.epoch > last,
        "epoch {} after the child's {last}: an epoch was repeated",
        next.epoch
    );
    assert!(
        next.epoch <= last + 2,
        "at most one grant went unreported before the kill"
    );
}

/// Rule L5 when the database goes back in time: a copy of the file taken earlier (an operator's
/// backup, restored) has forgotten the grants made since, and still mints none of their epochs,
/// since every epoch is at least the wall clock in milliseconds (`SqliteConfig::epoch_clock`).
/// Without an epoch clock the restored copy grants again the epoch granted after the copy.
#[test]
fn l5_sqlite_a_file_restored_from_an_earlier_copy_mints_no_epoch_twice() {
    let folder = tempfile::tempdir().unwrap();
    let database = folder.path().join("leases.db");
    let backup = folder.path().join("backup.db");
    let clock = ManualClock::new(1_000);
    let grant_after_restore = |config: fencepost::backend::sqlite::SqliteConfig| {
        let _ = std::fs::remove_file(&database);
        let open =
            || SqliteLeaseCoordinator::open_with(&database, clock.wall_clock(), config.clone()).unwrap();
        let mut granted = vec![open().acquire("milo", "laptop", 1_000).unwrap().epoch];
        std::fs::copy(&database, &backup).unwrap(); // closed: the file holds every grant
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(3));
            clock.advance(1_000);
            granted.push(open().acquire("milo", "phone", 1_000).unwrap().epoch);
        }
        std::fs::copy(&backup, &database).unwrap(); // the restore
        clock.advance(1_000);
        let after = open().acquire("milo", "laptop", 1_000).unwrap().epoch;
        (granted, after)
    };
    let (granted, after) = grant_after_restore(fencepost::backend::sqlite::SqliteConfig::default());
    assert!(
        granted.iter().all(|epoch| after > *epoch),
        "epoch {after} after the restore; granted before it: {granted:?}"
    );
    let counting = fencepost::backend::sqlite::SqliteConfig {
        epoch_clock: None,
        ..Default::default()
    };
    let (granted, after) = grant_after_restore(counting);
    assert_eq!((granted, after), (vec![1, 2, 3, 4], 2), "without an epoch clock");
}

#[test]
fn l5_sqlite_epoch_floor_gives_42_after_41_and_survives_a_restart() {
    let folder = tempfile::tempdir().unwrap();
    let database = folder.path().join("leases.db");
    let clock = ManualClock::new(1_000);
    counting(&database, clock.wall_clock())
        .raise_epoch_floor("milo", 41)
        .unwrap();
    let reopened = counting(&database, clock.wall_clock());
    assert_eq!(reopened.acquire("milo", "laptop", 10_000).unwrap().epoch, 42);
    drop(reopened);
    let again = counting(&database, clock.wall_clock());
    assert_eq!(again.current("milo").unwrap().map(|lease| lease.epoch), Some(42));
    clock.advance(10_000);
    assert_eq!(again.acquire("milo", "phone", 10_000).unwrap().epoch, 43);
}

/// Rule L5 at the cost of a command: raising the floor to one the coordinator already has (not
/// above both its floor and its last epoch) writes nothing, since every `fencepost run` raises it
/// to the ledger's epoch, almost always the last, before it acquires; a higher floor is written.
/// And once no process has the file open, the file alone holds every grant (the log was
/// checkpointed into it): a copy of it taken then, as an operator's `cp` backup, loses nothing.
#[test]
fn l5_sqlite_a_floor_it_has_writes_nothing_and_a_closed_file_holds_every_grant() {
    let folder = tempfile::tempdir().unwrap();
    let database = folder.path().join("leases.db");
    let log = folder.path().join("leases.db-wal");
    let clock = ManualClock::new(1_000);
    let coordinator = counting(&database, clock.wall_clock());
    coordinator.raise_epoch_floor("milo", 41).unwrap();
    assert_eq!(coordinator.acquire("milo", "laptop", 1_000).unwrap().epoch, 42);
    let length = || std::fs::metadata(&log).unwrap().len();
    let before = length();
    for floor in [0, 41, 42] {
        coordinator.raise_epoch_floor("milo", floor).unwrap();
        assert_eq!(
            length(),
            before,
            "raising the floor to {floor} (not above the epoch it has) wrote to the log"
        );
    }
    coordinator.raise_epoch_floor("milo", 50).unwrap();
    assert!(length() > before, "a higher floor is written");
    clock.advance(1_000);
    assert_eq!(coordinator.acquire("milo", "phone", 1_000).unwrap().epoch, 51);
    drop(coordinator);
    let copy = folder.path().join("copy.db");
    std::fs::copy(&database, &copy).unwrap();
    let restored = counting(&copy, clock.wall_clock());
    assert_eq!(
        restored.current("milo").unwrap().map(|lease| lease.epoch),
        Some(51),
        "a copy of the closed file alone has the last grant"
    );
}

fn open_error(path: &Path) -> String {
    match SqliteLeaseCoordinator::open(path, ManualClock::new(1).wall_clock()) {
        Err(LeaseError::Backend(error)) => error.to_string(),
        Err(other) => panic!("expected a backend error, got {other:?}"),
        Ok(_) => panic!("{} opened", path.display()),
    }
}

#[test]
fn l8_sqlite_refuses_bad_database_files_without_touching_them() {
    let folder = tempfile::tempdir().unwrap();

    let text = folder.path().join("notes.txt");
    std::fs::write(&text, "these are my notes, not a database\n".repeat(100)).unwrap();
    let message = open_error(&text);
    assert!(
        message.contains("not a") && message.contains("database"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(&text).unwrap(),
        "these are my notes, not a database\n".repeat(100)
    );

    let corrupt = folder.path().join("corrupt.db");
    SqliteLeaseCoordinator::open(&corrupt, ManualClock::new(1).wall_clock()).unwrap();
    let mut bytes = std::fs::read(&corrupt).unwrap();
    bytes[..16].copy_from_slice(b"garbage garbage!");
    std::fs::write(&corrupt, &bytes).unwrap();
    let message = open_error(&corrupt);
    assert!(message.contains("not a database"), "{message}");
    assert_eq!(
        std::fs::read(&corrupt).unwrap(),
        bytes,
        "a corrupt file is left as it was"
    );

    let foreign = folder.path().join("app.db");
    let connection = rusqlite::Connection::open(&foreign).unwrap();
    connection
        .execute_batch("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ada');")
        .unwrap();
    drop(connection);
    let before = std::fs::read(&foreign).unwrap();
    let message = open_error(&foreign);
    assert!(message.contains("another application"), "{message}");
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        before,
        "another application's database is left as it was"
    );

    let message = open_error(folder.path());
    assert!(message.contains("is a folder"), "{message}");

    let under_a_file = text.join("leases.db");
    let message = open_error(&under_a_file);
    assert!(message.contains("cannot open"), "{message}");

    // A read-only location (read-only even for root).
    let message = open_error(Path::new("/proc/fencepost-test/leases.db"));
    assert!(message.contains("cannot open"), "{message}");
}

#[test]
fn l7_sqlite_processes_that_open_a_new_file_at_once_all_succeed() {
    // Several hosts' first `fencepost run` can create the database at the same moment: switching
    // it to WAL must wait for the others, not fail.
    for round in 0..20 {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("leases.db");
        let barrier = std::sync::Barrier::new(6);
        std::thread::scope(|scope| {
            for _ in 0..6 {
                scope.spawn(|| {
                    barrier.wait();
                    if let Err(error) = SqliteLeaseCoordinator::open(&path, system_clock()) {
                        panic!("round {round}: {error}");
                    }
                });
            }
        });
    }
}

/// L1, L5 with a boot-time clock: a new time line (a reboot) expires every lease and keeps every
/// epoch; the same time line changes nothing; a database from a wall-clock coordinator counts as
/// another time line.
#[test]
fn l1_sqlite_a_new_clock_timeline_expires_every_lease_and_keeps_epochs() {
    use fencepost::backend::sqlite::SqliteConfig;
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("leases.db");
    let on = |timeline: Option<&str>, now_ms: u64| {
        let config = SqliteConfig {
            clock_timeline: timeline.map(str::to_owned),
            epoch_clock: None,
            ..SqliteConfig::default()
        };
        SqliteLeaseCoordinator::open_with(&path, ManualClock::new(now_ms).wall_clock(), config).unwrap()
    };
    // Before: a wall-clock coordinator granted a lease for a long time.
    let wall = on(None, 1_796_000_000_000);
    assert_eq!(wall.acquire("a", "laptop", 3_600_000).unwrap().epoch, 1);
    drop(wall);
    // A boot-time coordinator (its clock reads far less) does not honour that wall-clock expiry.
    let boot = on(Some("boot:1"), 5_000);
    let first = boot.acquire("a", "phone", 60_000).unwrap();
    assert_eq!((first.epoch, first.expires_at_ms), (2, 65_000));
    drop(boot);
    // The same boot: the lease holds.
    let same = on(Some("boot:1"), 6_000);
    assert!(matches!(
        same.acquire("a", "laptop", 60_000),
        Err(LeaseError::Held { .. })
    ));
    drop(same);
    // After a reboot the clock starts again near 0: the old lease is expired, its epoch kept.
    let rebooted = on(Some("boot:2"), 100);
    let current = rebooted.current("a").unwrap().unwrap();
    assert_eq!(
        (current.holder.as_str(), current.epoch, current.expires_at_ms),
        ("phone", 2, 0)
    );
    assert_eq!(rebooted.acquire("a", "laptop", 60_000).unwrap().epoch, 3);
}

/// H1 with heads, on a SQLite coordinator file made before heads were published (its frontiers
/// table has no `last_op_id` column): opening it adds the column, keeps what was published, and
/// heads are then published and read back.
#[test]
fn h1_sqlite_a_file_from_before_heads_gains_the_column_and_keeps_its_frontier() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("leases.db");
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        connection
            .execute_batch(&format!(
                "CREATE TABLE fencepost_leases (agent_id TEXT PRIMARY KEY NOT NULL, holder TEXT, epoch INTEGER NOT NULL CHECK (epoch >= 0), expires_at_ms INTEGER NOT NULL CHECK (expires_at_ms >= 0), floor INTEGER NOT NULL CHECK (floor >= 0)) STRICT, WITHOUT ROWID;
                 CREATE TABLE fencepost_settings (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) STRICT, WITHOUT ROWID;
                 CREATE TABLE fencepost_frontiers (agent_id TEXT NOT NULL, device_id TEXT NOT NULL, next_seq INTEGER NOT NULL CHECK (next_seq >= 0), PRIMARY KEY (agent_id, device_id)) STRICT, WITHOUT ROWID;
                 INSERT INTO fencepost_frontiers VALUES ('milo', 'laptop', 3);
                 PRAGMA application_id = {};",
                fencepost::backend::sqlite::SQLITE_APPLICATION_ID
            ))
            .unwrap();
    }
    let clock = ManualClock::new(1_000);
    let coordinator = SqliteLeaseCoordinator::open(&path, clock.wall_clock()).unwrap();
    let before = coordinator.published_frontier("milo").unwrap();
    assert_eq!((before.next_seq("laptop"), before.head("laptop")), (3, None));
    let lease = coordinator.acquire("milo", "laptop", 1_000).unwrap();
    let mut frontier = fencepost::relay::Frontier::new();
    frontier.raise_to("laptop", 4, Some(fencepost::oplog::OpId([7; 32])));
    coordinator
        .publish_frontier("milo", "laptop", lease.epoch, &frontier)
        .unwrap();
    drop(coordinator);
    let reopened = SqliteLeaseCoordinator::open(&path, clock.wall_clock()).unwrap();
    let after = reopened.published_frontier("milo").unwrap();
    assert_eq!(
        (after.next_seq("laptop"), after.head("laptop")),
        (4, Some(fencepost::oplog::OpId([7; 32])))
    );
}
