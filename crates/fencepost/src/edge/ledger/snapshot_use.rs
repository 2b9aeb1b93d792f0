//! This site's snapshot ([`LedgerOptions::snapshot`](super::LedgerOptions::snapshot)): the
//! [`Ledger`]'s resuming from it, saving to it and giving it up, and the open store with its lock.

use super::*;

/// A ledger's snapshot ([`LedgerOptions::snapshot`]) and what this process did with it.
#[derive(Debug)]
pub(super) struct SnapshotUse {
    pub(super) store: Snapshot,
    /// The lock that keeps the file in place while it is open here ([`SnapshotLock`]).
    pub(super) lock: SnapshotLock,
    /// Whether the stored runs are part of the state (the ledger resumed from it): a run not in
    /// the view is looked up there. After a read from the start, the view has every run.
    pub(super) queried: bool,
    /// The runs looked up in the store (found or not) and merged into the view.
    pub(super) loaded: BTreeSet<(String, String)>,
    /// The runs whose entries changed since the last save; `None`: every run.
    pub(super) dirty: Option<BTreeSet<(String, String)>>,
    /// The frontier of the last save (or of the resumed snapshot).
    pub(super) saved: Option<Frontier>,
}

impl Ledger {
    /// Restores the view from the snapshot, if it has a saved state and the relay resumes at its
    /// cursor. A snapshot that cannot be read is started over (a new file: a process still
    /// reading the old one keeps it). One that the ledger no longer matches (a device file that
    /// shrank or was replaced, records deleted) is kept as it is and not used: what it had read
    /// is checked like the seen file's memory (damage until the ledger has it again), and it is
    /// not overwritten while the ledger is damaged.
    pub(super) fn resume_snapshot(&mut self) -> Result<(), RelayError> {
        let Some(snapshot) = &self.snapshot else {
            return Ok(());
        };
        let path = snapshot.store.path().to_path_buf();
        let mut saved = snapshot.store.base();
        let mut from_checkpoint = None;
        let mut empty = matches!(saved, Ok(None));
        // The fencing epochs of a snapshot given up for a checkpoint that forgets more (K2: kept
        // whatever the checkpoint says).
        let mut given_up = Vec::new();
        // A protected ledger's are the sealed ones it opens (none without a folder for them).
        let checkpoints = self.checkpoints_dir().is_some();
        if let Ok(Some(base)) = saved.as_ref().map(|base| base.as_ref().filter(|_| checkpoints)) {
            if self.move_to_forgetting_checkpoint(base) {
                empty = true;
                given_up.clone_from(&base.fencing);
            } else if self.move_past_pruned(base) {
                // What it read is checked like the seen file's marks: the checkpoint and the
                // files after it must hold it all.
                empty = true;
                given_up.clone_from(&base.fencing);
                self.snapshot_marks.clone_from(&base.heads);
            }
        }
        if empty && checkpoints {
            // Nothing saved yet (a new site, or a snapshot started over): from the shared
            // checkpoint, if there is one.
            from_checkpoint = self.import_checkpoint();
        }
        if self.share_snapshot() || empty {
            let Some(snapshot) = &self.snapshot else {
                return Ok(());
            };
            saved = snapshot.store.base();
        }
        let base = match saved {
            Ok(None) => return Ok(()), // nothing saved yet
            Ok(Some(base)) => base,
            Err(error) if error.is_busy() => {
                tracing::warn!(snapshot = %path.display(), %error, "another process holds the snapshot; reading the whole ledger this time");
                self.snapshot = None;
                return Ok(());
            }
            Err(error) => {
                self.start_snapshot_over(path, &error.to_string());
                return Ok(());
            }
        };
        let view = LedgerState::restored(&base).and_then(|view| self.with_protected(view, &base));
        let view = match view {
            Ok(view) => view,
            Err(reason) => {
                self.start_snapshot_over(path, &reason);
                return Ok(());
            }
        };
        if let Err(reason) = self.relay.resume(&base.cursor) {
            // The relay could not be read (a database away): nothing is known of the snapshot,
            // which stays as it is; the open fails with the relay's error.
            let reason = match reason {
                crate::relay::ResumeError::Relay(error) => return Err(error),
                other => other.to_string(),
            };
            if let Some((_, checkpoint)) = from_checkpoint {
                // The files here do not reach the checkpoint (not synced up to it yet, or they
                // shrank) or hold other records: what it covers is checked like the seen file's
                // memory, so nothing runs on a ledger that lacks records the checkpoint saw.
                tracing::warn!(checkpoint = %checkpoint.display(), %reason, "the ledger's files here do not match the shared checkpoint; reading the whole ledger");
                // Its fencing epochs still hold (rule K2): the epochs it saw were granted, even
                // if the records that show them are not here (and their damage is accepted).
                for (agent, epoch) in &base.fencing {
                    self.view.state.raise_fencing_epoch(agent, *epoch);
                }
                // And so do its commits (issue 37, item 4; found by an adversarial test: a host
                // that accepted this damage ran again a run the checkpoint holds committed).
                self.keep_commits_of_snapshot();
                self.checkpoint_marks = Some((checkpoint, base.heads));
                self.start_snapshot_over(
                    path,
                    "it was copied from a checkpoint that this ledger does not match",
                );
                return Ok(());
            }
            tracing::warn!(snapshot = %path.display(), %reason, "the ledger no longer holds what this site's snapshot read; reading the whole ledger");
            self.snapshot_marks = base.heads;
            self.snapshot = None;
            if self.relay.is_database() {
                self.went_back_snapshot = Some(path);
            }
            return Ok(());
        }
        let Some(snapshot) = &mut self.snapshot else {
            return Ok(());
        };
        snapshot.saved = Some(view.frontier.clone());
        snapshot.queried = true;
        snapshot.dirty = Some(BTreeSet::new());
        self.view = view;
        for (agent, epoch) in &given_up {
            self.view.state.raise_fencing_epoch(agent, *epoch);
        }
        self.started_from = from_checkpoint.map(|(id, _)| id);
        tracing::debug!(snapshot = %path.display(), "resumed from the snapshot");
        Ok(())
    }

    /// `view`, restored from `base` (a snapshot's or a checkpoint's), with this ledger's
    /// protected reading restored from it too.
    ///
    /// # Errors
    /// A line saying why `base` is not of this ledger's kind, or its reading does not read.
    pub(super) fn with_protected(
        &self,
        mut view: LedgerState,
        base: &SnapshotBase,
    ) -> Result<LedgerState, String> {
        view.protected = match (self.protected.as_deref(), &base.protected) {
            (None, None) => None,
            (Some(protected), Some(mark)) => Some(protected.restore_logs(mark, &view.heads)?),
            (None, Some(_)) => return Err("it is a protected ledger's, read here as unprotected".to_owned()),
            (Some(_), None) => return Err("it is an unprotected ledger's, read here as protected".to_owned()),
        };
        Ok(view)
    }

    /// Makes the snapshot's lock shared again if this process holds it exclusively (it made the
    /// snapshot, or tried to), and opens the snapshot again (it may have been replaced while the
    /// lock changed hands); whether it did.
    pub(super) fn share_snapshot(&mut self) -> bool {
        if !self
            .snapshot
            .as_ref()
            .is_some_and(|snapshot| snapshot.lock.is_exclusive())
        {
            return false;
        }
        let Some(snapshot) = self.snapshot.take() else {
            return false;
        };
        let (path, lock) = snapshot.close();
        let device = self.log.device_id().to_owned();
        self.snapshot = lock
            .downgrade(&path)
            .and_then(|lock| SnapshotUse::open(path, &device, lock));
        true
    }

    /// Closes the snapshot and takes its lock exclusively, when no other process has it open:
    /// its path and the lock, for a caller that replaces or removes the file. Else the snapshot
    /// stays open here, shared, and `None`.
    pub(super) fn snapshot_exclusively(&mut self) -> Option<(std::path::PathBuf, SnapshotLock)> {
        let (path, lock) = self.snapshot.take()?.close();
        match lock.upgrade(&path) {
            Ok(lock) => Some((path, lock)),
            Err(shared) => {
                let device = self.log.device_id().to_owned();
                self.snapshot = shared.and_then(|lock| SnapshotUse::open(path, &device, lock));
                None
            }
        }
    }

    /// Removes a snapshot that cannot be used and starts a new one in its place, when no other
    /// process has it open (else this process does without it: removing a SQLite file from
    /// under its readers is not safe for them); this open reads the whole ledger.
    pub(super) fn start_snapshot_over(&mut self, path: std::path::PathBuf, reason: &str) {
        let Some(snapshot) = self.snapshot.take() else {
            return;
        };
        let (_, lock) = snapshot.close();
        let lock = match lock.upgrade(&path) {
            Ok(lock) => lock,
            Err(_) => {
                tracing::warn!(snapshot = %path.display(), %reason, "the snapshot cannot be used, and other processes have it open; reading the whole ledger without it");
                return;
            }
        };
        tracing::warn!(snapshot = %path.display(), %reason, "the snapshot cannot be used; reading the whole ledger and starting it over");
        let device = self.log.device_id().to_owned();
        Snapshot::remove(&path);
        self.snapshot = lock
            .downgrade(&path)
            .and_then(|lock| SnapshotUse::open(path, &device, lock));
    }

    /// Saves what the view holds to the snapshot, when it is at a clean point: no damage, and
    /// the relay's cursor exactly at the view's frontier. A failure only costs the next process
    /// a longer read.
    pub(super) fn save_snapshot(&mut self) {
        let Some(snapshot) = &mut self.snapshot else {
            return;
        };
        let unchanged = snapshot.saved.as_ref() == Some(&self.view.frontier)
            && snapshot.dirty.as_ref().is_some_and(BTreeSet::is_empty);
        if unchanged || self.problems.iter().any(RelayProblem::is_damage) || !self.view.rejected.is_empty() {
            return;
        }
        let Some(cursor) = self.relay.cursor(&self.view.frontier) else {
            return;
        };
        let base = self.view.base_mark(cursor);
        if self.protected.is_some() && base.protected.is_none() {
            // A protected reading with records not settled yet (held for a head, missing) is
            // not saved: a resume would skip them.
            return;
        }
        let view = &self.view;
        let runs = match &snapshot.dirty {
            None => view.state.run_count(),
            Some(dirty) => dirty.len(),
        };
        // A save of the runs changed since the last one continues the stored state only if that
        // holds everything this view resumed from (found by an adversarial test: a snapshot
        // replaced under a process, then saved with only its last runs and the heads of all,
        // answered "not committed" for every other run).
        let continues = |stored: &[HeadMark]| match (&snapshot.dirty, &snapshot.saved) {
            (None, _) | (Some(_), None) => true,
            (Some(_), Some(saved)) => saved.iter().all(|(device, next_seq)| {
                stored
                    .iter()
                    .any(|mark| mark.device_id == device && mark.next_seq >= next_seq)
            }),
        };
        let saved = (|| -> Result<bool, SnapshotError> {
            let Some(mut save) = snapshot
                .store
                .begin_save(|stored| contains(&base.heads, stored) && continues(stored), runs)?
            else {
                return Ok(false);
            };
            match &snapshot.dirty {
                None => view
                    .state
                    .for_each_run_summary(|agent, run, summary| save.put_run(agent, run, &summary))?,
                Some(dirty) => {
                    for (agent, run) in dirty {
                        if let Some(summary) = view.state.run_summary(agent, run) {
                            save.put_run(agent, run, &summary)?;
                        }
                    }
                }
            }
            save.finish(&base)?;
            Ok(true)
        })();
        match saved {
            Ok(true) => {
                if snapshot.dirty.is_none() {
                    // A whole ledger was written: out of the write-ahead log, into the file.
                    if let Err(error) = snapshot.store.checkpoint() {
                        tracing::debug!(%error, "cannot checkpoint the snapshot's log now");
                    }
                }
                snapshot.dirty = Some(BTreeSet::new());
                snapshot.saved = Some(self.view.frontier.clone());
            }
            Ok(false) => {
                tracing::debug!("another process saved a snapshot this one does not contain; not saving")
            }
            Err(error) => {
                tracing::warn!(snapshot = %snapshot.store.path().display(), %error, "cannot save the snapshot (the next command reads more of the ledger)");
            }
        }
    }

    /// Merges the stored entry of a run into the view, once, when the view resumed from a
    /// snapshot. A snapshot that cannot be read is damage (see [`crate::snapshot`]).
    pub(super) fn load_run(&mut self, agent_id: &str, run_id: &str) {
        let Some(snapshot) = self.snapshot.as_mut().filter(|snapshot| snapshot.queried) else {
            return;
        };
        let key = (agent_id.to_owned(), run_id.to_owned());
        if snapshot.loaded.contains(&key) {
            return;
        }
        match snapshot.store.run(agent_id, run_id) {
            Ok(summary) => {
                if let Some(summary) = summary {
                    self.view.state.merge_summary(agent_id, run_id, &summary);
                }
                snapshot.loaded.insert(key);
            }
            Err(error) => self.snapshot_failed(&error),
        }
    }

    /// A stored run could not be read: the snapshot is removed, and this ledger, which may lack
    /// a commit, reports damage until the process ends.
    pub(super) fn snapshot_failed(&mut self, error: &SnapshotError) {
        let Some(snapshot) = self.snapshot.take() else {
            return;
        };
        let (path, lock) = snapshot.close();
        let detail = if error.is_busy() {
            // Held by another program for longer than the busy wait: not damaged, but no answer.
            format!(
                "this site's snapshot of the ledger, {}, is held by another program ({error}); try again",
                path.display()
            )
        } else if lock.upgrade(&path).is_ok() {
            Snapshot::remove(&path);
            tracing::warn!(snapshot = %path.display(), %error, "the snapshot cannot be read; removed");
            format!(
                "this site's snapshot of the ledger, {}, cannot be read ({error}); it was removed, and the next command reads the whole ledger again",
                path.display()
            )
        } else {
            tracing::warn!(snapshot = %path.display(), %error, "the snapshot cannot be read; other processes have it open");
            format!(
                "this site's snapshot of the ledger, {}, cannot be read ({error}); other processes have it open, and the first command that finds it unused removes it and reads the whole ledger again",
                path.display()
            )
        };
        self.snapshot_damage = Some(RelayProblem {
            kind: crate::relay::ProblemKind::Damage,
            device_id: None,
            detail,
            file: Some(path),
            line_number: None,
        });
        self.recompute_problems();
    }
}

impl SnapshotUse {
    /// Opens the snapshot at `path`, holding `lock`; one that cannot be used (another format or
    /// device, not a database) is removed and started over when no other process has it open.
    /// `None` when no snapshot can be kept there, or used now.
    pub(super) fn open(path: std::path::PathBuf, device_id: &str, mut lock: SnapshotLock) -> Option<Self> {
        let store = match Snapshot::open(&path, device_id) {
            Ok(store) => store,
            Err(error) if error.is_busy() => {
                tracing::warn!(snapshot = %path.display(), %error, "another process holds the snapshot; reading the whole ledger this time");
                return None;
            }
            Err(error) => {
                let shared = !lock.is_exclusive();
                lock = match lock.upgrade(&path) {
                    Ok(lock) => lock,
                    Err(_) => {
                        tracing::warn!(snapshot = %path.display(), %error, "the snapshot cannot be used, and other processes have it open; reading the whole ledger without it");
                        return None;
                    }
                };
                tracing::warn!(snapshot = %path.display(), %error, "starting the snapshot over");
                Snapshot::remove(&path);
                if shared {
                    lock = lock.downgrade(&path)?;
                }
                match Snapshot::open(&path, device_id) {
                    Ok(store) => store,
                    Err(error) => {
                        tracing::warn!(snapshot = %path.display(), %error, "cannot keep a snapshot; every command reads the whole ledger");
                        return None;
                    }
                }
            }
        };
        Some(Self {
            store,
            lock,
            queried: false,
            loaded: BTreeSet::new(),
            dirty: None,
            saved: None,
        })
    }

    /// Closes the file; its path and the lock (still held).
    pub(super) fn close(self) -> (std::path::PathBuf, SnapshotLock) {
        (self.store.path().to_path_buf(), self.lock)
    }
}
