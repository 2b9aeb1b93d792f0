//! The snapshot's store: a SQLite file (see the [module docs](super)).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use sha2::{Digest, Sha256};

use super::{SnapshotBase, SnapshotError};
use crate::clock::Hlc;
use crate::fold::{RunSummary, SummaryRecord, SyncState};
use crate::intent::IntentStatus;
use crate::oplog::{HeadMark, OpId};

/// The snapshot format this version writes and reads; any other is rebuilt.
const FORMAT: &str = "fencepost-snapshot/1";
/// How long a save waits for another process's save.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The prefix of a run row's checksum.
const ROW_DOMAIN: &[u8] = b"fencepost/snapshot/run/v1\0";
/// The prefix of the loaded part's digest.
const BASE_DOMAIN: &[u8] = b"fencepost/snapshot/base/v1\0";
/// The bytes of a row's checksum.
const CHECKSUM_BYTES: usize = 16;

/// An open snapshot file.
pub(crate) struct Snapshot {
    connection: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Snapshot")
            .field("path", &self.path)
            .finish()
    }
}

impl Snapshot {
    /// Opens (or creates) the snapshot at `path` for `device_id`.
    pub(crate) fn open(path: &Path, device_id: &str) -> Result<Self, SnapshotError> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(BUSY_WAIT)?;
        // A write-ahead log keeps every save atomic, also when the machine loses power; a save
        // lost that way only costs the next process a longer read.
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", "NORMAL")?;
        connection.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS base (id INTEGER PRIMARY KEY CHECK (id = 1), value BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS runs (agent TEXT NOT NULL, run TEXT NOT NULL, value BLOB NOT NULL,
                                              PRIMARY KEY (agent, run)) WITHOUT ROWID;",
        )?;
        let snapshot = Self {
            connection,
            path: path.to_path_buf(),
        };
        for (key, expected) in [("format", FORMAT), ("device", device_id)] {
            snapshot.connection.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?1, ?2)",
                params![key, expected],
            )?;
            let found: String =
                snapshot
                    .connection
                    .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| row.get(0))?;
            if found != expected {
                return Err(SnapshotError::Other(format!(
                    "its {key} is {found:?}, not {expected:?}"
                )));
            }
        }
        Ok(snapshot)
    }

    /// Removes the snapshot file at `path` (and SQLite's journal beside it), if there is one.
    pub(crate) fn remove(path: &Path) {
        for suffix in ["", "-journal", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            if let Err(error) = std::fs::remove_file(&file) {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(file = %PathBuf::from(file).display(), %error, "cannot remove the snapshot");
                }
            }
        }
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The loaded part, if a state was saved.
    pub(crate) fn base(&self) -> Result<Option<SnapshotBase>, SnapshotError> {
        read_base(&self.connection)
    }

    /// The stored summary of a run.
    pub(crate) fn run(&self, agent_id: &str, run_id: &str) -> Result<Option<RunSummary>, SnapshotError> {
        let value: Option<Vec<u8>> = self
            .connection
            .query_row(
                "SELECT value FROM runs WHERE agent = ?1 AND run = ?2",
                params![agent_id, run_id],
                |row| row.get(0),
            )
            .optional()?;
        value
            .map(|value| decode_row(agent_id, run_id, &value))
            .transpose()
    }

    /// Starts a save, under the snapshot's write lock, when `contains` accepts the saved state's
    /// heads (the new state must contain it); `None` when it does not.
    pub(crate) fn begin_save(
        &mut self,
        contains: impl FnOnce(&[HeadMark]) -> bool,
    ) -> Result<Option<Save<'_>>, SnapshotError> {
        let transaction = self
            .connection
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let stored = read_base(&transaction)?;
        let heads = stored.map(|base| base.heads).unwrap_or_default();
        if !contains(&heads) {
            return Ok(None);
        }
        Ok(Some(Save { transaction }))
    }
}

/// A save in progress: one transaction.
pub(crate) struct Save<'a> {
    transaction: rusqlite::Transaction<'a>,
}

impl Save<'_> {
    /// Stores a run: its stored summary (if any) merged with `summary`, by the fold's own rule.
    pub(crate) fn put_run(
        &mut self,
        agent_id: &str,
        run_id: &str,
        summary: &RunSummary,
    ) -> Result<(), SnapshotError> {
        let stored: Option<Vec<u8>> = self
            .transaction
            .prepare_cached("SELECT value FROM runs WHERE agent = ?1 AND run = ?2")?
            .query_row(params![agent_id, run_id], |row| row.get(0))
            .optional()?;
        let merged = match stored {
            None => summary.clone(),
            Some(value) => {
                let stored = decode_row(agent_id, run_id, &value)?;
                let mut state = SyncState::new();
                state.merge_summary(agent_id, run_id, &stored);
                state.merge_summary(agent_id, run_id, summary);
                state
                    .run_summary(agent_id, run_id)
                    .ok_or_else(|| SnapshotError::Other("a merged run vanished".to_owned()))?
            }
        };
        self.transaction
            .prepare_cached("INSERT OR REPLACE INTO runs (agent, run, value) VALUES (?1, ?2, ?3)")?
            .execute(params![agent_id, run_id, encode_row(agent_id, run_id, &merged)])?;
        Ok(())
    }

    /// Stores the loaded part and commits.
    pub(crate) fn finish(self, base: &SnapshotBase) -> Result<(), SnapshotError> {
        let mut value = serde_json::to_vec(base).map_err(|error| SnapshotError::Other(error.to_string()))?;
        let digest = base_digest(&value);
        value.extend_from_slice(&digest);
        self.transaction
            .execute("INSERT OR REPLACE INTO base (id, value) VALUES (1, ?1)", [value])?;
        self.transaction.commit()?;
        Ok(())
    }
}

fn read_base(connection: &Connection) -> Result<Option<SnapshotBase>, SnapshotError> {
    let value: Option<Vec<u8>> = connection
        .query_row("SELECT value FROM base WHERE id = 1", [], |row| row.get(0))
        .optional()?;
    let Some(value) = value else {
        return Ok(None);
    };
    let damaged = || SnapshotError::Damaged("its saved state does not match its digest".to_owned());
    let split = value.len().checked_sub(32).ok_or_else(damaged)?;
    let (json, digest) = value.split_at(split);
    if base_digest(json).as_slice() != digest {
        return Err(damaged());
    }
    serde_json::from_slice(json)
        .map(Some)
        .map_err(|error| SnapshotError::Damaged(format!("its saved state cannot be read: {error}")))
}

fn base_digest(json: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(BASE_DOMAIN);
    hasher.update(json);
    hasher.finalize().into()
}

fn row_checksum(agent_id: &str, run_id: &str, body: &[u8]) -> [u8; CHECKSUM_BYTES] {
    let mut hasher = Sha256::new();
    hasher.update(ROW_DOMAIN);
    hasher.update((agent_id.len() as u64).to_be_bytes());
    hasher.update(agent_id.as_bytes());
    hasher.update((run_id.len() as u64).to_be_bytes());
    hasher.update(run_id.as_bytes());
    hasher.update(body);
    let digest: [u8; 32] = hasher.finalize().into();
    let mut checksum = [0u8; CHECKSUM_BYTES];
    checksum.copy_from_slice(&digest[..CHECKSUM_BYTES]);
    checksum
}

fn status_code(status: IntentStatus) -> u8 {
    match status {
        IntentStatus::Pending => 0,
        IntentStatus::Committed => 1,
        IntentStatus::Failed => 2,
    }
}

fn push_record(record: &SummaryRecord, out: &mut Vec<u8>) {
    out.extend_from_slice(&record.op_id.0);
    out.extend_from_slice(&record.epoch.to_be_bytes());
    out.push(status_code(record.status));
    out.extend_from_slice(&record.hlc.wall_ms.to_be_bytes());
    out.extend_from_slice(&record.hlc.counter.to_be_bytes());
    let device = record.hlc.device_id.as_bytes();
    out.extend_from_slice(&(device.len() as u32).to_be_bytes());
    out.extend_from_slice(device);
}

/// A run row: `0` or `1` (whether a committed record below a failed one follows), the records,
/// then a checksum over the key and the body.
pub(crate) fn encode_row(agent_id: &str, run_id: &str, summary: &RunSummary) -> Vec<u8> {
    let mut body = Vec::with_capacity(128);
    body.push(u8::from(summary.committed_below_failed.is_some()));
    push_record(&summary.best, &mut body);
    if let Some(below) = &summary.committed_below_failed {
        push_record(below, &mut body);
    }
    let checksum = row_checksum(agent_id, run_id, &body);
    body.extend_from_slice(&checksum);
    body
}

/// Reads bytes off the front of a row.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.0.len() < count {
            return None;
        }
        let (head, rest) = self.0.split_at(count);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn record(&mut self) -> Option<SummaryRecord> {
        let op_id = OpId(self.array()?);
        let epoch = u64::from_be_bytes(self.array()?);
        let status = match self.array::<1>()?[0] {
            0 => IntentStatus::Pending,
            1 => IntentStatus::Committed,
            2 => IntentStatus::Failed,
            _ => return None,
        };
        let wall_ms = u64::from_be_bytes(self.array()?);
        let counter = u32::from_be_bytes(self.array()?);
        let length = usize::try_from(u32::from_be_bytes(self.array()?)).ok()?;
        let device = std::str::from_utf8(self.take(length)?).ok()?;
        Some(SummaryRecord {
            op_id,
            epoch,
            status,
            hlc: Hlc {
                wall_ms,
                counter,
                device_id: Arc::from(device),
            },
        })
    }
}

/// Decodes a run row, checking its checksum and the shape of a summary the fold makes.
pub(crate) fn decode_row(agent_id: &str, run_id: &str, value: &[u8]) -> Result<RunSummary, SnapshotError> {
    let damaged = || {
        SnapshotError::Damaged(format!(
            "the row of run {run_id:?} of agent {agent_id:?} is damaged"
        ))
    };
    let split = value.len().checked_sub(CHECKSUM_BYTES).ok_or_else(damaged)?;
    let (body, checksum) = value.split_at(split);
    if row_checksum(agent_id, run_id, body).as_slice() != checksum {
        return Err(damaged());
    }
    let mut reader = Reader(body);
    let decoded = (|| {
        let below = match reader.array::<1>()?[0] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let best = reader.record()?;
        let committed_below_failed = if below { Some(reader.record()?) } else { None };
        let shaped = match &committed_below_failed {
            None => true,
            Some(below) => best.status == IntentStatus::Failed && below.status == IntentStatus::Committed,
        };
        (reader.0.is_empty() && shaped).then_some(RunSummary {
            best,
            committed_below_failed,
        })
    })();
    decoded.ok_or_else(damaged)
}
