//! The local snapshot (issue 17, item 1; rules F3–F6, O1, R1): a ledger that resumes from its
//! snapshot answers exactly as one that reads everything, and a snapshot that does not match the
//! relay, or is damaged, is never trusted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::Ledger;
use fencepost::ledger::LedgerOptions;
use fencepost::relay::{FsRelay, ProblemKind, Relay, SqliteRelay};
use proptest::prelude::*;

const AGENTS: [&str; 2] = ["milo", "otto"];
const RUNS: usize = 5;

/// A folder ledger, or (a path ending in `.db`) one in a SQLite file.
fn relay(ledger: &Path) -> Arc<dyn Relay> {
    if ledger.extension().is_some_and(|extension| extension == "db") {
        Arc::new(SqliteRelay::open(ledger).unwrap())
    } else {
        Arc::new(FsRelay::open(ledger).unwrap())
    }
}

fn open(folder: &Path, device: &str, clock: &ManualClock, snapshot: Option<&Path>, seen: &Path) -> Ledger {
    let mut options = LedgerOptions::default().seen_file(seen);
    if let Some(snapshot) = snapshot {
        options = options.snapshot(snapshot);
    }
    Ledger::open_with(device, clock.wall_clock(), relay(folder), options).unwrap()
}

/// Everything a dispatch asks, for every agent and run: the oracle, the fencing epochs, the runs
/// in doubt, the own log head.
fn answers(ledger: &mut Ledger) -> Vec<String> {
    let mut out = Vec::new();
    for agent in AGENTS {
        out.push(format!("{agent} fencing {}", ledger.state().fencing_epoch(agent)));
        for run in 0..RUNS {
            let run = format!("run-{run}");
            let committed = ledger.committed_run(agent, &run).map(|record| record.op_id);
            out.push(format!("{agent} {run} committed {committed:?}"));
            let held = ledger.in_doubt_run(agent, &run, u64::MAX);
            out.push(format!("{agent} {run} in doubt {held:?}"));
        }
        out.push(format!("{agent} in doubt {:?}", ledger.in_doubt(agent, u64::MAX)));
    }
    out.push(format!("pushed {:?}", ledger.pushed()));
    out.push(format!("damage {:?}", ledger.damage()));
    out
}

#[derive(Debug, Clone)]
struct Step {
    writer: usize,
    agent: usize,
    run: usize,
    epoch: u64,
    status: u8,
    reopen: bool,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (0..3usize, 0..2usize, 0..RUNS, 1..5u64, 0..3u8, any::<bool>()).prop_map(
        |(writer, agent, run, epoch, status, reopen)| Step {
            writer,
            agent,
            run,
            epoch,
            status,
            reopen,
        },
    );
    prop::collection::vec(step, 1..40)
}

struct Site {
    _dir: tempfile::TempDir,
    folder: PathBuf,
    snapshot: PathBuf,
    seen: PathBuf,
    clock: ManualClock,
}

impl Site {
    fn new() -> Self {
        Self::with_ledger("ledger")
    }

    /// `name` ending in `.db`: a ledger in a SQLite file.
    fn with_ledger(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(name);
        Self {
            snapshot: dir.path().join("snapshot.sqlite"),
            seen: dir.path().join("seen.json"),
            folder,
            _dir: dir,
            clock: ManualClock::new(1_000),
        }
    }

    fn write(&self, device: &str, intent: &Intent) {
        let seen = self.seen.with_file_name(format!("seen-{device}.json"));
        let mut writer = open(&self.folder, device, &self.clock, None, &seen);
        writer.record(intent).unwrap();
    }

    fn reader(&self, snapshot: bool) -> Ledger {
        let seen = self.seen.with_file_name(if snapshot {
            "seen-snap.json"
        } else {
            "seen-full.json"
        });
        let path = snapshot.then_some(self.snapshot.as_path());
        open(&self.folder, "reader", &self.clock, path, &seen)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// F3–F6: after any writes by several devices, with the snapshot saved at any points (and the
    /// reader writing too), a ledger that resumes from it answers every question as one that
    /// reads everything.
    #[test]
    fn f3_f6_a_ledger_resumed_from_its_snapshot_answers_as_a_full_read(steps in steps(), in_sqlite in any::<bool>()) {
        let site = if in_sqlite { Site::with_ledger("ledger.db") } else { Site::new() };
        let statuses = [IntentStatus::Pending, IntentStatus::Committed, IntentStatus::Failed];
        for step in &steps {
            site.clock.advance(1);
            let intent = Intent::new(AGENTS[step.agent], format!("run-{}", step.run), step.epoch, statuses[usize::from(step.status)]);
            if step.writer == 0 {
                // The reader itself writes, through its snapshot.
                let mut reader = site.reader(true);
                reader.record(&intent).unwrap();
            } else {
                site.write(&format!("writer-{}", step.writer), &intent);
            }
            if step.reopen {
                let mut resumed = site.reader(true);
                let mut full = site.reader(false);
                prop_assert_eq!(answers(&mut resumed), answers(&mut full));
                prop_assert!(resumed.state() == full.state(), "every run asked: the states are equal");
            }
        }
        drop(site.reader(true));
        let mut resumed = site.reader(true);
        prop_assert!(resumed.resumed_from_snapshot());
        let mut full = site.reader(false);
        prop_assert!(!full.resumed_from_snapshot());
        prop_assert_eq!(answers(&mut resumed), answers(&mut full));
    }
}

/// Commits of several runs by two devices, and a reader that saved its snapshot.
fn committed_site() -> Site {
    committed_site_in("ledger")
}

fn committed_site_in(ledger: &str) -> Site {
    let site = Site::with_ledger(ledger);
    for run in 0..RUNS {
        site.clock.advance(1);
        let device = if run % 2 == 0 { "laptop" } else { "phone" };
        site.write(
            device,
            &Intent::new("milo", format!("run-{run}"), 1, IntentStatus::Pending),
        );
        site.write(
            device,
            &Intent::new("milo", format!("run-{run}"), 1, IntentStatus::Committed),
        );
    }
    drop(site.reader(true));
    assert!(site.snapshot.exists());
    site
}

fn committed(ledger: &mut Ledger) -> usize {
    (0..RUNS)
        .filter(|run| ledger.committed_run("milo", &format!("run-{run}")).is_some())
        .count()
}

/// Rewrites one byte of every stored bucket of runs.
fn damage_rows(snapshot: &Path) {
    let connection = rusqlite::Connection::open(snapshot).unwrap();
    let changed = connection
        .execute(
            "UPDATE buckets SET value = CAST(substr(value, 1, 40) AS BLOB) || x'ff' || substr(value, 42)",
            [],
        )
        .unwrap();
    assert!(changed > 0);
}

#[test]
fn r1_snapshot_a_damaged_row_is_damage_the_snapshot_is_removed_and_the_next_open_rebuilds_it() {
    let site = committed_site();
    damage_rows(&site.snapshot);
    let mut resumed = site.reader(true);
    // The damaged row is never taken for "not committed" silently: the ledger is damaged.
    assert_eq!(committed(&mut resumed), 0);
    let damage = resumed.damage();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(damage[0].detail.contains("snapshot"), "{}", damage[0]);
    assert!(!site.snapshot.exists(), "the damaged snapshot is removed");
    drop(resumed);
    let mut rebuilt = site.reader(true);
    assert!(rebuilt.damage().is_empty());
    assert_eq!(committed(&mut rebuilt), RUNS);
    let mut resumed = site.reader(true);
    assert_eq!(committed(&mut resumed), RUNS);
}

#[test]
fn r1_snapshot_a_snapshot_of_another_device_or_not_a_database_is_rebuilt() {
    let site = committed_site();
    let other = site.snapshot.with_file_name("other.sqlite");
    std::fs::copy(&site.snapshot, &other).unwrap();
    // Another device's snapshot in this device's place.
    let options = LedgerOptions::default()
        .snapshot(&other)
        .seen_file(site.seen.with_file_name("seen-other.json"));
    let mut ledger =
        Ledger::open_with("phone", site.clock.wall_clock(), relay(&site.folder), options).unwrap();
    assert_eq!(committed(&mut ledger), RUNS);
    assert!(ledger.damage().is_empty());
    // Garbage where the snapshot was.
    std::fs::write(
        &site.snapshot,
        b"not a database, not at all; garbage of a full disk",
    )
    .unwrap();
    let mut ledger = site.reader(true);
    assert_eq!(committed(&mut ledger), RUNS);
    assert!(ledger.damage().is_empty());
    // Cut short.
    let bytes = std::fs::read(&site.snapshot).unwrap();
    std::fs::write(&site.snapshot, &bytes[..bytes.len() / 3]).unwrap();
    let mut ledger = site.reader(true);
    assert_eq!(committed(&mut ledger), RUNS);
}

#[test]
fn r1_snapshot_a_device_file_that_shrank_after_the_snapshot_is_damage() {
    let site = committed_site();
    let phone = site.folder.join("devices").join("phone.jsonl");
    let bytes = std::fs::read(&phone).unwrap();
    let cut = bytes[..bytes.len() - 1]
        .iter()
        .rposition(|byte| *byte == b'\n')
        .unwrap()
        + 1;
    std::fs::write(&phone, &bytes[..cut]).unwrap();
    let mut ledger = site.reader(true);
    let damage: Vec<String> = ledger.damage().iter().map(ToString::to_string).collect();
    assert!(
        damage
            .iter()
            .any(|problem| problem.contains("phone") && problem.contains("shrank")),
        "{damage:?}"
    );
    // The commit of the cut record stays known (the seen file's damage blocks dispatch anyway).
    assert!(committed(&mut ledger) >= RUNS - 1);
}

#[test]
fn r1_snapshot_a_device_file_replaced_by_another_of_the_same_length_is_not_resumed() {
    let site = committed_site();
    let phone = site.folder.join("devices").join("phone.jsonl");
    let bytes = std::fs::read(&phone).unwrap();
    // Another record of the same length in the last line's place.
    let mut changed = bytes.clone();
    let at = bytes.len() - 10;
    changed[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    std::fs::write(&phone, &changed).unwrap();
    let mut ledger = site.reader(true);
    assert!(!ledger.damage().is_empty(), "the changed record is damage");
    assert!(committed(&mut ledger) >= RUNS - 1);
}

#[test]
fn r1_snapshot_two_processes_of_one_device_never_step_back_each_others_snapshot() {
    let site = committed_site();
    let mut first = site.reader(true);
    let mut second = site.reader(true);
    site.clock.advance(1);
    first
        .record(&Intent::new("otto", "run-0", 1, IntentStatus::Committed))
        .unwrap();
    // The second appends after the first (it catches up on the first's record) and saves.
    second
        .record(&Intent::new("otto", "run-1", 1, IntentStatus::Committed))
        .unwrap();
    // The first saves again, knowing less than the second: it must not step back.
    first.sync().unwrap();
    drop((first, second));
    let mut resumed = site.reader(true);
    assert!(resumed.committed_run("otto", "run-0").is_some());
    assert!(resumed.committed_run("otto", "run-1").is_some());
    assert_eq!(committed(&mut resumed), RUNS);
}

#[test]
fn r1_snapshot_records_deleted_from_a_sqlite_ledger_after_the_snapshot_are_damage() {
    let site = committed_site_in("ledger.db");
    let mut resumed = site.reader(true);
    assert_eq!(committed(&mut resumed), RUNS);
    assert!(resumed.damage().is_empty());
    drop(resumed);
    let connection = rusqlite::Connection::open(&site.folder).unwrap();
    connection
        .execute_batch(
            "DELETE FROM fencepost_relay_records WHERE device_id = 'phone' AND seq = (SELECT max(seq) FROM fencepost_relay_records WHERE device_id = 'phone');
             UPDATE fencepost_relay_devices SET next_seq = next_seq - 1 WHERE device_id = 'phone';",
        )
        .unwrap();
    let ledger = site.reader(true);
    let damage: Vec<String> = ledger.damage().iter().map(ToString::to_string).collect();
    assert!(
        damage.iter().any(|problem| problem.contains("phone")),
        "{damage:?}"
    );
}

/// A site whose SQLite ledger was copied, then `phone` committed `run-9` and both readers (with
/// and without a snapshot) read it, then the copy was put back: a database that went back.
fn went_back_site() -> Site {
    let site = committed_site_in("ledger.db");
    drop(site.reader(false));
    let copy = site.folder.with_extension("copy");
    std::fs::copy(&site.folder, &copy).unwrap();
    site.clock.advance(1);
    site.write("phone", &Intent::new("milo", "run-9", 2, IntentStatus::Committed));
    drop(site.reader(true));
    drop(site.reader(false));
    std::fs::copy(&copy, &site.folder).unwrap();
    site
}

/// R1 (issue 37, item 5): a database ledger put back to an earlier copy (a restore) lacks
/// records both readers saw, through the snapshot and through the seen file: each says the
/// database went back ([`ProblemKind::WentBack`]), which is damage, not a sync that lags.
#[test]
fn r1_a_sqlite_ledger_put_back_to_an_earlier_copy_is_a_database_that_went_back() {
    let site = went_back_site();
    for snapshot in [true, false] {
        let ledger = site.reader(snapshot);
        let went_back: Vec<String> = ledger
            .damage()
            .iter()
            .filter(|problem| problem.kind == ProblemKind::WentBack)
            .map(ToString::to_string)
            .collect();
        assert!(
            went_back
                .iter()
                .any(|problem| problem.contains("phone") && problem.contains("this database went back")),
            "snapshot {snapshot}: {:?}",
            ledger.damage()
        );
    }
}

/// R1 (issue 37, item 5): a site whose snapshot read more than a database that went back
/// holds (and that was written since) writes the commits it read back into it
/// ([`Ledger::repair_went_back`]): its damage is gone, every other site sees those runs
/// committed, and its next open resumes clean. A site with only a seen file has nothing to
/// write back: its damage stays.
#[test]
fn r1_a_database_that_went_back_is_repaired_by_the_site_that_read_more() {
    let site = went_back_site();
    // Written since: the phone's record at that place is another one now.
    site.clock.advance(1);
    site.write(
        "phone",
        &Intent::new("milo", "run-10", 3, IntentStatus::Committed),
    );

    let mut ledger = site.reader(true);
    assert!(!ledger.damage().is_empty());
    assert!(
        ledger
            .damage()
            .iter()
            .all(|problem| problem.kind == ProblemKind::WentBack
                && problem.to_string().contains("was written since")),
        "{:?}",
        ledger.damage()
    );
    assert!(ledger.committed_run("milo", "run-9").is_none());
    let repair = ledger.repair_went_back().unwrap().expect("repaired");
    assert_eq!(repair.devices, ["phone"]);
    assert_eq!(repair.commits, [("milo".to_owned(), "run-9".to_owned(), 2)]);
    assert!(ledger.damage().is_empty(), "{:?}", ledger.damage());
    assert!(ledger.committed_run("milo", "run-9").is_some());
    drop(ledger);
    let mut again = site.reader(true);
    assert!(again.damage().is_empty(), "{:?}", again.damage());
    assert!(again.committed_run("milo", "run-9").is_some());
    assert_eq!(again.repair_went_back().unwrap(), None, "nothing left to repair");
    // Another site, new to the ledger, sees the run committed.
    let seen = site.seen.with_file_name("seen-newcomer.json");
    let mut newcomer = open(&site.folder, "newcomer", &site.clock, None, &seen);
    assert!(newcomer.committed_run("milo", "run-9").is_some());
    // The reader with no snapshot remembers more than the database holds, and nothing of it.
    let mut full = site.reader(false);
    assert!(!full.damage().is_empty());
    assert_eq!(full.repair_went_back().unwrap(), None);
    assert!(!full.damage().is_empty(), "its damage stays");
}

/// F6: a snapshot that grows from a few runs to thousands (its runs laid out again in more
/// buckets on the way) still answers for every one of them, as a full read does.
#[test]
fn f6_a_snapshot_that_grows_past_its_layout_keeps_every_commit() {
    let site = Site::new();
    let mut writer = site.reader(true);
    let runs = 4_500;
    for run in 0..runs {
        site.clock.advance(1);
        writer
            .record(&Intent::new(
                "milo",
                format!("grown-{run}"),
                1,
                IntentStatus::Committed,
            ))
            .unwrap();
    }
    drop(writer);
    let mut resumed = site.reader(true);
    assert!(resumed.resumed_from_snapshot());
    let missing: Vec<usize> = (0..runs)
        .filter(|run| resumed.committed_run("milo", &format!("grown-{run}")).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "{} commits missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(resumed.committed_run("milo", "grown-never").is_none());
    assert!(resumed.damage().is_empty());
}

/// R1 (found by an adversarial test): with the seen file gone too, what the snapshot had read
/// still makes a device file that shrank damage, in every process until the file is restored.
#[test]
fn r1_snapshot_what_the_snapshot_read_is_remembered_when_the_seen_file_is_lost() {
    let site = committed_site();
    let phone = site.folder.join("devices").join("phone.jsonl");
    let whole = std::fs::read(&phone).unwrap();
    let cut = whole[..whole.len() - 1]
        .iter()
        .rposition(|byte| *byte == b'\n')
        .unwrap()
        + 1;
    std::fs::write(&phone, &whole[..cut]).unwrap();
    for attempt in 0..2 {
        let forgetful = site.seen.with_file_name(format!("seen-lost-{attempt}.json"));
        let ledger = open(
            &site.folder,
            "reader",
            &site.clock,
            Some(&site.snapshot),
            &forgetful,
        );
        let damage: Vec<String> = ledger.damage().iter().map(ToString::to_string).collect();
        assert!(
            damage
                .iter()
                .any(|problem| problem.contains("phone") && problem.contains("snapshot read")),
            "attempt {attempt}: {damage:?}"
        );
    }
    // Restored: the snapshot is used again, and nothing is damaged.
    std::fs::write(&phone, &whole).unwrap();
    let mut ledger = site.reader(true);
    assert!(ledger.damage().is_empty(), "{:?}", ledger.damage());
    assert!(ledger.resumed_from_snapshot());
    assert_eq!(committed(&mut ledger), RUNS);
}

/// R1 (found by an adversarial test): the snapshot of another ledger copied in under this one's
/// name is started over, not taken for this ledger's past (which would look like damage).
#[test]
fn r1_snapshot_another_ledgers_snapshot_under_this_name_is_rebuilt() {
    let site = committed_site();
    let other = Site::new();
    other.write("phone", &Intent::new("otto", "run-x", 1, IntentStatus::Committed));
    let other_snapshot = other.snapshot.with_file_name("other-ledger.sqlite");
    let options = LedgerOptions::default()
        .snapshot(&other_snapshot)
        .seen_file(other.seen.with_file_name("seen-other.json"));
    drop(Ledger::open_with("reader", other.clock.wall_clock(), relay(&other.folder), options).unwrap());
    for suffix in ["-wal", "-shm"] {
        let mut path = site.snapshot.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
    std::fs::copy(&other_snapshot, &site.snapshot).unwrap();
    let mut ledger = site.reader(true);
    assert!(ledger.damage().is_empty(), "{:?}", ledger.damage());
    assert!(!ledger.resumed_from_snapshot());
    assert_eq!(committed(&mut ledger), RUNS);
    assert!(ledger.committed_run("otto", "run-x").is_none());
    drop(ledger);
    let mut resumed = site.reader(true);
    assert!(resumed.resumed_from_snapshot());
    assert_eq!(committed(&mut resumed), RUNS);
}

/// F6, R1 (found by an adversarial test: first runs of a new host started at once left a
/// snapshot with the heads of the whole ledger and the runs of one process, and every other
/// committed run ran again): a process saves the runs it changed only into a snapshot that still
/// holds what it resumed from; one emptied under it is not written, and the next open reads the
/// whole ledger.
#[test]
fn r1_snapshot_a_save_never_writes_its_last_runs_into_a_snapshot_that_lost_the_rest() {
    let site = committed_site();
    let mut resumed = site.reader(true);
    assert!(resumed.resumed_from_snapshot());
    assert!(resumed.committed_run("milo", "run-new").is_none());
    // Another process empties the snapshot under it (in place: the same file).
    let connection = rusqlite::Connection::open(&site.snapshot).unwrap();
    connection
        .execute_batch("DELETE FROM base; DELETE FROM sums; DELETE FROM buckets;")
        .unwrap();
    drop(connection);
    resumed
        .record(&Intent::new("milo", "run-new", 1, IntentStatus::Pending))
        .unwrap();
    drop(resumed);
    let mut next = site.reader(true);
    assert!(next.damage().is_empty(), "{:?}", next.damage());
    assert_eq!(committed(&mut next), RUNS, "every commit is still answered");
}
