//! Checking every checkpoint against the records it covers (`Ledger::verify_checkpoints`, rule
//! K3).

use super::*;
use crate::checkpoint::CheckpointName;

impl Ledger {
    /// Checks every shared checkpoint against the records it covers (rule K3): its id, its
    /// heads (the ledger's records there), and its content, which must be the fold of those
    /// records (the runs, fencing epochs, attempts and other records). Returns one problem per
    /// checkpoint that fails; one that covers records this ledger does not have (a synced folder
    /// behind it, or a device file that shrank) fails too, as a site would not start from it.
    /// Needs a ledger opened without a snapshot (one that read every record).
    ///
    /// # Errors
    /// [`LedgerError::Checkpoint`] when the ledger resumed from a snapshot or the folder
    /// cannot be listed, [`LedgerError::Relay`] when the records cannot be read again.
    pub fn verify_checkpoints(&self) -> Result<Vec<RelayProblem>, LedgerError> {
        let Some(dir) = self.checkpoints_dir() else {
            return Ok(Vec::new());
        };
        if self.resumed_from_snapshot() {
            return Err(CheckpointError::VerifyAfterSnapshot.into());
        }
        // Stored elsewhere (a database): what is stored is checked, copied afresh into a folder
        // of this call's, not this site's copies (found by an adversarial test: a host whose
        // copy was whole said "intact" of a damaged stored checkpoint that stopped every new
        // host, and one that had copied a damaged one reported it after it was stored again).
        let stored_elsewhere = self.checkpoint_store().is_some();
        let fresh =
            FreshCopies(stored_elsewhere.then(|| dir.join(format!(".verifying-{}", std::process::id()))));
        let checked = fresh.0.clone().unwrap_or_else(|| dir.clone());
        if stored_elsewhere {
            let _ = std::fs::remove_dir_all(&checked);
        }
        let mut problems: Vec<RelayProblem> = self
            .mirror_checkpoints(&checked, |_, _| true)
            .into_iter()
            .map(|(name, error)| {
                checkpoint_problem(
                    &dir.join(name),
                    &format!("cannot be copied from the ledger: {error}"),
                )
            })
            .collect();
        let shared = self.relay.checkpoints_dir().unwrap_or_else(|| dir.clone());
        for (sealed, why) in self.unopened_checkpoints() {
            problems.push(checkpoint_problem(
                &shared.join(sealed),
                &format!("does not open: {why}"),
            ));
        }
        let listed = checkpoint::list(&checked).map_err(|source| CheckpointError::ListFolder {
            path: checked.clone(),
            source,
        })?;
        for (named, path) in listed {
            // Named where sites keep it.
            let shown = path
                .file_name()
                .map_or_else(|| path.clone(), |name| dir.join(name));
            if let Some(detail) = self.check_checkpoint(&named, &path, &shown)? {
                problems.push(checkpoint_problem(&shown, &detail));
            }
        }
        Ok(problems)
    }

    /// What is wrong with the checkpoint at `path` (named `named`, shown as `shown`), if
    /// anything: the file, its name, its heads (the ledger's records there), and its content
    /// against the fold of the records it covers.
    fn check_checkpoint(
        &self,
        named: &CheckpointName,
        path: &Path,
        shown: &Path,
    ) -> Result<Option<String>, LedgerError> {
        let mut file = match CheckpointFile::open(path) {
            Ok(file) => file,
            Err(error) => return Ok(Some(format!("cannot be read: {error}"))),
        };
        // (Found by an adversarial test: a byte changed in a page's free space was
        // "intact" here, while every new site refused the file.)
        if let Err(error) = file.check_pages() {
            return Ok(Some(format!("cannot be used: {error}")));
        }
        if let Some(detail) = named.mismatch(&file) {
            return Ok(Some(detail));
        }
        let base = file.base();
        if let Some(detail) = self.heads_problem(base) {
            return Ok(Some(detail));
        }
        let folded;
        let prefix = match self.covered_fold(base, shown)? {
            Covered::Here => &self.view,
            Covered::Folded(view) => {
                folded = view;
                &*folded
            }
            Covered::Superseded => return Ok(None),
            Covered::Merged { start, union } => {
                let Some(theirs) = self.loaded_view(&mut file) else {
                    return Ok(Some("cannot be read".to_owned()));
                };
                return Ok(merge_problem(*start, theirs, &union));
            }
            Covered::Unchecked(detail) => return Ok(Some(detail)),
        };
        let mut mark = prefix.base_mark(Value::Null);
        // The compactions of its line are when others wrote theirs: not in the records.
        mark.compactions.clone_from(&base.compactions);
        if comparable(&mark) != comparable(base) {
            return Ok(Some(
                "does not hold the fencing epochs, attempts or heads of the records it covers (forged, or written by a faulty site)".to_owned(),
            ));
        }
        let mut theirs = match LedgerState::restored(base) {
            Ok(view) => view.state,
            Err(reason) => return Ok(Some(format!("cannot be read: {reason}"))),
        };
        if let Err(error) = file.for_each_run(|agent, run, summary| theirs.merge_summary(agent, run, summary))
        {
            return Ok(Some(format!("cannot be read: {error}")));
        }
        Ok((theirs != prefix.state).then(|| {
            "does not hold the runs of the records it covers (forged, or written by a faulty site)".to_owned()
        }))
    }

    /// Why the heads of a checkpoint (`base`) are not the ledger's, if they are not: it ends a
    /// device at another record, or covers records the ledger does not have.
    fn heads_problem(&self, base: &SnapshotBase) -> Option<String> {
        let mut ahead = None;
        let mut mismatch = None;
        let id_here = |device: &str, seq: u64| self.view.known_id(device, seq);
        for head in &base.heads {
            let has = self.view.frontier.next_seq(&head.device_id);
            if has < head.next_seq {
                ahead = Some((head.device_id.clone(), head.next_seq, has));
                // The ledger's last record of the device, where the checkpoint kept its id.
                let theirs = base
                    .recent_ids
                    .iter()
                    .find(|(device, _, _)| *device == head.device_id)
                    .and_then(|(_, first, ids)| {
                        ids.get(usize::try_from(has.checked_sub(1)?.checked_sub(*first)?).ok()?)
                    });
                if let (Some(theirs), Some(last)) = (theirs, has.checked_sub(1)) {
                    if id_here(&head.device_id, last) != Some(*theirs) {
                        mismatch = Some(head.device_id.clone());
                    }
                }
                continue;
            }
            let here = head
                .next_seq
                .checked_sub(1)
                .and_then(|last| id_here(&head.device_id, last));
            if here != head.last.map(|(op_id, _, _)| op_id) {
                mismatch = Some(head.device_id.clone());
            }
        }
        if let Some(device) = mismatch {
            return Some(format!(
                "ends device {device:?} at a record that is not the ledger's"
            ));
        }
        // A site would not start from it either (see `resume_snapshot`).
        ahead.map(|(device, covers, has)| format!(
            "covers {covers} records of device {device:?}, the ledger here has {has}: a synced folder that has not brought them yet (check again once it has), or a device file that shrank, was replaced or lost records (restore it from a copy)"
        ))
    }

    /// The fold of exactly the records a checkpoint (`base`) covers, to compare it with.
    fn covered_fold(&self, base: &SnapshotBase, shown: &Path) -> Result<Covered, LedgerError> {
        let forgotten = base.forgotten.clone();
        // The fold of exactly the records it covers: this ledger's own view when it covers
        // the same records (no second read), else a fold of them alone.
        // (A checkpoint that forgot runs is compared with a fold of its own, which forgets
        // the same runs.)
        let exact = forgotten.is_none()
            && base.heads.len() == self.view.heads.len()
            && base
                .heads
                .iter()
                .all(|head| self.view.frontier.next_seq(&head.device_id) == head.next_seq);
        Ok(if exact {
            Covered::Here
        } else if let Some((start, started_at)) = &self.start_checkpoint {
            // Records before the checkpoint this ledger started from were removed: one that
            // contains it is checked against its content and the records after it; an
            // older one cannot be checked.
            let contains_start = started_at.iter().all(|(device, next_seq)| {
                base.heads
                    .iter()
                    .any(|head| head.device_id == device && head.next_seq >= next_seq)
            });
            let from_start = contains_start
                .then(|| CheckpointFile::open(start).ok())
                .flatten()
                .and_then(|mut file| self.loaded_view(&mut file));
            let Some(mut view) = from_start else {
                // One that the start covers wholly (a sync brought it after the start, and
                // its records were pruned; its heads are the ledger's, checked above) is of
                // no more use: no reading uses it (rule K6), and a compaction removes it as
                // one it contains. Not damage (found by the torture test: `verify` said it
                // could not be checked, exit 1, until the next compaction).
                let superseded = base
                    .heads
                    .iter()
                    .all(|head| started_at.next_seq(&head.device_id) >= head.next_seq);
                if superseded {
                    tracing::info!(checkpoint = %shown.display(), "superseded by the checkpoint this ledger starts from (its records were pruned, so it cannot be checked, and no reading uses it); the next compaction removes it");
                    return Ok(Covered::Superseded);
                }
                // One that covers no pruned record (a host that had not received the pruned
                // device's records when it wrote it) is checked against its records, all
                // here (found by the K6 property test, and the torture test's rare red:
                // `verify` said it could not be checked).
                let starts = self.relay.log_starts()?;
                let untouched = base
                    .heads
                    .iter()
                    .all(|head| head.next_seq == 0 || !starts.contains_key(&head.device_id));
                if untouched {
                    let mut since = Frontier::new();
                    for (device, (first, before)) in &starts {
                        since.raise_to(device, *first, Some(*before));
                    }
                    return Ok(Covered::Folded(Box::new(self.fold_from(&since, base)?)));
                }
                // Else it is checked in its merge with the start, which readings use (rule
                // K6): the merge must be the fold of the records the two cover.
                if let Some(merged) = self.merged_with_start(start, started_at, base)? {
                    return Ok(merged);
                }
                return Ok(Covered::Unchecked(format!(
                    "cannot be checked: it covers records removed from the relay (pruned) before {}, which this ledger starts from; remove it",
                    start.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned())
                )));
            };
            self.fold_covered(&mut view, started_at, base)?;
            if let Some(rule) = &forgotten {
                view.forget_runs(rule);
            }
            view.forgotten.clone_from(&forgotten);
            Covered::Folded(Box::new(view))
        } else {
            Covered::Folded(Box::new(self.fold_from(&Frontier::new(), base)?))
        })
    }

    /// A checkpoint (`base`) that neither contains nor is contained in the one this ledger
    /// starts from (`start`, which ends at `started_at`) and covers pruned records, as
    /// [`Covered::Merged`]: the start's view and the fold of the records the two cover.
    /// `None` when the start cannot be read again.
    fn merged_with_start(
        &self,
        start: &Path,
        started_at: &Frontier,
        base: &SnapshotBase,
    ) -> Result<Option<Covered>, LedgerError> {
        let load = || {
            CheckpointFile::open(start)
                .ok()
                .and_then(|mut file| self.loaded_view(&mut file))
        };
        let (Some(start_view), Some(mut union)) = (load(), load()) else {
            return Ok(None);
        };
        let mut ends: BTreeMap<&str, u64> = started_at.iter().collect();
        for head in &base.heads {
            let end = ends.entry(head.device_id.as_str()).or_default();
            *end = (*end).max(head.next_seq);
        }
        self.fold_until(&mut union, started_at, &ends)?;
        Ok(Some(Covered::Merged {
            start: Box::new(start_view),
            union: Box::new(union),
        }))
    }

    /// The records a checkpoint (`base`) covers from `since` on, read again and folded a batch
    /// at a time (not all held at once), forgetting what it forgot.
    fn fold_from(&self, since: &Frontier, base: &SnapshotBase) -> Result<LedgerState, LedgerError> {
        let mut view = LedgerState::new();
        view.protected = self.protected.as_deref().map(super::super::Protected::logs);
        self.fold_covered(&mut view, since, base)?;
        if let Some(rule) = &base.forgotten {
            view.forget_runs(rule);
            view.forgotten = Some(rule.clone());
        }
        Ok(view)
    }
}

/// What a checkpoint is compared with ([`Ledger::covered_fold`]).
enum Covered {
    /// The ledger's own view: it covers the same records.
    Here,
    /// A fold of the records it covers.
    Folded(Box<LedgerState>),
    /// The checkpoint this ledger starts from supersedes it: nothing to check (rule K6).
    Superseded,
    /// The view of the checkpoint this ledger starts from, and the fold of the records it
    /// and this one cover: this one merged into the start must be that fold (rule K6).
    Merged {
        /// The start's view.
        start: Box<LedgerState>,
        /// The fold of the records both cover.
        union: Box<LedgerState>,
    },
    /// It cannot be checked: why.
    Unchecked(String),
}

/// What is wrong with a checkpoint's view (`theirs`) merged into `start` (the view of the one
/// the ledger starts from), against `union`, the fold of the records the two cover.
fn merge_problem(mut start: LedgerState, theirs: LedgerState, union: &LedgerState) -> Option<String> {
    if let Err(reason) = start.merge_checkpoint(theirs) {
        return Some(format!(
            "cannot be merged with the checkpoint this ledger starts from: {reason}"
        ));
    }
    let mut merged = start.base_mark(Value::Null);
    let mut folded = union.base_mark(Value::Null);
    // The compactions of its line are when others wrote theirs: not in the records.
    merged.compactions = Default::default();
    folded.compactions = Default::default();
    if comparable(&merged) != comparable(&folded) || start.state != union.state {
        return Some(
            "merged with the checkpoint this ledger starts from, does not hold the fold of the records the two cover (forged, or written by a faulty site)".to_owned(),
        );
    }
    None
}

/// A folder of fresh copies of stored checkpoints, removed when dropped.
pub(in crate::edge::ledger) struct FreshCopies(Option<PathBuf>);

impl Drop for FreshCopies {
    fn drop(&mut self) {
        if let Some(folder) = &self.0 {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

/// A checkpoint's loaded part as compared with a fold: without the relay's cursor, and with the
/// other surfaces' records in one order (a site keeps them in the order it read them).
pub(in crate::edge::ledger) fn comparable(base: &SnapshotBase) -> Value {
    let mut value = serde_json::to_value(base).unwrap_or(Value::Null);
    if let Some(object) = value.as_object_mut() {
        object.insert("cursor".to_owned(), Value::Null);
        if let Some(Value::Array(records)) = object.get_mut("records") {
            records.sort_by_key(ToString::to_string);
        }
        // A protected reading lists what it read in the order it read it, which the batches
        // of a pull decide.
        if let Some(Value::Object(mark)) = object.get_mut("protected") {
            for (_, field) in mark.iter_mut() {
                if let Value::Array(items) = field {
                    items.sort_by_key(ToString::to_string);
                }
            }
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::lease::{Intent, IntentStatus};
    use crate::oplog::{DeviceLog, Surface};

    fn intent(run: &str, status: IntentStatus) -> Value {
        Intent::new("milo", run, 1, status).payload()
    }

    fn view(records: &[&OpRecord]) -> LedgerState {
        let mut view = LedgerState::new();
        let owned: Vec<OpRecord> = records.iter().map(|record| (*record).clone()).collect();
        view.absorb(&owned);
        view
    }

    /// K3, K6: a checkpoint that neither contains the start nor is contained in it is checked
    /// in its merge with the start: the merge of a faithful one is the fold of the records the
    /// two cover; one whose runs are not its records' is reported.
    #[test]
    fn k3_k6_a_checkpoint_beside_the_start_is_checked_in_its_merge_with_it() {
        let clock = ManualClock::new(1_000);
        let mut laptop = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
        let mut phone = DeviceLog::new("phone", clock.wall_clock()).unwrap();
        let first = laptop.append(Surface::Intent, intent("run-1", IntentStatus::Pending));
        let second = laptop.append(Surface::Intent, intent("run-1", IntentStatus::Committed));
        let theirs = phone.append(Surface::Intent, intent("run-2", IntentStatus::Committed));
        // The start covers the laptop's two records; the other checkpoint the laptop's first
        // and the phone's.
        let start = view(&[&first, &second]);
        let union = view(&[&first, &second, &theirs]);
        assert_eq!(
            merge_problem(view(&[&first, &second]), view(&[&first, &theirs]), &union),
            None
        );
        let mut other_phone = DeviceLog::new("phone", clock.wall_clock()).unwrap();
        let forged = other_phone.append(Surface::Intent, intent("run-3", IntentStatus::Committed));
        let problem = merge_problem(start, view(&[&first, &forged]), &union);
        assert!(problem.is_some_and(|detail| detail.contains("does not hold the fold")));
    }
}
