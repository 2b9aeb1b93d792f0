//! [`PostgresLeaseCoordinator`]: leases for many hosts in PostgreSQL (feature `postgres`), with a
//! transactional fence for effects stored in the same database.
//!
//! # Deploying it
//!
//! * **Schema and roles.** Run [`PostgresLeaseCoordinator::migrate`] once per database, as a role
//!   that may create the schema (it is idempotent and safe to run from several hosts at once). The
//!   coordinators then need only `USAGE` on the schema and `SELECT, INSERT, UPDATE` on its `leases`
//!   table:
//!
//!   ```sql
//!   CREATE ROLE fencepost_agent LOGIN PASSWORD '…';
//!   GRANT USAGE ON SCHEMA fencepost TO fencepost_agent;
//!   GRANT SELECT, INSERT, UPDATE ON fencepost.leases TO fencepost_agent;
//!   ```
//!
//!   Never grant `DELETE` or `TRUNCATE` on `leases`: a deleted row forgets its epoch, and the next
//!   grant would repeat epoch 1.
//! * **Replication.** A granted epoch must survive a fail-over, or the new primary can grant it a
//!   second time to another site. Run a synchronous standby (`synchronous_standby_names` set and
//!   `synchronous_commit = on` or `remote_apply`) and fail over only to a synchronous standby. With
//!   asynchronous replication a fail-over can lose the last grants.
//! * **The epoch floor is the second line of defence.** After a fail-over to a standby that may lag,
//!   or a restore from a backup, raise every agent's floor
//!   ([`raise_epoch_floor`](LeaseCoordinator::raise_epoch_floor)) to the highest epoch its ledger has
//!   seen ([`SyncState::fencing_epoch`](crate::fold::SyncState::fencing_epoch)): the next grant is
//!   then above every epoch that was ever in use.
//! * **Time** is the database server's clock. Keep it synchronized (NTP) like any server's; the
//!   clients' clocks play no part. A step of the server clock shortens or lengthens leases by the
//!   step; it never makes an epoch repeat.
//!
//! # What the transactional fence covers
//!
//! [`PostgresLeaseCoordinator::fenced_transaction`] runs the caller's statements in one transaction
//! that first locks the agent's lease row and checks the caller's holder and epoch. While that lock is
//! held no other site can take the lease, so the caller's writes commit only if it held the lease at
//! its epoch up to the commit. That closes the window `check_dispatch` leaves open **for effects that
//! are rows in this same PostgreSQL database** (an outbox row that a relay later sends, a ledger
//! entry, a state change). It cannot cover an effect outside the database — an email, a payment API
//! call, a file — even when the call is made inside the closure: the call has happened whether or not
//! the transaction then commits. For those, write an outbox row through the fence and let one sender
//! deliver it with an idempotency key, or pass the epoch to a resource that checks it.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Statement};

/// The `postgres` client crate this backend uses, for the types of
/// [`PostgresLeaseCoordinator::fenced_transaction`]'s closure (`driver::Transaction`, parameter
/// types).
pub use postgres as driver;

use crate::fence::FenceDecision;
use crate::id::{validate_id, IdKind};
use crate::lease::{
    validate_epoch_floor, validate_ttl, BackendError, Lease, LeaseCoordinator, LeaseError, MAX_EPOCH,
    MAX_EXPIRES_AT_MS,
};

/// A statement parameter.
type Param<'a> = &'a (dyn ToSql + Sync);

/// The database server's clock in milliseconds since the Unix epoch: the coordinator clock.
pub const SERVER_CLOCK_SQL: &str = "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint";

/// The longest schema name PostgreSQL keeps (longer names are truncated, silently).
const MAX_SCHEMA_BYTES: usize = 63;

/// How many times `acquire` runs its statement: once more after creating the agent's row, and once
/// more, in a transaction, when a refusal's lease was gone by the time it was read.
const ACQUIRE_ATTEMPTS: usize = 3;

/// Settings of a [`PostgresLeaseCoordinator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// A `postgres://` URL (or a key=value connection string). Sessions are named `fencepost` in
    /// `pg_stat_activity` unless the URL sets `application_name`.
    pub url: String,
    /// The schema that holds the `leases` table ([`PostgresLeaseCoordinator::migrate`] creates it).
    pub schema: String,
    /// How long to wait for a connection.
    pub connect_timeout_ms: u64,
    /// How many times one call tries to (re)connect before failing (at least 1).
    pub connect_attempts: u32,
    /// The longest one statement may run, including a wait for the lease row's lock (held, for
    /// example, by a [`fenced_transaction`](PostgresLeaseCoordinator::fenced_transaction)); past it
    /// the statement is cancelled and has not applied. 0 means no limit.
    pub statement_timeout_ms: u64,
    /// The SQL expression of the coordinator clock, in milliseconds. Leave it at
    /// [`SERVER_CLOCK_SQL`]: expiry must be decided by the server's clock, never a client's. Tests
    /// replace it with a clock they can move, still read by the server; it must be volatile (read
    /// afresh each time it is evaluated), as `clock_timestamp()` is.
    pub clock_sql: String,
}

impl PostgresConfig {
    /// The defaults for `url`: schema `fencepost`, 5 s connect timeout, 3 attempts, 10 s statement
    /// timeout, the server clock.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "fencepost".to_owned(),
            connect_timeout_ms: 5_000,
            connect_attempts: 3,
            statement_timeout_ms: 10_000,
            clock_sql: SERVER_CLOCK_SQL.to_owned(),
        }
    }
}

/// Why a [`fenced_transaction`](PostgresLeaseCoordinator::fenced_transaction) committed nothing, or
/// may have.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedError<E> {
    /// The caller does not hold the lease at its epoch ([`FenceDecision::NotHeld`] or
    /// [`FenceDecision::StaleEpoch`]): the closure did not run and nothing was written.
    #[error("the fence refused the transaction: {0:?}")]
    Refused(FenceDecision),
    /// The closure failed: the transaction was rolled back.
    #[error("the fenced work failed; nothing was committed")]
    Work(#[source] E),
    /// An id was invalid ([`LeaseError::InvalidId`]), or the database failed
    /// ([`LeaseError::Backend`]). Nothing was committed unless [`BackendError::may_have_applied`]
    /// is set, which happens only when the commit itself was sent and its answer lost.
    #[error(transparent)]
    Lease(LeaseError),
}

/// A lease coordinator in PostgreSQL: linearizable across hosts, durable, expiry by the server's
/// clock.
///
/// * One table, `<schema>.leases`, made by the idempotent [`migrate`](Self::migrate).
/// * Each write is one statement, serialized by the lease row's lock, and reads the clock only
///   after it holds that lock: `acquire` is `INSERT … ON CONFLICT … DO UPDATE … WHERE <free or
///   expired> RETURNING …`, `renew` the same with `WHERE <holder and epoch>`, and `release` is
///   `UPDATE … WHERE <holder and epoch> RETURNING …`.
///   A verdict that needs the current row (`Held`, `Lost`) reads it in a second statement, at an
///   instant where the verdict still holds.
/// * Reads take a share lock on the row (`FOR SHARE`), so a read never returns the state a write
///   has already replaced but not yet committed: `current` and the fence are linearizable, not
///   merely snapshot reads.
/// * Time is the **server's** clock (`clock_timestamp()`): clients whose clocks disagree by hours
///   behave identically.
/// * A lost connection is a [`BackendError`]: `may_have_applied` is true when a write was sent and
///   its answer lost (resolve with [`current`](LeaseCoordinator::current)); the next call
///   reconnects (at most [`PostgresConfig::connect_attempts`] tries).
/// * One connection per coordinator, used by one call at a time; open one coordinator per thread
///   for parallel calls.
///
/// See the [module docs](self) for deployment (roles, synchronous replication, the epoch floor).
///
/// ```no_run
/// use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator};
/// use fencepost::lease::LeaseCoordinator;
///
/// let config = PostgresConfig::new("postgres://fencepost_agent:secret@db.internal/app");
/// let coordinator = PostgresLeaseCoordinator::connect(config)?;
/// coordinator.migrate()?; // once per database; idempotent
/// let lease = coordinator.acquire("billing-agent", "laptop", 30_000)?;
/// println!("epoch {} until {} ms (server time)", lease.epoch, lease.expires_at_ms);
/// # Ok::<(), fencepost::lease::LeaseError>(())
/// ```
pub struct PostgresLeaseCoordinator {
    config: PostgresConfig,
    statements: Statements,
    session: Mutex<Option<Session>>,
}

impl std::fmt::Debug for PostgresLeaseCoordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PostgresLeaseCoordinator")
            .field("schema", &self.config.schema)
            .finish_non_exhaustive()
    }
}

/// The SQL of each operation, built once from the schema and clock of the config.
#[derive(Debug)]
struct Statements {
    migrate: String,
    /// `$1` agent, `$2` device, `$3` ttl. Inserts an unheld row for a new agent (no clock read
    /// outside the row lock); grants on a free or expired row. Returns `holder, epoch, expires`.
    acquire: String,
    /// `$1` agent, `$2` device, `$3` epoch, `$4` ttl. Returns `holder, epoch, expires`: the
    /// renewed lease, or an unheld row it just created.
    renew: String,
    /// `$1` agent, `$2` device, `$3` epoch.
    release: String,
    /// `$1` agent. Returns `holder, epoch, expires, now`.
    read: String,
    /// `$1` agent, `$2` floor.
    raise_floor: String,
}

impl Statements {
    fn new(schema: &str, clock: &str) -> Self {
        let schema = quote_identifier(schema);
        let table = format!("{schema}.leases");
        let expiry = |ttl: &str| format!("least(({clock})::numeric + {ttl}, {MAX_EXPIRES_AT_MS})::bigint");
        Self {
            migrate: format!(
                "SELECT pg_advisory_xact_lock(7046837213749);
                 CREATE SCHEMA IF NOT EXISTS {schema};
                 CREATE TABLE IF NOT EXISTS {table} (
                     agent_id text PRIMARY KEY,
                     holder text,
                     epoch bigint NOT NULL CHECK (epoch >= 0),
                     expires_at_ms bigint NOT NULL CHECK (expires_at_ms >= 0),
                     floor bigint NOT NULL DEFAULT 0 CHECK (floor >= 0)
                 );"
            ),
            // PostgreSQL evaluates the conflict branch's WHERE and SET after it has locked the
            // row, so the decision and the new expiry read the clock at one locked instant. The
            // insert branch writes an unheld row and reads no clock: its values are computed
            // before the row exists to be locked, so a grant there could carry an expiry from
            // before a concurrent reader's view. The caller runs the statement again, and the
            // grant happens in the conflict branch.
            acquire: format!(
                "INSERT INTO {table} AS lease (agent_id, holder, epoch, expires_at_ms, floor)
                 VALUES ($1, NULL, 0, 0, 0)
                 ON CONFLICT (agent_id) DO UPDATE
                     SET holder = $2,
                         epoch = greatest(lease.epoch, lease.floor) + 1,
                         expires_at_ms = {expires}
                     WHERE (lease.holder IS NULL OR lease.expires_at_ms <= ({clock}))
                       AND greatest(lease.epoch, lease.floor) < {max_epoch}
                 RETURNING holder, epoch, expires_at_ms",
                expires = expiry("$3::bigint"),
                max_epoch = i64::MAX
            ),
            // Not a plain UPDATE: an UPDATE computes its new values while it scans, before it
            // waits for the row's lock, so a renewal that waited would carry an expiry from
            // before the wait. The conflict branch reads the clock with the row locked. For an
            // agent without a row it inserts an unheld row at epoch 0, which reads as no lease.
            renew: format!(
                "INSERT INTO {table} AS lease (agent_id, holder, epoch, expires_at_ms, floor)
                 VALUES ($1, NULL, 0, 0, 0)
                 ON CONFLICT (agent_id) DO UPDATE
                     SET expires_at_ms = {expires}
                     WHERE lease.holder = $2 AND lease.epoch = $3
                 RETURNING holder, epoch, expires_at_ms",
                expires = expiry("$4::bigint")
            ),
            release: format!(
                "UPDATE {table} SET holder = NULL
                 WHERE agent_id = $1 AND holder = $2 AND epoch = $3 RETURNING epoch"
            ),
            read: format!(
                "SELECT holder, epoch, expires_at_ms, ({clock}) FROM {table} WHERE agent_id = $1 FOR SHARE"
            ),
            raise_floor: format!(
                "INSERT INTO {table} AS lease (agent_id, holder, epoch, expires_at_ms, floor)
                 VALUES ($1, NULL, 0, 0, $2)
                 ON CONFLICT (agent_id) DO UPDATE SET floor = greatest(lease.floor, excluded.floor)"
            ),
        }
    }
}

/// One lease row as read, with the server clock at the read: `(holder, epoch, expires_at_ms,
/// now_ms)`.
type Row = (Option<String>, i64, i64, i64);

/// The coordinator's statements that run through a prepared, cached statement.
#[derive(Debug, Clone, Copy)]
enum Sql {
    Acquire,
    Renew,
    Release,
    Read,
    RaiseFloor,
}

impl Statements {
    fn sql(&self, which: Sql) -> &str {
        match which {
            Sql::Acquire => &self.acquire,
            Sql::Renew => &self.renew,
            Sql::Release => &self.release,
            Sql::Read => &self.read,
            Sql::RaiseFloor => &self.raise_floor,
        }
    }
}

/// A connection, with the statements prepared on it so far: each operation is then one round
/// trip (bind and execute), never a parse.
struct Session {
    client: Client,
    prepared: [Option<Statement>; 5],
}

impl Session {
    fn prepare(&mut self, statements: &Statements, which: Sql) -> Result<Statement, postgres::Error> {
        let slot = &mut self.prepared[which as usize];
        if let Some(statement) = slot {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(statements.sql(which))?;
        *slot = Some(statement.clone());
        Ok(statement)
    }

    fn query_opt(
        &mut self,
        statements: &Statements,
        which: Sql,
        parameters: &[Param],
    ) -> Result<Option<postgres::Row>, postgres::Error> {
        let statement = self.prepare(statements, which)?;
        self.client.query_opt(&statement, parameters)
    }
}

/// The columns of the `read` statement.
fn lease_row(row: &postgres::Row) -> Row {
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

fn failure(
    message: impl Into<String>,
    may_have_applied: bool,
    source: Option<postgres::Error>,
) -> LeaseError {
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

/// Converts a validated `u64` (TTLs and floors are bounded far below `i64::MAX`) for a `bigint`
/// parameter; one beyond `i64::MAX` is an error, never clamped onto a real value (rule L5).
fn storable(value: u64, what: &str) -> Result<i64, LeaseError> {
    i64::try_from(value).map_err(|_| {
        failure(
            format!("{what} {value} is out of the storable range"),
            false,
            None,
        )
    })
}

/// Converts an epoch a caller claims: one beyond `i64::MAX` was never minted, so it becomes -1,
/// which matches no row (it must never be clamped onto a real epoch).
fn claimed(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(-1)
}

fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

/// Why a call failed: before a statement could be sent, or in a statement.
enum CallError {
    Connect(LeaseError),
    Statement(postgres::Error),
}

impl From<postgres::Error> for CallError {
    fn from(error: postgres::Error) -> Self {
        CallError::Statement(error)
    }
}

impl PostgresLeaseCoordinator {
    /// Connects (a bounded number of attempts). Call [`migrate`](Self::migrate) once per database
    /// before the first use.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] for a schema name that is empty or longer than 63 bytes, a URL that
    /// does not parse, a wrong password or database, or a server that cannot be reached.
    pub fn connect(config: PostgresConfig) -> Result<Self, LeaseError> {
        if config.schema.is_empty() || config.schema.len() > MAX_SCHEMA_BYTES || config.schema.contains('\0')
        {
            return Err(failure(
                format!(
                    "schema name {:?} must be 1 to {MAX_SCHEMA_BYTES} bytes, without NUL",
                    config.schema
                ),
                false,
                None,
            ));
        }
        let statements = Statements::new(&config.schema, &config.clock_sql);
        let coordinator = Self {
            config,
            statements,
            session: Mutex::new(None),
        };
        let session = coordinator.new_session()?;
        *coordinator.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(session);
        Ok(coordinator)
    }

    /// The settings.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    fn new_session(&self) -> Result<Session, LeaseError> {
        let mut settings: postgres::Config = self
            .config
            .url
            .parse()
            .map_err(|error| failure(format!("invalid PostgreSQL URL: {error}"), false, Some(error)))?;
        settings.connect_timeout(Duration::from_millis(self.config.connect_timeout_ms));
        if settings.get_application_name().is_none() {
            settings.application_name("fencepost");
        }
        let session = format!(
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED;
             SET statement_timeout = {}",
            self.config.statement_timeout_ms
        );
        let mut last = None;
        for attempt in 0..self.config.connect_attempts.max(1) {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100 << attempt.min(5)));
            }
            match settings
                .connect(NoTls)
                .and_then(|mut client| client.batch_execute(&session).map(|()| client))
            {
                Ok(client) => {
                    return Ok(Session {
                        client,
                        prepared: Default::default(),
                    })
                }
                Err(error) => {
                    let permanent = error.code().is_some_and(|code| {
                        *code == SqlState::INVALID_PASSWORD
                            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                            || *code == SqlState::INVALID_CATALOG_NAME
                    });
                    tracing::debug!(attempt, error = %describe(&error), "PostgreSQL connection attempt failed");
                    last = Some(error);
                    if permanent {
                        break;
                    }
                }
            }
        }
        let Some(error) = last else {
            unreachable!("at least one connection attempt was made");
        };
        Err(failure(
            format!("cannot connect to PostgreSQL: {}", describe(&error)),
            false,
            Some(error),
        ))
    }

    /// Creates the schema and the `leases` table if they do not exist. Idempotent, and safe to run
    /// from several processes at once.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the database refuses (for example, the role may not create the
    /// schema) or the connection fails.
    pub fn migrate(&self) -> Result<(), LeaseError> {
        self.with_session(|session| {
            let mut transaction = session.client.transaction()?;
            transaction.batch_execute(&self.statements.migrate)?;
            transaction.commit()
        })
        .map_err(|error| self.explain("migrate", error, false))
    }

    /// Every lease with a holder (expired or not), in agent order: what an operator lists.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the table cannot be read.
    pub fn list(&self) -> Result<Vec<Lease>, LeaseError> {
        let statement = format!(
            "SELECT agent_id, holder, epoch, expires_at_ms FROM {}.leases WHERE holder IS NOT NULL ORDER BY agent_id",
            quote_identifier(&self.config.schema)
        );
        let rows = self
            .with_session(|session| session.client.query(&statement, &[]))
            .map_err(|error| self.explain("list", error, false))?;
        rows.iter()
            .map(|row| {
                Ok(Lease {
                    agent_id: row.get(0),
                    holder: row.get(1),
                    epoch: stored(row.get(2), "epoch")?,
                    expires_at_ms: stored(row.get(3), "expires_at_ms")?,
                })
            })
            .collect()
    }

    /// Runs `work` in one transaction that commits only if `device_id` holds `agent_id`'s lease at
    /// `epoch` — the **transactional fence**.
    ///
    /// The transaction first locks the lease row (`FOR SHARE`) and checks holder and epoch, as
    /// [`check_dispatch`](crate::fence::check_dispatch) does; only then does `work` run, on the same
    /// transaction. The lock is held until the commit, so no other site can take the lease in
    /// between: `work`'s writes commit if and only if the caller held the lease at its epoch
    /// throughout. A zombie holder whose lease was taken commits nothing. While the transaction
    /// runs, other writes to this agent's lease (including the holder's own renewals) wait, up to
    /// [`PostgresConfig::statement_timeout_ms`]: keep the work short.
    ///
    /// It protects effects that are rows of this database only; see the [module docs](self) for
    /// what it cannot cover. It does not consult the ledger: make the effect idempotent by run id
    /// (a unique key) as well.
    ///
    /// # Errors
    /// * [`FencedError::Refused`]: not the holder at `epoch`; `work` did not run.
    /// * [`FencedError::Work`]: `work` failed; rolled back.
    /// * [`FencedError::Lease`]: an invalid id, or the database failed. `may_have_applied` is set only when the
    ///   commit was sent and its answer lost; then look for the effect's rows to learn the outcome.
    ///
    /// ```no_run
    /// use fencepost::backend::postgres::{FencedError, PostgresConfig, PostgresLeaseCoordinator};
    /// use fencepost::lease::LeaseCoordinator;
    ///
    /// let coordinator = PostgresLeaseCoordinator::connect(PostgresConfig::new("postgres://app@db/app"))?;
    /// let lease = coordinator.acquire("billing-agent", "laptop", 30_000)?;
    /// let outcome = coordinator.fenced_transaction("billing-agent", "laptop", lease.epoch, |transaction| {
    ///     transaction.execute(
    ///         "INSERT INTO outbox (run_id, body) VALUES ($1, $2) ON CONFLICT (run_id) DO NOTHING",
    ///         &[&"run-42", &"invoice #42"],
    ///     )
    /// });
    /// match outcome {
    ///     Ok(rows) => println!("queued {rows} row(s) under epoch {}", lease.epoch),
    ///     Err(FencedError::Refused(decision)) => println!("not ours any more: {decision:?}"),
    ///     Err(other) => return Err(other.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fenced_transaction<T, E>(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        work: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T, E>,
    ) -> Result<T, FencedError<E>> {
        let invalid = |error| FencedError::Lease(LeaseError::from(error));
        validate_id(IdKind::Agent, agent_id).map_err(invalid)?;
        validate_id(IdKind::Device, device_id).map_err(invalid)?;
        enum Step<T, E> {
            Refused(FenceDecision),
            Work(E),
            Done(T),
        }
        let mut commit_sent = false;
        let outcome = self.with_session(|session| {
            let read = session.prepare(&self.statements, Sql::Read)?;
            let mut transaction = session.client.transaction()?;
            let row = transaction.query_opt(&read, &[&agent_id as Param])?;
            let decision = match row.map(|row| (row.get::<_, Option<String>>(0), row.get::<_, i64>(1))) {
                Some((Some(holder), current)) if holder == device_id && current == claimed(epoch) => None,
                Some((Some(holder), current)) => Some(FenceDecision::StaleEpoch {
                    claimed_epoch: epoch,
                    current_epoch: u64::try_from(current).unwrap_or(0),
                    current_holder: holder,
                }),
                _ => Some(FenceDecision::NotHeld { claimed_epoch: epoch }),
            };
            if let Some(decision) = decision {
                return Ok(Step::Refused(decision)); // dropping the transaction rolls it back
            }
            match work(&mut transaction) {
                Ok(value) => {
                    commit_sent = true;
                    transaction.commit()?;
                    Ok(Step::Done(value))
                }
                Err(error) => Ok(Step::Work(error)),
            }
        });
        match outcome {
            Ok(Step::Done(value)) => Ok(value),
            Ok(Step::Refused(decision)) => Err(FencedError::Refused(decision)),
            Ok(Step::Work(error)) => Err(FencedError::Work(error)),
            Err(error) => Err(FencedError::Lease(self.explain(
                "fenced_transaction",
                error,
                commit_sent,
            ))),
        }
    }

    /// Runs `work` with the coordinator's connection, reconnecting first if it broke.
    ///
    /// For statements of the caller's own (a health check, a query next to the lease table); the
    /// lease table itself is the coordinator's to write.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when no connection can be made, or `work` fails; `may_have_applied`
    /// is set when the connection broke while `work` ran.
    pub fn with_connection<T>(
        &self,
        work: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, LeaseError> {
        self.with_session(|session| work(&mut session.client))
            .map_err(|error| self.explain("with_connection", error, true))
    }

    /// Runs `work` with a connected session, reconnecting first if the last connection broke.
    fn with_session<T>(
        &self,
        work: impl FnOnce(&mut Session) -> Result<T, postgres::Error>,
    ) -> Result<T, CallError> {
        let mut slot = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_none_or(|session| session.client.is_closed()) {
            *slot = None;
            *slot = Some(self.new_session().map_err(CallError::Connect)?);
        }
        let Some(session) = slot.as_mut() else {
            unreachable!("connected above");
        };
        work(session).map_err(|error| {
            if outcome_unknown(&error) {
                *slot = None; // reconnect on the next call
            }
            CallError::Statement(error)
        })
    }

    /// The error of a failed call; `write` says whether the call sent a write whose answer may be
    /// lost.
    fn explain(&self, operation: &str, error: CallError, write: bool) -> LeaseError {
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
                    Some(code) if *code == SqlState::QUERY_CANCELED => {
                        " (statement_timeout: the lease row stayed locked, or the server is slow; not applied)"
                    }
                    _ if unknown => " (the connection was lost; the next call reconnects)",
                    _ => "",
                };
                tracing::warn!(operation, error = %describe(&error), may_have_applied = write && unknown, "PostgreSQL call failed");
                failure(
                    format!("{operation}: {}{hint}", describe(&error)),
                    write && unknown,
                    Some(error),
                )
            }
        }
    }

    /// Reads the row, share-locked, with the server clock.
    fn read(&self, session: &mut Session, agent_id: &str) -> Result<Option<Row>, postgres::Error> {
        let row = session.query_opt(&self.statements, Sql::Read, &[&agent_id])?;
        Ok(row.as_ref().map(lease_row))
    }

    /// The current epoch, for a `Lost`: read after the failed write, when it is still not the
    /// caller's (epochs never repeat, so it never will be again).
    fn lost(&self, session: &mut Session, agent_id: &str) -> Result<i64, postgres::Error> {
        Ok(self.read(session, agent_id)?.map_or(0, |row| row.1))
    }
}

impl LeaseCoordinator for PostgresLeaseCoordinator {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let ttl = storable(ttl_ms, "ttl_ms")?;
        let parameters: [Param; 3] = [&agent_id, &device_id, &ttl];
        for attempt in 0..ACQUIRE_ATTEMPTS {
            // The first attempts are one autocommit statement, and a refusal reads the holder in a
            // second one. Should the lease change between the two, the last attempt runs both in
            // one transaction: the refusal keeps the row locked, so the read sees what it saw.
            let locked = attempt + 1 == ACQUIRE_ATTEMPTS;
            let outcome = self
                .with_session(|session| {
                    let granted = |row: postgres::Row| (row.get(0), row.get(1), row.get(2));
                    if !locked {
                        return match session.query_opt(&self.statements, Sql::Acquire, &parameters)? {
                            Some(row) => Ok(Ok(granted(row))),
                            None => Ok(Err(self.read(session, agent_id)?)),
                        };
                    }
                    let acquire = session.prepare(&self.statements, Sql::Acquire)?;
                    let read = session.prepare(&self.statements, Sql::Read)?;
                    let mut transaction = session.client.transaction()?;
                    let outcome = match transaction.query_opt(&acquire, &parameters)? {
                        Some(row) => Ok(granted(row)),
                        None => Err(transaction
                            .query_opt(&read, &[&agent_id as Param])?
                            .as_ref()
                            .map(lease_row)),
                    };
                    transaction.commit()?;
                    Ok(outcome)
                })
                .map_err(|error| self.explain("acquire", error, true))?;
            let outcome: Result<(Option<String>, i64, i64), Option<Row>> = outcome;
            match outcome {
                Ok((Some(holder), epoch, expires_at_ms)) => {
                    debug_assert_eq!(holder, device_id);
                    return Ok(Lease {
                        agent_id: agent_id.to_owned(),
                        holder,
                        epoch: stored(epoch, "epoch")?,
                        expires_at_ms: stored(expires_at_ms, "expires_at_ms")?,
                    });
                }
                // The agent's row was just created, unheld: grant in the conflict branch.
                Ok((None, _, _)) => continue,
                // Held at the refusal (locked), or still held at the read.
                Err(Some((Some(holder), epoch, expires_at_ms, now_ms)))
                    if locked || now_ms < expires_at_ms =>
                {
                    return Err(LeaseError::Held {
                        agent_id: agent_id.to_owned(),
                        holder,
                        epoch: stored(epoch, "epoch")?,
                        expires_at_ms: stored(expires_at_ms, "expires_at_ms")?,
                    })
                }
                // Free, but the last epoch was minted (floors stop one below it): refused by the
                // statement's epoch condition, not by a holder.
                Err(Some((_, epoch, _, _))) if epoch == i64::MAX => {
                    return Err(LeaseError::EpochsExhausted {
                        agent_id: agent_id.to_owned(),
                        last_epoch: MAX_EPOCH,
                    })
                }
                // Released or expired in between: try to take it again.
                Err(_) => continue,
            }
        }
        // Only when the agent's row vanished under the locked attempt (deleted by hand).
        Err(failure(
            format!("acquire: the lease row of {agent_id:?} changed under a locked attempt; was it deleted?"),
            false,
            None,
        ))
    }

    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let ttl = storable(ttl_ms, "ttl_ms")?;
        let parameters: [Param; 4] = [&agent_id, &device_id, &claimed(epoch), &ttl];
        let outcome = self
            .with_session(
                |session| match session.query_opt(&self.statements, Sql::Renew, &parameters)? {
                    Some(row) if row.get::<_, Option<String>>(0).is_some() => Ok(Ok(row.get::<_, i64>(2))),
                    // The agent had no row: epoch 0.
                    Some(row) => Ok(Err(row.get::<_, i64>(1))),
                    None => Ok(Err(self.lost(session, agent_id)?)),
                },
            )
            .map_err(|error| self.explain("renew", error, true))?;
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
        let parameters: [Param; 3] = [&agent_id, &device_id, &claimed(epoch)];
        let outcome = self
            .with_session(
                |session| match session.query_opt(&self.statements, Sql::Release, &parameters)? {
                    Some(_) => Ok(None),
                    None => Ok(Some(self.lost(session, agent_id)?)),
                },
            )
            .map_err(|error| self.explain("release", error, true))?;
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
        let row = self
            .with_session(|session| self.read(session, agent_id))
            .map_err(|error| self.explain("current", error, false))?;
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
        let floor = storable(floor, "epoch floor")?;
        self.with_session(|session| {
            session.query_opt(&self.statements, Sql::RaiseFloor, &[&agent_id, &floor])
        })
        .map(drop)
        .map_err(|error| self.explain("raise_epoch_floor", error, true))
    }
}
