//! Run one occurrence of a job once across sites: [`run_once`], the driver of the
//! [run session](crate::session) that programs call (and `fencepost run` calls).
//!
//! ```
//! use std::sync::Arc;
//! use fencepost::clock::system_clock;
//! use fencepost::ledger::Ledger;
//! use fencepost::lease::InMemoryLeaseCoordinator;
//! use fencepost::relay::InMemoryRelay;
//! use fencepost::run::{run_once, Occurrence, Outcome, RunOptions};
//!
//! // What every site shares: a coordinator and a relay.
//! let coordinator = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
//! let relay = Arc::new(InMemoryRelay::new());
//! let mut laptop = Ledger::open("laptop", system_clock(), relay.clone())?;
//! let mut phone = Ledger::open("phone", system_clock(), relay.clone())?;
//!
//! let report = Occurrence::new("milo", "send the daily report", "2026-12-06")?;
//! let options = RunOptions::new(30_000);
//! let sent = run_once(coordinator.clone(), &mut laptop, &report, &options, |context| {
//!     // Send the report, passing the fencing token to a service that checks it.
//!     Ok::<_, std::io::Error>(context.token().epoch)
//! })?;
//! assert!(matches!(sent, Outcome::Committed { epoch, .. } if epoch == 1));
//!
//! // The same occurrence on another site: the oracle refuses it, nothing runs.
//! let again = run_once(coordinator, &mut phone, &report, &options, |_| Ok::<_, std::io::Error>(0))?;
//! assert!(matches!(again, Outcome::AlreadyCommitted { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use crate::dispatch::{DispatchError, EffectOutcome};
use crate::fence::FencingToken;
use crate::id::{AgentId, Claim, Epoch, EpochError, IdError, RunId};
use crate::keeper::{KeeperClock, KeeperConfig, KeeperError, LeaseKeeper, Shutdown};
use crate::lease::{LeaseCoordinator, LeaseError};
use crate::ledger::{InDoubtRun, Ledger, LedgerError, MissingRecords, StaleGrant};
use crate::oplog::OpId;
use crate::run_id::RunIdError;

use crate::session::{SessionEnd, Stage};

/// One occurrence of a job: the agent that runs it and its run id, which every site that sees
/// the occurrence computes alike ([`RunId::derive`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    agent_id: AgentId,
    run_id: RunId,
}

/// Why an [`Occurrence`] could not be named.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OccurrenceError {
    /// An id is not valid (rule L8).
    #[error(transparent)]
    Id(#[from] IdError),
    /// The run id could not be derived.
    #[error(transparent)]
    RunId(#[from] RunIdError),
}

impl Occurrence {
    /// The occurrence `salt` (a date, a ticket number) of what `agent_id` does (`intent`).
    ///
    /// # Errors
    /// An invalid agent id, or parts the run id cannot be derived from.
    pub fn new(agent_id: &str, intent: &str, salt: &str) -> Result<Self, OccurrenceError> {
        let agent_id = AgentId::new(agent_id)?;
        let run_id = RunId::derive(&agent_id, intent, salt)?;
        Ok(Self { agent_id, run_id })
    }

    /// The occurrence named `run_id` of `agent_id`.
    ///
    /// # Errors
    /// An invalid id.
    pub fn of_run(agent_id: &str, run_id: &str) -> Result<Self, OccurrenceError> {
        Ok(Self {
            agent_id: AgentId::new(agent_id)?,
            run_id: RunId::new(run_id)?,
        })
    }

    /// The agent.
    pub fn agent_id(&self) -> &AgentId {
        &self.agent_id
    }

    /// The run id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }
}

/// A test that says the caller wants [`run_once`] to stop (a signal came, the program shuts down).
pub type StopWhen = Arc<dyn Fn() -> bool + Send + Sync>;

/// How [`run_once`] runs an occurrence.
#[derive(Clone)]
pub struct RunOptions {
    keeper: KeeperConfig,
    wait_ms: u64,
    poll_ms: u64,
    retry_in_doubt: bool,
    clock: KeeperClock,
    stop: Option<StopWhen>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RunOptions")
            .field("keeper", &self.keeper)
            .field("wait_ms", &self.wait_ms)
            .field("poll_ms", &self.poll_ms)
            .field("retry_in_doubt", &self.retry_in_doubt)
            .field("stop", &self.stop.is_some())
            .finish_non_exhaustive()
    }
}

impl RunOptions {
    /// A lease of `ttl_ms`, renewed in the background while the effect runs; a site waiting for
    /// another holder tries at least every second; no wait (one attempt); a run in doubt is not
    /// run again.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            keeper: KeeperConfig {
                acquire_every_ms: (ttl_ms / 4).clamp(1, 1_000),
                ..KeeperConfig::new(ttl_ms)
            },
            wait_ms: 0,
            poll_ms: 200,
            retry_in_doubt: false,
            clock: KeeperClock::monotonic(),
            stop: None,
        }
    }

    /// The keeper's timings.
    pub fn keeper(mut self, config: KeeperConfig) -> Self {
        self.keeper = config;
        self
    }

    /// How long, all told, to wait for another site's lease to end and then for this site's
    /// ledger to receive what the earlier holders published (rule H3).
    pub fn wait_ms(mut self, wait_ms: u64) -> Self {
        self.wait_ms = wait_ms;
        self
    }

    /// How often the ledger is synced while the run waits for it (200 ms by default).
    pub fn poll_ms(mut self, poll_ms: u64) -> Self {
        self.poll_ms = poll_ms.max(1);
        self
    }

    /// Run an occurrence that is in doubt again (rule D2): after checking that its effect did not
    /// happen, or when running it twice is harmless.
    pub fn retry_in_doubt(mut self, retry: bool) -> Self {
        self.retry_in_doubt = retry;
        self
    }

    /// The clock of the keeper and of the waits (monotonic by default).
    pub fn clock(mut self, clock: KeeperClock) -> Self {
        self.clock = clock;
        self
    }

    /// Stop the run before its effect when `stop` says so ([`Outcome::Stopped`]): it is asked
    /// while waiting for the lease, right after the grant and while waiting for the ledger.
    pub fn stop_when(mut self, stop: StopWhen) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The keeper's timings.
    pub fn keeper_config(&self) -> KeeperConfig {
        self.keeper
    }
}

/// What the effect of [`run_once`] is given: the fencing token to pass to the resource, and the
/// lease's keeper (to stop when it is lost: [`LeaseKeeper::holds`], [`LeaseKeeper::wait_lost`]).
#[derive(Debug)]
pub struct EffectContext<'run> {
    token: &'run FencingToken,
    claim: &'run Claim,
    keeper: &'run LeaseKeeper,
}

impl EffectContext<'_> {
    /// The fencing token: agent, run id and epoch.
    pub fn token(&self) -> &FencingToken {
        self.token
    }

    /// Who holds the agent at which epoch: this device, at the token's epoch.
    pub fn claim(&self) -> &Claim {
        self.claim
    }

    /// The keeper of the lease the effect runs under.
    pub fn keeper(&self) -> &LeaseKeeper {
        self.keeper
    }

    /// Whether the lease still counts as held.
    pub fn holds(&self) -> bool {
        self.keeper.holds()
    }
}

/// How [`run_once`] ended: every end the CLI's `fencepost run` has an exit status for.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<T, E> {
    /// The effect ran and succeeded: `committed` was recorded (exit 0).
    Committed {
        /// The epoch it ran under.
        epoch: Epoch,
        /// What the effect returned.
        value: T,
    },
    /// The effect ran and failed: `failed` was recorded, so the next run runs it (exit 1).
    Failed {
        /// The epoch it ran under.
        epoch: Epoch,
        /// What the effect returned.
        error: E,
    },
    /// The effect started and nobody knows whether it happened ([`EffectOutcome::Unknown`]): no
    /// outcome was recorded, so the run is in doubt (rule D2; exit 1, or 6 when the lease was
    /// lost).
    Interrupted {
        /// The epoch it ran under.
        epoch: Epoch,
        /// What the effect returned.
        error: E,
    },
    /// The run committed already, on any site: nothing ran (exit 3).
    AlreadyCommitted {
        /// The commit record.
        committed_op_id: OpId,
        /// Whether the ledger knew before the lease was asked for (else the fence found it).
        before_lease: bool,
    },
    /// Another site held the lease for the whole wait: nothing ran (exit 4).
    Held {
        /// The holder.
        holder: String,
        /// Its epoch.
        epoch: u64,
        /// When its lease expires, in the coordinator's clock.
        expires_at_ms: u64,
        /// When the last attempt failed after the refusals (the coordinator away), how.
        last_error: Option<LeaseError>,
    },
    /// An earlier attempt started the run and recorded no outcome: nothing ran (exit 5).
    InDoubt {
        /// That attempt.
        run: InDoubtRun,
    },
    /// Another writer of this device id started the run just before: nothing ran (exit 5).
    ConcurrentAttempt {
        /// That attempt.
        run: InDoubtRun,
    },
    /// The lease was lost before the effect started: nothing ran (exit 6).
    LeaseLost {
        /// The epoch this site held.
        claimed_epoch: Epoch,
        /// The agent's epoch and holder, when the fence found another.
        current: Option<(u64, String)>,
    },
    /// This site's ledger still lacked what earlier holders published when the wait ran out
    /// (rule H3): nothing ran (exit 7).
    LedgerBehind {
        /// What is missing, per device.
        missing: Vec<MissingRecords>,
    },
    /// [`RunOptions::stop_when`] said stop before the effect: nothing ran, the lease (if held)
    /// was given back (exit 128 + the signal).
    Stopped {
        /// Where the run was.
        stage: Stage,
    },
}

impl<T, E> Outcome<T, E> {
    /// A name for the outcome, as metrics, logs and `fencepost run --json` label it (those of
    /// [`DispatchOutcome::kind`](crate::dispatch::DispatchOutcome::kind) where the fence was asked): `succeeded`, `failed`,
    /// `interrupted`, `already_committed`, `held`, `in_doubt`, `concurrent_attempt`,
    /// `stale_epoch` or `not_held` (the lease lost), `ledger_behind`, `stopped`.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Committed { .. } => "succeeded",
            Outcome::Failed { .. } => "failed",
            Outcome::Interrupted { .. } => "interrupted",
            Outcome::AlreadyCommitted { .. } => "already_committed",
            Outcome::Held { .. } => "held",
            Outcome::InDoubt { .. } => "in_doubt",
            Outcome::ConcurrentAttempt { .. } => "concurrent_attempt",
            Outcome::LeaseLost { current: Some(_), .. } => "stale_epoch",
            Outcome::LeaseLost { current: None, .. } => "not_held",
            Outcome::LedgerBehind { .. } => "ledger_behind",
            Outcome::Stopped { .. } => "stopped",
        }
    }

    /// Whether the effect ran (to the end, or until it was interrupted).
    pub fn executed(&self) -> bool {
        matches!(
            self,
            Outcome::Committed { .. } | Outcome::Failed { .. } | Outcome::Interrupted { .. }
        )
    }
}

/// Why [`run_once`] could not run the occurrence. Nothing ran, and the lease, if it was held,
/// was given back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The ledger failed, or refused because it is damaged ([`LedgerError::Damaged`]).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The dispatch failed or refused at the fence for another reason than the ledger (a
    /// [`DispatchError::Ledger`] is reported as [`RunError::Ledger`]).
    #[error(transparent)]
    Dispatch(DispatchError),
    /// The ledger could not be synced.
    #[error("cannot sync the ledger")]
    Sync(#[source] LedgerError),
    /// The lease could not be acquired (the coordinator failed, an invalid configuration).
    #[error("cannot acquire the lease of {agent_id}")]
    Acquire {
        /// The agent.
        agent_id: String,
        /// Why.
        #[source]
        source: KeeperError,
    },
    /// What the agent's earlier holders published could not be read within the wait.
    #[error("cannot read what the previous holders of {agent_id} published")]
    Published {
        /// The agent.
        agent_id: String,
        /// Why.
        #[source]
        source: LeaseError,
    },
    /// The coordinator granted epochs the ledger has seen, again and again (it lost or rolled
    /// back its state, and keeps doing so).
    #[error("the coordinator granted epoch {epoch} of {agent_id}, which this ledger has seen, {attempts} times in a row", attempts = crate::session::FRESH_GRANT_ATTEMPTS)]
    StaleGrants {
        /// The agent.
        agent_id: String,
        /// The last grant.
        epoch: Epoch,
        /// Why it was stale.
        why: StaleGrant,
    },
    /// The coordinator granted an epoch no coordinator mints: nothing ran, the lease was given
    /// back.
    #[error("the coordinator granted {0}")]
    Epoch(#[from] EpochError),
    /// The run session asked its driver for a step the driver did not expect (a bug in
    /// fencepost, reported rather than a panic).
    #[error("the run session asked for {step}, which its driver did not expect (a bug in fencepost)")]
    Unexpected {
        /// What it asked for.
        step: &'static str,
    },
}

impl From<DispatchError> for RunError {
    fn from(error: DispatchError) -> Self {
        match error {
            DispatchError::Ledger(error) => RunError::Ledger(error),
            other => RunError::Dispatch(other),
        }
    }
}

impl RunError {
    /// Whether trying again later may succeed (a database restarting, a lost connection).
    pub fn is_transient(&self) -> bool {
        match self {
            RunError::Ledger(error) | RunError::Sync(error) => error.is_transient(),
            RunError::Acquire {
                source: KeeperError::Lease(error),
                ..
            }
            | RunError::Published { source: error, .. } => error.is_transient(),
            _ => false,
        }
    }
}

/// What a caller of [`run_once_with`] is told as the run goes (the CLI reports, records and
/// prints from them). Every method does nothing by default.
pub trait RunHooks {
    /// The lease is being asked for.
    fn acquiring(&mut self) {}
    /// The coordinator granted `epoch`, which the ledger has seen (`why`): it is given back and
    /// acquired again above it.
    fn stale_grant(&mut self, epoch: Epoch, why: &StaleGrant) {
        let _ = (epoch, why);
    }
    /// The coordinator granted the lease at `keeper.epoch()`; whether the grant is fresh is
    /// checked next (the ledger synced first).
    fn granted(&mut self, keeper: &LeaseKeeper) {
        let _ = keeper;
    }
    /// The acquisition ended (a fresh grant, or none).
    fn acquire_ended(&mut self) {}
    /// A fresh grant: the lease is held at `keeper.epoch()` for this run.
    fn holding(&mut self, keeper: &LeaseKeeper) {
        let _ = keeper;
    }
    /// The run waits for the ledger to receive `missing` (said once).
    fn waiting_for_ledger(&mut self, missing: &[MissingRecords]) {
        let _ = missing;
    }
    /// The wait for the ledger ended (it has everything, or the wait ran out).
    fn ledger_wait_ended(&mut self) {}
    /// The fence is asked: the run's `pending` is about to be stored.
    fn dispatching(&mut self) {}
    /// Just before the lease is given back, on the way to `end` (records of the run may wait in
    /// `ledger` to be stored: [`Ledger::unsent`]).
    fn before_release(&mut self, ledger: &mut Ledger, end: SessionEnd) {
        let _ = (ledger, end);
    }
    /// How the release went (a failed one ends by the lease's TTL).
    fn released(&mut self, shutdown: &Result<Shutdown, KeeperError>) {
        let _ = shutdown;
    }
}

/// The hooks that do nothing.
struct NoHooks;

impl RunHooks for NoHooks {}

/// Runs `occurrence` once across every site that shares `coordinator` and the ledger's relay:
/// the oracle, the lease above the ledger's epoch (given back and acquired again when the
/// coordinator forgot its state and grants an epoch the ledger has seen), the wait for the
/// ledger to receive what earlier holders published (rule H3), the fence, the effect under the
/// fencing token, its outcome, and the release (rule H2). See [`crate::session`] for the steps.
///
/// # Errors
/// A [`RunError`]; nothing ran.
pub fn run_once<T, E>(
    coordinator: Arc<dyn LeaseCoordinator>,
    ledger: &mut Ledger,
    occurrence: &Occurrence,
    options: &RunOptions,
    effect: impl FnOnce(&EffectContext<'_>) -> Result<T, E>,
) -> Result<Outcome<T, E>, RunError> {
    run_once_with(
        coordinator,
        ledger,
        occurrence,
        options,
        &mut NoHooks,
        |context| match effect(context) {
            Ok(value) => EffectOutcome::Succeeded(value),
            Err(error) => EffectOutcome::Failed(error),
        },
    )
}

/// [`run_once`] for an effect that may not know whether it happened ([`EffectOutcome`]), told
/// of the run's steps ([`RunHooks`]).
///
/// # Errors
/// As [`run_once`].
pub fn run_once_with<T, E>(
    coordinator: Arc<dyn LeaseCoordinator>,
    ledger: &mut Ledger,
    occurrence: &Occurrence,
    options: &RunOptions,
    hooks: &mut dyn RunHooks,
    effect: impl FnOnce(&EffectContext<'_>) -> EffectOutcome<T, E>,
) -> Result<Outcome<T, E>, RunError> {
    driver::run(coordinator, ledger, occurrence, options, hooks, effect)
}

mod driver;
