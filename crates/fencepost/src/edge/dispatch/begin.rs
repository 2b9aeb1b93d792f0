//! The first half of a dispatch, as a step: [`Ledger::begin`] (the checks, the `pending`, the
//! fence), and [`Ledger::resolve`], which settles a run in doubt.

use super::{DispatchError, DispatchOptions, Permit, Refusal, RunOutcome};
use crate::fence::{check_dispatch, FenceDecision, FencingToken, Holder};
use crate::id::{AgentId, RunId};
use crate::lease::{Intent, IntentStatus, LeaseError};
use crate::ledger::{Ledger, LedgerError};
use crate::metrics;
use crate::oplog::OpRecord;

impl Ledger {
    /// Settles a run in doubt (rule D2) by someone who found out whether its effect happened
    /// (an operator who checked the resource; `fencepost ledger resolve`): records `outcome` at
    /// the epoch of the attempt in doubt (the newest, when several are), which ends the doubt.
    /// Make sure that attempt is no longer running first (its lease has ended).
    ///
    /// # Errors
    /// [`LedgerError::NotInDoubt`] (nothing written), and the errors of
    /// [`record`](Self::record).
    pub fn resolve(
        &mut self,
        agent_id: &AgentId,
        run_id: &RunId,
        outcome: RunOutcome,
    ) -> Result<OpRecord, LedgerError> {
        let Some(doubt) = self.in_doubt_run(agent_id, run_id, u64::MAX) else {
            return Err(LedgerError::NotInDoubt {
                agent_id: agent_id.to_string(),
                run_id: run_id.to_string(),
            });
        };
        let status = IntentStatus::from(outcome);
        self.record(&Intent::new(
            agent_id.as_str(),
            run_id.as_str(),
            doubt.epoch,
            status,
        ))
    }

    /// The first half of a dispatch, as a step (rules D1, D2, F4, F6, L5): checks, in order, that
    /// the holder still holds the lease, that the run has not committed (the oracle), that the
    /// holder's epoch is not below the ledger's fencing epoch nor one another device already held
    /// ([`DispatchError::EpochReused`]), that the ledger is not damaged, and
    /// that the run is not in doubt (unless `options` retry it); then stores the `pending`,
    /// checks that no other writer of this device began the same run first, asks the fence
    /// ([`check_dispatch`]) and checks the holder's own timing once more. A refusal at the fence
    /// or after it records `failed`. On success, the effect may run: see [`Permit`].
    ///
    /// [`dispatch`](super::dispatch) is this, the effect, and [`Permit::finish`].
    ///
    /// Each verdict is counted ([`metrics::FENCE_DECISIONS`](crate::metrics::FENCE_DECISIONS)).
    ///
    /// # Errors
    /// A [`Refusal`]; see each variant for what was written.
    pub fn begin(
        &mut self,
        holder: &dyn Holder,
        run_id: &RunId,
        options: DispatchOptions,
    ) -> Result<Permit, Refusal> {
        let begun = self.begin_uncounted(holder, run_id, options);
        let decision = match &begun {
            Ok(_) => "proceed",
            Err(refusal) => refusal.kind(),
        };
        metrics::count(metrics::FENCE_DECISIONS, holder.agent_id(), "decision", decision);
        if let Err(Refusal::LedgerBehind { .. }) = &begun {
            metrics::count_agent(metrics::LEDGER_BEHIND, holder.agent_id());
        }
        begun
    }

    /// [`begin`](Self::begin), without counting its verdict.
    fn begin_uncounted(
        &mut self,
        holder: &dyn Holder,
        run_id: &RunId,
        options: DispatchOptions,
    ) -> Result<Permit, Refusal> {
        self.check_before_pending(holder, run_id, options)?;
        self.write_pending(holder, run_id)?;
        self.fence(holder, run_id)?;
        Ok(Permit {
            token: FencingToken {
                agent_id: holder.agent_id().to_owned(),
                run_id: run_id.to_string(),
                epoch: holder.epoch(),
            },
            device_id: self.device_id().to_owned(),
        })
    }

    /// What is checked before the `pending` is written: the ids, the holder's device and its
    /// lease, the oracle, the epoch (neither below the fencing epoch nor another device's), the
    /// damage, the records earlier holders published (rule H3), and the doubt. Nothing is written.
    fn check_before_pending(
        &mut self,
        holder: &dyn Holder,
        run_id: &RunId,
        options: DispatchOptions,
    ) -> Result<(), Refusal> {
        let run_id = run_id.as_str();
        if holder.device_id() != self.device_id() {
            return Err(DispatchError::DeviceMismatch {
                keeper: holder.device_id().to_owned(),
                ledger: self.device_id().to_owned(),
            }
            .into());
        }
        let agent_id = holder.agent_id();
        let epoch = holder.epoch();
        // With a snapshot, the run's stored entry joins the state (a failed read is damage,
        // refused below).
        self.prepare_run(agent_id, run_id);
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
        if let Some(other_device) = self
            .view()
            .other_pending_device(agent_id, epoch, holder.device_id())
        {
            return Err(DispatchError::EpochReused {
                agent_id: agent_id.to_owned(),
                epoch,
                other_device,
            }
            .into());
        }
        let damage = self.damage();
        if !damage.is_empty() {
            return Err(LedgerError::Damaged {
                problems: damage.into_iter().cloned().collect(),
            }
            .into());
        }
        // Rule H3: every record the earlier holders published must be here first, or a run they
        // began or finished looks new.
        let published = match holder.handed_over() {
            Some(frontier) => frontier,
            None => holder.coordinator().published_frontier(agent_id)?,
        };
        let missing = self.behind(&published);
        if !missing.is_empty() {
            return Err(Refusal::LedgerBehind { missing });
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
        Ok(())
    }

    /// Writes the `pending` of the holder's attempt (a `failed` queued behind it when it cannot
    /// be stored), and refuses when another writer of this device began the same run first.
    fn write_pending(&mut self, holder: &dyn Holder, run_id: &RunId) -> Result<(), Refusal> {
        let run_id = run_id.as_str();
        let (agent_id, epoch) = (holder.agent_id(), holder.epoch());
        let intent = |status| Intent::new(agent_id, run_id, epoch, status);
        if let Err(error) = self.record(&intent(IntentStatus::Pending)) {
            // Not stored, or stored with its answer lost: nothing runs, and a `failed` queued
            // behind it settles the attempt wherever the `pending` got to (stored by the next
            // flush, or kept in the outbox, with it).
            self.queue_behind_unsent(intent(IntentStatus::Failed));
            return Err(error.into());
        }
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
        Ok(())
    }

    /// The fence (rule D1) after the `pending`: the oracle, the coordinator (by publishing the
    /// `pending`, rule H2), and the holder's own timing. A refusal records `failed`.
    fn fence(&mut self, holder: &dyn Holder, run_id: &RunId) -> Result<(), Refusal> {
        let run_id = run_id.as_str();
        let (agent_id, epoch) = (holder.agent_id(), holder.epoch());
        let intent = |status| Intent::new(agent_id, run_id, epoch, status);
        let refuse = |ledger: &mut Ledger| {
            if let Err(error) = ledger.record(&intent(IntentStatus::Failed)) {
                tracing::warn!(%error, run_id, "could not store a failed intent; it stays queued");
            }
        };
        // The fence (rule D1). The oracle first: the append may have brought a commit of the
        // run (another writer of this device).
        if let Some(committed) = self.state().committed_run(agent_id, run_id) {
            let committed_op_id = committed.op_id;
            refuse(self);
            return Err(Refusal::AlreadyCommitted { committed_op_id });
        }
        // Then the coordinator, by publishing the `pending` (rule H2): the publication succeeds
        // only for the holder at its epoch, so it is the fence's "am I still the holder at epoch
        // N?" and costs no round trip of its own. A successor, which reads the published frontier
        // after its grant, waits for this `pending` before it dispatches anything (rule H3).
        let decision =
            match holder
                .coordinator()
                .publish_frontier(agent_id, holder.device_id(), epoch, &self.pushed())
            {
                Ok(()) => FenceDecision::Proceed,
                // Refused: the full verdict (who holds it now) from the fence's read.
                Err(LeaseError::Lost { .. }) => match check_dispatch(
                    holder.coordinator(),
                    self.state(),
                    agent_id,
                    run_id,
                    holder.device_id(),
                    epoch,
                ) {
                    Ok(FenceDecision::Proceed) | Err(_) => FenceDecision::NotHeld { claimed_epoch: epoch },
                    Ok(decision) => decision,
                },
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
        Ok(())
    }
}
