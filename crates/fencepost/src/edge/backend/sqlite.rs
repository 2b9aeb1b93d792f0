//! [`SqliteLeaseCoordinator`]: the embedded, durable coordinator (feature `sqlite`).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior};

mod open;

use super::{claimed, Columns};
use crate::clock::WallClock;
use crate::id::{validate_id, IdKind};
use crate::lease::{
    expiry_after, validate_epoch_floor, validate_frontier, validate_publish, validate_ttl, BackendError,
    Lease, LeaseCoordinator, LeaseError, MAX_EPOCH,
};
use crate::relay::Frontier;

/// The SQLite `application_id` of a fencepost database ("FPST").
pub const SQLITE_APPLICATION_ID: i32 = 0x4650_5354;

/// The table's name, as a literal so that the statements below are constants.
macro_rules! table {
    () => {
        "fencepost_leases"
    };
}

/// The table that holds the registers.
const TABLE: &str = table!();
/// Reads one register.
const SELECT_ROW: &str = concat!(
    "SELECT holder, epoch, expires_at_ms, floor FROM ",
    table!(),
    " WHERE agent_id = ?1"
);
/// Writes a granted lease (`acquire`).
const GRANT: &str = concat!("INSERT INTO ", table!(), " (agent_id, holder, epoch, expires_at_ms, floor) VALUES (?1, ?2, ?3, ?4, 0) ON CONFLICT (agent_id) DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch, expires_at_ms = excluded.expires_at_ms");
/// Extends the expiry for the holder at its epoch, and returns the row either way (`renew`).
const RENEW: &str = concat!("UPDATE ", table!(), " SET expires_at_ms = CASE WHEN holder = ?2 AND epoch = ?3 THEN ?4 ELSE expires_at_ms END WHERE agent_id = ?1 RETURNING holder, epoch, expires_at_ms");
/// Every agent with a register, for operators (`agents`).
const AGENTS: &str = concat!("SELECT agent_id FROM ", table!(), " ORDER BY agent_id");
/// Every held lease, for operators (`list`).
const LIST: &str = concat!(
    "SELECT agent_id, holder, epoch, expires_at_ms FROM ",
    table!(),
    " WHERE holder IS NOT NULL ORDER BY agent_id"
);
/// Clears the holder (`release`, after the transaction checked holder and epoch).
const RELEASE: &str = concat!("UPDATE ", table!(), " SET holder = NULL WHERE agent_id = ?1");
/// Raises the epoch floor, creating the row if needed. A floor not above both the floor and the
/// last epoch changes no grant (the next is one above the higher of the two), and is not written:
/// every `fencepost run` raises the floor to the ledger's epoch, which is almost always the last.
const RAISE_FLOOR: &str = concat!("INSERT INTO ", table!(), " (agent_id, holder, epoch, expires_at_ms, floor) VALUES (?1, NULL, 0, 0, ?2) ON CONFLICT (agent_id) DO UPDATE SET floor = excluded.floor WHERE excluded.floor > max(floor, epoch)");

/// Settings of a [`SqliteLeaseCoordinator`].
#[derive(Clone)]
pub struct SqliteConfig {
    /// How long an operation waits for another process's write transaction before failing with a
    /// (not applied) backend error.
    pub busy_timeout_ms: u64,
    /// The identity of the coordinator clock's time line, when it can restart: for a clock that
    /// counts from boot (Linux `CLOCK_BOOTTIME`, which an NTP step or a VM's wall-clock jump does
    /// not move), the boot id. The database records it; opening it with another one (after a
    /// reboot) expires every lease, keeping holders and epochs, since expiries measured on the
    /// old time line mean nothing on the new one. `None` (the default): the clock never
    /// restarts (a wall clock), nothing is recorded.
    pub clock_timeline: Option<String>,
    /// The wall clock (milliseconds since the Unix epoch) that every grant's epoch is at least
    /// (rule L5): a grant mints `max(last epoch + 1, floor + 1, this clock)`. So a file restored
    /// from a copy taken earlier, which forgot the grants made since, still mints no epoch
    /// that was granted before: the clock has passed them (unless the agent was granted more
    /// than once per millisecond up to the restore, or the clock was set back). Default: the
    /// system's clock ([`system_clock`](crate::clock::system_clock)), whatever clock decides
    /// expiry. `None`: epochs count 1, 2, 3, … and a restored copy grants again the epochs
    /// granted after it was taken.
    pub epoch_clock: Option<WallClock>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            busy_timeout_ms: 5_000,
            clock_timeline: None,
            epoch_clock: Some(crate::clock::system_clock()),
        }
    }
}

impl std::fmt::Debug for SqliteConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SqliteConfig")
            .field("busy_timeout_ms", &self.busy_timeout_ms)
            .field("clock_timeline", &self.clock_timeline)
            .field("epoch_clock", &self.epoch_clock.as_ref().map(|clock| clock()))
            .finish()
    }
}

/// The table of the database's own settings (the clock's time line).
const SETTINGS_TABLE: &str = "fencepost_settings";
/// The published frontiers (rule H1): per agent and device, the largest next seq published.
const FRONTIERS_TABLE: &str = "fencepost_frontiers";
/// Raises a device's published next seq; the head (`last_op_id`, the id of its record
/// `next_seq - 1`) goes with the larger count, and for an equal count the first one stays.
const PUBLISH: &str =
    "INSERT INTO fencepost_frontiers (agent_id, device_id, next_seq, last_op_id) VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (agent_id, device_id) DO UPDATE SET
        last_op_id = CASE WHEN excluded.next_seq > next_seq THEN excluded.last_op_id
                          WHEN excluded.next_seq = next_seq THEN coalesce(last_op_id, excluded.last_op_id)
                          ELSE last_op_id END,
        next_seq = max(next_seq, excluded.next_seq)";
const PUBLISHED: &str = "SELECT device_id, next_seq, last_op_id FROM fencepost_frontiers WHERE agent_id = ?1";

/// A lease coordinator in a SQLite database file: durable, and safe for many processes **on one
/// host**.
///
/// * One table, `fencepost_leases`, one row per agent: holder, epoch, expiry, epoch floor.
/// * Write-ahead log, `synchronous = FULL`: a granted epoch is on disk before `acquire` returns,
///   so a crash (of the process or of the machine) never lets an epoch be granted twice. The
///   last process to close the file checkpoints the log into it, so a copy of the file taken
///   while no process has it open holds every grant (an operator's `cp` backup).
/// * Epochs are at least the wall clock in milliseconds ([`SqliteConfig::epoch_clock`]), so that
///   a file restored from an older copy, or replaced by one, repeats no epoch granted since.
/// * Every operation is a `BEGIN IMMEDIATE` transaction that reads the coordinator clock only once
///   it holds the write lock (so each operation takes effect at one instant of that clock); `renew`
///   is one `UPDATE … RETURNING` statement in it. `current` takes the lock too, so that it never
///   returns the state a write in flight is replacing. Writers in other processes wait up to
///   [`SqliteConfig::busy_timeout_ms`].
/// * The coordinator clock is the injected [`WallClock`]: every process that shares the file must
///   use the same clock. The wall clock can step (NTP, a VM resumed): an expiry then comes early
///   or late. A clock that counts from boot does not step; give its boot id as
///   [`SqliteConfig::clock_timeline`] so that a reboot expires every lease. The `fencepost`
///   command does so on Linux (`CLOCK_BOOTTIME` and `/proc/sys/kernel/random/boot_id`).
///
/// **Not across hosts.** SQLite's locking needs one kernel. A database file on a synced folder
/// (Dropbox, Syncthing) or a network file system gives no mutual exclusion at all: two hosts can
/// each be granted the same epoch. Use the PostgreSQL coordinator for several hosts, and keep
/// synced folders for the ledger (the relay), which is built for them.
///
/// Opening refuses a file that is not a SQLite database, or that belongs to another application
/// (another `application_id`, or tables of its own): an existing database is never overwritten.
///
/// ```
/// use fencepost::backend::sqlite::SqliteLeaseCoordinator;
/// use fencepost::clock::system_clock;
/// use fencepost::lease::LeaseCoordinator;
///
/// let folder = tempfile::tempdir()?;
/// let coordinator = SqliteLeaseCoordinator::open(folder.path().join("leases.db"), system_clock())?;
/// let lease = coordinator.acquire("milo", "laptop", 30_000)?;
/// // At least the wall clock in milliseconds (SqliteConfig::epoch_clock).
/// assert!(lease.epoch > 1_700_000_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SqliteLeaseCoordinator {
    path: PathBuf,
    clock: WallClock,
    epoch_clock: Option<WallClock>,
    connection: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteLeaseCoordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SqliteLeaseCoordinator")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn failure(
    message: impl Into<String>,
    may_have_applied: bool,
    source: Option<rusqlite::Error>,
) -> LeaseError {
    LeaseError::Backend(BackendError {
        backend: "sqlite",
        message: message.into(),
        may_have_applied,
        transient: false,
        source: source.map(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
    })
}

/// A failure of a statement or transaction. `writing` says whether the failed step could have
/// committed (an I/O error while committing leaves the outcome unknown).
/// What a busy or locked SQLite error means, as the coordinator and the ledger say it.
pub(crate) const BUSY_HINT: &str = " (another process held the database longer than the busy timeout)";

fn sqlite_failure(context: &str, error: rusqlite::Error, writing: bool) -> LeaseError {
    let code = error.sqlite_error_code();
    let may_have_applied = writing
        && matches!(
            code,
            Some(ErrorCode::SystemIoFailure | ErrorCode::DiskFull | ErrorCode::Unknown)
        );
    let hint = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => BUSY_HINT,
        Some(ErrorCode::ReadOnly) => " (the database or its folder is read-only)",
        Some(ErrorCode::NotADatabase) => " (the file is not a SQLite database)",
        _ => "",
    };
    let failed = failure(format!("{context}: {error}{hint}"), may_have_applied, Some(error));
    match (failed, code) {
        // Another process held the file: it may let go.
        (LeaseError::Backend(mut backend), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)) => {
            backend.transient = true;
            LeaseError::Backend(backend)
        }
        (failed, _) => failed,
    }
}

/// The conversions to and from this backend's signed 64-bit columns.
const COLUMNS: Columns = Columns { backend: "sqlite" };

/// Switches `connection`'s file to write-ahead logging, waiting up to `wait` for other
/// connections. Switching needs the file to itself, and SQLite does not wait for that through
/// the busy handler when another process opens the same new file at the same moment. The SQLite
/// coordinator and the SQLite relay both open files this way.
pub(crate) fn switch_to_wal(connection: &Connection, wait: Duration) -> rusqlite::Result<String> {
    let limit = crate::clock::RealTimeLimit::starting_now(wait);
    loop {
        match connection.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(error, _))
                if error.code == rusqlite::ErrorCode::DatabaseBusy && !limit.passed() =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            outcome => return outcome,
        }
    }
}

/// A register row: holder, epoch, expiry, floor.
type Row = (Option<String>, i64, i64, i64);

impl SqliteLeaseCoordinator {
    /// The coordinator clock's reading (the clock every decision of this coordinator uses).
    pub fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on this coordinator's connection (for example a benchmark's own statements, or
    /// the caller's tables in the same file). Do not write the `fencepost_leases` table.
    pub fn with_connection<R>(&self, work: impl FnOnce(&Connection) -> R) -> R {
        work(&self.lock())
    }

    /// Every agent the coordinator has a register of (held, released or never granted but with
    /// a raised floor), in order: `fencepost status` asks each for what its holders published.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the file cannot be read.
    pub fn agents(&self) -> Result<Vec<String>, LeaseError> {
        let connection = self.lock();
        connection
            .prepare_cached(AGENTS)
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|error| sqlite_failure("list the agents", error, false))
    }

    /// Every lease with a holder (expired or not), in agent order: what an operator lists.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the database cannot be read.
    pub fn list(&self) -> Result<Vec<Lease>, LeaseError> {
        let connection = self.lock();
        let rows = connection
            .prepare_cached(LIST)
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, i64>(2)?,
                            row.get::<_, i64>(3)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|error| sqlite_failure("list", error, false))?;
        rows.into_iter()
            .map(|(agent_id, holder, epoch, expires_at_ms)| {
                Ok(Lease {
                    agent_id,
                    holder,
                    epoch: COLUMNS.stored(epoch, "epoch")?,
                    expires_at_ms: COLUMNS.stored(expires_at_ms, "expires_at_ms")?,
                })
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while the lock was held rolled back any open transaction (rusqlite rolls back on
        // drop), so the connection is usable.
        self.connection.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a write transaction (`BEGIN IMMEDIATE`: the write lock is held from here) and reads
    /// the coordinator clock, so that the operation takes effect at that instant of the clock.
    fn begin_write<'c>(
        &self,
        connection: &'c mut Connection,
        operation: &str,
    ) -> Result<(Transaction<'c>, u64), LeaseError> {
        let transaction = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|error| sqlite_failure(&format!("{operation}: cannot begin"), error, false))?;
        Ok((transaction, (self.clock)()))
    }

    fn read_row(connection: &Connection, agent_id: &str) -> Result<Option<Row>, rusqlite::Error> {
        connection
            .prepare_cached(SELECT_ROW)?
            .query_row([agent_id], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
    }

    /// Grants the lease in `transaction` at `now_ms` (rule L1), at an epoch not below the epoch
    /// clock (rule L5), or says why not.
    fn grant(
        &self,
        transaction: &Transaction<'_>,
        now_ms: u64,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<Lease, LeaseError> {
        let row =
            Self::read_row(transaction, agent_id).map_err(|error| sqlite_failure("acquire", error, false))?;
        let (last_epoch, floor) = match &row {
            Some((holder, epoch, expires_at_ms, floor)) => {
                let expires_at_ms = COLUMNS.stored(*expires_at_ms, "expires_at_ms")?;
                if let Some(holder) = holder {
                    if now_ms < expires_at_ms {
                        return Err(LeaseError::Held {
                            agent_id: agent_id.to_owned(),
                            holder: holder.clone(),
                            epoch: COLUMNS.stored(*epoch, "epoch")?,
                            expires_at_ms,
                        });
                    }
                }
                (COLUMNS.stored(*epoch, "epoch")?, COLUMNS.stored(*floor, "floor")?)
            }
            None => (0, 0),
        };
        let last_epoch = last_epoch.max(floor);
        if last_epoch >= MAX_EPOCH {
            return Err(LeaseError::EpochsExhausted {
                agent_id: agent_id.to_owned(),
                last_epoch,
            });
        }
        // Read with the write lock held, like the coordinator clock: no grant comes between.
        let clock_ms = self.epoch_clock.as_ref().map_or(0, |clock| clock());
        let epoch = (last_epoch + 1).max(clock_ms.min(MAX_EPOCH));
        let expires_at_ms = expiry_after(now_ms, ttl_ms);
        let (stored_epoch, stored_expiry) = (
            COLUMNS.storable(epoch, "epoch")?,
            COLUMNS.storable(expires_at_ms, "expiry")?,
        );
        transaction
            .prepare_cached(GRANT)
            .and_then(|mut statement| {
                statement.execute(params![agent_id, device_id, stored_epoch, stored_expiry])
            })
            .map_err(|error| sqlite_failure("acquire", error, false))?;
        Ok(Lease {
            agent_id: agent_id.to_owned(),
            holder: device_id.to_owned(),
            epoch,
            expires_at_ms,
        })
    }

    /// Extends the holder's lease in `transaction` at `now_ms` (rule L2), or says it is lost.
    fn extend(
        transaction: &Transaction<'_>,
        now_ms: u64,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<Lease, LeaseError> {
        let expires_at_ms = expiry_after(now_ms, ttl_ms);
        let stored_expiry = COLUMNS.storable(expires_at_ms, "expiry")?;
        // One statement: extends the expiry only for the holder at its epoch, and returns the row
        // either way, so that a Lost verdict reports the epoch of the same instant.
        let row: Option<(Option<String>, i64, i64)> = transaction
            .prepare_cached(RENEW)
            .and_then(|mut statement| {
                statement
                    .query_row(
                        params![agent_id, device_id, claimed(epoch), stored_expiry],
                        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                    )
                    .optional()
            })
            .map_err(|error| sqlite_failure("renew", error, false))?;
        match row {
            Some((Some(holder), current, stored_expiry))
                if holder == device_id && COLUMNS.stored(current, "epoch")? == epoch =>
            {
                Ok(Lease {
                    agent_id: agent_id.to_owned(),
                    holder,
                    epoch,
                    expires_at_ms: COLUMNS.stored(stored_expiry, "expires_at_ms")?,
                })
            }
            Some((_, current, _)) => Err(COLUMNS.lost(agent_id, epoch, current)),
            None => Err(COLUMNS.lost(agent_id, epoch, 0)),
        }
    }

    /// `Lost` unless `device_id` holds the agent at `epoch` (expired or not).
    fn check_holder(
        transaction: &Transaction<'_>,
        operation: &str,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
    ) -> Result<(), LeaseError> {
        let row =
            Self::read_row(transaction, agent_id).map_err(|error| sqlite_failure(operation, error, false))?;
        match &row {
            Some((Some(holder), current, _, _)) if holder == device_id && *current == claimed(epoch) => {
                Ok(())
            }
            other => Err(COLUMNS.lost(agent_id, epoch, other.as_ref().map_or(0, |row| row.1))),
        }
    }

    /// Merges `frontier` into the agent's published frontier (rule H1), in `transaction`.
    fn write_frontier(
        transaction: &Transaction<'_>,
        agent_id: &str,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        let mut statement = transaction
            .prepare_cached(PUBLISH)
            .map_err(|error| sqlite_failure("publish_frontier", error, false))?;
        for (device, next_seq) in frontier.iter() {
            let head = frontier.head(device).map(|head| head.to_string());
            let next_seq = COLUMNS.storable(next_seq, "next seq")?;
            statement
                .execute(params![agent_id, device, next_seq, head])
                .map_err(|error| sqlite_failure("publish_frontier", error, false))?;
        }
        Ok(())
    }

    /// The agent's published frontier.
    fn read_frontier(connection: &Connection, agent_id: &str) -> Result<Frontier, LeaseError> {
        let rows = connection
            .prepare_cached(PUBLISHED)
            .and_then(|mut statement| {
                statement
                    .query_map([agent_id], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, i64>(1)?,
                            row.get::<_, Option<String>>(2)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|error| sqlite_failure("published_frontier", error, false))?;
        let mut frontier = Frontier::new();
        for (device, next_seq, head) in rows {
            let head = head.map(|head| COLUMNS.head(&head)).transpose()?;
            frontier.raise_to(&device, COLUMNS.stored(next_seq, "next seq")?, head);
        }
        Ok(frontier)
    }

    /// Releases (rule L3), publishing `frontier` first in the same transaction when given.
    fn release_with(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: Option<&Frontier>,
    ) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        let mut connection = self.lock();
        let (transaction, _) = self.begin_write(&mut connection, "release")?;
        Self::check_holder(&transaction, "release", agent_id, device_id, epoch)?;
        if let Some(frontier) = frontier {
            if let Err(error) = Self::write_frontier(&transaction, agent_id, frontier) {
                tracing::warn!(agent_id, %error, "cannot publish before the release; releasing");
            }
        }
        transaction
            .prepare_cached(RELEASE)
            .and_then(|mut statement| statement.execute([agent_id]))
            .map_err(|error| sqlite_failure("release", error, false))?;
        transaction
            .commit()
            .map_err(|error| sqlite_failure("release: commit failed", error, true))
    }
}

impl LeaseCoordinator for SqliteLeaseCoordinator {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let mut connection = self.lock();
        let (transaction, now_ms) = self.begin_write(&mut connection, "acquire")?;
        let lease = self.grant(&transaction, now_ms, agent_id, device_id, ttl_ms)?;
        transaction
            .commit()
            .map_err(|error| sqlite_failure("acquire: commit failed", error, true))?;
        Ok(lease)
    }

    fn acquire_handing_over(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<(Lease, Option<Frontier>), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let mut connection = self.lock();
        let (transaction, now_ms) = self.begin_write(&mut connection, "acquire")?;
        let lease = self.grant(&transaction, now_ms, agent_id, device_id, ttl_ms)?;
        // In the grant's transaction: what every earlier holder published (rule H3).
        let published = Self::read_frontier(&transaction, agent_id).ok();
        transaction
            .commit()
            .map_err(|error| sqlite_failure("acquire: commit failed", error, true))?;
        Ok((lease, published))
    }

    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let mut connection = self.lock();
        // The clock is read inside the write transaction, so that the new expiry is computed at the
        // instant the renew takes effect (another connection may commit in between otherwise).
        let (transaction, now_ms) = self.begin_write(&mut connection, "renew")?;
        let renewed = Self::extend(&transaction, now_ms, agent_id, device_id, epoch, ttl_ms);
        transaction
            .commit()
            .map_err(|error| sqlite_failure("renew: commit failed", error, true))?;
        renewed
    }

    fn renew_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
        frontier: &Frontier,
    ) -> Result<(Lease, bool), LeaseError> {
        validate_publish(agent_id, device_id, frontier)?;
        validate_ttl(ttl_ms)?;
        let mut connection = self.lock();
        let (transaction, now_ms) = self.begin_write(&mut connection, "renew")?;
        let renewed = Self::extend(&transaction, now_ms, agent_id, device_id, epoch, ttl_ms);
        // Published only by the holder that was just renewed, in the same transaction.
        let published = renewed.is_ok() && Self::write_frontier(&transaction, agent_id, frontier).is_ok();
        transaction
            .commit()
            .map_err(|error| sqlite_failure("renew: commit failed", error, true))?;
        Ok((renewed?, published))
    }

    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        self.release_with(agent_id, device_id, epoch, None)
    }

    fn release_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        validate_frontier(frontier)?;
        self.release_with(agent_id, device_id, epoch, Some(frontier))
    }

    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        let mut connection = self.lock();
        // A write transaction, though it writes nothing: a plain read would not wait for a write
        // that has read the clock but not yet committed, and could return the state that write
        // replaces after the clock had moved on (the linearizability check found it). Nothing is
        // written, so ending it (a rollback) syncs nothing.
        let (transaction, _) = self.begin_write(&mut connection, "current")?;
        let row = Self::read_row(&transaction, agent_id)
            .map_err(|error| sqlite_failure("current", error, false))?;
        drop(transaction);
        match row {
            Some((Some(holder), epoch, expires_at_ms, _)) => Ok(Some(Lease {
                agent_id: agent_id.to_owned(),
                holder,
                epoch: COLUMNS.stored(epoch, "epoch")?,
                expires_at_ms: COLUMNS.stored(expires_at_ms, "expires_at_ms")?,
            })),
            _ => Ok(None),
        }
    }

    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_epoch_floor(floor)?;
        let stored_floor = COLUMNS.storable(floor, "epoch floor")?;
        let connection = self.lock();
        connection
            .prepare_cached(RAISE_FLOOR)
            .and_then(|mut statement| statement.execute(params![agent_id, stored_floor]))
            .map(drop)
            .map_err(|error| sqlite_failure("raise_epoch_floor", error, true))
    }

    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        validate_publish(agent_id, device_id, frontier)?;
        let mut connection = self.lock();
        let (transaction, _) = self.begin_write(&mut connection, "publish_frontier")?;
        Self::check_holder(&transaction, "publish_frontier", agent_id, device_id, epoch)?;
        Self::write_frontier(&transaction, agent_id, frontier)?;
        transaction
            .commit()
            .map_err(|error| sqlite_failure("publish_frontier: commit failed", error, true))
    }

    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        let connection = self.lock();
        Self::read_frontier(&connection, agent_id)
    }
}
