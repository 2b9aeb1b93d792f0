//! A ledger's use of the shared checkpoints ([`crate::checkpoint`]): writing one, starting from
//! one, and checking them against the records they cover.

mod compact;
mod sealed;
mod start;
mod verify;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{contains, CompactOptions, Ledger, LedgerState};
use crate::checkpoint::{self, CheckpointInfo};
use crate::fold::Forgetting;
use crate::ledger::{CheckpointError, LedgerError};
use crate::oplog::{OpId, OpRecord};
use crate::relay::{Frontier, ProblemKind, RelayProblem};
use crate::snapshot::{CheckpointFile, CompactionMark, Snapshot, SnapshotBase, SnapshotError};

impl Ledger {
    /// The folder of checkpoints the rest of this module works on: the relay's
    /// ([`Relay::checkpoints_dir`](crate::relay::Relay::checkpoints_dir)), or for a protected
    /// ledger this site's copies of the ones it opened (when the relay shares checkpoints and
    /// the ledger was given the folder).
    pub(in crate::edge::ledger) fn checkpoints_dir(&self) -> Option<PathBuf> {
        let shared = self.relay.checkpoints_dir();
        match &self.protected {
            None => shared,
            Some(_) => shared.and(self.checkpoint_copies.clone()),
        }
    }

    /// Where the checkpoints are stored when it is not [`checkpoints_dir`](Self::checkpoints_dir)
    /// itself: the relay's store (a database), or for a protected ledger the sealed ones.
    pub(in crate::edge::ledger) fn checkpoint_store(
        &self,
    ) -> Option<Box<dyn crate::relay::CheckpointStore + '_>> {
        if self.protected.is_none() {
            return self
                .relay
                .checkpoint_store()
                .map(|store| Box::new(Plain(store)) as Box<_>);
        }
        self.sealed_store().map(|store| Box::new(store) as Box<_>)
    }

    /// Notes, once this reading has read a device's revocation, that the checkpoints that
    /// device wrote and this host opened before are not to be used again (rule S6).
    pub(in crate::edge::ledger) fn refuse_revoked_writers(&self) {
        if let Some(store) = self.sealed_store() {
            store.refuse_revoked();
        }
    }

    /// A protected ledger's sealed checkpoints, when it keeps checkpoints.
    fn sealed_store(&self) -> Option<sealed::SealedStore<'_>> {
        let protected = self.protected.as_deref()?;
        let copies = self.checkpoints_dir()?;
        let shared = crate::checkpoint::SharedPlace::of(&*self.relay)?;
        let reading = self.view.protected.as_ref();
        let seal_key = reading.and_then(|logs| logs.protection().newest_key().cloned());
        let known = reading
            .map(crate::protected::ProtectedLogs::changes)
            .unwrap_or_default();
        // Whose checkpoints are never used: the devices revoked, and those only a void admit
        // admitted (found by a cryptography review: a device a thief admitted after its cut had
        // its checkpoint used by a host that opened it before it read the revocation).
        let revoked = reading.map_or_else(Vec::new, |logs| {
            let roster = logs.protection().roster();
            roster.revoked().map(ToString::to_string).collect()
        });
        Some(sealed::SealedStore {
            relay: &*self.relay,
            shared,
            copies,
            protected,
            seal_key,
            unopened: &self.unopened_checkpoints,
            known,
            revoked,
        })
    }

    /// The sealed checkpoints that did not open here (not sealed with a generation this device
    /// holds, written by a device that was no member there, altered), and why: they are never
    /// used, and stop nothing ([`verify_checkpoints`](Self::verify_checkpoints) reports them).
    pub fn unopened_checkpoints(&self) -> Vec<(String, String)> {
        self.unopened_checkpoints
            .lock()
            .map(|unopened| unopened.clone())
            .unwrap_or_default()
    }

    /// Folds into `view` the records from `since` on that `base` covers (up to its heads), read
    /// again a batch at a time (never all held at once).
    fn fold_covered(
        &self,
        view: &mut LedgerState,
        since: &Frontier,
        base: &SnapshotBase,
    ) -> Result<(), LedgerError> {
        let ends: BTreeMap<&str, u64> = base
            .heads
            .iter()
            .map(|head| (head.device_id.as_str(), head.next_seq))
            .collect();
        self.fold_until(view, since, &ends)
    }

    /// Folds into `view` the records from `since` on that end before `ends` (per device; a
    /// device not named has none), read again a batch at a time.
    fn fold_until(
        &self,
        view: &mut LedgerState,
        since: &Frontier,
        ends: &BTreeMap<&str, u64>,
    ) -> Result<(), LedgerError> {
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
        let Some(store) = self.checkpoint_store() else {
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

/// The relay's own store, as the one the ledger uses.
struct Plain<'a>(&'a dyn crate::relay::CheckpointStore);

impl crate::relay::CheckpointStore for Plain<'_> {
    fn names(&self) -> Result<Vec<String>, crate::relay::RelayError> {
        self.0.names()
    }

    fn download(&self, name: &str, to: &mut dyn std::io::Write) -> Result<bool, crate::relay::RelayError> {
        self.0.download(name, to)
    }

    fn upload(&self, name: &str, path: &Path) -> Result<(), crate::relay::RelayError> {
        self.0.upload(name, path)
    }

    fn remove(&self, name: &str) -> Result<(), crate::relay::RelayError> {
        self.0.remove(name)
    }
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
