//! The snapshot's store: a SQLite file (see the [module docs](super)).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod checkpoint_file;

pub(crate) use checkpoint_file::CheckpointFile;

use super::{SnapshotBase, SnapshotError};
use crate::clock::Hlc;
use crate::fold::{RunSummary, SummaryRecord, SyncState};
use crate::intent::IntentStatus;
use crate::oplog::{HeadMark, OpId};

/// The snapshot format this version writes and reads; any other is rebuilt.
const FORMAT: &str = "fencepost-snapshot/3";
/// How long a save waits for another process's save.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The prefix of a bucket's checksum.
const BUCKET_DOMAIN: &[u8] = b"fencepost/snapshot/bucket/v1\0";
/// The prefix of the bucket a run is in.
const PLACE_DOMAIN: &[u8] = b"fencepost/snapshot/place/v1\0";
/// The prefix of a page of checksums' digest.
const PAGE_DOMAIN: &[u8] = b"fencepost/snapshot/page/v1\0";
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
/// are kept in buckets (by a hash of agent and run); each bucket's checksum is in a page of
/// checksums (`sums`, 256 buckets a page), and each page's digest is here. So a lookup checks the
/// one page and the one bucket it reads against the saved state (a tree of depth two): a bucket
/// that lost a run (a row deleted, a page of the file damaged or restored from another time) does
/// not match, and is damage, never "not committed".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    base: SnapshotBase,
    buckets: u32,
    runs: u64,
    pages: String,
}

/// [`Stored`], borrowed, as a save writes it.
#[derive(Serialize)]
struct StoredRef<'a> {
    base: &'a SnapshotBase,
    buckets: u32,
    runs: u64,
    pages: &'a str,
}

/// How many buckets' checksums a page holds.
const BUCKETS_PER_PAGE: u32 = 256;

/// The runs' layout: the pages' digests, and the pages read.
#[derive(Debug)]
struct Layout {
    buckets: u32,
    runs: u64,
    /// Per page, its digest in the saved state (or as this save leaves it).
    pages: Vec<[u8; 32]>,
    /// Whether the pages are those of empty buckets, not stored (a new layout).
    fresh: bool,
    /// The pages read or changed, checked.
    loaded: BTreeMap<u32, Vec<[u8; CHECKSUM_BYTES]>>,
}

impl Layout {
    fn page_len(buckets: u32) -> u32 {
        buckets.min(BUCKETS_PER_PAGE)
    }

    fn empty_page(buckets: u32, page: u32) -> Vec<[u8; CHECKSUM_BYTES]> {
        let first = page * Self::page_len(buckets);
        (first..first + Self::page_len(buckets))
            .map(|bucket| bucket_sum(bucket, &[]))
            .collect()
    }

    /// A layout of `buckets` empty buckets.
    fn empty(buckets: u32) -> Self {
        let count = buckets / Self::page_len(buckets);
        Self {
            buckets,
            runs: 0,
            pages: (0..count)
                .map(|page| page_digest(page, &Self::empty_page(buckets, page)))
                .collect(),
            fresh: true,
            loaded: BTreeMap::new(),
        }
    }

    /// The checksums of page `page`, read and checked against its digest when not loaded yet.
    fn page(
        &mut self,
        connection: &Connection,
        page: u32,
    ) -> Result<&mut Vec<[u8; CHECKSUM_BYTES]>, SnapshotError> {
        if !self.loaded.contains_key(&page) {
            let sums = if self.fresh {
                Self::empty_page(self.buckets, page)
            } else {
                let bytes: Vec<u8> = connection
                    .prepare_cached("SELECT value FROM sums WHERE page = ?1")?
                    .query_row([page], |row| row.get(0))
                    .optional()?
                    .unwrap_or_default();
                let sums: Vec<[u8; CHECKSUM_BYTES]> = bytes
                    .chunks_exact(CHECKSUM_BYTES)
                    .map(|chunk| {
                        let mut sum = [0u8; CHECKSUM_BYTES];
                        sum.copy_from_slice(chunk);
                        sum
                    })
                    .collect();
                let expected = self.pages.get(page as usize);
                if expected != Some(&page_digest(page, &sums))
                    || sums.len() != Self::page_len(self.buckets) as usize
                {
                    return Err(SnapshotError::Damaged(format!(
                        "its page {page} of checksums does not match the saved state"
                    )));
                }
                sums
            };
            self.loaded.insert(page, sums);
        }
        self.loaded
            .get_mut(&page)
            .ok_or_else(|| SnapshotError::Other("a loaded page vanished".to_owned()))
    }

    fn pages_hex(&self) -> String {
        let mut text = String::with_capacity(self.pages.len() * 64);
        for page in &self.pages {
            crate::hex::push_lower_hex(&mut text, page);
        }
        text
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
             CREATE TABLE IF NOT EXISTS base (id INTEGER PRIMARY KEY CHECK (id = 1), value BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS sums (page INTEGER PRIMARY KEY, value BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS buckets (id INTEGER PRIMARY KEY, value BLOB NOT NULL);",
        )?;
        let snapshot = Self {
            connection,
            path: path.to_path_buf(),
        };
        // The file's own name too: the CLI names a snapshot after its ledger, so one copied in
        // from another ledger's name is started over, not taken for this ledger's past.
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (key, expected) in [("format", FORMAT), ("device", device_id), ("file", name.as_str())] {
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
        Ok(read_stored(&self.connection)?.map(|(stored, _)| stored.base))
    }

    /// The stored summary of a run, checked against the saved state (see [`Stored`]).
    pub(crate) fn run(&self, agent_id: &str, run_id: &str) -> Result<Option<RunSummary>, SnapshotError> {
        // One read transaction: the saved state, the page and the bucket of one save.
        let transaction = self.connection.unchecked_transaction()?;
        let Some((_, mut layout)) = read_stored(&transaction)? else {
            return Err(SnapshotError::Damaged("its saved state is gone".to_owned()));
        };
        let bucket = bucket_of(agent_id, run_id, layout.buckets);
        let entries = read_bucket(&transaction, &mut layout, bucket)?;
        transaction.commit()?;
        Ok(entries
            .into_iter()
            .find(|entry| entry.agent == agent_id && entry.run == run_id)
            .map(|entry| entry.summary))
    }

    /// Calls `each` with every stored run, in one read transaction, each bucket checked against
    /// the saved state (what a site that saw more writes back into a database that went back:
    /// [`Ledger::repair_went_back`](crate::ledger::Ledger::repair_went_back)).
    pub(crate) fn for_each_run(
        &self,
        mut each: impl FnMut(&str, &str, &RunSummary),
    ) -> Result<(), SnapshotError> {
        let transaction = self.connection.unchecked_transaction()?;
        let Some((_, mut layout)) = read_stored(&transaction)? else {
            return Ok(());
        };
        for bucket in 0..layout.buckets {
            for entry in read_bucket(&transaction, &mut layout, bucket)? {
                each(&entry.agent, &entry.run, &entry.summary);
            }
        }
        transaction.commit()?;
        Ok(())
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
        let stored = read_stored(&transaction)?;
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
            None => read_bucket(&self.transaction, &mut self.layout, bucket)?,
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
                None => read_bucket(&self.transaction, &mut self.layout, bucket)?,
            };
            for entry in entries {
                let body = spread
                    .entry(bucket_of(&entry.agent, &entry.run, buckets))
                    .or_default();
                push_entry(&entry.agent, &entry.run, &entry.summary, body);
            }
        }
        self.transaction
            .execute_batch("DELETE FROM buckets; DELETE FROM sums;")?;
        let runs = self.layout.runs;
        self.layout = Layout::empty(buckets);
        self.layout.runs = runs;
        self.pending = spread;
        self.empty = true;
        Ok(())
    }

    /// Stores the changed buckets, their pages of checksums and the loaded part, and commits.
    pub(crate) fn finish(mut self, base: &SnapshotBase) -> Result<(), SnapshotError> {
        if self.layout.runs > u64::from(self.layout.buckets) * MAX_RUNS_PER_BUCKET {
            self.spread()?;
        }
        let page_len = Layout::page_len(self.layout.buckets);
        // A new layout stores every page; a save, the pages of the buckets it changed.
        let mut touched: std::collections::BTreeSet<u32> = if self.layout.fresh {
            (0..self.layout.pages.len() as u32).collect()
        } else {
            std::collections::BTreeSet::new()
        };
        {
            let mut write = self
                .transaction
                .prepare_cached("INSERT OR REPLACE INTO buckets (id, value) VALUES (?1, ?2)")?;
            for (bucket, body) in &self.pending {
                write.execute(params![bucket, body])?;
                let page = bucket / page_len;
                self.layout.page(&self.transaction, page)?[(bucket % page_len) as usize] =
                    bucket_sum(*bucket, body);
                touched.insert(page);
            }
        }
        for page in touched {
            let sums = self.layout.page(&self.transaction, page)?.clone();
            let bytes: Vec<u8> = sums.iter().flatten().copied().collect();
            self.transaction
                .prepare_cached("INSERT OR REPLACE INTO sums (page, value) VALUES (?1, ?2)")?
                .execute(params![page, bytes])?;
            self.layout.pages[page as usize] = page_digest(page, &sums);
        }
        let pages = self.layout.pages_hex();
        let stored = StoredRef {
            base,
            buckets: self.layout.buckets,
            runs: self.layout.runs,
            pages: &pages,
        };
        let mut value =
            serde_json::to_vec(&stored).map_err(|error| SnapshotError::Other(error.to_string()))?;
        let digest = base_digest(&value);
        value.extend_from_slice(&digest);
        self.transaction
            .execute("INSERT OR REPLACE INTO base (id, value) VALUES (1, ?1)", [value])?;
        self.transaction.commit()?;
        Ok(())
    }
}

/// The saved state and the runs' layout, checked.
fn read_stored(connection: &Connection) -> Result<Option<(Stored, Layout)>, SnapshotError> {
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
    if !stored.buckets.is_power_of_two() || stored.buckets < MIN_BUCKETS {
        return Err(damaged("has a wrong number of buckets"));
    }
    let count = (stored.buckets / Layout::page_len(stored.buckets)) as usize;
    let pages: Vec<[u8; 32]> = (0..count)
        .map(|page| {
            let hex = stored.pages.get(page * 64..page * 64 + 64)?;
            crate::hex::decode_lower_hex::<32>(hex)
        })
        .collect::<Option<_>>()
        .filter(|_| stored.pages.len() == count * 64)
        .ok_or_else(|| damaged("has damaged page digests"))?;
    let layout = Layout {
        buckets: stored.buckets,
        runs: stored.runs,
        pages,
        fresh: false,
        loaded: BTreeMap::new(),
    };
    Ok(Some((stored, layout)))
}

/// The runs of `bucket`, checked against its page of checksums (an absent row is an empty
/// bucket).
fn read_bucket(
    connection: &Connection,
    layout: &mut Layout,
    bucket: u32,
) -> Result<Vec<Entry>, SnapshotError> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("SELECT value FROM buckets WHERE id = ?1")?
        .query_row([bucket], |row| row.get(0))
        .optional()?;
    let body = body.unwrap_or_default();
    let page_len = Layout::page_len(layout.buckets);
    let expected = layout
        .page(connection, bucket / page_len)?
        .get((bucket % page_len) as usize)
        .copied();
    if expected != Some(bucket_sum(bucket, &body)) {
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

fn page_digest(page: u32, sums: &[[u8; CHECKSUM_BYTES]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(PAGE_DOMAIN);
    hasher.update(page.to_be_bytes());
    for sum in sums {
        hasher.update(sum);
    }
    hasher.finalize().into()
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
