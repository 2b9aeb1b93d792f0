//! The snapshot's store: a SQLite file (see the [module docs](super)).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{SnapshotBase, SnapshotError};
use crate::clock::Hlc;
use crate::fold::{RunSummary, SummaryRecord, SyncState};
use crate::intent::IntentStatus;
use crate::oplog::{HeadMark, OpId};

/// The snapshot format this version writes and reads; any other is rebuilt.
const FORMAT: &str = "fencepost-snapshot/2";
/// How long a save waits for another process's save.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The prefix of a bucket's checksum.
const BUCKET_DOMAIN: &[u8] = b"fencepost/snapshot/bucket/v1\0";
/// The prefix of the bucket a run is in.
const PLACE_DOMAIN: &[u8] = b"fencepost/snapshot/place/v1\0";
/// The prefix of the loaded part's digest.
const BASE_DOMAIN: &[u8] = b"fencepost/snapshot/base/v1\0";
/// The bytes of a bucket's checksum.
const CHECKSUM_BYTES: usize = 16;
/// The fewest buckets a snapshot has.
const MIN_BUCKETS: u32 = 64;
/// How many runs a bucket holds on average when the buckets are laid out.
const RUNS_PER_BUCKET: u64 = 16;
/// Past this many runs per bucket on average, the runs are laid out in more buckets.
const MAX_RUNS_PER_BUCKET: u64 = 64;

/// What the `base` row holds: the ledger's loaded part, and how the runs are laid out. The runs
/// are kept in buckets (by a hash of agent and run); the `sums` row holds every bucket's checksum,
/// and this row the digest of `sums`. So a lookup checks the one bucket it reads against the
/// saved state: a bucket that lost a run (a row deleted, a page of the file damaged or restored
/// from another time) does not match, and is damage, never "not committed".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    base: SnapshotBase,
    buckets: u32,
    runs: u64,
    sums: String,
}

/// [`Stored`], borrowed, as a save writes it.
#[derive(Serialize)]
struct StoredRef<'a> {
    base: &'a SnapshotBase,
    buckets: u32,
    runs: u64,
    sums: &'a str,
}

/// The runs' layout: the buckets' checksums.
#[derive(Debug, Clone)]
struct Layout {
    buckets: u32,
    runs: u64,
    sums: Vec<[u8; CHECKSUM_BYTES]>,
    /// The digest of `sums` as stored.
    digest: String,
}

impl Layout {
    fn empty(buckets: u32) -> Self {
        let sums = (0..buckets).map(|id| bucket_sum(id, &[])).collect();
        let mut layout = Self {
            buckets,
            runs: 0,
            sums,
            digest: String::new(),
        };
        layout.digest = sums_digest(&layout.sums_bytes());
        layout
    }

    fn sums_bytes(&self) -> Vec<u8> {
        self.sums.iter().flatten().copied().collect()
    }
}

/// One run of a bucket.
#[derive(Debug, Clone)]
struct Entry {
    agent: String,
    run: String,
    summary: RunSummary,
}

/// An open snapshot file.
pub(crate) struct Snapshot {
    connection: Connection,
    path: PathBuf,
    /// The layout last read, for lookups while no other process saves.
    layout: std::cell::RefCell<Option<Layout>>,
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
        // The write-ahead log stays between processes (checkpointed as it grows, not by every
        // process that closes the file), so a command's saves append to it without a sync.
        connection.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        // A log that grew (a first save of a long ledger) is cut back when it starts over.
        connection.pragma_update(None, "journal_size_limit", 4 * 1024 * 1024)?;
        connection.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS base (id INTEGER PRIMARY KEY CHECK (id IN (1, 2)), value BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS buckets (id INTEGER PRIMARY KEY, value BLOB NOT NULL);",
        )?;
        let snapshot = Self {
            connection,
            path: path.to_path_buf(),
            layout: std::cell::RefCell::new(None),
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

    /// Removes the snapshot file at `path` (and SQLite's files beside it), if there is one.
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
        let transaction = self.connection.unchecked_transaction()?;
        let cached = self.layout.borrow().clone();
        let stored = read_stored(&transaction, cached)?;
        transaction.commit()?;
        Ok(stored.map(|(stored, layout)| {
            *self.layout.borrow_mut() = Some(layout);
            stored.base
        }))
    }

    /// The stored summary of a run, checked against the saved state (see [`Stored`]).
    pub(crate) fn run(&self, agent_id: &str, run_id: &str) -> Result<Option<RunSummary>, SnapshotError> {
        // One read transaction: the saved state and the bucket of one save.
        let transaction = self.connection.unchecked_transaction()?;
        let cached = self.layout.borrow().clone();
        let Some((_, layout)) = read_stored(&transaction, cached)? else {
            return Err(SnapshotError::Damaged("its saved state is gone".to_owned()));
        };
        let bucket = bucket_of(agent_id, run_id, layout.buckets);
        let entries = read_bucket(&transaction, &layout, bucket)?;
        transaction.commit()?;
        *self.layout.borrow_mut() = Some(layout);
        Ok(entries
            .into_iter()
            .find(|entry| entry.agent == agent_id && entry.run == run_id)
            .map(|entry| entry.summary))
    }

    /// Moves what the write-ahead log holds into the file and empties the log (after a save of
    /// a whole ledger, so that the log does not keep that size).
    pub(crate) fn checkpoint(&self) -> Result<(), SnapshotError> {
        self.connection
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// Starts a save, under the snapshot's write lock, when `contains` accepts the saved state's
    /// heads (the new state must contain it); `None` when it does not. `runs_hint`: about how
    /// many runs the save puts (it lays a new snapshot's runs out).
    pub(crate) fn begin_save(
        &mut self,
        contains: impl FnOnce(&[HeadMark]) -> bool,
        runs_hint: usize,
    ) -> Result<Option<Save<'_>>, SnapshotError> {
        let transaction = self
            .connection
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let cached = self.layout.borrow().clone();
        let stored = read_stored(&transaction, cached)?;
        let (heads, layout, empty) = match stored {
            Some((stored, layout)) => (stored.base.heads, layout, false),
            None => {
                let wanted = (runs_hint as u64 / RUNS_PER_BUCKET).max(u64::from(MIN_BUCKETS));
                let buckets = u32::try_from(wanted.next_power_of_two()).unwrap_or(1 << 31);
                (Vec::new(), Layout::empty(buckets), true)
            }
        };
        if !contains(&heads) {
            return Ok(None);
        }
        Ok(Some(Save {
            transaction,
            layout,
            empty,
            pending: BTreeMap::new(),
            cache: &self.layout,
        }))
    }
}

/// A save in progress: one transaction.
pub(crate) struct Save<'a> {
    transaction: rusqlite::Transaction<'a>,
    layout: Layout,
    /// Whether the snapshot had no saved state: its buckets are all empty.
    empty: bool,
    /// The buckets changed by this save, encoded.
    pending: BTreeMap<u32, Vec<u8>>,
    cache: &'a std::cell::RefCell<Option<Layout>>,
}

impl Save<'_> {
    /// Stores a run: its stored summary (if any) merged with `summary`, by the fold's own rule.
    pub(crate) fn put_run(
        &mut self,
        agent_id: &str,
        run_id: &str,
        summary: &RunSummary,
    ) -> Result<(), SnapshotError> {
        let bucket = bucket_of(agent_id, run_id, self.layout.buckets);
        if self.empty {
            // A new snapshot: each run is put once, into an empty bucket.
            let body = self.pending.entry(bucket).or_default();
            push_entry(agent_id, run_id, summary, body);
            self.layout.runs += 1;
            return Ok(());
        }
        let mut entries = match self.pending.get(&bucket) {
            Some(body) => decode_bucket(bucket, body)?,
            None => read_bucket(&self.transaction, &self.layout, bucket)?,
        };
        match entries
            .iter_mut()
            .find(|entry| entry.agent == agent_id && entry.run == run_id)
        {
            Some(entry) => {
                let mut state = SyncState::new();
                state.merge_summary(agent_id, run_id, &entry.summary);
                state.merge_summary(agent_id, run_id, summary);
                entry.summary = state
                    .run_summary(agent_id, run_id)
                    .ok_or_else(|| SnapshotError::Other("a merged run vanished".to_owned()))?;
            }
            None => {
                entries.push(Entry {
                    agent: agent_id.to_owned(),
                    run: run_id.to_owned(),
                    summary: summary.clone(),
                });
                self.layout.runs += 1;
            }
        }
        let mut body = Vec::new();
        for entry in &entries {
            push_entry(&entry.agent, &entry.run, &entry.summary, &mut body);
        }
        self.pending.insert(bucket, body);
        Ok(())
    }

    /// Lays the runs out in more buckets (every bucket read, checked and written again).
    fn spread(&mut self) -> Result<(), SnapshotError> {
        let wanted = (self.layout.runs / RUNS_PER_BUCKET).max(u64::from(MIN_BUCKETS));
        let buckets = u32::try_from(wanted.next_power_of_two()).unwrap_or(1 << 31);
        let mut spread: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        for bucket in 0..self.layout.buckets {
            let entries = match self.pending.get(&bucket) {
                Some(body) => decode_bucket(bucket, body)?,
                None if self.empty => Vec::new(),
                None => read_bucket(&self.transaction, &self.layout, bucket)?,
            };
            for entry in entries {
                let body = spread
                    .entry(bucket_of(&entry.agent, &entry.run, buckets))
                    .or_default();
                push_entry(&entry.agent, &entry.run, &entry.summary, body);
            }
        }
        self.transaction.execute("DELETE FROM buckets", [])?;
        let runs = self.layout.runs;
        self.layout = Layout::empty(buckets);
        self.layout.runs = runs;
        self.pending = spread;
        self.empty = true;
        Ok(())
    }

    /// Stores the changed buckets, their checksums and the loaded part, and commits.
    pub(crate) fn finish(mut self, base: &SnapshotBase) -> Result<(), SnapshotError> {
        if self.layout.runs > u64::from(self.layout.buckets) * MAX_RUNS_PER_BUCKET {
            self.spread()?;
        }
        {
            let mut write = self
                .transaction
                .prepare_cached("INSERT OR REPLACE INTO buckets (id, value) VALUES (?1, ?2)")?;
            for (bucket, body) in &self.pending {
                write.execute(params![bucket, body])?;
                self.layout.sums[*bucket as usize] = bucket_sum(*bucket, body);
            }
        }
        let sums = self.layout.sums_bytes();
        self.layout.digest = sums_digest(&sums);
        let stored = StoredRef {
            base,
            buckets: self.layout.buckets,
            runs: self.layout.runs,
            sums: &self.layout.digest,
        };
        let mut value =
            serde_json::to_vec(&stored).map_err(|error| SnapshotError::Other(error.to_string()))?;
        let digest = base_digest(&value);
        value.extend_from_slice(&digest);
        self.transaction
            .execute("INSERT OR REPLACE INTO base (id, value) VALUES (1, ?1)", [value])?;
        self.transaction
            .execute("INSERT OR REPLACE INTO base (id, value) VALUES (2, ?1)", [sums])?;
        self.transaction.commit()?;
        *self.cache.borrow_mut() = Some(self.layout);
        Ok(())
    }
}

/// The saved state and the runs' layout, checked (the layout `cached` is used when its digest is
/// the saved one).
fn read_stored(
    connection: &Connection,
    cached: Option<Layout>,
) -> Result<Option<(Stored, Layout)>, SnapshotError> {
    let value: Option<Vec<u8>> = connection
        .query_row("SELECT value FROM base WHERE id = 1", [], |row| row.get(0))
        .optional()?;
    let Some(value) = value else {
        return Ok(None);
    };
    let damaged = |what: &str| SnapshotError::Damaged(format!("its saved state {what}"));
    let split = value
        .len()
        .checked_sub(32)
        .ok_or_else(|| damaged("is cut short"))?;
    let (json, digest) = value.split_at(split);
    if base_digest(json).as_slice() != digest {
        return Err(damaged("does not match its digest"));
    }
    let stored: Stored = serde_json::from_slice(json)
        .map_err(|error| SnapshotError::Damaged(format!("its saved state cannot be read: {error}")))?;
    if !stored.buckets.is_power_of_two() {
        return Err(damaged("has a wrong number of buckets"));
    }
    if let Some(layout) =
        cached.filter(|layout| layout.digest == stored.sums && layout.buckets == stored.buckets)
    {
        let layout = Layout {
            runs: stored.runs,
            ..layout
        };
        return Ok(Some((stored, layout)));
    }
    let sums: Vec<u8> = connection
        .query_row("SELECT value FROM base WHERE id = 2", [], |row| row.get(0))
        .optional()?
        .ok_or_else(|| damaged("lacks its buckets' checksums"))?;
    if sums_digest(&sums) != stored.sums || sums.len() != stored.buckets as usize * CHECKSUM_BYTES {
        return Err(damaged("does not match its buckets' checksums"));
    }
    let layout = Layout {
        buckets: stored.buckets,
        runs: stored.runs,
        sums: sums
            .chunks_exact(CHECKSUM_BYTES)
            .map(|chunk| {
                let mut sum = [0u8; CHECKSUM_BYTES];
                sum.copy_from_slice(chunk);
                sum
            })
            .collect(),
        digest: stored.sums.clone(),
    };
    Ok(Some((stored, layout)))
}

/// The runs of `bucket`, checked against the layout's checksum (an absent row is an empty bucket).
fn read_bucket(connection: &Connection, layout: &Layout, bucket: u32) -> Result<Vec<Entry>, SnapshotError> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("SELECT value FROM buckets WHERE id = ?1")?
        .query_row([bucket], |row| row.get(0))
        .optional()?;
    let body = body.unwrap_or_default();
    let expected = layout
        .sums
        .get(bucket as usize)
        .ok_or_else(|| SnapshotError::Damaged(format!("bucket {bucket} is out of range")))?;
    if bucket_sum(bucket, &body) != *expected {
        return Err(SnapshotError::Damaged(format!(
            "its bucket {bucket} of runs does not match the saved state (a run lost or changed)"
        )));
    }
    decode_bucket(bucket, &body)
}

fn base_digest(json: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(BASE_DOMAIN);
    hasher.update(json);
    hasher.finalize().into()
}

fn sums_digest(sums: &[u8]) -> String {
    let digest: [u8; 32] = Sha256::digest(sums).into();
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn bucket_sum(bucket: u32, body: &[u8]) -> [u8; CHECKSUM_BYTES] {
    let mut hasher = Sha256::new();
    hasher.update(BUCKET_DOMAIN);
    hasher.update(bucket.to_be_bytes());
    hasher.update(body);
    let digest: [u8; 32] = hasher.finalize().into();
    let mut sum = [0u8; CHECKSUM_BYTES];
    sum.copy_from_slice(&digest[..CHECKSUM_BYTES]);
    sum
}

/// The bucket of a run, of `buckets` (a power of two).
fn bucket_of(agent_id: &str, run_id: &str, buckets: u32) -> u32 {
    let mut hasher = Sha256::new();
    hasher.update(PLACE_DOMAIN);
    hasher.update((agent_id.len() as u64).to_be_bytes());
    hasher.update(agent_id.as_bytes());
    hasher.update(run_id.as_bytes());
    let digest: [u8; 32] = hasher.finalize().into();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) & (buckets - 1)
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

/// Appends one run of a bucket: the agent and run ids (each with its length), `0` or `1`
/// (whether a committed record below a failed one follows), the records.
fn push_entry(agent_id: &str, run_id: &str, summary: &RunSummary, out: &mut Vec<u8>) {
    for text in [agent_id, run_id] {
        out.extend_from_slice(&(text.len() as u32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out.push(u8::from(summary.committed_below_failed.is_some()));
    push_record(&summary.best, out);
    if let Some(below) = &summary.committed_below_failed {
        push_record(below, out);
    }
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

impl Reader<'_> {
    fn text(&mut self) -> Option<String> {
        let length = usize::try_from(u32::from_be_bytes(self.array()?)).ok()?;
        std::str::from_utf8(self.take(length)?).ok().map(str::to_owned)
    }

    fn entry(&mut self) -> Option<Entry> {
        let agent = self.text()?;
        let run = self.text()?;
        let below = match self.array::<1>()?[0] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let best = self.record()?;
        let committed_below_failed = if below { Some(self.record()?) } else { None };
        let shaped = match &committed_below_failed {
            None => true,
            Some(below) => best.status == IntentStatus::Failed && below.status == IntentStatus::Committed,
        };
        shaped.then_some(Entry {
            agent,
            run,
            summary: RunSummary {
                best,
                committed_below_failed,
            },
        })
    }
}

/// Decodes a bucket's runs (its checksum was checked), each of the shape the fold makes.
fn decode_bucket(bucket: u32, body: &[u8]) -> Result<Vec<Entry>, SnapshotError> {
    let mut reader = Reader(body);
    let mut entries = Vec::new();
    while !reader.0.is_empty() {
        let entry = reader
            .entry()
            .ok_or_else(|| SnapshotError::Damaged(format!("its bucket {bucket} of runs cannot be read")))?;
        entries.push(entry);
    }
    Ok(entries)
}
