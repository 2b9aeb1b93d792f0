//! A database that went back (issue 37, item 5; rule R1): restored from a dump or an older
//! copy, or failed over to a standby that lagged, it forgot records that this site had read,
//! commits among them ([`ProblemKind::WentBack`]). A site whose snapshot still holds what it
//! read writes the commits the database lost back into it, as `committed` records of its own
//! log, so that every site, an idle or a new one included, sees those runs committed again;
//! then what it remembers of those devices is what the database holds now, and it runs on.
//!
//! Only commits are written back: a run the database lost in doubt (a `pending` with no
//! outcome) is not, and may run again.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ledger, Seen};
use crate::dispatch::DispatchError;
use crate::lease::{Intent, IntentStatus};
use crate::oplog::Surface;
use crate::relay::ProblemKind;
use crate::snapshot::Snapshot;

/// What [`Ledger::repair_went_back`] wrote back into a database that went back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WentBackRepair {
    /// The devices whose records the database forgot (or replaced since).
    pub devices: Vec<String>,
    /// The runs this site had seen committed that the database no longer held: each recorded
    /// again as `committed`, at the epoch of its commit.
    pub commits: Vec<(String, String, u64)>,
}

impl Ledger {
    /// Repairs a database that went back ([`ProblemKind::WentBack`]), when that is the only
    /// damage and this ledger was opened with a [snapshot](super::LedgerOptions::snapshot)
    /// that still holds what this site had read: records in this device's log, as
    /// `committed`, every run the snapshot holds committed that the database does not (and a
    /// log record `log/fencepost.went-back` naming the devices and the problems, for audit),
    /// then makes the seen file remember of those devices what the database holds now and
    /// removes the snapshot (the next open makes it again). The damage is then gone.
    ///
    /// Returns `None`, changing nothing, when there is nothing to repair or it cannot be: other
    /// damage too, no snapshot of what was read, or one that cannot be read (the damage stays:
    /// nothing is dispatched).
    ///
    /// # Errors
    /// The errors of [`record`](Self::record) (what was stored stays; the damage stays, and a
    /// later repair writes the rest), and [`DispatchError::Seen`] when the seen file cannot
    /// be written.
    pub fn repair_went_back(&mut self) -> Result<Option<WentBackRepair>, DispatchError> {
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
        let Some(mut commits) = self.commits_read(&path) else {
            return Ok(None);
        };
        commits.retain(|(agent, run, _)| self.committed_run(agent, run).is_none());
        self.append_now(
            Surface::log("fencepost.went-back"),
            serde_json::json!({"devices": devices, "problems": problems, "commits": commits.len()}),
        )?;
        for (agent, run, epoch) in &commits {
            self.record(&Intent::new(agent, run, *epoch, IntentStatus::Committed))?;
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
        tracing::warn!(devices = ?devices, commits = commits.len(), "this database went back: wrote the commits this site had read back into it");
        Ok(Some(WentBackRepair {
            devices: devices.into_iter().collect(),
            commits,
        }))
    }

    /// Every run the snapshot at `path` holds committed (agent, run, epoch of the commit), or
    /// `None` when it cannot be read.
    fn commits_read(&self, path: &std::path::Path) -> Option<Vec<(String, String, u64)>> {
        let mut commits = Vec::new();
        let read = Snapshot::open(path, self.device_id()).and_then(|snapshot| {
            snapshot.for_each_run(|agent, run, summary| {
                if let Some(commit) = summary.committed() {
                    commits.push((agent.to_owned(), run.to_owned(), commit.epoch));
                }
            })
        });
        match read {
            Ok(()) => Some(commits),
            Err(error) => {
                tracing::warn!(snapshot = %path.display(), %error, "this database went back, and the snapshot of what this site read cannot be read: not repairing it");
                None
            }
        }
    }

    /// What the view holds of `device` as the seen file remembers it (none: no record).
    fn seen_mark(&self, device: &str) -> Option<Seen> {
        let next_seq = self.view.frontier.next_seq(device);
        let head = self.view.heads.get(device)?;
        let last_op_id = head.last_op_id().filter(|_| head.next_seq() == next_seq)?;
        Some(Seen { next_seq, last_op_id })
    }
}
