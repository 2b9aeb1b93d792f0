//! The snapshot as a shared checkpoint: `Snapshot::export` writes one, `Snapshot::install_checkpoint` makes one this site's snapshot, and `CheckpointFile` reads one (see [`crate::checkpoint`]).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};

use super::{bucket_sum, decode_bucket, read_stored, Layout, Snapshot, Stored, BUSY_WAIT, FORMAT};
use crate::fold::RunSummary;
use crate::snapshot::{SnapshotBase, SnapshotError};

/// What a checkpoint file's meta names as its device and file: no site's.
const CHECKPOINT_OWNER: &str = "checkpoint";

impl Snapshot {
    /// Writes a copy of the saved state to `dest` (which must not exist) as a checkpoint file
    /// (see [`crate::checkpoint`]): one consistent read of the snapshot, with no write-ahead log,
    /// and its meta naming no site. Returns the copy, opened and its saved state checked.
    pub(crate) fn export(&self, dest: &Path) -> Result<CheckpointFile, SnapshotError> {
        let target = dest
            .to_str()
            .ok_or_else(|| SnapshotError::Other(format!("{} is not a UTF-8 path", dest.display())))?;
        self.connection.execute("VACUUM INTO ?1", [target])?;
        {
            let copy = Connection::open(dest)?;
            copy.pragma_update(None, "journal_mode", "DELETE")?;
            copy.execute(
                "UPDATE meta SET value = ?1 WHERE key IN ('device', 'file')",
                [CHECKPOINT_OWNER],
            )?;
            let sync = std::fs::File::open(dest).and_then(|file| file.sync_all());
            sync.map_err(|error| SnapshotError::Other(format!("cannot sync {}: {error}", dest.display())))?;
        }
        CheckpointFile::open(dest)
    }
}

impl Snapshot {
    /// Makes the snapshot at `path` (of `device_id`) a copy of the checkpoint at `checkpoint`,
    /// whose id must be `id`: the file is copied beside `path`, the copy is checked whole (its
    /// saved state against `id`, every page of checksums and every bucket of runs against it),
    /// made this device's snapshot, and moved over `path` (whose old files are removed first; a
    /// process still reading them keeps them). On an error, `path` is left as it was.
    pub(crate) fn install_checkpoint(
        path: &Path,
        device_id: &str,
        checkpoint: &Path,
        id: &[u8; 32],
    ) -> Result<(), SnapshotError> {
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
            let mut prefix = name.to_os_string();
            prefix.push(".copying-");
            crate::checkpoint::remove_leftovers(dir, &[&prefix.to_string_lossy()]);
        }
        let mut copy = path.as_os_str().to_owned();
        copy.push(format!(".copying-{}", std::process::id()));
        let copy = PathBuf::from(copy);
        let installed = (|| {
            std::fs::copy(checkpoint, &copy).map_err(|error| {
                SnapshotError::Other(format!("cannot copy {}: {error}", checkpoint.display()))
            })?;
            let mut copied = CheckpointFile::open(&copy)?;
            if copied.id() != *id {
                return Err(SnapshotError::Damaged(
                    "its content does not match the id in its name".to_owned(),
                ));
            }
            copied.for_each_bucket(|_, _| Ok(()))?;
            drop(copied);
            let mut connection = Connection::open(&copy)?;
            // Not in place yet: nothing to sync (a copy lost to a power cut is made again).
            connection.pragma_update(None, "synchronous", "OFF")?;
            connection.pragma_update(None, "journal_mode", "WAL")?;
            let name = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            let meta = connection.transaction()?;
            meta.execute("UPDATE meta SET value = ?1 WHERE key = 'device'", [device_id])?;
            meta.execute("UPDATE meta SET value = ?1 WHERE key = 'file'", [name])?;
            meta.commit()?;
            drop(connection);
            Snapshot::remove(path);
            std::fs::rename(&copy, path).map_err(|error| {
                SnapshotError::Other(format!("cannot move the copy to {}: {error}", path.display()))
            })
        })();
        if installed.is_err() {
            Snapshot::remove(&copy);
        }
        installed
    }
}

/// A checkpoint file, opened read-only, its saved state checked against its digest (the
/// checkpoint's id).
pub(crate) struct CheckpointFile {
    connection: Connection,
    stored: Stored,
    layout: Layout,
    /// The `base` row as stored: the saved state's JSON and its digest.
    raw_base: Vec<u8>,
}

impl std::fmt::Debug for CheckpointFile {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("CheckpointFile")
            .field("runs", &self.stored.runs)
            .finish_non_exhaustive()
    }
}

impl CheckpointFile {
    /// Opens the checkpoint at `path` and checks its saved state.
    pub(crate) fn open(path: &Path) -> Result<Self, SnapshotError> {
        // A FIFO would block the open for ever; a folder or a device is no checkpoint either.
        match std::fs::metadata(path) {
            Ok(metadata) if metadata.is_file() => {}
            Ok(_) => {
                return Err(SnapshotError::Damaged(
                    "it is not a regular file (a folder, a FIFO or a device)".to_owned(),
                ))
            }
            Err(error) => return Err(SnapshotError::Other(format!("it cannot be read: {error}"))),
        }
        let connection = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        connection.busy_timeout(BUSY_WAIT)?;
        for (key, expected) in [("format", FORMAT), ("device", CHECKPOINT_OWNER)] {
            let found: Option<String> = connection
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| row.get(0))
                .optional()?;
            if found.as_deref() != Some(expected) {
                return Err(SnapshotError::Damaged(format!(
                    "its {key} is {}, not {expected:?}",
                    found.map_or_else(|| "missing".to_owned(), |found| format!("{found:?}"))
                )));
            }
        }
        let raw_base: Vec<u8> = connection
            .query_row("SELECT value FROM base WHERE id = 1", [], |row| row.get(0))
            .optional()?
            .ok_or_else(|| SnapshotError::Damaged("it has no saved state".to_owned()))?;
        let Some((stored, layout)) = read_stored(&connection)? else {
            return Err(SnapshotError::Damaged("it has no saved state".to_owned()));
        };
        Ok(Self {
            connection,
            stored,
            layout,
            raw_base,
        })
    }

    /// The checkpoint's id: the digest of its saved state (which holds the digests of its pages
    /// of checksums, which hold its buckets' checksums).
    pub(crate) fn id(&self) -> [u8; 32] {
        let mut id = [0u8; 32];
        let start = self.raw_base.len().saturating_sub(32);
        id.copy_from_slice(&self.raw_base[start..]);
        id
    }

    /// Its loaded part.
    pub(crate) fn base(&self) -> &SnapshotBase {
        &self.stored.base
    }

    /// How many runs it holds.
    pub(crate) fn runs(&self) -> u64 {
        self.stored.runs
    }

    /// Checks the file's pages as SQLite lays them out (`PRAGMA quick_check`): damage in pages
    /// that no read of the content touches (free space, a free page's list) makes a copy of the
    /// file fail when a site makes it its own, so `verify` reports it too.
    pub(crate) fn check_pages(&self) -> Result<(), SnapshotError> {
        let mut statement = self.connection.prepare("PRAGMA quick_check")?;
        let found: Vec<String> = statement
            .query_map([], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        match found.as_slice() {
            [ok] if ok == "ok" => Ok(()),
            _ => Err(SnapshotError::Damaged(format!(
                "SQLite finds it damaged: {}",
                found.into_iter().take(3).collect::<Vec<_>>().join("; ")
            ))),
        }
    }

    /// Calls `each` with every non-empty bucket, in order, each checked against its page of
    /// checksums; an absent bucket must be an empty one.
    fn for_each_bucket(
        &mut self,
        mut each: impl FnMut(u32, &[u8]) -> Result<(), SnapshotError>,
    ) -> Result<(), SnapshotError> {
        let buckets = self.layout.buckets;
        let page_len = Layout::page_len(buckets);
        let mut next = 0u32;
        let mut statement = self
            .connection
            .prepare("SELECT id, value FROM buckets ORDER BY id")?;
        let mut rows = statement.query([])?;
        let mismatch = |bucket: u32| {
            SnapshotError::Damaged(format!(
                "its bucket {bucket} of runs does not match its saved state (a run lost or changed)"
            ))
        };
        let check = |layout: &mut Layout, bucket: u32, body: &[u8]| -> Result<(), SnapshotError> {
            let expected = layout
                .page(&self.connection, bucket / page_len)?
                .get((bucket % page_len) as usize)
                .copied();
            if expected == Some(bucket_sum(bucket, body)) {
                Ok(())
            } else {
                Err(mismatch(bucket))
            }
        };
        while let Some(row) = rows.next()? {
            let bucket: i64 = row.get(0)?;
            let body: Vec<u8> = row.get(1)?;
            let bucket = u32::try_from(bucket)
                .ok()
                .filter(|bucket| *bucket < buckets && *bucket >= next)
                .ok_or_else(|| SnapshotError::Damaged(format!("it has a bucket {bucket} out of place")))?;
            for empty in next..bucket {
                check(&mut self.layout, empty, &[])?;
            }
            check(&mut self.layout, bucket, &body)?;
            each(bucket, &body)?;
            next = bucket + 1;
        }
        for empty in next..buckets {
            check(&mut self.layout, empty, &[])?;
        }
        Ok(())
    }

    /// Calls `each` with every run it holds, every bucket checked (see
    /// [`for_each_bucket`](Self::for_each_bucket)).
    pub(crate) fn for_each_run(
        &mut self,
        mut each: impl FnMut(&str, &str, &RunSummary),
    ) -> Result<(), SnapshotError> {
        self.for_each_bucket(|bucket, body| {
            for entry in decode_bucket(bucket, body)? {
                each(&entry.agent, &entry.run, &entry.summary);
            }
            Ok(())
        })
    }
}
