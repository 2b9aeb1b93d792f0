//! Guarded dispatch: run one side effect under the whole protocol ([`dispatch`]), the site's
//! [`Ledger`] it writes to, the runs a new holder finds in doubt ([`Ledger::in_doubt`]), and a
//! [`FencedResource`] that checks fencing tokens the way a cooperating service does.
//!
//! [`dispatch`] for `(agent, run_id)`:
//!
//! 1. takes a [`WorkGuard`](crate::keeper::WorkGuard) from the keeper (else `NotHeld`), so that a
//!    shutdown waits for the effect;
//! 2. refuses a run the oracle already has (`AlreadyCommitted`: nothing is written);
//! 3. refuses to write below the agent's known fencing epoch (an error: such a `pending` would be
//!    fenced on arrival, and the effect would run unrecorded);
//! 4. appends `pending` at the held epoch and pushes it to the relay **before** the effect, so that
//!    every other site can see the attempt even if this one dies mid-effect; if another writer of
//!    this device (a thread or process sharing the device id) appended a `pending` of the same run
//!    since this ledger last looked, the first one in the log runs and this call returns
//!    `ConcurrentAttempt`;
//! 5. asks [`check_dispatch`] (oracle, then coordinator); anything but `Proceed` records `failed`
//!    and returns the verdict, without running the effect;
//! 6. runs the effect with a [`FencingToken`] `{agent_id, run_id, epoch}` to pass to any resource
//!    that checks tokens, and records `committed` or `failed` by its result.
//!
//! # What stays open, and in-doubt runs
//!
//! Between `Proceed` and the effect landing, the holder can pause, lose its lease, and a successor
//! can run the same run. The fence cannot close that window; a resource that rejects stale tokens
//! **and** runs it has already applied ([`FencedResource`] shows how; one of the two checks alone
//! is not enough) or a database effect under the PostgreSQL transactional fence can. When a site
//! dies between `pending` and its outcome, the run is **in doubt**: the effect may or may not have
//! happened. A new holder lists those runs with [`Ledger::in_doubt`] right after
//! acquiring (before it dispatches anything) and decides, per run:
//!
//! * **retry with the token**: dispatch again under the new epoch when the resource checks the
//!   token's run id as an idempotency key (that is what makes a second attempt harmless; the epoch
//!   check alone lets the retry through);
//! * **reconcile**: ask the resource whether the effect happened (look the payment up by run id),
//!   then record `committed` or `failed` with [`Ledger::record`];
//! * **give up**: record `failed` and alert a human.
//!
//! `dispatch` does not decide for you: dispatching an in-doubt run is a retry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use crate::clock::{HlcConfig, WallClock};
use crate::fence::{check_dispatch, FenceDecision};
use crate::fold::SyncState;
use crate::id::{validate_id, IdError, IdKind};
use crate::keeper::LeaseKeeper;
use crate::lease::{Intent, IntentStatus, LeaseError};
use crate::oplog::{DeviceLog, LogError, LogHead, OpId, OpRecord, Surface};
use crate::relay::{Frontier, Relay, RelayError, RelayProblem};

/// What a site hands to the resource along with the effect: who acts, for which run, under which
/// epoch. A resource that refuses an epoch lower than one it has seen for the agent, *and* a run id
/// it has already applied, stops a zombie that passed the fence before it paused, whichever effect
/// lands first ([`FencedResource`] shows both checks).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FencingToken {
    /// The agent.
    pub agent_id: String,
    /// The run: an idempotency key for the resource.
    pub run_id: String,
    /// The epoch of the lease the effect runs under.
    pub epoch: u64,
}

/// A [`Ledger`] or [`dispatch`] error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// An id was invalid.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// An intent's epoch is outside `1..=`[`MAX_EPOCH`](crate::lease::MAX_EPOCH): no coordinator
    /// mints it, and the fold would ignore the record as malformed (F7). Nothing was written.
    #[error("epoch {epoch} is outside 1..={max}: no coordinator mints it", max = crate::lease::MAX_EPOCH)]
    InvalidEpoch {
        /// The epoch.
        epoch: u64,
    },
    /// The relay failed: the records are kept and pushed by the next [`Ledger::sync`] or
    /// [`Ledger::flush`]. When `dispatch` returns this before the effect, the effect did not run.
    #[error("relay: {0}")]
    Relay(#[from] RelayError),
    /// The relay holds a log of this device that cannot be continued.
    #[error("this device's log in the relay cannot be continued: {0}")]
    Log(#[from] LogError),
    /// The held epoch is below the agent's fencing epoch in the ledger: a `pending` written there
    /// would be fenced on arrival. The keeper's coordinator granted an epoch the ledger already
    /// passed; raise its floor from the ledger (the keeper does so before its first acquire).
    #[error("epoch {epoch} of {agent_id:?} is below its fencing epoch {fencing_epoch} in the ledger")]
    BelowFencingEpoch {
        /// The agent.
        agent_id: String,
        /// The held epoch.
        epoch: u64,
        /// The ledger's fencing epoch.
        fencing_epoch: u64,
    },
    /// [`Ledger::resolve`] was asked to settle a run that is not in doubt.
    #[error("{run_id} of {agent_id} is not in doubt")]
    NotInDoubt {
        /// The agent.
        agent_id: String,
        /// The run.
        run_id: String,
    },
    /// The keeper and the ledger belong to different devices.
    #[error("the keeper acts as {keeper:?} but the ledger writes as {ledger:?}")]
    DeviceMismatch {
        /// The keeper's device.
        keeper: String,
        /// The ledger's device.
        ledger: String,
    },
    /// The coordinator failed during the fence; the effect did not run (`failed` was recorded).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The ledger is incomplete: the relay reported damage ([`Ledger::damage`]), so a run that the
    /// damaged device committed would look new. Nothing was written, nothing ran. Repair the file
    /// from a copy, or accept the damage explicitly ([`Ledger::accept_damage`]).
    #[error("the ledger is damaged, not dispatching on it: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Damaged {
        /// What is damaged.
        problems: Vec<RelayProblem>,
    },
    /// The seen file ([`LedgerOptions::seen_file`]) could not be read or written.
    #[error("cannot use the seen file {path}")]
    Seen {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What [`dispatch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DispatchOutcome<T, E> {
    /// The fence said `Proceed` and the effect ran; `committed` or `failed` was recorded by its
    /// result.
    Executed {
        /// The epoch it ran under.
        epoch: u64,
        /// The effect's result.
        result: Result<T, E>,
    },
    /// The run already committed (on any site, at any epoch): nothing ran. Nothing was written
    /// when the ledger knew it before the attempt; when the commit arrived with this attempt's
    /// `pending` (another writer's records), a `failed` of this attempt was recorded too.
    AlreadyCommitted {
        /// The commit record.
        committed_op_id: OpId,
    },
    /// Another site holds the agent at a newer epoch: nothing ran.
    StaleEpoch {
        /// The epoch this site claimed.
        claimed_epoch: u64,
        /// The agent's epoch.
        current_epoch: u64,
        /// Its holder.
        current_holder: String,
    },
    /// This site does not hold the agent (lost, released, or never held): nothing ran.
    NotHeld {
        /// The epoch this site claimed.
        claimed_epoch: u64,
    },
    /// The effect started under the fence and was interrupted ([`EffectOutcome::Unknown`]): no
    /// outcome was recorded, so the run is now in doubt (rule D2).
    Interrupted {
        /// The epoch it ran under.
        epoch: u64,
        /// What interrupted it.
        error: E,
    },
    /// The run is in doubt (rule D2): an earlier attempt started and has recorded no outcome: it
    /// may still be running (another thread or process of this device, under this lease), or its
    /// site died mid-effect. Nothing ran, nothing was written; decide (see the [module docs](self)), then record the
    /// outcome with [`Ledger::record`] or retry with [`DispatchOptions::retry_in_doubt`].
    InDoubt {
        /// The attempt in doubt.
        run: InDoubtRun,
    },
    /// Another writer of this device (another thread or process with the same device id, under
    /// the same lease) started the same run just before this call: its `pending` precedes this
    /// call's in the device's log. Nothing ran; this call's `pending` stays, and the other
    /// attempt's outcome settles both (they share the epoch).
    ConcurrentAttempt {
        /// The other attempt.
        run: InDoubtRun,
    },
}

impl<T, E> DispatchOutcome<T, E> {
    /// Whether the effect ran (to the end, or until it was interrupted).
    pub fn executed(&self) -> bool {
        matches!(
            self,
            DispatchOutcome::Executed { .. } | DispatchOutcome::Interrupted { .. }
        )
    }
}

/// A run in doubt (rule D2): it has no `committed` record, and a `pending` of some epoch has no
/// `committed` or `failed` record of that same epoch, so that attempt's effect may or may not have
/// happened. A `failed` of an *older* epoch does not settle a newer attempt: a run whose history is
/// `failed`@1 then `pending`@2 is in doubt at epoch 2 (the fold's view of the run, F5, still shows
/// the `failed`@1; `fencepost ledger runs` shows `in-doubt … epoch 2 … after failed@1`).
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

impl LedgerOptions {
    /// Remember what was seen in `path` (see [`LedgerOptions::seen_file`]).
    pub fn seen_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.seen_file = Some(path.into());
        self
    }
}

/// Per run: the pendings with no outcome of their epoch yet, and the epochs that have one.
#[derive(Debug, Default)]
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
    relay: Arc<dyn Relay>,
    state: SyncState,
    frontier: Frontier,
    /// Records asked for but not yet stored (their append failed), in order.
    unsent: Vec<(Surface, Value)>,
    /// Per agent and run, the attempts, for runs with no commit.
    attempts: BTreeMap<(String, String), Attempts>,
    /// What the last pull reported, the replaced records, and the devices that shrank.
    problems: Vec<RelayProblem>,
    /// What the last pull reported.
    relay_problems: Vec<RelayProblem>,
    /// Records found replaced (another record where the seen file remembers one): for good.
    replaced: Vec<RelayProblem>,
    /// Devices (or files) whose damage the caller accepted.
    accepted: BTreeSet<String>,
    seen: Option<SeenFile>,
    /// Per device, the head of the records folded: every record is checked against it (its
    /// `op_id`, seq, chain and limits) before it reaches the fold.
    heads: BTreeMap<String, LogHead>,
    /// Intent records of this device that other writers appended since this ledger's previous
    /// append, as found by the last append (see [`DispatchOutcome::ConcurrentAttempt`]).
    others_appended: Vec<OpRecord>,
    /// Per device, the record the relay handed over that did not verify (a forged or damaged
    /// one): damage until the relay hands over a valid record in its place.
    rejected: BTreeMap<String, RelayProblem>,
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
        let batch = relay.pull(&Frontier::new())?;
        let own: Vec<OpRecord> = batch
            .ops
            .iter()
            .filter(|op| &*op.device_id == device_id)
            .cloned()
            .collect();
        let log = DeviceLog::resume(device_id, wall_clock, HlcConfig::default(), &own)?;
        let mut ledger = Self {
            log,
            relay,
            state: SyncState::new(),
            frontier: Frontier::new(),
            unsent: Vec::new(),
            attempts: BTreeMap::new(),
            problems: Vec::new(),
            relay_problems: Vec::new(),
            replaced: Vec::new(),
            accepted: BTreeSet::new(),
            seen,
            heads: BTreeMap::new(),
            rejected: BTreeMap::new(),
            others_appended: Vec::new(),
        };
        ledger.take_pull(batch)?;
        Ok(ledger)
    }

    /// This site's device id.
    pub fn device_id(&self) -> &str {
        self.log.device_id()
    }

    /// The folded state of every intent this ledger has.
    pub fn state(&self) -> &SyncState {
        &self.state
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
    /// accepted with [`accept_damage`](Self::accept_damage). [`dispatch`] refuses to run anything
    /// while there is any: a run that the damaged device committed would look new.
    pub fn damage(&self) -> Vec<&RelayProblem> {
        self.problems
            .iter()
            .filter(|problem| problem.is_damage() && !self.is_accepted(problem))
            .collect()
    }

    fn is_accepted(&self, problem: &RelayProblem) -> bool {
        self.accepted.iter().any(|device| names(problem, device))
    }

    /// Accepts the damage of `device` (a device id, or a device file's name): [`dispatch`] no
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

    /// Appends an intent to this device's log and stores it through the relay at once (under the
    /// relay's claim on the device's log), then folds it. For recording the outcome of a reconciled
    /// in-doubt run; [`dispatch`] records its own.
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

    /// Stores the queued records under the relay's claim on this device's log.
    fn write_queued(&mut self) -> Result<Vec<OpRecord>, DispatchError> {
        if self.unsent.is_empty() {
            return Ok(Vec::new());
        }
        let mut draft: Option<DeviceLog> = None;
        let (log, unsent) = (&self.log, &self.unsent);
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
        Ok(appended.appended)
    }

    /// Stores the queued records.
    ///
    /// # Errors
    /// [`DispatchError::Relay`] or [`DispatchError::Log`]; the records stay queued.
    pub fn flush(&mut self) -> Result<usize, DispatchError> {
        Ok(self.write_queued()?.len())
    }

    /// Stores the queued records, then pulls and folds what the relay has that this ledger lacks.
    /// The problems the pull reports replace the previous ones ([`problems`](Self::problems)).
    ///
    /// # Errors
    /// [`DispatchError::Relay`] when the push or the pull fails.
    pub fn sync(&mut self) -> Result<SyncReport, DispatchError> {
        let pushed = self.flush()?;
        let batch = self.relay.pull(&self.frontier)?;
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
        Ok(SyncReport { pushed, pulled })
    }

    /// Folds a pull, keeps its problems, and checks and updates the seen file.
    fn take_pull(&mut self, batch: crate::relay::PullBatch) -> Result<(), DispatchError> {
        for problem in batch.problems.iter().filter(|problem| problem.is_damage()) {
            tracing::debug!(%problem, "the ledger is damaged");
        }
        self.relay_problems = batch.problems;
        self.absorb(&batch.ops);
        self.recompute_problems();
        self.save_seen()
    }

    /// The problems: the last pull's, the records found replaced (for good: a replaced record
    /// stays damage, even once the file has grown past it), and the devices with fewer records
    /// than the seen file remembers.
    fn recompute_problems(&mut self) {
        self.problems = self.relay_problems.clone();
        self.problems.extend(self.replaced.iter().cloned());
        self.problems.extend(self.rejected.values().cloned());
        if let Some(seen) = &self.seen {
            for (device, mark) in &seen.devices {
                let has = self.frontier.next_seq(device);
                if has < mark.next_seq {
                    self.problems.push(RelayProblem {
                        kind: crate::relay::ProblemKind::Damage,
                        device_id: Some(device.clone()),
                        file: None,
                        line_number: None,
                        detail: format!(
                            "this site has seen {} records of this device, the ledger now has {has}: its file shrank, was replaced or lost records (restore it from a copy)",
                            mark.next_seq
                        ),
                    });
                }
            }
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
        for (device, next_seq) in self.frontier.iter() {
            if damaged.contains(device) {
                continue;
            }
            if let Some(head) = self.heads.get(device) {
                if let (true, Some(last_op_id)) = (head.next_seq() == next_seq, head.last_op_id()) {
                    marks.insert(device.to_owned(), Seen { next_seq, last_op_id });
                }
            }
        }
        seen.store(marks)
    }

    /// Folds `ops` (stored in the relay), indexes their attempts, and checks them against the seen
    /// file.
    ///
    /// Whatever the relay hands over is verified first (rule O1: `op_id` over the content, seq,
    /// chain, limits), so a forged record never reaches the fold, whose laws assume records whose
    /// ids match their content. A record that does not verify is damage of its device; the
    /// frontier stays before it.
    fn absorb(&mut self, ops: &[OpRecord]) {
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
            match head.accept(op) {
                Ok(()) => {
                    self.rejected.remove(device);
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
        for op in verified {
            if let Some(mark) = self
                .seen
                .as_ref()
                .and_then(|seen| seen.devices.get(&*op.device_id))
            {
                if op.seq + 1 == mark.next_seq && op.op_id != mark.last_op_id {
                    self.replaced.push(RelayProblem {
                        kind: crate::relay::ProblemKind::Damage,
                        device_id: Some(op.device_id.to_string()),
                        file: None,
                        line_number: Some(op.seq + 1),
                        detail: format!(
                            "record {} is {}, but this site saw {} there: the file was replaced (restore it from a copy)",
                            op.seq, op.op_id, mark.last_op_id
                        ),
                    });
                }
            }
            // Only intent records are attempts: a record of another surface with the same fields
            // (an audit mirror, say) settles nothing, exactly as the fold ignores it.
            if op.surface != Surface::Intent {
                continue;
            }
            let Some(intent) = op.payload.intent() else {
                continue;
            };
            let run_id = intent.run_id;
            let key = (intent.agent_id, run_id.clone());
            if self.state.committed_run(&key.0, &key.1).is_some() {
                self.attempts.remove(&key);
                continue;
            }
            let attempts = self.attempts.entry(key).or_default();
            if intent.status == IntentStatus::Pending {
                if !attempts.settled.contains(&intent.epoch) {
                    let candidate = InDoubtRun {
                        run_id: run_id.clone(),
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
    }

    /// The runs of `agent_id` in doubt for a holder at `held_epoch` (rule D2): no `committed`
    /// record, and a `pending` of an epoch below `held_epoch` with no `committed` or `failed` of
    /// that epoch. Each run is reported once, at its greatest such epoch. Call it right after
    /// acquiring, before dispatching; see the [module docs](self) for what to do with them.
    /// `held_epoch = u64::MAX` lists every run in doubt.
    pub fn in_doubt(&self, agent_id: &str, held_epoch: u64) -> Vec<InDoubtRun> {
        let start = (agent_id.to_owned(), String::new());
        self.attempts
            .range(start..)
            .take_while(|((agent, _), _)| agent == agent_id)
            .filter_map(|(_, attempts)| attempts.unsettled.range(..held_epoch).next_back())
            .map(|(_, run)| run.clone())
            .collect()
    }

    /// A `pending` of `run_id` that another writer of this device appended just before this
    /// ledger's last append (found in that append's catch-up), if any.
    /// A `committed` of the run among them is left to the fence (`AlreadyCommitted`).
    fn concurrent_attempt(&self, agent_id: &str, run_id: &str) -> Option<InDoubtRun> {
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

    /// Whether `run_id` of `agent_id` is in doubt for a holder at `held_epoch`: like
    /// [`in_doubt`](Self::in_doubt), but a `pending` *at* `held_epoch` with no outcome counts too
    /// (an earlier attempt of this tenure whose outcome was never stored).
    pub fn in_doubt_run(&self, agent_id: &str, run_id: &str, held_epoch: u64) -> Option<InDoubtRun> {
        let attempts = self.attempts.get(&(agent_id.to_owned(), run_id.to_owned()))?;
        attempts
            .unsettled
            .range(..=held_epoch)
            .next_back()
            .map(|(_, run)| run.clone())
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
        let failed = |source| DispatchError::Seen {
            path: self.path.clone(),
            source,
        };
        let changed = marks.iter().any(|(device, mark)| {
            self.devices
                .get(device)
                .is_none_or(|known| mark.next_seq > known.next_seq)
        });
        if !changed {
            return Ok(());
        }
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
                    return Ok(());
                }
                Err(std::fs::TryLockError::Error(error)) => return Err(failed(error)),
            }
        }
        let mut devices = Self::read(&self.path)?;
        for (device, mark) in marks {
            let slot = devices.entry(device).or_insert(mark);
            if mark.next_seq > slot.next_seq {
                *slot = mark;
            }
        }
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", std::process::id()));
        let bytes = serde_json::to_vec(&devices).map_err(|error| failed(error.into()))?;
        std::fs::write(&temporary, bytes).map_err(failed)?;
        std::fs::rename(&temporary, &self.path).map_err(failed)?;
        self.devices = devices;
        Ok(())
    }
}

/// Runs `effect` for `run_id` of the keeper's agent under the whole protocol; see the
/// [module docs](self).
///
/// # Errors
/// * [`DispatchError::InvalidId`], [`DispatchError::DeviceMismatch`]: nothing written.
/// * [`DispatchError::BelowFencingEpoch`]: nothing written, nothing ran.
/// * [`DispatchError::Relay`] before the effect: the `pending` could not be pushed, so the effect
///   did not run (the `pending` stays queued).
/// * [`DispatchError::Lease`]: the coordinator failed during the fence; `failed` was recorded and
///   the effect did not run.
///
/// A relay failure *after* the effect is not an error: the outcome is `Executed` and the record
/// stays queued ([`Ledger::unsent`]) for the next [`Ledger::sync`].
///
/// ```
/// use std::sync::Arc;
/// use fencepost::clock::system_clock;
/// use fencepost::dispatch::{dispatch, DispatchOutcome, Ledger};
/// use fencepost::keeper::{KeeperConfig, LeaseKeeper};
/// use fencepost::lease::InMemoryLeaseCoordinator;
/// use fencepost::relay::InMemoryRelay;
/// use fencepost::run_id::deterministic_run_id;
///
/// // What every site shares: a coordinator and a relay.
/// let coordinator = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
/// let relay = Arc::new(InMemoryRelay::new());
///
/// // The agent runtime on the laptop.
/// let mut ledger = Ledger::open("laptop", system_clock(), relay.clone())?;
/// ledger.sync()?;
/// let keeper = LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
///     .config(KeeperConfig::new(30_000))
///     .ledger_epoch(ledger.state().fencing_epoch("milo"))
///     .acquire()?;
/// for run in ledger.in_doubt("milo", keeper.epoch()) {
///     println!("in doubt, decide before dispatching: {run:?}");
/// }
/// let mut sent = 0;
/// for day in ["2026-11-30", "2026-12-01"] {
///     let run_id = deterministic_run_id("milo", "send the daily report", day)?;
///     let outcome = dispatch(&keeper, &mut ledger, &run_id, |token| {
///         sent += 1; // send the report, passing `token` to a service that checks it
///         Ok::<_, std::io::Error>(token.epoch)
///     })?;
///     assert!(outcome.executed());
///     // The same run again, here or on any site that synced: the oracle refuses it.
///     let again = dispatch(&keeper, &mut ledger, &run_id, |_| Ok::<_, std::io::Error>(0))?;
///     assert!(matches!(again, DispatchOutcome::AlreadyCommitted { .. }));
/// }
/// assert_eq!(sent, 2);
/// keeper.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn dispatch<T, E>(
    keeper: &LeaseKeeper,
    ledger: &mut Ledger,
    run_id: &str,
    effect: impl FnOnce(&FencingToken) -> Result<T, E>,
) -> Result<DispatchOutcome<T, E>, DispatchError> {
    dispatch_with(keeper, ledger, run_id, DispatchOptions::default(), effect)
}

/// Choices a caller makes explicitly in [`dispatch_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchOptions {
    /// Run the effect even when the run is in doubt (rule D2): the caller checked that the earlier
    /// attempt's effect did not happen, or the resource makes a second attempt harmless.
    pub retry_in_doubt: bool,
}

impl DispatchOptions {
    /// Retry an in-doubt run (see [`DispatchOptions::retry_in_doubt`]).
    pub fn retry_in_doubt(mut self, retry: bool) -> Self {
        self.retry_in_doubt = retry;
        self
    }
}

/// [`dispatch`] with explicit [`DispatchOptions`].
///
/// # Errors
/// As [`dispatch`].
pub fn dispatch_with<T, E>(
    keeper: &LeaseKeeper,
    ledger: &mut Ledger,
    run_id: &str,
    options: DispatchOptions,
    effect: impl FnOnce(&FencingToken) -> Result<T, E>,
) -> Result<DispatchOutcome<T, E>, DispatchError> {
    dispatch_effect(keeper, ledger, run_id, options, |token| match effect(token) {
        Ok(value) => EffectOutcome::Succeeded(value),
        Err(error) => EffectOutcome::Failed(error),
    })
}

/// What an effect reports to [`dispatch_effect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectOutcome<T, E> {
    /// It happened: `committed` is recorded.
    Succeeded(T),
    /// It did not happen: `failed` is recorded.
    Failed(E),
    /// Nobody knows whether it happened (it was interrupted mid-way: killed, timed out, its lease
    /// lost): no outcome is recorded, so the run stays **in doubt** (rule D2) and no site runs it
    /// again without a decision.
    Unknown(E),
}

/// [`dispatch_with`] for an effect that may not know whether it happened ([`EffectOutcome`]).
///
/// # Errors
/// As [`dispatch`].
pub fn dispatch_effect<T, E>(
    keeper: &LeaseKeeper,
    ledger: &mut Ledger,
    run_id: &str,
    options: DispatchOptions,
    effect: impl FnOnce(&FencingToken) -> EffectOutcome<T, E>,
) -> Result<DispatchOutcome<T, E>, DispatchError> {
    validate_id(IdKind::Run, run_id)?;
    if keeper.device_id() != ledger.device_id() {
        return Err(DispatchError::DeviceMismatch {
            keeper: keeper.device_id().to_owned(),
            ledger: ledger.device_id().to_owned(),
        });
    }
    let Some(guard) = keeper.guard() else {
        return Ok(DispatchOutcome::NotHeld {
            claimed_epoch: keeper.epoch(),
        });
    };
    let permit = match ledger.begin(&guard, run_id, options) {
        Ok(permit) => permit,
        Err(refusal) => return refusal.into_outcome(),
    };
    let epoch = permit.token().epoch;
    let (outcome, result) = match effect(permit.token()) {
        EffectOutcome::Succeeded(value) => (RunOutcome::Committed, Ok(value)),
        EffectOutcome::Failed(error) => (RunOutcome::Failed, Err(error)),
        EffectOutcome::Unknown(error) => {
            permit.abandon();
            drop(guard);
            return Ok(DispatchOutcome::Interrupted { epoch, error });
        }
    };
    if let Err(error) = permit.finish(ledger, outcome) {
        tracing::warn!(%error, run_id, "could not store the outcome; it stays queued for the next sync");
    }
    drop(guard);
    Ok(DispatchOutcome::Executed { epoch, result })
}

/// Why [`Ledger::begin`] gave no [`Permit`]: the refusals of [`DispatchOutcome`], and the errors
/// of [`dispatch`]. Nothing ran; what was recorded is said per variant.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refusal {
    /// As [`DispatchOutcome::AlreadyCommitted`].
    AlreadyCommitted {
        /// The commit record.
        committed_op_id: OpId,
    },
    /// As [`DispatchOutcome::StaleEpoch`]: the fence found another holder or epoch; `failed`
    /// was recorded for this attempt.
    StaleEpoch {
        /// The epoch claimed.
        claimed_epoch: u64,
        /// The agent's epoch.
        current_epoch: u64,
        /// Its holder.
        current_holder: String,
    },
    /// As [`DispatchOutcome::NotHeld`] (before the `pending`: nothing written; at or after the
    /// fence: `failed` recorded).
    NotHeld {
        /// The epoch claimed.
        claimed_epoch: u64,
    },
    /// As [`DispatchOutcome::InDoubt`]: nothing written.
    InDoubt {
        /// The attempt in doubt.
        run: InDoubtRun,
    },
    /// As [`DispatchOutcome::ConcurrentAttempt`]: this attempt's `pending` stays.
    ConcurrentAttempt {
        /// The other attempt.
        run: InDoubtRun,
    },
    /// As the errors of [`dispatch`].
    Error(DispatchError),
}

impl From<DispatchError> for Refusal {
    fn from(error: DispatchError) -> Self {
        Refusal::Error(error)
    }
}

impl From<LeaseError> for Refusal {
    fn from(error: LeaseError) -> Self {
        Refusal::Error(error.into())
    }
}

impl Refusal {
    /// The [`DispatchOutcome`] of this refusal, or its error.
    ///
    /// # Errors
    /// [`Refusal::Error`]'s error.
    pub fn into_outcome<T, E>(self) -> Result<DispatchOutcome<T, E>, DispatchError> {
        Ok(match self {
            Refusal::AlreadyCommitted { committed_op_id } => {
                DispatchOutcome::AlreadyCommitted { committed_op_id }
            }
            Refusal::StaleEpoch {
                claimed_epoch,
                current_epoch,
                current_holder,
            } => DispatchOutcome::StaleEpoch {
                claimed_epoch,
                current_epoch,
                current_holder,
            },
            Refusal::NotHeld { claimed_epoch } => DispatchOutcome::NotHeld { claimed_epoch },
            Refusal::InDoubt { run } => DispatchOutcome::InDoubt { run },
            Refusal::ConcurrentAttempt { run } => DispatchOutcome::ConcurrentAttempt { run },
            Refusal::Error(error) => return Err(error),
        })
    }
}

/// How a run that a [`Permit`] let through ended: what [`Permit::finish`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The effect happened: `committed`.
    Committed,
    /// The effect did not happen: `failed`.
    Failed,
}

/// The right to perform one run's effect, from [`Ledger::begin`]: its `pending` is stored and the
/// fence said `Proceed`. Pass [`token`](Self::token) to the resource, then end it with
/// [`finish`](Self::finish) (the outcome is known) or [`abandon`](Self::abandon) (it is not: the
/// run stays in doubt). Time may pass between the steps; the permit holds no lock and no borrow.
#[derive(Debug)]
#[must_use = "end a permit with finish (the outcome is known) or abandon (it is not)"]
pub struct Permit {
    token: FencingToken,
    device_id: String,
}

impl Permit {
    /// The fencing token of the run: agent, run id and epoch.
    pub fn token(&self) -> &FencingToken {
        &self.token
    }

    /// Records the run's outcome (`committed` or `failed` at the permit's epoch) in `ledger`,
    /// which must be the ledger of the device that began it.
    ///
    /// # Errors
    /// [`DispatchError::DeviceMismatch`] for another device's ledger (nothing written);
    /// [`DispatchError::Relay`] or [`DispatchError::Log`] when the record could not be stored: it
    /// stays queued and is stored by the ledger's next flush, sync or record.
    pub fn finish(self, ledger: &mut Ledger, outcome: RunOutcome) -> Result<OpRecord, DispatchError> {
        if ledger.device_id() != self.device_id {
            return Err(DispatchError::DeviceMismatch {
                keeper: self.device_id,
                ledger: ledger.device_id().to_owned(),
            });
        }
        let status = match outcome {
            RunOutcome::Committed => IntentStatus::Committed,
            RunOutcome::Failed => IntentStatus::Failed,
        };
        let FencingToken {
            agent_id,
            run_id,
            epoch,
        } = &self.token;
        let stored = ledger.record(&Intent::new(agent_id.as_str(), run_id.as_str(), *epoch, status));
        tracing::info!(
            agent_id = %agent_id,
            run_id = %run_id,
            epoch,
            status = status.as_str(),
            "run dispatched"
        );
        stored
    }

    /// Ends the permit without an outcome: nobody knows whether the effect happened (it was
    /// interrupted: killed, timed out, its lease lost). Nothing is recorded, so the run stays in
    /// doubt (rule D2). Returns the token.
    pub fn abandon(self) -> FencingToken {
        tracing::warn!(
            agent_id = %self.token.agent_id,
            run_id = %self.token.run_id,
            epoch = self.token.epoch,
            "the effect was interrupted; the run stays in doubt"
        );
        self.token
    }
}

impl Ledger {
    /// Settles a run in doubt (rule D2) by someone who found out whether its effect happened
    /// (an operator who checked the resource; `fencepost ledger resolve`): records `outcome` at
    /// the epoch of the attempt in doubt (the newest, when several are), which ends the doubt.
    /// Make sure that attempt is no longer running first (its lease has ended).
    ///
    /// # Errors
    /// [`DispatchError::NotInDoubt`] (nothing written), and the errors of
    /// [`record`](Self::record).
    pub fn resolve(
        &mut self,
        agent_id: &str,
        run_id: &str,
        outcome: RunOutcome,
    ) -> Result<OpRecord, DispatchError> {
        let Some(doubt) = self.in_doubt_run(agent_id, run_id, u64::MAX) else {
            return Err(DispatchError::NotInDoubt {
                agent_id: agent_id.to_owned(),
                run_id: run_id.to_owned(),
            });
        };
        let status = match outcome {
            RunOutcome::Committed => IntentStatus::Committed,
            RunOutcome::Failed => IntentStatus::Failed,
        };
        self.record(&Intent::new(agent_id, run_id, doubt.epoch, status))
    }

    /// The first half of a dispatch, as a step (rules D1, D2, F4, F6): checks, in order, that the
    /// holder still holds the lease, that the run has not committed (the oracle), that the
    /// holder's epoch is not below the ledger's fencing epoch, that the ledger is not damaged, and
    /// that the run is not in doubt (unless `options` retry it); then stores the `pending`,
    /// checks that no other writer of this device began the same run first, asks the fence
    /// ([`check_dispatch`]) and checks the holder's own timing once more. A refusal at the fence
    /// or after it records `failed`. On success, the effect may run: see [`Permit`].
    ///
    /// [`dispatch`] is this, the effect, and [`Permit::finish`].
    ///
    /// # Errors
    /// A [`Refusal`]; see each variant for what was written.
    pub fn begin(
        &mut self,
        holder: &dyn crate::fence::Holder,
        run_id: &str,
        options: DispatchOptions,
    ) -> Result<Permit, Refusal> {
        validate_id(IdKind::Run, run_id).map_err(DispatchError::from)?;
        if holder.device_id() != self.device_id() {
            return Err(DispatchError::DeviceMismatch {
                keeper: holder.device_id().to_owned(),
                ledger: self.device_id().to_owned(),
            }
            .into());
        }
        let agent_id = holder.agent_id();
        let epoch = holder.epoch();
        if !holder.holds() {
            return Err(Refusal::NotHeld { claimed_epoch: epoch });
        }
        if let Some(committed) = self.state().committed_run(agent_id, run_id) {
            return Err(Refusal::AlreadyCommitted {
                committed_op_id: committed.op_id,
            });
        }
        let fencing_epoch = self.state().fencing_epoch(agent_id);
        if epoch < fencing_epoch {
            return Err(DispatchError::BelowFencingEpoch {
                agent_id: agent_id.to_owned(),
                epoch,
                fencing_epoch,
            }
            .into());
        }
        let damage = self.damage();
        if !damage.is_empty() {
            return Err(DispatchError::Damaged {
                problems: damage.into_iter().cloned().collect(),
            }
            .into());
        }
        if let Some(run) = self.in_doubt_run(agent_id, run_id, epoch) {
            if !options.retry_in_doubt {
                return Err(Refusal::InDoubt { run });
            }
            tracing::info!(
                agent_id,
                run_id,
                epoch,
                earlier_epoch = run.epoch,
                "retrying an in-doubt run"
            );
        }
        let intent = |status| Intent::new(agent_id, run_id, epoch, status);
        self.record(&intent(IntentStatus::Pending))?;
        // Another writer of this device (a thread or process sharing the device id and the lease)
        // may have started the same run since this ledger last looked: its `pending` then arrived
        // in this append's catch-up, before ours. The first `pending` in the log runs; this one
        // does not, and records nothing more (a `failed` at this epoch would settle the other
        // attempt).
        if let Some(run) = self.concurrent_attempt(agent_id, run_id) {
            tracing::warn!(
                agent_id,
                run_id,
                epoch,
                other_op_id = %run.op_id,
                "another writer of this device started the run first; not running it"
            );
            return Err(Refusal::ConcurrentAttempt { run });
        }
        let refuse = |ledger: &mut Ledger| {
            if let Err(error) = ledger.record(&intent(IntentStatus::Failed)) {
                tracing::warn!(%error, run_id, "could not store a failed intent; it stays queued");
            }
        };
        let decision = match check_dispatch(
            holder.coordinator(),
            self.state(),
            agent_id,
            run_id,
            holder.device_id(),
            epoch,
        ) {
            Ok(decision) => decision,
            Err(error) => {
                refuse(self);
                return Err(error.into());
            }
        };
        tracing::debug!(agent_id, run_id, epoch, ?decision, "fence decision");
        let refusal = match decision {
            FenceDecision::Proceed => None,
            FenceDecision::AlreadyCommitted { committed_op_id } => {
                Some(Refusal::AlreadyCommitted { committed_op_id })
            }
            FenceDecision::StaleEpoch {
                claimed_epoch,
                current_epoch,
                current_holder,
            } => Some(Refusal::StaleEpoch {
                claimed_epoch,
                current_epoch,
                current_holder,
            }),
            FenceDecision::NotHeld { claimed_epoch } => Some(Refusal::NotHeld { claimed_epoch }),
        };
        if let Some(refusal) = refusal {
            tracing::info!(agent_id, run_id, epoch, "the fence refused the run");
            refuse(self);
            return Err(refusal);
        }
        // The fence may have waited on the coordinator past the holder's renew deadline: the
        // lease can then be gone although the coordinator had not given it away yet. Never act
        // after the holder reported the loss.
        if !holder.holds() {
            tracing::warn!(
                agent_id,
                run_id,
                epoch,
                "the lease was lost while the fence was checked"
            );
            refuse(self);
            return Err(Refusal::NotHeld { claimed_epoch: epoch });
        }
        Ok(Permit {
            token: FencingToken {
                agent_id: agent_id.to_owned(),
                run_id: run_id.to_owned(),
                epoch,
            },
            device_id: self.device_id().to_owned(),
        })
    }
}

/// Why a [`FencedResource`] refused an effect; nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceRefusal {
    /// The token's epoch is older than one the resource has seen for the agent: the caller is a
    /// zombie (it lost its lease after the fence said `Proceed`).
    #[error(
        "stale fencing token: epoch {epoch} of {agent_id:?}, but the resource has seen epoch {highest_epoch}"
    )]
    StaleEpoch {
        /// The agent.
        agent_id: String,
        /// The token's epoch.
        epoch: u64,
        /// The highest epoch the resource has seen for the agent.
        highest_epoch: u64,
    },
    /// The token's epoch is outside `1..=`[`MAX_EPOCH`](crate::lease::MAX_EPOCH): no coordinator
    /// minted it, and accepting it would make every real epoch look stale.
    #[error(
        "fencing token epoch {epoch} of {agent_id:?} is outside the epoch range: no coordinator minted it"
    )]
    EpochOutOfRange {
        /// The agent.
        agent_id: String,
        /// The token's epoch.
        epoch: u64,
    },
    /// The run was applied before (under `applied_epoch`): the run id is the idempotency key, so a
    /// second execution of a run, whoever sends it, changes nothing.
    #[error("run {run_id:?} of {agent_id:?} was already applied under epoch {applied_epoch}")]
    AlreadyApplied {
        /// The agent.
        agent_id: String,
        /// The run.
        run_id: String,
        /// The epoch of the token it was applied under.
        applied_epoch: u64,
    },
}

/// A resource that cooperates with the fence the way a real service must, for tests, examples and
/// the simulator: atomically with each write it checks
///
/// 1. the **fencing token**: it remembers the highest epoch it has seen per agent and refuses a
///    lower one ([`ResourceRefusal::StaleEpoch`]), which stops a zombie whose effect arrives after
///    a successor's;
/// 2. the **idempotency key**: it remembers every run it applied per agent and refuses the same
///    run again ([`ResourceRefusal::AlreadyApplied`]), which stops a zombie whose effect arrived
///    *first*, and makes retrying an in-doubt run under a new epoch harmless.
///
/// Only both checks together close the window between the fence and the effect. A service that
/// checks only the epoch still runs a run twice when the stale effect lands first; one that
/// checks only the run id still lets a zombie act for an agent it no longer holds.
///
/// ```
/// use fencepost::dispatch::{FencedResource, FencingToken, ResourceRefusal};
///
/// let resource = FencedResource::new();
/// let token = |run: &str, epoch| FencingToken { agent_id: "milo".into(), run_id: run.into(), epoch };
/// resource.apply(&token("run-a", 1), "sent")?;            // a zombie's effect lands first
/// assert!(matches!(                                        // the successor's retry is refused
///     resource.apply(&token("run-a", 2), "sent"),
///     Err(ResourceRefusal::AlreadyApplied { applied_epoch: 1, .. })
/// ));
/// resource.apply(&token("run-b", 2), "sent")?;
/// assert!(matches!(                                        // epoch 1 is stale from now on
///     resource.apply(&token("run-c", 1), "sent"),
///     Err(ResourceRefusal::StaleEpoch { highest_epoch: 2, .. })
/// ));
/// assert_eq!(resource.applied().len(), 2);
/// # Ok::<(), ResourceRefusal>(())
/// ```
#[derive(Debug)]
pub struct FencedResource<T> {
    inner: Mutex<ResourceState<T>>,
}

#[derive(Debug)]
struct ResourceState<T> {
    highest_epoch: BTreeMap<String, u64>,
    /// Per (agent, run), the epoch it was applied under.
    applied_runs: BTreeMap<(String, String), u64>,
    applied: Vec<(FencingToken, T)>,
}

impl<T> Default for FencedResource<T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(ResourceState {
                highest_epoch: BTreeMap::new(),
                applied_runs: BTreeMap::new(),
                applied: Vec::new(),
            }),
        }
    }
}

impl<T: Clone> FencedResource<T> {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `effect` under `token`, unless a higher epoch of its agent was seen before or its
    /// run was applied before. Both checks and the write are one atomic step.
    ///
    /// # Errors
    /// [`ResourceRefusal`]: nothing applied, nothing remembered.
    pub fn apply(&self, token: &FencingToken, effect: T) -> Result<(), ResourceRefusal> {
        if !(1..=crate::lease::MAX_EPOCH).contains(&token.epoch) {
            return Err(ResourceRefusal::EpochOutOfRange {
                agent_id: token.agent_id.clone(),
                epoch: token.epoch,
            });
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let highest = inner.highest_epoch.get(&token.agent_id).copied().unwrap_or(0);
        if token.epoch < highest {
            return Err(ResourceRefusal::StaleEpoch {
                agent_id: token.agent_id.clone(),
                epoch: token.epoch,
                highest_epoch: highest,
            });
        }
        let key = (token.agent_id.clone(), token.run_id.clone());
        if let Some(applied_epoch) = inner.applied_runs.get(&key) {
            return Err(ResourceRefusal::AlreadyApplied {
                agent_id: token.agent_id.clone(),
                run_id: token.run_id.clone(),
                applied_epoch: *applied_epoch,
            });
        }
        inner.highest_epoch.insert(token.agent_id.clone(), token.epoch);
        inner.applied_runs.insert(key, token.epoch);
        inner.applied.push((token.clone(), effect));
        Ok(())
    }

    /// Every applied effect, in order, with its token.
    pub fn applied(&self) -> Vec<(FencingToken, T)> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .applied
            .clone()
    }

    /// The highest epoch seen for `agent_id` (0 if none).
    pub fn highest_epoch(&self, agent_id: &str) -> u64 {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.highest_epoch.get(agent_id).copied().unwrap_or(0)
    }

    /// The epoch `run_id` of `agent_id` was applied under, if it was.
    pub fn applied_epoch(&self, agent_id: &str, run_id: &str) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .applied_runs
            .get(&(agent_id.to_owned(), run_id.to_owned()))
            .copied()
    }
}
