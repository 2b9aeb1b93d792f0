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
//! * **Loss** is delivered exactly once, at the renew deadline at the latest, even while a
//!   renewal hangs in the coordinator (renewals are sent from their own thread; the keeper's
//!   thread only keeps time): first to [`LeaseKeeper::wait_lost`] / [`LeaseKeeper::loss`], then to
//!   the `on_lost` callback, whose panic is contained.
//! * **Guarded work** ([`LeaseKeeper::guard`]): work done under the lease holds a guard;
//!   [`LeaseKeeper::shutdown`] keeps renewing until every guard is dropped, then releases (its
//!   wait for the answer is bounded), so a successor acquires at once instead of waiting out the
//!   TTL. Which calls are allowed where: see [`LeaseKeeper`].
//! * **The epoch floor** (rule L5): before its first acquire, the keeper raises the coordinator's
//!   floor to the highest epoch the caller's ledger has seen, so a coordinator that lost its state
//!   cannot grant an epoch that was already used.
//!
//! A keeper is for liveness. It does not make an effect safe: pass its epoch to the dispatch fence
//! ([`crate::dispatch::dispatch`] does).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;
use std::time::Duration;

use crate::clock::{monotonic_clock, ManualClock, WallClock};
use crate::lease::{LeaseCoordinator, LeaseError};
use crate::metrics;
use crate::relay::Frontier;

mod builder;

pub use crate::tenure::{
    AcquirePlan, AcquireStep, Acquisition, KeeperConfig, KeeperError, LossReason, Renewal, RenewalStep,
};
pub use builder::KeeperBuilder;

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
    /// An earlier `shutdown` already ran, or is running on another thread.
    AlreadyShutDown,
}

/// The callback that receives the one [`Loss`].
type OnLost = Box<dyn FnOnce(&Loss) + Send>;
/// A [`KeeperBuilder::stop_waiting_when`] test.
type StopWaiting = Box<dyn Fn() -> bool + Send>;
/// How often a wait to acquire tests its [`KeeperBuilder::stop_waiting_when`].
const STOP_WAITING_EVERY: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Renewing.
    Holding,
    /// [`LeaseKeeper::shutdown`] was called: still renewing (and still holding) until the last
    /// guard is dropped; no new guard is handed out.
    Draining,
    /// The release is on its way: no more renewals.
    Releasing,
    Lost(Loss),
    ShutDown,
}

impl Phase {
    /// Whether the keeper still renews (and so may hold) the lease.
    fn renewing(&self) -> bool {
        matches!(self, Phase::Holding | Phase::Draining)
    }
}

/// Runs the `on_lost` callback, containing a panic (reported, never propagated: not even one
/// raised while dropping the panic's payload, which is leaked instead).
fn call_on_lost(callback: OnLost, loss: &Loss) {
    let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(loss)));
    if let Err(panic) = called {
        let message = panic
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        std::mem::forget(panic);
        tracing::error!(agent_id = %loss.agent_id, epoch = loss.epoch, panic = %message, "the on_lost callback panicked; the loss was delivered to every waiter");
    }
}

/// The answer to a call of the [`Renewal`] machine, posted by the thread that sent it.
#[derive(Debug)]
enum Answer {
    /// To a renewal.
    Renewed(Result<crate::lease::Lease, LeaseError>),
    /// To a renewal with a publication riding on it (rule H2).
    RenewedPublishing(Result<(crate::lease::Lease, bool), LeaseError>),
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// The renewal protocol (keeper clock), which this driver runs.
    renewal: Renewal,
    /// The answer to the last call, until the keeper's thread takes it.
    answer: Option<Answer>,
    /// The answer to the release, until the shutdown takes it.
    released: Option<Result<(), LeaseError>>,
    /// The threads that took the guards in flight (one entry per guard).
    guard_threads: Vec<ThreadId>,
    /// The keeper's own thread (it delivers the loss and runs `on_lost`).
    keeper_thread: Option<ThreadId>,
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
        state.phase.renewing() && state.renewal.holds(self.clock.now_ms())
    }

    /// Moves to `Lost` and delivers the loss, unless the keeper is already lost or shut down.
    /// Takes the state lock's guard and releases it first: waiters are woken before anything
    /// else, then the loss is logged, then the callback runs, on this thread, with no lock held.
    /// A panic in the callback is contained and reported.
    fn lose(&self, mut state: MutexGuard<'_, State>, reason: LossReason) {
        if matches!(state.phase, Phase::Lost(_) | Phase::ShutDown) {
            return;
        }
        let loss = Loss {
            agent_id: self.agent_id.clone(),
            epoch: state.renewal.epoch(),
            reason,
        };
        state.phase = Phase::Lost(loss.clone());
        metrics::set_held(&self.agent_id, false);
        metrics::count_agent(metrics::LEASE_LOSSES, &self.agent_id);
        let on_keeper_thread = state.keeper_thread == Some(std::thread::current().id());
        drop(state);
        self.changed.notify_all();
        tracing::warn!(agent_id = %loss.agent_id, epoch = loss.epoch, reason = ?loss.reason, "lease lost");
        let callback = self.on_lost.lock().unwrap_or_else(PoisonError::into_inner).take();
        let Some(callback) = callback else {
            return;
        };
        if on_keeper_thread {
            call_on_lost(callback, &loss);
            return;
        }
        // Found by a caller (a shutdown whose release found the lease lost): the callback runs on
        // a thread of its own, so that one that blocks delays no caller.
        let slot = Arc::new(Mutex::new(Some(callback)));
        let spawned = {
            let (slot, loss) = (Arc::clone(&slot), loss.clone());
            std::thread::Builder::new()
                .name(format!("fencepost-on-lost-{}", loss.agent_id))
                .spawn(move || {
                    if let Some(callback) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                        call_on_lost(callback, &loss);
                    }
                })
        };
        if spawned.is_err() {
            if let Some(callback) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                call_on_lost(callback, &loss);
            }
        }
    }

    /// Sends a renewal from a thread of its own, which posts the answer: however long the
    /// coordinator takes, the keeper's thread stays free to declare the loss at the deadline.
    fn send_renewal(self: &Arc<Self>, epoch: u64, ttl_ms: u64) -> Result<(), std::io::Error> {
        self.send(move |shared| {
            let stopwatch = crate::clock::Stopwatch::start();
            let renewed = shared
                .coordinator
                .renew(&shared.agent_id, &shared.device_id, epoch, ttl_ms);
            metrics::time_agent(metrics::RENEW_SECONDS, &shared.agent_id, stopwatch.elapsed());
            Answer::Renewed(renewed)
        })
    }

    /// Sends a renewal with a publication riding on it (rule H2) the same way.
    fn send_renewal_publishing(
        self: &Arc<Self>,
        epoch: u64,
        ttl_ms: u64,
        frontier: crate::relay::Frontier,
    ) -> Result<(), std::io::Error> {
        self.send(move |shared| {
            let stopwatch = crate::clock::Stopwatch::start();
            let renewed = shared.coordinator.renew_publishing(
                &shared.agent_id,
                &shared.device_id,
                epoch,
                ttl_ms,
                &frontier,
            );
            metrics::time_agent(metrics::RENEW_SECONDS, &shared.agent_id, stopwatch.elapsed());
            Answer::RenewedPublishing(renewed)
        })
    }

    fn log_renewal(&self, epoch: u64, outcome: Result<u64, &LeaseError>) {
        let counted = match outcome {
            Ok(_) => "ok",
            Err(LeaseError::Backend(_)) => "transient_error",
            Err(_) => "lost",
        };
        metrics::count(metrics::RENEWALS, &self.agent_id, "outcome", counted);
        match outcome {
            Ok(expires_at_ms) => {
                tracing::debug!(agent_id = %self.agent_id, epoch, expires_at_ms, "lease renewed")
            }
            Err(LeaseError::Backend(error)) => {
                tracing::warn!(agent_id = %self.agent_id, epoch, %error, "lease renewal failed; retrying")
            }
            Err(_) => {}
        }
    }

    fn send(
        self: &Arc<Self>,
        call: impl FnOnce(&Shared) -> Answer + Send + 'static,
    ) -> Result<(), std::io::Error> {
        let shared = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("fencepost-renew-{}", self.agent_id))
            .spawn(move || {
                let answer = call(&shared);
                shared.lock().answer = Some(answer);
                shared.changed.notify_all();
            })
            .map(drop)
    }

    /// The keeper's thread: the driver of the [`Renewal`] machine while the keeper is holding or
    /// draining. It sends what the machine asks for, waits as long as it says, feeds it the
    /// answers, and delivers the loss it reports (at the deadline at the latest, whether or not a
    /// renewal is still on its way).
    fn run(self: &Arc<Self>) {
        let mut state = self.lock();
        state.keeper_thread = Some(std::thread::current().id());
        loop {
            if !state.phase.renewing() {
                return;
            }
            let now = self.clock.now_ms();
            match state.answer.take() {
                Some(Answer::Renewed(outcome)) => {
                    self.log_renewal(
                        state.renewal.epoch(),
                        outcome.as_ref().map(|lease| lease.expires_at_ms),
                    );
                    state.renewal.answered(now, outcome);
                }
                Some(Answer::RenewedPublishing(outcome)) => {
                    self.log_renewal(
                        state.renewal.epoch(),
                        outcome.as_ref().map(|(lease, _)| lease.expires_at_ms),
                    );
                    if let Ok((_, false)) = &outcome {
                        tracing::warn!(agent_id = %self.agent_id, "publishing the ledger frontier failed; sending it with the next renewal");
                    }
                    state.renewal.answered_publishing(now, outcome);
                }
                None => {}
            }
            match state.renewal.step(now) {
                RenewalStep::Lost(reason) => {
                    self.lose(state, reason);
                    return;
                }
                RenewalStep::Renew { epoch, ttl_ms } => {
                    if let Err(error) = self.send_renewal(epoch, ttl_ms) {
                        tracing::warn!(agent_id = %self.agent_id, %error, "cannot start a renewal; retrying");
                        state.renewal.answered(now, Err(not_started("a renewal", &error)));
                    }
                }
                RenewalStep::RenewAndPublish {
                    epoch,
                    ttl_ms,
                    frontier,
                } => {
                    if let Err(error) = self.send_renewal_publishing(epoch, ttl_ms, frontier) {
                        tracing::warn!(agent_id = %self.agent_id, %error, "cannot start a renewal; retrying");
                        state
                            .renewal
                            .answered_publishing(now, Err(not_started("a renewal", &error)));
                    }
                }
                RenewalStep::WaitUntil { at_ms } => {
                    state = self.wait(state, at_ms.saturating_sub(now));
                }
            }
        }
    }
}

/// The transient error of a call the keeper could not start (no thread to send it from).
fn not_started(call: &str, error: &std::io::Error) -> LeaseError {
    LeaseError::Backend(crate::lease::BackendError {
        backend: "keeper",
        message: format!("cannot start {call}: {error}"),
        may_have_applied: false,
        transient: true,
        source: None,
    })
}

/// Holds one agent's lease on a background thread; see the [module docs](self).
///
/// # Threads, callbacks and where each call is allowed
///
/// The keeper's own thread keeps the time: it sends each renewal from a short-lived thread of its
/// own and waits for the answer only until the renew deadline, so a coordinator call that hangs
/// never hides a loss. The loss is delivered at the deadline at the latest: waiters of
/// [`wait_lost`](Self::wait_lost) are woken first, then `on_lost` runs on the keeper's thread (or,
/// when a [`shutdown`](Self::shutdown)'s release finds the lease lost, on a thread of its own). A panic in
/// `on_lost` is caught and logged; a callback that blocks delays nothing but itself.
///
/// * `holds`, `epoch`, `loss`, `wait_lost` and `guard` may be called from anywhere, `on_lost`
///   included.
/// * `shutdown` may be called from anywhere except a thread that holds one of this keeper's
///   [`WorkGuard`]s (inside a [`dispatch`](crate::dispatch::dispatch)ed effect, say): it would
///   wait for itself, so it returns [`KeeperError::ShutdownWhileGuarding`] instead. From `on_lost`
///   it returns at once with [`Shutdown::Lost`] once other threads' guards are dropped.
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

/// Work in progress under a [`LeaseKeeper`]'s lease: [`LeaseKeeper::shutdown`] keeps renewing
/// until every guard is dropped. A guard stays on the thread that took it (it is not `Send`), so
/// that [`LeaseKeeper::shutdown`] can refuse to wait for a guard of its own thread:
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use fencepost::clock::system_clock;
/// # use fencepost::keeper::LeaseKeeper;
/// # use fencepost::lease::InMemoryLeaseCoordinator;
/// let coordinator = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
/// let keeper = LeaseKeeper::builder(coordinator, "milo", "laptop").acquire().unwrap();
/// let guard = keeper.guard().unwrap();
/// std::thread::scope(|scope| {
///     scope.spawn(move || drop(guard)); // a guard cannot move to another thread
/// });
/// ```
#[derive(Debug)]
pub struct WorkGuard<'keeper> {
    keeper: &'keeper LeaseKeeper,
    epoch: u64,
    thread: ThreadId,
    /// Not `Send`: a guard stays on the thread that took it, so that a `shutdown` on that thread
    /// can tell that it would wait for itself.
    _not_send: std::marker::PhantomData<*const ()>,
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

impl crate::fence::Holder for WorkGuard<'_> {
    fn agent_id(&self) -> &str {
        self.keeper.agent_id()
    }

    fn device_id(&self) -> &str {
        self.keeper.device_id()
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn holds(&self) -> bool {
        self.keeper.holds()
    }

    fn coordinator(&self) -> &dyn LeaseCoordinator {
        self.keeper.coordinator()
    }

    fn handed_over(&self) -> Option<crate::relay::Frontier> {
        self.keeper.handed_over()
    }

    fn pushed(&self, frontier: &crate::relay::Frontier) {
        self.keeper.pushed(frontier);
    }
}

impl Drop for WorkGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.keeper.shared.lock();
        if let Some(index) = state
            .guard_threads
            .iter()
            .position(|thread| *thread == self.thread)
        {
            state.guard_threads.swap_remove(index);
        }
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
            stop_waiting: None,
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
        self.shared.lock().renewal.epoch()
    }

    /// What the agent's earlier holders published (rule H3), read right after the grant: this
    /// site's ledger must have received every record up to it before anything is dispatched
    /// ([`Ledger::behind`](crate::ledger::Ledger::behind)). `None` when the read failed (a
    /// dispatch then asks the coordinator itself).
    pub fn handed_over(&self) -> Option<crate::relay::Frontier> {
        self.shared.lock().renewal.handed_over().cloned()
    }

    /// Tells the keeper that this holder pushed its ledger's records up to `frontier` (rule H2):
    /// it publishes them after its next successful renewal, or before its release, so that a
    /// successor waits for them. [`dispatch`](crate::dispatch::dispatch) calls it after storing
    /// an outcome; call it yourself after [`Permit::finish`](crate::dispatch::Permit::finish) or
    /// [`Ledger::record`](crate::ledger::Ledger::record), with
    /// [`Ledger::pushed`](crate::ledger::Ledger::pushed).
    pub fn pushed(&self, frontier: &crate::relay::Frontier) {
        self.shared.lock().renewal.pushed(frontier);
    }

    /// The coordinator's expiry after the last successful renewal (coordinator time).
    pub fn expires_at_ms(&self) -> u64 {
        self.shared.lock().renewal.expires_at_ms()
    }

    /// Whether the keeper still holds the lease: not lost, not released, and less than
    /// `renew_deadline_ms` (keeper clock) since the last successful renewal was sent. True while a
    /// [`shutdown`](Self::shutdown) waits for guarded work.
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

    /// Blocks until the lease is lost (at the renew deadline at the latest, even while a renewal
    /// hangs), or the keeper releases it (`None`), or `timeout` passes (real time; `None`).
    pub fn wait_lost(&self, timeout: Duration) -> Option<Loss> {
        let state = self.shared.lock();
        let (state, _) = self
            .shared
            .changed
            .wait_timeout_while(state, timeout, |state| state.phase.renewing())
            .unwrap_or_else(PoisonError::into_inner);
        match &state.phase {
            Phase::Lost(loss) => Some(loss.clone()),
            _ => None,
        }
    }

    /// A guard for work under the lease, if the keeper [`holds`](Self::holds) it and no
    /// [`shutdown`](Self::shutdown) has begun; shutdown keeps renewing until every guard is
    /// dropped.
    pub fn guard(&self) -> Option<WorkGuard<'_>> {
        let mut state = self.shared.lock();
        if state.phase != Phase::Holding || !self.shared.holds(&state) {
            return None;
        }
        let thread = std::thread::current().id();
        state.guard_threads.push(thread);
        Some(WorkGuard {
            keeper: self,
            epoch: state.renewal.epoch(),
            thread,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Stops the keeper: hands out no new guard, **keeps renewing** until every [`WorkGuard`] is
    /// dropped (guarded work never runs without the lease because of a shutdown), then releases
    /// the lease so that a successor acquires at once. Idempotent; a second call while the first
    /// waits returns [`Shutdown::AlreadyShutDown`].
    ///
    /// The wait for guards is as long as the work; the release itself is bounded: the keeper
    /// waits for its answer until the renew deadline (at least `retry_every_ms`), and then
    /// reports [`KeeperError::ReleaseUnanswered`]: the lease ends by its TTL.
    ///
    /// # Errors
    /// * [`KeeperError::ShutdownWhileGuarding`] when the calling thread holds a guard of this
    ///   keeper (nothing changes: drop the guard first).
    /// * [`KeeperError::Lease`] when the release fails in the coordinator (the lease then expires
    ///   by its TTL).
    /// * [`KeeperError::ReleaseUnanswered`] when the release did not answer in time.
    pub fn shutdown(&self) -> Result<Shutdown, KeeperError> {
        let shared = &self.shared;
        let me = std::thread::current().id();
        let mut state = shared.lock();
        if state.guard_threads.contains(&me) {
            return Err(KeeperError::ShutdownWhileGuarding);
        }
        match &state.phase {
            Phase::Holding => {
                state.phase = Phase::Draining;
                shared.changed.notify_all();
            }
            Phase::Lost(_) => {}
            Phase::Draining | Phase::Releasing | Phase::ShutDown => return Ok(Shutdown::AlreadyShutDown),
        }
        // The keeper's thread goes on renewing meanwhile; if the lease is lost, the guards'
        // holders are told (`holds`, `wait_lost`, `on_lost`) and still finish first.
        while !state.guard_threads.is_empty() {
            state = shared.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        if let Phase::Lost(loss) = &state.phase {
            return Ok(Shutdown::Lost(loss.clone()));
        }
        state.phase = Phase::Releasing;
        let epoch = state.renewal.epoch();
        // What was pushed and not published yet (an outcome, rule H2) goes first, so that the
        // successor waits for it and does not take a finished run for one in doubt.
        let unpublished = state.renewal.unpublished().clone();
        let give_up_ms = state
            .renewal
            .deadline_ms()
            .max(shared.clock.now_ms().saturating_add(shared.config.retry_every_ms));
        shared.changed.notify_all();
        if let Err(error) = send_release(shared, epoch, unpublished) {
            shut_down(shared, state);
            tracing::warn!(agent_id = %shared.agent_id, epoch, %error, "cannot send the release; the lease will expire by its TTL");
            return Err(KeeperError::ReleaseUnanswered { epoch, waited_ms: 0 });
        }
        let started_ms = shared.clock.now_ms();
        let released = loop {
            if let Some(released) = state.released.take() {
                break Some(released);
            }
            let now = shared.clock.now_ms();
            if now >= give_up_ms {
                break None;
            }
            state = shared.wait(state, give_up_ms - now);
        };
        match released {
            Some(Ok(())) => {
                shut_down(shared, state);
                tracing::info!(agent_id = %shared.agent_id, epoch, "lease released");
                Ok(Shutdown::Released { epoch })
            }
            Some(Err(LeaseError::Lost { current_epoch, .. })) => {
                // Lost while shutting down: deliver it, once. The keeper stays lost.
                shared.lose(state, LossReason::Stolen { current_epoch });
                let loss = self.loss().unwrap_or_else(|| Loss {
                    agent_id: shared.agent_id.clone(),
                    epoch,
                    reason: LossReason::Stolen { current_epoch },
                });
                Ok(Shutdown::Lost(loss))
            }
            Some(Err(error)) => {
                shut_down(shared, state);
                tracing::warn!(agent_id = %shared.agent_id, epoch, %error, "lease release failed; it will expire by its TTL");
                Err(error.into())
            }
            None => {
                shut_down(shared, state);
                let waited_ms = shared.clock.now_ms().saturating_sub(started_ms);
                tracing::warn!(agent_id = %shared.agent_id, epoch, waited_ms, "the release did not answer; the lease will expire by its TTL");
                Err(KeeperError::ReleaseUnanswered { epoch, waited_ms })
            }
        }
    }
}

/// Sends the release of `epoch` (with what was not published yet, rule H2) from a thread of
/// its own; the answer lands in the shared state's `released`.
fn send_release(shared: &Arc<Shared>, epoch: u64, unpublished: Frontier) -> std::io::Result<()> {
    let releaser = Arc::clone(shared);
    std::thread::Builder::new()
        .name(format!("fencepost-release-{}", shared.agent_id))
        .spawn(move || {
            let released = if unpublished.is_empty() {
                releaser
                    .coordinator
                    .release(&releaser.agent_id, &releaser.device_id, epoch)
            } else {
                releaser.coordinator.release_publishing(
                    &releaser.agent_id,
                    &releaser.device_id,
                    epoch,
                    &unpublished,
                )
            };
            releaser.lock().released = Some(released);
            releaser.changed.notify_all();
        })
        .map(drop)
}

/// Ends a shutdown: the keeper is shut down and its lease no longer counted as held.
fn shut_down(shared: &Shared, mut state: MutexGuard<'_, State>) {
    state.phase = Phase::ShutDown;
    drop(state);
    shared.changed.notify_all();
    metrics::set_held(&shared.agent_id, false);
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            tracing::warn!(agent_id = %self.shared.agent_id, %error, "keeper dropped; release failed");
        }
    }
}
