//! A database that went back (issue 37, item 5; rule R1): restored from a dump or an older
//! copy, or failed over to a standby that lagged, it forgot records that this site had read,
//! commits among them ([`ProblemKind::WentBack`]). A site whose snapshot still holds what it
//! read writes the commits the database lost back into it, as `committed` records of its own
//! log, so that every site, an idle or a new one included, sees those runs committed again;
//! then what it remembers of those devices is what the database holds now, and it runs on.
//!
//! Commits are written back, and runs this site read in doubt (a `pending` with no outcome) of
//! which the database holds no record, as `pending` records at their epoch: they stay in doubt
//! (found by an adversarial test: a run two hosts had read in doubt ran again after the
//! restore). A run the database lost that no site with a snapshot read may run again.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ledger, Seen};
use crate::lease::{Intent, IntentStatus};
use crate::ledger::LedgerError;
use crate::oplog::Surface;
use crate::protected::ProtectedMark;
use crate::relay::ProblemKind;
use crate::snapshot::Snapshot;

/// A run: its agent, its id and an epoch.
type Run = (String, String, u64);

/// What [`Ledger::repair_went_back`] wrote back into a database that went back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WentBackRepair {
    /// The devices whose records the database forgot (or replaced since).
    pub devices: Vec<String>,
    /// The runs this site had seen committed that the database no longer held: each recorded
    /// again as `committed`, at the epoch of its commit.
    pub commits: Vec<(String, String, u64)>,
    /// The runs this site had seen in doubt of which the database held no record: each
    /// recorded again as `pending`, at its epoch, so that it stays in doubt.
    pub in_doubt: Vec<(String, String, u64)>,
}

impl Ledger {
    /// Repairs a database that went back ([`ProblemKind::WentBack`]), when that is the only
    /// damage and this ledger was opened with a [snapshot](super::LedgerOptions::snapshot)
    /// that still holds what this site had read: records in this device's log (on a protected
    /// ledger, first every membership change it had read that the database lost, so that a
    /// revocation stays one), as `committed`, every run the snapshot holds committed that the
    /// database does not (and a log record `log/fencepost.went-back` naming the devices and
    /// the problems, for audit), and as `pending` every run the snapshot holds in doubt of which the database has no
    /// record, then makes the seen file remember of those devices what the database holds now and
    /// removes the snapshot (the next open makes it again). The damage is then gone.
    ///
    /// What this site read counts as far as its snapshot holds it: a process that keeps a
    /// ledger open for long, and finds it damaged on a [`sync`](Self::sync) after the database
    /// went back, opens it again with the same snapshot and repairs it then.
    ///
    /// Returns `None`, changing nothing, when there is nothing to repair or it cannot be: other
    /// damage too, no snapshot of what was read, or one that cannot be read (the damage stays:
    /// nothing is dispatched).
    ///
    /// # Errors
    /// The errors of [`record`](Self::record) (what was stored stays; the damage stays, and a
    /// later repair writes the rest), and [`LedgerError::Seen`] when the seen file cannot
    /// be written.
    pub fn repair_went_back(&mut self) -> Result<Option<WentBackRepair>, LedgerError> {
        let damage = self.damage();
        let repairable = !damage.is_empty()
            && damage.iter().all(|problem| problem.kind == ProblemKind::WentBack)
            && self.checkpoint_marks.is_none();
        let Some(path) = self.went_back_snapshot.clone().filter(|_| repairable) else {
            return Ok(None);
        };
        let devices: BTreeSet<String> = damage
            .iter()
            .filter_map(|problem| problem.device_id.clone())
            .collect();
        let problems: Vec<String> = damage.iter().map(ToString::to_string).collect();
        let Some((mut commits, mut in_doubt, memberships)) = self.runs_read(&path) else {
            return Ok(None);
        };
        commits.retain(|(agent, run, _)| self.committed_run(agent, run).is_none());
        // A pending the database holds nothing as recent as (an older `failed`, say: found by
        // an adversarial test, a retry of a failed run read in doubt ran again).
        in_doubt.retain(|(agent, run, epoch)| {
            let known = self
                .state()
                .agent(agent)
                .and_then(|known| known.run(run))
                .map(|record| record.epoch);
            let unsettled = self.in_doubt_run(agent, run, u64::MAX).map(|doubt| doubt.epoch);
            self.committed_run(agent, run).is_none()
                && known.max(unsettled).is_none_or(|known| known < *epoch)
        });
        let memberships = memberships
            .map(|mark| self.memberships_to_write_back(&mark))
            .unwrap_or_default();
        // First: a rotation among them seals what follows.
        if !memberships.is_empty() && self.protected.is_some() {
            self.write_queued_and(&memberships)?;
        }
        self.append_now(
            Surface::log("fencepost.went-back"),
            serde_json::json!({"devices": devices, "problems": problems, "commits": commits.len(), "in_doubt": in_doubt.len(), "memberships": memberships.len()}),
        )?;
        for (agent, run, epoch) in &commits {
            self.record(&Intent::new(agent, run, *epoch, IntentStatus::Committed))?;
        }
        for (agent, run, epoch) in &in_doubt {
            self.record(&Intent::new(agent, run, *epoch, IntentStatus::Pending))?;
        }
        let marks: BTreeMap<String, Option<Seen>> = devices
            .iter()
            .map(|device| (device.clone(), self.seen_mark(device)))
            .collect();
        if let Some(seen) = &mut self.seen {
            seen.reset(marks)?;
        }
        self.snapshot_marks.clear();
        self.replaced.retain(|problem| {
            problem
                .device_id
                .as_ref()
                .is_none_or(|device| !devices.contains(device))
        });
        self.went_back_snapshot = None;
        Snapshot::remove(&path);
        self.recompute_problems();
        tracing::warn!(devices = ?devices, commits = commits.len(), in_doubt = in_doubt.len(), "this database went back: wrote the commits and the runs in doubt this site had read back into it");
        Ok(Some(WentBackRepair {
            devices: devices.into_iter().collect(),
            commits,
            in_doubt,
        }))
    }

    /// Every run the snapshot at `path` holds committed (agent, run, epoch of the commit), and
    /// every one it holds in doubt (agent, run, the epoch of its greatest unsettled `pending`),
    /// and the protected reading it keeps (its membership records), or `None` when it cannot be
    /// read.
    fn runs_read(&self, path: &std::path::Path) -> Option<(Vec<Run>, Vec<Run>, Option<ProtectedMark>)> {
        let (mut commits, mut in_doubt, mut protected) = (Vec::new(), Vec::new(), None);
        let read = Snapshot::open(path, self.device_id()).and_then(|snapshot| {
            snapshot.for_each_run(|agent, run, summary| {
                if let Some(commit) = summary.committed() {
                    commits.push((agent.to_owned(), run.to_owned(), commit.epoch));
                }
            })?;
            let base = snapshot.base()?;
            protected = base.as_ref().and_then(|base| base.protected.clone());
            for mark in base.map(|base| base.attempts).unwrap_or_default() {
                if let Some(epoch) = mark.unsettled.iter().map(|doubt| doubt.epoch).max() {
                    in_doubt.push((mark.agent, mark.run, epoch));
                }
            }
            Ok(())
        });
        match read {
            Ok(()) => Some((commits, in_doubt, protected)),
            Err(error) => {
                tracing::warn!(snapshot = %path.display(), %error, "this database went back, and the snapshot of what this site read cannot be read: not repairing it");
                None
            }
        }
    }

    /// The membership changes `mark` read that the database lost and that this device writes
    /// back with the authority they had: its own, and the recovery key's (which count wherever
    /// they sit). Another member's change written as this device's would count as this
    /// device's (found by an adversary: a thief's revocation of a member, voided by a recovery
    /// cut, was written back as the repairer's and revoked that member). A revocation of its
    /// own cuts at most where the revoked device's log ends now: records it writes after the
    /// restore, below the cut it had, must not count (found by the same adversary).
    fn memberships_to_write_back(&self, mark: &ProtectedMark) -> Vec<Vec<u8>> {
        use crate::membership::{Membership, MembershipRecord};
        let own = self.device_id();
        let view = &self.view;
        mark.memberships_lost(|device, seq| view.id_at(device, seq))
            .into_iter()
            .filter_map(|(author, bytes)| {
                let mut record = MembershipRecord::from_bytes(&bytes).ok()?;
                if record.by_recovery.is_some() {
                    return Some(bytes);
                }
                if author != own {
                    return None;
                }
                if let Membership::Revoke { device, cut } = &mut record.change {
                    *cut = (*cut).min(view.frontier.next_seq(device.as_str()));
                }
                Some(record.to_bytes())
            })
            .collect()
    }

    /// What the view holds of `device` as the seen file remembers it (none: no record).
    fn seen_mark(&self, device: &str) -> Option<Seen> {
        let next_seq = self.view.frontier.next_seq(device);
        let head = self.view.heads.get(device)?;
        let last_op_id = head.last_op_id().filter(|_| head.next_seq() == next_seq)?;
        Some(Seen {
            next_seq,
            last_op_id,
            head: None,
        })
    }
}
