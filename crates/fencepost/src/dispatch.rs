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
//!    every other site can see the attempt even if this one dies mid-effect;
//! 5. asks [`check_dispatch`] (oracle, then coordinator); anything but `Proceed` records `failed`
//!    and returns the verdict, without running the effect;
//! 6. runs the effect with a [`FencingToken`] `{agent_id, run_id, epoch}` to pass to any resource
//!    that checks tokens, and records `committed` or `failed` by its result.
//!
//! # What stays open, and in-doubt runs
//!
//! Between `Proceed` and the effect landing, the holder can pause, lose its lease, and a successor
//! can run the same run. The fence cannot close that window; a resource that rejects stale tokens
//! ([`FencedResource`] shows how) or a database effect under the PostgreSQL transactional fence
//! can. When a site dies between `pending` and its outcome, the run is **in doubt**: the effect
//! may or may not have happened. A new holder lists those runs with [`Ledger::in_doubt`] right after
//! acquiring (before it dispatches anything) and decides, per run:
//!
//! * **retry with the token**: dispatch again under the new epoch when the resource checks tokens
//!   or keys (an idempotency key equal to the run id makes a second attempt harmless);
//! * **reconcile**: ask the resource whether the effect happened (look the payment up by run id),
//!   then record `committed` or `failed` with [`Ledger::record`];
//! * **give up**: record `failed` and alert a human.
//!
//! `dispatch` does not decide for you: dispatching an in-doubt run is a retry.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::{HlcConfig, WallClock};
use crate::fence::{check_dispatch, FenceDecision};
use crate::fold::SyncState;
use crate::id::{validate_id, IdError, IdKind};
use crate::keeper::LeaseKeeper;
use crate::lease::{Intent, IntentStatus, LeaseError};
use crate::oplog::{DeviceLog, LogError, OpId, OpRecord, Surface};
use crate::relay::{Frontier, Relay, RelayError};

/// What a site hands to the resource along with the effect: who acts, for which run, under which
/// epoch. A resource that remembers the highest epoch per agent and refuses lower ones stops a
/// zombie that passed the fence before it paused ([`FencedResource`]).
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
    /// The run already committed (on any site, at any epoch): nothing ran, nothing was written.
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
}

impl<T, E> DispatchOutcome<T, E> {
    /// Whether the effect ran.
    pub fn executed(&self) -> bool {
        matches!(self, DispatchOutcome::Executed { .. })
    }
}

/// A run whose latest record is a `pending` of an earlier epoch, with no `committed` or `failed`
/// record anywhere: its effect may or may not have happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDoubtRun {
    /// The run.
    pub run_id: String,
    /// The epoch of its latest `pending`.
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

/// One site's view of the ledger: its own op log (appended and pushed through a relay), the folded
/// state of every device's intents, and an index of the runs that may be in doubt.
pub struct Ledger {
    log: DeviceLog,
    relay: Arc<dyn Relay>,
    state: SyncState,
    frontier: Frontier,
    unsent: Vec<OpRecord>,
    /// Per agent and run, the greatest `pending` seen, for runs with no terminal record.
    pendings: BTreeMap<(String, String), InDoubtRun>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Ledger")
            .field("device_id", &self.log.device_id())
            .field("unsent", &self.unsent.len())
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
        validate_id(IdKind::Device, device_id)?;
        let batch = relay.pull(&Frontier::new())?;
        for problem in &batch.problems {
            tracing::warn!(%problem, "relay problem while opening the ledger");
        }
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
            pendings: BTreeMap::new(),
        };
        ledger.absorb(&batch.ops);
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

    /// How many own records wait to be pushed.
    pub fn unsent(&self) -> usize {
        self.unsent.len()
    }

    /// Appends an intent to this device's log, folds it, and queues it for the relay (push with
    /// [`flush`](Self::flush) or [`sync`](Self::sync)). For recording the outcome of a reconciled
    /// in-doubt run; [`dispatch`] records its own.
    ///
    /// # Errors
    /// [`DispatchError::InvalidId`] for an invalid agent or run id.
    pub fn record(&mut self, intent: &Intent) -> Result<OpRecord, DispatchError> {
        validate_id(IdKind::Agent, &intent.agent_id)?;
        validate_id(IdKind::Run, &intent.run_id)?;
        let op = self.log.append(Surface::Intent, intent.payload());
        self.absorb(std::slice::from_ref(&op));
        self.unsent.push(op.clone());
        Ok(op)
    }

    /// Pushes the queued records.
    ///
    /// # Errors
    /// [`DispatchError::Relay`]; the records stay queued.
    pub fn flush(&mut self) -> Result<usize, DispatchError> {
        if self.unsent.is_empty() {
            return Ok(0);
        }
        self.relay.push(&self.unsent)?;
        Ok(std::mem::take(&mut self.unsent).len())
    }

    /// Pushes the queued records, then pulls and folds what the relay has that this ledger lacks.
    ///
    /// # Errors
    /// [`DispatchError::Relay`] when the push or the pull fails.
    pub fn sync(&mut self) -> Result<SyncReport, DispatchError> {
        let pushed = self.flush()?;
        let batch = self.relay.pull(&self.frontier)?;
        for problem in &batch.problems {
            tracing::warn!(%problem, "relay problem while syncing the ledger");
        }
        for op in &batch.ops {
            // A stamp too far ahead is refused by the clock (rule C1) but still folded.
            if let Err(error) = self.log.observe(&op.hlc) {
                tracing::warn!(%error, device_id = %op.device_id, "not advancing the clock to a remote stamp");
            }
        }
        self.absorb(&batch.ops);
        Ok(SyncReport {
            pushed,
            pulled: batch.ops.len(),
        })
    }

    /// Folds `ops` (already stored in the relay or this log) and indexes their pendings.
    fn absorb(&mut self, ops: &[OpRecord]) {
        self.frontier.observe_all(ops);
        self.state.apply_all(ops);
        for op in ops {
            let Some(intent) = op.payload.intent() else {
                continue;
            };
            let key = (intent.agent_id, intent.run_id);
            let terminal = self
                .state
                .intent(&key.0, &key.1)
                .is_some_and(|record| record.status != IntentStatus::Pending);
            if terminal {
                self.pendings.remove(&key);
            } else if intent.status == IntentStatus::Pending {
                let candidate = InDoubtRun {
                    run_id: key.1.clone(),
                    epoch: intent.epoch,
                    device_id: op.device_id.to_string(),
                    op_id: op.op_id,
                };
                let entry = self.pendings.entry(key).or_insert_with(|| candidate.clone());
                if (candidate.epoch, &candidate.op_id) > (entry.epoch, &entry.op_id) {
                    *entry = candidate;
                }
            }
        }
    }

    /// The runs of `agent_id` in doubt for a holder at `held_epoch`: the latest record is a
    /// `pending` of an earlier epoch, and no `committed` or `failed` exists. Call it right after
    /// acquiring, before dispatching; see the [module docs](self) for what to do with them.
    pub fn in_doubt(&self, agent_id: &str, held_epoch: u64) -> Vec<InDoubtRun> {
        let start = (agent_id.to_owned(), String::new());
        self.pendings
            .range(start..)
            .take_while(|((agent, _), _)| agent == agent_id)
            .map(|(_, run)| run)
            .filter(|run| run.epoch < held_epoch)
            .cloned()
            .collect()
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
    validate_id(IdKind::Run, run_id)?;
    if keeper.device_id() != ledger.device_id() {
        return Err(DispatchError::DeviceMismatch {
            keeper: keeper.device_id().to_owned(),
            ledger: ledger.device_id().to_owned(),
        });
    }
    let agent_id = keeper.agent_id();
    let Some(guard) = keeper.guard() else {
        return Ok(DispatchOutcome::NotHeld {
            claimed_epoch: keeper.epoch(),
        });
    };
    let epoch = guard.epoch();
    if let Some(committed) = ledger.state().committed_run(agent_id, run_id) {
        return Ok(DispatchOutcome::AlreadyCommitted {
            committed_op_id: committed.op_id,
        });
    }
    let fencing_epoch = ledger.state().fencing_epoch(agent_id);
    if epoch < fencing_epoch {
        return Err(DispatchError::BelowFencingEpoch {
            agent_id: agent_id.to_owned(),
            epoch,
            fencing_epoch,
        });
    }
    let intent = |status| Intent::new(run_id, agent_id, epoch, status);
    ledger.record(&intent(IntentStatus::Pending))?;
    ledger.flush()?;
    let refuse = |ledger: &mut Ledger| -> Result<(), DispatchError> {
        ledger.record(&intent(IntentStatus::Failed))?;
        if let Err(error) = ledger.flush() {
            tracing::warn!(%error, run_id, "could not push a failed intent; it stays queued");
        }
        Ok(())
    };
    let decision = match check_dispatch(
        keeper.coordinator(),
        ledger.state(),
        agent_id,
        run_id,
        keeper.device_id(),
        epoch,
    ) {
        Ok(decision) => decision,
        Err(error) => {
            refuse(ledger)?;
            return Err(error.into());
        }
    };
    tracing::debug!(agent_id, run_id, epoch, ?decision, "fence decision");
    let outcome = match decision {
        FenceDecision::Proceed => None,
        FenceDecision::AlreadyCommitted { committed_op_id } => {
            Some(DispatchOutcome::AlreadyCommitted { committed_op_id })
        }
        FenceDecision::StaleEpoch {
            claimed_epoch,
            current_epoch,
            current_holder,
        } => Some(DispatchOutcome::StaleEpoch {
            claimed_epoch,
            current_epoch,
            current_holder,
        }),
        FenceDecision::NotHeld { claimed_epoch } => Some(DispatchOutcome::NotHeld { claimed_epoch }),
    };
    if let Some(outcome) = outcome {
        tracing::info!(agent_id, run_id, epoch, "the fence refused the run");
        refuse(ledger)?;
        return Ok(outcome);
    }
    let token = FencingToken {
        agent_id: agent_id.to_owned(),
        run_id: run_id.to_owned(),
        epoch,
    };
    let result = effect(&token);
    let status = if result.is_ok() {
        IntentStatus::Committed
    } else {
        IntentStatus::Failed
    };
    ledger.record(&intent(status))?;
    if let Err(error) = ledger.flush() {
        tracing::warn!(%error, run_id, "could not push the outcome; it stays queued for the next sync");
    }
    tracing::info!(
        agent_id,
        run_id,
        epoch,
        status = status.as_str(),
        "run dispatched"
    );
    drop(guard);
    Ok(DispatchOutcome::Executed { epoch, result })
}

/// A token was older than one the resource has seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fencing token: epoch {epoch} of {agent_id:?}, but the resource has seen epoch {highest_epoch}"
)]
pub struct StaleToken {
    /// The agent.
    pub agent_id: String,
    /// The token's epoch.
    pub epoch: u64,
    /// The highest epoch the resource has seen for the agent.
    pub highest_epoch: u64,
}

/// A resource that checks fencing tokens, as a cooperating service does: it remembers the highest
/// epoch it has seen per agent and rejects any lower one. For tests and examples; a real service
/// does the same check in its own storage, atomically with the write.
#[derive(Debug)]
pub struct FencedResource<T> {
    inner: Mutex<ResourceState<T>>,
}

#[derive(Debug)]
struct ResourceState<T> {
    highest_epoch: BTreeMap<String, u64>,
    applied: Vec<(FencingToken, T)>,
}

impl<T> Default for FencedResource<T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(ResourceState {
                highest_epoch: BTreeMap::new(),
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

    /// Applies `effect` under `token`, unless a higher epoch of its agent was seen before.
    ///
    /// # Errors
    /// [`StaleToken`]: nothing applied.
    pub fn apply(&self, token: &FencingToken, effect: T) -> Result<(), StaleToken> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let highest = inner.highest_epoch.entry(token.agent_id.clone()).or_insert(0);
        if token.epoch < *highest {
            return Err(StaleToken {
                agent_id: token.agent_id.clone(),
                epoch: token.epoch,
                highest_epoch: *highest,
            });
        }
        *highest = token.epoch;
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
}
