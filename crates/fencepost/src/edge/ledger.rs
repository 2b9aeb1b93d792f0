//! One site's view of the ledger ([`Ledger`]): its own op log, appended through the relay; the
//! folded state of every device's intents; the index of runs in doubt (rule D2); and the damage
//! the relay reported. The dispatch steps that write to it ([`Ledger::begin`],
//! [`Permit`](crate::dispatch::Permit)) are in [`crate::dispatch`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::clock::{HlcConfig, WallClock};
use crate::dispatch::DispatchError;
use crate::fold::{RunRecord, SyncState};
use crate::id::{validate_id, IdKind};
use crate::lease::{Intent, IntentStatus};
use crate::oplog::{DeviceLog, HeadMark, LogHead, OpId, OpRecord, Surface};
use crate::relay::{Frontier, Relay, RelayError, RelayProblem};
use crate::run_id::RunKey;
use crate::snapshot::{AttemptsMark, Snapshot, SnapshotBase, SnapshotError};

mod checkpoints;
mod compose;
mod outbox;
mod snapshot_lock;
mod went_back;

pub use outbox::{read_outbox, QueuedRecord};
pub use went_back::WentBackRepair;

use snapshot_lock::SnapshotLock;

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

/// What a database ledger that holds fewer records than a site read before did
/// ([`ProblemKind::WentBack`](crate::relay::ProblemKind::WentBack)).
const WENT_BACK: &str = "this database went back (restored from a dump or an older copy, or failed over to a standby that lagged) and forgot records this site read, commits among them";

/// What a database ledger that holds other records than a site read before did.
const WENT_BACK_WRITTEN: &str = "this database went back (restored from a dump or an older copy, or failed over to a standby that lagged), forgot records this site read, commits among them, and was written since";

/// What a [`Ledger::sync`] moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncReport {
    /// Own records pushed.
    pub pushed: usize,
    /// Records pulled from other devices (and own records the relay had that this ledger lacked).
    pub pulled: usize,
}

/// Settings of [`Ledger::open_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LedgerOptions {
    /// A file (in the site's own data directory, never in the relay) where the ledger remembers,
    /// per device, how many records it has seen and the last one's id. A later open that finds
    /// fewer records, or another record at that place, reports the device as damaged (a file that
    /// shrank, was replaced or lost records), so nothing is dispatched on what is left. Shared by
    /// every process of the site (updates merge under a file lock).
    pub seen_file: Option<std::path::PathBuf>,
    /// A file (in the site's own data directory) where the ledger keeps what it folded, per
    /// ledger and device, so that the next open reads only the records added since; see
    /// [`crate::snapshot`]. Used with relays that can resume ([`Relay::resume`]): a folder. A
    /// snapshot that cannot be used is rebuilt, never trusted blindly.
    ///
    /// With a snapshot, [`Ledger::state`] holds the runs read or asked about in this process
    /// only: ask [`Ledger::committed_run`], or open without one to list everything.
    pub snapshot: Option<std::path::PathBuf>,
    /// A file (in the site's own data directory) that keeps the records this site could not
    /// store yet ([`Ledger::queue_unsent`]: the outcome of a command that ran while the
    /// database was away), until a ledger opened with it stores them: [`Ledger::open_with`]
    /// does, before it returns, and fails while it cannot, so that nothing is decided on a
    /// ledger that lacks them. Shared by the site's processes (under a file lock).
    pub outbox: Option<std::path::PathBuf>,
}

impl LedgerOptions {
    /// Keep records that could not be stored in `path` (see [`LedgerOptions::outbox`]).
    pub fn outbox(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.outbox = Some(path.into());
        self
    }

    /// Remember what was seen in `path` (see [`LedgerOptions::seen_file`]).
    pub fn seen_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.seen_file = Some(path.into());
        self
    }

    /// Keep a snapshot in `path` (see [`LedgerOptions::snapshot`]).
    pub fn snapshot(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.snapshot = Some(path.into());
        self
    }
}

/// How [`Ledger::compact_with`] writes a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactOptions {
    /// The oracle's retention: leave out the committed runs that are at least this old (off by
    /// default; see [`Forgetting`](crate::fold::Forgetting) for when it is safe).
    pub forget: Option<Retention>,
    /// A clock that reads earlier than this (ms since the Unix epoch) is not set yet (a device
    /// without a real-time clock, at 1970 before it synchronises): its compaction adds nothing
    /// to the line of compactions, so it can never be an anchor. 0 (the default): no floor.
    pub clock_floor_ms: u64,
    /// Then remove from this device's own log in the relay the records the checkpoint covers
    /// ([`Relay::prune`](crate::relay::Relay::prune)): the relay stays bounded when every site
    /// compacts with it now and then. Off by default.
    pub prune: bool,
}

impl CompactOptions {
    /// Prune this device's own log after writing the checkpoint (see [`CompactOptions::prune`]).
    pub fn prune(mut self) -> Self {
        self.prune = true;
        self
    }

    /// Forget what `retention` says (see [`CompactOptions::forget`]).
    pub fn forget(mut self, retention: Retention) -> Self {
        self.forget = Some(retention);
        self
    }

    /// Take a clock that reads earlier than `floor_ms` for one not set yet (see
    /// [`CompactOptions::clock_floor_ms`]).
    pub fn clock_floor(mut self, floor_ms: u64) -> Self {
        self.clock_floor_ms = floor_ms;
        self
    }
}

/// The oracle's retention asked of a compaction ([`CompactOptions::forget`]): forget the
/// committed runs of `agents` (empty: every agent's) that an earlier compaction of the
/// checkpoints' line, written at least `older_than_ms` ago by the ledger's clock, already
/// covered (that compaction is the rule's anchor, [`Forgetting`](crate::fold::Forgetting)). With
/// no compaction that old yet, nothing is forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// How old a compaction must be to be the anchor, in ms.
    pub older_than_ms: u64,
    /// The agents whose runs are forgotten; empty: every agent's.
    pub agents: Vec<String>,
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
}

/// How many ids of each device a snapshot keeps (what a published head is compared with).
const RECENT_IDS: usize = 1024;

/// A ledger's snapshot ([`LedgerOptions::snapshot`]) and what this process did with it.
#[derive(Debug)]
struct SnapshotUse {
    store: Snapshot,
    /// The lock that keeps the file in place while it is open here ([`SnapshotLock`]).
    lock: SnapshotLock,
    /// Whether the stored runs are part of the state (the ledger resumed from it): a run not in
    /// the view is looked up there. After a read from the start, the view has every run.
    queried: bool,
    /// The runs looked up in the store (found or not) and merged into the view.
    loaded: BTreeSet<(String, String)>,
    /// The runs whose entries changed since the last save; `None`: every run.
    dirty: Option<BTreeSet<(String, String)>>,
    /// The frontier of the last save (or of the resumed snapshot).
    saved: Option<Frontier>,
}

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

/// What a ledger knows, as a value with no I/O: the folded state of the records it was given,
/// each device's verified head (every record is checked against it, rule O1, before it reaches
/// the fold), the index of attempts per run (rule D2) and the devices at each agent's highest
/// `pending` epoch. [`Ledger`] keeps one and feeds it what its relay hands over; anything else
/// that holds records (a test, a simulator, a relay of its own) can feed one directly.
#[derive(Debug, Default)]
pub struct LedgerState {
    state: SyncState,
    frontier: Frontier,
    /// Per device, the head of the records folded.
    heads: BTreeMap<String, LogHead>,
    /// Per device, the seq of the first id kept and the id of each record folded from it on, by
    /// seq: what a published head (rule H3) is compared with. From seq 0, or from the first id a
    /// snapshot kept.
    ids: BTreeMap<String, (u64, Vec<OpId>)>,
    /// The verified records of the other surfaces (logs, registries), for a snapshot.
    other_records: Vec<OpRecord>,
    /// Per device, the record handed over that did not verify (a forged or damaged one): damage
    /// until a valid record takes its place.
    rejected: BTreeMap<String, RelayProblem>,
    /// Per agent and run, the attempts, for runs with no commit.
    attempts: BTreeMap<String, BTreeMap<RunKey, Attempts>>,
    /// Per agent, the highest epoch of its `pending` intents and the devices that wrote one at it:
    /// only the holder of an epoch writes `pending`s at it, so two devices there mean the epoch
    /// was granted twice (a coordinator that lost or rolled back its state).
    pending_epochs: BTreeMap<String, (u64, BTreeSet<String>)>,
    /// The committed runs that the checkpoint this view started from left out (the oracle's
    /// retention, [`Forgetting`](crate::fold::Forgetting)); kept with the snapshot.
    forgotten: Option<crate::fold::Forgetting>,
    /// Records known by their place and id from the checkpoint this view started from after
    /// records were pruned (its heads and its line's): what [`holds`](Self::holds) accepts
    /// where the records themselves are no longer in the relay.
    attested: BTreeSet<(String, u64, OpId)>,
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
    /// [`DispatchError::InvalidId`], [`DispatchError::Relay`] if the pull fails, and
    /// [`DispatchError::Log`] if this device's stored log does not verify.
    pub fn open(
        device_id: &str,
        wall_clock: WallClock,
        relay: Arc<dyn Relay>,
    ) -> Result<Self, DispatchError> {
        Self::open_with(device_id, wall_clock, relay, LedgerOptions::default())
    }

    /// [`open`](Self::open) with options.
    ///
    /// # Errors
    /// As [`open`](Self::open), and [`DispatchError::Seen`] when the seen file cannot be read or
    /// written, or is damaged (it is never silently started over).
    pub fn open_with(
        device_id: &str,
        wall_clock: WallClock,
        relay: Arc<dyn Relay>,
        options: LedgerOptions,
    ) -> Result<Self, DispatchError> {
        validate_id(IdKind::Device, device_id)?;
        let seen = options.seen_file.map(SeenFile::load).transpose()?;
        let mut ledger = Self {
            log: DeviceLog::new(device_id, wall_clock.clone())?,
            wall_clock: wall_clock.clone(),
            relay: Arc::clone(&relay),
            view: LedgerState::default(),
            unsent: Vec::new(),
            problems: Vec::new(),
            relay_problems: Vec::new(),
            replaced: Vec::new(),
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
        };
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
        let mut pulled = 0;
        let problems = relay.pull_in_batches(&since, &mut |ops| {
            pulled += ops.len();
            ledger.absorb(&ops);
        })?;
        crate::metrics::relay_call(
            crate::metrics::RELAY_PULL_SECONDS,
            crate::metrics::RELAY_PULLED_RECORDS,
            stopwatch.elapsed(),
            pulled,
        );
        ledger.take_problems(problems)?;
        if let Some(head) = ledger.view.heads.get(device_id) {
            ledger.log = DeviceLog::continue_after(wall_clock, HlcConfig::default(), head.clone());
        }
        ledger.write_merged_start();
        ledger.save_snapshot();
        ledger.stored_from_outbox = ledger.store_outbox()?;
        Ok(ledger)
    }

    /// Restores the view from the snapshot, if it has a saved state and the relay resumes at its
    /// cursor. A snapshot that cannot be read is started over (a new file: a process still
    /// reading the old one keeps it). One that the ledger no longer matches (a device file that
    /// shrank or was replaced, records deleted) is kept as it is and not used: what it had read
    /// is checked like the seen file's memory (damage until the ledger has it again), and it is
    /// not overwritten while the ledger is damaged.
    fn resume_snapshot(&mut self) -> Result<(), RelayError> {
        let Some(snapshot) = &self.snapshot else {
            return Ok(());
        };
        let path = snapshot.store.path().to_path_buf();
        let mut saved = snapshot.store.base();
        let mut from_checkpoint = None;
        let mut empty = matches!(saved, Ok(None));
        // The fencing epochs of a snapshot given up for a checkpoint that forgets more (K2: kept
        // whatever the checkpoint says).
        let mut given_up = Vec::new();
        if let Ok(Some(base)) = &saved {
            if self.move_to_forgetting_checkpoint(base) {
                empty = true;
                given_up.clone_from(&base.fencing);
            } else if self.move_past_pruned(base) {
                // What it read is checked like the seen file's marks: the checkpoint and the
                // files after it must hold it all.
                empty = true;
                given_up.clone_from(&base.fencing);
                self.snapshot_marks.clone_from(&base.heads);
            }
        }
        if empty {
            // Nothing saved yet (a new site, or a snapshot started over): from the shared
            // checkpoint, if there is one.
            from_checkpoint = self.import_checkpoint();
        }
        if self.share_snapshot() || empty {
            let Some(snapshot) = &self.snapshot else {
                return Ok(());
            };
            saved = snapshot.store.base();
        }
        let base = match saved {
            Ok(None) => return Ok(()), // nothing saved yet
            Ok(Some(base)) => base,
            Err(error) if error.is_busy() => {
                tracing::warn!(snapshot = %path.display(), %error, "another process holds the snapshot; reading the whole ledger this time");
                self.snapshot = None;
                return Ok(());
            }
            Err(error) => {
                self.start_snapshot_over(path, &error.to_string());
                return Ok(());
            }
        };
        let view = match LedgerState::restored(&base) {
            Ok(view) => view,
            Err(reason) => {
                self.start_snapshot_over(path, &reason);
                return Ok(());
            }
        };
        if let Err(reason) = self.relay.resume(&base.cursor) {
            // The relay could not be read (a database away): nothing is known of the snapshot,
            // which stays as it is; the open fails with the relay's error.
            let reason = match reason {
                crate::relay::ResumeError::Relay(error) => return Err(error),
                other => other.to_string(),
            };
            if let Some((_, checkpoint)) = from_checkpoint {
                // The files here do not reach the checkpoint (not synced up to it yet, or they
                // shrank) or hold other records: what it covers is checked like the seen file's
                // memory, so nothing runs on a ledger that lacks records the checkpoint saw.
                tracing::warn!(checkpoint = %checkpoint.display(), %reason, "the ledger's files here do not match the shared checkpoint; reading the whole ledger");
                // Its fencing epochs still hold (rule K2): the epochs it saw were granted, even
                // if the records that show them are not here (and their damage is accepted).
                for (agent, epoch) in &base.fencing {
                    self.view.state.raise_fencing_epoch(agent, *epoch);
                }
                // And so do its commits (issue 37, item 4; found by an adversarial test: a host
                // that accepted this damage ran again a run the checkpoint holds committed).
                self.keep_commits_of_snapshot();
                self.checkpoint_marks = Some((checkpoint, base.heads));
                self.start_snapshot_over(
                    path,
                    "it was copied from a checkpoint that this ledger does not match",
                );
                return Ok(());
            }
            tracing::warn!(snapshot = %path.display(), %reason, "the ledger no longer holds what this site's snapshot read; reading the whole ledger");
            self.snapshot_marks = base.heads;
            self.snapshot = None;
            if self.relay.is_database() {
                self.went_back_snapshot = Some(path);
            }
            return Ok(());
        }
        let Some(snapshot) = &mut self.snapshot else {
            return Ok(());
        };
        snapshot.saved = Some(view.frontier.clone());
        snapshot.queried = true;
        snapshot.dirty = Some(BTreeSet::new());
        self.view = view;
        for (agent, epoch) in &given_up {
            self.view.state.raise_fencing_epoch(agent, *epoch);
        }
        self.started_from = from_checkpoint.map(|(id, _)| id);
        tracing::debug!(snapshot = %path.display(), "resumed from the snapshot");
        Ok(())
    }

    /// Makes the snapshot's lock shared again if this process holds it exclusively (it made the
    /// snapshot, or tried to), and opens the snapshot again (it may have been replaced while the
    /// lock changed hands); whether it did.
    fn share_snapshot(&mut self) -> bool {
        if !self
            .snapshot
            .as_ref()
            .is_some_and(|snapshot| snapshot.lock.is_exclusive())
        {
            return false;
        }
        let Some(snapshot) = self.snapshot.take() else {
            return false;
        };
        let (path, lock) = snapshot.close();
        let device = self.log.device_id().to_owned();
        self.snapshot = lock
            .downgrade(&path)
            .and_then(|lock| SnapshotUse::open(path, &device, lock));
        true
    }

    /// Closes the snapshot and takes its lock exclusively, when no other process has it open:
    /// its path and the lock, for a caller that replaces or removes the file. Else the snapshot
    /// stays open here, shared, and `None`.
    fn snapshot_exclusively(&mut self) -> Option<(std::path::PathBuf, SnapshotLock)> {
        let (path, lock) = self.snapshot.take()?.close();
        match lock.upgrade(&path) {
            Ok(lock) => Some((path, lock)),
            Err(shared) => {
                let device = self.log.device_id().to_owned();
                self.snapshot = shared.and_then(|lock| SnapshotUse::open(path, &device, lock));
                None
            }
        }
    }

    /// Removes a snapshot that cannot be used and starts a new one in its place, when no other
    /// process has it open (else this process does without it: removing a SQLite file from
    /// under its readers is not safe for them); this open reads the whole ledger.
    fn start_snapshot_over(&mut self, path: std::path::PathBuf, reason: &str) {
        let Some(snapshot) = self.snapshot.take() else {
            return;
        };
        let (_, lock) = snapshot.close();
        let lock = match lock.upgrade(&path) {
            Ok(lock) => lock,
            Err(_) => {
                tracing::warn!(snapshot = %path.display(), %reason, "the snapshot cannot be used, and other processes have it open; reading the whole ledger without it");
                return;
            }
        };
        tracing::warn!(snapshot = %path.display(), %reason, "the snapshot cannot be used; reading the whole ledger and starting it over");
        let device = self.log.device_id().to_owned();
        Snapshot::remove(&path);
        self.snapshot = lock
            .downgrade(&path)
            .and_then(|lock| SnapshotUse::open(path, &device, lock));
    }

    /// Saves what the view holds to the snapshot, when it is at a clean point: no damage, and
    /// the relay's cursor exactly at the view's frontier. A failure only costs the next process
    /// a longer read.
    fn save_snapshot(&mut self) {
        let Some(snapshot) = &mut self.snapshot else {
            return;
        };
        let unchanged = snapshot.saved.as_ref() == Some(&self.view.frontier)
            && snapshot.dirty.as_ref().is_some_and(BTreeSet::is_empty);
        if unchanged || self.problems.iter().any(RelayProblem::is_damage) || !self.view.rejected.is_empty() {
            return;
        }
        let Some(cursor) = self.relay.cursor(&self.view.frontier) else {
            return;
        };
        let base = self.view.base_mark(cursor);
        let view = &self.view;
        let runs = match &snapshot.dirty {
            None => view.state.run_count(),
            Some(dirty) => dirty.len(),
        };
        // A save of the runs changed since the last one continues the stored state only if that
        // holds everything this view resumed from (found by an adversarial test: a snapshot
        // replaced under a process, then saved with only its last runs and the heads of all,
        // answered "not committed" for every other run).
        let continues = |stored: &[HeadMark]| match (&snapshot.dirty, &snapshot.saved) {
            (None, _) | (Some(_), None) => true,
            (Some(_), Some(saved)) => saved.iter().all(|(device, next_seq)| {
                stored
                    .iter()
                    .any(|mark| mark.device_id == device && mark.next_seq >= next_seq)
            }),
        };
        let saved = (|| -> Result<bool, SnapshotError> {
            let Some(mut save) = snapshot
                .store
                .begin_save(|stored| contains(&base.heads, stored) && continues(stored), runs)?
            else {
                return Ok(false);
            };
            match &snapshot.dirty {
                None => view
                    .state
                    .for_each_run_summary(|agent, run, summary| save.put_run(agent, run, &summary))?,
                Some(dirty) => {
                    for (agent, run) in dirty {
                        if let Some(summary) = view.state.run_summary(agent, run) {
                            save.put_run(agent, run, &summary)?;
                        }
                    }
                }
            }
            save.finish(&base)?;
            Ok(true)
        })();
        match saved {
            Ok(true) => {
                if snapshot.dirty.is_none() {
                    // A whole ledger was written: out of the write-ahead log, into the file.
                    if let Err(error) = snapshot.store.checkpoint() {
                        tracing::debug!(%error, "cannot checkpoint the snapshot's log now");
                    }
                }
                snapshot.dirty = Some(BTreeSet::new());
                snapshot.saved = Some(self.view.frontier.clone());
            }
            Ok(false) => {
                tracing::debug!("another process saved a snapshot this one does not contain; not saving")
            }
            Err(error) => {
                tracing::warn!(snapshot = %snapshot.store.path().display(), %error, "cannot save the snapshot (the next command reads more of the ledger)");
            }
        }
    }

    /// Merges the stored entry of a run into the view, once, when the view resumed from a
    /// snapshot. A snapshot that cannot be read is damage (see [`crate::snapshot`]).
    fn load_run(&mut self, agent_id: &str, run_id: &str) {
        let Some(snapshot) = self.snapshot.as_mut().filter(|snapshot| snapshot.queried) else {
            return;
        };
        let key = (agent_id.to_owned(), run_id.to_owned());
        if snapshot.loaded.contains(&key) {
            return;
        }
        match snapshot.store.run(agent_id, run_id) {
            Ok(summary) => {
                if let Some(summary) = summary {
                    self.view.state.merge_summary(agent_id, run_id, &summary);
                }
                snapshot.loaded.insert(key);
            }
            Err(error) => self.snapshot_failed(&error),
        }
    }

    /// A stored run could not be read: the snapshot is removed, and this ledger, which may lack
    /// a commit, reports damage until the process ends.
    fn snapshot_failed(&mut self, error: &SnapshotError) {
        let Some(snapshot) = self.snapshot.take() else {
            return;
        };
        let (path, lock) = snapshot.close();
        let detail = if error.is_busy() {
            // Held by another program for longer than the busy wait: not damaged, but no answer.
            format!(
                "this site's snapshot of the ledger, {}, is held by another program ({error}); try again",
                path.display()
            )
        } else if lock.upgrade(&path).is_ok() {
            Snapshot::remove(&path);
            tracing::warn!(snapshot = %path.display(), %error, "the snapshot cannot be read; removed");
            format!(
                "this site's snapshot of the ledger, {}, cannot be read ({error}); it was removed, and the next command reads the whole ledger again",
                path.display()
            )
        } else {
            tracing::warn!(snapshot = %path.display(), %error, "the snapshot cannot be read; other processes have it open");
            format!(
                "this site's snapshot of the ledger, {}, cannot be read ({error}); other processes have it open, and the first command that finds it unused removes it and reads the whole ledger again",
                path.display()
            )
        };
        self.snapshot_damage = Some(RelayProblem {
            kind: crate::relay::ProblemKind::Damage,
            device_id: None,
            detail,
            file: Some(path),
            line_number: None,
        });
        self.recompute_problems();
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

    /// Every problem the last pull reported (damage, incomplete last lines, ignored files), and
    /// the devices found with fewer records than this site saw before.
    pub fn problems(&self) -> &[RelayProblem] {
        &self.problems
    }

    /// The damage that makes this ledger incomplete (rule R1): problems of kind
    /// [`ProblemKind::Damage`](crate::relay::ProblemKind::Damage) whose device (or file) was not
    /// accepted with [`accept_damage`](Self::accept_damage). [`dispatch`](crate::dispatch::dispatch) refuses to run anything
    /// while there is any: a run that the damaged device committed would look new.
    pub fn damage(&self) -> Vec<&RelayProblem> {
        self.problems
            .iter()
            .filter(|problem| problem.is_damage() && !self.is_accepted(problem))
            .collect()
    }

    fn is_accepted(&self, problem: &RelayProblem) -> bool {
        // A snapshot that cannot be read is not the ledger's damage: nothing to accept (the next
        // process rebuilds it).
        self.snapshot_damage.as_ref() != Some(problem)
            && self.checkpoint_damage.as_ref() != Some(problem)
            && self.accepted.iter().any(|device| names(problem, device))
    }

    /// Folds into the view every run the snapshot holds committed, as its commit alone (the
    /// records that show it may not be here): a caller that accepts the damage runs none of
    /// them again.
    fn keep_commits_of_snapshot(&mut self) {
        let Some(snapshot) = &self.snapshot else {
            return;
        };
        let state = &mut self.view.state;
        let kept = snapshot.store.for_each_run(|agent, run, summary| {
            if let Some(commit) = summary.committed() {
                let commit = crate::fold::RunSummary {
                    best: commit.clone(),
                    committed_below_failed: None,
                };
                state.merge_summary(agent, run, &commit);
            }
        });
        if let Err(error) = kept {
            tracing::warn!(%error, "cannot read the commits of the checkpoint this ledger does not match; they count only once its files reach it");
        }
    }

    /// Why this ledger's [snapshot](LedgerOptions::snapshot) could not be read, if it could not
    /// (a run's stored state was lost or changed): part of [`damage`](Self::damage) until the
    /// process ends, and cannot be accepted; the snapshot was removed, so the next open reads the
    /// whole ledger and rebuilds it.
    pub fn snapshot_failure(&self) -> Option<&RelayProblem> {
        self.snapshot_damage.as_ref()
    }

    /// Accepts the damage of `device` (a device id, or a device file's name): [`dispatch`](crate::dispatch::dispatch) no
    /// longer refuses because of it, in this ledger. The operator's decision is recorded in this
    /// device's log (surface `log/fencepost.accept-damaged`, with the problems seen), so it can be
    /// audited. Returns how many current problems it covers; when none, nothing is recorded or
    /// accepted.
    ///
    /// # Errors
    /// [`DispatchError::Relay`] when the record cannot be stored (nothing is accepted then).
    pub fn accept_damage(&mut self, device: &str) -> Result<usize, DispatchError> {
        let mut accepted = self.accepted.clone();
        accepted.insert(device.to_owned());
        let covered: Vec<String> = self
            .problems
            .iter()
            .filter(|problem| self.snapshot_damage.as_ref() != Some(*problem))
            .filter(|problem| self.checkpoint_damage.as_ref() != Some(*problem))
            .filter(|problem| problem.is_damage() && names(problem, device))
            .map(ToString::to_string)
            .collect();
        if covered.is_empty() {
            return Ok(0); // nothing to accept, nothing recorded
        }
        self.append_now(
            Surface::log("fencepost.accept-damaged"),
            serde_json::json!({"device": device, "problems": covered}),
        )?;
        self.accepted = accepted;
        Ok(covered.len())
    }

    /// Accepts that the records of `device` that the agent's earlier holders published
    /// (`published`, from [`LeaseCoordinator::published_frontier`](crate::lease::LeaseCoordinator::published_frontier))
    /// and that this ledger lacks are lost for good (a host whose ledger was never shared, a
    /// disk that died): [`behind`](Self::behind) no longer waits for *those* records, in this
    /// ledger, so the runs they settled may run again. Records of the device published later
    /// (beyond `published`) are waited for as any others. The decision is recorded in this
    /// device's log (surface `log/fencepost.accept-missing`, with the records missing). Returns
    /// how many records it covers; when none (the ledger lacks nothing of `device`), nothing is
    /// recorded or accepted.
    ///
    /// # Errors
    /// [`DispatchError::Relay`] when the record cannot be stored (nothing is accepted then).
    pub fn accept_missing(&mut self, device: &str, published: &Frontier) -> Result<u64, DispatchError> {
        let Some(missing) = self
            .view
            .frontier
            .lacking(published)
            .into_iter()
            .find(|(lacking, _, _)| lacking == device)
        else {
            return Ok(0);
        };
        let (_, has, needs) = missing;
        self.append_now(
            Surface::log("fencepost.accept-missing"),
            serde_json::json!({"device": device, "has": has, "published": needs}),
        )?;
        let waived = self.waived.entry(device.to_owned()).or_insert(0);
        *waived = (*waived).max(needs);
        Ok(needs - has)
    }

    /// Appends an intent to this device's log and stores it through the relay at once (under the
    /// relay's claim on the device's log), then folds it. For recording the outcome of a reconciled
    /// in-doubt run; [`dispatch`](crate::dispatch::dispatch) records its own.
    ///
    /// # Errors
    /// [`DispatchError::InvalidId`] for an invalid agent or run id, [`DispatchError::InvalidEpoch`]
    /// for an epoch no coordinator mints (nothing queued);
    /// [`DispatchError::Relay`] or [`DispatchError::Log`] when it could not be stored: it stays
    /// queued ([`unsent`](Self::unsent)) and is stored, in order, by the next
    /// [`flush`](Self::flush), [`sync`](Self::sync) or record of this ledger.
    pub fn record(&mut self, intent: &Intent) -> Result<OpRecord, DispatchError> {
        validate_id(IdKind::Agent, &intent.agent_id)?;
        validate_id(IdKind::Run, &intent.run_id)?;
        if !(1..=crate::lease::MAX_EPOCH).contains(&intent.epoch) {
            return Err(DispatchError::InvalidEpoch { epoch: intent.epoch });
        }
        self.append_now(Surface::Intent, intent.payload())
    }

    /// Queues one record and stores every queued one; returns the last.
    fn append_now(&mut self, surface: Surface, payload: Value) -> Result<OpRecord, DispatchError> {
        // A record no log can hold (over a record limit) is refused now, not queued: it would
        // block every record queued after it.
        self.log.clone().try_append(surface.clone(), payload.clone())?;
        self.unsent.push((surface, payload));
        let mut stored = self.write_queued()?;
        stored.pop().ok_or_else(|| {
            DispatchError::Relay(RelayError::Io {
                operation: "append to",
                path: std::path::PathBuf::from(self.device_id()),
                source: std::io::Error::other("the relay stored nothing"),
            })
        })
    }

    /// Queues `intent` behind the records that could not be stored yet, without writing: when
    /// there are some (an attempt's `pending` whose append failed, which `intent` settles).
    pub(crate) fn queue_behind_unsent(&mut self, intent: Intent) {
        if !self.unsent.is_empty() {
            self.unsent.push((Surface::Intent, intent.payload()));
        }
    }

    /// Stores the queued records under the relay's claim on this device's log.
    fn write_queued(&mut self) -> Result<Vec<OpRecord>, DispatchError> {
        if self.unsent.is_empty() {
            return Ok(Vec::new());
        }
        // Records of this device that other writers (processes sharing its id) appended and
        // that this ledger has read since it opened: the log continues after them, so that the
        // relay need not hand them over again (found by a flaky test: a file pruned since no
        // longer held them, and the append was refused as damage).
        if let Some(head) = self.view.heads.get(self.log.device_id()) {
            if head.next_seq() > self.log.head().next_seq() {
                self.log =
                    DeviceLog::continue_after(self.wall_clock.clone(), HlcConfig::default(), head.clone());
            }
        }
        let mut draft: Option<DeviceLog> = None;
        let (log, unsent) = (&self.log, &self.unsent);
        let stopwatch = crate::clock::Stopwatch::start();
        let appended = self.relay.append(
            log.device_id(),
            log.head().next_seq(),
            &mut |tail: &[OpRecord]| {
                let mut next = log.clone();
                next.catch_up(tail)?;
                let made = unsent
                    .iter()
                    .map(|(surface, payload)| next.try_append(surface.clone(), payload.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                draft = Some(next);
                Ok(made)
            },
        )?;
        crate::metrics::relay_call(
            crate::metrics::RELAY_PUSH_SECONDS,
            crate::metrics::RELAY_PUSHED_RECORDS,
            stopwatch.elapsed(),
            appended.appended.len(),
        );
        if let Some(next) = draft {
            self.log = next;
        }
        self.unsent.clear();
        self.others_appended = appended
            .tail
            .iter()
            .filter(|op| op.surface == Surface::Intent)
            .cloned()
            .collect();
        self.absorb(&appended.tail);
        self.absorb(&appended.appended);
        self.recompute_problems();
        self.save_seen()?;
        self.save_snapshot();
        Ok(appended.appended)
    }

    /// Stores the queued records.
    ///
    /// # Errors
    /// [`DispatchError::Relay`] or [`DispatchError::Log`]; the records stay queued.
    pub fn flush(&mut self) -> Result<usize, DispatchError> {
        Ok(self.write_queued()?.len())
    }

    /// Stores this ledger's queued records through `other`, a ledger of the same device opened
    /// again (the device's file pruned while this one read it, say: this one can no longer
    /// continue the log, a new reading from the newest checkpoint can); they leave this ledger's
    /// queue, and stay in `other`'s if its append fails too. Returns how many were stored
    /// (0, moving nothing, when `other` is of another device).
    ///
    /// # Errors
    /// As [`flush`](Self::flush).
    pub fn flush_through(&mut self, other: &mut Ledger) -> Result<usize, DispatchError> {
        if other.device_id() != self.device_id() {
            return Ok(0);
        }
        other.unsent.append(&mut self.unsent);
        other.flush()
    }

    /// Stores the queued records, then pulls and folds what the relay has that this ledger lacks.
    /// The problems the pull reports replace the previous ones ([`problems`](Self::problems)).
    ///
    /// # Errors
    /// [`DispatchError::Relay`] when the push or the pull fails.
    pub fn sync(&mut self) -> Result<SyncReport, DispatchError> {
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
    fn take_pull(&mut self, batch: crate::relay::PullBatch) -> Result<(), DispatchError> {
        self.absorb(&batch.ops);
        self.take_problems(batch.problems)
    }

    /// Takes the problems of a pull whose records were absorbed.
    fn take_problems(&mut self, problems: Vec<RelayProblem>) -> Result<(), DispatchError> {
        for problem in problems.iter().filter(|problem| problem.is_damage()) {
            tracing::debug!(%problem, "the ledger is damaged");
        }
        self.relay_problems = problems;
        self.recompute_problems();
        self.save_seen()
    }

    /// The problems: the last pull's, the records found replaced (for good: a replaced record
    /// stays damage, even once the file has grown past it), and the devices with fewer records
    /// than the seen file remembers.
    fn recompute_problems(&mut self) {
        self.problems = self.relay_problems.clone();
        self.problems.extend(self.replaced.iter().cloned());
        self.problems.extend(self.view.rejected.values().cloned());
        self.problems.extend(self.snapshot_damage.iter().cloned());
        self.problems.extend(self.checkpoint_damage.iter().cloned());
        let snapshot_marks = self
            .snapshot_marks
            .iter()
            .map(|mark| (mark, "this site's snapshot".to_owned(), "read"));
        let checkpoint_marks = self.checkpoint_marks.iter().flat_map(|(file, marks)| {
            let name = file
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
            marks
                .iter()
                .map(move |mark| (mark, format!("the checkpoint {name}"), "covers"))
        });
        let mut found = Vec::new();
        for (mark, whose, verb) in snapshot_marks.chain(checkpoint_marks) {
            let device = &mark.device_id;
            if self
                .problems
                .iter()
                .chain(&found)
                .any(|problem: &RelayProblem| problem.device_id.as_ref() == Some(device))
            {
                continue; // said already
            }
            let has = self.view.frontier.next_seq(device);
            let here = self.view.last_id_known(device, mark.next_seq);
            let mut kind = crate::relay::ProblemKind::Damage;
            let detail = if has < mark.next_seq && self.relay.is_database() {
                kind = crate::relay::ProblemKind::WentBack;
                format!(
                    "{whose} {verb} {} records of this device, the database has {has}: {WENT_BACK}",
                    mark.next_seq
                )
            } else if has < mark.next_seq {
                format!(
                    "{whose} {verb} {} records of this device, the ledger here has {has}: a synced folder that has not brought them yet (run again once it has), or a file that shrank, was replaced or lost records (restore it from a copy)",
                    mark.next_seq
                )
            } else if let (Some(here), Some((last_op_id, _, _))) = (here, mark.last) {
                if here == last_op_id {
                    continue;
                }
                let cause;
                (kind, cause) = self.replaced_cause();
                format!(
                    "record {} is {here}, but {whose} {verb} {last_op_id} there: {cause}",
                    mark.next_seq - 1
                )
            } else {
                continue;
            };
            found.push(RelayProblem {
                kind,
                device_id: Some(device.clone()),
                file: None,
                line_number: None,
                detail,
            });
        }
        self.problems.extend(found);
        if let Some(seen) = &self.seen {
            for (device, mark) in &seen.devices {
                let has = self.view.frontier.next_seq(device);
                // A file that begins after what this reading has (pruned while it read, or
                // after a checkpoint not here yet) is said already, and its records were not
                // handed over: what the site saw is checked once they are (found by the test
                // `k6_concurrent_prunes_on_one_folder_refuse_no_run_and_no_compaction`: this
                // second problem made the gap look like other damage, which is not read again).
                let gap = self.problems.iter().any(|problem| {
                    problem.kind == crate::relay::ProblemKind::Pruned
                        && problem.device_id.as_ref() == Some(device)
                });
                if gap && has < mark.next_seq {
                    continue;
                }
                let mut kind = crate::relay::ProblemKind::Damage;
                let detail = if has < mark.next_seq && self.relay.is_database() {
                    kind = crate::relay::ProblemKind::WentBack;
                    format!(
                        "this site has seen {} records of this device, the database has {has}: {WENT_BACK}",
                        mark.next_seq
                    )
                } else if has < mark.next_seq {
                    format!(
                        "this site has seen {} records of this device, the ledger now has {has}: its file shrank, was replaced or lost records (restore it from a copy)",
                        mark.next_seq
                    )
                } else {
                    // The record seen last, where this view knows it without reading it again:
                    // a file replaced by another log's pruned one (with that log's checkpoint)
                    // holds another there (found by an adversarial test: refused once, then
                    // run on, since the record was never read again to be compared).
                    let here = self.view.last_id_known(device, mark.next_seq);
                    let said = self
                        .problems
                        .iter()
                        .any(|problem| problem.device_id.as_ref() == Some(device));
                    match here {
                        Some(here) if here != mark.last_op_id && !said => {
                            let cause;
                            (kind, cause) = self.replaced_cause();
                            format!(
                                "record {} is {here}, but this site saw {} there: {cause}",
                                mark.next_seq - 1,
                                mark.last_op_id
                            )
                        }
                        _ => continue,
                    }
                };
                self.problems.push(RelayProblem {
                    kind,
                    device_id: Some(device.clone()),
                    file: None,
                    line_number: None,
                    detail,
                });
            }
        }
    }

    /// Why a device holds another record where this site saw one, and how serious it is: in a
    /// database, it went back and was written since
    /// ([`ProblemKind::WentBack`](crate::relay::ProblemKind::WentBack)); else its file was
    /// replaced (damage).
    fn replaced_cause(&self) -> (crate::relay::ProblemKind, &'static str) {
        if self.relay.is_database() {
            (crate::relay::ProblemKind::WentBack, WENT_BACK_WRITTEN)
        } else {
            (
                crate::relay::ProblemKind::Damage,
                "the file was replaced (restore it from a copy)",
            )
        }
    }

    fn save_seen(&mut self) -> Result<(), DispatchError> {
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
                    marks.insert(device.to_owned(), Seen { next_seq, last_op_id });
                }
            }
        }
        seen.store(marks)
    }

    /// Folds `ops` (stored in the relay) into the view, then checks the records that verified
    /// against the seen file.
    fn absorb(&mut self, ops: &[OpRecord]) {
        if self.snapshot.as_ref().is_some_and(|snapshot| snapshot.queried) {
            // The runs these records continue: their stored entries first.
            for op in ops {
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
        let verified = self.view.absorb_from(ops, self.relay.checks_records());
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
            if let Some(mark) = self
                .seen
                .as_ref()
                .and_then(|seen| seen.devices.get(&*op.device_id))
            {
                if op.seq + 1 == mark.next_seq && op.op_id != mark.last_op_id {
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
                }
            }
        }
    }

    /// What this device has stored in the relay: its own log's next seq, as a frontier of one
    /// device. What a holder publishes (rule H2; [`LeaseKeeper::pushed`](crate::keeper::LeaseKeeper::pushed)).
    pub fn pushed(&self) -> Frontier {
        let mut frontier = Frontier::new();
        let head = self.log.head();
        if head.next_seq() > 0 {
            frontier.raise_to(self.device_id(), head.next_seq(), head.last_op_id());
        }
        frontier
    }

    /// What this ledger lacks of `published` (rule H3): per device, the records that the agent's
    /// earlier holders pushed and published and that have not reached this site yet, in device
    /// order. Empty when the ledger has everything. Records accepted as lost
    /// ([`accept_missing`](Self::accept_missing)) are not waited for; accepting a device's
    /// *damage* does not waive its published records. [`Ledger::begin`] refuses to
    /// dispatch while anything is missing ([`Refusal::LedgerBehind`](crate::dispatch::Refusal::LedgerBehind)):
    /// [`sync`](Self::sync) and ask again.
    pub fn behind(&self, published: &Frontier) -> Vec<MissingRecords> {
        published
            .iter()
            .filter_map(|(device, needs)| {
                let has = self.view.frontier.next_seq(device);
                // The record the previous holder published last: this ledger's record at that
                // seq must be the same one, or this ledger counts other records (a device id
                // that two hosts use with ledgers of their own, a log replaced by another).
                let differs = match (published.head(device), needs.checked_sub(1)) {
                    (Some(head), Some(last)) if has >= needs => self
                        .view
                        .ids
                        .get(device)
                        .and_then(|(first, ids)| ids.get(usize::try_from(last.checked_sub(*first)?).ok()?))
                        .is_some_and(|here| *here != head),
                    _ => false,
                };
                (has < needs || differs).then(|| MissingRecords {
                    device_id: device.to_owned(),
                    has,
                    needs,
                    differs,
                })
            })
            .filter(|missing| {
                self.waived
                    .get(&missing.device_id)
                    .is_none_or(|waived| missing.needs > *waived)
            })
            .collect()
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

    /// Why `epoch` of `agent_id`, just granted to `device_id`, is not a fresh grant, if it is
    /// not. A grant comes after the coordinator's floor was raised to the ledger's epoch, so it
    /// is above every epoch the ledger has seen, unless the coordinator lost or rolled back its
    /// state in between; then give the lease back and acquire again with the ledger's epoch as
    /// the floor (`fencepost run` does). Call it right after acquiring (and syncing): later in
    /// the tenure, this holder's own records are at `epoch`.
    pub fn stale_grant(&self, agent_id: &str, epoch: u64, device_id: &str) -> Option<StaleGrant> {
        let fencing_epoch = self.state().fencing_epoch(agent_id);
        if epoch > fencing_epoch {
            return None;
        }
        Some(if epoch < fencing_epoch {
            StaleGrant::BelowLedger { fencing_epoch }
        } else if let Some(device_id) = self.epoch_used_by_another(agent_id, epoch, device_id) {
            StaleGrant::HeldBy { device_id }
        } else {
            StaleGrant::UsedBefore
        })
    }

    /// Another device with a `pending` of `agent_id` at `epoch`; see
    /// [`LedgerState::epoch_used_by_another`].
    pub fn epoch_used_by_another(&self, agent_id: &str, epoch: u64, device_id: &str) -> Option<String> {
        self.view.epoch_used_by_another(agent_id, epoch, device_id)
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

impl LedgerState {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// The folded state of the records given.
    pub fn state(&self) -> &SyncState {
        &self.state
    }

    /// Per device, how many records were folded.
    pub fn frontier(&self) -> &Frontier {
        &self.frontier
    }

    /// The damage found while verifying: per device, the record that did not verify.
    pub fn rejected(&self) -> impl Iterator<Item = &RelayProblem> {
        self.rejected.values()
    }

    /// Verifies `ops` against each device's head, folds those that verify and indexes their
    /// attempts; returns them. Records already folded are skipped, and a record that does not
    /// verify is damage of its device ([`rejected`](Self::rejected)) until a valid one takes its
    /// place.
    ///
    /// Whatever the relay hands over is verified first (rule O1: `op_id` over the content, seq,
    /// chain, limits), so a forged record never reaches the fold, whose laws assume records whose
    /// ids match their content. A record that does not verify is damage of its device; the
    /// frontier stays before it.
    pub fn absorb<'ops>(&mut self, ops: &'ops [OpRecord]) -> Vec<&'ops OpRecord> {
        self.absorb_from(ops, false)
    }

    /// [`absorb`](Self::absorb); `identified` when a relay that [checks its
    /// records](crate::relay::Relay::checks_records) handed `ops` over, so their ids are not
    /// hashed again (seq, chain and HLC order still are checked).
    pub(crate) fn absorb_from<'ops>(
        &mut self,
        ops: &'ops [OpRecord],
        identified: bool,
    ) -> Vec<&'ops OpRecord> {
        let mut verified: Vec<&OpRecord> = Vec::with_capacity(ops.len());
        for op in ops {
            let device = &*op.device_id;
            let head = match self.heads.get_mut(device) {
                Some(head) => head,
                None => self
                    .heads
                    .entry(device.to_owned())
                    .or_insert_with(|| LogHead::new(Arc::clone(&op.device_id))),
            };
            if op.seq < head.next_seq() {
                continue; // folded before
            }
            if self.rejected.contains_key(device) && op.seq > head.next_seq() {
                continue; // after a record that did not verify
            }
            let accepted = if identified {
                head.accept_identified(op)
            } else {
                head.accept(op)
            };
            match accepted {
                Ok(()) => {
                    if !self.rejected.is_empty() {
                        self.rejected.remove(device);
                    }
                    match self.ids.get_mut(device) {
                        Some((_, ids)) => ids.push(op.op_id),
                        None => drop(self.ids.insert(device.to_owned(), (op.seq, vec![op.op_id]))),
                    }
                    if op.surface != Surface::Intent {
                        self.other_records.push(op.clone());
                    }
                    verified.push(op);
                }
                Err(error) => {
                    tracing::warn!(%error, "the relay handed over a record that does not verify");
                    self.rejected.insert(
                        device.to_owned(),
                        RelayProblem {
                            kind: crate::relay::ProblemKind::Damage,
                            device_id: Some(device.to_owned()),
                            file: None,
                            line_number: Some(op.seq.saturating_add(1)),
                            detail: format!("the relay handed over a record that does not verify: {error}"),
                        },
                    );
                }
            }
        }
        self.frontier.observe_all(verified.iter().copied());
        self.state.apply_all(verified.iter().copied());
        for op in &verified {
            // Only intent records are attempts: a record of another surface with the same fields
            // (an audit mirror, say) settles nothing, exactly as the fold ignores it.
            if op.surface != Surface::Intent {
                continue;
            }
            // Read in place: no allocation unless the run is in doubt.
            let Some(intent) = op.payload.compact_intent() else {
                continue;
            };
            let agent = intent.agent.as_str();
            if intent.status == IntentStatus::Pending {
                // No allocation for the common case: a known agent, a known device.
                if !self.pending_epochs.contains_key(agent) {
                    self.pending_epochs.insert(agent.to_owned(), Default::default());
                }
                if let Some((top, devices)) = self.pending_epochs.get_mut(agent) {
                    if intent.epoch > *top {
                        *top = intent.epoch;
                        devices.clear();
                    }
                    if intent.epoch == *top && !devices.contains(&*op.device_id) {
                        devices.insert(op.device_id.to_string());
                    }
                }
            }
            // A commit was just folded; anything else asks the fold (one lookup).
            let committed = intent.status == IntentStatus::Committed
                || self.state.committed_run_key(agent, &intent.run).is_some();
            if committed {
                if let Some(runs) = self.attempts.get_mut(agent) {
                    runs.remove(&intent.run);
                }
                continue;
            }
            let runs = match self.attempts.get_mut(agent) {
                Some(runs) => runs,
                None => self.attempts.entry(agent.to_owned()).or_default(),
            };
            let attempts = runs.entry(intent.run.clone()).or_default();
            if intent.status == IntentStatus::Pending {
                if !attempts.settled.contains(&intent.epoch) {
                    let candidate = InDoubtRun {
                        run_id: intent.run.to_string(),
                        epoch: intent.epoch,
                        device_id: op.device_id.to_string(),
                        op_id: op.op_id,
                    };
                    let slot = attempts
                        .unsettled
                        .entry(intent.epoch)
                        .or_insert_with(|| candidate.clone());
                    if candidate.op_id > slot.op_id {
                        *slot = candidate;
                    }
                }
            } else {
                attempts.settled.insert(intent.epoch);
                attempts.unsettled.remove(&intent.epoch);
            }
        }
        verified
    }

    /// The runs of `agent_id` in doubt for a holder at `held_epoch` (rule D2): no `committed`
    /// record, and a `pending` of an epoch below `held_epoch` with no `committed` or `failed` of
    /// that epoch. Each run is reported once, at its greatest such epoch. Call it right after
    /// acquiring, before dispatching; see the [dispatch docs](crate::dispatch) for what to do with them.
    /// `held_epoch = u64::MAX` lists every run in doubt.
    pub fn in_doubt(&self, agent_id: &str, held_epoch: u64) -> Vec<InDoubtRun> {
        self.attempts
            .get(agent_id)
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|attempts| attempts.unsettled.range(..held_epoch).next_back())
            .map(|(_, run)| run.clone())
            .collect()
    }

    /// Another device that wrote a `pending` of `agent_id` at `epoch`, when `epoch` is the
    /// highest epoch of the agent's `pending`s: only the holder of an epoch writes them, so the
    /// coordinator granted `epoch` to `device_id` after it had granted it to that device (it lost
    /// or rolled back its state). `None` when no other device did, as far as this ledger knows.
    pub fn epoch_used_by_another(&self, agent_id: &str, epoch: u64, device_id: &str) -> Option<String> {
        let (top, devices) = self.pending_epochs.get(agent_id)?;
        if *top != epoch {
            return None;
        }
        devices.iter().find(|device| *device != device_id).cloned()
    }

    /// Whether `run_id` of `agent_id` is in doubt for a holder at `held_epoch`: like
    /// [`in_doubt`](Self::in_doubt), but a `pending` *at* `held_epoch` with no outcome counts too
    /// (an earlier attempt of this tenure whose outcome was never stored).
    pub fn in_doubt_run(&self, agent_id: &str, run_id: &str, held_epoch: u64) -> Option<InDoubtRun> {
        let attempts = self.attempts.get(agent_id)?.get(&RunKey::new(run_id))?;
        attempts
            .unsettled
            .range(..=held_epoch)
            .next_back()
            .map(|(_, run)| run.clone())
    }
}

impl SnapshotUse {
    /// Opens the snapshot at `path`, holding `lock`; one that cannot be used (another format or
    /// device, not a database) is removed and started over when no other process has it open.
    /// `None` when no snapshot can be kept there, or used now.
    fn open(path: std::path::PathBuf, device_id: &str, mut lock: SnapshotLock) -> Option<Self> {
        let store = match Snapshot::open(&path, device_id) {
            Ok(store) => store,
            Err(error) if error.is_busy() => {
                tracing::warn!(snapshot = %path.display(), %error, "another process holds the snapshot; reading the whole ledger this time");
                return None;
            }
            Err(error) => {
                let shared = !lock.is_exclusive();
                lock = match lock.upgrade(&path) {
                    Ok(lock) => lock,
                    Err(_) => {
                        tracing::warn!(snapshot = %path.display(), %error, "the snapshot cannot be used, and other processes have it open; reading the whole ledger without it");
                        return None;
                    }
                };
                tracing::warn!(snapshot = %path.display(), %error, "starting the snapshot over");
                Snapshot::remove(&path);
                if shared {
                    lock = lock.downgrade(&path)?;
                }
                match Snapshot::open(&path, device_id) {
                    Ok(store) => store,
                    Err(error) => {
                        tracing::warn!(snapshot = %path.display(), %error, "cannot keep a snapshot; every command reads the whole ledger");
                        return None;
                    }
                }
            }
        };
        Some(Self {
            store,
            lock,
            queried: false,
            loaded: BTreeSet::new(),
            dirty: None,
            saved: None,
        })
    }

    /// Closes the file; its path and the lock (still held).
    fn close(self) -> (std::path::PathBuf, SnapshotLock) {
        (self.store.path().to_path_buf(), self.lock)
    }
}

/// Whether a state with `heads` contains the one saved with `stored`: every stored device at
/// least as far, and the same last record where as far.
fn contains(heads: &[HeadMark], stored: &[HeadMark]) -> bool {
    stored.iter().all(|old| {
        heads.iter().any(|new| {
            new.device_id == old.device_id
                && (new.next_seq > old.next_seq || (new.next_seq == old.next_seq && new.last == old.last))
        })
    })
}

/// The records an anchor of the oracle's retention covered ([`LedgerState::covered_ids`]).
#[derive(Debug, Default)]
pub(crate) struct Covered {
    /// The ids of those the view keeps.
    ids: rustc_hash::FxHashSet<OpId>,
    /// When the anchor covers every record the view knows only from the checkpoint or
    /// snapshot it started from: the ids it keeps (any other id is one of those).
    known: Option<rustc_hash::FxHashSet<OpId>>,
}

impl Covered {
    /// Whether the record `id` is covered.
    fn holds(&self, id: &OpId) -> bool {
        self.ids.contains(id) || self.known.as_ref().is_some_and(|known| !known.contains(id))
    }
}

impl LedgerState {
    /// Whether `rule` forgets run `run_id` of `agent_id`, whose entry is `summary`: the rule
    /// applies to the agent, the run has a commit, its greatest record and its greatest commit
    /// are both among the records the anchor covered (`covered`, from
    /// [`covered_ids`](Self::covered_ids)), and it has no attempt in doubt (rule D2).
    pub(crate) fn forgets(
        &self,
        rule: &crate::fold::Forgetting,
        covered: &Covered,
        agent_id: &str,
        run_id: &str,
        summary: &crate::fold::RunSummary,
    ) -> bool {
        let in_doubt = self
            .attempts
            .get(agent_id)
            .and_then(|runs| runs.get(&RunKey::new(run_id)))
            .is_some_and(|attempts| !attempts.unsettled.is_empty());
        !in_doubt
            && rule.applies_to(agent_id)
            && covered.holds(&summary.best.op_id)
            && summary
                .committed()
                .is_some_and(|committed| covered.holds(&committed.op_id))
    }

    /// The id of record `seq` of device `device_id`, when the view keeps it.
    pub(crate) fn id_at(&self, device_id: &str, seq: u64) -> Option<OpId> {
        let (first, ids) = self.ids.get(device_id)?;
        ids.get(usize::try_from(seq.checked_sub(*first)?).ok()?).copied()
    }

    /// The id this view knows (without reading it again) of the last of the first `records`
    /// records of `device_id` ([`known_id`](Self::known_id)): what a mark of them (the seen
    /// file's, a snapshot's, a checkpoint's) is compared with.
    fn last_id_known(&self, device_id: &str, records: u64) -> Option<OpId> {
        self.known_id(device_id, records.checked_sub(1)?)
    }

    /// [`id_at`](Self::id_at), or where the records were removed from the relay, the id the
    /// checkpoint this view started from gives for record `seq` (a head of it or of its line).
    pub(crate) fn known_id(&self, device_id: &str, seq: u64) -> Option<OpId> {
        self.id_at(device_id, seq).or_else(|| {
            let next = seq.checked_add(1)?;
            self.attested
                .iter()
                .find(|(device, next_seq, _)| device == device_id && *next_seq == next)
                .map(|(_, _, id)| *id)
        })
    }

    /// Its heads as a compaction of a line names them: per device, the count and the id of the
    /// last record.
    pub(crate) fn compaction_heads(&self) -> Vec<(String, u64, OpId)> {
        self.heads
            .values()
            .filter_map(|head| Some((head.device_id().to_string(), head.next_seq(), head.last_op_id()?)))
            .collect()
    }

    /// Whether every head of `heads` (per device, a count and the id of the last record) is a
    /// record this view has, at its place.
    pub(crate) fn holds(&self, heads: &[(String, u64, OpId)]) -> bool {
        heads.iter().all(|(device, next_seq, last)| {
            next_seq.checked_sub(1).and_then(|seq| self.id_at(device, seq)) == Some(*last)
                || self.attested.contains(&(device.clone(), *next_seq, *last))
        })
    }

    /// The records that `rule`'s anchor covered, as this view knows them: the ids it keeps of
    /// each device up to the anchor's head there; and when the anchor covers every record
    /// before the first id it keeps of every device (a view that started from a checkpoint
    /// after records were pruned, or from a snapshot), every record it knows only from there.
    pub(crate) fn covered_ids(&self, rule: &crate::fold::Forgetting) -> Covered {
        let anchor = |device: &str| {
            rule.anchor_heads
                .iter()
                .find(|(covered, _)| covered == device)
                .map_or(0, |(_, next_seq)| *next_seq)
        };
        let mut covered = Covered::default();
        for (device, (first, ids)) in &self.ids {
            let end = usize::try_from(anchor(device).saturating_sub(*first))
                .unwrap_or(usize::MAX)
                .min(ids.len());
            covered.ids.extend(ids[..end].iter().copied());
        }
        // Where each device's kept ids begin (a device without any: after all its records).
        let begins =
            |device: &str, head: &LogHead| self.ids.get(device).map_or(head.next_seq(), |(first, _)| *first);
        let unknown_before = self.heads.iter().any(|(device, head)| begins(device, head) > 0);
        let anchor_covers_them = self
            .heads
            .iter()
            .all(|(device, head)| anchor(device) >= begins(device, head));
        if unknown_before && anchor_covers_them {
            covered.known = Some(
                self.ids
                    .values()
                    .flat_map(|(_, ids)| ids.iter().copied())
                    .collect(),
            );
        }
        covered
    }

    /// Removes the runs that `rule` forgets ([`forgets`](Self::forgets)).
    pub(crate) fn forget_runs(&mut self, rule: &crate::fold::Forgetting) {
        let covered = self.covered_ids(rule);
        let mut forgotten = Vec::new();
        let listed: Result<(), std::convert::Infallible> =
            self.state.for_each_run_summary(|agent, run, summary| {
                if self.forgets(rule, &covered, agent, run, &summary) {
                    forgotten.push((agent.to_owned(), run.to_owned()));
                }
                Ok(())
            });
        let Ok(()) = listed;
        for (agent, run) in &forgotten {
            self.state.forget_run(agent, run);
        }
    }

    /// The view a snapshot's loaded part stands for (its runs stay in the store); `Err` when the
    /// part is not one a view makes.
    pub(crate) fn restored(base: &SnapshotBase) -> Result<Self, String> {
        let mut view = Self::default();
        for mark in &base.heads {
            let head = LogHead::from_mark(mark)
                .ok_or_else(|| format!("the head of {:?} is damaged", mark.device_id))?;
            view.frontier
                .raise_to(&mark.device_id, head.next_seq(), head.last_op_id());
            if view.heads.insert(mark.device_id.clone(), head).is_some() {
                return Err(format!("two heads of {:?}", mark.device_id));
            }
        }
        for (device, first, ids) in &base.recent_ids {
            let next = first.checked_add(ids.len() as u64);
            if next != Some(view.frontier.next_seq(device)) || ids.is_empty() {
                return Err(format!("the ids of {device:?} do not end at its head"));
            }
            view.ids.insert(device.clone(), (*first, ids.clone()));
        }
        for (agent, epoch) in &base.fencing {
            view.state.raise_fencing_epoch(agent, *epoch);
        }
        for (agent, top, devices) in &base.pending_epochs {
            view.pending_epochs
                .insert(agent.clone(), (*top, devices.iter().cloned().collect()));
        }
        for mark in &base.attempts {
            let attempts = Attempts {
                unsettled: mark
                    .unsettled
                    .iter()
                    .map(|run| (run.epoch, run.clone()))
                    .collect(),
                settled: mark.settled.iter().copied().collect(),
            };
            view.attempts
                .entry(mark.agent.clone())
                .or_default()
                .insert(RunKey::new(&mark.run), attempts);
        }
        view.forgotten = base.forgotten.clone();
        for line in &base.records {
            let op = OpRecord::from_json(line.as_bytes())
                .map_err(|error| format!("a stored record is damaged: {error}"))?;
            let folded = view
                .heads
                .get(&*op.device_id)
                .is_some_and(|head| op.seq < head.next_seq());
            if op.surface == Surface::Intent || !folded || !op.has_valid_id() {
                return Err("a stored record is not one of the other surfaces' verified records".to_owned());
            }
            view.state.apply(&op);
            view.other_records.push(op);
        }
        Ok(view)
    }

    /// The loaded part of a snapshot of this view, with the relay's `cursor`.
    pub(crate) fn base_mark(&self, cursor: Value) -> SnapshotBase {
        SnapshotBase {
            heads: self.heads.values().map(LogHead::mark).collect(),
            recent_ids: self
                .ids
                .iter()
                .map(|(device, (first, ids))| {
                    let skip = ids.len().saturating_sub(RECENT_IDS);
                    (device.clone(), first + skip as u64, ids[skip..].to_vec())
                })
                .collect(),
            fencing: self
                .state
                .agents()
                .into_iter()
                .map(|(agent, folded)| (agent.to_owned(), folded.fencing_epoch()))
                .collect(),
            pending_epochs: self
                .pending_epochs
                .iter()
                .map(|(agent, (top, devices))| (agent.clone(), *top, devices.iter().cloned().collect()))
                .collect(),
            attempts: self
                .attempts
                .iter()
                .flat_map(|(agent, runs)| {
                    runs.iter().map(move |(run, attempts)| AttemptsMark {
                        agent: agent.clone(),
                        run: run.to_string(),
                        unsettled: attempts.unsettled.values().cloned().collect(),
                        settled: attempts.settled.iter().copied().collect(),
                    })
                })
                .collect(),
            records: self
                .other_records
                .iter()
                .map(|op| {
                    let mut line = Vec::new();
                    op.write_json_line(&mut line);
                    String::from_utf8_lossy(&line).trim_end().to_owned()
                })
                .collect(),
            cursor,
            forgotten: self.forgotten.clone(),
            compactions: Vec::new(),
        }
    }
}

/// Whether `problem` concerns `device` (a device id, or the name of its file in the relay).
fn names(problem: &RelayProblem, device: &str) -> bool {
    let file_name = problem
        .file
        .as_ref()
        .and_then(|file| file.file_name())
        .map(|name| name.to_string_lossy().into_owned());
    match problem.device_id.as_deref() {
        // A device's damage is accepted by its id, and only by it.
        Some(id) => id == device,
        // A file that says nothing of its device (unreadable, garbage from its first line): by the
        // file's name, or by the id whose file it is.
        None => {
            file_name.is_some_and(|name| name == device || name == crate::relay::device_file_name(device))
        }
    }
}

/// How long an update of the seen file waits for another process's lock on it.
const SEEN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a site remembers of one device's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Seen {
    next_seq: u64,
    last_op_id: OpId,
}

/// The seen file of [`LedgerOptions::seen_file`].
#[derive(Debug)]
struct SeenFile {
    path: std::path::PathBuf,
    devices: BTreeMap<String, Seen>,
}

impl SeenFile {
    fn load(path: std::path::PathBuf) -> Result<Self, DispatchError> {
        let devices = Self::read(&path)?;
        Ok(Self { path, devices })
    }

    fn read(path: &std::path::Path) -> Result<BTreeMap<String, Seen>, DispatchError> {
        match std::fs::read(path) {
            // A damaged memory is no memory: say so, rather than forget silently what was seen.
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| DispatchError::Seen {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("it is damaged ({error}); remove it to start it over, knowing that a ledger file that shrank before now then goes unnoticed"),
                ),
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(error) => Err(DispatchError::Seen {
                path: path.to_path_buf(),
                source: error,
            }),
        }
    }

    /// Merges `marks` into the file (the greater seq wins), under the file's lock.
    fn store(&mut self, marks: BTreeMap<String, Seen>) -> Result<(), DispatchError> {
        let changed = marks.iter().any(|(device, mark)| {
            self.devices
                .get(device)
                .is_none_or(|known| mark.next_seq > known.next_seq)
        });
        if !changed {
            return Ok(());
        }
        let Some(_lock) = self.lock()? else {
            return Ok(());
        };
        let mut devices = Self::read(&self.path)?;
        for (device, mark) in marks {
            let slot = devices.entry(device).or_insert(mark);
            if mark.next_seq > slot.next_seq {
                *slot = mark;
            }
        }
        self.write(devices)
    }

    /// Puts `marks` in place of what the file remembers of those devices (none: forgets the
    /// device), under the file's lock: after a database that went back was repaired
    /// ([`Ledger::repair_went_back`]), what it holds now is what this site has seen.
    fn reset(&mut self, marks: BTreeMap<String, Option<Seen>>) -> Result<(), DispatchError> {
        let Some(_lock) = self.lock()? else {
            return Err(DispatchError::Seen {
                path: self.path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::WouldBlock, "another process holds its lock"),
            });
        };
        let mut devices = Self::read(&self.path)?;
        for (device, mark) in marks {
            match mark {
                Some(mark) => drop(devices.insert(device, mark)),
                None => drop(devices.remove(&device)),
            }
        }
        self.write(devices)
    }

    /// The file's lock, held only to merge and rename; `None` when a holder does not let go
    /// within `SEEN_LOCK_WAIT`.
    fn lock(&self) -> Result<Option<std::fs::File>, DispatchError> {
        let failed = |source| DispatchError::Seen {
            path: self.path.clone(),
            source,
        };
        let mut lock_path = self.path.clone().into_os_string();
        lock_path.push(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(failed)?;
        // Held only to merge and rename; a holder that does not let go for this long is stopped
        // (SIGSTOP) or stuck: skip this update rather than wait for it (the marks only ever grow,
        // so a skipped update weakens the check a little and breaks nothing).
        let limit = crate::clock::RealTimeLimit::starting_now(SEEN_LOCK_WAIT);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if !limit.passed() => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    tracing::warn!(file = %self.path.display(), "another process holds the seen file's lock; not updating it this time");
                    return Ok(None);
                }
                Err(std::fs::TryLockError::Error(error)) => return Err(failed(error)),
            }
        }
        Ok(Some(lock))
    }

    /// Replaces the file with `devices` (by a rename), under the lock.
    fn write(&mut self, devices: BTreeMap<String, Seen>) -> Result<(), DispatchError> {
        let failed = |source| DispatchError::Seen {
            path: self.path.clone(),
            source,
        };
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", std::process::id()));
        let bytes = serde_json::to_vec(&devices).map_err(|error| failed(error.into()))?;
        std::fs::write(&temporary, bytes).map_err(failed)?;
        std::fs::rename(&temporary, &self.path).map_err(failed)?;
        self.devices = devices;
        Ok(())
    }
}
