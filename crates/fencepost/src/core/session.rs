//! The run session: the steps that run one occurrence of a job once across sites, as values a
//! driver acts on (sans I/O, like the keeper's [`Acquisition`](crate::keeper::Acquisition) and
//! [`Renewal`](crate::keeper::Renewal) machines).
//!
//! A [`RunSession`] decides; its driver does the I/O and answers. The order is the protocol:
//!
//! 1. **The oracle** ([`SessionStep::AskOracle`]): a run the ledger already holds committed ends
//!    here, before any lease is asked for.
//! 2. **The lease** ([`SessionStep::Acquire`]): acquired above the ledger's fencing epoch (the
//!    floor raised first, rule L5), waiting at most what is left of the session's wait.
//! 3. **A fresh grant** ([`SessionStep::SyncAndCheckGrant`]): a coordinator that lost or rolled
//!    back its state may grant an epoch the ledger has seen (another host's, or this device id's
//!    own); it is given back ([`SessionStep::GiveBack`]) and acquired again above it, at most
//!    [`FRESH_GRANT_ATTEMPTS`] times, so that no two attempts ever hold one fencing token.
//! 4. **The ledger caught up** ([`SessionStep::Compare`], rule H3): nothing runs until the ledger
//!    has every record the agent's earlier holders published; the driver syncs every `poll_ms`
//!    ([`SessionStep::SyncAt`]) while the wait lasts, holding the lease.
//! 5. **The fence and the in-doubt decision** ([`SessionStep::Begin`], rules D1, D2): the
//!    `pending` stored and the fence asked; a run in doubt runs again only when the plan says so.
//! 6. **The effect** ([`SessionStep::RunEffect`]) under the fencing token, then **its outcome**
//!    ([`SessionStep::Record`]; none when nobody knows whether it happened: in doubt).
//! 7. **The release** ([`SessionStep::Release`]), publishing what was pushed (rule H2): after
//!    every end that held the lease, whatever it was.
//!
//! The session's ends ([`SessionEnd`]) carry no payload: the driver keeps what it read (the
//! holder, the records missing, the run in doubt) and names the end with it.
//! [`run_once`](crate::run::run_once) is the driver programs call; the CLI's `fencepost run`
//! and the simulator drive this machine too.
//!
//! ```
//! use fencepost::id::Epoch;
//! use fencepost::session::{Acquired, Begun, Comparison, EffectEnd, RunSession, SessionEnd, SessionPlan, SessionStep};
//!
//! let epoch = Epoch::new(3)?;
//! let mut session = RunSession::new(SessionPlan { started_ms: 0, wait_ms: 1_000, poll_ms: 200, retry_in_doubt: false });
//! assert_eq!(session.step(0), SessionStep::AskOracle);
//! session.oracle_answered(false);
//! assert_eq!(session.step(0), SessionStep::Acquire { max_wait_ms: 1_000 });
//! session.acquired(5, Acquired::Granted { epoch });
//! assert_eq!(session.step(5), SessionStep::SyncAndCheckGrant { epoch });
//! session.grant_checked(6, false);
//! assert_eq!(session.step(6), SessionStep::Compare);
//! // The ledger lacks what the previous holder published: sync and look again.
//! session.compared(7, Comparison::Missing { differs: false });
//! assert_eq!(session.step(7), SessionStep::SyncAt { at_ms: 207, first: true });
//! session.synced(207);
//! assert_eq!(session.step(207), SessionStep::Compare);
//! session.compared(208, Comparison::Complete);
//! assert_eq!(session.step(208), SessionStep::Begin { epoch, retry_in_doubt: false });
//! session.begun(Begun::Permitted);
//! assert_eq!(session.step(209), SessionStep::RunEffect { epoch });
//! session.effect_ended(EffectEnd::Succeeded);
//! assert_eq!(session.step(300), SessionStep::Record { committed: true });
//! session.recorded();
//! assert_eq!(session.step(301), SessionStep::Release { epoch });
//! session.released();
//! assert_eq!(session.step(302), SessionStep::Done(SessionEnd::Ran { epoch, committed: true }));
//! # Ok::<(), fencepost::id::EpochError>(())
//! ```

use crate::id::Epoch;

/// How many grants in a row a session takes before it gives up on a coordinator that keeps
/// granting epochs the ledger has seen ([`SessionEnd::StaleGrants`]).
pub const FRESH_GRANT_ATTEMPTS: u32 = 4;

/// What a [`RunSession`] is for, in the driver's clock (ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPlan {
    /// When the session starts.
    pub started_ms: u64,
    /// How long, all told, it may wait: for another holder's lease to end, then for the ledger to
    /// receive what the earlier holders published.
    pub wait_ms: u64,
    /// How often the ledger is synced while the session waits for it.
    pub poll_ms: u64,
    /// Run the occurrence although it is in doubt (rule D2): its effect was checked not to have
    /// happened, or running it twice is harmless.
    pub retry_in_doubt: bool,
}

/// Where a session was when it was told to stop ([`RunSession::stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for the lease: nothing is held.
    Acquiring,
    /// Just granted: the lease is given back.
    Granted,
    /// Holding the lease, waiting for the ledger (rule H3): the lease is given back.
    WaitingForLedger,
}

/// What a [`RunSession`] asks its driver to do next. Each asks for one answer, named in its docs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionStep {
    /// Ask the ledger whether the run committed already: [`RunSession::oracle_answered`].
    AskOracle,
    /// Acquire the lease, raising the floor to the ledger's fencing epoch first, waiting at most
    /// `max_wait_ms` for another holder: [`RunSession::acquired`].
    Acquire {
        /// What is left of the wait.
        max_wait_ms: u64,
    },
    /// Sync the ledger, then say whether the grant is one it has seen (an epoch below its fencing
    /// epoch, or one already held): [`RunSession::grant_checked`].
    SyncAndCheckGrant {
        /// The epoch granted.
        epoch: Epoch,
    },
    /// Give the stale grant back, then [`RunSession::given_back`] (the next step acquires again).
    GiveBack {
        /// The epoch to give back.
        epoch: Epoch,
    },
    /// Compare the ledger with what the agent's earlier holders published:
    /// [`RunSession::compared`].
    Compare,
    /// Sync the ledger at `at_ms`, then [`RunSession::synced`]; `first` on the first wait (say
    /// once that the run waits for the ledger).
    SyncAt {
        /// When.
        at_ms: u64,
        /// Whether this is the first wait of the session.
        first: bool,
    },
    /// Store the `pending` and ask the fence (`Ledger::begin`): [`RunSession::begun`].
    Begin {
        /// The epoch held.
        epoch: Epoch,
        /// Whether a run in doubt runs again.
        retry_in_doubt: bool,
    },
    /// Run the effect with the fencing token of `epoch`: [`RunSession::effect_ended`].
    RunEffect {
        /// The epoch it runs under.
        epoch: Epoch,
    },
    /// Record the effect's outcome (`committed`, else `failed`): [`RunSession::recorded`].
    Record {
        /// Whether the effect happened.
        committed: bool,
    },
    /// Give the lease back, publishing what was pushed (rule H2): [`RunSession::released`].
    Release {
        /// The epoch held.
        epoch: Epoch,
    },
    /// The answer to the last step has not come yet.
    Waiting,
    /// The session ended.
    Done(SessionEnd),
}

/// How a [`RunSession`] ended. The driver keeps what each end refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEnd {
    /// The ledger held the run committed before the lease was asked for: nothing ran.
    AlreadyCommitted,
    /// The lease was not granted (held elsewhere for the whole wait, or the coordinator failed).
    NotAcquired,
    /// The coordinator granted epochs the ledger had seen [`FRESH_GRANT_ATTEMPTS`] times in a row.
    StaleGrants {
        /// The last one.
        epoch: Epoch,
    },
    /// The ledger still lacked records the earlier holders published when the wait ran out, or
    /// holds another log under a published device id (which syncing does not cure).
    LedgerBehind,
    /// `Ledger::begin` refused (already committed, in doubt, lease lost, …): nothing ran.
    Refused,
    /// The effect ran and its outcome was recorded.
    Ran {
        /// The epoch it ran under.
        epoch: Epoch,
        /// Whether it happened (`committed`) or not (`failed`).
        committed: bool,
    },
    /// The effect started and nobody knows whether it happened: no outcome was recorded, so the
    /// run is in doubt (rule D2).
    Interrupted {
        /// The epoch it ran under.
        epoch: Epoch,
    },
    /// The driver was told to stop before the effect ([`RunSession::stop`]).
    Stopped(Stage),
    /// The driver failed ([`RunSession::fail`]); the lease, if held, was given back.
    Aborted,
}

/// What the driver's acquisition ended with ([`RunSession::acquired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The lease, at `epoch`.
    Granted {
        /// The fencing token.
        epoch: Epoch,
    },
    /// Not granted: held elsewhere for the whole wait, or the coordinator failed.
    Refused,
    /// The wait was stopped (the driver was told to stop).
    Stopped,
}

/// The ledger against what the agent's earlier holders published ([`RunSession::compared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// It has every record they published.
    Complete,
    /// It lacks some; `differs` when it holds another log under a published device id.
    Missing {
        /// Syncing does not cure it.
        differs: bool,
    },
    /// What they published could not be read.
    Unread,
    /// The lease is no longer held: the fence reports it.
    LeaseLost,
}

/// What `Ledger::begin` answered ([`RunSession::begun`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begun {
    /// A permit: the effect may run.
    Permitted,
    /// A refusal: nothing runs.
    Refused,
}

/// How the effect ended ([`RunSession::effect_ended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectEnd {
    /// It happened.
    Succeeded,
    /// It did not happen.
    Failed,
    /// Nobody knows.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Oracle {
        asked: bool,
    },
    Acquiring {
        asked: bool,
    },
    CheckingGrant {
        epoch: Epoch,
        asked: bool,
    },
    GivingBack {
        epoch: Epoch,
        asked: bool,
    },
    Comparing {
        epoch: Epoch,
        asked: bool,
    },
    Syncing {
        epoch: Epoch,
        at_ms: u64,
        first: bool,
        asked: bool,
    },
    Beginning {
        epoch: Epoch,
        asked: bool,
    },
    Running {
        epoch: Epoch,
        asked: bool,
    },
    Recording {
        epoch: Epoch,
        committed: bool,
        asked: bool,
    },
    Releasing {
        epoch: Epoch,
        then: SessionEnd,
        asked: bool,
    },
    Done(SessionEnd),
}

/// The machine of one run session; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct RunSession {
    plan: SessionPlan,
    phase: Phase,
    /// Grants given back as stale, in a row.
    stale_grants: u32,
    /// Whether the session has waited for the ledger yet.
    waited: bool,
}

impl RunSession {
    /// The session of `plan`.
    pub fn new(plan: SessionPlan) -> Self {
        Self {
            plan,
            phase: Phase::Oracle { asked: false },
            stale_grants: 0,
            waited: false,
        }
    }

    /// When the session's wait runs out.
    pub fn deadline_ms(&self) -> u64 {
        self.plan.started_ms.saturating_add(self.plan.wait_ms)
    }

    /// The epoch held, from the grant to the release.
    pub fn epoch(&self) -> Option<Epoch> {
        match &self.phase {
            Phase::CheckingGrant { epoch, .. }
            | Phase::GivingBack { epoch, .. }
            | Phase::Comparing { epoch, .. }
            | Phase::Syncing { epoch, .. }
            | Phase::Beginning { epoch, .. }
            | Phase::Running { epoch, .. }
            | Phase::Recording { epoch, .. }
            | Phase::Releasing { epoch, .. } => Some(*epoch),
            Phase::Oracle { .. } | Phase::Acquiring { .. } | Phase::Done(_) => None,
        }
    }

    /// The end the session is on its way to while it gives the lease back, or has reached.
    pub fn ending(&self) -> Option<SessionEnd> {
        match &self.phase {
            Phase::Releasing { then, .. } | Phase::Done(then) => Some(*then),
            _ => None,
        }
    }

    /// What to do at `now_ms`. A step is handed out once; until it is answered, [`SessionStep::Waiting`].
    pub fn step(&mut self, now_ms: u64) -> SessionStep {
        let deadline = self.deadline_ms();
        let retry_in_doubt = self.plan.retry_in_doubt;
        match &mut self.phase {
            Phase::Done(end) => SessionStep::Done(*end),
            Phase::Oracle { asked }
            | Phase::Acquiring { asked }
            | Phase::CheckingGrant { asked, .. }
            | Phase::GivingBack { asked, .. }
            | Phase::Comparing { asked, .. }
            | Phase::Syncing { asked, .. }
            | Phase::Beginning { asked, .. }
            | Phase::Running { asked, .. }
            | Phase::Recording { asked, .. }
            | Phase::Releasing { asked, .. }
                if *asked =>
            {
                SessionStep::Waiting
            }
            Phase::Oracle { asked } => {
                *asked = true;
                SessionStep::AskOracle
            }
            Phase::Acquiring { asked } => {
                *asked = true;
                SessionStep::Acquire {
                    max_wait_ms: deadline.saturating_sub(now_ms),
                }
            }
            Phase::CheckingGrant { epoch, asked } => {
                *asked = true;
                SessionStep::SyncAndCheckGrant { epoch: *epoch }
            }
            Phase::GivingBack { epoch, asked } => {
                *asked = true;
                SessionStep::GiveBack { epoch: *epoch }
            }
            Phase::Comparing { asked, .. } => {
                *asked = true;
                SessionStep::Compare
            }
            Phase::Syncing {
                at_ms, first, asked, ..
            } => {
                *asked = true;
                SessionStep::SyncAt {
                    at_ms: *at_ms,
                    first: *first,
                }
            }
            Phase::Beginning { epoch, asked } => {
                *asked = true;
                SessionStep::Begin {
                    epoch: *epoch,
                    retry_in_doubt,
                }
            }
            Phase::Running { epoch, asked } => {
                *asked = true;
                SessionStep::RunEffect { epoch: *epoch }
            }
            Phase::Recording { committed, asked, .. } => {
                *asked = true;
                SessionStep::Record {
                    committed: *committed,
                }
            }
            Phase::Releasing { epoch, asked, .. } => {
                *asked = true;
                SessionStep::Release { epoch: *epoch }
            }
        }
    }

    /// The answer to [`SessionStep::AskOracle`]: whether the ledger holds the run committed.
    pub fn oracle_answered(&mut self, committed: bool) {
        if let Phase::Oracle { asked: true } = self.phase {
            self.phase = if committed {
                Phase::Done(SessionEnd::AlreadyCommitted)
            } else {
                Phase::Acquiring { asked: false }
            };
        }
    }

    /// The answer to [`SessionStep::Acquire`].
    pub fn acquired(&mut self, now_ms: u64, acquired: Acquired) {
        let _ = now_ms;
        if let Phase::Acquiring { asked: true } = self.phase {
            self.phase = match acquired {
                Acquired::Granted { epoch } => Phase::CheckingGrant { epoch, asked: false },
                Acquired::Refused => Phase::Done(SessionEnd::NotAcquired),
                Acquired::Stopped => Phase::Done(SessionEnd::Stopped(Stage::Acquiring)),
            };
        }
    }

    /// The answer to [`SessionStep::SyncAndCheckGrant`]: whether the ledger has seen the epoch
    /// granted (below its fencing epoch, or held already).
    pub fn grant_checked(&mut self, now_ms: u64, stale: bool) {
        let _ = now_ms;
        if let Phase::CheckingGrant { epoch, asked: true } = self.phase {
            self.phase = if !stale {
                self.stale_grants = 0;
                Phase::Comparing { epoch, asked: false }
            } else {
                self.stale_grants += 1;
                if self.stale_grants >= FRESH_GRANT_ATTEMPTS {
                    Phase::Releasing {
                        epoch,
                        then: SessionEnd::StaleGrants { epoch },
                        asked: false,
                    }
                } else {
                    Phase::GivingBack { epoch, asked: false }
                }
            };
        }
    }

    /// The answer to [`SessionStep::GiveBack`]: the stale grant was given back (or its release
    /// failed: it ends by its TTL). The next step acquires again.
    pub fn given_back(&mut self) {
        if let Phase::GivingBack { asked: true, .. } = self.phase {
            self.phase = Phase::Acquiring { asked: false };
        }
    }

    /// The answer to [`SessionStep::Compare`], at `now_ms`.
    pub fn compared(&mut self, now_ms: u64, comparison: Comparison) {
        let Phase::Comparing { epoch, asked: true } = self.phase else {
            return;
        };
        let deadline = self.deadline_ms();
        self.phase = match comparison {
            // The fence reports a lost lease.
            Comparison::Complete | Comparison::LeaseLost => Phase::Beginning { epoch, asked: false },
            Comparison::Missing { differs } if differs || now_ms >= deadline => Phase::Releasing {
                epoch,
                then: SessionEnd::LedgerBehind,
                asked: false,
            },
            Comparison::Unread if now_ms >= deadline => Phase::Releasing {
                epoch,
                then: SessionEnd::Aborted,
                asked: false,
            },
            Comparison::Missing { .. } | Comparison::Unread => {
                let first = matches!(comparison, Comparison::Missing { .. }) && !self.waited;
                self.waited |= first;
                Phase::Syncing {
                    epoch,
                    at_ms: now_ms.saturating_add(self.plan.poll_ms).min(deadline),
                    first,
                    asked: false,
                }
            }
        };
    }

    /// The answer to [`SessionStep::SyncAt`]: the ledger was synced. The next step compares again.
    pub fn synced(&mut self, now_ms: u64) {
        let _ = now_ms;
        if let Phase::Syncing {
            epoch, asked: true, ..
        } = self.phase
        {
            self.phase = Phase::Comparing { epoch, asked: false };
        }
    }

    /// The answer to [`SessionStep::Begin`].
    pub fn begun(&mut self, begun: Begun) {
        if let Phase::Beginning { epoch, asked: true } = self.phase {
            self.phase = match begun {
                Begun::Permitted => Phase::Running { epoch, asked: false },
                Begun::Refused => Phase::Releasing {
                    epoch,
                    then: SessionEnd::Refused,
                    asked: false,
                },
            };
        }
    }

    /// The answer to [`SessionStep::RunEffect`].
    pub fn effect_ended(&mut self, end: EffectEnd) {
        if let Phase::Running { epoch, asked: true } = self.phase {
            self.phase = match end {
                EffectEnd::Succeeded | EffectEnd::Failed => Phase::Recording {
                    epoch,
                    committed: end == EffectEnd::Succeeded,
                    asked: false,
                },
                EffectEnd::Unknown => Phase::Releasing {
                    epoch,
                    then: SessionEnd::Interrupted { epoch },
                    asked: false,
                },
            };
        }
    }

    /// The answer to [`SessionStep::Record`]: the outcome was recorded (or queued: the driver
    /// keeps it until it is stored).
    pub fn recorded(&mut self) {
        if let Phase::Recording {
            epoch,
            committed,
            asked: true,
        } = self.phase
        {
            self.phase = Phase::Releasing {
                epoch,
                then: SessionEnd::Ran { epoch, committed },
                asked: false,
            };
        }
    }

    /// The answer to [`SessionStep::Release`] (released, lost before, or a release that failed:
    /// the lease then ends by its TTL).
    pub fn released(&mut self) {
        if let Phase::Releasing {
            then, asked: true, ..
        } = self.phase
        {
            self.phase = Phase::Done(then);
        }
    }

    /// The driver was told to stop (a signal, a cancellation) while the session had not started
    /// the effect: the lease, if held, is given back, and the session ends
    /// [`SessionEnd::Stopped`]. Ignored once the effect runs (the effect is told on its own) and
    /// while the lease is being given back.
    pub fn stop(&mut self) {
        let stage = match &self.phase {
            Phase::Oracle { .. } | Phase::Acquiring { .. } => Stage::Acquiring,
            Phase::CheckingGrant { .. } | Phase::GivingBack { .. } => Stage::Granted,
            Phase::Comparing { .. } | Phase::Syncing { .. } => Stage::WaitingForLedger,
            Phase::Beginning { .. }
            | Phase::Running { .. }
            | Phase::Recording { .. }
            | Phase::Releasing { .. }
            | Phase::Done(_) => return,
        };
        self.end_with(SessionEnd::Stopped(stage));
    }

    /// The driver failed (an I/O error it keeps): the lease, if held, is given back, and the
    /// session ends [`SessionEnd::Aborted`]. Ignored once the effect ran (its outcome is
    /// recorded or queued by the driver) and while the lease is being given back.
    pub fn fail(&mut self) {
        if matches!(
            self.phase,
            Phase::Running { .. } | Phase::Recording { .. } | Phase::Releasing { .. } | Phase::Done(_)
        ) {
            return;
        }
        self.end_with(SessionEnd::Aborted);
    }

    /// Ends with `end`, giving the lease back first if it is held (a stale grant being given back
    /// is held until then).
    fn end_with(&mut self, end: SessionEnd) {
        self.phase = match self.epoch() {
            Some(epoch) => Phase::Releasing {
                epoch,
                then: end,
                asked: false,
            },
            None => Phase::Done(end),
        };
    }
}

#[cfg(test)]
mod tests;
