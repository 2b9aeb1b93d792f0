//! [`PostgresLeaseCoordinator`]: leases for many hosts in PostgreSQL (feature `postgres`).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls};

/// A statement parameter.
type Param<'a> = &'a (dyn ToSql + Sync);

use crate::id::{validate_id, IdKind};
use crate::lease::{
    validate_epoch_floor, validate_ttl, BackendError, Lease, LeaseCoordinator, LeaseError, MAX_EXPIRES_AT_MS,
};

/// The database server's clock in milliseconds since the Unix epoch: the coordinator clock.
pub const SERVER_CLOCK_SQL: &str = "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint";

/// Settings of a [`PostgresLeaseCoordinator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// A `postgres://` URL (or a key=value connection string).
    pub url: String,
    /// The schema that holds the `leases` table ([`PostgresLeaseCoordinator::migrate`] creates it).
    pub schema: String,
    /// How long to wait for a connection.
    pub connect_timeout_ms: u64,
    /// How many times one call tries to (re)connect before failing.
    pub connect_attempts: u32,
    /// The SQL expression of the coordinator clock, in milliseconds. Leave it at
    /// [`SERVER_CLOCK_SQL`]: expiry must be decided by the server's clock, never a client's. Tests
    /// replace it with a clock they can move, still read by the server; it must be volatile (read
    /// afresh each time it is evaluated), as `clock_timestamp()` is.
    pub clock_sql: String,
}

impl PostgresConfig {
    /// The defaults for `url`: schema `fencepost`, 5 s connect timeout, 3 attempts, server clock.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "fencepost".to_owned(),
            connect_timeout_ms: 5_000,
            connect_attempts: 3,
            clock_sql: SERVER_CLOCK_SQL.to_owned(),
        }
    }
}

/// A lease coordinator in PostgreSQL: linearizable across hosts, durable, expiry by the server's
/// clock.
///
/// * One table, `<schema>.leases`, made by the idempotent [`migrate`](Self::migrate).
/// * Every operation is one statement, linearized by PostgreSQL's row locks; `acquire` is
///   `INSERT … ON CONFLICT … DO UPDATE … WHERE <free or expired> RETURNING …`. When a verdict
///   (`Held`, `Lost`) needs the current row, a follow-up read supplies it, taken at an instant where
///   the verdict still holds.
/// * Time is the **server's** clock (`clock_timestamp()`): clients whose clocks disagree by hours
///   behave identically.
/// * A lost connection is a [`BackendError`]: `may_have_applied` is true when a write was sent and
///   its answer lost (resolve with [`current`](LeaseCoordinator::current)); the next call
///   reconnects (at most [`PostgresConfig::connect_attempts`] tries).
///
/// Deployment: give the coordinator a role that owns its schema (or has `USAGE` on it and
/// `SELECT, INSERT, UPDATE` on `leases`); run PostgreSQL with synchronous replication
/// (`synchronous_commit = on` with a synchronous standby) so that a fail-over cannot lose a granted
/// epoch; and, as the second line of defence, seed [`raise_epoch_floor`](LeaseCoordinator::raise_epoch_floor)
/// from the ledger after a fail-over or restore.
pub struct PostgresLeaseCoordinator {
    config: PostgresConfig,
    table: String,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PostgresLeaseCoordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PostgresLeaseCoordinator")
            .field("schema", &self.config.schema)
            .finish_non_exhaustive()
    }
}

fn failure(message: impl Into<String>, may_have_applied: bool, source: Option<postgres::Error>) -> LeaseError {
    LeaseError::Backend(BackendError {
        backend: "postgres",
        message: message.into(),
        may_have_applied,
        source: source.map(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
    })
}

/// Whether `error` left the statement's outcome unknown: the connection closed or failed (the
/// answer may be lost), or the server ended the session. An error the server reported for the
/// statement itself, or one raised before anything was sent (a parameter that cannot be encoded),
/// means it did not apply.
fn outcome_unknown(error: &postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        Some(code) => {
            *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || code.code().starts_with("08")
        }
        None => std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>()),
    }
}

/// Quotes an SQL identifier.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn stored(value: i64, column: &str) -> Result<u64, LeaseError> {
    u64::try_from(value).map_err(|_| failure(format!("corrupt row: {column} is {value}"), false, None))
}

fn storable(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl PostgresLeaseCoordinator {
    /// Connects (a bounded number of attempts). Call [`migrate`](Self::migrate) once per database
    /// before the first use.
    pub fn connect(config: PostgresConfig) -> Result<Self, LeaseError> {
        if config.schema.is_empty() || config.schema.len() > 63 {
            return Err(failure(
                format!("schema name {:?} must be 1 to 63 bytes", config.schema),
                false,
                None,
            ));
        }
        let table = format!("{}.leases", quote_identifier(&config.schema));
        let coordinator = Self {
            config,
            table,
            client: Mutex::new(None),
        };
        let client = coordinator.new_client()?;
        *coordinator.client.lock().unwrap_or_else(PoisonError::into_inner) = Some(client);
        Ok(coordinator)
    }

    /// The settings.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    fn new_client(&self) -> Result<Client, LeaseError> {
        let mut settings: postgres::Config = self.config.url.parse().map_err(|error| {
            failure(format!("invalid PostgreSQL URL: {error}"), false, Some(error))
        })?;
        settings.connect_timeout(Duration::from_millis(self.config.connect_timeout_ms));
        settings.application_name("fencepost");
        let mut last = None;
        for attempt in 0..self.config.connect_attempts.max(1) {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100 << attempt.min(5)));
            }
            match settings.connect(NoTls) {
                Ok(client) => return Ok(client),
                Err(error) => {
                    let permanent = error.code().is_some_and(|code| {
                        *code == SqlState::INVALID_PASSWORD
                            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                            || *code == SqlState::INVALID_CATALOG_NAME
                    });
                    last = Some(error);
                    if permanent {
                        break;
                    }
                }
            }
        }
        let error = last.expect("at least one attempt was made");
        Err(failure(
            format!("cannot connect to PostgreSQL: {}", describe(&error)),
            false,
            Some(error),
        ))
    }

    /// Creates the schema and the `leases` table if they do not exist. Idempotent, and safe to run
    /// from several processes at once.
    pub fn migrate(&self) -> Result<(), LeaseError> {
        let schema = quote_identifier(&self.config.schema);
        let sql = format!(
            "SELECT pg_advisory_xact_lock(7046837213749);
             CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {table} (
                 agent_id text PRIMARY KEY,
                 holder text,
                 epoch bigint NOT NULL CHECK (epoch >= 0),
                 expires_at_ms bigint NOT NULL CHECK (expires_at_ms >= 0),
                 floor bigint NOT NULL DEFAULT 0 CHECK (floor >= 0)
             );",
            table = self.table
        );
        self.with_client(|client| {
            let mut transaction = client.transaction()?;
            transaction.batch_execute(&sql)?;
            transaction.commit()
        })
        .map_err(|error| self.explain("migrate", error))
    }

    /// Runs `work` with a connected client, reconnecting first if the last connection broke.
    fn with_client<T>(
        &self,
        work: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, CallError> {
        let mut slot = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = None;
            *slot = Some(self.new_client().map_err(CallError::Connect)?);
        }
        let client = slot.as_mut().expect("connected above");
        match work(client) {
            Ok(value) => Ok(value),
            Err(error) => {
                if outcome_unknown(&error) {
                    *slot = None; // reconnect on the next call
                }
                Err(CallError::Statement(error))
            }
        }
    }

    fn explain(&self, operation: &str, error: CallError) -> LeaseError {
        self.explain_write(operation, error, false)
    }

    fn explain_write(&self, operation: &str, error: CallError, write: bool) -> LeaseError {
        match error {
            CallError::Connect(error) => error,
            CallError::Statement(error) => {
                let unknown = outcome_unknown(&error);
                let hint = match error.code() {
                    Some(code) if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::INVALID_SCHEMA_NAME => {
                        " (the schema or table is missing: run migrate() first, or check the schema name)"
                    }
                    Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => {
                        " (the role lacks privileges on the fencepost schema)"
                    }
                    _ if unknown => " (the connection was lost; the next call reconnects)",
                    _ => "",
                };
                failure(
                    format!("{operation}: {}{hint}", describe(&error)),
                    write && unknown,
                    Some(error),
                )
            }
        }
    }

    /// Reads the row and the server clock at one instant: `(holder, epoch, expires_at_ms, now_ms)`.
    fn read_with_clock(client: &mut Client, table: &str, clock: &str, agent_id: &str) -> Result<Option<(Option<String>, i64, i64, i64)>, postgres::Error> {
        let rows = client.query(
            &format!("SELECT holder, epoch, expires_at_ms, {clock} FROM {table} WHERE agent_id = $1"),
            &[&agent_id],
        )?;
        Ok(rows.first().map(|row| (row.get(0), row.get(1), row.get(2), row.get(3))))
    }
}

/// Why a call failed: before a statement could be sent, or in the statement.
enum CallError {
    Connect(LeaseError),
    Statement(postgres::Error),
}

impl From<postgres::Error> for CallError {
    fn from(error: postgres::Error) -> Self {
        CallError::Statement(error)
    }
}

fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

/// How many times `acquire` retries when the lease changes between its statement and the read of
/// the holder's details.
const ACQUIRE_ATTEMPTS: usize = 8;

impl LeaseCoordinator for PostgresLeaseCoordinator {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let (table, clock) = (&self.table, &self.config.clock_sql);
        // The clock is read in the conflict branch's WHERE and SET, which PostgreSQL evaluates after
        // it has locked the row: the decision and the new expiry belong to one instant. (A CTE or
        // a subquery would be evaluated before a wait for the lock, with a stale time.)
        let grant = format!(
            "INSERT INTO {table} AS lease (agent_id, holder, epoch, expires_at_ms, floor)
             VALUES ($1, $2, 1, least({clock}::numeric + $3::bigint, {MAX_EXPIRES_AT_MS})::bigint, 0)
             ON CONFLICT (agent_id) DO UPDATE
                 SET holder = excluded.holder,
                     epoch = greatest(lease.epoch, lease.floor) + 1,
                     expires_at_ms = least({clock}::numeric + $3::bigint, {MAX_EXPIRES_AT_MS})::bigint
                 WHERE lease.holder IS NULL OR lease.expires_at_ms <= {clock}
             RETURNING epoch, expires_at_ms"
        );
        let ttl = storable(ttl_ms);
        for _ in 0..ACQUIRE_ATTEMPTS {
            let outcome = self.with_client(|client| {
                let granted = client.query_opt(&grant, &[&agent_id as Param, &device_id, &ttl])?;
                if let Some(row) = granted {
                    return Ok(Ok((row.get::<_, i64>(0), row.get::<_, i64>(1))));
                }
                // Refused: the lease was valid. Read who holds it, at an instant where it still is.
                Ok(Err(Self::read_with_clock(client, table, clock, agent_id)?))
            });
            match outcome.map_err(|error| self.explain_write("acquire", error, true))? {
                Ok((epoch, expires_at_ms)) => {
                    return Ok(Lease {
                        agent_id: agent_id.to_owned(),
                        holder: device_id.to_owned(),
                        epoch: stored(epoch, "epoch")?,
                        expires_at_ms: stored(expires_at_ms, "expires_at_ms")?,
                    })
                }
                Err(Some((Some(holder), epoch, expires_at_ms, now_ms))) if now_ms < expires_at_ms => {
                    return Err(LeaseError::Held {
                        agent_id: agent_id.to_owned(),
                        holder,
                        epoch: stored(epoch, "epoch")?,
                        expires_at_ms: stored(expires_at_ms, "expires_at_ms")?,
                    })
                }
                // Released or expired in between: try to take it again.
                Err(_) => continue,
            }
        }
        Err(failure(
            format!("acquire: the lease of {agent_id:?} changed {ACQUIRE_ATTEMPTS} times while it was read; try again"),
            false,
            None,
        ))
    }

    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let (table, clock) = (&self.table, &self.config.clock_sql);
        let extend = format!(
            "UPDATE {table} SET expires_at_ms = least({clock}::numeric + $4::bigint, {MAX_EXPIRES_AT_MS})::bigint
             WHERE agent_id = $1 AND holder = $2 AND epoch = $3 RETURNING expires_at_ms"
        );
        let outcome = self
            .with_client(|client| {
                match client.query_opt(&extend, &[&agent_id as Param, &device_id, &storable(epoch), &storable(ttl_ms)])? {
                    Some(row) => Ok(Ok(row.get::<_, i64>(0))),
                    // Not the holder at that epoch; epochs never repeat, so it never will be again.
                    None => Ok(Err(Self::read_with_clock(client, table, clock, agent_id)?.map_or(0, |row| row.1))),
                }
            })
            .map_err(|error| self.explain_write("renew", error, true))?;
        match outcome {
            Ok(expires_at_ms) => Ok(Lease {
                agent_id: agent_id.to_owned(),
                holder: device_id.to_owned(),
                epoch,
                expires_at_ms: stored(expires_at_ms, "expires_at_ms")?,
            }),
            Err(current_epoch) => Err(LeaseError::Lost {
                agent_id: agent_id.to_owned(),
                claimed_epoch: epoch,
                current_epoch: stored(current_epoch, "epoch")?,
            }),
        }
    }

    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        let (table, clock) = (&self.table, &self.config.clock_sql);
        let clear = format!("UPDATE {table} SET holder = NULL WHERE agent_id = $1 AND holder = $2 AND epoch = $3 RETURNING epoch");
        let outcome = self
            .with_client(|client| match client.query_opt(&clear, &[&agent_id as Param, &device_id, &storable(epoch)])? {
                Some(_) => Ok(None),
                None => Ok(Some(Self::read_with_clock(client, table, clock, agent_id)?.map_or(0, |row| row.1))),
            })
            .map_err(|error| self.explain_write("release", error, true))?;
        match outcome {
            None => Ok(()),
            Some(current_epoch) => Err(LeaseError::Lost {
                agent_id: agent_id.to_owned(),
                claimed_epoch: epoch,
                current_epoch: stored(current_epoch, "epoch")?,
            }),
        }
    }

    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        let (table, clock) = (&self.table, &self.config.clock_sql);
        let row = self
            .with_client(|client| Self::read_with_clock(client, table, clock, agent_id))
            .map_err(|error| self.explain("current", error))?;
        match row {
            Some((Some(holder), epoch, expires_at_ms, _)) => Ok(Some(Lease {
                agent_id: agent_id.to_owned(),
                holder,
                epoch: stored(epoch, "epoch")?,
                expires_at_ms: stored(expires_at_ms, "expires_at_ms")?,
            })),
            _ => Ok(None),
        }
    }

    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_epoch_floor(floor)?;
        let statement = format!(
            "INSERT INTO {table} AS lease (agent_id, holder, epoch, expires_at_ms, floor) VALUES ($1, NULL, 0, 0, $2)
             ON CONFLICT (agent_id) DO UPDATE SET floor = greatest(lease.floor, excluded.floor)",
            table = self.table
        );
        self.with_client(|client| client.execute(&statement, &[&agent_id as Param, &storable(floor)]))
            .map(drop)
            .map_err(|error| self.explain_write("raise_epoch_floor", error, true))
    }
}
