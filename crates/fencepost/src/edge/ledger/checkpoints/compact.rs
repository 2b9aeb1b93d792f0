//! Writing a checkpoint (`Ledger::compact_with`): the view exported, the line of compactions,
//! the runs a retention forgets, the checkpoints it contains removed, and this device's prune.

use super::*;
use crate::oplog::HeadMark;

impl Ledger {
    /// Writes a shared checkpoint of this ledger (see [`crate::checkpoint`]): the fold of every
    /// record it has read, with every device's head and the relay's cursor there, into the
    /// relay's checkpoints folder, where a new site starts from it instead of reading every
    /// record. Checkpoints that this one contains are removed. Unsent records are stored first.
    /// The ledger must have been opened without a snapshot: it read, and checked, every record.
    ///
    /// # Errors
    /// [`LedgerError::Damaged`] when the ledger is damaged (a checkpoint of an incomplete
    /// ledger would lack commits), [`LedgerError::Checkpoint`] when the relay keeps no
    /// checkpoints, the ledger resumed from a snapshot, has no records, or the file cannot be
    /// written (the [`CheckpointError`] says which), [`LedgerError::Relay`] when unsent records
    /// cannot be stored.
    pub fn compact(&mut self) -> Result<CheckpointInfo, LedgerError> {
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
    pub fn compact_with(&mut self, options: &CompactOptions) -> Result<CheckpointInfo, LedgerError> {
        let dir = match self.checkpoints_dir() {
            Some(dir) => dir,
            None if self.protected.is_some() && self.relay.checkpoints_dir().is_some() => {
                return Err(CheckpointError::Protected.into())
            }
            None => return Err(CheckpointError::NotKept.into()),
        };
        if self.resumed_from_snapshot() {
            // Its records read before are not read again: damage among them would not be seen.
            return Err(CheckpointError::CompactAfterSnapshot.into());
        }
        self.flush()?;
        // A member that has written nothing writes its record 0: a sealed checkpoint is judged
        // by where it ends its writer's log (found by an adversary: a member that had not
        // written compacted, no other host could open its checkpoint, and it had removed the
        // one they could).
        self.write_origin()?;
        let problems: Vec<RelayProblem> = self.damage().into_iter().cloned().collect();
        if !problems.is_empty() || !self.view.rejected.is_empty() {
            return Err(LedgerError::Damaged { problems });
        }
        if self.view.frontier.iter().next().is_none() {
            return Err(CheckpointError::NoRecords.into());
        }
        if self
            .view
            .protected
            .as_ref()
            .is_some_and(|logs| logs.mark().is_none())
        {
            return Err(CheckpointError::Unsettled.into());
        }
        std::fs::create_dir_all(&dir).map_err(|source| CheckpointError::CreateFolder {
            path: dir.clone(),
            source,
        })?;
        checkpoint::remove_leftovers(&dir, &[".writing-", ".folding-"]);
        // Stored elsewhere (a database): every stored one copied here, the line of compactions
        // and the ones this one contains are found among them.
        // One that cannot be copied is left as it is (`verify` reports it): the database holds
        // every record it covers.
        for (name, error) in self.mirror_checkpoints(&dir, |_, _| true) {
            tracing::warn!(checkpoint = name.as_str(), %error, "cannot copy a stored checkpoint; compacting without it");
        }
        if self.relay.cursor(&self.view.frontier).is_none() {
            // Opening a sealed checkpoint read the ledger again to judge it: a pull puts the
            // relay's reading back where this ledger's stands (found by a test: a member whose
            // copies held none of the shared checkpoints could not compact, "try again").
            self.sync()?;
        }
        // Judged on what this reading holds now, as every reader judges it.
        self.refuse_checkpoint_no_member_writes()?;
        // A name no other compaction uses: this device's, this process's, this call's.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let stamp = format!(
            "{}-{}-{}",
            crate::relay::device_file_name(self.log.device_id()).trim_end_matches(".jsonl"),
            std::process::id(),
            CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let written = dir.join(format!(".writing-{stamp}.sqlite"));
        let (compactions, forget) = self.line_and_forgetting(&dir, options);
        let exported = self.export_checkpoint(&dir, &stamp, &written, forget.as_ref(), compactions);
        let (file, forgotten_runs) = match exported {
            Ok(exported) => exported,
            Err(error) => {
                Snapshot::remove(&written);
                return Err(error);
            }
        };
        let id = checkpoint::id_hex(&file.id());
        let heads = file.base().heads.clone();
        let records = file.base().records();
        let runs = file.runs();
        let forgotten = file.base().forgotten.clone();
        let forgets_before_ms = file.base().forgets_before_ms();
        drop(file);
        let name = checkpoint::file_name(records, &id, forgets_before_ms);
        let path = self.place_checkpoint(&dir, &written, &name)?;
        self.remove_contained(&dir, &path, records, &heads, &id, forgets_before_ms);
        tracing::info!(checkpoint = %path.display(), records, runs, "wrote a checkpoint");
        let pruned = if options.prune {
            self.prune_own(&heads, &path)?
        } else {
            0
        };
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

    /// The line of compactions the checkpoint carries (the latest checkpoint's, this one's
    /// added unless the clock is not set, thinned) and the [`Forgetting`] rule a retention makes
    /// of it, if any compaction is old enough to anchor one.
    fn line_and_forgetting(
        &self,
        dir: &Path,
        options: &CompactOptions,
    ) -> (Vec<CompactionMark>, Option<Forgetting>) {
        let now_ms = (self.wall_clock)();
        let mut compactions = self.compactions_before(dir);
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
        (compactions, forget)
    }

    /// Moves the written file into `dir` under `name` (the folder synced), and stores it in the
    /// ledger's database when the relay keeps checkpoints there. Returns its path.
    fn place_checkpoint(&self, dir: &Path, written: &Path, name: &str) -> Result<PathBuf, LedgerError> {
        // Stored first, from the file as written, and only then named in the folder of copies:
        // another process of this host that mirrors the store meanwhile removes every copy the
        // store lacks (found by CI: a `run` beside a `ledger compact --prune` on one data
        // directory removed the new checkpoint before it was stored, and the compaction failed).
        if let Some(store) = self.checkpoint_store() {
            if let Err(error) = store.upload(name, written) {
                Snapshot::remove(written);
                return Err(CheckpointError::Store(error).into());
            }
        }
        let path = dir.join(name);
        let moved = std::fs::rename(written, &path)
            .and_then(|()| std::fs::File::open(dir).and_then(|folder| folder.sync_all()));
        if let Err(error) = moved {
            Snapshot::remove(written);
            return Err(CheckpointError::Move {
                dir: dir.to_owned(),
                source: error,
            }
            .into());
        }
        Ok(path)
    }

    /// Writes this device's record 0 of a protected ledger, signed, when its log has none yet
    /// and it is a member there (a member that has written nothing): what a checkpoint it
    /// writes ends its log at.
    fn write_origin(&mut self) -> Result<(), LedgerError> {
        let device = self.log.device_id();
        let (Some(protected), Some(logs)) = (self.protected.as_ref(), self.view.protected.as_ref()) else {
            return Ok(());
        };
        let key = crate::roster::KeyId(protected.origin_id().0);
        if self.view.frontier.next_seq(device) > 0
            || self.log.head().next_seq() > 0
            || logs.protection().roster().standing(device, key, 0) != crate::roster::Standing::Member
        {
            return Ok(());
        }
        self.append_queued_and(&[])?;
        // Read back, so that the relay's reading stands where the ledger's does.
        self.sync().map(drop)
    }

    /// Refuses to write a sealed checkpoint that others would refuse, before it replaces any
    /// ([`Roster::refuses_checkpoint_of`](crate::roster::Roster::refuses_checkpoint_of), as
    /// readers judge it; found by an adversary: a device revoked after its last record
    /// compacted, replaced the founder's checkpoint and pruned its records into its own, which
    /// no host opens).
    fn refuse_checkpoint_no_member_writes(&self) -> Result<(), LedgerError> {
        let (Some(logs), Some(protected)) = (self.view.protected.as_ref(), self.protected.as_ref()) else {
            return Ok(());
        };
        let device = self.log.device_id();
        let key = crate::roster::KeyId(protected.origin_id().0);
        match logs.protection().roster().refuses_checkpoint_of(
            device,
            key,
            self.view.frontier.next_seq(device),
        ) {
            None => Ok(()),
            Some(_) => Err(CheckpointError::WriterNotMember {
                device: device.to_owned(),
            }
            .into()),
        }
    }

    /// Removes the checkpoints in `dir` that the one at `path` (of `records` records, `heads`,
    /// `id`) contains; what cannot be removed is logged and left.
    fn remove_contained(
        &self,
        dir: &Path,
        path: &Path,
        records: u64,
        heads: &[HeadMark],
        id: &str,
        forgets_before_ms: Option<u64>,
    ) {
        // The checkpoints this one contains are of no more use: those of this ledger's records
        // (another ledger's is left for `verify` to report), and of two of the same records
        // (two compactions at once), the one with the greater id stays (found by an adversarial
        // test: two compactions at once removed each other's, and the line was lost): the one
        // that comes first in the order sites choose by (`checkpoint::list`).
        let ours = crate::hex::decode_lower_hex::<32>(id).map(|id| (forgets_before_ms, id));
        let stored_elsewhere = self.checkpoint_store().is_some();
        for (older_name, older) in checkpoint::list(dir).unwrap_or_default() {
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
                    contains(heads, &file.base().heads) && self.view.holds(&file.base().compaction_heads())
                });
            if contained {
                if let Some(store) = self.checkpoint_store() {
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
        // A revoked device's are never opened, so never among those above.
        if let Some(store) = self.sealed_store() {
            store.remove_revoked_contained(|theirs| {
                let within = theirs.iter().all(|(device, count, _)| {
                    heads
                        .iter()
                        .any(|ours| ours.device_id == *device && ours.next_seq >= *count)
                });
                within && self.view.holds(theirs)
            });
        }
    }

    /// Prunes this device's records that the checkpoint at `path` covers (its `heads`): it is in
    /// place (renamed, the folder synced). Returns how many went.
    fn prune_own(&self, heads: &[HeadMark], path: &Path) -> Result<u64, LedgerError> {
        let own = heads
            .iter()
            .find(|head| head.device_id == self.log.device_id())
            .and_then(|head| Some((head.next_seq.checked_sub(1)?, head.last?.0)));
        if let Some((through_seq, through_id)) = own {
            return Ok(self
                .relay
                .prune(self.log.device_id(), through_seq, through_id)
                .map_err(|source| CheckpointError::Prune {
                    path: path.to_owned(),
                    source,
                })?);
        }
        Ok(0)
    }

    /// Writes the checkpoint's file at `written`: the view, folded into a snapshot of its own
    /// (`.folding-…` in `dir`), copied; without the runs that `forget` forgets (and how many
    /// those were).
    pub(in crate::edge::ledger) fn export_checkpoint(
        &mut self,
        dir: &Path,
        stamp: &str,
        written: &Path,
        forget: Option<&Forgetting>,
        compactions: Vec<CompactionMark>,
    ) -> Result<(CheckpointFile, u64), LedgerError> {
        let cursor = self
            .relay
            .cursor(&self.view.frontier)
            .ok_or(LedgerError::from(CheckpointError::NoCursor))?;
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
            .map_err(|error| CheckpointError::Export(error).into())
    }

    /// The compactions of the line of the best checkpoint in `dir` (see
    /// [`compact_with`](Self::compact_with)), when it is one to take them from: its content
    /// matches its name, and its line is consistent and of this ledger's records (times and
    /// heads never go down, every compaction names records this ledger has, the last one is
    /// the checkpoint's own heads). Found by an adversarial test: another ledger's checkpoint
    /// copied in, one whose name `verify` reports, or one of a device whose records were
    /// replaced since, lent its compactions. Else none (nothing is forgotten this time).
    pub(in crate::edge::ledger) fn compactions_before(&self, dir: &Path) -> Vec<CompactionMark> {
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
}

/// Keeps a checkpoint line's compactions bounded: every one of the last two days (by
/// `written_at_ms`, UTC), the last of each day before, and at most the newest 4 096.
pub(in crate::edge::ledger) fn thin_compactions(compactions: &mut Vec<CompactionMark>) {
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
