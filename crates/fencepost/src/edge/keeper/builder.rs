//! Building a keeper ([`KeeperBuilder`]): its options, and `acquire`, which starts it.

use std::sync::{Arc, Condvar, Mutex};

use super::{KeeperClock, LeaseKeeper, Loss, OnLost, Phase, Shared, State, StopWaiting, STOP_WAITING_EVERY};
use crate::id::{validate_id, IdKind};
use crate::keeper::{AcquirePlan, AcquireStep, Acquisition, KeeperConfig, KeeperError};
use crate::lease::{LeaseCoordinator, LeaseError};
use crate::metrics;

/// Builds a [`LeaseKeeper`]: [`LeaseKeeper::builder`].
pub struct KeeperBuilder {
    pub(super) coordinator: Arc<dyn LeaseCoordinator>,
    pub(super) agent_id: String,
    pub(super) device_id: String,
    pub(super) config: KeeperConfig,
    pub(super) clock: KeeperClock,
    pub(super) ledger_epoch: u64,
    pub(super) on_lost: Option<OnLost>,
    pub(super) stop_waiting: Option<StopWaiting>,
}

impl std::fmt::Debug for KeeperBuilder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("KeeperBuilder")
            .field("agent_id", &self.agent_id)
            .field("device_id", &self.device_id)
            .field("config", &self.config)
            .field("stop_waiting", &self.stop_waiting.is_some())
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
    ///
    /// A coordinator that loses or rolls back its state between that raise and the grant can
    /// grant an epoch the ledger has seen (the floor went with the state). So once acquired, sync
    /// the ledger and ask [`Ledger::stale_grant`](crate::ledger::Ledger::stale_grant) whether
    /// [`LeaseKeeper::epoch`] is fresh; if not, shut the keeper down and acquire again with the
    /// new ledger epoch ([`run_once`](crate::run::run_once) does). A
    /// [`Ledger::begin`](crate::ledger::Ledger::begin) refuses an epoch below the ledger's, or one
    /// another device's `pending` holds; it cannot tell this device id's own earlier tenure from
    /// the current one.
    pub fn ledger_epoch(mut self, epoch: u64) -> Self {
        self.ledger_epoch = epoch;
        self
    }

    /// Called once when the lease is lost: on the keeper's thread, or on a thread of its own
    /// when a [`LeaseKeeper::shutdown`]'s release finds the lease lost. Not called for a release
    /// by a shutdown. A panic is contained; a callback that blocks delays no other call.
    pub fn on_lost(mut self, callback: impl FnOnce(&Loss) + Send + 'static) -> Self {
        self.on_lost = Some(Box::new(callback));
        self
    }

    /// Stops acquiring when `stop` says so (a signal came, the caller's own deadline passed):
    /// tested before each request to the coordinator and at least every 20 ms while waiting
    /// between attempts, so a [`wait_to_acquire`](Self::wait_to_acquire) of minutes ends
    /// promptly with [`KeeperError::Interrupted`]. Once the lease is granted, `stop` is no longer
    /// tested: a keeper is returned, and the caller who wants to stop shuts it down (the lease is
    /// given back at once).
    ///
    /// As when the wait runs out, a request whose answer was lost (a timeout the coordinator may
    /// have applied) can leave a grant nobody knows of; it ends by its TTL.
    pub fn stop_waiting_when(mut self, stop: impl Fn() -> bool + Send + 'static) -> Self {
        self.stop_waiting = Some(Box::new(stop));
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

    /// The driver of the [`Acquisition`] machine: the keeper's clock and the real coordinator.
    fn start(self, max_wait_ms: u64) -> Result<LeaseKeeper, KeeperError> {
        self.config.validate()?;
        validate_id(IdKind::Agent, &self.agent_id).map_err(LeaseError::from)?;
        validate_id(IdKind::Device, &self.device_id).map_err(LeaseError::from)?;
        let mut acquisition = Acquisition::new(
            self.config,
            AcquirePlan {
                agent_id: self.agent_id.clone(),
                ledger_epoch: self.ledger_epoch,
                started_ms: self.clock.now_ms(),
                max_wait_ms,
            },
        );
        let stopped = || self.stop_waiting.as_ref().is_some_and(|stop| stop());
        let renewal = loop {
            let now = self.clock.now_ms();
            let step = acquisition.step(now);
            if !matches!(step, AcquireStep::Granted(_) | AcquireStep::GaveUp(_)) && stopped() {
                return Err(KeeperError::Interrupted);
            }
            match step {
                AcquireStep::RaiseFloor { floor } => {
                    let outcome = self.coordinator.raise_epoch_floor(&self.agent_id, floor);
                    acquisition.floor_raised(self.clock.now_ms(), outcome);
                }
                AcquireStep::Acquire { ttl_ms } => {
                    let stopwatch = crate::clock::Stopwatch::start();
                    let outcome =
                        self.coordinator
                            .acquire_handing_over(&self.agent_id, &self.device_id, ttl_ms);
                    metrics::time_agent(metrics::ACQUIRE_SECONDS, &self.agent_id, stopwatch.elapsed());
                    let counted = match &outcome {
                        Ok(_) => "granted",
                        Err(LeaseError::Held { .. }) => "held",
                        Err(_) => "error",
                    };
                    metrics::count(metrics::ACQUIRES, &self.agent_id, "outcome", counted);
                    acquisition.acquired_handing_over(self.clock.now_ms(), outcome);
                }
                AcquireStep::WaitUntil { at_ms } => {
                    while self.clock.now_ms() < at_ms {
                        if stopped() {
                            return Err(KeeperError::Interrupted);
                        }
                        let slice = self.clock.slice(at_ms - self.clock.now_ms());
                        std::thread::sleep(match self.stop_waiting {
                            Some(_) => slice.min(STOP_WAITING_EVERY),
                            None => slice,
                        });
                    }
                }
                AcquireStep::Granted(renewal) => break renewal,
                AcquireStep::GaveUp(error) => return Err(error),
                AcquireStep::Spent => unreachable!("the driver stops at Granted or GaveUp"),
            }
        };
        let epoch = renewal.epoch();
        tracing::info!(agent_id = %self.agent_id, device_id = %self.device_id, epoch, "lease acquired");
        metrics::set_held(&self.agent_id, true);
        let shared = Arc::new(Shared {
            coordinator: self.coordinator,
            agent_id: self.agent_id,
            device_id: self.device_id,
            config: self.config,
            clock: self.clock,
            state: Mutex::new(State {
                phase: Phase::Holding,
                renewal,
                answer: None,
                released: None,
                guard_threads: Vec::new(),
                keeper_thread: None,
            }),
            changed: Condvar::new(),
            on_lost: Mutex::new(self.on_lost),
        });
        let renewer = Arc::clone(&shared);
        let started = std::thread::Builder::new()
            .name(format!("fencepost-keeper-{}", shared.agent_id))
            .spawn(move || renewer.run());
        if let Err(error) = started {
            // Nobody would renew the lease: give it back rather than leave it to expire.
            let _ = shared
                .coordinator
                .release(&shared.agent_id, &shared.device_id, epoch);
            return Err(LeaseError::Backend(crate::lease::BackendError {
                backend: "keeper",
                message: format!("cannot start the renewal thread: {error}"),
                may_have_applied: false,
                transient: true,
                source: None,
            })
            .into());
        }
        Ok(LeaseKeeper { shared })
    }
}
