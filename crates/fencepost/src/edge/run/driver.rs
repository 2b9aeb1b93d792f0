//! The driver of one [`RunSession`]: the I/O each step asks for, through the keeper, the ledger
//! and the dispatch's own steps.

use std::sync::Arc;
use std::time::Duration;

use super::{EffectContext, Occurrence, Outcome, RunError, RunHooks, RunOptions};
use crate::dispatch::{
    begin_guarded, count_dispatch, end_effect, DispatchOptions, DispatchOutcome, EffectOutcome, Refusal,
};
use crate::id::{Claim, Epoch};
use crate::keeper::{KeeperError, LeaseKeeper};
use crate::lease::{LeaseCoordinator, LeaseError};
use crate::ledger::{Ledger, LedgerError, MissingRecords, StaleGrant};
use crate::oplog::OpId;
use crate::session::{
    Acquired, Begun, Comparison, EffectEnd, RunSession, SessionEnd, SessionPlan, SessionStep,
};

/// Drives one [`RunSession`] of `occurrence` to its end: [`run_once_with`](super::run_once_with).
pub(super) fn run<T, E>(
    coordinator: Arc<dyn LeaseCoordinator>,
    ledger: &mut Ledger,
    occurrence: &Occurrence,
    options: &RunOptions,
    hooks: &mut dyn RunHooks,
    effect: impl FnOnce(&EffectContext<'_>) -> EffectOutcome<T, E>,
) -> Result<Outcome<T, E>, RunError> {
    let mut driver = Driver {
        coordinator,
        occurrence,
        options,
        hooks,
        keeper: None,
        read: None,
        error: None,
        stale: None,
        acquiring: Progress::NotYet,
        waiting: Progress::NotYet,
    };
    let mut session = RunSession::new(SessionPlan {
        started_ms: driver.now_ms(),
        wait_ms: options.wait_ms,
        poll_ms: options.poll_ms,
        retry_in_doubt: options.retry_in_doubt,
    });
    let outcome = driver.drive(&mut session, ledger, effect);
    if let Some(keeper) = driver.keeper.take() {
        release_quietly(&keeper); // only on a driver bug: the session releases before its end
    }
    outcome
}

/// Where a part of the session is: not started, going on, over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    NotYet,
    Going,
    Over,
}

/// The I/O of one [`RunSession`]: what it read, and what it holds.
struct Driver<'run> {
    coordinator: Arc<dyn LeaseCoordinator>,
    occurrence: &'run Occurrence,
    options: &'run RunOptions,
    hooks: &'run mut dyn RunHooks,
    keeper: Option<LeaseKeeper>,
    /// What the driver read that names the session's end (a commit, a holder, what is missing).
    read: Option<Read>,
    /// The error that ends the session.
    error: Option<RunError>,
    /// Why the last grant was stale.
    stale: Option<StaleGrant>,
    /// The acquisition (to the fresh grant), for the hooks.
    acquiring: Progress,
    /// The wait for the ledger, for the hooks.
    waiting: Progress,
}

/// What the driver read that names the session's end.
enum Read {
    Committed(OpId),
    Held(LeaseError, Option<LeaseError>),
    Missing(Vec<MissingRecords>),
}

impl Driver<'_> {
    fn now_ms(&self) -> u64 {
        self.options.clock.now_ms()
    }

    fn stop_requested(&self) -> bool {
        self.options.stop.as_ref().is_some_and(|stop| stop())
    }

    /// Whether `ledger`, protected, lacks records the agent's earlier holders published (or
    /// cannot tell): a commit it holds is then not taken before the hand-off (rule M4: found
    /// by an adversary, a relay that withheld a revocation made a revoked device's commit stop
    /// the run, where the hand-off would have waited for it). The session then takes the lease,
    /// waits for those records, and `Ledger::begin` decides. A ledger that is not protected
    /// has no revocation to wait for: its commit is taken at once.
    fn behind_what_was_published(&self, ledger: &Ledger) -> bool {
        if !ledger.is_protected() {
            return false;
        }
        match self.coordinator.published_frontier(self.agent()) {
            Ok(published) => !ledger.behind(&published).is_empty(),
            Err(error) => {
                tracing::warn!(%error, "cannot read the published frontier; taking the lease before trusting the commit");
                true
            }
        }
    }

    fn agent(&self) -> &str {
        &self.occurrence.agent_id
    }

    /// Drives the session to its end.
    fn drive<T, E>(
        &mut self,
        session: &mut RunSession,
        ledger: &mut Ledger,
        effect: impl FnOnce(&EffectContext<'_>) -> EffectOutcome<T, E>,
    ) -> Result<Outcome<T, E>, RunError> {
        let mut effect = Some(effect);
        let mut dispatched = None;
        loop {
            let step = session.step(self.now_ms());
            self.tell_hooks(&step);
            match step {
                SessionStep::AskOracle => {
                    let committed = ledger
                        .committed_run(self.agent(), &self.occurrence.run_id)
                        .filter(|_| !self.behind_what_was_published(ledger));
                    if let Some(run) = committed {
                        self.read = Some(Read::Committed(run.op_id));
                    }
                    session.oracle_answered(committed.is_some());
                }
                SessionStep::Acquire { max_wait_ms } => self.acquire(session, ledger, max_wait_ms),
                SessionStep::SyncAndCheckGrant { epoch } => self.check_grant(session, ledger, epoch),
                SessionStep::GiveBack { epoch } => {
                    if let Some(keeper) = self.keeper.take() {
                        release_quietly(&keeper);
                    }
                    if let Some(why) = &self.stale {
                        self.hooks.stale_grant(epoch, why);
                    }
                    session.given_back();
                }
                SessionStep::Compare => self.compare(session, ledger),
                SessionStep::SyncAt { at_ms, first } => self.sync_at(session, ledger, at_ms, first),
                SessionStep::Begin {
                    epoch,
                    retry_in_doubt,
                } => match effect.take() {
                    Some(effect) => {
                        dispatched = self.dispatch(session, ledger, epoch, retry_in_doubt, effect)
                    }
                    None => {
                        return Err(RunError::Unexpected {
                            step: "a second Begin",
                        })
                    }
                },
                SessionStep::Release { .. } => {
                    self.release(ledger, session.ending());
                    session.released();
                }
                SessionStep::Done(end) => return self.outcome(end, dispatched),
                // The dispatch (the Begin step) runs the effect and records its outcome.
                _ => {
                    return Err(RunError::Unexpected {
                        step: "a step the driver took already",
                    })
                }
            }
        }
    }

    /// Tells the hooks where the run is, from the step it takes next.
    fn tell_hooks(&mut self, step: &SessionStep) {
        let acquiring = matches!(
            step,
            SessionStep::Acquire { .. }
                | SessionStep::SyncAndCheckGrant { .. }
                | SessionStep::GiveBack { .. }
        );
        match self.acquiring {
            Progress::NotYet if acquiring => {
                self.acquiring = Progress::Going;
                self.hooks.acquiring();
            }
            Progress::Going if !acquiring => {
                self.acquiring = Progress::Over;
                self.hooks.acquire_ended();
            }
            _ => {}
        }
        let waiting = matches!(step, SessionStep::Compare | SessionStep::SyncAt { .. });
        match self.waiting {
            Progress::NotYet if waiting => self.waiting = Progress::Going,
            Progress::Going if !waiting => {
                self.waiting = Progress::Over;
                self.hooks.ledger_wait_ended();
            }
            _ => {}
        }
    }

    /// [`SessionStep::Acquire`]: the keeper, above the ledger's fencing epoch.
    fn acquire(&mut self, session: &mut RunSession, ledger: &Ledger, max_wait_ms: u64) {
        let mut builder =
            LeaseKeeper::builder(Arc::clone(&self.coordinator), self.agent(), ledger.device_id())
                .config(self.options.keeper)
                .clock(self.options.clock.clone())
                .ledger_epoch(ledger.state().fencing_epoch(self.agent()));
        if let Some(stop) = &self.options.stop {
            let stop = Arc::clone(stop);
            builder = builder.stop_waiting_when(move || stop());
        }
        let acquired = match builder.wait_to_acquire(max_wait_ms) {
            Ok(keeper) => match Epoch::new(keeper.epoch()) {
                Ok(epoch) => {
                    self.hooks.granted(&keeper);
                    self.keeper = Some(keeper);
                    Acquired::Granted { epoch }
                }
                Err(error) => {
                    release_quietly(&keeper);
                    self.error = Some(RunError::Epoch(error));
                    Acquired::Refused
                }
            },
            Err(KeeperError::Interrupted) => Acquired::Stopped,
            Err(KeeperError::Lease(held @ LeaseError::Held { .. })) => {
                self.read = Some(Read::Held(held, None));
                Acquired::Refused
            }
            Err(KeeperError::HeldThenFailed { held, last_error }) => {
                self.read = Some(Read::Held(*held, Some(*last_error)));
                Acquired::Refused
            }
            Err(source) => {
                self.error = Some(RunError::Acquire {
                    agent_id: self.agent().to_owned(),
                    source,
                });
                Acquired::Refused
            }
        };
        session.acquired(self.now_ms(), acquired);
    }

    /// [`SessionStep::SyncAndCheckGrant`]: a grant the ledger has seen is stale (rule L5).
    fn check_grant(&mut self, session: &mut RunSession, ledger: &mut Ledger, epoch: Epoch) {
        if self.stop_requested() {
            session.stop();
            return;
        }
        if let Err(error) = sync_checked(ledger) {
            self.abort(session, error);
            return;
        }
        self.stale = ledger.stale_grant(&Claim {
            agent: self.occurrence.agent_id.clone(),
            device: ledger.device().clone(),
            epoch,
        });
        session.grant_checked(self.now_ms(), self.stale.is_some());
        if self.stale.is_some() {
            return;
        }
        if let Some(keeper) = &self.keeper {
            self.hooks.holding(keeper);
        }
        if self.stop_requested() {
            session.stop();
        }
    }

    /// [`SessionStep::Compare`]: the ledger against what the earlier holders published (H3).
    fn compare(&mut self, session: &mut RunSession, ledger: &mut Ledger) {
        let Some(keeper) = &self.keeper else {
            self.abort(
                session,
                RunError::Unexpected {
                    step: "Compare without a lease",
                },
            );
            return;
        };
        // Read right after the grant by the keeper; asked again only when that read failed.
        let published = match keeper.handed_over() {
            Some(frontier) => Ok(frontier),
            None => keeper.coordinator().published_frontier(keeper.agent_id()),
        };
        let missing = match published {
            Ok(frontier) => Ok(ledger.behind(&frontier)),
            Err(source) => {
                tracing::warn!(error = %source, "cannot read the published frontier; trying again");
                Err(RunError::Published {
                    agent_id: keeper.agent_id().to_owned(),
                    source,
                })
            }
        };
        if matches!(&missing, Ok(missing) if missing.is_empty()) {
            session.compared(self.now_ms(), Comparison::Complete);
            return;
        }
        if !keeper.holds() {
            session.compared(self.now_ms(), Comparison::LeaseLost); // the fence reports it
            return;
        }
        if self.stop_requested() {
            session.stop();
            return;
        }
        let comparison = match missing {
            Ok(missing) => {
                let differs = missing.iter().any(|missing| missing.differs);
                self.read = Some(Read::Missing(missing));
                Comparison::Missing { differs }
            }
            Err(error) => {
                self.error = Some(error);
                Comparison::Unread
            }
        };
        session.compared(self.now_ms(), comparison);
    }

    /// [`SessionStep::SyncAt`]: waits, syncs, and checks the ledger for damage.
    fn sync_at(&mut self, session: &mut RunSession, ledger: &mut Ledger, at_ms: u64, first: bool) {
        if first {
            if let Some(Read::Missing(missing)) = &self.read {
                self.hooks.waiting_for_ledger(missing);
            }
        }
        let now = self.now_ms();
        if at_ms > now {
            std::thread::sleep(Duration::from_millis(at_ms - now));
        }
        match sync_checked(ledger) {
            Ok(()) => session.synced(self.now_ms()),
            Err(error) => self.abort(session, error),
        }
    }

    /// [`SessionStep::Begin`], [`SessionStep::RunEffect`] and [`SessionStep::Record`]: the
    /// fence, the effect and its outcome, through the steps of
    /// [`dispatch`](crate::dispatch::dispatch).
    fn dispatch<T, E>(
        &mut self,
        session: &mut RunSession,
        ledger: &mut Ledger,
        epoch: Epoch,
        retry_in_doubt: bool,
        effect: impl FnOnce(&EffectContext<'_>) -> EffectOutcome<T, E>,
    ) -> Option<(Epoch, DispatchOutcome<T, E>)> {
        let Some(keeper) = self.keeper.take() else {
            self.abort(
                session,
                RunError::Unexpected {
                    step: "Begin without a lease",
                },
            );
            return None;
        };
        self.hooks.dispatching();
        let claim = Claim {
            agent: self.occurrence.agent_id.clone(),
            device: ledger.device().clone(),
            epoch,
        };
        let options = DispatchOptions::default().retry_in_doubt(retry_in_doubt);
        let dispatched = match begin_guarded(&keeper, ledger, &self.occurrence.run_id, options) {
            Ok((guard, permit)) => {
                session.begun(Begun::Permitted);
                let _run_effect = session.step(self.now_ms());
                let ended = effect(&EffectContext {
                    token: permit.token(),
                    claim: &claim,
                    keeper: &keeper,
                });
                let end = match &ended {
                    EffectOutcome::Succeeded(_) => EffectEnd::Succeeded,
                    EffectOutcome::Failed(_) => EffectEnd::Failed,
                    EffectOutcome::Unknown(_) => EffectEnd::Unknown,
                };
                session.effect_ended(end);
                if end != EffectEnd::Unknown {
                    let _record = session.step(self.now_ms());
                    session.recorded();
                }
                Ok(end_effect(&keeper, ledger, guard, permit, ended))
            }
            Err(Refusal::Error(error)) => Err(error),
            Err(refusal) => {
                session.begun(Begun::Refused);
                refusal.into_outcome()
            }
        };
        let kind = dispatched.as_ref().map_or("error", DispatchOutcome::kind);
        count_dispatch(keeper.agent_id(), kind);
        self.keeper = Some(keeper);
        match dispatched {
            Ok(outcome) => Some((epoch, outcome)),
            Err(error) => {
                self.abort(session, RunError::from(error));
                None
            }
        }
    }

    /// [`SessionStep::Release`]: what waits to be stored first (the hooks), then the release,
    /// publishing what was pushed (rule H2).
    fn release(&mut self, ledger: &mut Ledger, end: Option<SessionEnd>) {
        let Some(keeper) = self.keeper.take() else {
            return;
        };
        self.hooks
            .before_release(ledger, end.unwrap_or(SessionEnd::Aborted));
        keeper.pushed(&ledger.pushed());
        let shutdown = keeper.shutdown();
        if let Err(error) = &shutdown {
            tracing::warn!(%error, "could not release the lease");
        }
        self.hooks.released(&shutdown);
    }

    /// Ends the session with `error`, the lease given back.
    fn abort(&mut self, session: &mut RunSession, error: RunError) {
        self.error = Some(error);
        session.fail();
    }

    /// The outcome of the session's `end`, named with what the driver read.
    fn outcome<T, E>(
        &mut self,
        end: SessionEnd,
        dispatched: Option<(Epoch, DispatchOutcome<T, E>)>,
    ) -> Result<Outcome<T, E>, RunError> {
        Ok(match (end, self.read.take(), dispatched) {
            (SessionEnd::AlreadyCommitted, Some(Read::Committed(committed_op_id)), _) => {
                Outcome::AlreadyCommitted {
                    committed_op_id,
                    before_lease: true,
                }
            }
            (
                SessionEnd::NotAcquired,
                Some(Read::Held(
                    LeaseError::Held {
                        holder,
                        epoch,
                        expires_at_ms,
                        ..
                    },
                    last_error,
                )),
                _,
            ) => Outcome::Held {
                holder,
                epoch,
                expires_at_ms,
                last_error,
            },
            (SessionEnd::LedgerBehind, Some(Read::Missing(missing)), _) => Outcome::LedgerBehind { missing },
            (SessionEnd::Stopped(stage), _, _) => Outcome::Stopped { stage },
            (SessionEnd::StaleGrants { epoch }, _, _) => {
                return Err(RunError::StaleGrants {
                    agent_id: self.agent().to_owned(),
                    epoch,
                    why: self.stale.take().unwrap_or(StaleGrant::UsedBefore),
                })
            }
            (
                SessionEnd::Ran { .. } | SessionEnd::Interrupted { .. } | SessionEnd::Refused,
                _,
                Some((epoch, dispatched)),
            ) => from_dispatch(dispatched, epoch),
            _ => {
                return Err(self.error.take().unwrap_or(RunError::Unexpected {
                    step: "an end without what names it",
                }))
            }
        })
    }
}

/// A dispatch's outcome as the run's; `epoch` is the one held (the dispatch's, checked).
fn from_dispatch<T, E>(outcome: DispatchOutcome<T, E>, epoch: Epoch) -> Outcome<T, E> {
    match outcome {
        DispatchOutcome::Executed {
            result: Ok(value), ..
        } => Outcome::Committed { epoch, value },
        DispatchOutcome::Executed {
            result: Err(error), ..
        } => Outcome::Failed { epoch, error },
        DispatchOutcome::Interrupted { error, .. } => Outcome::Interrupted { epoch, error },
        DispatchOutcome::AlreadyCommitted { committed_op_id } => Outcome::AlreadyCommitted {
            committed_op_id,
            before_lease: false,
        },
        DispatchOutcome::StaleEpoch {
            current_epoch,
            current_holder,
            ..
        } => Outcome::LeaseLost {
            claimed_epoch: epoch,
            current: Some((current_epoch, current_holder)),
        },
        DispatchOutcome::NotHeld { .. } => Outcome::LeaseLost {
            claimed_epoch: epoch,
            current: None,
        },
        DispatchOutcome::InDoubt { run } => Outcome::InDoubt { run },
        DispatchOutcome::ConcurrentAttempt { run } => Outcome::ConcurrentAttempt { run },
        DispatchOutcome::LedgerBehind { missing } => Outcome::LedgerBehind { missing },
    }
}

/// Syncs the ledger and refuses damage that was not accepted ([`Ledger::damage`]).
fn sync_checked(ledger: &mut Ledger) -> Result<(), RunError> {
    ledger.sync().map_err(RunError::Sync)?;
    let problems: Vec<_> = ledger.damage().into_iter().cloned().collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RunError::Ledger(LedgerError::Damaged { problems }))
    }
}

/// Releases after a refusal or a failure; that is what gets reported.
fn release_quietly(keeper: &LeaseKeeper) {
    if let Err(error) = keeper.shutdown() {
        tracing::warn!(%error, "could not release the lease");
    }
}
