//! Guarded dispatch: run one side effect under the whole protocol ([`dispatch`]), the site's
//! [`Ledger`] it writes to, the runs a new holder finds in doubt ([`Ledger::in_doubt`]), and a
//! [`FencedResource`](crate::resource::FencedResource) that checks fencing tokens the way a cooperating service does.
//!
//! [`dispatch`] for `(agent, run_id)`:
//!
//! 1. takes a [`WorkGuard`](crate::keeper::WorkGuard) from the keeper (else `NotHeld`), so that a
//!    shutdown waits for the effect;
//! 2. refuses a run the oracle already has (`AlreadyCommitted`: nothing is written);
//! 3. refuses to write below the agent's known fencing epoch (an error: such a `pending` would be
//!    fenced on arrival, and the effect would run unrecorded), and refuses while the ledger lacks
//!    records that the agent's earlier holders published (`LedgerBehind`, rule H3: a run they
//!    began or finished would look new; sync and try again);
//! 4. appends `pending` at the held epoch and pushes it to the relay **before** the effect, so that
//!    every other site can see the attempt even if this one dies mid-effect; if another writer of
//!    this device (a thread or process sharing the device id) appended a `pending` of the same run
//!    since this ledger last looked, the first one in the log runs and this call returns
//!    `ConcurrentAttempt`;
//! 5. the fence (rule D1): the oracle again, then the coordinator, by publishing what the device
//!    has pushed, the `pending` included (rule H2: only the holder at its epoch can publish, so
//!    this is "am I still the holder at epoch N?", and a successor will wait for the `pending`);
//!    a refusal records `failed` and returns the verdict ([`check_dispatch`](crate::fence::check_dispatch) names the holder),
//!    without running the effect;
//! 6. runs the effect with a [`FencingToken`] `{agent_id, run_id, epoch}` to pass to any resource
//!    that checks tokens, records `committed` or `failed` by its result, and has the keeper
//!    publish it after its next renewal or before its release.
//!
//! # What stays open, and in-doubt runs
//!
//! Between `Proceed` and the effect landing, the holder can pause, lose its lease, and a successor
//! can run the same run. The fence cannot close that window; a resource that rejects stale tokens
//! **and** runs it has already applied ([`FencedResource`](crate::resource::FencedResource) shows how; one of the two checks alone
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

mod begin;

use crate::id::RunId;
use crate::keeper::LeaseKeeper;
use crate::lease::{Intent, IntentStatus, LeaseError};
use crate::metrics;
use crate::oplog::{OpId, OpRecord};
use crate::relay::RelayError;

use crate::fence::FencingToken;
use crate::ledger::{InDoubtRun, Ledger, LedgerError, MissingRecords};

/// A [`dispatch`] or [`Ledger::begin`] error. What the ledger itself reports is a
/// [`LedgerError`], carried whole in [`DispatchError::Ledger`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The ledger failed (the relay, this device's log, the outbox) or refused (it is damaged:
    /// [`LedgerError::Damaged`]). When `dispatch` returns this before the effect, the effect did
    /// not run.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
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
    /// The coordinator granted an epoch that the ledger shows another device already held (its
    /// `pending` at that epoch is in the ledger): the coordinator lost or rolled back its state
    /// after that grant, and two holders would share one fencing token (rule L5). Nothing was
    /// written and nothing ran. Release the lease and acquire again with the ledger's epoch as the
    /// floor (the next grant is above it).
    #[error("epoch {epoch} of {agent_id:?} was already held by {other_device:?} (its pending is in the ledger): the coordinator granted it twice, after losing or rolling back its state")]
    EpochReused {
        /// The agent.
        agent_id: String,
        /// The epoch granted twice.
        epoch: u64,
        /// The device the ledger shows at that epoch.
        other_device: String,
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

impl From<RelayError> for DispatchError {
    fn from(error: RelayError) -> Self {
        DispatchError::Ledger(LedgerError::Relay(error))
    }
}

impl DispatchError {
    /// Whether trying again later may succeed: the relay or the coordinator failed in a way
    /// that may pass by itself ([`LedgerError::is_transient`], [`LeaseError::is_transient`]).
    pub fn is_transient(&self) -> bool {
        match self {
            DispatchError::Ledger(error) => error.is_transient(),
            DispatchError::Lease(error) => error.is_transient(),
            _ => false,
        }
    }
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
    /// This site's ledger has not received every record that the agent's earlier holders
    /// published (rule H3): a run they began or finished could look new here. Nothing ran,
    /// nothing was written. [`Ledger::sync`] (the relay is behind: a synced folder still
    /// copying, another host's ledger not shared at all) and try again.
    LedgerBehind {
        /// What is missing, per device.
        missing: Vec<MissingRecords>,
    },
}

impl<T, E> DispatchOutcome<T, E> {
    /// A name for the outcome, as metrics, logs and `fencepost run --json` label it:
    /// `succeeded`, `failed` (the effect ran), `interrupted` (it ran and its outcome is unknown:
    /// the run is in doubt), or the refusal: `already_committed`, `stale_epoch`, `not_held`,
    /// `in_doubt`, `concurrent_attempt`, `ledger_behind`.
    pub fn kind(&self) -> &'static str {
        match self {
            DispatchOutcome::Executed { result: Ok(_), .. } => "succeeded",
            DispatchOutcome::Executed { result: Err(_), .. } => "failed",
            DispatchOutcome::Interrupted { .. } => "interrupted",
            DispatchOutcome::AlreadyCommitted { .. } => "already_committed",
            DispatchOutcome::StaleEpoch { .. } => "stale_epoch",
            DispatchOutcome::NotHeld { .. } => "not_held",
            DispatchOutcome::InDoubt { .. } => "in_doubt",
            DispatchOutcome::ConcurrentAttempt { .. } => "concurrent_attempt",
            DispatchOutcome::LedgerBehind { .. } => "ledger_behind",
        }
    }

    /// Whether the effect ran (to the end, or until it was interrupted).
    pub fn executed(&self) -> bool {
        matches!(
            self,
            DispatchOutcome::Executed { .. } | DispatchOutcome::Interrupted { .. }
        )
    }
}

/// Runs `effect` for `run_id` of the keeper's agent under the whole protocol; see the
/// [module docs](self).
///
/// # Errors
/// * [`DispatchError::DeviceMismatch`]: nothing written.
/// * [`DispatchError::BelowFencingEpoch`]: nothing written, nothing ran.
/// * [`DispatchError::Ledger`] ([`LedgerError::Relay`]) before the effect: the `pending` could
///   not be pushed, so the effect did not run (the `pending` stays queued); a damaged ledger
///   ([`LedgerError::Damaged`]): nothing written, nothing ran.
/// * [`DispatchError::Lease`]: the coordinator failed during the fence; `failed` was recorded and
///   the effect did not run.
///
/// A relay failure *after* the effect is not an error: the outcome is `Executed` and the record
/// stays queued ([`Ledger::unsent`]) for the next [`Ledger::sync`].
///
/// ```
/// use std::sync::Arc;
/// use fencepost::clock::system_clock;
/// use fencepost::dispatch::{dispatch, DispatchOutcome};
/// use fencepost::ledger::Ledger;
/// use fencepost::keeper::{KeeperConfig, LeaseKeeper};
/// use fencepost::lease::InMemoryLeaseCoordinator;
/// use fencepost::relay::InMemoryRelay;
/// use fencepost::id::RunId;
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
///     let run_id = RunId::derive("milo", "send the daily report", day)?;
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
    run_id: &RunId,
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
    run_id: &RunId,
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
    run_id: &RunId,
    options: DispatchOptions,
    effect: impl FnOnce(&FencingToken) -> EffectOutcome<T, E>,
) -> Result<DispatchOutcome<T, E>, DispatchError> {
    let dispatched = dispatch_effect_uncounted(keeper, ledger, run_id, options, effect);
    let kind = match &dispatched {
        Ok(outcome) => outcome.kind(),
        Err(_) => "error",
    };
    count_dispatch(keeper.agent_id(), kind);
    dispatched
}

/// [`dispatch_effect`], without counting its outcome.
fn dispatch_effect_uncounted<T, E>(
    keeper: &LeaseKeeper,
    ledger: &mut Ledger,
    run_id: &RunId,
    options: DispatchOptions,
    effect: impl FnOnce(&FencingToken) -> EffectOutcome<T, E>,
) -> Result<DispatchOutcome<T, E>, DispatchError> {
    let (guard, permit) = match begin_guarded(keeper, ledger, run_id, options) {
        Ok(begun) => begun,
        Err(refusal) => return refusal.into_outcome(),
    };
    let outcome = effect(permit.token());
    Ok(end_effect(keeper, ledger, guard, permit, outcome))
}

/// The first half of a dispatch by a keeper: a guard of its lease (so that a shutdown waits for
/// the effect) and [`Ledger::begin`].
pub(crate) fn begin_guarded<'keeper>(
    keeper: &'keeper LeaseKeeper,
    ledger: &mut Ledger,
    run_id: &RunId,
    options: DispatchOptions,
) -> Result<(crate::keeper::WorkGuard<'keeper>, Permit), Refusal> {
    if keeper.device_id() != ledger.device_id() {
        return Err(DispatchError::DeviceMismatch {
            keeper: keeper.device_id().to_owned(),
            ledger: ledger.device_id().to_owned(),
        }
        .into());
    }
    let Some(guard) = keeper.guard() else {
        return Err(Refusal::NotHeld {
            claimed_epoch: keeper.epoch(),
        });
    };
    let permit = ledger.begin(&guard, run_id, options)?;
    Ok((guard, permit))
}

/// The second half: the effect's outcome recorded (none when it is unknown: in doubt), and
/// handed to the keeper to publish (rule H2).
pub(crate) fn end_effect<T, E>(
    keeper: &LeaseKeeper,
    ledger: &mut Ledger,
    guard: crate::keeper::WorkGuard<'_>,
    permit: Permit,
    outcome: EffectOutcome<T, E>,
) -> DispatchOutcome<T, E> {
    let epoch = permit.token().epoch;
    let (outcome, result) = match outcome {
        EffectOutcome::Succeeded(value) => (RunOutcome::Committed, Ok(value)),
        EffectOutcome::Failed(error) => (RunOutcome::Failed, Err(error)),
        EffectOutcome::Unknown(error) => {
            permit.abandon();
            drop(guard);
            return DispatchOutcome::Interrupted { epoch, error };
        }
    };
    let run_id = permit.token().run_id.clone();
    if let Err(error) = permit.finish(ledger, outcome) {
        tracing::warn!(%error, run_id, "could not store the outcome; it stays queued for the next sync");
    }
    // Published at the next renewal or at the release (rule H2).
    keeper.pushed(&ledger.pushed());
    drop(guard);
    DispatchOutcome::Executed { epoch, result }
}

/// Counts a dispatch's outcome (`kind`: [`DispatchOutcome::kind`], or `error`), and a run it
/// left in doubt, as [`dispatch_effect`] does.
pub(crate) fn count_dispatch(agent_id: &str, kind: &'static str) {
    metrics::count(metrics::DISPATCHES, agent_id, "outcome", kind);
    if kind == "interrupted" {
        metrics::count_agent(metrics::RUNS_LEFT_IN_DOUBT, agent_id);
    }
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
    /// As [`DispatchOutcome::LedgerBehind`]: nothing written.
    LedgerBehind {
        /// What is missing, per device.
        missing: Vec<MissingRecords>,
    },
    /// As the errors of [`dispatch`].
    Error(DispatchError),
}

impl From<DispatchError> for Refusal {
    fn from(error: DispatchError) -> Self {
        Refusal::Error(error)
    }
}

impl From<LedgerError> for Refusal {
    fn from(error: LedgerError) -> Self {
        Refusal::Error(error.into())
    }
}

impl From<LeaseError> for Refusal {
    fn from(error: LeaseError) -> Self {
        Refusal::Error(error.into())
    }
}

impl Refusal {
    /// A name for the refusal, as metrics and logs label it: `already_committed`, `stale_epoch`,
    /// `not_held`, `in_doubt`, `concurrent_attempt`, `ledger_behind` or `error`.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::AlreadyCommitted { .. } => "already_committed",
            Refusal::StaleEpoch { .. } => "stale_epoch",
            Refusal::NotHeld { .. } => "not_held",
            Refusal::InDoubt { .. } => "in_doubt",
            Refusal::ConcurrentAttempt { .. } => "concurrent_attempt",
            Refusal::LedgerBehind { .. } => "ledger_behind",
            Refusal::Error(_) => "error",
        }
    }

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
            Refusal::LedgerBehind { missing } => DispatchOutcome::LedgerBehind { missing },
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

impl From<RunOutcome> for IntentStatus {
    fn from(outcome: RunOutcome) -> Self {
        match outcome {
            RunOutcome::Committed => IntentStatus::Committed,
            RunOutcome::Failed => IntentStatus::Failed,
        }
    }
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
    /// [`LedgerError::Relay`] or [`LedgerError::Log`] when the record could not be stored: it
    /// stays queued and is stored by the ledger's next flush, sync or record.
    pub fn finish(self, ledger: &mut Ledger, outcome: RunOutcome) -> Result<OpRecord, DispatchError> {
        if ledger.device_id() != self.device_id {
            return Err(DispatchError::DeviceMismatch {
                keeper: self.device_id,
                ledger: ledger.device_id().to_owned(),
            });
        }
        let status = IntentStatus::from(outcome);
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
        Ok(stored?)
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
