//! Checkpoints compose (issue 37, rule K6): sites with a ledger folder each, synced by copying
//! files and checkpoints at arbitrary moments and in any order, compact and prune whenever
//! they like; once every copy has caught up, every site reads the ledger whole — from the
//! checkpoints in its folder and the files, whatever order they came in — and its fold holds
//! every commit and every fencing epoch of the reference fold of every record ever written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::fold::fold;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::Ledger;
use fencepost::ledger::{CompactOptions, LedgerOptions};
use fencepost::oplog::OpRecord;
use fencepost::relay::{FsRelay, Relay};
use proptest::prelude::*;

const SITES: usize = 3;
const AGENTS: [&str; 2] = ["milo", "otto"];
const RUNS: usize = 4;

/// What a site does, or what the sync carries.
#[derive(Debug, Clone)]
enum Step {
    /// Site `site` records an intent of agent `agent`, run `run`, at `epoch`, `status`.
    Write {
        site: usize,
        agent: usize,
        run: usize,
        epoch: u64,
        status: usize,
    },
    /// Site `site` writes a checkpoint, and prunes its own log when `prune`.
    Compact { site: usize, prune: bool },
    /// The sync carries `from`'s own device file to `to`'s folder (as it is now: pruned or not).
    CarryFile { from: usize, to: usize },
    /// The sync carries the `index`-th checkpoint of `from`'s folder to `to`'s.
    CarryCheckpoint { from: usize, to: usize, index: usize },
    /// Site `site` opens its ledger with its snapshot (a `fencepost run` does).
    Open { site: usize },
}

fn step() -> impl Strategy<Value = Step> {
    let site = 0..SITES;
    prop_oneof![
        4 => (0..SITES, 0..AGENTS.len(), 0..RUNS, 1..4u64, 0..3usize)
            .prop_map(|(site, agent, run, epoch, status)| Step::Write { site, agent, run, epoch, status }),
        2 => (site.clone(), any::<bool>()).prop_map(|(site, prune)| Step::Compact { site, prune }),
        3 => (0..SITES, 0..SITES).prop_map(|(from, to)| Step::CarryFile { from, to }),
        3 => (0..SITES, 0..SITES, 0..4usize).prop_map(|(from, to, index)| Step::CarryCheckpoint { from, to, index }),
        1 => site.prop_map(|site| Step::Open { site }),
    ]
}

struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
    clock: ManualClock,
    written: Vec<OpRecord>,
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for site in 0..SITES {
            std::fs::create_dir_all(root.join(format!("folder-{site}"))).unwrap();
        }
        Self {
            _dir: dir,
            root,
            clock: ManualClock::new(1_000),
            written: Vec::new(),
        }
    }

    fn folder(&self, site: usize) -> PathBuf {
        self.root.join(format!("folder-{site}"))
    }

    fn device(site: usize) -> String {
        format!("site-{site}")
    }

    fn open(&self, site: usize, snapshot: bool) -> Ledger {
        let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(self.folder(site)).unwrap());
        let mut options = LedgerOptions::default();
        if snapshot {
            options = options.snapshot(self.root.join(format!("snapshot-{site}.sqlite")));
        }
        Ledger::open_with(&Self::device(site), self.clock.wall_clock(), relay, options).unwrap()
    }

    fn apply(&mut self, step: &Step) {
        self.clock.advance(1);
        match *step {
            Step::Write {
                site,
                agent,
                run,
                epoch,
                status,
            } => {
                let status = [
                    IntentStatus::Pending,
                    IntentStatus::Committed,
                    IntentStatus::Failed,
                ][status];
                let intent = Intent::new(AGENTS[agent], format!("run-{run}"), epoch, status);
                let mut ledger = self.open(site, false);
                // A site whose ledger lacks records (a pruned file that came before the
                // checkpoint that covers its prefix) runs nothing, as `fencepost run` refuses.
                if ledger.damage().is_empty() {
                    self.written.push(ledger.record(&intent).unwrap());
                }
            }
            Step::Compact { site, prune } => {
                let options = if prune {
                    CompactOptions::default().prune()
                } else {
                    CompactOptions::default()
                };
                // A ledger that lacks records here (a pruned file that came before its
                // checkpoint) refuses to compact: that is the point.
                let _ = self.open(site, false).compact_with(&options);
            }
            Step::CarryFile { from, to } => {
                carry_file(&self.folder(from), &self.folder(to), &Self::device(from))
            }
            Step::CarryCheckpoint { from, to, index } => {
                let listed = checkpoints(&self.folder(from));
                if !listed.is_empty() {
                    carry_checkpoint(&listed[index % listed.len()], &self.folder(to));
                }
            }
            Step::Open { site } => drop(self.open(site, true)),
        }
    }

    /// Every copy catches up: each site's own file and every checkpoint reach every folder.
    fn catch_up(&self) {
        for from in 0..SITES {
            for to in 0..SITES {
                for checkpoint in checkpoints(&self.folder(from)) {
                    carry_checkpoint(&checkpoint, &self.folder(to));
                }
            }
        }
        for from in 0..SITES {
            for to in 0..SITES {
                carry_file(&self.folder(from), &self.folder(to), &Self::device(from));
            }
        }
    }
}

fn carry_file(from: &Path, to: &Path, device: &str) {
    if from == to {
        return;
    }
    let source = from.join("devices").join(format!("{device}.jsonl"));
    if source.exists() {
        std::fs::create_dir_all(to.join("devices")).unwrap();
        let staged = to.join("devices").join(format!(".{device}.copying"));
        std::fs::copy(&source, &staged).unwrap();
        std::fs::rename(&staged, to.join("devices").join(format!("{device}.jsonl"))).unwrap();
    }
}

fn carry_checkpoint(checkpoint: &Path, to: &Path) {
    let target = to.join("checkpoints").join(checkpoint.file_name().unwrap());
    if target.exists() || checkpoint.parent().and_then(Path::parent) == Some(to) {
        return;
    }
    std::fs::create_dir_all(to.join("checkpoints")).unwrap();
    let staged = to.join("checkpoints").join(".copying");
    std::fs::copy(checkpoint, &staged).unwrap();
    std::fs::rename(&staged, target).unwrap();
}

fn checkpoints(folder: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(folder.join("checkpoints"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| {
                    path.file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with("checkpoint-"))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Per agent: the fencing epoch, and per run the committed record's id (the oracle, F6).
type Oracle = BTreeMap<String, (u64, BTreeMap<String, String>)>;

fn oracle_of(state: &fencepost::fold::SyncState) -> Oracle {
    state
        .agents()
        .into_iter()
        .map(|(agent, folded)| {
            let committed = folded
                .committed_runs()
                .into_iter()
                .map(|(run, record)| (run, record.op_id.to_string()))
                .collect();
            (agent.to_owned(), (folded.fencing_epoch(), committed))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// K6 (with K1, K2): whatever the sites pruned and whatever order the sync carried files
    /// and checkpoints in, once the copies have caught up every site's ledger is undamaged and
    /// holds exactly the reference fold's commits and fencing epochs, read without a snapshot
    /// (as `ledger` commands do) and with one (as `run` does).
    #[test]
    fn k6_pruning_sites_with_arbitrary_sync_delays_read_every_commit_once_caught_up(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        let mut world = World::new();
        for step in &steps {
            world.apply(step);
        }
        world.catch_up();
        let expected = oracle_of(&fold(&world.written));
        for site in 0..SITES {
            for snapshot in [false, true] {
                let mut ledger = world.open(site, snapshot);
                let damage: Vec<String> = ledger.damage().iter().map(ToString::to_string).collect();
                prop_assert!(damage.is_empty(), "site {site} (snapshot {snapshot}) is damaged: {damage:?}");
                // Every run of the universe asked (a ledger with a snapshot loads runs when
                // asked for them).
                let mut found = Oracle::new();
                for agent in AGENTS {
                    let mut committed = BTreeMap::new();
                    for run in 0..RUNS {
                        let run = format!("run-{run}");
                        if let Some(record) = ledger.committed_run(agent, &run) {
                            committed.insert(run, record.op_id.to_string());
                        }
                    }
                    let fencing = ledger.state().fencing_epoch(agent);
                    if fencing > 0 || !committed.is_empty() {
                        found.insert(agent.to_owned(), (fencing, committed));
                    }
                }
                prop_assert_eq!(&found, &expected, "site {} (snapshot {})", site, snapshot);
                // K3: and `ledger verify` finds every checkpoint there checked or superseded.
                if !snapshot {
                    let problems: Vec<String> = ledger
                        .verify_checkpoints()
                        .unwrap()
                        .iter()
                        .map(ToString::to_string)
                        .collect();
                    prop_assert!(problems.is_empty(), "site {site}: {problems:?}");
                }
            }
        }
    }
}

/// K6, K3 (found by an adversarial test): a checkpoint of another ledger whose device ids are
/// this one's, and whose head sits on the record a pruned file keeps, is not taken for this
/// ledger's (alone, or in a merge): it names another record before the file's first one. The
/// ledger is damaged (nothing runs) instead of holding the other ledger's commits.
#[test]
fn k6_k3_another_ledgers_checkpoint_that_reaches_a_pruned_files_start_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let open = |folder: &Path, snapshot: Option<&str>| {
        let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(folder).unwrap());
        let mut options = LedgerOptions::default();
        if let Some(name) = snapshot {
            options = options.snapshot(dir.path().join(name));
        }
        Ledger::open_with("beta", clock.wall_clock(), relay, options).unwrap()
    };
    let ours = dir.path().join("ours");
    let theirs = dir.path().join("theirs");
    for (folder, prefix) in [(&ours, "ours"), (&theirs, "theirs")] {
        for index in 0..3 {
            clock.advance(1);
            let intent = Intent::new("milo", format!("{prefix}-{index}"), 1, IntentStatus::Committed);
            open(folder, None).record(&intent).unwrap();
        }
    }
    open(&ours, None)
        .compact_with(&CompactOptions::default().prune())
        .unwrap();
    for checkpoint in checkpoints(&ours) {
        std::fs::remove_file(checkpoint).unwrap();
    }
    open(&theirs, None).compact().unwrap();
    for checkpoint in checkpoints(&theirs) {
        carry_checkpoint(&checkpoint, &ours);
    }
    for snapshot in [None, Some("snapshot.sqlite")] {
        let mut ledger = open(&ours, snapshot);
        assert!(!ledger.damage().is_empty(), "snapshot {snapshot:?}: no damage");
        assert!(
            ledger.committed_run("milo", "theirs-0").is_none(),
            "snapshot {snapshot:?}: another ledger's commit"
        );
    }
}
