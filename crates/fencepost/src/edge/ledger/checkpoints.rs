//! A ledger's use of the shared checkpoints ([`crate::checkpoint`]): writing one, starting from
//! one, and checking them against the records they cover.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{contains, CompactOptions, Ledger, LedgerState};
use crate::checkpoint::{self, CheckpointInfo};
use crate::dispatch::DispatchError;
use crate::fold::Forgetting;
use crate::oplog::{HeadMark, OpId, OpRecord};
use crate::relay::{Frontier, ProblemKind, RelayProblem};
use crate::snapshot::{CheckpointFile, CompactionMark, Snapshot, SnapshotBase, SnapshotError};

impl Ledger {
    /// Writes a shared checkpoint of this ledger (see [`crate::checkpoint`]): the fold of every
    /// record it has read, with every device's head and the relay's cursor there, into the
    /// relay's checkpoints folder, where a new site starts from it instead of reading every
    /// record. Checkpoints that this one contains are removed. Unsent records are stored first.
    /// The ledger must have been opened without a snapshot: it read, and checked, every record.
    ///
    /// # Errors
    /// [`DispatchError::Damaged`] when the ledger is damaged (a checkpoint of an incomplete
    /// ledger would lack commits), [`DispatchError::Checkpoint`] when the relay keeps no
    /// checkpoints, the ledger resumed from a snapshot, has no records, or the file cannot be
    /// written, [`DispatchError::Relay`] when unsent records
    /// cannot be stored.
    pub fn compact(&mut self) -> Result<CheckpointInfo, DispatchError> {
        self.compact_with(&CompactOptions::default())
    }

    /// [`compact`](Self::compact), with `options`. Every checkpoint carries the compactions of
    /// its line (when each was written, by this ledger's clock, and how many records of each
    /// device it covered). With [`forget`](CompactOptions::forget), the newest of them written
    /// at least that long ago is the anchor of a [`Forgetting`] rule: the checkpoint leaves out
    /// the committed runs the anchor already covered (never a run in doubt; the fencing epochs
    /// are kept whole), says so in its content and its name, and the sites that use a snapshot
    /// move to it at their next open (so that their snapshots stop growing with those runs
    /// too). With no compaction that old yet, nothing is forgotten
    /// ([`CheckpointInfo::forgotten`] is `None`).
    ///
    /// # Errors
    /// As [`compact`](Self::compact).
    pub fn compact_with(&mut self, options: &CompactOptions) -> Result<CheckpointInfo, DispatchError> {
        let failed = |what: String| DispatchError::Checkpoint(format!("cannot write a checkpoint: {what}"));
        let dir = self.relay.checkpoints_dir().ok_or_else(|| {
            failed("this ledger keeps no checkpoints (a ledger in PostgreSQL keeps them with a folder for this site's copies: PostgresRelay::with_checkpoint_mirror)".to_owned())
        })?;
        if self.resumed_from_snapshot() {
            // Its records read before are not read again: damage among them would not be seen.
            return Err(failed(
                "compaction needs a ledger that read every record (opened without a snapshot), so that every record is checked".to_owned(),
            ));
        }
        self.flush()?;
        let problems: Vec<RelayProblem> = self.damage().into_iter().cloned().collect();
        if !problems.is_empty() || !self.view.rejected.is_empty() {
            return Err(DispatchError::Damaged { problems });
        }
        if self.view.frontier.iter().next().is_none() {
            return Err(failed("the ledger has no records yet".to_owned()));
        }
        std::fs::create_dir_all(&dir)
            .map_err(|error| failed(format!("cannot create {}: {error}", dir.display())))?;
        checkpoint::remove_leftovers(&dir, &[".writing-", ".folding-"]);
        // Stored elsewhere (a database): every stored one copied here, the line of compactions
        // and the ones this one contains are found among them.
        // One that cannot be copied is left as it is (`verify` reports it): the database holds
        // every record it covers.
        for (name, error) in self.mirror_checkpoints(&dir, |_, _| true) {
            tracing::warn!(checkpoint = name.as_str(), %error, "cannot copy a stored checkpoint; compacting without it");
        }
        // A name no other compaction uses: this device's, this process's, this call's.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let stamp = format!(
            "{}-{}-{}",
            crate::relay::device_file_name(self.log.device_id()).trim_end_matches(".jsonl"),
            std::process::id(),
            CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let written = dir.join(format!(".writing-{stamp}.sqlite"));
        let now_ms = (self.wall_clock)();
        let mut compactions = self.compactions_before(&dir);
        // The newest stamp of the records here, and the line's latest compaction: a compacting
        // host whose clock is behind (days, or 1970 before it synchronises) never writes a
        // compaction that looks older than the records it covers or than the line before it
        // (found by an adversarial test: a plain compaction at 1970 made every fresh commit
        // "old"); one whose clock is ahead does not find a compaction old before the newest
        // record does (a ledger nobody writes to any more forgets nothing more: it does not
        // grow either).
        let newest_stamp_ms = self
            .view
            .heads
            .values()
            .filter_map(|head| head.last_hlc().map(|hlc| hlc.wall_ms))
            .max()
            .unwrap_or(0);
        let line_ms = compactions
            .iter()
            .map(|mark| mark.written_at_ms)
            .max()
            .unwrap_or(0);
        let written_at_ms = now_ms.max(line_ms).max(newest_stamp_ms);
        let judged_at_ms = now_ms.min(newest_stamp_ms);
        let forget = options.forget.as_ref().and_then(|retention| {
            let limit = judged_at_ms.checked_sub(retention.older_than_ms)?;
            let anchor = compactions
                .iter()
                .filter(|mark| mark.written_at_ms <= limit)
                .max_by_key(|mark| mark.written_at_ms)?;
            Some(Forgetting {
                anchor_written_at_ms: anchor.written_at_ms,
                anchor_heads: anchor
                    .heads
                    .iter()
                    .map(|(device, next_seq, _)| (device.clone(), *next_seq))
                    .collect(),
                agents: retention.agents.clone(),
            })
        });
        let heads = self.view.compaction_heads();
        // The same records compacted again keep the time they were first covered (and two
        // compactions of the same records write one checkpoint, rule K4). A clock that is not
        // set yet adds nothing (found by an adversarial test: a host at 1970 that wrote a commit
        // and compacted made it "old").
        let clock_unset = now_ms < options.clock_floor_ms;
        if clock_unset {
            tracing::warn!(now_ms, "this host's clock is not set (it reads before {} ms since the Unix epoch): its compaction starts no anchor for a retention", options.clock_floor_ms);
        }
        if !clock_unset && compactions.last().is_none_or(|last| last.heads != heads) {
            compactions.push(CompactionMark { written_at_ms, heads });
        }
        thin_compactions(&mut compactions);
        let exported = self.export_checkpoint(&dir, &stamp, &written, forget.as_ref(), compactions);
        let (file, forgotten_runs) = match exported {
            Ok(exported) => exported,
            Err(error) => {
                Snapshot::remove(&written);
                return Err(failed(error));
            }
        };
        let id = checkpoint::id_hex(&file.id());
        let heads = file.base().heads.clone();
        let records = file.base().records();
        let runs = file.runs();
        let forgotten = file.base().forgotten.clone();
        let forgets_before_ms = file.base().forgets_before_ms();
        drop(file);
        let path = dir.join(checkpoint::file_name(records, &id, forgets_before_ms));
        let moved = std::fs::rename(&written, &path)
            .and_then(|()| std::fs::File::open(&dir).and_then(|folder| folder.sync_all()));
        if let Err(error) = moved {
            Snapshot::remove(&written);
            return Err(failed(format!(
                "cannot move the checkpoint into {}: {error}",
                dir.display()
            )));
        }
        if let Some(store) = self.relay.checkpoint_store() {
            let name = checkpoint::file_name(records, &id, forgets_before_ms);
            if let Err(error) = store.upload(&name, &path) {
                Snapshot::remove(&path);
                return Err(failed(format!("cannot store it in the ledger: {error}")));
            }
        }
        // The checkpoints this one contains are of no more use: those of this ledger's records
        // (another ledger's is left for `verify` to report), and of two of the same records
        // (two compactions at once), the one with the greater id stays (found by an adversarial
        // test: two compactions at once removed each other's, and the line was lost): the one
        // that comes first in the order sites choose by (`checkpoint::list`).
        let ours = crate::hex::decode_lower_hex::<32>(&id).map(|id| (forgets_before_ms, id));
        let stored_elsewhere = self.relay.checkpoint_store().is_some();
        for (older_name, older) in checkpoint::list(&dir).unwrap_or_default() {
            if older == path || older_name.records > records {
                continue;
            }
            let opened = CheckpointFile::open(&older);
            // Stored in a database, a damaged one of no more records than this one is of no
            // use, and new sites that would choose it first stop on it: it goes (found by an
            // adversarial test: a stored checkpoint cut short, its size edited to match,
            // stopped new hosts after every compaction of the same records, whose checkpoints
            // got other ids). Records pruned after it are in this one too: this ledger is
            // intact, so it read them, or started from another checkpoint that covers them. In
            // a folder, a damaged file may be one a sync tool has not finished copying: it stays.
            let damaged = stored_elsewhere
                && match &opened {
                    Ok(file) => older_name.mismatch(file).is_some() || file.check_pages().is_err(),
                    Err(error) => !error.is_busy(),
                };
            let before_ours =
                older_name.records == records && Some((older_name.forgets_before_ms, older_name.id)) > ours;
            if before_ours && !damaged {
                continue;
            }
            let contained = damaged
                || opened.is_ok_and(|file| {
                    let base = file.base();
                    contains(&heads, &base.heads)
                        && (self.view.holds(&base.compaction_heads()) || self.superseded(&base.heads))
                });
            if contained {
                if let Some(store) = self.relay.checkpoint_store() {
                    let name = older.file_name().and_then(|name| name.to_str()).unwrap_or("");
                    if let Err(error) = store.remove(name) {
                        tracing::warn!(checkpoint = name, %error, "cannot remove an older checkpoint from the ledger");
                        continue;
                    }
                }
                if let Err(error) = std::fs::remove_file(&older).or_else(|error| {
                    // Another compaction removed it first.
                    (error.kind() == std::io::ErrorKind::NotFound)
                        .then_some(())
                        .ok_or(error)
                }) {
                    tracing::warn!(checkpoint = %older.display(), %error, "cannot remove an older checkpoint");
                }
            }
        }
        tracing::info!(checkpoint = %path.display(), records, runs, "wrote a checkpoint");
        let mut pruned = 0;
        if options.prune {
            // The checkpoint is in place (renamed, the folder synced): this device's records
            // it covers go.
            let own = heads
                .iter()
                .find(|head| head.device_id == self.log.device_id())
                .and_then(|head| Some((head.next_seq.checked_sub(1)?, head.last?.0)));
            if let Some((through_seq, through_id)) = own {
                pruned = self
                    .relay
                    .prune(self.log.device_id(), through_seq, through_id)
                    .map_err(|error| {
                        failed(format!(
                            "wrote {}, but cannot prune this device's log: {error}",
                            path.display()
                        ))
                    })?;
            }
        }
        Ok(CheckpointInfo {
            path,
            id,
            records,
            devices: heads.len(),
            runs,
            forgotten,
            forgotten_runs,
            pruned,
        })
    }

    /// Folds into `view` the records from `since` on that `base` covers (up to its heads), read
    /// again a batch at a time (never all held at once).
    fn fold_covered(
        &self,
        view: &mut LedgerState,
        since: &Frontier,
        base: &SnapshotBase,
    ) -> Result<(), DispatchError> {
        let ends: std::collections::BTreeMap<&str, u64> = base
            .heads
            .iter()
            .map(|head| (head.device_id.as_str(), head.next_seq))
            .collect();
        self.relay.pull_in_batches(since, &mut |batch| {
            let covered: Vec<OpRecord> = batch
                .into_iter()
                .filter(|op| ends.get(&*op.device_id).is_some_and(|end| op.seq < *end))
                .collect();
            if !covered.is_empty() {
                view.absorb(&covered);
            }
        })?;
        Ok(())
    }

    /// Writes the checkpoint's file at `written`: the view, folded into a snapshot of its own
    /// (`.folding-…` in `dir`), copied; without the runs that `forget` forgets (and how many
    /// those were).
    fn export_checkpoint(
        &mut self,
        dir: &Path,
        stamp: &str,
        written: &Path,
        forget: Option<&Forgetting>,
        compactions: Vec<CompactionMark>,
    ) -> Result<(CheckpointFile, u64), String> {
        let cursor = self.relay.cursor(&self.view.frontier).ok_or(
            "the relay cannot say where its reading stands (a device file with an incomplete last line?); try again",
        )?;
        let folded = dir.join(format!(".folding-{stamp}.sqlite"));
        // A file of this name is a leftover of a process killed with this process's id.
        Snapshot::remove(&folded);
        Snapshot::remove(written);
        let view = &self.view;
        let covered = forget.map(|rule| view.covered_ids(rule)).unwrap_or_default();
        let mut forgotten_runs = 0u64;
        let exported = (|| -> Result<CheckpointFile, SnapshotError> {
            let mut store = Snapshot::open(&folded, self.log.device_id())?;
            let mut save = store
                .begin_save(|_| true, view.state.run_count())?
                .ok_or_else(|| SnapshotError::Other("a new file had a saved state".to_owned()))?;
            view.state.for_each_run_summary(|agent, run, summary| {
                if forget.is_some_and(|rule| view.forgets(rule, &covered, agent, run, &summary)) {
                    forgotten_runs += 1;
                    return Ok(());
                }
                save.put_run(agent, run, &summary)
            })?;
            let mut base = view.base_mark(cursor);
            base.forgotten = forget.cloned();
            base.compactions = compactions;
            save.finish(&base)?;
            store.export(written)
        })();
        Snapshot::remove(&folded);
        exported
            .map(|file| (file, forgotten_runs))
            .map_err(|error| error.to_string())
    }

    /// The compactions of the line of the best checkpoint in `dir` (see
    /// [`compact_with`](Self::compact_with)), when it is one to take them from: its content
    /// matches its name, and its line is consistent and of this ledger's records (times and
    /// heads never go down, every compaction names records this ledger has, the last one is
    /// the checkpoint's own heads). Found by an adversarial test: another ledger's checkpoint
    /// copied in, one whose name `verify` reports, or one of a device whose records were
    /// replaced since, lent its compactions. Else none (nothing is forgotten this time).
    fn compactions_before(&self, dir: &Path) -> Vec<CompactionMark> {
        let Some((named, path)) = checkpoint::list(dir)
            .ok()
            .and_then(|listed| listed.into_iter().next())
        else {
            return Vec::new();
        };
        let file = match CheckpointFile::open(&path) {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(checkpoint = %path.display(), %error, "cannot read the compactions of the latest checkpoint; none is an anchor this time");
                return Vec::new();
            }
        };
        let base = file.base();
        let line = &base.compactions;
        let monotone = line.windows(2).all(|pair| {
            pair[0].written_at_ms <= pair[1].written_at_ms
                && pair[0].heads.iter().all(|(device, next_seq, _)| {
                    pair[1]
                        .heads
                        .iter()
                        .any(|(later, later_seq, _)| later == device && later_seq >= next_seq)
                })
        });
        let ours = line.iter().all(|mark| self.view.holds(&mark.heads));
        let ends_here = line
            .last()
            .is_none_or(|last| last.heads == base.compaction_heads());
        if named.mismatch(&file).is_some() || !monotone || !ours || !ends_here {
            tracing::warn!(checkpoint = %path.display(), "the latest checkpoint does not match its name, this ledger's records or its own line of compactions; none is an anchor this time (ledger verify says more)");
            return Vec::new();
        }
        line.clone()
    }

    /// Copies the best shared checkpoint (the one covering the most records) into this site's
    /// empty snapshot, checking it whole (see [`crate::checkpoint`], rule K3); returns its id. A
    /// damaged one is damage of this ledger ([`damage`](Self::damage)), and not used.
    pub(super) fn import_checkpoint(&mut self) -> Option<(String, PathBuf)> {
        let dir = self.relay.checkpoints_dir()?;
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
        self.snapshot = super::SnapshotUse::open(path_of_snapshot.clone(), &device, lock);
        let empty = self
            .snapshot
            .as_ref()
            .is_some_and(|snapshot| matches!(snapshot.store.base(), Ok(None)));
        if !empty {
            return None; // made by another process (or cannot be made now): that one is used
        }
        let (_, lock) = self.snapshot.take()?.close();
        let installed = Snapshot::install_checkpoint(&path_of_snapshot, &device, &path, &named.id);
        self.snapshot = super::SnapshotUse::open(path_of_snapshot, &device, lock);
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
    fn checkpoint_unusable(&mut self, path: &Path, detail: &str) {
        self.checkpoint_damage = Some(checkpoint_problem(path, &format!("cannot be used: {detail}")));
        if self.relay.checkpoint_store().is_some() {
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
    pub(super) fn move_to_forgetting_checkpoint(&mut self, base: &SnapshotBase) -> bool {
        let Some(dir) = self.relay.checkpoints_dir() else {
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
        self.snapshot = super::SnapshotUse::open(path_of_snapshot, &device, lock);
        self.snapshot.is_some()
    }

    /// Starts the view from the best shared checkpoint that covers every record removed from
    /// the relay ([`Relay::log_starts`](crate::relay::Relay::log_starts)), its runs loaded, when
    /// records were removed: a reading from record 0 would lack them. None that covers them (not
    /// synced here yet, removed, damaged) is damage of this ledger: nothing runs on it.
    pub(super) fn start_after_pruning(&mut self) -> Result<(), DispatchError> {
        let starts = self.relay.log_starts()?;
        if starts.is_empty() {
            return Ok(());
        }
        let Some(dir) = self.relay.checkpoints_dir() else {
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
            let Ok(mut view) = base_view(file.base()) else {
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
        // of those that together cover them (rule K6).
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
    pub(super) fn write_merged_start(&mut self) {
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
    pub(super) fn move_past_pruned(&mut self, base: &SnapshotBase) -> bool {
        // A store that holds no checkpoint (just listed): no log was pruned that a reading
        // could start after (a pull reports one that was), and a database is not asked again.
        if self.relay.checkpoint_store().is_some() && self.stored_checkpoints.get() == Some(0) {
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
        self.snapshot = super::SnapshotUse::open(path_of_snapshot, &device, lock);
        self.snapshot.is_some()
    }

    /// Whether a checkpoint with `heads` is superseded by the checkpoint this ledger started
    /// from after records were pruned: that one covers each of its devices at least as far, and
    /// every record this ledger knows at one of its heads is the one it names. Its records were
    /// pruned (nobody can check it again) and no reading uses it (a site starts from a
    /// checkpoint that covers more, rule K6): it is of no more use, not damage. Found by the
    /// torture test: a checkpoint a sync brought after a newer one had covered its records and
    /// they were pruned stayed for good, and `ledger verify` said it could not be checked.
    fn superseded(&self, heads: &[HeadMark]) -> bool {
        let Some((_, started_at)) = &self.start_checkpoint else {
            return false;
        };
        heads.iter().all(|head| {
            let known = head
                .next_seq
                .checked_sub(1)
                .and_then(|last| self.view.known_id(&head.device_id, last));
            started_at.next_seq(&head.device_id) >= head.next_seq
                && known.is_none_or(|id| head.last.is_some_and(|(last, _, _)| last == id))
        })
    }

    /// The checkpoint this ledger started from because device files begin after it (their
    /// first records were pruned), and where it ends: a reading of every record reads from
    /// there.
    pub fn pruned_start(&self) -> Option<(&Path, &Frontier)> {
        self.start_checkpoint
            .as_ref()
            .map(|(path, frontier)| (path.as_path(), frontier))
    }

    /// The shared checkpoint that a new site could not start from, if any (it is damaged or
    /// does not match its name): part of [`damage`](Self::damage) until the process ends, and
    /// cannot be accepted; remove the file (the records it covers are still in the relay) or
    /// write a new checkpoint.
    pub fn checkpoint_failure(&self) -> Option<&RelayProblem> {
        self.checkpoint_damage.as_ref()
    }

    /// The id of the shared checkpoint this ledger started from (a new site's first open with a
    /// [snapshot](super::LedgerOptions::snapshot)), if it did.
    pub fn started_from_checkpoint(&self) -> Option<&str> {
        self.started_from.as_deref()
    }

    /// Checks every shared checkpoint against the records it covers (rule K3): its id, its
    /// heads (the ledger's records there), and its content, which must be the fold of those
    /// records (the runs, fencing epochs, attempts and other records). Returns one problem per
    /// checkpoint that fails; one that covers records this ledger does not have (a synced folder
    /// behind it, or a device file that shrank) fails too, as a site would not start from it.
    /// Needs a ledger opened without a snapshot (one that read every record).
    ///
    /// # Errors
    /// [`DispatchError::Checkpoint`] when the ledger resumed from a snapshot or the folder
    /// cannot be listed, [`DispatchError::Relay`] when the records cannot be read again.
    pub fn verify_checkpoints(&self) -> Result<Vec<RelayProblem>, DispatchError> {
        let failed =
            |what: String| DispatchError::Checkpoint(format!("cannot check the checkpoints: {what}"));
        let Some(dir) = self.relay.checkpoints_dir() else {
            return Ok(Vec::new());
        };
        if self.resumed_from_snapshot() {
            return Err(failed(
                "checking checkpoints needs a ledger that read every record".to_owned(),
            ));
        }
        // Stored elsewhere (a database): what is stored is checked, copied afresh into a folder
        // of this call's, not this site's copies (found by an adversarial test: a host whose
        // copy was whole said "intact" of a damaged stored checkpoint that stopped every new
        // host, and one that had copied a damaged one reported it after it was stored again).
        let stored_elsewhere = self.relay.checkpoint_store().is_some();
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
        let listed = checkpoint::list(&checked)
            .map_err(|error| failed(format!("cannot list {}: {error}", checked.display())))?;
        for (named, path) in listed {
            // Named where sites keep it.
            let shown = path
                .file_name()
                .map_or_else(|| path.clone(), |name| dir.join(name));
            let problem = |detail: String| checkpoint_problem(&shown, &detail);
            let mut file = match CheckpointFile::open(&path) {
                Ok(file) => file,
                Err(error) => {
                    problems.push(problem(format!("cannot be read: {error}")));
                    continue;
                }
            };
            // (Found by an adversarial test: a byte changed in a page's free space was
            // "intact" here, while every new site refused the file.)
            if let Err(error) = file.check_pages() {
                problems.push(problem(format!("cannot be used: {error}")));
                continue;
            }
            if let Some(detail) = named.mismatch(&file) {
                problems.push(problem(detail));
                continue;
            }
            let base = file.base();
            let forgotten = base.forgotten.clone();
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
                problems.push(problem(format!(
                    "ends device {device:?} at a record that is not the ledger's"
                )));
                continue;
            }
            if let Some((device, covers, has)) = ahead {
                // A site would not start from it either (see `resume_snapshot`).
                problems.push(problem(format!(
                    "covers {covers} records of device {device:?}, the ledger here has {has}: a synced folder that has not brought them yet (check again once it has), or a device file that shrank, was replaced or lost records (restore it from a copy)"
                )));
                continue;
            }
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
            let folded;
            let prefix = if exact {
                &self.view
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
                    .and_then(|mut file| loaded_view(&mut file));
                let Some(mut view) = from_start else {
                    if self.superseded(&base.heads) {
                        tracing::info!(checkpoint = %shown.display(), "superseded by the checkpoint this ledger starts from (its records were pruned, so it cannot be checked, and no reading uses it); the next compaction removes it");
                        continue;
                    }
                    problems.push(problem(format!(
                        "cannot be checked: it covers records removed from the relay (pruned) before {}, which this ledger starts from; remove it",
                        start.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned())
                    )));
                    continue;
                };
                self.fold_covered(&mut view, started_at, base)?;
                if let Some(rule) = &forgotten {
                    view.forget_runs(rule);
                }
                view.forgotten.clone_from(&forgotten);
                folded = view;
                &folded
            } else {
                // The records it covers, read again and folded a batch at a time (not all held
                // at once).
                let mut view = LedgerState::new();
                self.fold_covered(&mut view, &Frontier::new(), base)?;
                if let Some(rule) = &forgotten {
                    view.forget_runs(rule);
                    view.forgotten = Some(rule.clone());
                }
                folded = view;
                &folded
            };
            let mut mark = prefix.base_mark(Value::Null);
            // The compactions of its line are when others wrote theirs: not in the records.
            mark.compactions.clone_from(&base.compactions);
            if comparable(&mark) != comparable(base) {
                problems.push(problem(
                    "does not hold the fencing epochs, attempts or heads of the records it covers (forged, or written by a faulty site)".to_owned(),
                ));
                continue;
            }
            let mut theirs = match LedgerState::restored(base) {
                Ok(view) => view.state,
                Err(reason) => {
                    problems.push(problem(format!("cannot be read: {reason}")));
                    continue;
                }
            };
            if let Err(error) =
                file.for_each_run(|agent, run, summary| theirs.merge_summary(agent, run, summary))
            {
                problems.push(problem(format!("cannot be read: {error}")));
                continue;
            }
            if theirs != prefix.state {
                problems.push(problem(
                    "does not hold the runs of the records it covers (forged, or written by a faulty site)"
                        .to_owned(),
                ));
            }
        }
        Ok(problems)
    }
}

/// The view a checkpoint file stands for, its runs loaded; `None` when it cannot be read.
impl Ledger {
    /// For a relay that stores its checkpoints elsewhere than [`checkpoints_dir`](crate::relay::Relay::checkpoints_dir)
    /// (a database, [`checkpoint_store`](crate::relay::Relay::checkpoint_store)): brings `dir`,
    /// this site's copies, in line with the store. A copy the store no longer has is removed; a
    /// stored one that `wanted` names (by its place in the order sites choose by, 0 being the
    /// one used, and its name) is copied in when missing (to a file of its own, then renamed:
    /// the processes of one host may share `dir`). Returns what could not be copied, and why (a
    /// store that cannot be listed leaves `dir` as it is: the ledger then reads its records
    /// from the relay, which holds every one). Nothing for a relay whose `dir` is shared.
    fn mirror_checkpoints(
        &self,
        dir: &Path,
        wanted: impl Fn(usize, &checkpoint::CheckpointName) -> bool,
    ) -> Vec<(String, String)> {
        let Some(store) = self.relay.checkpoint_store() else {
            return Vec::new();
        };
        let names = match store.names() {
            Ok(names) => names,
            Err(error) => {
                tracing::warn!(%error, "cannot list the ledger's checkpoints; reading its records");
                return vec![("the checkpoints".to_owned(), error.to_string())];
            }
        };
        self.stored_checkpoints.set(Some(names.len()));
        let mut stored: Vec<(checkpoint::CheckpointName, String)> = names
            .into_iter()
            .filter_map(|name| Some((checkpoint::parse_file_name(&name)?, name)))
            .collect();
        stored.sort_by_key(|(named, _)| checkpoint::rank(named));
        for (_, path) in checkpoint::list(dir).unwrap_or_default() {
            let kept = path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| stored.iter().any(|(_, stored)| stored == name));
            if !kept {
                if let Err(error) = std::fs::remove_file(&path) {
                    tracing::debug!(checkpoint = %path.display(), %error, "cannot remove a copy of a checkpoint the ledger no longer has");
                }
            }
        }
        let mut failures = Vec::new();
        for (index, (named, name)) in stored.iter().enumerate() {
            let path = dir.join(name);
            if !wanted(index, named) || path.exists() {
                continue;
            }
            if let Err(error) = std::fs::create_dir_all(dir) {
                failures.push((name.clone(), format!("cannot create {}: {error}", dir.display())));
                break;
            }
            checkpoint::remove_leftovers(dir, &[".downloading-"]);
            static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let copy = dir.join(format!(
                ".downloading-{}-{}-{name}",
                std::process::id(),
                COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            let copied = (|| -> Result<bool, String> {
                let mut file = std::fs::File::create(&copy).map_err(|error| error.to_string())?;
                let mut writer = std::io::BufWriter::new(&mut file);
                if !store
                    .download(name, &mut writer)
                    .map_err(|error| error.to_string())?
                {
                    return Ok(false);
                }
                std::io::Write::flush(&mut writer).map_err(|error| error.to_string())?;
                drop(writer);
                file.sync_all().map_err(|error| error.to_string())?;
                std::fs::rename(&copy, &path).map_err(|error| error.to_string())?;
                Ok(true)
            })();
            match copied {
                Ok(true) => tracing::info!(checkpoint = %path.display(), "copied a checkpoint of the ledger"),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(checkpoint = name.as_str(), %error, "cannot copy a checkpoint of the ledger; reading its records");
                    failures.push((name.clone(), error));
                }
            }
            let _ = std::fs::remove_file(&copy);
        }
        failures
    }
}

/// A folder of fresh copies of stored checkpoints, removed when dropped.
struct FreshCopies(Option<PathBuf>);

impl Drop for FreshCopies {
    fn drop(&mut self) {
        if let Some(folder) = &self.0 {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

/// The records a checkpoint attests by place and id: its heads and its line's, what a view
/// that starts from it no longer finds in the relay.
fn attested_of(base: &SnapshotBase) -> std::collections::BTreeSet<(String, u64, OpId)> {
    base.compactions
        .iter()
        .flat_map(|mark| mark.heads.iter().cloned())
        .chain(base.compaction_heads())
        .collect()
}

/// A checkpoint's loaded part as a view, without its runs, with what it attests: what its
/// heads and the ids it knows are compared with (`covers_starts`, `contradicts_starts`).
fn base_view(base: &SnapshotBase) -> Result<LedgerState, String> {
    let mut view = LedgerState::restored(base)?;
    view.attested = attested_of(base);
    Ok(view)
}

/// Folds a checkpoint's runs into `view`, its loaded part ([`base_view`]); `None` when a run
/// cannot be read.
fn load_runs(view: &mut LedgerState, file: &mut CheckpointFile) -> Option<()> {
    file.for_each_run(|agent, run, summary| view.state.merge_summary(agent, run, summary))
        .ok()
}

/// Whether `view` covers every record removed from the logs (`starts`: per device, the seq of
/// its first stored record and the id that record names as its `prev`).
fn covers_starts(view: &LedgerState, starts: &BTreeMap<String, (u64, OpId)>) -> bool {
    starts
        .iter()
        .all(|(device, start)| covers_start(view, device, *start))
}

/// Whether `view` covers the records of `device` before its first stored record, `first`,
/// which names `prev`: it reaches it, and where it knows the record before it, that record is
/// `prev` (found by an adversarial test: a checkpoint of another ledger with the same device
/// ids, whose head sat on the kept record, was taken for this one's: a run that never ran here
/// was "already committed", and a commit was lost).
fn covers_start(view: &LedgerState, device: &str, (first, prev): (u64, OpId)) -> bool {
    view.frontier.next_seq(device) >= first && !contradicts_start(view, device, (first, prev))
}

/// Whether `view` names another record than the files do before the first record of some
/// device (another ledger's checkpoint, or a device whose log was replaced since).
fn contradicts_starts(view: &LedgerState, starts: &BTreeMap<String, (u64, OpId)>) -> bool {
    starts
        .iter()
        .any(|(device, start)| contradicts_start(view, device, *start))
}

fn contradicts_start(view: &LedgerState, device: &str, (first, prev): (u64, OpId)) -> bool {
    first
        .checked_sub(1)
        .and_then(|before| view.known_id(device, before))
        .is_some_and(|known| known != prev)
}

/// Checkpoints merged (rule K6): their view, their files, and whether they cover every record
/// removed from the logs.
struct Merged {
    view: LedgerState,
    parts: Vec<PathBuf>,
    covers: bool,
}

/// The merge (rule K6) of checkpoints among `usable` (best first) that together cover every
/// record removed from the logs (`starts`): each one taken covers more of a device that the
/// merge does not cover yet. One that cannot be merged (not a view of the same ledger as the
/// others: see [`LedgerState::merge_checkpoint`]) is left out. When they do not cover it all
/// together, the merge of those that cover some of it ([`Merged::covers`] false); `None` when
/// none does.
fn merge_covering(
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

fn loaded_view(file: &mut CheckpointFile) -> Option<LedgerState> {
    let mut view = LedgerState::restored(file.base()).ok()?;
    load_runs(&mut view, file)?;
    Some(view)
}

/// Keeps a checkpoint line's compactions bounded: every one of the last two days (by
/// `written_at_ms`, UTC), the last of each day before, and at most the newest 4 096.
fn thin_compactions(compactions: &mut Vec<CompactionMark>) {
    const DAY_MS: u64 = 86_400_000;
    const MAX: usize = 4096;
    compactions.sort_by_key(|mark| mark.written_at_ms);
    let newest_day = compactions.last().map_or(0, |mark| mark.written_at_ms / DAY_MS);
    let mut kept: Vec<CompactionMark> = Vec::with_capacity(compactions.len());
    for mark in compactions.drain(..) {
        let day = mark.written_at_ms / DAY_MS;
        if let Some(previous) = kept.last() {
            if previous.written_at_ms / DAY_MS == day && day + 1 < newest_day {
                kept.pop(); // an earlier one of the same old day
            }
        }
        kept.push(mark);
    }
    let excess = kept.len().saturating_sub(MAX);
    kept.drain(..excess);
    *compactions = kept;
}

/// The damage of the checkpoint at `path`: it `detail`, and what to do.
fn checkpoint_problem(path: &Path, detail: &str) -> RelayProblem {
    RelayProblem {
        kind: ProblemKind::Damage,
        device_id: None,
        file: Some(path.to_path_buf()),
        line_number: None,
        detail: format!(
            "the checkpoint {detail}; write a new one with `fencepost ledger compact` on a host whose ledger is intact (or remove it, if no device's records were pruned after it: the records it covers are then all in the ledger)"
        ),
    }
}

/// A checkpoint's loaded part as compared with a fold: without the relay's cursor, and with the
/// other surfaces' records in one order (a site keeps them in the order it read them).
fn comparable(base: &SnapshotBase) -> Value {
    let mut value = serde_json::to_value(base).unwrap_or(Value::Null);
    if let Some(object) = value.as_object_mut() {
        object.insert("cursor".to_owned(), Value::Null);
        if let Some(Value::Array(records)) = object.get_mut("records") {
            records.sort_by_key(ToString::to_string);
        }
    }
    value
}

#[cfg(test)]
#[cfg(feature = "sqlite")]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::{Hlc, ManualClock};
    use crate::fold::{RunSummary, SummaryRecord};
    use crate::lease::{Intent, IntentStatus};
    use crate::oplog::OpId;
    use crate::relay::{FsRelay, Relay};

    /// A ledger folder with two committed runs and a checkpoint of it.
    fn compacted(dir: &Path) -> (Arc<dyn Relay>, CheckpointInfo, ManualClock) {
        let clock = ManualClock::new(1_000);
        let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(dir.join("ledger")).unwrap());
        let mut ledger = Ledger::open("laptop", clock.wall_clock(), Arc::clone(&relay)).unwrap();
        for run in ["run-1", "run-2"] {
            ledger
                .record(&Intent::new("milo", run, 2, IntentStatus::Pending))
                .unwrap();
            ledger
                .record(&Intent::new("milo", run, 2, IntentStatus::Committed))
                .unwrap();
        }
        let info = ledger.compact().unwrap();
        (relay, info, clock)
    }

    /// Writes a checkpoint in `info`'s place with valid digests over a changed content: its
    /// runs with `extra` merged in, its loaded part changed by `change`.
    fn forge(
        dir: &Path,
        info: &CheckpointInfo,
        extra: Option<RunSummary>,
        change: impl FnOnce(&mut SnapshotBase),
    ) {
        let real = CheckpointFile::open(&info.path).unwrap();
        let work = dir.join("forging.sqlite");
        Snapshot::install_checkpoint(&work, "forger", &info.path, &real.id()).unwrap();
        let mut store = Snapshot::open(&work, "forger").unwrap();
        let mut base = store.base().unwrap().unwrap();
        change(&mut base);
        let mut save = store.begin_save(|_| true, 1).unwrap().unwrap();
        if let Some(summary) = extra {
            save.put_run("milo", "run-9", &summary).unwrap();
        }
        save.finish(&base).unwrap();
        let forged = dir.join("forged.sqlite");
        let file = store.export(&forged).unwrap();
        let name = checkpoint::file_name(info.records, &checkpoint::id_hex(&file.id()), None);
        drop(file);
        std::fs::remove_file(&info.path).unwrap();
        std::fs::rename(&forged, info.path.with_file_name(name)).unwrap();
    }

    #[test]
    fn k3_a_forged_checkpoint_with_a_commit_added_is_found_by_verify() {
        let dir = tempfile::tempdir().unwrap();
        let (relay, info, clock) = compacted(dir.path());
        let full = Ledger::open("reader", clock.wall_clock(), Arc::clone(&relay)).unwrap();
        assert_eq!(full.verify_checkpoints().unwrap(), vec![]);
        let fake = SummaryRecord {
            op_id: OpId([7; 32]),
            epoch: 2,
            status: IntentStatus::Committed,
            hlc: Hlc {
                wall_ms: 1_000,
                counter: 0,
                device_id: Arc::from("laptop"),
            },
        };
        forge(
            dir.path(),
            &info,
            Some(RunSummary {
                best: fake,
                committed_below_failed: None,
            }),
            |_| {},
        );
        let found = full.verify_checkpoints().unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].detail.contains("does not hold the runs"), "{}", found[0]);
    }

    #[test]
    fn k2_k3_a_forged_checkpoint_with_a_lower_fencing_epoch_is_found_by_verify() {
        let dir = tempfile::tempdir().unwrap();
        let (relay, info, clock) = compacted(dir.path());
        forge(dir.path(), &info, None, |base| {
            for (_, epoch) in &mut base.fencing {
                *epoch = 1;
            }
        });
        let full = Ledger::open("reader", clock.wall_clock(), relay).unwrap();
        let found = full.verify_checkpoints().unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].detail.contains("fencing epochs"), "{}", found[0]);
    }
}
