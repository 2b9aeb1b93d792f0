//! [`SqliteRelay`] (feature `sqlite`): the ledger in a SQLite file, for the processes of one host.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::{
    group_by_device, plan_device_push, stored_head, stored_record, stored_starts, verify_pulled, Appended,
    Frontier, MakeRecords, ProblemKind, PullBatch, PushReport, Relay, RelayError, RelayProblem,
};
use crate::oplog::{LogHead, OpId, OpRecord};
use std::collections::BTreeMap;

/// How long a call waits for another process's write lock on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Every device's log in two tables of a SQLite file (WAL, `synchronous = FULL`): the records
/// (their JSON wire form, keyed by device and seq) and, per device, how many there are. Rule R1:
/// a push is one transaction that verifies each device's chain (nothing of a refused push is
/// stored); a pull reads, per device, only the records from the caller's frontier on (the primary
/// key is `(device_id, seq)`: O(new records)) and verifies them, so a damaged record (a row edited
/// by hand, a gap) is reported as damage of its device, the other devices going on;
/// [`append`](Relay::append) holds SQLite's write lock (`BEGIN IMMEDIATE`) from reading the
/// device's tail to storing the new records, so the processes sharing a device id interleave.
///
/// One host only, like the SQLite coordinator: over a network or synced folder, SQLite's locks do
/// not hold. For many hosts, use a synced folder ([`FsRelay`](super::FsRelay)) or PostgreSQL.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::oplog::{DeviceLog, Surface};
/// use fencepost::relay::{Frontier, Relay, SqliteRelay};
/// use serde_json::json;
///
/// let folder = tempfile::tempdir()?;
/// let relay = SqliteRelay::open(folder.path().join("ledger.db"))?;
/// let mut log = DeviceLog::new("laptop", ManualClock::new(1).wall_clock())?;
/// let op = log.append(Surface::log("note"), json!({"text": "hi"}));
/// relay.push(&[op.clone()])?;
/// assert_eq!(relay.push(&[op.clone()])?.already_present, 1); // idempotent
/// assert_eq!(relay.pull(&Frontier::new())?.ops, vec![op]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SqliteRelay {
    path: PathBuf,
    connection: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fencepost_relay_records (
    device_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (device_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencepost_relay_devices (
    device_id TEXT NOT NULL PRIMARY KEY,
    next_seq INTEGER NOT NULL
) WITHOUT ROWID;
";

impl SqliteRelay {
    /// Opens (creating when missing) the relay in the SQLite file at `path`.
    ///
    /// # Errors
    /// [`RelayError::Io`] when the file cannot be opened or is no SQLite database.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RelayError> {
        let path = path.as_ref().to_path_buf();
        let failed = |error| storage("open", &path, error);
        let connection = Connection::open(&path).map_err(failed)?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(failed)?;
        // As the SQLite coordinator opens its file: several processes may create it at once.
        crate::backend::sqlite::switch_to_wal(&connection, BUSY_TIMEOUT).map_err(failed)?;
        connection
            .pragma_update(None, "synchronous", "FULL")
            .map_err(failed)?;
        connection.execute_batch(SCHEMA).map_err(failed)?;
        Ok(Self {
            path,
            connection: Mutex::new(connection),
        })
    }

    /// Opens the relay in an existing SQLite file without changing it: no table is created and
    /// the journal mode is left as it is (a file opened only to be read, or one the process may
    /// not write). A file without the relay's tables is refused: it is no ledger (a coordinator's
    /// file, say), and reading it as an empty one would hide that.
    ///
    /// # Errors
    /// [`RelayError::Io`] when the file is missing, cannot be opened, or holds no ledger.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self, RelayError> {
        use rusqlite::OpenFlags;
        let path = path.as_ref().to_path_buf();
        let failed = |error| storage("open", &path, error);
        let connection = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .or_else(|_| {
            Connection::open_with_flags(
                &path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
        })
        .map_err(failed)?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(failed)?;
        // A file with no schema at all is one another process is creating (`open` makes the
        // file, then its tables): waited for, a little (found by a test: a `ledger compact` that
        // came as the first `run` created the ledger was refused, "no fencepost ledger").
        let creating = crate::clock::RealTimeLimit::starting_now(BUSY_TIMEOUT);
        let tables = loop {
            let (tables, others): (i64, i64) = connection
                .query_row(
                    "SELECT count(*) FILTER (WHERE type = 'table'
                         AND name IN ('fencepost_relay_records', 'fencepost_relay_devices')),
                            count(*) FILTER (WHERE name NOT LIKE '%fencepost_relay%')
                     FROM sqlite_schema",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .map_err(failed)?;
            // Done: the relay's tables are there, or the file holds something else.
            if tables >= 2 || others > 0 || creating.passed() {
                break tables;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if tables < 2 {
            return Err(storage_text(
                "open",
                &path,
                "this file holds no fencepost ledger (no relay tables): a coordinator's file, or another database",
            ));
        }
        Ok(Self {
            path,
            connection: Mutex::new(connection),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failed(&self, operation: &'static str) -> impl Fn(rusqlite::Error) -> RelayError + '_ {
        move |error| storage(operation, &self.path, error)
    }

    fn damage(&self, device_id: &str, seq: u64, detail: String) -> RelayProblem {
        RelayProblem {
            kind: ProblemKind::Damage,
            device_id: Some(device_id.to_owned()),
            file: Some(self.path.clone()),
            line_number: Some(seq.saturating_add(1)),
            detail: format!("record {seq}: {detail}"),
        }
    }

    /// The stored record `seq` of `device_id`, verified to be that device's record `seq` with an
    /// id that matches its content.
    fn record_at(
        &self,
        transaction: &Transaction<'_>,
        device_id: &str,
        seq: u64,
    ) -> Result<Result<OpRecord, RelayProblem>, RelayError> {
        let bytes = self.bytes_at(transaction, device_id, seq)?;
        let damage = |seq, detail| self.damage(device_id, seq, detail);
        Ok(match bytes {
            None => Err(damage(seq, "missing".to_owned())),
            Some(bytes) => stored_record(device_id, seq, bytes.as_deref(), &damage),
        })
    }

    /// How many records of `device_id` are stored.
    fn next_seq(&self, transaction: &Transaction<'_>, device_id: &str) -> Result<u64, RelayError> {
        let next: Option<i64> = transaction
            .prepare_cached("SELECT next_seq FROM fencepost_relay_devices WHERE device_id = ?1")
            .and_then(|mut statement| statement.query_row([device_id], |row| row.get(0)).optional())
            .map_err(self.failed("read"))?;
        Ok(next.map_or(0, |next| u64::try_from(next).unwrap_or(0)))
    }

    /// The head of `device_id`'s stored log (from its last record), or the damage that keeps
    /// anything from being appended to it.
    fn head(&self, transaction: &Transaction<'_>, device_id: &str) -> Result<LogHead, RelayError> {
        let next_seq = self.next_seq(transaction, device_id)?;
        let top: Option<i64> = transaction
            .prepare_cached("SELECT max(seq) FROM fencepost_relay_records WHERE device_id = ?1")
            .and_then(|mut statement| {
                statement.query_row([device_id], |row| row.get_ref(0).map(|value| value.as_i64().ok()))
            })
            .map_err(self.failed("read"))?;
        let top = top.and_then(|top| u64::try_from(top).ok());
        let last = match next_seq.checked_sub(1) {
            Some(last) if top == Some(last) => self.bytes_at(transaction, device_id, last)?,
            _ => None,
        };
        let damage = |seq, detail| self.damage(device_id, seq, detail);
        stored_head(
            device_id,
            next_seq,
            top,
            last.as_ref().map(Option::as_deref),
            &damage,
        )
    }

    /// The bytes of the stored record `seq` of `device_id`: `None` when there is no such row,
    /// `Some(None)` when it holds a value of another type.
    fn bytes_at(
        &self,
        transaction: &Transaction<'_>,
        device_id: &str,
        seq: u64,
    ) -> Result<Option<Option<Vec<u8>>>, RelayError> {
        transaction
            .prepare_cached("SELECT record FROM fencepost_relay_records WHERE device_id = ?1 AND seq = ?2")
            .and_then(|mut statement| {
                statement
                    .query_row(
                        params![device_id, i64::try_from(seq).unwrap_or(i64::MAX)],
                        |row| Ok(bytes_of(row.get_ref(0)?)),
                    )
                    .optional()
            })
            .map_err(self.failed("read"))
    }

    /// Stores `ops` (checked to continue `device_id`'s chain) and the device's new length.
    fn store(
        &self,
        transaction: &Transaction<'_>,
        device_id: &str,
        ops: &[&OpRecord],
        next_seq: u64,
    ) -> Result<(), RelayError> {
        let mut insert = transaction
            .prepare_cached(
                "INSERT INTO fencepost_relay_records (device_id, seq, record) VALUES (?1, ?2, ?3)",
            )
            .map_err(self.failed("append to"))?;
        let mut line = Vec::new();
        for op in ops {
            line.clear();
            op.write_json_line(&mut line);
            let seq = i64::try_from(op.seq)
                .map_err(|_| storage_text("append to", &self.path, "a seq beyond 2^63"))?;
            insert
                .execute(params![device_id, seq, line.trim_ascii_end()])
                .map_err(self.failed("append to"))?;
        }
        let next_seq = i64::try_from(next_seq)
            .map_err(|_| storage_text("append to", &self.path, "a seq beyond 2^63"))?;
        transaction
            .prepare_cached(
                "INSERT INTO fencepost_relay_devices (device_id, next_seq) VALUES (?1, ?2)
                 ON CONFLICT (device_id) DO UPDATE SET next_seq = excluded.next_seq",
            )
            .and_then(|mut statement| statement.execute(params![device_id, next_seq]))
            .map_err(self.failed("append to"))?;
        Ok(())
    }
}

/// The bytes of a stored record (a BLOB, or TEXT once edited by hand); `None` for another type.
fn bytes_of(value: rusqlite::types::ValueRef<'_>) -> Option<Vec<u8>> {
    match value {
        rusqlite::types::ValueRef::Blob(bytes) | rusqlite::types::ValueRef::Text(bytes) => {
            Some(bytes.to_vec())
        }
        _ => None,
    }
}

/// A SQLite failure as a relay error. Another process that held the file past the busy timeout
/// may let go: that one is transient (as the SQLite coordinator's is), so that `fencepost run`
/// waits it out within `--wait`; nothing was written (SQLite changes nothing on a busy error).
fn storage(operation: &'static str, path: &Path, error: rusqlite::Error) -> RelayError {
    if matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    ) {
        return RelayError::Database {
            operation,
            message: format!("{}: {error}{}", path.display(), crate::backend::sqlite::BUSY_HINT),
            may_have_applied: false,
            transient: true,
        };
    }
    RelayError::Io {
        operation,
        path: path.to_path_buf(),
        source: std::io::Error::other(error),
    }
}

fn storage_text(operation: &'static str, path: &Path, text: &str) -> RelayError {
    RelayError::Io {
        operation,
        path: path.to_path_buf(),
        source: std::io::Error::other(text.to_owned()),
    }
}

impl Relay for SqliteRelay {
    /// Every record is checked against its chain as it is read.
    fn checks_records(&self) -> bool {
        true
    }

    fn is_database(&self) -> bool {
        true
    }

    /// The caller's frontier: this relay reads by it.
    fn cursor(&self, frontier: &Frontier) -> Option<serde_json::Value> {
        super::frontier_cursor(frontier)
    }

    /// Checks that every device still holds the cursor's last record.
    fn resume(&self, cursor: &serde_json::Value) -> Result<(), super::ResumeError> {
        super::resume_by_pull(self, cursor)
    }

    /// The folder `<file>.checkpoints` beside the ledger's file (the processes of one host share
    /// both).
    fn checkpoints_dir(&self) -> Option<PathBuf> {
        let mut name = self.path.file_name()?.to_os_string();
        name.push(".checkpoints");
        Some(self.path.with_file_name(name))
    }

    /// Reads each device's first row (an index lookup each).
    fn log_starts(&self) -> Result<BTreeMap<String, (u64, OpId)>, RelayError> {
        let mut connection = self.lock();
        let transaction = connection.transaction().map_err(self.failed("read"))?;
        let firsts: Vec<(String, i64, Option<Vec<u8>>)> = transaction
            .prepare_cached(
                "SELECT r.device_id, r.seq, r.record
                 FROM fencepost_relay_devices AS d JOIN fencepost_relay_records AS r
                   ON r.device_id = d.device_id
                  AND r.seq = (SELECT min(x.seq) FROM fencepost_relay_records AS x WHERE x.device_id = d.device_id)
                 WHERE r.seq > 0",
            )
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| {
                        Ok((row.get(0)?, row.get_ref(1)?.as_i64().unwrap_or(0), bytes_of(row.get_ref(2)?)))
                    })?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(self.failed("read"))?;
        Ok(stored_starts(firsts.iter().filter_map(
            |(device_id, seq, bytes)| Some((device_id.as_str(), u64::try_from(*seq).ok()?, bytes.as_deref())),
        )))
    }

    /// Deletes the device's rows before the kept ones in one transaction under the write lock,
    /// after checking the rows where the checkpoint ends and where the log then begins.
    fn prune(&self, device_id: &str, through_seq: u64, through_id: OpId) -> Result<u64, RelayError> {
        crate::id::validate_id(crate::id::IdKind::Device, device_id)?;
        let mut connection = self.lock();
        let transaction = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.failed("prune"))?;
        let head = self.head(&transaction, device_id)?;
        let Some(last) = head.next_seq().checked_sub(1) else {
            return Ok(0);
        };
        let begins: Option<i64> = transaction
            .prepare_cached("SELECT min(seq) FROM fencepost_relay_records WHERE device_id = ?1")
            .and_then(|mut statement| {
                statement.query_row([device_id], |row| {
                    Ok(row.get_ref(0)?.as_i64_or_null().ok().flatten())
                })
            })
            .map_err(self.failed("read"))?;
        let begins = begins.and_then(|begins| u64::try_from(begins).ok()).unwrap_or(0);
        let read = |seq| -> Result<OpRecord, RelayError> {
            self.record_at(&transaction, device_id, seq)?
                .map_err(|problem| RelayError::DeviceDamaged {
                    device_id: device_id.to_owned(),
                    problem,
                })
        };
        let damage = |seq, detail| self.damage(device_id, seq, detail);
        let plan = super::plan_prune(device_id, through_seq, through_id, last, begins, read, &damage)?;
        let Some(keep_from) = plan else {
            return Ok(0);
        };
        transaction
            .prepare_cached("DELETE FROM fencepost_relay_records WHERE device_id = ?1 AND seq < ?2")
            .and_then(|mut statement| {
                statement.execute(params![device_id, i64::try_from(keep_from).unwrap_or(i64::MAX)])
            })
            .map_err(self.failed("prune"))?;
        transaction.commit().map_err(self.failed("prune"))?;
        tracing::info!(file = %self.path.display(), device_id, removed = keep_from - begins, "removed the records a checkpoint covers from the device's log");
        Ok(keep_from - begins)
    }

    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        let groups = group_by_device(ops)?;
        let mut connection = self.lock();
        let transaction = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.failed("push to"))?;
        let mut report = PushReport::default();
        let mut plans = Vec::with_capacity(groups.len());
        for (device_id, device_ops) in groups {
            let head = self.head(&transaction, device_id)?;
            let plan = plan_device_push(
                &head,
                |seq| -> Result<OpId, RelayError> {
                    match self.record_at(&transaction, device_id, seq)? {
                        Ok(stored) => Ok(stored.op_id),
                        Err(problem) => Err(RelayError::DeviceDamaged {
                            device_id: device_id.to_owned(),
                            problem,
                        }),
                    }
                },
                device_ops,
            )?;
            plans.push((device_id, plan));
        }
        for (device_id, plan) in plans {
            report.already_present += plan.already_present;
            report.appended += plan.fresh.len();
            if !plan.fresh.is_empty() {
                self.store(&transaction, device_id, &plan.fresh, plan.head.next_seq())?;
            }
        }
        transaction.commit().map_err(self.failed("push to"))?;
        Ok(report)
    }

    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        let mut connection = self.lock();
        // One read transaction: a snapshot of every device (WAL).
        let transaction = connection.transaction().map_err(self.failed("read"))?;
        // With where each log begins (its smallest seq: a log pruned after a checkpoint begins
        // after record 0), an index lookup each.
        let devices: Vec<(String, i64, Option<i64>)> = transaction
            .prepare_cached(
                "SELECT d.device_id, d.next_seq,
                        (SELECT min(r.seq) FROM fencepost_relay_records AS r WHERE r.device_id = d.device_id)
                 FROM fencepost_relay_devices AS d ORDER BY d.device_id",
            )
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get_ref(2)?.as_i64_or_null().ok().flatten(),
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(self.failed("read"))?;
        let mut batch = PullBatch::default();
        // Devices with records but no length row (deleted by hand): their records would be
        // invisible. A walk over the records' device ids by the primary key: O(devices).
        let orphans: Vec<String> = transaction
            .prepare_cached(
                "WITH RECURSIVE ids(device_id) AS (
                     SELECT (SELECT device_id FROM fencepost_relay_records ORDER BY device_id LIMIT 1)
                     UNION ALL
                     SELECT (SELECT r.device_id FROM fencepost_relay_records AS r
                             WHERE r.device_id > ids.device_id ORDER BY r.device_id LIMIT 1)
                     FROM ids WHERE ids.device_id IS NOT NULL
                 )
                 SELECT device_id FROM ids
                 WHERE device_id IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM fencepost_relay_devices AS d WHERE d.device_id = ids.device_id)",
            )
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(self.failed("read"))?;
        for device_id in orphans {
            batch.problems.push(self.damage(
                &device_id,
                0,
                "the device has records but no length (its row in the devices table was deleted)".to_owned(),
            ));
        }
        for (device_id, stored, first) in devices {
            let stored = u64::try_from(stored).unwrap_or(0);
            let first = first.and_then(|first| u64::try_from(first).ok());
            let from = since.next_seq(&device_id);
            // Rows at or beyond both the stored length and the frontier (a length edited down,
            // or to 0) are read, so that they are reported as damage.
            let beyond: bool = transaction
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM fencepost_relay_records WHERE device_id = ?1 AND seq >= ?2)",
                )
                .and_then(|mut statement| {
                    statement.query_row(
                        params![device_id, i64::try_from(from.max(stored)).unwrap_or(i64::MAX)],
                        |row| row.get(0),
                    )
                })
                .map_err(self.failed("read"))?;
            if from >= stored && !beyond {
                continue;
            }
            // From the record before `from`, which anchors the chain of the first new one.
            let rows: Vec<(Option<u64>, Option<Vec<u8>>)> = transaction
                .prepare_cached(
                    "SELECT seq, record FROM fencepost_relay_records
                     WHERE device_id = ?1 AND seq >= ?2 ORDER BY seq",
                )
                .and_then(|mut statement| {
                    statement
                        .query_map(
                            params![
                                device_id,
                                i64::try_from(from.saturating_sub(1)).unwrap_or(i64::MAX)
                            ],
                            |row| {
                                // A row edited by hand may hold values of any type: damage of
                                // its device, not an error of the whole pull.
                                let seq = row
                                    .get_ref(0)?
                                    .as_i64()
                                    .ok()
                                    .and_then(|seq| u64::try_from(seq).ok());
                                Ok((seq, bytes_of(row.get_ref(1)?)))
                            },
                        )?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(self.failed("read"))?;
            let damage = |seq, detail| self.damage(&device_id, seq, detail);
            let (ops, problem) = verify_pulled(
                &device_id,
                from,
                stored,
                first,
                rows.iter().map(|(seq, bytes)| (*seq, bytes.as_deref())),
                &damage,
            );
            batch.ops.extend(ops);
            batch.problems.extend(problem);
        }
        Ok(batch)
    }

    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError> {
        crate::id::validate_id(crate::id::IdKind::Device, device_id)?;
        let mut connection = self.lock();
        // The write lock, held from reading the tail to storing the new records: the claim on
        // the device's log (and on every other's: SQLite has one writer at a time).
        let transaction = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.failed("append to"))?;
        let mut head = self.head(&transaction, device_id)?;
        // Records of the caller's that a prune removed since it read (another process of the
        // device appended them, a checkpoint covers them) are not handed over: the tail begins
        // where the log does (found by a flaky test: the append was refused as damage).
        let begins: Option<i64> = transaction
            .prepare_cached("SELECT min(seq) FROM fencepost_relay_records WHERE device_id = ?1")
            .and_then(|mut statement| {
                statement.query_row([device_id], |row| row.get_ref(0).map(|value| value.as_i64().ok()))
            })
            .map_err(self.failed("read"))?;
        let begins = begins.and_then(|begins| u64::try_from(begins).ok()).unwrap_or(0);
        let mut tail = Vec::new();
        for seq in since_seq.max(begins)..head.next_seq() {
            match self.record_at(&transaction, device_id, seq)? {
                Ok(op) => tail.push(op),
                Err(problem) => {
                    return Err(RelayError::DeviceDamaged {
                        device_id: device_id.to_owned(),
                        problem,
                    })
                }
            }
        }
        let made = make(&tail)?;
        for op in &made {
            head.accept(op)?;
        }
        let refs: Vec<&OpRecord> = made.iter().collect();
        if !refs.is_empty() {
            self.store(&transaction, device_id, &refs, head.next_seq())?;
        }
        transaction.commit().map_err(self.failed("append to"))?;
        Ok(Appended { tail, appended: made })
    }
}
