//! Shared checkpoints (issue 17, item 2; rules K1–K4): a site that starts from a checkpoint
//! answers every question as a site that reads every record, whatever was appended while the
//! checkpoint was written; a damaged checkpoint is reported and never used; a checkpoint that
//! does not hold the fold of its records is found by `verify_checkpoints`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{CheckpointError, CompactOptions, Ledger, LedgerError, LedgerOptions, Retention};
use fencepost::oplog::OpId;
use fencepost::relay::{Frontier, FsRelay, Relay, SqliteRelay};
use proptest::prelude::*;

const AGENTS: [&str; 2] = ["milo", "otto"];
const RUNS: usize = 5;
const STATUSES: [IntentStatus; 3] = [
    IntentStatus::Pending,
    IntentStatus::Committed,
    IntentStatus::Failed,
];

struct Site {
    dir: tempfile::TempDir,
    folder: PathBuf,
    clock: ManualClock,
}

impl Site {
    fn new() -> Self {
        Self::with_ledger("ledger")
    }

    /// `name` ending in `.db`: a ledger in a SQLite file.
    fn with_ledger(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            folder: dir.path().join(name),
            dir,
            clock: ManualClock::new(1_000),
        }
    }

    fn relay(&self) -> Arc<dyn Relay> {
        if self.folder.extension().is_some_and(|extension| extension == "db") {
            Arc::new(SqliteRelay::open(&self.folder).unwrap())
        } else {
            Arc::new(FsRelay::open(&self.folder).unwrap())
        }
    }

    /// `device`'s ledger; with `snapshot`, from its snapshot (and, when it has none yet, from
    /// the shared checkpoint).
    fn open(&self, device: &str, snapshot: bool) -> Ledger {
        let mut options = LedgerOptions::default()
            .seen_file(self.dir.path().join(format!("seen-{device}-{snapshot}.json")));
        if snapshot {
            options = options.snapshot(self.snapshot_of(device));
        }
        Ledger::open_with(device, self.clock.wall_clock(), self.relay(), options).unwrap()
    }

    fn snapshot_of(&self, device: &str) -> PathBuf {
        self.dir.path().join(format!("snapshot-{device}.sqlite"))
    }

    fn write(&self, device: &str, intent: &Intent) {
        self.clock.advance(1);
        self.open(device, false).record(intent).unwrap();
    }

    /// Copies the checkpoint at `path` into this site's checkpoints; where it is now.
    fn place_checkpoint(&self, path: &Path) -> PathBuf {
        let placed = self
            .relay()
            .checkpoints_dir()
            .unwrap()
            .join(path.file_name().unwrap());
        std::fs::copy(path, &placed).unwrap();
        placed
    }

    fn checkpoints(&self) -> Vec<PathBuf> {
        let dir = self.relay().checkpoints_dir().unwrap();
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
            .unwrap_or_default();
        found.retain(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("checkpoint-"))
        });
        found.sort();
        found
    }
}

/// Everything a dispatch asks, for every agent and run: the oracle (F6), who holds each run
/// (F5), the fencing epochs (F4), the runs in doubt (D2).
fn answers(ledger: &mut Ledger) -> Vec<String> {
    let mut out = Vec::new();
    for agent in AGENTS {
        out.push(format!("{agent} fencing {}", ledger.state().fencing_epoch(agent)));
        for run in 0..RUNS {
            let run = format!("run-{run}");
            let committed = ledger.committed_run(agent, &run).map(|record| record.op_id);
            out.push(format!("{agent} {run} committed {committed:?}"));
            let holds = ledger
                .state()
                .intent(agent, &run)
                .map(|record| (record.op_id, record.epoch));
            out.push(format!("{agent} {run} holds {holds:?}"));
            let held = ledger.in_doubt_run(agent, &run, u64::MAX);
            out.push(format!("{agent} {run} in doubt {held:?}"));
        }
        out.push(format!("{agent} in doubt {:?}", ledger.in_doubt(agent, u64::MAX)));
    }
    out.push(format!("damage {:?}", ledger.damage()));
    out
}

#[derive(Debug, Clone)]
enum Step {
    /// A device writes an intent.
    Write {
        device: usize,
        agent: usize,
        run: usize,
        epoch: u64,
        status: usize,
    },
    /// A device opens its ledger (reading every record); the next `later` writes happen while
    /// it holds it open, then it writes a checkpoint of what it read.
    Compact { device: usize, later: usize },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let write = (0..3usize, 0..2usize, 0..RUNS, 1..5u64, 0..3usize).prop_map(
        |(device, agent, run, epoch, status)| Step::Write {
            device,
            agent,
            run,
            epoch,
            status,
        },
    );
    let compact = (0..3usize, 0..4usize).prop_map(|(device, later)| Step::Compact { device, later });
    prop::collection::vec(prop_oneof![4 => write, 1 => compact], 1..30)
}

const DEVICES: [&str; 3] = ["laptop", "phone", "server"];

/// Writes a checkpoint; a ledger with no records yet has nothing to write.
fn compact(ledger: &mut Ledger) {
    match ledger.compact() {
        Ok(_) => {}
        Err(LedgerError::Checkpoint(error))
            if matches!(*error, CheckpointError::NoRecords)
                && ledger.view().frontier().iter().next().is_none() => {}
        Err(error) => panic!("{error}"),
    }
}

/// Plays `steps` on `site`: writes, and compactions with writes in between the compactor's read
/// and its checkpoint.
fn play(site: &Site, steps: &[Step]) {
    let mut compacting: Option<(Ledger, usize)> = None;
    for step in steps {
        match step {
            Step::Write {
                device,
                agent,
                run,
                epoch,
                status,
            } => {
                let intent = Intent::new(AGENTS[*agent], format!("run-{run}"), *epoch, STATUSES[*status]);
                site.write(DEVICES[*device], &intent);
                if let Some((ledger, later)) = &mut compacting {
                    if *later == 0 {
                        compact(ledger);
                        compacting = None;
                    } else {
                        *later -= 1;
                    }
                }
            }
            Step::Compact { device, later } => {
                if let Some((mut ledger, _)) = compacting.take() {
                    compact(&mut ledger);
                }
                let ledger = site.open(DEVICES[*device], false);
                compacting = Some((ledger, *later));
            }
        }
    }
    if let Some((mut ledger, _)) = compacting {
        compact(&mut ledger);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// K1, K2 (and F4–F6, D2 through them): after any writes by three devices, with checkpoints
    /// written at any points by any of them while the others keep writing, a new site that
    /// starts from the latest checkpoint answers every question as a site that reads every
    /// record: no commit lost, no fencing epoch lower, the same runs in doubt. Every checkpoint
    /// is the fold of the records it covers (`verify_checkpoints` finds nothing). A ledger folder
    /// or a SQLite ledger.
    #[test]
    fn k1_k2_a_site_started_from_a_checkpoint_answers_as_a_full_read(steps in steps(), in_sqlite in any::<bool>()) {
        let site = if in_sqlite { Site::with_ledger("ledger.db") } else { Site::new() };
        play(&site, &steps);
        let compacted = !site.checkpoints().is_empty();
        let mut started = site.open("newcomer", true);
        prop_assert_eq!(started.started_from_checkpoint().is_some(), compacted);
        let mut full = site.open("reader", false);
        prop_assert_eq!(answers(&mut started), answers(&mut full));
        prop_assert!(started.state() == full.state(), "every run asked: the states are equal");
        prop_assert_eq!(full.verify_checkpoints().unwrap(), vec![]);
        // And again, from its own snapshot now.
        drop(started);
        let mut resumed = site.open("newcomer", true);
        prop_assert!(resumed.started_from_checkpoint().is_none());
        prop_assert_eq!(answers(&mut resumed), answers(&mut full));
    }
}

/// Commits of every run of both agents by two devices, a checkpoint, and one more commit after it.
fn compacted_site() -> Site {
    let site = Site::new();
    for (index, agent) in AGENTS.iter().enumerate() {
        for run in 0..RUNS {
            let device = DEVICES[(run + index) % 2];
            let run = format!("run-{run}");
            site.write(
                device,
                &Intent::new(*agent, run.clone(), 2, IntentStatus::Pending),
            );
            if run != "run-4" {
                site.write(device, &Intent::new(*agent, run, 2, IntentStatus::Committed));
            }
        }
    }
    let info = site.open("laptop", false).compact().unwrap();
    assert_eq!(info.records, 18);
    assert_eq!(info.devices, 2);
    assert_eq!(info.runs, 10);
    site.write(
        "server",
        &Intent::new("milo", "run-4", 3, IntentStatus::Committed),
    );
    site
}

fn committed(ledger: &mut Ledger) -> usize {
    AGENTS
        .iter()
        .flat_map(|agent| (0..RUNS).map(move |run| (*agent, format!("run-{run}"))))
        .filter(|(agent, run)| ledger.committed_run(agent, run).is_some())
        .count()
}

#[test]
fn k1_a_new_site_reads_only_the_records_after_the_checkpoint_and_has_every_commit() {
    let site = compacted_site();
    let mut started = site.open("newcomer", true);
    assert!(started.started_from_checkpoint().is_some());
    assert!(started.damage().is_empty());
    assert_eq!(committed(&mut started), 9);
    assert_eq!(started.state().fencing_epoch("milo"), 3);
    assert_eq!(started.state().fencing_epoch("otto"), 2);
    assert_eq!(
        started
            .in_doubt("otto", u64::MAX)
            .iter()
            .map(|run| run.run_id.as_str())
            .collect::<Vec<_>>(),
        ["run-4"]
    );
    assert!(started.in_doubt("milo", u64::MAX).is_empty());
}

/// Flips `count` bytes of `path` at places drawn from `seed`.
fn flip_bytes(path: &Path, seed: u64, count: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let at = (state % bytes.len() as u64) as usize;
        bytes[at] ^= 1 << (state % 8);
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn k3_a_damaged_checkpoint_is_damage_or_unused_never_a_wrong_answer() {
    let site = compacted_site();
    let mut full = site.open("reader", false);
    let expected = answers(&mut full);
    let checkpoint = site.checkpoints().pop().unwrap();
    let pristine = std::fs::read(&checkpoint).unwrap();
    let mut reported = 0;
    for seed in 0..40u64 {
        std::fs::write(&checkpoint, &pristine).unwrap();
        flip_bytes(&checkpoint, seed, 1 + (seed % 4) as usize);
        let device = format!("newcomer-{seed}");
        let mut started = site.open(&device, true);
        if let Some(problem) = started.checkpoint_failure() {
            reported += 1;
            assert!(!started.damage().is_empty(), "a damaged checkpoint is damage");
            assert!(problem.detail.contains("checkpoint"), "{problem}");
            assert!(started.started_from_checkpoint().is_none());
            assert!(
                !full.verify_checkpoints().unwrap().is_empty(),
                "seed {seed}: verify reports what a new site refuses"
            );
        } else {
            // The flips hit bytes that mean nothing (free space of the file): the checkpoint
            // is whole, and used.
            let mut answered = answers(&mut started);
            assert_eq!(answered.pop(), expected.last().cloned());
            assert_eq!(answered[..], expected[..expected.len() - 1], "seed {seed}");
        }
    }
    assert!(reported > 0, "some flips damage what the checkpoint says");
}

/// K3 (found by an adversarial test: a byte changed in a page's free space was "intact" for
/// `verify_checkpoints`, while every new site refused the checkpoint, "database disk image is
/// malformed"): one byte changed anywhere in a checkpoint, `verify_checkpoints` reports every
/// checkpoint a new site refuses, and a new site that uses one answers as a full read.
#[test]
fn k3_verify_reports_every_checkpoint_a_new_site_refuses() {
    let site = compacted_site();
    let mut full = site.open("reader", false);
    let expected = answers(&mut full);
    let checkpoint = site.checkpoints().pop().unwrap();
    let pristine = std::fs::read(&checkpoint).unwrap();
    let mut refused = 0;
    // Every 61st byte of the file, and every 5th of its second page (a b-tree page with free
    // space, where the damage that was missed sat).
    let second_page = (4096..8192.min(pristine.len())).step_by(5);
    for at in (0..pristine.len()).step_by(61).chain(second_page) {
        let mut bytes = pristine.clone();
        bytes[at] ^= 0x5a;
        std::fs::write(&checkpoint, &bytes).unwrap();
        let mut started = site.open(&format!("newcomer-{at}"), true);
        let reported = !full.verify_checkpoints().unwrap().is_empty();
        if started.checkpoint_failure().is_some() {
            refused += 1;
            assert!(reported, "byte {at}: a new site refuses it, verify says nothing");
        } else {
            // (Verify may find more: SQLite's check of pages that no read touches. What a site
            // uses is checked against the checkpoint's digests, so it answers right.)
            let mut answered = answers(&mut started);
            assert_eq!(answered.pop(), expected.last().cloned());
            assert_eq!(answered[..], expected[..expected.len() - 1], "byte {at}");
        }
    }
    assert!(refused > 0);
}

#[test]
fn k3_a_checkpoint_under_another_id_or_with_a_bucket_deleted_is_damage() {
    let site = compacted_site();
    let checkpoint = site.checkpoints().pop().unwrap();
    let inspected = fencepost::checkpoint::inspect(&checkpoint).unwrap();
    assert_eq!(
        (inspected.records, inspected.devices, inspected.runs),
        (18, 2, 10)
    );
    // Under another id.
    let name = checkpoint.file_name().unwrap().to_string_lossy().into_owned();
    let (start, id) = name.rsplit_once('-').unwrap();
    let other = if id.starts_with('0') { '1' } else { '0' };
    let renamed = checkpoint.with_file_name(format!("{start}-{other}{}", &id[1..]));
    std::fs::rename(&checkpoint, &renamed).unwrap();
    let started = site.open("newcomer-1", true);
    let problem = started.checkpoint_failure().expect("reported");
    assert!(
        problem.detail.contains("does not match the id in its name"),
        "{problem}"
    );
    std::fs::rename(&renamed, &checkpoint).unwrap();
    // A bucket of runs deleted.
    let connection = rusqlite::Connection::open(&checkpoint).unwrap();
    assert!(
        connection
            .execute(
                "DELETE FROM buckets WHERE id IN (SELECT id FROM buckets LIMIT 1)",
                []
            )
            .unwrap()
            == 1
    );
    drop(connection);
    let started = site.open("newcomer-2", true);
    let problem = started.checkpoint_failure().expect("reported");
    assert!(problem.detail.contains("bucket"), "{problem}");
    let error = fencepost::checkpoint::inspect(&checkpoint).unwrap_err();
    assert!(error.detail.contains("bucket"), "{error}");
    let full = site.open("reader", false);
    let found = full.verify_checkpoints().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
}

/// Cuts the last `records` lines of `device`'s file.
fn cut_records(site: &Site, device: &str, records: usize) -> Vec<u8> {
    let file = site.folder.join("devices").join(format!("{device}.jsonl"));
    let bytes = std::fs::read(&file).unwrap();
    let mut cut = bytes.len();
    for _ in 0..records {
        cut = bytes[..cut - 1]
            .iter()
            .rposition(|byte| *byte == b'\n')
            .map_or(0, |at| at + 1);
    }
    std::fs::write(&file, &bytes[..cut]).unwrap();
    bytes
}

/// `verify` reports one checkpoint, as one whose head is not this ledger's record (another
/// ledger's).
fn verify_reports_another_ledgers(reader: &Ledger) {
    let found = reader.verify_checkpoints().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].detail.contains("not the ledger's"), "{}", found[0]);
}

#[test]
fn k3_a_checkpoint_of_another_ledger_is_damage_and_verify_reports_it() {
    let site = compacted_site();
    let other = Site::new();
    for run in 0..3 {
        other.write(
            "laptop",
            &Intent::new("milo", format!("run-{run}"), 1, IntentStatus::Pending),
        );
        other.write(
            "phone",
            &Intent::new("milo", format!("run-{run}"), 1, IntentStatus::Pending),
        );
        other.write(
            "laptop",
            &Intent::new("milo", format!("run-{run}"), 1, IntentStatus::Failed),
        );
    }
    let foreign = other.open("laptop", false).compact().unwrap();
    for own in site.checkpoints() {
        std::fs::remove_file(own).unwrap();
    }
    let placed = site.place_checkpoint(&foreign.path);
    let mut full = site.open("reader", false);
    let expected = answers(&mut full);
    // Its heads are not this ledger's records: not used, and nothing runs until it is removed.
    let started = site.open("newcomer", true);
    assert!(started.started_from_checkpoint().is_none());
    let damage: Vec<String> = started.damage().iter().map(ToString::to_string).collect();
    assert!(
        damage.iter().any(|problem| problem.contains("the checkpoint")),
        "{damage:?}"
    );
    verify_reports_another_ledgers(&full);
    std::fs::remove_file(&placed).unwrap();
    drop(started);
    let mut started = site.open("newcomer", true);
    assert_eq!(answers(&mut started), expected);
}

/// K3, K6 (found by an adversarial test): another ledger's checkpoint whose heads lie further
/// back than the ids a pruned ledger keeps is still reported by `verify`, and a compaction leaves
/// it for the operator: it is not taken for a checkpoint superseded by the one the ledger starts
/// from (compaction removed it, and `verify` then said "intact").
#[test]
fn k3_k6_another_ledgers_checkpoint_behind_the_ids_a_pruned_ledger_keeps_is_not_removed() {
    let site = Site::new();
    let mut writer = site.open("laptop", false);
    for run in 0..1_100 {
        site.clock.advance(1);
        writer
            .record(&Intent::new(
                "milo",
                format!("run-{run}"),
                1,
                IntentStatus::Pending,
            ))
            .unwrap();
    }
    writer.compact_with(&CompactOptions::default().prune()).unwrap();
    drop(writer);
    let other = Site::new();
    for run in 0..3 {
        other.write(
            "laptop",
            &Intent::new("milo", format!("other-{run}"), 1, IntentStatus::Pending),
        );
    }
    let foreign = other.open("laptop", false).compact().unwrap();
    let placed = site.place_checkpoint(&foreign.path);
    let mut reader = site.open("reader", false);
    verify_reports_another_ledgers(&reader);
    reader.compact().unwrap();
    assert!(
        placed.exists(),
        "the compaction removed another ledger's checkpoint"
    );
    drop(reader);
    verify_reports_another_ledgers(&site.open("reader", false));
}

/// K1, K2 (found by an adversarial test: a new host with a new coordinator ran a committed run
/// again at a reused epoch): a checkpoint that covers records the device files do not have (a
/// sync that lags, a file that shrank) is damage of those devices, not a reason to read the
/// files alone; once the files reach it, it is used.
#[test]
fn k1_k2_a_checkpoint_ahead_of_the_device_files_is_damage_until_they_reach_it() {
    let site = compacted_site();
    let whole = cut_records(&site, "laptop", 3);
    let started = site.open("newcomer", true);
    assert!(started.started_from_checkpoint().is_none());
    let damage: Vec<String> = started.damage().iter().map(ToString::to_string).collect();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(
        damage[0].contains("the checkpoint") && damage[0].contains("laptop"),
        "{damage:?}"
    );
    let full = site.open("reader", false);
    let found = full.verify_checkpoints().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].detail.contains("the ledger here has"), "{}", found[0]);
    drop(started);
    std::fs::write(site.folder.join("devices").join("laptop.jsonl"), whole).unwrap();
    let mut started = site.open("newcomer", true);
    assert!(started.started_from_checkpoint().is_some());
    let mut full = site.open("reader-2", false);
    assert_eq!(answers(&mut started), answers(&mut full));
}

/// K2 (found by an adversarial test: with the damage accepted, a new site with a new coordinator
/// reused an epoch that only the checkpoint showed): a checkpoint the files do not reach still
/// raises the fencing epochs it carries.
#[test]
fn k2_a_checkpoint_the_files_do_not_reach_still_raises_the_fencing_epochs() {
    let site = compacted_site();
    site.write("laptop", &Intent::new("milo", "run-7", 7, IntentStatus::Pending));
    site.write(
        "laptop",
        &Intent::new("milo", "run-7", 7, IntentStatus::Committed),
    );
    site.open("phone", false).compact().unwrap();
    cut_records(&site, "laptop", 2);
    let mut started = site.open("newcomer", true);
    assert!(started.started_from_checkpoint().is_none());
    assert!(!started.damage().is_empty());
    assert_eq!(started.state().fencing_epoch("milo"), 7);
    assert_eq!(started.accept_damage("laptop").unwrap(), 1);
    assert!(started.damage().is_empty());
    assert_eq!(started.state().fencing_epoch("milo"), 7);
}

/// K3 (found by an adversarial test: a FIFO named like a checkpoint hung every new site): what
/// is not a regular file under a checkpoint's name is damage, at once.
#[cfg(unix)]
#[test]
fn k3_a_fifo_named_like_a_checkpoint_is_damage_not_a_hang() {
    let site = compacted_site();
    let dir = site.relay().checkpoints_dir().unwrap();
    let fifo = dir.join(format!("checkpoint-99-{}.sqlite", "0".repeat(64)));
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let started = site.open("newcomer", true);
    let problem = started.checkpoint_failure().expect("reported");
    assert!(problem.detail.contains("not a regular file"), "{problem}");
    let found = site.open("reader", false).verify_checkpoints().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(fencepost::checkpoint::inspect(&fifo).is_err());
}

#[test]
fn k4_two_sites_compacting_at_once_while_a_third_writes_leave_checkpoints_that_each_start_a_site_right() {
    let site = compacted_site();
    for path in site.checkpoints() {
        std::fs::remove_file(path).unwrap();
    }
    let mut laptop = site.open("laptop", false);
    site.write("server", &Intent::new("otto", "run-4", 2, IntentStatus::Failed));
    let mut phone = site.open("phone", false);
    site.write("server", &Intent::new("otto", "run-3", 4, IntentStatus::Pending));
    let (first, second) = std::thread::scope(|scope| {
        let first = scope.spawn(|| laptop.compact().unwrap());
        let second = scope.spawn(|| phone.compact().unwrap());
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(second.records > first.records);
    site.write("server", &Intent::new("milo", "run-0", 5, IntentStatus::Pending));
    let mut full = site.open("reader", false);
    let expected = answers(&mut full);
    assert_eq!(full.verify_checkpoints().unwrap(), vec![]);
    // The later one removed the earlier one, which it contains, unless the earlier was moved in
    // last: either way, each checkpoint written starts a site right.
    for (index, info) in [first, second].into_iter().enumerate() {
        if !info.path.exists() {
            continue;
        }
        let keep = info.path.clone();
        let saved: Vec<(PathBuf, Vec<u8>)> = site
            .checkpoints()
            .into_iter()
            .filter(|path| *path != keep)
            .map(|path| {
                let bytes = std::fs::read(&path).unwrap();
                std::fs::remove_file(&path).unwrap();
                (path, bytes)
            })
            .collect();
        let mut started = site.open(&format!("newcomer-{index}"), true);
        assert_eq!(started.started_from_checkpoint(), Some(info.id.as_str()));
        assert_eq!(answers(&mut started), expected);
        for (path, bytes) in saved {
            std::fs::write(path, bytes).unwrap();
        }
    }
}

#[test]
fn k4_two_checkpoints_of_the_same_records_are_one_file() {
    let site = compacted_site();
    let first = site.open("laptop", false).compact().unwrap();
    let second = site.open("phone", false).compact().unwrap();
    assert_eq!(first.id, second.id, "the same fold, the same checkpoint");
    assert_eq!(site.checkpoints(), vec![first.path]);
}

/// K1 (found by an adversarial test: a site compacted from its snapshot, which had read a record
/// before it was damaged): compaction reads every record, so damage anywhere refuses it.
#[test]
fn k1_compact_refuses_a_ledger_resumed_from_a_snapshot() {
    let site = compacted_site();
    drop(site.open("laptop", true));
    let mut resumed = site.open("laptop", true);
    assert!(resumed.resumed_from_snapshot());
    let error = resumed.compact().unwrap_err();
    assert!(error.to_string().contains("read every record"), "{error}");
}

#[test]
fn k1_compact_refuses_a_damaged_ledger() {
    let site = compacted_site();
    let phone = site.folder.join("devices").join("phone.jsonl");
    let mut bytes = std::fs::read(&phone).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&phone, bytes).unwrap();
    let before = site.checkpoints();
    let error = site.open("laptop", false).compact().unwrap_err();
    assert!(matches!(error, LedgerError::Damaged { .. }), "{error}");
    assert_eq!(site.checkpoints(), before);
}

/// The ids of every record the ledger holds now.
fn every_record(site: &Site) -> BTreeSet<OpId> {
    let mut ids = BTreeSet::new();
    site.relay()
        .pull_in_batches(&Frontier::new(), &mut |ops| {
            ids.extend(ops.iter().map(|op| op.op_id))
        })
        .unwrap();
    ids
}

/// The runs that a retention anchored at a compaction that had read `covered` leaves out, by
/// the reference: runs of the agents named whose greatest record and greatest commit are both
/// among `covered`, never a run in doubt (D2).
fn forgotten_by(
    ledger: &mut Ledger,
    covered: &BTreeSet<OpId>,
    agents: &[String],
) -> BTreeSet<(String, String)> {
    let mut forgotten = BTreeSet::new();
    for agent in AGENTS {
        if !agents.is_empty() && !agents.iter().any(|named| named == agent) {
            continue;
        }
        for run in 0..RUNS {
            let run = format!("run-{run}");
            let Some(summary) = ledger.state().run_summary(agent, &run) else {
                continue;
            };
            let old = covered.contains(&summary.best.op_id)
                && summary
                    .committed()
                    .is_some_and(|committed| covered.contains(&committed.op_id));
            if old && ledger.in_doubt_run(agent, &run, u64::MAX).is_none() {
                forgotten.insert((agent.to_owned(), run));
            }
        }
    }
    forgotten
}

/// What [`answers`] says of a site that forgot the runs `forgotten`: nothing of them.
fn without(mut lines: Vec<String>, forgotten: &BTreeSet<(String, String)>) -> Vec<String> {
    for (agent, run) in forgotten {
        for line in &mut lines {
            for what in ["committed", "holds", "in doubt"] {
                if line.starts_with(&format!("{agent} {run} {what} ")) {
                    *line = format!("{agent} {run} {what} None");
                }
            }
        }
    }
    lines
}

/// Only the writes of `steps`, and none to the runs `forgotten` (nobody asks for those again).
fn writes_not_to(steps: Vec<Step>, forgotten: &BTreeSet<(String, String)>) -> Vec<Step> {
    steps
        .into_iter()
        .filter(|step| match step {
            Step::Write { agent, run, .. } => {
                !forgotten.contains(&(AGENTS[*agent].to_owned(), format!("run-{run}")))
            }
            Step::Compact { .. } => false,
        })
        .collect()
}

/// A retention of `older_than_ms` for `agents` (empty: all).
fn retention(older_than_ms: u64, agents: Vec<String>) -> CompactOptions {
    CompactOptions::default().forget(Retention {
        older_than_ms,
        agents,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// K1, K2 with the oracle's retention (issue 17, item 4): a compaction asked to forget what
    /// is older than the age of an earlier compaction (the anchor, carried along the line of
    /// checkpoints by the compactions written in between, which remove its file) leaves out
    /// exactly the committed runs the anchor had covered (their greatest record and greatest
    /// commit among its records), of the agents named, and nothing else: a new site started
    /// from it, and a site whose snapshot was made before it (it moves to the checkpoint),
    /// answer as a full read for every other run, with the same fencing epochs and the same
    /// runs in doubt, after more writes (to runs not forgotten: nobody asks for those again).
    /// `verify_checkpoints` applies the same rule and finds nothing.
    #[test]
    fn k1_k2_a_checkpoint_that_forgets_leaves_out_only_the_commits_an_old_compaction_covered(
        before in steps(),
        middle in steps(),
        after in steps(),
        device in 0..3usize,
        only_milo in any::<bool>(),
        in_sqlite in any::<bool>(),
    ) {
        let site = if in_sqlite { Site::with_ledger("ledger.db") } else { Site::new() };
        play(&site, &before);
        site.clock.advance(1);
        let mut anchor = site.open(DEVICES[device], false);
        if anchor.view().frontier().iter().next().is_none() {
            return Ok(());
        }
        let covered = every_record(&site);
        let anchored_at = site.clock.now_ms();
        anchor.compact().unwrap();
        drop(anchor);
        // Writes and compactions (younger than the retention) after the anchor.
        play(&site, &middle);
        drop(site.open("regular", true));
        site.clock.advance(1_000_000);
        // (A retention judges age by the newest record too: the ledger goes on growing.)
        site.write("server", &Intent::new("otto", "run-99", 1, IntentStatus::Committed));
        let agents = if only_milo { vec!["milo".to_owned()] } else { Vec::new() };
        let mut compactor = site.open(DEVICES[(device + 1) % 3], false);
        let forgotten = forgotten_by(&mut compactor, &covered, &agents);
        let info = compactor
            .compact_with(&retention(site.clock.now_ms() - anchored_at, agents))
            .unwrap();
        let rule = info.forgotten.clone().expect("the anchor is old enough");
        // (Or earlier: a compaction of the same records keeps the time they were first covered.)
        prop_assert!(rule.anchor_written_at_ms <= anchored_at);
        prop_assert_eq!(info.forgotten_runs, forgotten.len() as u64);
        prop_assert!(
            info.path.to_string_lossy().ends_with(&format!("-forgets-{}.sqlite", rule.anchor_written_at_ms)),
            "{}", info.path.display()
        );
        drop(compactor);
        play(&site, &writes_not_to(after, &forgotten));
        let mut full = site.open("reader", false);
        let expected = without(answers(&mut full), &forgotten);
        let mut started = site.open("newcomer", true);
        prop_assert!(started.started_from_checkpoint().is_some());
        prop_assert_eq!(answers(&mut started), expected.clone());
        // The regular site first reads what its snapshot lacks of the checkpoint (a site
        // moves only to a checkpoint its snapshot has read up to), then moves.
        drop(site.open("regular", true));
        let mut regular = site.open("regular", true);
        prop_assert_eq!(regular.started_from_checkpoint(), started.started_from_checkpoint());
        prop_assert_eq!(answers(&mut regular), expected.clone());
        // Once moved, it stays: the next open resumes its own snapshot.
        drop(regular);
        let mut regular = site.open("regular", true);
        prop_assert!(regular.started_from_checkpoint().is_none());
        prop_assert_eq!(answers(&mut regular), expected);
        prop_assert_eq!(full.verify_checkpoints().unwrap(), vec![]);
    }
}

/// The oracle's retention measures age by the ledger's order, not by the records' stamps
/// (found by an adversarial test: a host whose clock was days behind, or at 1970, committed a
/// run that a retention judging by stamps forgot at once, and a new host ran it again): a
/// commit written after the anchor is kept, however old its stamp; with no compaction old
/// enough, nothing is forgotten.
#[test]
fn k1_a_commit_stamped_long_ago_by_a_clock_behind_is_not_forgotten() {
    let site = compacted_site();
    // (One write, run-4's commit, came after the first compaction.)
    let anchored_at = site.clock.now_ms() - 1;
    // A device whose clock reads 1970 commits run-9 after the compaction.
    let behind = ManualClock::new(1);
    let mut late = Ledger::open("late", behind.wall_clock(), site.relay()).unwrap();
    late.record(&Intent::new("milo", "run-9", 5, IntentStatus::Pending))
        .unwrap();
    late.record(&Intent::new("milo", "run-9", 5, IntentStatus::Committed))
        .unwrap();
    drop(late);
    site.clock.advance(100);
    let young = site
        .open("laptop", false)
        .compact_with(&retention(1_000_000, Vec::new()))
        .unwrap();
    assert_eq!(young.forgotten, None, "no compaction is that old yet");
    assert_eq!(young.forgotten_runs, 0);
    // Old enough for the first compaction to be the anchor, not the second (which covered
    // the late commit).
    site.clock.advance(1_000_000 - 50);
    site.write(
        "server",
        &Intent::new("otto", "run-9", 3, IntentStatus::Committed),
    );
    let info = site
        .open("laptop", false)
        .compact_with(&retention(1_000_000, Vec::new()))
        .unwrap();
    assert_eq!(
        info.forgotten.as_ref().map(|rule| rule.anchor_written_at_ms),
        Some(anchored_at)
    );
    assert_eq!(
        info.forgotten_runs, 8,
        "the commits of the first checkpoint: {info:?}"
    );
    let mut newcomer = site.open("newcomer", true);
    assert!(newcomer.started_from_checkpoint().is_some());
    assert!(
        newcomer.committed_run("milo", "run-9").is_some(),
        "the late commit is kept"
    );
    assert!(
        newcomer.committed_run("milo", "run-4").is_some(),
        "committed after the anchor"
    );
    assert!(newcomer.committed_run("milo", "run-0").is_none(), "forgotten");
    assert_eq!(newcomer.state().fencing_epoch("milo"), 5, "K2");
    assert_eq!(site.open("reader", false).verify_checkpoints().unwrap(), vec![]);
}

/// K3 with the oracle's retention: a checkpoint whose name says another anchor than its
/// content (renamed by hand, or forged) is damage for a new site and for `verify`; a site
/// with a snapshot keeps its snapshot rather than move to it.
#[test]
fn k3_a_checkpoint_whose_name_says_another_cut_off_is_damage() {
    let site = compacted_site();
    drop(site.open("regular", true));
    site.clock.advance(10);
    site.write(
        "server",
        &Intent::new("otto", "run-9", 3, IntentStatus::Committed),
    );
    let info = site
        .open("laptop", false)
        .compact_with(&retention(5, Vec::new()))
        .unwrap();
    assert!(info.forgotten_runs > 0, "{info:?}");
    let name = info.path.to_string_lossy().into_owned();
    let (kept, _) = name.split_once("-forgets-").unwrap();
    std::fs::rename(&info.path, format!("{kept}-forgets-1999.sqlite")).unwrap();
    let newcomer = site.open("newcomer", true);
    assert!(newcomer.checkpoint_failure().is_some());
    assert!(!newcomer.damage().is_empty());
    let mut regular = site.open("regular", true);
    assert!(regular.damage().is_empty(), "{:?}", regular.damage());
    assert_eq!(committed(&mut regular), 9, "it kept every commit");
    let problems = site.open("reader", false).verify_checkpoints().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
}

/// The oracle's retention: an anchor counts records by device and names the last one, so a
/// device whose records were replaced since (a log written anew under the same id, read by a
/// compacting site that never saw the old one) is not taken for the one it covered: that
/// compaction is no anchor, and the new device's commits are not forgotten.
#[test]
fn k1_an_anchor_whose_device_records_were_replaced_is_no_anchor() {
    let site = Site::new();
    for run in 0..3 {
        let run = format!("run-{run}");
        site.write(
            "laptop",
            &Intent::new("milo", run.clone(), 1, IntentStatus::Pending),
        );
        site.write("laptop", &Intent::new("milo", run, 1, IntentStatus::Committed));
    }
    site.open("laptop", false).compact().unwrap();
    // The laptop's log is written anew: as many records, other runs.
    std::fs::remove_file(site.folder.join("devices").join("laptop.jsonl")).unwrap();
    let other = Site::new();
    for run in 5..8 {
        let run = format!("run-{run}");
        other.write(
            "laptop",
            &Intent::new("milo", run.clone(), 2, IntentStatus::Pending),
        );
        other.write("laptop", &Intent::new("milo", run, 2, IntentStatus::Committed));
    }
    std::fs::copy(
        other.folder.join("devices").join("laptop.jsonl"),
        site.folder.join("devices").join("laptop.jsonl"),
    )
    .unwrap();
    site.clock.advance(1_000_000);
    site.write(
        "server",
        &Intent::new("otto", "run-0", 1, IntentStatus::Committed),
    );
    let mut compactor = site.open("fresh-compactor", false);
    assert!(compactor.damage().is_empty(), "{:?}", compactor.damage());
    let info = compactor.compact_with(&retention(1_000, Vec::new())).unwrap();
    assert_eq!(info.forgotten, None, "{info:?}");
    let mut newcomer = site.open("newcomer", true);
    for run in 5..8 {
        assert!(newcomer.committed_run("milo", &format!("run-{run}")).is_some());
    }
}

/// The oracle's retention (found by an adversarial test: a plain `ledger compact` on a host
/// whose clock read 1970 wrote a compaction that looked 56 years old, and the next retention
/// forgot the run committed seconds before): a compaction never takes a time older than the
/// line before it or than the records it covers, so one by a clock far behind, even the first
/// of its line, is no anchor.
#[test]
fn k1_a_compaction_by_a_clock_behind_is_not_an_old_anchor() {
    let site = Site::new();
    site.write("laptop", &Intent::new("milo", "run-0", 1, IntentStatus::Pending));
    site.write(
        "laptop",
        &Intent::new("milo", "run-0", 1, IntentStatus::Committed),
    );
    site.write("laptop", &Intent::new("milo", "run-1", 1, IntentStatus::Pending));
    site.write(
        "laptop",
        &Intent::new("milo", "run-1", 1, IntentStatus::Committed),
    );
    let in_1970 = ManualClock::new(1);
    Ledger::open("pi", in_1970.wall_clock(), site.relay())
        .unwrap()
        .compact()
        .unwrap();
    site.clock.advance(300);
    site.write(
        "laptop",
        &Intent::new("milo", "run-2", 1, IntentStatus::Committed),
    );
    let info = site
        .open("laptop", false)
        .compact_with(&retention(500, Vec::new()))
        .unwrap();
    assert_eq!(info.forgotten, None, "no compaction is 500 ms old: {info:?}");
    let mut newcomer = site.open("newcomer", true);
    for run in ["run-0", "run-1", "run-2"] {
        assert!(newcomer.committed_run("milo", run).is_some(), "{run}");
    }
}

/// The oracle's retention (found by an adversarial test: another ledger's checkpoint copied
/// into the folder lent its old compactions, and was then removed as "contained"): the
/// compactions of a checkpoint whose heads are not this ledger's records are not taken, and
/// such a checkpoint is left for `verify` to report.
#[test]
fn k1_another_ledgers_checkpoint_lends_no_anchor_and_is_not_removed() {
    let site = compacted_site();
    let other = Site::new();
    for run in 0..12 {
        let run = format!("run-{run}");
        other.write(
            "laptop",
            &Intent::new("milo", run.clone(), 1, IntentStatus::Pending),
        );
        other.write("laptop", &Intent::new("milo", run, 1, IntentStatus::Committed));
    }
    let foreign = other.open("laptop", false).compact().unwrap();
    let dir = site.relay().checkpoints_dir().unwrap();
    let copied = dir.join(foreign.path.file_name().unwrap());
    std::fs::copy(&foreign.path, &copied).unwrap();
    // And a smaller one of a third ledger, which this ledger's checkpoints "contain" by count.
    let third = Site::new();
    third.write(
        "laptop",
        &Intent::new("milo", "run-0", 1, IntentStatus::Committed),
    );
    let small = third.open("laptop", false).compact().unwrap();
    let small_copy = dir.join(small.path.file_name().unwrap());
    std::fs::copy(&small.path, &small_copy).unwrap();
    site.clock.advance(1_000_000);
    site.write(
        "server",
        &Intent::new("otto", "run-9", 3, IntentStatus::Committed),
    );
    let info = site
        .open("phone", false)
        .compact_with(&retention(1_000, Vec::new()))
        .unwrap();
    assert!(
        info.records < foreign.records,
        "the foreign one stays the best: {info:?}"
    );
    assert_eq!(info.forgotten, None, "{info:?}");
    assert!(copied.exists(), "left for verify to report");
    assert!(small_copy.exists(), "not this ledger's records: not contained");
    assert!(!site
        .open("reader", false)
        .verify_checkpoints()
        .unwrap()
        .is_empty());
}

/// The oracle's retention (found by an adversarial test: a host at 1970 that wrote a commit and
/// compacted alone made its own fresh commit "old"): a compaction by a clock that reads before
/// the floor (a clock not set yet) adds nothing to the line, so it is never an anchor.
#[test]
fn k1_a_compaction_by_a_clock_not_set_yet_is_never_an_anchor() {
    let site = Site::new();
    site.write("laptop", &Intent::new("milo", "run-0", 1, IntentStatus::Pending));
    site.write(
        "laptop",
        &Intent::new("milo", "run-0", 1, IntentStatus::Committed),
    );
    let floor = CompactOptions::default().clock_floor(500_000);
    site.open("laptop", false).compact_with(&floor).unwrap();
    site.clock.set(1_000_000);
    site.write(
        "laptop",
        &Intent::new("milo", "run-1", 1, IntentStatus::Committed),
    );
    let forget = CompactOptions::default().clock_floor(500_000).forget(Retention {
        older_than_ms: 1_000,
        agents: Vec::new(),
    });
    let info = site.open("laptop", false).compact_with(&forget).unwrap();
    assert_eq!(info.forgotten, None, "{info:?}");
    site.clock.advance(2_000);
    site.write(
        "laptop",
        &Intent::new("milo", "run-2", 1, IntentStatus::Committed),
    );
    let info = site.open("laptop", false).compact_with(&forget).unwrap();
    assert_eq!(
        info.forgotten_runs, 2,
        "the second compaction is the anchor: {info:?}"
    );
}
