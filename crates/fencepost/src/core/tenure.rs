//! The timing of a tenure (acquire, then keep renewing, until the lease is lost or released) as
//! state machines with no thread, no clock read and no I/O: [`Acquisition`] and [`Renewal`],
//! configured by [`KeeperConfig`] alone. The caller passes the time and the coordinator's answers
//! in and gets back what to do next. [`LeaseKeeper`](crate::keeper::LeaseKeeper) drives them with
//! a thread, a monotonic clock and a real coordinator; the simulator drives the very same machines
//! with simulated time. Public from [`crate::keeper`] only.

use crate::core::frontier::Frontier;
use crate::lease::{validate_ttl, LeaseError, MAX_EPOCH_FLOOR};

/// The timing of a [`LeaseKeeper`](crate::keeper::LeaseKeeper), in milliseconds of the keeper's clock.
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

/// Why a [`LeaseKeeper`](crate::keeper::LeaseKeeper) lost its lease.
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

/// A [`LeaseKeeper`](crate::keeper::LeaseKeeper) error.
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
    /// [`LeaseKeeper::shutdown`](crate::keeper::LeaseKeeper::shutdown) was called on a thread that holds one of the keeper's
    /// [`WorkGuard`](crate::keeper::WorkGuard)s: it would wait for itself. Nothing changed; drop the guard first.
    #[error("shutdown called while this thread holds a work guard of the keeper: it would wait for itself (drop the guard first)")]
    ShutdownWhileGuarding,
    /// The release was sent but did not answer within the renew deadline: the lease ends by its
    /// TTL at the latest (a successor waits until then).
    #[error(
        "the release of epoch {epoch} did not answer within {waited_ms} ms; the lease will expire by its TTL"
    )]
    ReleaseUnanswered {
        /// The epoch whose release was sent.
        epoch: u64,
        /// How long the keeper waited (keeper clock).
        waited_ms: u64,
    },
    /// The wait ran out: the coordinator refused the lease during the wait (`held`, the last such
    /// refusal), and the last attempt then failed (`last_error`). The lease was not obtained.
    #[error("{held}; the last attempt then failed: {last_error}")]
    HeldThenFailed {
        /// The last `Held` refusal during the wait.
        held: Box<LeaseError>,
        /// The error of the last attempt.
        last_error: Box<LeaseError>,
    },
    /// The caller stopped the acquisition
    /// ([`KeeperBuilder::stop_waiting_when`](crate::keeper::KeeperBuilder::stop_waiting_when))
    /// before the lease was granted. The lease was not obtained.
    #[error("the acquisition was stopped by the caller before the lease was granted")]
    Interrupted,
}

/// The renewal protocol of one held lease, as a state machine with no threads, no clock reads and
/// no I/O (in the manner of raft-rs's `RawNode`): the caller passes the time and the coordinator's
/// answers in, and gets back what to do next. [`LeaseKeeper`](crate::keeper::LeaseKeeper) drives it with a thread, a monotonic
/// clock and the real coordinator; a simulator can drive the same machine with simulated time.
///
/// Every timing decision of renewal is here, from [`KeeperConfig`]: renew `renew_every_ms` after
/// the last successful renewal was sent; after a transient error, retry `retry_every_ms` after
/// the failed renewal was sent; lost once `renew_deadline_ms` have passed since the last
/// successful renewal was sent (whether or not a renewal is still on its way), or at once on a
/// `Lost` verdict or an error retrying cannot fix.
///
/// ```
/// use fencepost::keeper::{KeeperConfig, LossReason, Renewal, RenewalStep};
/// use fencepost::lease::Lease;
///
/// let config = KeeperConfig::new(900); // renew every 300, deadline 600, retry every 75
/// let lease = Lease { agent_id: "milo".into(), holder: "laptop".into(), epoch: 1, expires_at_ms: 900 };
/// let mut renewal = Renewal::new(config, &lease, 0);
/// assert_eq!(renewal.step(10), RenewalStep::WaitUntil { at_ms: 300 });
/// assert_eq!(renewal.step(300), RenewalStep::Renew { epoch: 1, ttl_ms: 900 });
/// renewal.answered(305, Ok(Lease { expires_at_ms: 1_200, ..lease.clone() }));
/// assert_eq!(renewal.step(305), RenewalStep::WaitUntil { at_ms: 600 });
/// assert!(renewal.holds(899));
/// assert!(matches!(renewal.step(2_000), RenewalStep::Lost(LossReason::DeadlinePassed { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    config: KeeperConfig,
    epoch: u64,
    /// The coordinator's expiry after the last successful acquire or renewal.
    expires_at_ms: u64,
    /// When the last successful acquire or renewal was sent.
    renewed_at_ms: u64,
    /// When to send the next renewal.
    next_attempt_ms: u64,
    last_error: Option<String>,
    /// When the renewal that was sent and has not been answered was sent.
    in_flight: Option<u64>,
    lost: Option<LossReason>,
    /// What the predecessors published (rule H3), read right after the grant; `None` when that
    /// read failed (then a dispatch reads it itself).
    handed_over: Option<Frontier>,
    /// What this holder pushed and has not published yet (rule H2): published after the next
    /// successful renewal, or before the release.
    unpublished: Frontier,
    /// What the renewal in flight also publishes.
    publishing: Option<Frontier>,
}

/// What a [`Renewal`] asks its driver to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalStep {
    /// Send `renew(epoch, ttl_ms)` now, and pass its answer to [`Renewal::answered`] (the
    /// machine remembers when it asked: the time the renewal counts as sent).
    Renew {
        /// The epoch to renew.
        epoch: u64,
        /// The TTL to ask for.
        ttl_ms: u64,
    },
    /// Nothing to do before `at_ms` (or before the renewal in flight is answered).
    WaitUntil {
        /// When to call [`Renewal::step`] again at the latest.
        at_ms: u64,
    },
    /// Send `renew_publishing(epoch, ttl_ms, frontier)` now: the renewal, with what this holder
    /// pushed since its last publication riding on it (rule H2), and pass the answer to
    /// [`Renewal::answered_publishing`].
    RenewAndPublish {
        /// The epoch to renew.
        epoch: u64,
        /// The TTL to ask for.
        ttl_ms: u64,
        /// What to publish.
        frontier: Frontier,
    },
    /// The lease is lost; the machine stays lost.
    Lost(LossReason),
}

impl Renewal {
    /// The machine of `lease`, granted (or last renewed) by a call sent at `sent_ms`.
    pub fn new(config: KeeperConfig, lease: &crate::lease::Lease, sent_ms: u64) -> Self {
        Self {
            config,
            epoch: lease.epoch,
            expires_at_ms: lease.expires_at_ms,
            renewed_at_ms: sent_ms,
            next_attempt_ms: sent_ms.saturating_add(config.renew_every_ms),
            last_error: None,
            in_flight: None,
            lost: None,
            handed_over: None,
            unpublished: Frontier::new(),
            publishing: None,
        }
    }

    /// The frontier the predecessors published (rule H3), as read right after the grant: the
    /// ledger must have received at least this before anything is dispatched. `None` when it
    /// could not be read (ask the coordinator before dispatching).
    pub fn handed_over(&self) -> Option<&Frontier> {
        self.handed_over.as_ref()
    }

    /// Takes in that this holder pushed the records up to `frontier` (rule H2): they are
    /// published with the next renewal ([`RenewalStep::RenewAndPublish`]), or with the release
    /// ([`unpublished`](Self::unpublished)).
    pub fn pushed(&mut self, frontier: &Frontier) {
        self.unpublished.merge(frontier);
    }

    /// What was pushed and not published yet (empty when nothing is): a release publishes it
    /// first, so that the successor waits for the outcome, not only for the `pending`.
    pub fn unpublished(&self) -> &Frontier {
        &self.unpublished
    }

    /// Takes in the answer, at `now_ms`, to [`RenewalStep::RenewAndPublish`]: the renewal's as
    /// [`answered`](Self::answered) does; what was published is done with, and what was not is
    /// sent again with the next renewal.
    pub fn answered_publishing(
        &mut self,
        now_ms: u64,
        outcome: Result<(crate::lease::Lease, bool), LeaseError>,
    ) {
        let sent = self.publishing.take();
        let outcome = outcome.map(|(lease, published)| {
            if published && sent.as_ref() == Some(&self.unpublished) {
                self.unpublished = Frontier::new();
            }
            lease
        });
        self.answered(now_ms, outcome);
    }

    /// The epoch held.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The coordinator's expiry after the last successful renewal (coordinator time).
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// When the lease counts as lost unless a renewal succeeds first.
    pub fn deadline_ms(&self) -> u64 {
        self.renewed_at_ms.saturating_add(self.config.renew_deadline_ms)
    }

    /// Whether the lease is held at `now_ms`: not lost, and before the deadline.
    pub fn holds(&self, now_ms: u64) -> bool {
        self.lost.is_none() && now_ms < self.deadline_ms()
    }

    /// The loss, once lost.
    pub fn loss(&self) -> Option<&LossReason> {
        self.lost.as_ref()
    }

    /// What to do at `now_ms`.
    pub fn step(&mut self, now_ms: u64) -> RenewalStep {
        if let Some(reason) = &self.lost {
            return RenewalStep::Lost(reason.clone());
        }
        let deadline = self.deadline_ms();
        if now_ms >= deadline {
            let reason = LossReason::DeadlinePassed {
                last_error: self.last_error.clone(),
            };
            self.lost = Some(reason.clone());
            return RenewalStep::Lost(reason);
        }
        if self.in_flight.is_none() && now_ms >= self.next_attempt_ms {
            self.in_flight = Some(now_ms);
            if !self.unpublished.is_empty() {
                self.publishing = Some(self.unpublished.clone());
                return RenewalStep::RenewAndPublish {
                    epoch: self.epoch,
                    ttl_ms: self.config.ttl_ms,
                    frontier: self.unpublished.clone(),
                };
            }
            return RenewalStep::Renew {
                epoch: self.epoch,
                ttl_ms: self.config.ttl_ms,
            };
        }
        let at_ms = if self.in_flight.is_some() {
            deadline
        } else {
            self.next_attempt_ms.min(deadline)
        };
        RenewalStep::WaitUntil { at_ms }
    }

    /// Takes in the answer, at `now_ms`, to the renewal [`step`](Self::step) asked for (an
    /// answer when none was asked for is ignored). A success after the deadline comes too late
    /// to extend anything (the lease already counted as lost); `Lost` and errors that retrying
    /// cannot fix lose the lease at once; a transient error is retried (and is the `last_error` a
    /// later loss reports).
    pub fn answered(&mut self, now_ms: u64, outcome: Result<crate::lease::Lease, LeaseError>) {
        let Some(sent_ms) = self.in_flight.take() else {
            return;
        };
        if self.lost.is_some() {
            return;
        }
        match outcome {
            Err(LeaseError::Lost { current_epoch, .. }) => {
                self.lost = Some(LossReason::Stolen { current_epoch });
            }
            Err(LeaseError::Backend(error)) => {
                self.last_error = Some(error.to_string());
                // Counted from when the failed renewal was sent, not from when its answer came
                // in: the retry times do not drift with the driver's own delays.
                self.next_attempt_ms = sent_ms.saturating_add(self.config.retry_every_ms);
            }
            Ok(_) if now_ms >= self.deadline_ms() => {}
            Ok(lease) => {
                self.renewed_at_ms = sent_ms.max(self.renewed_at_ms);
                self.expires_at_ms = lease.expires_at_ms;
                self.next_attempt_ms = sent_ms.saturating_add(self.config.renew_every_ms);
                self.last_error = None;
            }
            Err(error) => {
                self.lost = Some(LossReason::Refused {
                    error: error.to_string(),
                });
            }
        }
    }
}

/// The acquisition of a lease, as a state machine with no threads, no clock reads and no I/O:
/// the first half of a tenure, before [`Renewal`]. [`KeeperBuilder::acquire`](crate::keeper::KeeperBuilder::acquire) and
/// [`KeeperBuilder::wait_to_acquire`](crate::keeper::KeeperBuilder::wait_to_acquire) drive it with the keeper's clock and the real coordinator;
/// the simulator drives the same machine with simulated time.
///
/// Its rules, from [`KeeperConfig`] and the [`AcquirePlan`]: raise the coordinator's epoch floor
/// to the ledger's epoch once, before the first acquire (rule L5; skipped when the ledger has seen
/// no epoch); try again `acquire_every_ms` after a refusal (`Held`) or a transient error, until
/// `max_wait_ms` after the start; give up at once on any other error, and at the start when the
/// ledger has seen the last epoch there is ([`LeaseError::EpochsExhausted`]: granting "floor + 1"
/// would repeat it).
///
/// ```
/// use fencepost::keeper::{AcquirePlan, AcquireStep, Acquisition, KeeperConfig};
/// use fencepost::lease::{Lease, LeaseError};
/// use fencepost::relay::Frontier;
///
/// let config = KeeperConfig::new(900); // try to acquire every 225 ms
/// let plan = AcquirePlan { agent_id: "milo".into(), ledger_epoch: 7, started_ms: 0, max_wait_ms: 1_000 };
/// let mut acquisition = Acquisition::new(config, plan);
/// assert_eq!(acquisition.step(0), AcquireStep::RaiseFloor { floor: 7 });
/// acquisition.floor_raised(0, Ok(()));
/// assert_eq!(acquisition.step(0), AcquireStep::Acquire { ttl_ms: 900 });
/// let held = LeaseError::Held { agent_id: "milo".into(), holder: "phone".into(), epoch: 8, expires_at_ms: 900 };
/// acquisition.acquired(2, Err(held));
/// assert_eq!(acquisition.step(2), AcquireStep::WaitUntil { at_ms: 227 });
/// assert_eq!(acquisition.step(227), AcquireStep::Acquire { ttl_ms: 900 });
/// let lease = Lease { agent_id: "milo".into(), holder: "laptop".into(), epoch: 9, expires_at_ms: 1_130 };
/// // The grant, with what the predecessors published (rule H3).
/// acquisition.acquired_handing_over(230, Ok((lease, Some(Frontier::new()))));
/// let AcquireStep::Granted(renewal) = acquisition.step(231) else { unreachable!() };
/// assert_eq!(renewal.handed_over(), Some(&Frontier::new()));
/// // The renewal counts from when the acquire was sent.
/// assert_eq!((renewal.epoch(), renewal.deadline_ms()), (9, 227 + 600));
/// assert_eq!(acquisition.step(232), AcquireStep::Spent);
/// ```
#[derive(Debug)]
pub struct Acquisition {
    config: KeeperConfig,
    agent_id: String,
    ledger_epoch: u64,
    give_up_ms: u64,
    floor_raised: bool,
    next_attempt_ms: u64,
    /// What was asked for and not answered yet, and when.
    in_flight: Option<u64>,
    /// The last `Held` refusal.
    last_held: Option<LeaseError>,
    /// The tenure granted (once the frontier was read) or the error that ended the wait, until
    /// [`step`](Acquisition::step) hands it over.
    ended: Option<Result<Renewal, KeeperError>>,
    spent: bool,
}

/// What an [`Acquisition`] is for: the agent, the highest epoch of the agent its ledger has seen
/// ([`SyncState::fencing_epoch`](crate::fold::SyncState::fencing_epoch); 0 for none), when it
/// starts and how long it may wait (0: one attempt), in the driver's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquirePlan {
    /// The agent (for the errors).
    pub agent_id: String,
    /// The floor to raise first.
    pub ledger_epoch: u64,
    /// When the acquisition starts.
    pub started_ms: u64,
    /// How long it may go on trying.
    pub max_wait_ms: u64,
}

/// What an [`Acquisition`] asks its driver to do next.
#[derive(Debug)]
#[non_exhaustive]
pub enum AcquireStep {
    /// Call `raise_epoch_floor(agent, floor)` now and pass the answer to
    /// [`Acquisition::floor_raised`].
    RaiseFloor {
        /// The floor: the highest epoch of the agent in the ledger.
        floor: u64,
    },
    /// Call `acquire_handing_over(agent, device, ttl_ms)` now (the grant, and what the
    /// predecessors published: rule H3) and pass the answer to
    /// [`Acquisition::acquired_handing_over`] (or call `acquire` and pass its answer to
    /// [`Acquisition::acquired`]).
    Acquire {
        /// The TTL to ask for.
        ttl_ms: u64,
    },

    /// Nothing to do before `at_ms` (or before the call asked for is answered).
    WaitUntil {
        /// When to call [`Acquisition::step`] again.
        at_ms: u64,
    },
    /// The lease is held: drive this [`Renewal`] from now on.
    Granted(Renewal),
    /// The lease was not obtained.
    GaveUp(KeeperError),
    /// `Granted` or `GaveUp` was handed over already.
    Spent,
}

impl PartialEq for AcquireStep {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::RaiseFloor { floor: a }, Self::RaiseFloor { floor: b }) => a == b,
            (Self::Acquire { ttl_ms: a }, Self::Acquire { ttl_ms: b }) => a == b,
            (Self::WaitUntil { at_ms: a }, Self::WaitUntil { at_ms: b }) => a == b,
            (Self::Granted(a), Self::Granted(b)) => a == b,
            (Self::GaveUp(a), Self::GaveUp(b)) => a.to_string() == b.to_string(),
            (Self::Spent, Self::Spent) => true,
            _ => false,
        }
    }
}

impl Acquisition {
    /// The machine of `plan`.
    pub fn new(config: KeeperConfig, plan: AcquirePlan) -> Self {
        let ended = (plan.ledger_epoch > MAX_EPOCH_FLOOR).then(|| {
            Err(KeeperError::Lease(LeaseError::EpochsExhausted {
                agent_id: plan.agent_id.clone(),
                last_epoch: plan.ledger_epoch,
            }))
        });
        Self {
            config,
            give_up_ms: plan.started_ms.saturating_add(plan.max_wait_ms),
            floor_raised: plan.ledger_epoch == 0,
            next_attempt_ms: plan.started_ms,
            agent_id: plan.agent_id,
            ledger_epoch: plan.ledger_epoch,
            in_flight: None,
            last_held: None,
            ended,
            spent: false,
        }
    }

    /// What to do at `now_ms`.
    pub fn step(&mut self, now_ms: u64) -> AcquireStep {
        if self.spent {
            return AcquireStep::Spent;
        }
        if let Some(ended) = self.ended.take() {
            self.spent = true;
            return match ended {
                Ok(renewal) => AcquireStep::Granted(renewal),
                Err(error) => AcquireStep::GaveUp(error),
            };
        }
        if self.in_flight.is_some() || now_ms < self.next_attempt_ms {
            return AcquireStep::WaitUntil {
                at_ms: self.next_attempt_ms.max(now_ms),
            };
        }
        self.in_flight = Some(now_ms);
        if self.floor_raised {
            AcquireStep::Acquire {
                ttl_ms: self.config.ttl_ms,
            }
        } else {
            AcquireStep::RaiseFloor {
                floor: self.ledger_epoch,
            }
        }
    }

    /// Takes in the answer, at `now_ms`, to [`AcquireStep::RaiseFloor`].
    pub fn floor_raised(&mut self, now_ms: u64, outcome: Result<(), LeaseError>) {
        // Only an asked-for call is answered; none is asked for once the acquisition ended.
        if self.in_flight.take().is_none() {
            return;
        }
        match outcome {
            Ok(()) => self.floor_raised = true,
            Err(error) => self.refused(now_ms, error),
        }
    }

    /// Takes in the answer, at `now_ms`, to [`AcquireStep::Acquire`] sent as a plain `acquire`
    /// (what the predecessors published is then unknown: [`Renewal::handed_over`] is `None`).
    pub fn acquired(&mut self, now_ms: u64, outcome: Result<crate::lease::Lease, LeaseError>) {
        self.acquired_handing_over(now_ms, outcome.map(|lease| (lease, None)));
    }

    /// Takes in the answer, at `now_ms`, to [`AcquireStep::Acquire`] sent as
    /// `acquire_handing_over`: the grant and what the predecessors published (rule H3), which
    /// the [`Renewal`] keeps ([`Renewal::handed_over`]).
    pub fn acquired_handing_over(
        &mut self,
        now_ms: u64,
        outcome: Result<(crate::lease::Lease, Option<Frontier>), LeaseError>,
    ) {
        let Some(sent_ms) = self.in_flight.take() else {
            return;
        };
        match outcome {
            Ok((lease, handed_over)) => {
                let mut renewal = Renewal::new(self.config, &lease, sent_ms);
                renewal.handed_over = handed_over;
                self.ended = Some(Ok(renewal));
            }
            Err(error) => self.refused(now_ms, error),
        }
    }

    /// A refusal or failure: wait and try again (within the wait), or give up.
    fn refused(&mut self, now_ms: u64, error: LeaseError) {
        if !matches!(error, LeaseError::Held { .. } | LeaseError::Backend(_)) {
            self.ended = Some(Err(error.into()));
            return;
        }
        if now_ms >= self.give_up_ms {
            self.ended = Some(Err(match (self.last_held.take(), error) {
                (Some(held), last_error @ LeaseError::Backend(_)) => KeeperError::HeldThenFailed {
                    held: Box::new(held),
                    last_error: Box::new(last_error),
                },
                (_, error) => error.into(),
            }));
            return;
        }
        tracing::debug!(agent_id = %self.agent_id, %error, "waiting to acquire");
        if matches!(error, LeaseError::Held { .. }) {
            self.last_held = Some(error);
        }
        self.next_attempt_ms = now_ms
            .saturating_add(self.config.acquire_every_ms)
            .min(self.give_up_ms);
    }
}
