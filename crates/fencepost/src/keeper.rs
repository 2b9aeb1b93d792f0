//! [`LeaseKeeper`]: holds an agent's lease for as long as the process wants it, renewing it in the
//! background, and says once, clearly, when it is lost.
//!
//! * **Timing** ([`KeeperConfig`]): the keeper renews every `renew_every_ms`; a transient backend
//!   error is retried every `retry_every_ms`, until `renew_deadline_ms` have passed since the last
//!   successful renewal. Only then is the lease treated as lost; a `Lost` verdict is lost at once.
//!   `ttl_ms > renew_deadline_ms ≥ renew_every_ms + retry_every_ms`, so the keeper gives the lease up
//!   before the coordinator can grant it to anyone else, with room for at least one retry.
//! * **Holding** ([`LeaseKeeper::holds`]) is judged by the keeper's own monotonic clock: held
//!   while less than `renew_deadline_ms` has passed since the last successful renewal was *sent*.
//!   The coordinator's expiry is never trusted beyond that.
//! * **Loss** is delivered exactly once: to the `on_lost` callback, and to
//!   [`LeaseKeeper::wait_lost`] / [`LeaseKeeper::loss`].
//! * **Guarded work** ([`LeaseKeeper::guard`]): work done under the lease holds a guard;
//!   [`LeaseKeeper::shutdown`] waits for every guard, then releases, so a successor acquires at once
//!   instead of waiting out the TTL.
//! * **The epoch floor** (rule L5): before its first acquire, the keeper raises the coordinator's
//!   floor to the highest epoch the caller's ledger has seen, so a coordinator that lost its state
//!   cannot grant an epoch that was already used.
//!
//! A keeper is for liveness. It does not make an effect safe: pass its epoch to the dispatch fence
//! ([`crate::dispatch::dispatch`] does).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{monotonic_clock, ManualClock, WallClock};
use crate::id::{validate_id, IdKind};
use crate::lease::{validate_ttl, LeaseCoordinator, LeaseError, MAX_EPOCH_FLOOR};

/// The timing of a [`LeaseKeeper`], in milliseconds of the keeper's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeeperConfig {
    /// The TTL asked for on every acquire and renewal.
    pub ttl_ms: u64,
    /// How long after a successful renewal the next one is sent.
    pub renew_every_ms: u64,
    /// How long after the last successful renewal (sent) the lease counts as lost if no renewal
    /// has succeeded since. Below `ttl_ms`: the keeper stops before the lease can be taken.
    pub renew_deadline_ms: u64,
    /// How long after a failed renewal the next try is sent.
    pub retry_every_ms: u64,
    /// How often a keeper that waits to acquire tries again.
    pub acquire_every_ms: u64,
}

impl KeeperConfig {
    /// A config for `ttl_ms`: renew every third of it, give up at two thirds, retry every twelfth,
    /// try to acquire every quarter.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            renew_every_ms: ttl_ms / 3,
            renew_deadline_ms: ttl_ms / 3 * 2,
            retry_every_ms: (ttl_ms / 12).max(1),
            acquire_every_ms: (ttl_ms / 4).max(1),
        }
    }

    /// Checks `ttl_ms > renew_deadline_ms ≥ renew_every_ms + retry_every_ms`, every interval at
    /// least 1 ms, and a TTL the coordinators accept.
    ///
    /// # Errors
    /// [`KeeperError::InvalidConfig`], saying which condition fails.
    pub fn validate(&self) -> Result<(), KeeperError> {
        let invalid = |reason: String| Err(KeeperError::InvalidConfig(reason));
        if validate_ttl(self.ttl_ms).is_err() {
            return invalid(format!(
                "ttl_ms {} is not a TTL a coordinator accepts",
                self.ttl_ms
            ));
        }
        for (name, value) in [
            ("renew_every_ms", self.renew_every_ms),
            ("retry_every_ms", self.retry_every_ms),
            ("acquire_every_ms", self.acquire_every_ms),
        ] {
            if value == 0 {
                return invalid(format!("{name} must be at least 1"));
            }
        }
        if self.renew_deadline_ms >= self.ttl_ms {
            return invalid(format!(
                "renew_deadline_ms {} must be below ttl_ms {}: the keeper must give the lease up before it can be taken",
                self.renew_deadline_ms, self.ttl_ms
            ));
        }
        let first_retry = self.renew_every_ms.saturating_add(self.retry_every_ms);
        if first_retry > self.renew_deadline_ms {
            return invalid(format!(
                "renew_every_ms {} + retry_every_ms {} must not exceed renew_deadline_ms {}: no room for one retry",
                self.renew_every_ms, self.retry_every_ms, self.renew_deadline_ms
            ));
        }
        Ok(())
    }
}

/// The clock a [`LeaseKeeper`] measures its own time by.
#[derive(Clone)]
pub struct KeeperClock {
    now_ms: WallClock,
    real_time: bool,
}

impl std::fmt::Debug for KeeperClock {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("KeeperClock")
            .field("real_time", &self.real_time)
            .finish_non_exhaustive()
    }
}

impl KeeperClock {
    /// The process's monotonic clock ([`monotonic_clock`]): what a keeper uses in production.
    pub fn monotonic() -> Self {
        Self {
            now_ms: monotonic_clock(),
            real_time: true,
        }
    }

    /// A [`ManualClock`] that a test or the simulator moves. The keeper then polls it every real
    /// millisecond while it waits, so it reacts at once when the clock is moved.
    pub fn manual(clock: &ManualClock) -> Self {
        Self {
            now_ms: clock.wall_clock(),
            real_time: false,
        }
    }

    /// The clock's time in milliseconds.
    pub fn now_ms(&self) -> u64 {
        (self.now_ms)()
    }

    /// How long to block for, in real time, to wait `remaining_ms` of this clock.
    fn slice(&self, remaining_ms: u64) -> Duration {
        if self.real_time {
            Duration::from_millis(remaining_ms.max(1))
        } else {
            Duration::from_millis(1)
        }
    }
}

/// Why a [`LeaseKeeper`] lost its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The coordinator said `Lost`: another site holds the agent at `current_epoch`, or the lease
    /// was released by someone else.
    Stolen {
        /// The agent's epoch when the keeper learned it.
        current_epoch: u64,
    },
    /// No renewal succeeded within `renew_deadline_ms` of the last successful one.
    DeadlinePassed {
        /// The last renewal error, if a renewal failed (none when the renewals never returned in
        /// time).
        last_error: Option<String>,
    },
    /// The coordinator refused a renewal or release with an error that retrying cannot fix.
    Refused {
        /// The error.
        error: String,
    },
}

/// The one report of a lost lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The agent.
    pub agent_id: String,
    /// The epoch that was lost.
    pub epoch: u64,
    /// Why.
    pub reason: LossReason,
}

/// A [`LeaseKeeper`] error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeeperError {
    /// The config breaks a rule of [`KeeperConfig::validate`].
    #[error("invalid keeper config: {0}")]
    InvalidConfig(String),
    /// The coordinator did not grant the lease (`Held`, when not waiting or when the wait ran
    /// out), or failed (raising the floor, acquiring, releasing).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The wait ran out: the coordinator refused the lease during the wait (`held`, the last such
    /// refusal), and the last attempt then failed (`last_error`). The lease was not obtained.
    #[error("{held}; the last attempt then failed: {last_error}")]
    HeldThenFailed {
        /// The last `Held` refusal during the wait.
        held: Box<LeaseError>,
        /// The error of the last attempt.
        last_error: Box<LeaseError>,
    },
}

/// How a [`LeaseKeeper::shutdown`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Shutdown {
    /// The lease was released: a successor can acquire at once.
    Released {
        /// The epoch that was released.
        epoch: u64,
    },
    /// The lease had been lost before (or the release found it lost): nothing to release.
    Lost(Loss),
    /// An earlier `shutdown` already ran.
    AlreadyShutDown,
}

/// The callback that receives the one [`Loss`].
type OnLost = Box<dyn FnOnce(&Loss) + Send>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Holding,
    Lost(Loss),
    ShuttingDown,
    ShutDown,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    epoch: u64,
    /// The coordinator's expiry after the last successful acquire or renewal.
    expires_at_ms: u64,
    /// The keeper clock when the last successful acquire or renewal was sent.
    renewed_at_ms: u64,
    /// When to send the next renewal (keeper clock).
    next_attempt_ms: u64,
    last_error: Option<String>,
    guards: usize,
}

struct Shared {
    coordinator: Arc<dyn LeaseCoordinator>,
    agent_id: String,
    device_id: String,
    config: KeeperConfig,
    clock: KeeperClock,
    state: Mutex<State>,
    changed: Condvar,
    on_lost: Mutex<Option<OnLost>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>, remaining_ms: u64) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(state, self.clock.slice(remaining_ms))
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    fn holds(&self, state: &State) -> bool {
        state.phase == Phase::Holding
            && self.clock.now_ms() < state.renewed_at_ms.saturating_add(self.config.renew_deadline_ms)
    }

    /// Moves to `Lost` and delivers the loss, unless a loss was already delivered. Takes the state
    /// lock's guard and releases it before the callback runs.
    fn lose(&self, mut state: MutexGuard<'_, State>, reason: LossReason) {
        if matches!(state.phase, Phase::Lost(_)) {
            return;
        }
        let loss = Loss {
            agent_id: self.agent_id.clone(),
            epoch: state.epoch,
            reason,
        };
        state.phase = Phase::Lost(loss.clone());
        drop(state);
        // Logged without the lock: a slow log sink must not hold up `holds()`.
        tracing::warn!(agent_id = %loss.agent_id, epoch = loss.epoch, reason = ?loss.reason, "lease lost");
        let callback = self.on_lost.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(callback) = callback {
            callback(&loss);
        }
        self.changed.notify_all();
    }

    /// The renewal loop of the background thread.
    fn run(&self) {
        let mut state = self.lock();
        loop {
            if state.phase != Phase::Holding {
                return;
            }
            let now = self.clock.now_ms();
            let deadline = state.renewed_at_ms.saturating_add(self.config.renew_deadline_ms);
            if now >= deadline {
                let last_error = state.last_error.clone();
                self.lose(state, LossReason::DeadlinePassed { last_error });
                return;
            }
            let due = state.next_attempt_ms.min(deadline);
            if now < due {
                state = self.wait(state, due - now);
                continue;
            }
            let epoch = state.epoch;
            drop(state);
            let sent_ms = self.clock.now_ms();
            let outcome = self
                .coordinator
                .renew(&self.agent_id, &self.device_id, epoch, self.config.ttl_ms);
            state = self.lock();
            if state.phase != Phase::Holding {
                return; // shut down meanwhile; the shutdown's release settles the lease
            }
            let now = self.clock.now_ms();
            match outcome {
                Err(LeaseError::Lost { current_epoch, .. }) => {
                    self.lose(state, LossReason::Stolen { current_epoch });
                    return;
                }
                // A renewal that answers after the deadline comes too late: `holds` said no.
                _ if now >= deadline => {}
                Ok(lease) => {
                    tracing::debug!(agent_id = %self.agent_id, epoch, expires_at_ms = lease.expires_at_ms, "lease renewed");
                    state.renewed_at_ms = sent_ms;
                    state.expires_at_ms = lease.expires_at_ms;
                    state.next_attempt_ms = sent_ms.saturating_add(self.config.renew_every_ms);
                    state.last_error = None;
                }
                Err(LeaseError::Backend(error)) => {
                    tracing::warn!(agent_id = %self.agent_id, epoch, %error, "lease renewal failed; retrying");
                    state.last_error = Some(error.to_string());
                    state.next_attempt_ms = now.saturating_add(self.config.retry_every_ms);
                }
                Err(error) => {
                    self.lose(
                        state,
                        LossReason::Refused {
                            error: error.to_string(),
                        },
                    );
                    return;
                }
            }
        }
    }
}

/// Builds a [`LeaseKeeper`]: [`LeaseKeeper::builder`].
pub struct KeeperBuilder {
    coordinator: Arc<dyn LeaseCoordinator>,
    agent_id: String,
    device_id: String,
    config: KeeperConfig,
    clock: KeeperClock,
    ledger_epoch: u64,
    on_lost: Option<OnLost>,
}

impl std::fmt::Debug for KeeperBuilder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("KeeperBuilder")
            .field("agent_id", &self.agent_id)
            .field("device_id", &self.device_id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KeeperBuilder {
    /// The timing (default: [`KeeperConfig::new`] of 30 s).
    pub fn config(mut self, config: KeeperConfig) -> Self {
        self.config = config;
        self
    }

    /// The keeper's clock (default: [`KeeperClock::monotonic`]).
    pub fn clock(mut self, clock: KeeperClock) -> Self {
        self.clock = clock;
        self
    }

    /// The highest epoch of the agent in the caller's ledger
    /// ([`SyncState::fencing_epoch`](crate::fold::SyncState::fencing_epoch)): raised as the
    /// coordinator's epoch floor before the first acquire (rule L5).
    pub fn ledger_epoch(mut self, epoch: u64) -> Self {
        self.ledger_epoch = epoch;
        self
    }

    /// Called once, on the thread that detects it, when the lease is lost. Not called for a
    /// release by [`LeaseKeeper::shutdown`].
    pub fn on_lost(mut self, callback: impl FnOnce(&Loss) + Send + 'static) -> Self {
        self.on_lost = Some(Box::new(callback));
        self
    }

    /// Acquires once; `Held` is an error.
    ///
    /// # Errors
    /// [`KeeperError::InvalidConfig`], [`KeeperError::Lease`] (an invalid id, `Held`, or a
    /// coordinator failure).
    pub fn acquire(self) -> Result<LeaseKeeper, KeeperError> {
        self.start(0)
    }

    /// Tries to acquire every `acquire_every_ms` (through `Held` and transient errors) for up to
    /// `max_wait_ms` of the keeper's clock.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); when the wait runs out, the last refusal or failure, or
    /// [`KeeperError::HeldThenFailed`] when the last attempt failed after a refusal: so a caller
    /// can tell "held by another" (some attempt reached the coordinator) from "never reached it".
    pub fn wait_to_acquire(self, max_wait_ms: u64) -> Result<LeaseKeeper, KeeperError> {
        self.start(max_wait_ms)
    }

    fn start(self, max_wait_ms: u64) -> Result<LeaseKeeper, KeeperError> {
        self.config.validate()?;
        validate_id(IdKind::Agent, &self.agent_id).map_err(LeaseError::from)?;
        validate_id(IdKind::Device, &self.device_id).map_err(LeaseError::from)?;
        let started_ms = self.clock.now_ms();
        let give_up_ms = started_ms.saturating_add(max_wait_ms);
        let mut last_held: Option<LeaseError> = None;
        let mut floor_raised = self.ledger_epoch == 0;
        let (lease, sent_ms) = loop {
            let sent_ms = self.clock.now_ms();
            // The floor first (once), within the same wait: a coordinator that is busy or
            // unreachable for a while gets the same patience as an acquire.
            let attempt = if floor_raised {
                self.coordinator
                    .acquire(&self.agent_id, &self.device_id, self.config.ttl_ms)
            } else {
                self.coordinator
                    .raise_epoch_floor(&self.agent_id, self.ledger_epoch.min(MAX_EPOCH_FLOOR))
                    .and_then(|()| {
                        floor_raised = true;
                        self.coordinator
                            .acquire(&self.agent_id, &self.device_id, self.config.ttl_ms)
                    })
            };
            match attempt {
                Ok(lease) => break (lease, sent_ms),
                Err(error @ (LeaseError::Held { .. } | LeaseError::Backend(_))) => {
                    let now = self.clock.now_ms();
                    if now >= give_up_ms {
                        return Err(match (last_held, error) {
                            (Some(held), last_error @ LeaseError::Backend(_)) => {
                                KeeperError::HeldThenFailed {
                                    held: Box::new(held),
                                    last_error: Box::new(last_error),
                                }
                            }
                            (_, error) => error.into(),
                        });
                    }
                    tracing::debug!(agent_id = %self.agent_id, %error, "waiting to acquire");
                    if matches!(error, LeaseError::Held { .. }) {
                        last_held = Some(error);
                    }
                    let retry_at = now.saturating_add(self.config.acquire_every_ms).min(give_up_ms);
                    while self.clock.now_ms() < retry_at {
                        std::thread::sleep(self.clock.slice(retry_at - self.clock.now_ms()));
                    }
                }
                Err(error) => return Err(error.into()),
            }
        };
        tracing::info!(agent_id = %self.agent_id, device_id = %self.device_id, epoch = lease.epoch, "lease acquired");
        let shared = Arc::new(Shared {
            coordinator: self.coordinator,
            agent_id: self.agent_id,
            device_id: self.device_id,
            config: self.config,
            clock: self.clock,
            state: Mutex::new(State {
                phase: Phase::Holding,
                epoch: lease.epoch,
                expires_at_ms: lease.expires_at_ms,
                renewed_at_ms: sent_ms,
                next_attempt_ms: sent_ms.saturating_add(self.config.renew_every_ms),
                last_error: None,
                guards: 0,
            }),
            changed: Condvar::new(),
            on_lost: Mutex::new(self.on_lost),
        });
        let renewer = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("fencepost-keeper-{}", shared.agent_id))
            .spawn(move || renewer.run())
            .map_err(|error| {
                LeaseError::Backend(crate::lease::BackendError {
                    backend: "keeper",
                    message: format!("cannot start the renewal thread: {error}"),
                    may_have_applied: false,
                    source: None,
                })
            })?;
        Ok(LeaseKeeper {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// Holds one agent's lease on a background thread; see the [module docs](self).
///
/// ```
/// use std::sync::Arc;
/// use fencepost::clock::system_clock;
/// use fencepost::keeper::{KeeperConfig, LeaseKeeper, Shutdown};
/// use fencepost::lease::InMemoryLeaseCoordinator;
///
/// let coordinator = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
/// let keeper = LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
///     .config(KeeperConfig::new(30_000))
///     .on_lost(|loss| eprintln!("stop acting for {}: {:?}", loss.agent_id, loss.reason))
///     .acquire()?;
/// if let Some(guard) = keeper.guard() {
///     println!("working under epoch {}", guard.epoch());
/// }
/// assert_eq!(keeper.shutdown()?, Shutdown::Released { epoch: 1 });
/// # Ok::<(), fencepost::keeper::KeeperError>(())
/// ```
pub struct LeaseKeeper {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LeaseKeeper")
            .field("agent_id", &self.shared.agent_id)
            .field("device_id", &self.shared.device_id)
            .field("state", &*self.shared.lock())
            .finish_non_exhaustive()
    }
}

/// Work in progress under a [`LeaseKeeper`]'s lease: [`LeaseKeeper::shutdown`] waits for it.
#[derive(Debug)]
pub struct WorkGuard<'keeper> {
    keeper: &'keeper LeaseKeeper,
    epoch: u64,
}

impl WorkGuard<'_> {
    /// The epoch the work runs under: the fencing token.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the keeper still holds the lease (see [`LeaseKeeper::holds`]).
    pub fn holds(&self) -> bool {
        self.keeper.holds()
    }
}

impl Drop for WorkGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.keeper.shared.lock();
        state.guards -= 1;
        drop(state);
        self.keeper.shared.changed.notify_all();
    }
}

impl LeaseKeeper {
    /// Starts building a keeper of `agent_id`'s lease for `device_id`.
    pub fn builder(
        coordinator: Arc<dyn LeaseCoordinator>,
        agent_id: impl Into<String>,
        device_id: impl Into<String>,
    ) -> KeeperBuilder {
        KeeperBuilder {
            coordinator,
            agent_id: agent_id.into(),
            device_id: device_id.into(),
            config: KeeperConfig::new(30_000),
            clock: KeeperClock::monotonic(),
            ledger_epoch: 0,
            on_lost: None,
        }
    }

    /// The agent.
    pub fn agent_id(&self) -> &str {
        &self.shared.agent_id
    }

    /// This site.
    pub fn device_id(&self) -> &str {
        &self.shared.device_id
    }

    /// The coordinator.
    pub fn coordinator(&self) -> &dyn LeaseCoordinator {
        &*self.shared.coordinator
    }

    /// The epoch granted to this keeper (the fencing token), held or not.
    pub fn epoch(&self) -> u64 {
        self.shared.lock().epoch
    }

    /// The coordinator's expiry after the last successful renewal (coordinator time).
    pub fn expires_at_ms(&self) -> u64 {
        self.shared.lock().expires_at_ms
    }

    /// Whether the keeper still holds the lease: not lost, not shut down, and less than
    /// `renew_deadline_ms` (keeper clock) since the last successful renewal was sent.
    pub fn holds(&self) -> bool {
        let state = self.shared.lock();
        self.shared.holds(&state)
    }

    /// The loss, once the lease is lost.
    pub fn loss(&self) -> Option<Loss> {
        match &self.shared.lock().phase {
            Phase::Lost(loss) => Some(loss.clone()),
            _ => None,
        }
    }

    /// Blocks until the lease is lost, or the keeper shuts down (`None`), or `timeout` passes
    /// (real time; `None`).
    pub fn wait_lost(&self, timeout: Duration) -> Option<Loss> {
        let state = self.shared.lock();
        let (state, _) = self
            .shared
            .changed
            .wait_timeout_while(state, timeout, |state| state.phase == Phase::Holding)
            .unwrap_or_else(PoisonError::into_inner);
        match &state.phase {
            Phase::Lost(loss) => Some(loss.clone()),
            _ => None,
        }
    }

    /// A guard for work under the lease, if the keeper [`holds`](Self::holds) it; shutdown waits
    /// until every guard is dropped.
    pub fn guard(&self) -> Option<WorkGuard<'_>> {
        let mut state = self.shared.lock();
        if !self.shared.holds(&state) {
            return None;
        }
        state.guards += 1;
        Some(WorkGuard {
            keeper: self,
            epoch: state.epoch,
        })
    }

    /// Stops renewing: waits for every [`WorkGuard`] to be dropped, then releases the lease, so
    /// that a successor acquires at once. Idempotent.
    ///
    /// # Errors
    /// [`KeeperError::Lease`] when the release fails in the coordinator (the lease then expires
    /// by its TTL).
    pub fn shutdown(&self) -> Result<Shutdown, KeeperError> {
        let mut state = self.shared.lock();
        let lost = match &state.phase {
            Phase::Holding => None,
            Phase::Lost(loss) => Some(loss.clone()),
            Phase::ShuttingDown | Phase::ShutDown => return Ok(Shutdown::AlreadyShutDown),
        };
        if lost.is_none() {
            state.phase = Phase::ShuttingDown;
            self.shared.changed.notify_all();
        }
        // Guards are only handed out while holding; wait for those in flight.
        while state.guards > 0 {
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let epoch = state.epoch;
        drop(state);
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(thread) = thread {
            let _ = thread.join(); // the loop ends on the phase change; a panic is not ours to rethrow
        }
        if let Some(loss) = lost {
            return Ok(Shutdown::Lost(loss));
        }
        let released = self
            .shared
            .coordinator
            .release(&self.shared.agent_id, &self.shared.device_id, epoch);
        let mut state = self.shared.lock();
        match released {
            Ok(()) => {
                state.phase = Phase::ShutDown;
                drop(state);
                self.shared.changed.notify_all();
                tracing::info!(agent_id = %self.shared.agent_id, epoch, "lease released");
                Ok(Shutdown::Released { epoch })
            }
            Err(LeaseError::Lost { current_epoch, .. }) => {
                // Lost while shutting down: deliver it, once. The keeper stays lost.
                self.shared.lose(state, LossReason::Stolen { current_epoch });
                let loss = self.loss().unwrap_or_else(|| Loss {
                    agent_id: self.shared.agent_id.clone(),
                    epoch,
                    reason: LossReason::Stolen { current_epoch },
                });
                Ok(Shutdown::Lost(loss))
            }
            Err(error) => {
                state.phase = Phase::ShutDown;
                drop(state);
                self.shared.changed.notify_all();
                tracing::warn!(agent_id = %self.shared.agent_id, epoch, %error, "lease release failed; it will expire by its TTL");
                Err(error.into())
            }
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            tracing::warn!(agent_id = %self.shared.agent_id, %error, "keeper dropped; release failed");
        }
    }
}
