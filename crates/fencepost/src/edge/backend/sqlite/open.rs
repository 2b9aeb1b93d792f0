//! Opening a SQLite coordinator: the file, its settings and pragmas, the schema and its
//! upgrades, and the epoch clock's timeline.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::{
    failure, sqlite_failure, switch_to_wal, SqliteConfig, SqliteLeaseCoordinator, FRONTIERS_TABLE,
    SELECT_ROW, SETTINGS_TABLE, SQLITE_APPLICATION_ID, TABLE,
};
use crate::clock::WallClock;
use crate::lease::LeaseError;

impl SqliteLeaseCoordinator {
    /// Opens (or creates) the database at `path` with the default settings.
    pub fn open(path: impl AsRef<Path>, clock: WallClock) -> Result<Self, LeaseError> {
        Self::open_with(path, clock, SqliteConfig::default())
    }

    /// Opens (or creates) the database at `path`.
    pub fn open_with(
        path: impl AsRef<Path>,
        clock: WallClock,
        config: SqliteConfig,
    ) -> Result<Self, LeaseError> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        if path.is_dir() {
            return Err(failure(
                format!("{shown} is a folder; give the path of a database file"),
                false,
                None,
            ));
        }
        let connection = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| sqlite_failure(&format!("cannot open {shown}"), error, false))?;
        connection
            .busy_timeout(Duration::from_millis(config.busy_timeout_ms))
            .map_err(|error| sqlite_failure(&format!("cannot configure {shown}"), error, false))?;
        let application_id = Self::check_owner(&connection, &shown)?;
        switch_to_wal(&connection, Duration::from_millis(config.busy_timeout_ms)).map_err(|error| {
            sqlite_failure(
                &format!("cannot switch {shown} to write-ahead logging"),
                error,
                false,
            )
        })?;
        connection
            .pragma_update(None, "synchronous", "FULL")
            .map_err(|error| sqlite_failure(&format!("cannot configure {shown}"), error, false))?;
        Self::create_schema(&connection, &shown, application_id)?;
        // A file made before published heads were kept (fencepost 0.1 of session 7) gains the
        // column; a fencepost of then still works with it (it names its columns).
        Self::add_head_column(&connection)
            .map_err(|error| sqlite_failure(&format!("cannot upgrade {shown}"), error, true))?;
        if let Some(timeline) = &config.clock_timeline {
            Self::enter_timeline(&connection, timeline).map_err(|error| {
                sqlite_failure(
                    &format!("cannot check the clock's time line in {shown}"),
                    error,
                    true,
                )
            })?;
        }
        // A table of the same name but another shape is refused here, before any operation.
        connection.prepare(SELECT_ROW).map_err(|error| {
            sqlite_failure(
                &format!("{shown} has an incompatible {TABLE} table"),
                error,
                false,
            )
        })?;
        Ok(Self {
            path,
            clock,
            epoch_clock: config.epoch_clock,
            connection: Mutex::new(connection),
        })
    }

    /// The file's application id, after checking that no other application owns the file (by
    /// its id, or by tables of its own in a file with none).
    fn check_owner(connection: &Connection, shown: &str) -> Result<i32, LeaseError> {
        let application_id: i32 = connection
            .pragma_query_value(None, "application_id", |row| row.get(0))
            .map_err(|error| sqlite_failure(&format!("cannot read {shown}"), error, false))?;
        if application_id != 0 && application_id != SQLITE_APPLICATION_ID {
            return Err(failure(
                format!("{shown} is the database of another application (application_id {application_id:#x}); fencepost will not write into it"),
                false,
                None,
            ));
        }
        if application_id == 0 {
            let foreign: i64 = connection
                .query_row(
                    "SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' AND name NOT IN (?1, ?2, ?3)",
                    [TABLE, SETTINGS_TABLE, FRONTIERS_TABLE],
                    |row| row.get(0),
                )
                .map_err(|error| sqlite_failure(&format!("cannot read {shown}"), error, false))?;
            if foreign > 0 {
                return Err(failure(
                    format!("{shown} already holds tables of another application; fencepost will not write into it (give it a file of its own)"),
                    false,
                    None,
                ));
            }
        }
        Ok(application_id)
    }

    /// Creates the tables and sets the application id, unless a file of fencepost's has them
    /// (the schema is created once; later opens only read).
    fn create_schema(connection: &Connection, shown: &str, application_id: i32) -> Result<(), LeaseError> {
        // The schema is created once; later opens only read (a write lock here would make every
        // open wait for a busy database).
        let tables: i64 = connection
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN (?1, ?2, ?3)",
                [TABLE, SETTINGS_TABLE, FRONTIERS_TABLE],
                |row| row.get(0),
            )
            .map_err(|error| sqlite_failure(&format!("cannot read {shown}"), error, false))?;
        if tables < 3 || application_id == 0 {
            connection
                .execute_batch(&format!(
                    "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS {TABLE} (
                     agent_id TEXT PRIMARY KEY NOT NULL,
                     holder TEXT,
                     epoch INTEGER NOT NULL CHECK (epoch >= 0),
                     expires_at_ms INTEGER NOT NULL CHECK (expires_at_ms >= 0),
                     floor INTEGER NOT NULL CHECK (floor >= 0)
                 ) STRICT, WITHOUT ROWID;
                 CREATE TABLE IF NOT EXISTS {SETTINGS_TABLE} (
                     key TEXT PRIMARY KEY NOT NULL,
                     value TEXT NOT NULL
                 ) STRICT, WITHOUT ROWID;
                 CREATE TABLE IF NOT EXISTS {FRONTIERS_TABLE} (
                     agent_id TEXT NOT NULL,
                     device_id TEXT NOT NULL,
                     next_seq INTEGER NOT NULL CHECK (next_seq >= 0),
                     last_op_id TEXT,
                     PRIMARY KEY (agent_id, device_id)
                 ) STRICT, WITHOUT ROWID;
                 PRAGMA application_id = {SQLITE_APPLICATION_ID};
                 COMMIT;"
                ))
                .map_err(|error| {
                    sqlite_failure(&format!("cannot create the lease table in {shown}"), error, true)
                })?;
        }
        Ok(())
    }

    /// Records `timeline` as the clock's time line; if another one was recorded (or none, by a
    /// coordinator on a wall clock), expires every lease first (see
    /// [`SqliteConfig::clock_timeline`]).
    fn enter_timeline(connection: &Connection, timeline: &str) -> rusqlite::Result<()> {
        let read = |connection: &Connection| -> rusqlite::Result<Option<String>> {
            connection
                .query_row(
                    &format!("SELECT value FROM {SETTINGS_TABLE} WHERE key = 'clock_timeline'"),
                    [],
                    |row| row.get(0),
                )
                .optional()
        };
        // Almost always the same time line: a read, no write lock.
        if read(connection)?.as_deref() == Some(timeline) {
            return Ok(());
        }
        let transaction = rusqlite::Transaction::new_unchecked(connection, TransactionBehavior::Immediate)?;
        let recorded = read(&transaction)?;
        if recorded.as_deref() != Some(timeline) {
            let expired = transaction.execute(
                &format!("UPDATE {TABLE} SET expires_at_ms = 0 WHERE holder IS NOT NULL"),
                [],
            )?;
            tracing::info!(
                expired,
                "the coordinator clock's time line changed (a reboot, or a wall clock before): every lease expired"
            );
            transaction.execute(
                &format!(
                    "INSERT INTO {SETTINGS_TABLE} (key, value) VALUES ('clock_timeline', ?1)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                ),
                [timeline],
            )?;
        }
        transaction.commit()
    }

    /// Adds the `last_op_id` column to a frontiers table made without it (checked again under
    /// the write lock: several processes may open the file at once).
    fn add_head_column(connection: &Connection) -> rusqlite::Result<()> {
        const HAS_COLUMN: &str =
            "SELECT count(*) FROM pragma_table_info('fencepost_frontiers') WHERE name = 'last_op_id'";
        let has = |connection: &Connection| connection.query_row(HAS_COLUMN, [], |row| row.get::<_, i64>(0));
        if has(connection)? > 0 {
            return Ok(());
        }
        connection.execute_batch("BEGIN IMMEDIATE")?;
        let added = has(connection).and_then(|count| {
            if count == 0 {
                connection.execute_batch("ALTER TABLE fencepost_frontiers ADD COLUMN last_op_id TEXT")?;
            }
            connection.execute_batch("COMMIT")
        });
        if added.is_err() {
            let _ = connection.execute_batch("ROLLBACK");
        }
        added
    }
}
