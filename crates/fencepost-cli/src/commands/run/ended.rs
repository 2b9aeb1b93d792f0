//! How `run` reports the end of its run session: the exit status and what it says.

use super::*;

/// What `run` reports when the run session ended with an error (nothing ran).
pub(super) fn run_error(
    error: RunError,
    ledger: &Ledger,
    settings: &Settings,
    run_id: &str,
    agent: &str,
    stored: Option<Result<Stored>>,
) -> Result<i32> {
    match error {
        RunError::Ledger(LedgerError::Damaged { .. }) => {
            refuse_damage(ledger, settings)?;
            bail!("the ledger is damaged")
        }
        RunError::StaleGrants { epoch, why, .. } => bail!(
            "the coordinator granted epoch {epoch} of {agent}, {}, four times in a row (it lost or rolled back its state, and keeps doing so); not running {run_id}",
            stale_why(&why, &settings.device)
        ),
        RunError::Ledger(error) => not_dispatched(error.into(), stored, run_id, agent),
        RunError::Dispatch(error) => not_dispatched(error.into(), stored, run_id, agent),
        error => Err(error.into()),
    }
}

/// The dispatch failed (the ledger, the fence): `error` kept whole in the chain (so that
/// [`transient`] sees it), and a record that could not be stored logged.
fn not_dispatched(
    error: anyhow::Error,
    stored: Option<Result<Stored>>,
    run_id: &str,
    agent: &str,
) -> Result<i32> {
    if let Some(Err(unstored)) = stored {
        tracing::warn!(error = %crate::exit::one_line(&unstored), "could not write nor queue the record of an attempt that did not run");
    }
    Err(error).context(format!("{run_id} of {agent} could not be dispatched"))
}

/// A run session's end, as `run` reports it.
pub(super) struct Ended<'a> {
    pub(super) settings: &'a Settings,
    pub(super) args: &'a RunArgs,
    pub(super) agent: &'a str,
    pub(super) run_id: &'a str,
    /// The epoch held (0 when none was).
    pub(super) epoch: u64,
    pub(super) command: &'a CommandRun,
    /// The signal that stopped the run, if one did.
    pub(super) signal: Option<nix::sys::signal::Signal>,
    /// The revoked devices of a protected ledger, each with its cut (the first record voided).
    pub(super) revoked: std::collections::BTreeMap<String, u64>,
}

impl Ended<'_> {
    /// Warns of a release that failed, or found the lease lost (unless the command already
    /// reported the loss).
    pub(super) fn warn_release(&self, release: Option<&Release>) {
        let (agent, epoch) = (self.agent, self.epoch);
        match release {
            Some(Release::Failed(error)) => {
                err!("fencepost: warning: could not release the lease of {agent} at epoch {epoch} ({error}); it ends with its TTL");
            }
            Some(Release::Lost(loss)) if !matches!(self.command.ending, Some(Ending::LeaseLost(_))) => {
                err!(
                    "fencepost: warning: the lease of {agent} at epoch {epoch} was lost before it could be released ({:?}); another host may have taken it",
                    loss.reason
                );
            }
            _ => {}
        }
    }

    /// Says where the records of a run that could not be written went; `Some` exit status when
    /// that decides it (a signal came meanwhile).
    pub(super) fn report_stored(
        &self,
        stored: Result<Stored>,
        executed: bool,
        report: &mut RunReport,
    ) -> Result<Option<i32>> {
        let (agent, run_id) = (self.agent, self.run_id);
        let ran = if executed {
            "ran, but its outcome"
        } else {
            "did not run; its record"
        };
        match stored {
            Ok(Stored::Written) => Ok(None),
            Ok(Stored::Queued {
                count,
                path,
                cause,
                passes,
                signal,
            }) => {
                report.queued = count;
                let queued = format!(
                    "{run_id} of {agent} {ran} could not be written to {} ({cause}); it is queued on this host in {} ({}), and the next fencepost command of this host that writes to the ledger, or `fencepost ledger flush`, writes it",
                    self.settings.ledger_label(),
                    path.display(),
                    plural(count as u64, "record")
                );
                if let Some(signal) = signal {
                    err!("fencepost: got {signal} while writing the outcome: {queued}");
                    return Ok(Some(128 + signal as i32));
                }
                if !passes {
                    // The ledger needs a repair first: until then the run is in doubt elsewhere.
                    bail!("{queued} once the ledger is repaired; until then other hosts find the run in doubt");
                }
                err!("fencepost: warning: {queued} (it did not come back within --outcome-wait)");
                Ok(None)
            }
            Err(error) => bail!(
                "{run_id} of {agent} {ran} could not be written to {}, nor queued on this host ({}); the run stays in doubt until `fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed` records it",
                self.settings.ledger_label(),
                crate::exit::one_line(&error)
            ),
        }
    }

    /// The exit status of `outcome`, said on stderr.
    pub(super) fn exit_status(&self, outcome: Outcome<(), String>, report: &mut RunReport) -> i32 {
        let (agent, run_id, epoch) = (self.agent, self.run_id, self.epoch);
        match outcome {
            Outcome::Committed { .. } => EXIT_RAN_OK,
            Outcome::Failed { error: reason, .. } => match self.command.stopped_before_start {
                // Nothing ran: `failed` settles the `pending`, and fencepost exits as the signal
                // says, as it does when the signal comes while it waits.
                Some(signal) => {
                    err!("fencepost: {reason}: {run_id} of {agent} did not run (recorded failed at epoch {epoch})");
                    128 + signal as i32
                }
                None if self.command.lost_before_start => {
                    err!("fencepost: {reason}: {run_id} of {agent} did not run (recorded failed at epoch {epoch}; the next run runs it)");
                    EXIT_LEASE_LOST
                }
                None => {
                    err!("fencepost: {run_id} of {agent} ran at epoch {epoch} and failed: {reason}");
                    EXIT_RAN_FAILED
                }
            },
            Outcome::Interrupted { error, .. } => {
                err!(
                    "fencepost: {run_id} of {agent} ran at epoch {epoch} and was interrupted: {error}. \
It may have done its effect, or part of it, so it is in doubt: check, then record it with \
`fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed` or rerun with --retry-in-doubt"
                );
                match self.command.ending {
                    Some(Ending::LeaseLost(_)) => EXIT_LEASE_LOST,
                    _ => EXIT_RAN_FAILED,
                }
            }
            Outcome::AlreadyCommitted { .. } => {
                err!("fencepost: {run_id} of {agent} already committed; not running it again");
                EXIT_ALREADY_COMMITTED
            }
            Outcome::Held {
                holder,
                epoch,
                expires_at_ms,
                last_error,
            } => self.held(holder, epoch, expires_at_ms, last_error, report),
            Outcome::InDoubt { run } if self.revoked.contains_key(&*run.device_id) => {
                // Found by an adversary: a revoked device's void commit was reported as a run
                // its host had recorded no outcome of.
                err!(
                    "fencepost: {run_id} of {agent} is in doubt: {} started it at epoch {}, and was revoked from record {} of its log on: what it recorded from there (an outcome included) counts for nothing. \
Check whether its effect happened, then rerun with --retry-in-doubt, or record it with `fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed`",
                    run.device_id, run.epoch, self.revoked[&*run.device_id]
                );
                EXIT_IN_DOUBT
            }
            Outcome::InDoubt { run } => {
                err!(
                    "fencepost: {run_id} of {agent} is in doubt: {} started it at epoch {} and has recorded no outcome \
(it may still be running there, or its host died mid-command). Check whether its effect happened, then rerun with --retry-in-doubt, or record it with \
`fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed`",
                    run.device_id, run.epoch
                );
                EXIT_IN_DOUBT
            }
            Outcome::ConcurrentAttempt { run } => {
                err!(
                    "fencepost: {run_id} of {agent} was started at epoch {} by another process with device id {} just before this one; not running it again (see `fencepost ledger runs`)",
                    run.epoch, run.device_id
                );
                EXIT_IN_DOUBT
            }
            Outcome::LeaseLost {
                current: Some((current_epoch, current_holder)),
                ..
            } => {
                err!("fencepost: lost {agent} to {current_holder} (epoch {current_epoch}) before {run_id} could start");
                EXIT_LEASE_LOST
            }
            Outcome::LeaseLost { current: None, .. } => {
                err!("fencepost: lost the lease of {agent} before {run_id} could start");
                EXIT_LEASE_LOST
            }
            Outcome::LedgerBehind { missing } => {
                err!(
                    "{}",
                    ledger_behind_message(agent, run_id, &missing, self.settings)
                );
                EXIT_LEDGER_BEHIND
            }
            Outcome::Stopped { stage } => self.stopped(stage),
            _ => {
                err!("fencepost: {run_id} of {agent} ended in a way this fencepost does not know");
                EXIT_ERROR
            }
        }
    }

    /// Exit 4: another host held the lease for the whole wait.
    pub(super) fn held(
        &self,
        holder: String,
        epoch: u64,
        expires_at_ms: u64,
        last_error: Option<LeaseError>,
        report: &mut RunReport,
    ) -> i32 {
        let (agent, run_id) = (self.agent, self.run_id);
        // Exit 4 whenever some attempt reached the coordinator and was refused; 10 only when none
        // did (docs/running.md's exit-status table says so).
        if let Some(last_error) = last_error {
            let held = LeaseError::Held {
                agent_id: agent.to_owned(),
                holder,
                epoch,
                expires_at_ms,
            };
            err!("fencepost: {held}, and when the wait ran out the last attempt failed ({last_error}); not running {run_id}");
            return EXIT_HELD_ELSEWHERE;
        }
        let named = crate::holder::describe(self.settings, agent, &holder, epoch);
        if self.args.wait == 0 {
            err!("fencepost: {agent} is held by {named} at epoch {epoch}; not running {run_id} (use --wait to wait for it)");
        } else {
            err!(
                "fencepost: {agent} is still held by {named} at epoch {epoch} after waiting {} ms (--wait); not running {run_id}",
                self.args.wait
            );
        }
        report.holder = Some(holder);
        EXIT_HELD_ELSEWHERE
    }

    /// Exit 128 + the signal that stopped the run before its command started.
    pub(super) fn stopped(&self, stage: Stage) -> i32 {
        let (agent, run_id) = (self.agent, self.run_id);
        let Some(signal) = self.command.stopped_before_start.or(self.signal) else {
            err!("fencepost: the wait for the lease of {agent} was stopped; {run_id} did not run");
            return EXIT_ERROR;
        };
        match stage {
            Stage::Acquiring => {
                err!("fencepost: got {signal} while waiting for the lease of {agent}; {run_id} did not run")
            }
            Stage::Granted => err!(
                "fencepost: got {signal} while the lease of {agent} was being granted; it was given back, and {run_id} did not run"
            ),
            Stage::WaitingForLedger => err!(
                "fencepost: got {signal} while waiting for the ledger; the lease of {agent} was given back, and {run_id} did not run"
            ),
        }
        128 + signal as i32
    }
}
