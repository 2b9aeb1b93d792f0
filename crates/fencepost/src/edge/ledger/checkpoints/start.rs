//! Starting from checkpoints: a new site's copy of the best one (rule K3), a start after pruned
//! records from the one or the merge of several that cover them (rule K6), and moving a snapshot
//! past a prune or to a checkpoint that forgets runs.

use super::*;

impl Ledger {
    /// Copies the best shared checkpoint (the one covering the most records) into this site's
    /// empty snapshot, checking it whole (see [`crate::checkpoint`], rule K3); returns its id. A
    /// damaged one is damage of this ledger ([`damage`](Self::damage)), and not used.
    pub(in crate::edge::ledger) fn import_checkpoint(&mut self) -> Option<(String, PathBuf)> {
        let dir = self.checkpoints_dir()?;
        self.mirror_checkpoints(&dir, |index, _| index == 0);
        let listed = match checkpoint::list(&dir) {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(folder = %dir.display(), %error, "cannot list the checkpoints; reading the whole ledger");
                return None;
            }
        };
        let (named, path) = listed.into_iter().next()?;
        let file = match CheckpointFile::open(&path) {
            Ok(file) => file,
            Err(error) if error.is_busy() || !path.exists() => return None,
            Err(error) => {
                self.checkpoint_unusable(&path, &error.to_string());
                return None;
            }
        };
        let view = match named.mismatch(&file) {
            Some(problem) => Err(problem),
            None => base_view(file.base()),
        };
        let view = match view {
            Ok(view) => view,
            Err(problem) => {
                self.checkpoint_unusable(&path, &problem);
                return None;
            }
        };
        // Device files that begin after records it does not cover (pruned after another
        // checkpoint): the open starts from the checkpoints that cover them together (rule K6).
        let starts = self.relay.log_starts().unwrap_or_default();
        if !covers_starts(&view, &starts) {
            tracing::info!(checkpoint = %path.display(), "the best checkpoint does not cover every record removed from the logs; starting from the checkpoints that do");
            return None;
        }
        drop(file);
        // The empty snapshot is replaced by a checked copy of the checkpoint with its lock
        // exclusive (no other process has the file open; those that wait for it then find the
        // copy), and only if no other process made it meanwhile. When another process has the
        // empty snapshot open (it reads the whole ledger into it), this one does the same.
        let (path_of_snapshot, lock) = self.snapshot_exclusively()?;
        let device = self.log.device_id().to_owned();
        self.snapshot = super::super::SnapshotUse::open(path_of_snapshot.clone(), &device, lock);
        let empty = self
            .snapshot
            .as_ref()
            .is_some_and(|snapshot| matches!(snapshot.store.base(), Ok(None)));
        if !empty {
            return None; // made by another process (or cannot be made now): that one is used
        }
        let (_, lock) = self.snapshot.take()?.close();
        let installed = Snapshot::install_checkpoint(&path_of_snapshot, &device, &path, &named.id);
        self.snapshot = super::super::SnapshotUse::open(path_of_snapshot, &device, lock);
        match installed {
            Ok(()) => {
                tracing::info!(checkpoint = %path.display(), "starting from the shared checkpoint");
                Some((checkpoint::id_hex(&named.id), path))
            }
            Err(error) if error.is_busy() || !path.exists() => None,
            Err(error) => {
                self.checkpoint_unusable(&path, &error.to_string());
                None
            }
        }
    }

    /// The shared checkpoint at `path` cannot be used: damage of this ledger. A copy of one
    /// stored in a database goes (the next open copies it again: stored again meanwhile by a
    /// compaction, it is whole).
    pub(in crate::edge::ledger) fn checkpoint_unusable(&mut self, path: &Path, detail: &str) {
        self.checkpoint_damage = Some(checkpoint_problem(path, &format!("cannot be used: {detail}")));
        if self.checkpoint_store().is_some() {
            Snapshot::remove(path);
        }
    }

    /// Gives up this site's snapshot, whose loaded part is `base`, for the best shared checkpoint
    /// when that one forgets committed runs older than the snapshot does (the oracle's
    /// retention, [`Forgetting`]): so that a site's snapshot stops growing with the runs the
    /// operator let go. Only when the snapshot has read every record the checkpoint covers
    /// (else nothing changes: a synced folder that has not brought them yet is no reason to
    /// stop), and when no other process has the snapshot open. The
    /// snapshot is then empty, with its lock exclusive, for
    /// [`import_checkpoint`](Self::import_checkpoint); whether it is.
    pub(in crate::edge::ledger) fn move_to_forgetting_checkpoint(&mut self, base: &SnapshotBase) -> bool {
        let Some(dir) = self.checkpoints_dir() else {
            return false;
        };
        // The name says whether it forgets: no file is opened (or copied) on an ordinary run.
        let own = base.forgets_before_ms().unwrap_or(0);
        self.mirror_checkpoints(&dir, |index, named| {
            index == 0 && named.forgets_before_ms.is_some_and(|before| before > own)
        });
        let Some((named, path)) = checkpoint::list(&dir)
            .ok()
            .and_then(|listed| listed.into_iter().next())
        else {
            return false;
        };
        let Some(before) = named.forgets_before_ms else {
            return false;
        };
        if before <= own {
            return false;
        }
        // The snapshot has read at least every record the checkpoint covers, device by device:
        // the files here reach it (or they lost records the snapshot read, which is damage
        // either way). One ahead of the snapshot somewhere may be ahead of the files (a synced
        // folder that has not brought them yet): not now. (A relay's resume is not a check
        // that can be made twice, so it is left to the open that follows.)
        let reaches = match CheckpointFile::open(&path) {
            Ok(file) => {
                named.mismatch(&file).is_none()
                    && file.base().heads.iter().all(|covered| {
                        base.heads.iter().any(|read| {
                            read.device_id == covered.device_id && read.next_seq >= covered.next_seq
                        })
                    })
            }
            Err(error) => {
                tracing::debug!(checkpoint = %path.display(), %error, "cannot read the checkpoint that forgets runs; keeping the snapshot");
                false
            }
        };
        if !reaches {
            return false;
        }
        // Other processes have it open: another time.
        let Some((path_of_snapshot, lock)) = self.snapshot_exclusively() else {
            return false;
        };
        tracing::info!(checkpoint = %path.display(), snapshot = %path_of_snapshot.display(), "a checkpoint forgets committed runs this snapshot keeps; starting the snapshot from it");
        Snapshot::remove(&path_of_snapshot);
        let device = self.log.device_id().to_owned();
        self.snapshot = super::super::SnapshotUse::open(path_of_snapshot, &device, lock);
        self.snapshot.is_some()
    }

    /// Starts the view from the best shared checkpoint that covers every record removed from
    /// the relay ([`Relay::log_starts`](crate::relay::Relay::log_starts)), its runs loaded, when
    /// records were removed: a reading from record 0 would lack them. None that covers them (not
    /// synced here yet, removed, damaged) is damage of this ledger: nothing runs on it.
    pub(in crate::edge::ledger) fn start_after_pruning(&mut self) -> Result<(), LedgerError> {
        let starts = self.relay.log_starts()?;
        if starts.is_empty() {
            return Ok(());
        }
        let Some(dir) = self.checkpoints_dir() else {
            return Ok(());
        };
        self.mirror_checkpoints(&dir, |_, _| true);
        // The usable ones, best first; the first that covers every removed record alone.
        let mut usable = Vec::new();
        for (named, path) in checkpoint::list(&dir).unwrap_or_default() {
            let Ok(mut file) = CheckpointFile::open(&path) else {
                continue;
            };
            if named.mismatch(&file).is_some() || file.check_pages().is_err() {
                continue;
            }
            let Ok(mut view) = base_view(file.base()).and_then(|view| self.with_protected(view, file.base()))
            else {
                continue;
            };
            if covers_starts(&view, &starts) {
                if load_runs(&mut view, &mut file).is_none() {
                    continue;
                }
                tracing::info!(checkpoint = %path.display(), "device files begin after a checkpoint: reading from it");
                self.view = view;
                self.started_from = Some(checkpoint::id_hex(&named.id));
                self.start_checkpoint = Some((path, self.view.frontier.clone()));
                return Ok(());
            }
            usable.push((path, file, view));
        }
        // None alone (hosts that pruned before a sync carried the others' records): the merge
        // of those that together cover them (rule K6). Not of a protected ledger's: a reading
        // is restored from one checkpoint's (a host waits for a checkpoint that covers them).
        if self.protected.is_some() {
            usable.clear();
        }
        let merged = merge_covering(usable, &starts);
        if let Some(Merged {
            view,
            parts,
            covers: true,
        }) = merged
        {
            tracing::info!(checkpoints = ?parts, "device files begin after records that several checkpoints cover, none alone: reading from their merge");
            self.view = view;
            self.merged_start = true;
            return Ok(());
        }
        // Not covered even together: damage. Whatever commits and epochs the checkpoints here
        // hold still count (a caller that accepts the damage runs none of those again).
        if let Some(Merged { view, .. }) = merged {
            self.view = view;
        }
        let lacking: Vec<String> = starts
            .iter()
            .map(|(device, (first, _))| format!("{device:?} from record {first}"))
            .collect();
        let problem = RelayProblem {
            kind: ProblemKind::Pruned,
            device_id: None,
            file: Some(dir.clone()),
            line_number: None,
            detail: format!(
                "the checkpoints folder holds no usable checkpoint (alone or merged with the others) that covers the records removed from the logs ({} begin after a checkpoint): not synced here yet, removed or damaged; sync it, or write a new checkpoint with `fencepost ledger compact` on a host whose ledger is intact",
                lacking.join(", ")
            ),
        };
        self.checkpoint_damage = Some(problem);
        Ok(())
    }

    /// After an open that started from a merge of checkpoints ([`start_after_pruning`]), writes
    /// that merge with every record read after it as a checkpoint of its own, so that other
    /// sites (and this one's next processes) start from one file: the checkpoints it contains
    /// go. Nothing is written on a damaged ledger, or when the merge forgets runs (a retention
    /// is an operator's `ledger compact --forget-commits-older-than`); a failure only costs the
    /// next open another merge.
    ///
    /// [`start_after_pruning`]: Self::start_after_pruning
    pub(in crate::edge::ledger) fn write_merged_start(&mut self) {
        if !self.merged_start || self.view.forgotten.is_some() || !self.damage().is_empty() {
            return;
        }
        match self.compact_with(&CompactOptions::default()) {
            Ok(info) => {
                tracing::info!(checkpoint = %info.path.display(), "wrote the merge of the checkpoints this ledger started from");
                self.started_from = Some(info.id.clone());
                self.start_checkpoint = Some((info.path, self.view.frontier.clone()));
            }
            Err(error) => {
                tracing::warn!(%error, "cannot write the merge of the checkpoints this ledger started from; the next open merges them again");
            }
        }
    }

    /// Gives up this site's snapshot, whose loaded part is `base`, when a device file now
    /// begins after what it read of that device (the records between were pruned after a
    /// checkpoint covered them): it cannot go on from there. As
    /// [`move_to_forgetting_checkpoint`](Self::move_to_forgetting_checkpoint), only when no
    /// other process has it open; whether it was given up.
    pub(in crate::edge::ledger) fn move_past_pruned(&mut self, base: &SnapshotBase) -> bool {
        // A store that holds no checkpoint (just listed): no log was pruned that a reading
        // could start after (a pull reports one that was), and a database is not asked again.
        if self.checkpoint_store().is_some() && self.stored_checkpoints.get() == Some(0) {
            return false;
        }
        let Ok(starts) = self.relay.log_starts() else {
            return false;
        };
        let behind = starts.iter().any(|(device, (first, _))| {
            base.heads
                .iter()
                .find(|head| head.device_id == *device)
                .map_or(0, |head| head.next_seq)
                < *first
        });
        if !behind {
            return false;
        }
        let Some((path_of_snapshot, lock)) = self.snapshot_exclusively() else {
            return false;
        };
        tracing::info!(snapshot = %path_of_snapshot.display(), "device files begin after what this snapshot read (pruned after a checkpoint): starting it from the checkpoint");
        Snapshot::remove(&path_of_snapshot);
        let device = self.log.device_id().to_owned();
        self.snapshot = super::super::SnapshotUse::open(path_of_snapshot, &device, lock);
        self.snapshot.is_some()
    }
}

/// The records a checkpoint attests by place and id: its heads and its line's, what a view
/// that starts from it no longer finds in the relay.
pub(in crate::edge::ledger) fn attested_of(
    base: &SnapshotBase,
) -> std::collections::BTreeSet<(String, u64, OpId)> {
    base.compactions
        .iter()
        .flat_map(|mark| mark.heads.iter().cloned())
        .chain(base.compaction_heads())
        .collect()
}

/// A checkpoint's loaded part as a view, without its runs, with what it attests: what its
/// heads and the ids it knows are compared with (`covers_starts`, `contradicts_starts`).
pub(in crate::edge::ledger) fn base_view(base: &SnapshotBase) -> Result<LedgerState, String> {
    let mut view = LedgerState::restored(base)?;
    view.attested = attested_of(base);
    Ok(view)
}

/// Folds a checkpoint's runs into `view`, its loaded part ([`base_view`]); `None` when a run
/// cannot be read.
pub(in crate::edge::ledger) fn load_runs(view: &mut LedgerState, file: &mut CheckpointFile) -> Option<()> {
    file.for_each_run(|agent, run, summary| view.state.merge_summary(agent, run, summary))
        .ok()
}

/// Whether `view` covers every record removed from the logs (`starts`: per device, the seq of
/// its first stored record and the id that record names as its `prev`).
pub(in crate::edge::ledger) fn covers_starts(
    view: &LedgerState,
    starts: &BTreeMap<String, (u64, OpId)>,
) -> bool {
    starts
        .iter()
        .all(|(device, start)| covers_start(view, device, *start))
}

/// Whether `view` covers the records of `device` before its first stored record, `first`,
/// which names `prev`: it reaches it, and where it knows the record before it, that record is
/// `prev` (found by an adversarial test: a checkpoint of another ledger with the same device
/// ids, whose head sat on the kept record, was taken for this one's: a run that never ran here
/// was "already committed", and a commit was lost).
pub(in crate::edge::ledger) fn covers_start(
    view: &LedgerState,
    device: &str,
    (first, prev): (u64, OpId),
) -> bool {
    view.frontier.next_seq(device) >= first && !contradicts_start(view, device, (first, prev))
}

/// Whether `view` names another record than the files do before the first record of some
/// device (another ledger's checkpoint, or a device whose log was replaced since).
pub(in crate::edge::ledger) fn contradicts_starts(
    view: &LedgerState,
    starts: &BTreeMap<String, (u64, OpId)>,
) -> bool {
    starts
        .iter()
        .any(|(device, start)| contradicts_start(view, device, *start))
}

pub(in crate::edge::ledger) fn contradicts_start(
    view: &LedgerState,
    device: &str,
    (first, prev): (u64, OpId),
) -> bool {
    first
        .checked_sub(1)
        .and_then(|before| view.known_id(device, before))
        .is_some_and(|known| known != prev)
}

/// Checkpoints merged (rule K6): their view, their files, and whether they cover every record
/// removed from the logs.
pub(in crate::edge::ledger) struct Merged {
    pub(in crate::edge::ledger) view: LedgerState,
    pub(in crate::edge::ledger) parts: Vec<PathBuf>,
    pub(in crate::edge::ledger) covers: bool,
}

/// The merge (rule K6) of checkpoints among `usable` (best first) that together cover every
/// record removed from the logs (`starts`): each one taken covers more of a device that the
/// merge does not cover yet. One that cannot be merged (not a view of the same ledger as the
/// others: see [`LedgerState::merge_checkpoint`]) is left out. When they do not cover it all
/// together, the merge of those that cover some of it ([`Merged::covers`] false); `None` when
/// none does.
pub(in crate::edge::ledger) fn merge_covering(
    usable: Vec<(PathBuf, CheckpointFile, LedgerState)>,
    starts: &BTreeMap<String, (u64, OpId)>,
) -> Option<Merged> {
    let mut merged: Option<Merged> = None;
    for (path, mut file, mut view) in usable {
        if contradicts_starts(&view, starts) {
            tracing::warn!(checkpoint = %path.display(), "the checkpoint names other records than the device files here (another ledger's?); not used");
            continue;
        }
        let so_far = merged.as_ref().map(|merged| &merged.view);
        let adds = starts.iter().any(|(device, start)| {
            let reach = |view: Option<&LedgerState>| view.map_or(0, |view| view.frontier.next_seq(device));
            !so_far.is_some_and(|so_far| covers_start(so_far, device, *start))
                && reach(Some(&view)) > reach(so_far)
        });
        if !adds || load_runs(&mut view, &mut file).is_none() {
            continue;
        }
        let so_far = match &mut merged {
            None => merged.insert(Merged {
                view,
                parts: Vec::new(),
                covers: false,
            }),
            Some(so_far) => {
                if let Err(reason) = so_far.view.merge_checkpoint(view) {
                    tracing::warn!(checkpoint = %path.display(), %reason, "cannot merge this checkpoint with the others");
                    continue;
                }
                so_far
            }
        };
        so_far.parts.push(path);
        if covers_starts(&so_far.view, starts) {
            so_far.covers = true;
            break;
        }
    }
    merged
}

impl Ledger {
    /// [`loaded_view`], with this ledger's protected reading restored from the checkpoint.
    pub(in crate::edge::ledger) fn loaded_view(&self, file: &mut CheckpointFile) -> Option<LedgerState> {
        let view = loaded_view(file)?;
        self.with_protected(view, file.base()).ok()
    }
}

pub(in crate::edge::ledger) fn loaded_view(file: &mut CheckpointFile) -> Option<LedgerState> {
    let mut view = LedgerState::restored(file.base()).ok()?;
    load_runs(&mut view, file)?;
    Some(view)
}
