//! One site's view of the ledger ([`Ledger`]): its own op log, appended through the relay; the
//! folded state of every device's intents; the index of runs in doubt (rule D2); and the damage
//! the relay reported. The dispatch steps that write to it ([`Ledger::begin`],
//! [`Permit`](crate::dispatch::Permit)) are in [`crate::dispatch`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::clock::{HlcConfig, WallClock};
mod error;
use crate::fold::{RunRecord, SyncState};
use crate::id::{Claim, DeviceId};
use crate::lease::IntentStatus;
use crate::oplog::{DeviceLog, HeadMark, LogHead, OpId, OpRecord, Surface};
use crate::relay::{Frontier, Relay, RelayError, RelayProblem};
use crate::run_id::RunKey;
use crate::snapshot::{AttemptsMark, Snapshot, SnapshotBase, SnapshotError};
pub use error::{CheckpointError, LedgerError};

mod append;
mod checkpoints;
mod compose;
mod damage;
mod handoff;
mod import;
mod membership;
mod open_ahead;
mod options;
mod outbox;
mod protected;
mod revocation;
mod seen;
mod snapshot_lock;
mod snapshot_use;
mod state;
mod went_back;

pub use import::{ImportError, ImportSource, Imported, IMPORT_BEGIN_REGISTRY, IMPORT_REGISTRY};
pub use membership::{identity_key, Founded};
pub use options::{CompactOptions, LedgerOptions, Retention};
pub use outbox::{read_outbox, QueuedRecord};
pub use protected::Protected;
pub use revocation::Revoked;
pub use went_back::WentBackRepair;

use seen::{Seen, SeenFile};
use snapshot_lock::SnapshotLock;
use snapshot_use::SnapshotUse;
use state::contains;
pub use state::LedgerState;

/// A run in doubt (rule D2): it has no `committed` record, and a `pending` of some epoch has no
/// `committed` or `failed` record of that same epoch, so that attempt's effect may or may not have
/// happened. A `failed` of an *older* epoch does not settle a newer attempt: a run whose history is
/// `failed`@1 then `pending`@2 is in doubt at epoch 2 (the fold's view of the run, F5, still shows
/// the `failed`@1; `fencepost ledger runs` shows `in-doubt … epoch 2 … after failed@1`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InDoubtRun {
    /// The run.
    pub run_id: String,
    /// The epoch of its greatest unsettled `pending`.
    pub epoch: u64,
    /// The device that wrote it.
    pub device_id: String,
    /// That record.
    pub op_id: OpId,
}

/// Records of one device that the agent's earlier holders pushed and published (rule H3) and
/// that this site's ledger has not received yet: [`Ledger::behind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingRecords {
    /// The device.
    pub device_id: String,
    /// How many of its records the ledger has (the next seq it lacks).
    pub has: u64,
    /// How many were published (the ledger needs every record below this seq).
    pub needs: u64,
    /// The ledger has that many records, but its record `needs - 1` is not the one published:
    /// it holds another log under the device's id (two hosts that use one device id with ledgers
    /// of their own, or a device log replaced by another). Syncing does not cure it.
    pub differs: bool,
}

impl std::fmt::Display for MissingRecords {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.differs {
            write!(
                formatter,
                "{} record {} (this ledger has another record there: a device id used by two hosts with ledgers of their own, or a replaced log)",
                self.device_id,
                self.needs.saturating_sub(1)
            )
        } else if self.has + 1 == self.needs {
            write!(formatter, "{} record {}", self.device_id, self.has)
        } else {
            write!(
                formatter,
                "{} records {}..={}",
                self.device_id,
                self.has,
                self.needs.saturating_sub(1)
            )
        }
    }
}

/// What a [`Ledger::sync`] moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncReport {
    /// Own records pushed.
    pub pushed: usize,
    /// Records pulled from other devices (and own records the relay had that this ledger lacked).
    pub pulled: usize,
}

/// Per run: the pendings with no outcome of their epoch yet, and the epochs that have one.
#[derive(Debug, Default, Clone)]
struct Attempts {
    unsettled: BTreeMap<u64, InDoubtRun>,
    settled: BTreeSet<u64>,
}

/// One site's view of the ledger: its own op log (appended through the relay), the folded state of
/// every device's intents, an index of the runs in doubt, and the damage the relay reported.
///
/// Appends go through [`Relay::append`]: under the relay's claim on this device's log, the ledger
/// first continues past what other writers of the same device (other processes, other `Ledger`s)
/// appended, so any number of them interleave; none forks the log or hides another's record.
pub struct Ledger {
    /// This site's device, checked when the ledger was opened.
    device: DeviceId,
    log: DeviceLog,
    /// The clock the ledger was opened with (a compaction's time).
    wall_clock: WallClock,
    relay: Arc<dyn Relay>,
    /// What the ledger knows, with no I/O: the fold, the verified heads, the in-doubt index.
    view: LedgerState,
    /// Records asked for but not yet stored (their append failed), in order.
    unsent: Vec<(Surface, Value)>,
    /// What the last pull reported, the replaced records, and the devices that shrank.
    problems: Vec<RelayProblem>,
    /// What the last pull reported.
    relay_problems: Vec<RelayProblem>,
    /// Records found replaced (another record where the seen file remembers one): for good.
    replaced: Vec<RelayProblem>,
    /// Devices whose record was found replaced where this site saw one its key signed: proved
    /// (or not) as equivocation once the pull is over.
    suspects: Vec<(String, Seen)>,
    /// Devices (or files) whose damage the caller accepted.
    accepted: BTreeSet<String>,
    /// Per device, the published records the caller accepted as lost ([`Ledger::accept_missing`]):
    /// those below this seq. Records published later are waited for as any others.
    waived: BTreeMap<String, u64>,
    seen: Option<SeenFile>,
    /// Intent records of this device that other writers appended since this ledger's previous
    /// append, as found by the last append (see [`DispatchOutcome::ConcurrentAttempt`]).
    others_appended: Vec<OpRecord>,
    /// The snapshot in use, if any.
    snapshot: Option<SnapshotUse>,
    /// The snapshot that could not be read in this process: damage, for good.
    snapshot_damage: Option<RelayProblem>,
    /// What a snapshot that the ledger no longer matches had read, per device: checked like the
    /// seen file's marks.
    snapshot_marks: Vec<HeadMark>,
    /// The snapshot of those marks, kept unused, when the relay is a database: what this site
    /// writes back into it if it went back ([`Ledger::repair_went_back`]).
    went_back_snapshot: Option<std::path::PathBuf>,
    /// The shared checkpoint that could not be used: damage, for good (see [`crate::checkpoint`]).
    checkpoint_damage: Option<RelayProblem>,
    /// The shared checkpoint that this ledger does not reach or match (its file, its heads):
    /// checked like the seen file's marks, damage until the ledger has what it covers.
    checkpoint_marks: Option<(std::path::PathBuf, Vec<HeadMark>)>,
    /// The id of the shared checkpoint this ledger started from, if it did.
    started_from: Option<String>,
    /// The checkpoint this ledger started from because device files begin after it (pruned),
    /// and the frontier where it ends.
    start_checkpoint: Option<(std::path::PathBuf, Frontier)>,
    /// Whether the view started from a merge of checkpoints (rule K6), none of which covers
    /// alone the records removed from the relay: written as a checkpoint once the open has read
    /// the rest ([`Ledger::write_merged_start`]).
    merged_start: bool,
    /// How many checkpoints the relay's [store](crate::relay::Relay::checkpoint_store) held when
    /// this ledger last listed them (`None`: not listed, or no store).
    stored_checkpoints: std::cell::Cell<Option<usize>>,
    /// The outbox ([`LedgerOptions::outbox`]).
    outbox: Option<std::path::PathBuf>,
    /// How many queued records the open stored from the outbox.
    stored_from_outbox: usize,
    /// The protected ledger this one is ([`LedgerOptions::protected`]).
    protected: Option<Arc<Protected>>,
    /// Where a protected ledger keeps the checkpoints it opened ([`LedgerOptions::checkpoint_copies`]).
    checkpoint_copies: Option<std::path::PathBuf>,
    /// Sealed checkpoints that did not open here, and why.
    unopened_checkpoints: std::sync::Mutex<Vec<(String, String)>>,
}

/// How many ids of each device a snapshot keeps (what a published head is compared with).
const RECENT_IDS: usize = 1024;

/// Why a grant is not fresh: [`Ledger::stale_grant`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleGrant {
    /// The epoch is below the ledger's fencing epoch.
    BelowLedger {
        /// The ledger's fencing epoch.
        fencing_epoch: u64,
    },
    /// Another device's `pending` is at the epoch: it held it.
    HeldBy {
        /// That device.
        device_id: String,
    },
    /// The ledger has records at the epoch, of this device id only (another process sharing it,
    /// or an earlier tenure).
    UsedBefore,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Ledger")
            .field("device_id", &self.log.device_id())
            .field("unsent", &self.unsent.len())
            .field("problems", &self.problems.len())
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Opens `device_id`'s ledger on `relay`: pulls everything, folds it, and continues this
    /// device's own log from what the relay holds of it (after a restart, too).
    ///
    /// # Errors
    /// [`LedgerError::InvalidId`], [`LedgerError::Relay`] if the pull fails, and
    /// [`LedgerError::Log`] if this device's stored log does not verify.
    pub fn open(device_id: &str, wall_clock: WallClock, relay: Arc<dyn Relay>) -> Result<Self, LedgerError> {
        Self::open_with(device_id, wall_clock, relay, LedgerOptions::default())
    }

    /// [`open`](Self::open) with options.
    ///
    /// # Errors
    /// As [`open`](Self::open), and [`LedgerError::Seen`] when the seen file cannot be read or
    /// written, or is damaged (it is never silently started over).
    pub fn open_with(
        device_id: &str,
        wall_clock: WallClock,
        relay: Arc<dyn Relay>,
        options: LedgerOptions,
    ) -> Result<Self, LedgerError> {
        let device = DeviceId::new(device_id)?;
        let seen = options.seen_file.map(SeenFile::load).transpose()?;
        let mut ledger = Self {
            device,
            log: DeviceLog::new(device_id, wall_clock.clone())?,
            wall_clock: wall_clock.clone(),
            relay: Arc::clone(&relay),
            view: LedgerState::default(),
            unsent: Vec::new(),
            problems: Vec::new(),
            relay_problems: Vec::new(),
            replaced: Vec::new(),
            suspects: Vec::new(),
            accepted: BTreeSet::new(),
            waived: BTreeMap::new(),
            seen,
            others_appended: Vec::new(),
            snapshot: None,
            snapshot_damage: None,
            snapshot_marks: Vec::new(),
            went_back_snapshot: None,
            checkpoint_damage: None,
            checkpoint_marks: None,
            started_from: None,
            start_checkpoint: None,
            merged_start: false,
            stored_checkpoints: std::cell::Cell::new(None),
            outbox: options.outbox.clone(),
            stored_from_outbox: 0,
            protected: options.protected.clone(),
            checkpoint_copies: options.checkpoint_copies.clone(),
            unopened_checkpoints: std::sync::Mutex::new(Vec::new()),
        };
        ledger.view.protected = options.protected.as_deref().map(Protected::logs);
        if !relay.checks_records() {
            // This device's records are verified here (a log that does not verify is an error),
            // then the ledger folds what the relay handed over, checking it again.
            let stopwatch = crate::clock::Stopwatch::start();
            let batch = relay.pull(&Frontier::new())?;
            crate::metrics::relay_call(
                crate::metrics::RELAY_PULL_SECONDS,
                crate::metrics::RELAY_PULLED_RECORDS,
                stopwatch.elapsed(),
                batch.ops.len(),
            );
            let own: Vec<OpRecord> = batch
                .ops
                .iter()
                .filter(|op| &*op.device_id == device_id)
                .cloned()
                .collect();
            ledger.log = DeviceLog::resume(device_id, wall_clock, HlcConfig::default(), &own)?;
            ledger.take_pull(batch)?;
            ledger.stored_from_outbox = ledger.store_outbox()?;
            return Ok(ledger);
        }
        // A relay that checks its records hands over checked chains: they are folded as they are
        // read (no need to hold them all), and this device's log continues from where the fold's
        // check of it ends. With a snapshot that matches the relay, only what follows it is read.
        if let Some(path) = options.snapshot {
            // In use, the snapshot is locked shared, so that no other process replaces it (see
            // `snapshot_lock`). A new site's first processes: one makes the snapshot (from the
            // checkpoint) with the lock exclusive, the others wait for it (`import_checkpoint`).
            let lock = if path.exists() {
                SnapshotLock::shared(&path)
            } else {
                SnapshotLock::for_new(&path)
            };
            ledger.snapshot = lock.and_then(|lock| SnapshotUse::open(path, device_id, lock));
        }
        ledger.resume_snapshot()?;
        if ledger.view.frontier.iter().next().is_none() {
            // Nothing restored: where device files begin after a checkpoint (pruned), from the
            // checkpoint that covers what they lack.
            ledger.start_after_pruning()?;
        }
        let since = ledger.view.frontier.clone();
        let stopwatch = crate::clock::Stopwatch::start();
        let (problems, pulled) = ledger.pull_and_absorb(&*relay, &since)?;
        crate::metrics::relay_call(
            crate::metrics::RELAY_PULL_SECONDS,
            crate::metrics::RELAY_PULLED_RECORDS,
            stopwatch.elapsed(),
            pulled,
        );
        ledger.take_problems(problems)?;
        ledger.read_again_if_stale()?;
        ledger.refuse_revoked_writers();
        if let Some(head) = ledger.view.heads.get(device_id) {
            ledger.log = DeviceLog::continue_after(wall_clock, HlcConfig::default(), head.clone());
        }
        ledger.write_merged_start();
        ledger.save_snapshot();
        ledger.stored_from_outbox = ledger.store_outbox()?;
        Ok(ledger)
    }

    /// Whether this ledger resumed from its [snapshot](LedgerOptions::snapshot): it read only the
    /// records that followed it.
    pub fn resumed_from_snapshot(&self) -> bool {
        self.snapshot.as_ref().is_some_and(|snapshot| snapshot.queried)
    }

    /// The greatest committed record of the run (rule F6: the idempotency oracle), looking it up
    /// in the snapshot when the ledger resumed from one.
    pub fn committed_run(&mut self, agent_id: &str, run_id: &str) -> Option<RunRecord> {
        self.load_run(agent_id, run_id);
        self.view.state.committed_run(agent_id, run_id).copied()
    }

    /// Merges the run's stored entry into [`state`](Self::state) when the ledger resumed from a
    /// snapshot, so that the state answers for it (the dispatch steps call it).
    pub(crate) fn prepare_run(&mut self, agent_id: &str, run_id: &str) {
        self.load_run(agent_id, run_id);
    }

    /// This site's device id.
    pub fn device_id(&self) -> &str {
        self.log.device_id()
    }

    /// The device this site writes as, as a checked id.
    pub fn device(&self) -> &DeviceId {
        &self.device
    }

    /// The folded state of every intent this ledger has; with a [snapshot](LedgerOptions::snapshot),
    /// of the runs read or asked about in this process ([`committed_run`](Self::committed_run)).
    pub fn state(&self) -> &SyncState {
        &self.view.state
    }

    /// What this ledger knows, as a value with no I/O.
    pub fn view(&self) -> &LedgerState {
        &self.view
    }

    /// The outbox ([`LedgerOptions::outbox`]), if the ledger was opened with one.
    pub fn outbox_file(&self) -> Option<&std::path::Path> {
        self.outbox.as_deref()
    }

    /// How many records queued on this site (in the [outbox](LedgerOptions::outbox)) the open
    /// stored.
    pub fn stored_from_outbox(&self) -> usize {
        self.stored_from_outbox
    }

    /// How many records wait to be stored (their append failed; [`flush`](Self::flush) retries).
    pub fn unsent(&self) -> usize {
        self.unsent.len()
    }

    /// Stores the queued records, then pulls and folds what the relay has that this ledger lacks.
    /// The problems the pull reports replace the previous ones ([`problems`](Self::problems)).
    ///
    /// # Errors
    /// [`LedgerError::Relay`] when the push or the pull fails.
    pub fn sync(&mut self) -> Result<SyncReport, LedgerError> {
        let pushed = self.flush()?;
        let stopwatch = crate::clock::Stopwatch::start();
        let batch = self.relay.pull(&self.view.frontier)?;
        crate::metrics::relay_call(
            crate::metrics::RELAY_PULL_SECONDS,
            crate::metrics::RELAY_PULLED_RECORDS,
            stopwatch.elapsed(),
            batch.ops.len(),
        );
        for op in &batch.ops {
            if &*op.device_id == self.log.device_id() {
                continue; // own records written by another process: caught up on the next append
            }
            // A stamp too far ahead is refused by the clock (rule C1) but still folded.
            if let Err(error) = self.log.observe(&op.hlc) {
                tracing::warn!(%error, device_id = %op.device_id, "not advancing the clock to a remote stamp");
            }
        }
        let pulled = batch.ops.len();
        self.take_pull(batch)?;
        self.save_snapshot();
        Ok(SyncReport { pushed, pulled })
    }

    /// Folds a pull, keeps its problems, and checks and updates the seen file.
    fn take_pull(&mut self, batch: crate::relay::PullBatch) -> Result<(), LedgerError> {
        self.absorb(&batch.ops);
        self.take_problems(batch.problems)?;
        self.read_again_if_stale()
    }

    fn save_seen(&mut self) -> Result<(), LedgerError> {
        let Some(seen) = &mut self.seen else {
            return Ok(());
        };
        let damaged: BTreeSet<&str> = self
            .problems
            .iter()
            .filter(|problem| problem.is_damage())
            .filter_map(|problem| problem.device_id.as_deref())
            .collect();
        let mut marks = BTreeMap::new();
        for (device, next_seq) in self.view.frontier.iter() {
            if damaged.contains(device) {
                continue;
            }
            if let Some(head) = self.view.heads.get(device) {
                if let (true, Some(last_op_id)) = (head.next_seq() == next_seq, head.last_op_id()) {
                    let mut mark = Seen {
                        next_seq,
                        last_op_id,
                        head: None,
                    };
                    let signed = self
                        .view
                        .protected
                        .as_ref()
                        .and_then(|logs| logs.last_head(device));
                    mark.head = signed.and_then(|(origin, head)| mark.head_of(origin, head));
                    marks.insert(device.to_owned(), mark);
                }
            }
        }
        seen.store(marks)
    }

    /// Folds `ops` (stored in the relay) into the view, then checks the records that verified
    /// against the seen file.
    fn absorb(&mut self, ops: &[OpRecord]) {
        let verified = self.view.accept_from(ops, self.relay.checks_records());
        if self.snapshot.as_ref().is_some_and(|snapshot| snapshot.queried) {
            // The runs these records continue: their stored entries first (a protected
            // ledger's records name their runs once opened, so after they are accepted).
            for op in &verified {
                if let Some(intent) = op
                    .payload
                    .compact_intent()
                    .filter(|_| op.surface == Surface::Intent)
                {
                    let (agent, run) = (intent.agent.to_string(), intent.run.to_string());
                    self.load_run(&agent, &run);
                }
            }
        }
        self.view.fold_accepted(&verified);
        if let Some(dirty) = self
            .snapshot
            .as_mut()
            .and_then(|snapshot| snapshot.dirty.as_mut())
        {
            for op in &verified {
                if let Some(intent) = op
                    .payload
                    .compact_intent()
                    .filter(|_| op.surface == Surface::Intent)
                {
                    dirty.insert((intent.agent.to_string(), intent.run.to_string()));
                }
            }
        }
        for op in verified {
            let Some(mark) = self
                .seen
                .as_ref()
                .and_then(|seen| seen.devices.get(&*op.device_id))
                .filter(|mark| op.seq + 1 == mark.next_seq && op.op_id != mark.last_op_id)
                .cloned()
            else {
                continue;
            };
            let (kind, cause) = self.replaced_cause();
            self.replaced.push(RelayProblem {
                kind,
                device_id: Some(op.device_id.to_string()),
                file: None,
                line_number: Some(op.seq + 1),
                detail: format!(
                    "record {} is {}, but this site saw {} there: {cause}",
                    op.seq, op.op_id, mark.last_op_id
                ),
            });
            // Proved once the pull is over (the relay is busy handing records over now).
            self.suspects.push((op.device_id.to_string(), mark));
        }
    }

    /// The runs of `agent_id` in doubt for a holder at `held_epoch` (rule D2); see
    /// [`LedgerState::in_doubt`].
    pub fn in_doubt(&self, agent_id: &str, held_epoch: u64) -> Vec<InDoubtRun> {
        self.view.in_doubt(agent_id, held_epoch)
    }

    /// Whether `run_id` of `agent_id` is in doubt for a holder at `held_epoch`; see
    /// [`LedgerState::in_doubt_run`].
    pub fn in_doubt_run(&self, agent_id: &str, run_id: &str, held_epoch: u64) -> Option<InDoubtRun> {
        self.view.in_doubt_run(agent_id, run_id, held_epoch)
    }

    /// Why `grant` (an epoch of an agent just granted to a device) is not a fresh grant, if it
    /// is not. A grant comes after the coordinator's floor was raised to the ledger's epoch, so it
    /// is above every epoch the ledger has seen, unless the coordinator lost or rolled back its
    /// state in between; then give the lease back and acquire again with the ledger's epoch as
    /// the floor ([`run_once`](crate::run::run_once) does). Call it right after acquiring (and syncing): later in
    /// the tenure, this holder's own records are at the epoch.
    pub fn stale_grant(&self, grant: &Claim) -> Option<StaleGrant> {
        let epoch = grant.epoch.get();
        let fencing_epoch = self.state().fencing_epoch(&grant.agent);
        if epoch > fencing_epoch {
            return None;
        }
        Some(if epoch < fencing_epoch {
            StaleGrant::BelowLedger { fencing_epoch }
        } else if let Some(device_id) = self.epoch_used_by_another(grant) {
            StaleGrant::HeldBy { device_id }
        } else {
            StaleGrant::UsedBefore
        })
    }

    /// Another device with a `pending` of the claim's agent at its epoch; see
    /// [`LedgerState::epoch_used_by_another`].
    pub fn epoch_used_by_another(&self, claim: &Claim) -> Option<String> {
        self.view.epoch_used_by_another(claim)
    }

    /// A `pending` of `run_id` that another writer of this device appended just before this
    /// ledger's last append (found in that append's catch-up), if any.
    /// A `committed` of the run among them is left to the fence (`AlreadyCommitted`).
    pub(crate) fn concurrent_attempt(&self, agent_id: &str, run_id: &str) -> Option<InDoubtRun> {
        let of_run = |op: &OpRecord| {
            op.payload
                .intent()
                .filter(|intent| intent.agent_id == agent_id && intent.run_id == run_id)
        };
        if self
            .others_appended
            .iter()
            .filter_map(of_run)
            .any(|intent| intent.status == IntentStatus::Committed)
        {
            return None;
        }
        self.others_appended.iter().rev().find_map(|op| {
            let intent = op.payload.intent()?;
            (intent.agent_id == agent_id && intent.run_id == run_id && intent.status == IntentStatus::Pending)
                .then(|| InDoubtRun {
                    run_id: intent.run_id,
                    epoch: intent.epoch,
                    device_id: op.device_id.to_string(),
                    op_id: op.op_id,
                })
        })
    }
}
