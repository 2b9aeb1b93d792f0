//! The sites of modes `fence` and `token` run each occurrence as `fencepost run` does: through the
//! library's [`RunSession`], driven here in simulated time (one attempt at the lease per session;
//! a session that is refused, or whose wait for the ledger runs out, is followed by another
//! `acquire_every_ms` later, as a scheduler runs `fencepost run` again).

use super::world::{agent_id, agent_name, run_id, LeaseState, SimHolder, SimSession, World};
use super::GuardMode;
use crate::dispatch::{DispatchOptions, Refusal, RunOutcome};
use crate::id::{Claim, Epoch};
use crate::lease::LeaseCoordinator;
use crate::session::{
    Acquired, Begun, Comparison, EffectEnd, RunSession, SessionEnd, SessionPlan, SessionStep,
};

/// Where a session is after [`World::drive_session`].
enum Driven {
    /// Waiting for its time, or for its effect to land.
    Parked,
    /// Ended.
    Ended,
}

impl World<'_> {
    /// Starts sessions of the site's backlog, one occurrence after the other, until one parks (its
    /// effect in flight, a wait for the ledger) or every agent waits for its next try.
    pub(super) fn work_sessions(&mut self, index: usize, local: u64) {
        if self.sites[index].session.is_some() {
            if let Driven::Ended = self.drive_session(index, local) {
                self.sites[index].session = None;
            }
            return;
        }
        let items: Vec<(usize, u64)> = self.sites[index].backlog.iter().copied().collect();
        for (agent, occurrence) in items {
            let gated = matches!(
                self.sites[index].leases[agent],
                LeaseState::Idle { next_try_local_ms } if local < next_try_local_ms
            );
            if gated {
                continue;
            }
            self.sites[index].session = Some(SimSession {
                machine: RunSession::new(SessionPlan {
                    started_ms: local,
                    wait_ms: self.config.run_wait_ms,
                    poll_ms: self.config.sync_every_ms,
                    retry_in_doubt: self.mode == GuardMode::Token,
                }),
                agent,
                occurrence,
                run_id: run_id(agent, occurrence),
                sync_at: None,
                refusal: None,
            });
            match self.drive_session(index, local) {
                Driven::Parked => return,
                Driven::Ended => self.sites[index].session = None,
            }
        }
    }

    /// Answers the session's steps until it parks or ends.
    fn drive_session(&mut self, index: usize, local: u64) -> Driven {
        loop {
            let Some(session) = self.sites[index].session.as_mut() else {
                return Driven::Ended;
            };
            if session.sync_at.is_some_and(|at_ms| local < at_ms) {
                return Driven::Parked;
            }
            if session.sync_at.take().is_some() {
                if let Some(ledger) = self.sites[index].ledger.as_mut() {
                    let _ = ledger.sync();
                }
                self.session_mut(index).machine.synced(local);
                continue;
            }
            let step = session.machine.step(local);
            match step {
                SessionStep::AskOracle => {
                    let session = self.session_mut(index);
                    let (agent, run) = (session.agent, session.run_id.clone());
                    let committed = self.sites[index]
                        .ledger
                        .as_mut()
                        .is_some_and(|ledger| ledger.committed_run(&agent_name(agent), &run).is_some());
                    self.session_mut(index).machine.oracle_answered(committed);
                }
                SessionStep::Acquire { .. } => self.session_acquire(index, local),
                SessionStep::SyncAndCheckGrant { epoch } => self.session_check_grant(index, local, epoch),
                SessionStep::GiveBack { epoch } => {
                    self.give_back(index, epoch);
                    self.session_mut(index).machine.given_back();
                }
                SessionStep::Compare => self.session_compare(index, local),
                SessionStep::SyncAt { at_ms, .. } => self.session_mut(index).sync_at = Some(at_ms),
                SessionStep::Begin {
                    epoch,
                    retry_in_doubt,
                } => {
                    self.session_begin(index, local, epoch, retry_in_doubt);
                }
                // The effect is in flight: `land` answers.
                SessionStep::RunEffect { .. } | SessionStep::Waiting => return Driven::Parked,
                // `land` recorded the outcome through the permit.
                SessionStep::Record { .. } => self.session_mut(index).machine.recorded(),
                SessionStep::Release { epoch } => {
                    self.give_back(index, epoch);
                    self.session_mut(index).machine.released();
                }
                SessionStep::Done(end) => {
                    self.session_ended(index, local, end);
                    return Driven::Ended;
                }
            }
        }
    }

    fn session_mut(&mut self, index: usize) -> &mut SimSession {
        self.sites[index]
            .session
            .as_mut()
            .unwrap_or_else(|| unreachable!("driven only while the site has a session"))
    }

    /// [`SessionStep::Acquire`]: one attempt, raising the floor from the ledger first.
    fn session_acquire(&mut self, index: usize, local: u64) {
        let agent = self.session_mut(index).agent;
        let granted = self.acquire_once(index, agent, local);
        let acquired = match granted.map(|renewal| (Epoch::new(renewal.epoch()), renewal)) {
            Some((Ok(epoch), renewal)) => {
                self.hold(index, agent, renewal);
                Acquired::Granted { epoch }
            }
            // Not granted (or at an epoch no coordinator mints): the next session starts
            // acquire_every_ms later.
            _ => {
                self.sites[index].leases[agent] = LeaseState::Idle {
                    next_try_local_ms: local + self.keeper.acquire_every_ms,
                };
                Acquired::Refused
            }
        };
        self.session_mut(index).machine.acquired(local, acquired);
    }

    /// [`SessionStep::SyncAndCheckGrant`]: a grant the ledger has seen is given back (rule L5).
    fn session_check_grant(&mut self, index: usize, local: u64, epoch: Epoch) {
        let agent = self.session_mut(index).agent;
        let stale = self.sites[index].ledger.as_mut().is_some_and(|ledger| {
            let _ = ledger.sync();
            let grant = Claim {
                agent: agent_id(agent),
                device: ledger.device().clone(),
                epoch,
            };
            ledger.stale_grant(&grant).is_some()
        });
        if stale {
            self.report.refused_at_fence += 1;
        }
        self.session_mut(index).machine.grant_checked(local, stale);
    }

    /// [`SessionStep::Compare`]: the ledger against what the earlier holders published (H3).
    fn session_compare(&mut self, index: usize, local: u64) {
        let agent = self.session_mut(index).agent;
        let name = agent_name(agent);
        let (holds, handed_over) = match &self.sites[index].leases[agent] {
            LeaseState::Holding { renewal, .. } => (renewal.holds(local), renewal.handed_over().cloned()),
            LeaseState::Idle { .. } => (false, None),
        };
        let published = match handed_over {
            Some(frontier) => Ok(frontier),
            None => self.coordinator.published_frontier(&name),
        };
        let missing = match (&published, self.sites[index].ledger.as_ref()) {
            (Ok(frontier), Some(ledger)) => Some(ledger.behind(frontier)),
            _ => None,
        };
        let comparison = match missing {
            Some(missing) if missing.is_empty() => Comparison::Complete,
            _ if !holds => Comparison::LeaseLost,
            Some(missing) => Comparison::Missing {
                differs: missing.iter().any(|missing| missing.differs),
            },
            None => Comparison::Unread,
        };
        if let (Comparison::Missing { .. }, LeaseState::Holding { behind_since_ms, .. }) =
            (comparison, &mut self.sites[index].leases[agent])
        {
            behind_since_ms.get_or_insert(self.now_ms);
        }
        self.session_mut(index).machine.compared(local, comparison);
    }

    /// [`SessionStep::Begin`]: the dispatch's first half; the effect then flies to the resource.
    fn session_begin(&mut self, index: usize, local: u64, epoch: Epoch, retry_in_doubt: bool) {
        let (agent, occurrence, run) = {
            let session = self.session_mut(index);
            (session.agent, session.occurrence, session.run_id.clone())
        };
        let name = agent_name(agent);
        let site = &mut self.sites[index];
        let (holds, handed_over) = match &site.leases[agent] {
            LeaseState::Holding { renewal, .. } => (renewal.holds(local), renewal.handed_over().cloned()),
            LeaseState::Idle { .. } => (false, None),
        };
        let holder = SimHolder {
            coordinator: &self.coordinator,
            agent_id: name.clone(),
            device_id: &site.name,
            epoch: epoch.get(),
            holds,
            handed_over,
        };
        let Some(ledger) = site.ledger.as_mut() else {
            return;
        };
        let retried = retry_in_doubt && ledger.in_doubt_run(&name, &run, epoch.get()).is_some();
        let begun = ledger.begin(
            &holder,
            &run,
            DispatchOptions::default().retry_in_doubt(retry_in_doubt),
        );
        self.caught_up(index, agent);
        match begun {
            Ok(permit) => {
                self.report.in_doubt_retried += u64::from(retried);
                self.begun_generation
                    .entry(run.clone())
                    .or_insert(self.generation);
                self.start(index, (agent, occurrence), run, epoch.get(), Some(permit));
                let session = self.session_mut(index);
                session.machine.begun(Begun::Permitted);
                let _run_effect = session.machine.step(local);
            }
            Err(refusal) => {
                let session = self.session_mut(index);
                session.refusal = Some(refusal);
                session.machine.begun(Begun::Refused);
            }
        }
    }

    /// The effect of the site's session landed with `outcome` (recorded through its permit).
    pub(super) fn session_effect_landed(&mut self, index: usize, outcome: RunOutcome) {
        if let Some(session) = self.sites[index].session.as_mut() {
            session.machine.effect_ended(match outcome {
                RunOutcome::Committed => EffectEnd::Succeeded,
                RunOutcome::Failed => EffectEnd::Failed,
            });
        }
    }

    /// [`SessionStep::GiveBack`] and [`SessionStep::Release`]: the release, publishing what was
    /// pushed (rule H2), and the tenure's end.
    fn give_back(&mut self, index: usize, epoch: Epoch) {
        let epoch = epoch.get();
        let agent = self.session_mut(index).agent;
        let name = agent_name(agent);
        let device = self.sites[index].name.clone();
        let unpublished = match &self.sites[index].leases[agent] {
            LeaseState::Holding { renewal, .. } if renewal.epoch() == epoch => {
                Some(renewal.unpublished().clone())
            }
            _ => None,
        };
        let _ = match unpublished {
            Some(frontier) if !frontier.is_empty() => self
                .coordinator
                .release_publishing(&name, &device, epoch, &frontier),
            _ => self.coordinator.release(&name, &device, epoch),
        };
        self.end_tenure(index, agent);
    }

    /// What the site does after a session's `end`: the occurrence leaves the backlog once it ran
    /// or committed; an operator settles a run in doubt (mode `fence`).
    fn session_ended(&mut self, index: usize, local: u64, end: SessionEnd) {
        let Some(session) = self.sites[index].session.take() else {
            return;
        };
        let key = (session.agent, session.occurrence);
        match (end, session.refusal) {
            (SessionEnd::AlreadyCommitted, _) | (_, Some(Refusal::AlreadyCommitted { .. })) => {
                self.sites[index].backlog.remove(&key);
            }
            (_, Some(Refusal::InDoubt { run })) => self.operator_resolves(index, key, &run),
            (_, Some(Refusal::StaleEpoch { .. } | Refusal::NotHeld { .. } | Refusal::Error(_))) => {
                self.report.refused_at_fence += 1;
            }
            // Not granted, or the wait ran out: the next session tries again later.
            (SessionEnd::NotAcquired | SessionEnd::LedgerBehind | SessionEnd::StaleGrants { .. }, _) => {
                let next = local + self.keeper.acquire_every_ms;
                if let LeaseState::Idle { next_try_local_ms } = &mut self.sites[index].leases[session.agent] {
                    *next_try_local_ms = (*next_try_local_ms).max(next);
                }
            }
            _ => {}
        }
        // The site keeps its handle on the session until here; `work_sessions` clears it.
        self.sites[index].session = None;
    }
}
