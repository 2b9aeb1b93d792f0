//! [`PostgresLeaseCoordinator`]: leases for many hosts in PostgreSQL (feature `postgres`), with a
//! transactional fence for effects stored in the same database.
//!
//! # Deploying it
//!
//! * **Schema and roles.** Creating the schema is an administration step:
//!   [`PostgresLeaseCoordinator::migrate`] (`fencepost admin migrate`), once per database and after
//!   an upgrade, as the schema's owner or a role with `CREATE` on the database (idempotent, safe
//!   from several hosts at once, never a downgrade). Coordinators only check it
//!   ([`check_schema`](PostgresLeaseCoordinator::check_schema): one read of the `schema_version`
//!   table) and need only these grants:
//!
//!   ```sql
//!   CREATE ROLE fencepost_agent LOGIN PASSWORD '…';
//!   GRANT USAGE ON SCHEMA fencepost TO fencepost_agent;
//!   GRANT SELECT, INSERT, UPDATE ON fencepost.leases, fencepost.frontiers TO fencepost_agent;
//!   GRANT SELECT ON fencepost.schema_version TO fencepost_agent;
//!   -- for the ledger in the same database (PostgresRelay, `--ledger postgres://…`):
//!   GRANT SELECT, INSERT, UPDATE ON fencepost.relay_devices, fencepost.relay_records TO fencepost_agent;
//!   GRANT SELECT ON fencepost.relay_checkpoints, fencepost.relay_checkpoint_chunks TO fencepost_agent;
//!   -- and for the role that compacts the ledger:
//!   -- GRANT INSERT, DELETE ON fencepost.relay_checkpoints, fencepost.relay_checkpoint_chunks TO …;
//!   ```
//!
//!   Never grant `DELETE` or `TRUNCATE` on `leases`: a deleted row forgets its epoch, and the next
//!   grant would repeat epoch 1. Nor on the relay's tables: a deleted record is a hole in a
//!   device's log (damage), and a deleted commit could be run again by a site that never saw it.
//! * **Poolers.** Every operation is one simple-query message: its statements run as one implicit
//!   transaction in one round trip, with values as escaped literals, no prepared statement and no
//!   session setting; `acquire` alone sends its `COMMIT` in a second message, so that a grant the
//!   caller gave up on before sending its `COMMIT` never commits (given up after, it may: the
//!   error then says it may have applied, and the grant holds the agent until its TTL ends). So it works through PgBouncer in transaction and in
//!   session mode, and every reply is checked to be about the agent asked for. Statement mode runs
//!   the lease operations too (`acquire` falls back to one implicit transaction there), but not
//!   [`fenced_transaction`](PostgresLeaseCoordinator::fenced_transaction), which needs a
//!   transaction block (its error names the mode).
//! * **Timeouts.** [`PostgresConfig::operation_timeout_ms`] bounds each operation with `SET LOCAL`
//!   (this transaction only), and only where the role's own `statement_timeout` / `lock_timeout`
//!   is unlimited or longer: the operator's lower setting wins. The role's defaults are read once
//!   per connection.
//! * **Replication.** A granted epoch must survive a fail-over, or the new primary can grant it a
//!   second time to another site. Run a synchronous standby (`synchronous_standby_names` set and
//!   `synchronous_commit = on` or `remote_apply`) and fail over only to a synchronous standby. With
//!   asynchronous replication a fail-over can lose the last grants.
//! * **Epochs are at least the server clock in milliseconds** ([`PostgresConfig::epoch_clock_sql`]),
//!   so that a database restored from a dump, or failed over to a standby that lagged, mints
//!   none of the epochs it forgot. The epoch floor
//!   ([`raise_epoch_floor`](LeaseCoordinator::raise_epoch_floor)), which every caller raises to the
//!   highest epoch its ledger has seen ([`SyncState::fencing_epoch`](crate::fold::SyncState::fencing_epoch)),
//!   covers a server clock set back behind them. A ledger in the same database goes back with the
//!   leases: only a synchronous standby loses no commit.
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

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage, SimpleQueryRow};

/// The PostgreSQL client crate this backend uses (`tokio-postgres`), for the types of a
/// [`Connection`]'s statements: parameter types (`driver::types::Type`), rows, errors.
pub use tokio_postgres as driver;

use super::{claimed, Columns};
use crate::clock::RealTimeLimit;
use crate::fence::FenceDecision;
use crate::id::{validate_id, IdKind};
use crate::lease::{
    validate_epoch_floor, validate_frontier, validate_publish, validate_ttl, BackendError, Lease,
    LeaseCoordinator, LeaseError, MAX_EPOCH, MAX_EXPIRES_AT_MS,
};
use crate::relay::Frontier;
use crate::relay::RelayError;

/// The database server's clock in milliseconds since the Unix epoch: the coordinator clock.
pub const SERVER_CLOCK_SQL: &str = "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint";

/// The longest schema name PostgreSQL keeps (longer names are truncated, silently).
const MAX_SCHEMA_BYTES: usize = 63;

/// Settings of a [`PostgresLeaseCoordinator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// A `postgres://` URL (or a key=value connection string). Sessions are named `fencepost` in
    /// `pg_stat_activity` unless the URL sets `application_name`.
    pub url: String,
    /// The schema that holds the `leases` table ([`PostgresLeaseCoordinator::migrate`] creates it).
    pub schema: String,
    /// How long to wait for the TCP connection. The whole connection (with the log-in and the
    /// read of the role's settings) is bounded like an operation, by the operation timeout plus
    /// [`CLIENT_MARGIN_MS`], together with the statements of the operation that needed it.
    pub connect_timeout_ms: u64,
    /// How many times one call tries to (re)connect before failing (at least 1).
    pub connect_attempts: u32,
    /// The library's bound on one operation, including a wait for the lease row's lock (held, for
    /// example, by a [`fenced_transaction`](PostgresLeaseCoordinator::fenced_transaction)); past it
    /// the operation is cancelled and has not applied. It is set per transaction (`SET LOCAL` of
    /// `statement_timeout` and `lock_timeout`), never for the session, and never above what the
    /// role, database or server already set: a lower `statement_timeout` or `lock_timeout` of the
    /// operator's wins. The client itself gives an operation up, its reconnection included, at
    /// this plus [`CLIENT_MARGIN_MS`] (a pooler's queue, a stopped server or pooler, which no
    /// server-side timeout covers). 0 means **no bound** from the library: no `SET LOCAL`, no
    /// client-side limit (only the operator's settings, and the TCP connect timeout, apply: a
    /// stopped server or pooler then holds a call for as long as it stays stopped). At most
    /// [`MAX_OPERATION_TIMEOUT_MS`]. In a URL: `?operation_timeout=5000` (milliseconds), `500ms`,
    /// `5s` or `2min` (PostgreSQL's units), given once.
    pub operation_timeout_ms: u64,
    /// The SQL expression of the coordinator clock, in milliseconds. Leave it at
    /// [`SERVER_CLOCK_SQL`]: expiry must be decided by the server's clock, never a client's. Tests
    /// replace it with a clock they can move, still read by the server; it must be volatile (read
    /// afresh each time it is evaluated), as `clock_timestamp()` is.
    pub clock_sql: String,
    /// The SQL expression, in milliseconds since the Unix epoch, that every grant's epoch is at
    /// least (rule L5): a grant mints `greatest(last epoch + 1, floor + 1, this)`. So a database
    /// restored from a dump, or failed over to a standby that lagged, which forgot the grants
    /// made since, still mints none of their epochs: the server clock has passed them (unless the
    /// agent was granted more than once per millisecond up to then, or the new server's clock is
    /// behind). Default: [`SERVER_CLOCK_SQL`] (kept when a test replaces `clock_sql`). `None`:
    /// epochs count 1, 2, 3, … and a restored database grants again the epochs granted after
    /// its dump.
    pub epoch_clock_sql: Option<String>,
}

impl PostgresConfig {
    /// The defaults for `url`: schema `fencepost`, 5 s connect timeout, 3 attempts, 10 s operation
    /// timeout (or the URL's `operation_timeout`, which is taken out of the URL), the server clock.
    /// A malformed `operation_timeout` stays in the URL, and [`PostgresLeaseCoordinator::connect`]
    /// reports it.
    pub fn new(url: impl Into<String>) -> Self {
        let url = url.into();
        let (url, operation_timeout_ms) = match take_operation_timeout(&url) {
            Some((rest, Some(ms))) => (rest, ms),
            _ => (url, DEFAULT_OPERATION_TIMEOUT_MS),
        };
        Self {
            url,
            schema: "fencepost".to_owned(),
            connect_timeout_ms: 5_000,
            connect_attempts: 3,
            operation_timeout_ms,
            clock_sql: SERVER_CLOCK_SQL.to_owned(),
            epoch_clock_sql: Some(SERVER_CLOCK_SQL.to_owned()),
        }
    }
}

impl PostgresConfig {
    /// Which database the URL names, however it is spelled (`postgres://` or `postgresql://`,
    /// credentials and options in the authority or in the query): `role@host:port/database`,
    /// hosts and ports as listed (default port 5432, database the role's name), with the
    /// schema. `None` for a URL that does not parse. Two names of one server (`localhost` and
    /// `127.0.0.1`) stay two identities.
    pub fn database_identity(&self) -> Option<String> {
        let settings: tokio_postgres::Config = self.url.parse().ok()?;
        let user = settings.get_user().unwrap_or_default();
        let hosts: Vec<String> = settings
            .get_hosts()
            .iter()
            .map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) => name.to_ascii_lowercase(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = match settings.get_ports() {
            [] => vec!["5432".to_owned()],
            ports => ports.iter().map(u16::to_string).collect(),
        };
        let database = settings.get_dbname().unwrap_or(user);
        Some(format!(
            "{user}@{}:{}/{database}#{}",
            hosts.join(","),
            ports.join(","),
            self.schema
        ))
    }
}

/// The largest [`PostgresConfig::operation_timeout_ms`]: PostgreSQL's timeouts are 32-bit
/// milliseconds.
pub const MAX_OPERATION_TIMEOUT_MS: u64 = i32::MAX as u64;

/// The default [`PostgresConfig::operation_timeout_ms`].
pub const DEFAULT_OPERATION_TIMEOUT_MS: u64 = 10_000;

/// How much longer than the operation timeout the client itself waits for an answer (the server
/// cancels the operation at the timeout; the client gives the connection up at the timeout plus
/// this, for waits no server-side timeout covers: a pooler's queue, a stopped server or pooler).
pub const CLIENT_MARGIN_MS: u64 = 1_000;

/// The URL parameter of [`PostgresConfig::operation_timeout_ms`].
const OPERATION_TIMEOUT_PARAMETER: &str = "operation_timeout";

/// Splits `operation_timeout=…` off a URL's query: the URL without it, and its value in
/// milliseconds (`None` when the value does not parse). `None` when the URL has no such parameter.
fn take_operation_timeout(url: &str) -> Option<(String, Option<u64>)> {
    let (base, query) = url.split_once('?')?;
    let mut value = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            // Given twice, it is ambiguous: malformed.
            Some((OPERATION_TIMEOUT_PARAMETER, text)) => {
                value = Some(if value.is_some() {
                    None
                } else {
                    setting_ms(text).filter(|ms| *ms <= MAX_OPERATION_TIMEOUT_MS)
                });
            }
            _ => kept.push(pair),
        }
    }
    let value = value?;
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Some((rest, value))
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
/// * One table, `<schema>.leases` (and `<schema>.schema_version`), made by the idempotent
///   [`migrate`](Self::migrate).
/// * Each operation is one round trip (one simple-query message, one implicit transaction), but
///   `acquire`, whose `COMMIT` is a second one (a grant given up before its `COMMIT` was sent
///   never commits; behind a pooler in statement mode, which refuses that, it falls back to one); each
///   write is one statement, serialized by the lease row's lock, and reads the clock only
///   after it holds that lock: `acquire` is `INSERT … ON CONFLICT … DO UPDATE … WHERE <free or
///   expired> RETURNING …`, `renew` the same with `WHERE <holder and epoch>`, and `release` is
///   `UPDATE … WHERE <holder and epoch> RETURNING …`.
///   A verdict that needs the current row (`Held`, `Lost`) reads it in a second statement of the
///   same transaction (`acquire`, `release`) or a second round trip (`renew`), at an instant where
///   the verdict still holds.
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
/// coordinator.check_schema()?; // `migrate()` is the administrator's step, once per database
/// let lease = coordinator.acquire("billing-agent", "laptop", 30_000)?;
/// println!("epoch {} until {} ms (server time)", lease.epoch, lease.expires_at_ms);
/// # Ok::<(), fencepost::lease::LeaseError>(())
/// ```
pub struct PostgresLeaseCoordinator {
    config: PostgresConfig,
    statements: Statements,
    session: Mutex<Option<Session>>,
    /// Set once a pooler said it runs no transaction block (PgBouncer's statement mode):
    /// `acquire` then commits in its one round trip.
    autocommit_only: AtomicBool,
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
    /// Creates or upgrades the schema to [`SCHEMA_VERSION`] (several statements).
    migrate: String,
    /// Returns the schema's version.
    version: String,
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
    /// `$1` agent, `$2` device, `$3` epoch, `$4` the `VALUES` list of `(device_id, next_seq,
    /// last_op_id)`.
    /// Raises the published frontier if the caller holds the agent at the epoch. Returns the agent.
    publish: String,
    /// `$1` agent. Returns `agent_id, device_id, next_seq, last_op_id`.
    published: String,
}

impl Statements {
    fn new(schema_name: &str, clock: &str, epoch_clock: Option<&str>) -> Self {
        let schema = quote_identifier(schema_name);
        let table = format!("{schema}.leases");
        let versions = format!("{schema}.schema_version");
        let frontiers = format!("{schema}.frontiers");
        let relay_devices = format!("{schema}.relay_devices");
        let relay_records = format!("{schema}.relay_records");
        let relay_checkpoints = format!("{schema}.relay_checkpoints");
        let relay_checkpoint_chunks = format!("{schema}.relay_checkpoint_chunks");
        // The schema is created only when missing: `CREATE SCHEMA IF NOT EXISTS` needs CREATE on
        // the database even when the schema exists, which its owner may not have.
        let mut tag = "$fencepost$".to_owned();
        while schema_name.contains(&tag) || schema.contains(&tag) {
            tag.insert(tag.len() - 1, '_');
        }
        let mut schema_literal = String::new();
        Literal::Text(schema_name).write(&mut schema_literal);
        // min(clock + ttl, MAX_EXPIRES_AT_MS) in bigint arithmetic, which cannot overflow
        // (0 <= ttl <= MAX): cheaper for the server than numeric.
        let expiry = |ttl: &str| format!("(least(({clock}), {MAX_EXPIRES_AT_MS} - {ttl}) + {ttl})");
        Self {
            migrate: format!(
                "SELECT pg_advisory_xact_lock(7046837213749);
                 DO {tag} BEGIN
                     IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = {schema_literal}) THEN
                         CREATE SCHEMA {schema};
                     END IF;
                 END {tag};
                 CREATE TABLE IF NOT EXISTS {table} (
                     agent_id text PRIMARY KEY,
                     holder text,
                     epoch bigint NOT NULL CHECK (epoch >= 0),
                     expires_at_ms bigint NOT NULL CHECK (expires_at_ms >= 0),
                     floor bigint NOT NULL DEFAULT 0 CHECK (floor >= 0)
                 );
                 CREATE TABLE IF NOT EXISTS {frontiers} (
                     agent_id text NOT NULL,
                     device_id text NOT NULL,
                     next_seq bigint NOT NULL CHECK (next_seq >= 0),
                     PRIMARY KEY (agent_id, device_id)
                 );
                 ALTER TABLE {frontiers} ADD COLUMN IF NOT EXISTS last_op_id text;
                 CREATE TABLE IF NOT EXISTS {relay_devices} (
                     device_id text PRIMARY KEY,
                     next_seq bigint NOT NULL CHECK (next_seq >= 0)
                 );
                 CREATE TABLE IF NOT EXISTS {relay_records} (
                     device_id text NOT NULL,
                     seq bigint NOT NULL,
                     record text NOT NULL,
                     PRIMARY KEY (device_id, seq)
                 );
                 CREATE TABLE IF NOT EXISTS {relay_checkpoints} (
                     name text PRIMARY KEY,
                     upload text NOT NULL,
                     bytes bigint NOT NULL CHECK (bytes >= 0),
                     chunks integer NOT NULL CHECK (chunks >= 0)
                 );
                 CREATE TABLE IF NOT EXISTS {relay_checkpoint_chunks} (
                     upload text NOT NULL,
                     chunk integer NOT NULL CHECK (chunk >= 0),
                     data bytea NOT NULL,
                     written_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (upload, chunk)
                 );
                 CREATE TABLE IF NOT EXISTS {versions} (
                     singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                     version integer NOT NULL
                 );
                 INSERT INTO {versions} AS current (version) VALUES ({SCHEMA_VERSION})
                     ON CONFLICT (singleton) DO UPDATE SET version = greatest(current.version, excluded.version)"
            ),
            version: format!("SELECT version FROM {versions}"),
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
                         epoch = greatest(lease.epoch + 1, lease.floor + 1{at_least}),
                         expires_at_ms = {expires}
                     WHERE (lease.holder IS NULL OR lease.expires_at_ms <= ({clock}))
                       AND greatest(lease.epoch, lease.floor) < {max_epoch}
                 RETURNING agent_id, holder, epoch, expires_at_ms",
                expires = expiry("$3::bigint"),
                max_epoch = i64::MAX,
                at_least = epoch_clock.map(|sql| format!(", ({sql})")).unwrap_or_default()
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
                 RETURNING agent_id, holder, epoch, expires_at_ms",
                expires = expiry("$4::bigint")
            ),
            release: format!(
                "UPDATE {table} SET holder = NULL
                 WHERE agent_id = $1 AND holder = $2 AND epoch = $3 RETURNING agent_id, epoch"
            ),
            read: format!(
                "SELECT agent_id, holder, epoch, expires_at_ms, ({clock}) FROM {table} WHERE agent_id = $1 FOR SHARE"
            ),
            // Run after the share-locked read of the agent's row in the same transaction, so
            // that no grant can come between the holder check and the write.
            publish: format!(
                "INSERT INTO {frontiers} AS f (agent_id, device_id, next_seq, last_op_id)
                 SELECT lease.agent_id, d.device_id, d.next_seq, d.last_op_id
                 FROM {table} AS lease, (VALUES $4) AS d(device_id, next_seq, last_op_id)
                 WHERE lease.agent_id = $1 AND lease.holder = $2 AND lease.epoch = $3
                 ON CONFLICT (agent_id, device_id) DO UPDATE SET
                     next_seq = greatest(f.next_seq, excluded.next_seq),
                     last_op_id = CASE WHEN excluded.next_seq > f.next_seq THEN excluded.last_op_id
                                       WHEN excluded.next_seq = f.next_seq THEN coalesce(f.last_op_id, excluded.last_op_id)
                                       ELSE f.last_op_id END
                 RETURNING f.agent_id"
            ),
            published: format!("SELECT agent_id, device_id, next_seq, last_op_id FROM {frontiers} WHERE agent_id = $1"),
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

/// A value spliced into a statement as an SQL literal. Statements travel in the simple query
/// protocol, so that an operation is one round trip with no prepared statement and no session
/// state (it works through a transaction-pooling proxy such as PgBouncer); values are therefore
/// literals, never parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Literal<'a> {
    /// Text (ids are validated: no control characters, rule L8).
    Text(&'a str),
    Int(i64),
    /// SQL made of other literals (a `VALUES` list), written as it is.
    Sql(&'a str),
}

impl Literal<'_> {
    pub(crate) fn write(self, out: &mut String) {
        match self {
            Literal::Text(text) => {
                // An escape string constant means the same whatever `standard_conforming_strings`
                // says; ids hold no control characters, so quotes and backslashes are all there
                // is to escape.
                out.push_str("E'");
                for character in text.chars() {
                    match character {
                        '\\' => out.push_str("\\\\"),
                        '\'' => out.push_str("''"),
                        other => out.push(other),
                    }
                }
                out.push('\'');
            }
            Literal::Sql(sql) => out.push_str(sql),
            Literal::Int(value) => {
                use std::fmt::Write as _;
                let _ = write!(out, "({value})::bigint");
            }
        }
    }
}

/// `template` with `$1`, `$2`, … replaced by `literals` (at most 9).
pub(crate) fn bind(template: &str, literals: &[Literal<'_>]) -> String {
    debug_assert!(literals.len() <= 9);
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let index = rest[at + 1..]
            .chars()
            .next()
            .and_then(|digit| digit.to_digit(10))
            .filter(|digit| (1..=literals.len() as u32).contains(digit));
        match index {
            Some(digit) => {
                literals[digit as usize - 1].write(&mut out);
                rest = &rest[at + 2..];
            }
            None => {
                out.push('$');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A connection. It keeps nothing on the server between operations: no prepared statement, no
/// setting. Its I/O runs on a current-thread runtime of its own, driven only while a call runs, on
/// the caller's thread: a call is bounded by a timer of that runtime, with no thread hop.
struct Session {
    /// The connection's runtime (the connection's task is spawned on it and runs during calls).
    runtime: tokio::runtime::Runtime,
    /// `None` only while the session is being dropped.
    client: Option<Client>,
    /// The connection's task, awaited (briefly) on a clean close.
    connection: Option<tokio::task::JoinHandle<()>>,
    /// What opens each transaction: the isolation level and the operation timeout, where the
    /// server's defaults for this role do not already give them ([`opening`]).
    prologue: String,
    /// The operation-timeout part of the prologue alone (for a transaction opened explicitly).
    timeouts: String,
    /// Set when a call did not answer within its limit: the session is not used again.
    spoiled: bool,
    /// Set from a `fenced_transaction`'s `BEGIN` until its end is confirmed: a session left in
    /// that state (a closure that panicked, an answer lost) is not used again.
    open_transaction: bool,
    /// The bound of the operation running on the session (its reconnection included), which
    /// every call of [`run`](Self::run) is cut to; `None` between operations and for the
    /// caller's own statements, which are bounded one by one.
    deadline: Option<RealTimeLimit>,
}

/// How long a session's close, or a cancel request for a call given up, may take.
const CLOSE_LIMIT: Duration = Duration::from_secs(1);

impl Session {
    /// Runs the future `call` builds, on this session's runtime, waiting at most `limit`: a
    /// pooler that queues the client (no free server connection, a server it cannot log in to)
    /// or a server or pooler that stopped answering cannot hold the caller past it. Then the
    /// session is spoiled (the caller drops it, which sends a cancel request and closes the
    /// connection), and the outcome is unknown.
    fn run<'s, T, F>(
        &'s mut self,
        limit: Option<Duration>,
        call: impl FnOnce(&'s Client) -> F,
    ) -> Result<T, CallError>
    where
        F: Future<Output = Result<T, tokio_postgres::Error>> + 's,
    {
        if self.spoiled {
            return Err(CallError::Reply(given_up()));
        }
        let Some(client) = self.client.as_ref() else {
            return Err(CallError::Reply(given_up()));
        };
        let limit = match (limit, self.deadline) {
            (Some(limit), Some(deadline)) => Some(limit.min(deadline.remaining())),
            (limit, _) => limit,
        };
        let future = call(client);
        let Some(limit) = limit else {
            return Ok(self.runtime.block_on(future)?);
        };
        match self
            .runtime
            .block_on(async { tokio::time::timeout(limit, future).await })
        {
            Ok(outcome) => Ok(outcome?),
            Err(_) => {
                self.spoiled = true;
                // What the caller waited: the whole operation's time when its bound cut this call.
                Err(CallError::NoAnswer(
                    self.deadline
                        .map_or(limit, |deadline| deadline.elapsed().max(limit)),
                ))
            }
        }
    }

    /// Whether the connection is still open, as far as can be told without a round trip. The
    /// connection's task runs only during calls, so a close the server sent while the session was
    /// idle (a restart, `idle_session_timeout`, `pg_terminate_backend`) would only be read by the
    /// next call, which would then fail for nothing (found by an adversarial run: the outcome of
    /// a long command was never written). So the task runs once first, without waiting.
    fn seems_open(&mut self) -> bool {
        let Some(client) = self.client.as_ref() else {
            return false;
        };
        if client.is_closed() {
            return false;
        }
        self.runtime.block_on(async {
            // `yield_now` lets the runtime poll its I/O driver (without blocking) and run the
            // connection's task before this resumes.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        });
        !client.is_closed()
    }

    /// Runs `text` as one simple query, within `limit` (see [`run`](Self::run)).
    fn simple_query_within(
        &mut self,
        text: &str,
        limit: Option<Duration>,
    ) -> Result<Vec<SimpleQueryMessage>, CallError> {
        self.run(limit, |client| client.simple_query(text))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.spoiled {
            // A call may still run on the server (or wait in a pooler's queue): ask for it to be
            // cancelled, best effort and never waited for, since the server or pooler may not
            // answer. The connection closes when the runtime goes, with that thread.
            let cancel = client.cancel_token();
            drop(client);
            let runtime = std::mem::replace(
                &mut self.runtime,
                match tokio::runtime::Builder::new_current_thread().build() {
                    Ok(runtime) => runtime,
                    Err(_) => return,
                },
            );
            let _ = std::thread::Builder::new()
                .name("fencepost-postgres-cancel".to_owned())
                .spawn(move || {
                    runtime.block_on(async {
                        let _ = tokio::time::timeout(CLOSE_LIMIT, cancel.cancel_query(NoTls)).await;
                    });
                });
            return;
        }
        // A clean close: the connection's task sends Terminate once the client is gone.
        drop(client);
        if let Some(connection) = self.connection.take() {
            self.runtime.block_on(async {
                let _ = tokio::time::timeout(CLOSE_LIMIT, connection).await;
            });
        }
    }
}

/// Statements of the caller's own on the coordinator's connection: in
/// [`fenced_transaction`](PostgresLeaseCoordinator::fenced_transaction)'s transaction, or through
/// [`with_connection`](PostgresLeaseCoordinator::with_connection).
///
/// It offers only what works through a transaction-pooling proxy (PgBouncer's
/// `pool_mode = transaction`): unnamed statements sent with their parameter types in one round trip
/// ([`query_typed`](Self::query_typed), [`execute_typed`](Self::execute_typed)) and the simple
/// query protocol ([`simple_query`](Self::simple_query), [`batch_execute`](Self::batch_execute)).
/// A named prepared statement could be run by another client of the same pooled server connection.
/// Each call is bounded like a lease operation: [`PostgresConfig::operation_timeout_ms`] on the
/// server, and that plus [`CLIENT_MARGIN_MS`] on the client.
pub struct Connection<'a> {
    session: &'a mut Session,
    limit: Option<Duration>,
}

impl std::fmt::Debug for Connection<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Connection")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Why a statement of a [`Connection`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatementError {
    /// The server refused the statement, or the connection failed.
    #[error(transparent)]
    Driver(#[from] tokio_postgres::Error),
    /// No answer within the client's bound: the connection was given up (and a cancel request
    /// sent); whether the statement applied is unknown.
    #[error("no answer within {} ms; the connection was given up", .0.as_millis())]
    NoAnswer(Duration),
}

impl StatementError {
    /// The driver's error, if the server or the connection reported one.
    pub fn as_driver(&self) -> Option<&tokio_postgres::Error> {
        match self {
            StatementError::Driver(error) => Some(error),
            StatementError::NoAnswer(_) => None,
        }
    }
}

impl Connection<'_> {
    /// A failed call as the caller sees it. A call on a session given up (an earlier statement of
    /// this connection did not answer) fails as that statement did.
    fn failed(&self, error: CallError) -> StatementError {
        match error {
            CallError::Statement(error) => StatementError::Driver(error),
            CallError::NoAnswer(limit) => StatementError::NoAnswer(limit),
            CallError::Connect(_) | CallError::Reply(_) => {
                StatementError::NoAnswer(self.limit.unwrap_or_default())
            }
        }
    }

    /// Runs `sql` (parameters `$1`, `$2`, … with their types) as an unnamed statement, in one round
    /// trip, and returns its rows.
    ///
    /// # Errors
    /// [`StatementError`]: refused by the server, a lost connection, or no answer in time.
    pub fn query_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<tokio_postgres::Row>, StatementError> {
        let limit = self.limit;
        self.session
            .run(limit, |client| client.query_typed(sql, params))
            .map_err(|error| self.failed(error))
    }

    /// Runs `sql` (parameters `$1`, `$2`, … with their types) as an unnamed statement, in one round
    /// trip, and returns the number of rows it changed.
    ///
    /// # Errors
    /// [`StatementError`]: refused by the server, a lost connection, or no answer in time.
    pub fn execute_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64, StatementError> {
        let limit = self.limit;
        self.session
            .run(limit, |client| client.execute_typed(sql, params))
            .map_err(|error| self.failed(error))
    }

    /// Runs `sql` (one or more statements, no parameters) with the simple query protocol.
    ///
    /// # Errors
    /// [`StatementError`]: refused by the server, a lost connection, or no answer in time.
    pub fn simple_query(&mut self, sql: &str) -> Result<Vec<SimpleQueryMessage>, StatementError> {
        let limit = self.limit;
        self.session
            .run(limit, |client| client.simple_query(sql))
            .map_err(|error| self.failed(error))
    }

    /// Runs `sql` (one or more statements, no parameters) and discards their rows.
    ///
    /// # Errors
    /// [`StatementError`]: refused by the server, a lost connection, or no answer in time.
    pub fn batch_execute(&mut self, sql: &str) -> Result<(), StatementError> {
        let limit = self.limit;
        self.session
            .run(limit, |client| client.batch_execute(sql))
            .map_err(|error| self.failed(error))
    }
}

/// The rows of each statement of a batch, in order.
type ResultSets = Vec<Vec<SimpleQueryRow>>;

/// The rows of each statement of a simple query's answer, in order.
fn result_sets(messages: Vec<SimpleQueryMessage>) -> ResultSets {
    let mut sets: ResultSets = Vec::new();
    let mut rows = Vec::new();
    for message in messages {
        match message {
            SimpleQueryMessage::Row(row) => rows.push(row),
            SimpleQueryMessage::CommandComplete(_) => sets.push(std::mem::take(&mut rows)),
            _ => {}
        }
    }
    sets
}

/// A column of a simple-query row as an integer.
fn integer(row: &SimpleQueryRow, column: usize) -> Result<i64, LeaseError> {
    let text = row.get(column).unwrap_or("");
    text.parse()
        .map_err(|_| failure(format!("corrupt row: column {column} is {text:?}"), false, None))
}

/// Checks that a row answers for `agent_id` (its first column): every statement returns the agent
/// it is about, so that a reply to someone else's statement (a pooling proxy mixing two clients'
/// statements) is an error, never a verdict.
fn for_agent(row: &SimpleQueryRow, agent_id: &str) -> Result<(), LeaseError> {
    match row.get(0) {
        Some(found) if found == agent_id => Ok(()),
        found => Err(failure(
            format!("the server answered for agent {found:?}, not {agent_id:?}: statements of two clients were mixed (a pooling proxy?); nothing is trusted from this reply"),
            true,
            None,
        )),
    }
}

/// The columns of the `read` statement, checked to be `agent_id`'s.
fn lease_row(row: &SimpleQueryRow, agent_id: &str) -> Result<Row, LeaseError> {
    for_agent(row, agent_id)?;
    Ok((
        row.get(1).map(str::to_owned),
        integer(row, 2)?,
        integer(row, 3)?,
        integer(row, 4)?,
    ))
}

fn failure(
    message: impl Into<String>,
    may_have_applied: bool,
    source: Option<tokio_postgres::Error>,
) -> LeaseError {
    LeaseError::Backend(BackendError {
        backend: "postgres",
        message: message.into(),
        may_have_applied,
        transient: false,
        source: source.map(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
    })
}

/// `error`, marked as one that may pass by itself ([`BackendError::transient`]).
fn passing(mut error: LeaseError) -> LeaseError {
    if let LeaseError::Backend(backend) = &mut error {
        backend.transient = true;
    }
    error
}

/// Whether a statement's error may pass by itself: a lost connection or a server that is
/// shutting down, starting or recovering ([`outcome_unknown`]), a pooler that cannot log in to
/// its server for now (PgBouncer's `server_login_retry` answers `08P01`), too many connections,
/// a timeout (a slow server, a row lock held by another writer), a serialization failure or a
/// deadlock (the server rolled the transaction back).
fn passes(error: &tokio_postgres::Error) -> bool {
    outcome_unknown(error)
        || error.code().is_some_and(|code| {
            *code == SqlState::TOO_MANY_CONNECTIONS
                || *code == SqlState::QUERY_CANCELED
                || *code == SqlState::LOCK_NOT_AVAILABLE
                || *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
        })
}

/// Whether `error` left the statement's outcome unknown: the connection closed or failed (the
/// answer may be lost), or the server ended the session. An error the server reported for the
/// statement itself, or one raised before anything was sent (a parameter that cannot be encoded),
/// means it did not apply.
fn outcome_unknown(error: &tokio_postgres::Error) -> bool {
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

/// Whether a login failed for a reason that trying again does not cure: a wrong password or
/// role, or a database that does not exist.
fn permanent_login_failure(code: &SqlState) -> bool {
    *code == SqlState::INVALID_PASSWORD
        || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        || *code == SqlState::INVALID_CATALOG_NAME
}

/// Quotes an SQL identifier.
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The conversions to and from this backend's signed 64-bit columns.
const COLUMNS: Columns = Columns { backend: "postgres" };

fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            // The driver's own message ("error connecting to server") says little; its causes
            // ("Connection refused") say what happened.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                if !text.contains(&cause_text) {
                    text.push_str(": ");
                    text.push_str(&cause_text);
                }
                source = cause.source();
            }
            text
        }
    }
}

/// Why a connection attempt failed.
enum ConnectFailure {
    Driver(tokio_postgres::Error),
    /// No answer within the bound.
    NoAnswer(Duration),
    /// No runtime for the connection could be made.
    Local(std::io::Error),
}

/// Why a call failed: before a statement could be sent, or in a statement.
enum CallError {
    Connect(LeaseError),
    Statement(tokio_postgres::Error),
    /// The server answered something this code cannot read (a corrupt row).
    Reply(LeaseError),
    /// No answer within the client's own bound: the connection was given up.
    NoAnswer(Duration),
}

impl From<tokio_postgres::Error> for CallError {
    fn from(error: tokio_postgres::Error) -> Self {
        CallError::Statement(error)
    }
}

impl From<LeaseError> for CallError {
    fn from(error: LeaseError) -> Self {
        CallError::Reply(error)
    }
}

/// The version of the schema this code reads and writes ([`PostgresLeaseCoordinator::migrate`]
/// brings a database to it). Version 2 added the published frontiers (`frontiers`), version 3
/// the ledger's tables (`relay_devices`, `relay_records`, [`PostgresRelay`](crate::relay::PostgresRelay))
/// and each published device's head (`frontiers.last_op_id`), version 4 the ledger's shared
/// checkpoints (`relay_checkpoints`, `relay_checkpoint_chunks`).
pub const SCHEMA_VERSION: i32 = 4;

/// What [`PostgresLeaseCoordinator::schema_version`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaState {
    /// The schema or its tables do not exist: run [`PostgresLeaseCoordinator::migrate`].
    Missing,
    /// The schema is at this version ([`SCHEMA_VERSION`] is what this code needs).
    Version(i32),
}

impl PostgresLeaseCoordinator {
    /// Connects (a bounded number of attempts). Creating the schema is a separate, explicit step
    /// ([`migrate`](Self::migrate)); [`check_schema`](Self::check_schema) says whether it was done.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] for a schema name that is empty or longer than 63 bytes, a URL that
    /// does not parse (or a malformed `operation_timeout`), a wrong password or database, or a
    /// server that cannot be reached (with the cause: `Connection refused`, a timeout, …).
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
        if take_operation_timeout(&config.url).is_some() {
            return Err(failure(
                format!("{OPERATION_TIMEOUT_PARAMETER}= in the URL must be a duration such as 5000 (milliseconds), 500ms, 5s or 2min, given once, at most {MAX_OPERATION_TIMEOUT_MS} ms"),
                false,
                None,
            ));
        }
        if config.operation_timeout_ms > MAX_OPERATION_TIMEOUT_MS {
            return Err(failure(
                format!(
                    "operation_timeout_ms {} is above PostgreSQL's limit of {MAX_OPERATION_TIMEOUT_MS} ms",
                    config.operation_timeout_ms
                ),
                false,
                None,
            ));
        }
        let statements = Statements::new(
            &config.schema,
            &config.clock_sql,
            config.epoch_clock_sql.as_deref(),
        );
        let coordinator = Self {
            config,
            statements,
            session: Mutex::new(None),
            autocommit_only: AtomicBool::new(false),
        };
        let session = coordinator.new_session(coordinator.call_bound())?;
        *coordinator.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(session);
        Ok(coordinator)
    }

    /// The settings.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// The bound of one operation from now: the client's bound on a call, or none.
    fn call_bound(&self) -> Option<RealTimeLimit> {
        self.client_limit().map(RealTimeLimit::starting_now)
    }

    /// Connects, within `phase` (the bound of the operation that needs the connection) for every
    /// attempt together: a stopped pooler accepts TCP connections and never answers, and each
    /// attempt would otherwise wait it out again.
    fn new_session(&self, phase: Option<RealTimeLimit>) -> Result<Session, LeaseError> {
        let mut settings: tokio_postgres::Config =
            self.config.url.parse().map_err(|error: tokio_postgres::Error| {
                failure(
                    format!("invalid PostgreSQL URL: {}", describe(&error)),
                    false,
                    Some(error),
                )
            })?;
        settings.connect_timeout(Duration::from_millis(self.config.connect_timeout_ms));
        if settings.get_application_name().is_none() {
            settings.application_name("fencepost");
        }
        let mut last = None;
        for attempt in 0..self.config.connect_attempts.max(1) {
            if attempt > 0 {
                let pause = Duration::from_millis(100 << attempt.min(5));
                if phase.is_some_and(|phase| phase.remaining() <= pause) {
                    break;
                }
                std::thread::sleep(pause);
            }
            match self.connect_within(&settings, phase.map(|phase| phase.remaining())) {
                Ok(session) => return Ok(session),
                Err(ConnectFailure::NoAnswer(limit)) => {
                    tracing::debug!(
                        attempt,
                        waited_ms = limit.as_millis() as u64,
                        "PostgreSQL connection attempt did not answer"
                    );
                    last = Some(ConnectFailure::NoAnswer(limit));
                    break; // the bound of the whole connection phase is spent
                }
                Err(ConnectFailure::Local(error)) => {
                    last = Some(ConnectFailure::Local(error));
                    break;
                }
                Err(ConnectFailure::Driver(error)) => {
                    let permanent = error.code().is_some_and(permanent_login_failure);
                    tracing::debug!(attempt, error = %describe(&error), "PostgreSQL connection attempt failed");
                    last = Some(ConnectFailure::Driver(error));
                    if permanent {
                        break;
                    }
                }
            }
        }
        match last {
            Some(ConnectFailure::Driver(error)) => {
                let permanent = error.code().is_some_and(permanent_login_failure);
                let failed = failure(
                    format!("cannot connect to PostgreSQL: {}", describe(&error)),
                    false,
                    Some(error),
                );
                Err(if permanent { failed } else { passing(failed) })
            }
            Some(ConnectFailure::NoAnswer(limit)) => Err(passing(failure(
                format!(
                    "cannot connect to PostgreSQL: no answer within {} ms (a stopped server or pooler, or a pooler that cannot log in to its server)",
                    phase.map_or(limit, |phase| phase.elapsed()).as_millis()
                ),
                false,
                None,
            ))),
            Some(ConnectFailure::Local(error)) => Err(failure(
                format!("cannot connect to PostgreSQL: no runtime for the connection: {error}"),
                false,
                None,
            )),
            None => unreachable!("at least one connection attempt was made"),
        }
    }

    /// The client's own bound on one call: the operation timeout plus [`CLIENT_MARGIN_MS`]; none
    /// when the operation timeout is 0.
    fn client_limit(&self) -> Option<Duration> {
        (self.config.operation_timeout_ms > 0)
            .then(|| Duration::from_millis(self.config.operation_timeout_ms.saturating_add(CLIENT_MARGIN_MS)))
    }

    /// One connection attempt, with the read of the role's defaults, bounded by `limit` (what is
    /// left of the operation's bound): the driver's `connect_timeout` covers only the TCP
    /// connection, not a pooler or server that accepts it and then never answers.
    fn connect_within(
        &self,
        settings: &tokio_postgres::Config,
        limit: Option<Duration>,
    ) -> Result<Session, ConnectFailure> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ConnectFailure::Local)?;
        let attempt = async {
            let (client, connection) = settings.connect(NoTls).await?;
            let connection = tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(error = %describe(&error), "PostgreSQL connection ended");
                }
            });
            // What this role gets by default (the role's, database's or server's settings; a
            // pooler connects every server connection of this client as the same role).
            let defaults = client
                .simple_query(
                    "SELECT current_setting('default_transaction_isolation'), current_setting('statement_timeout'), current_setting('lock_timeout')",
                )
                .await?;
            Ok::<_, tokio_postgres::Error>((client, connection, defaults))
        };
        let outcome = match limit {
            None => runtime.block_on(attempt),
            Some(limit) => runtime
                .block_on(async { tokio::time::timeout(limit, attempt).await })
                .map_err(|_| ConnectFailure::NoAnswer(limit))?,
        };
        let (client, connection, defaults) = outcome.map_err(ConnectFailure::Driver)?;
        let row = defaults.iter().find_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        });
        let (isolation, timeouts) = opening(
            row.and_then(|row| row.get(0)),
            row.and_then(|row| row.get(1)),
            row.and_then(|row| row.get(2)),
            self.config.operation_timeout_ms,
        );
        Ok(Session {
            runtime,
            client: Some(client),
            connection: Some(connection),
            prologue: format!("{isolation}{timeouts}"),
            timeouts,
            spoiled: false,
            open_transaction: false,
            deadline: None,
        })
    }

    /// Runs `statements` as one transaction in one round trip: one simple-query message, whose
    /// statements PostgreSQL runs as one implicit transaction (committed after the last one, rolled
    /// back at the first error, so the connection is never left inside a transaction): the
    /// session's prologue (READ COMMITTED and the operation timeout, local to the transaction,
    /// where the role's defaults do not already give them), then the statements. Returns each
    /// statement's rows.
    fn batch(&self, session: &mut Session, statements: &[String]) -> Result<ResultSets, CallError> {
        let mut text = String::with_capacity(256 + statements.iter().map(String::len).sum::<usize>());
        text.push_str(&session.prologue);
        for statement in statements {
            text.push_str(statement);
            text.push(';');
        }
        let messages = session.simple_query_within(&text, self.client_limit())?;
        // The prologue's statements, then the statements.
        let skip = session.prologue.matches(';').count();
        Ok(result_sets(messages)
            .into_iter()
            .skip(skip)
            .take(statements.len())
            .collect())
    }

    /// Creates or upgrades the schema: the schema, the `leases` table and a `schema_version`
    /// table, to [`SCHEMA_VERSION`]. Idempotent, and safe to run from several processes at once.
    /// An administration step (`fencepost admin migrate`), run as a role that may create the
    /// schema (or owns it); the roles that then run coordinators need only the grants listed in
    /// the [module docs](self).
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the database refuses (for example, the role may not create the
    /// schema), the schema is newer than this code, or the connection fails.
    pub fn migrate(&self) -> Result<(), LeaseError> {
        if let Ok(SchemaState::Version(found)) = self.schema_version() {
            if found > SCHEMA_VERSION {
                return Err(failure(
                    format!("migrate: the fencepost schema {:?} is at version {found}, newer than this fencepost knows ({SCHEMA_VERSION}): upgrade fencepost; nothing was changed", self.config.schema),
                    false,
                    None,
                ));
            }
        }
        let statements = [self.statements.migrate.clone()];
        self.with_session(|session| {
            let sets = self.batch(session, &statements)?;
            let _ = sets;
            Ok(())
        })
        .map_err(|error| self.explain("migrate", error, false))?;
        match self.schema_version()? {
            SchemaState::Version(SCHEMA_VERSION) => Ok(()),
            SchemaState::Version(found) => Err(failure(
                format!("migrate: the schema is at version {found} after migrating, this code needs version {SCHEMA_VERSION}"),
                false,
                None,
            )),
            SchemaState::Missing => Err(failure(
                "migrate: the schema is still missing after migrating (does this role see the schema it created?)",
                false,
                None,
            )),
        }
    }

    /// The state of the schema (one cheap read): missing, or at which version.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the database cannot be read.
    pub fn schema_version(&self) -> Result<SchemaState, LeaseError> {
        let statements = [self.statements.version.clone()];
        let outcome = self.with_session(|session| match self.batch(session, &statements) {
            Ok(sets) => {
                let version = sets
                    .first()
                    .and_then(|rows| rows.first())
                    .map(|row| integer(row, 0))
                    .transpose()?;
                Ok(match version {
                    Some(version) => SchemaState::Version(i32::try_from(version).unwrap_or(i32::MAX)),
                    None => SchemaState::Missing,
                })
            }
            Err(CallError::Statement(error))
                if error.code() == Some(&SqlState::UNDEFINED_TABLE)
                    || error.code() == Some(&SqlState::INVALID_SCHEMA_NAME) =>
            {
                Ok(SchemaState::Missing)
            }
            Err(error) => Err(error),
        });
        outcome.map_err(|error| self.explain("schema_version", error, false))
    }

    /// Checks that the schema exists at [`SCHEMA_VERSION`]; what every command does before it
    /// uses the coordinator, instead of creating the schema itself (a least-privilege role could
    /// not).
    ///
    /// # Errors
    /// [`LeaseError::Backend`] saying what to do: the schema is missing or older (run
    /// [`migrate`](Self::migrate), `fencepost admin migrate`, as its owner), or newer than this code
    /// (upgrade it).
    pub fn check_schema(&self) -> Result<(), LeaseError> {
        let schema = &self.config.schema;
        let problem = match self.schema_version()? {
            SchemaState::Version(SCHEMA_VERSION) => return Ok(()),
            SchemaState::Version(found) if found > SCHEMA_VERSION => format!(
                "the fencepost schema {schema:?} is at version {found}, newer than this fencepost knows ({SCHEMA_VERSION}): upgrade fencepost"
            ),
            SchemaState::Version(found) => format!(
                "the fencepost schema {schema:?} is at version {found}, this fencepost needs {SCHEMA_VERSION}: run `fencepost admin migrate --coordinator URL` (or migrate()) once, as the schema's owner"
            ),
            SchemaState::Missing => format!(
                "the fencepost schema {schema:?} does not exist in this database (or this role cannot see it): run `fencepost admin migrate --coordinator URL` (or migrate()) once, as a role that may create it, and grant this role what the deployment docs list"
            ),
        };
        Err(failure(problem, false, None))
    }

    /// Every agent the coordinator has a register of (held, released, or only a raised floor),
    /// in order: `fencepost status` asks each for what its holders published.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the server cannot be reached or answers wrongly.
    pub fn agents(&self) -> Result<Vec<String>, LeaseError> {
        let statements = [format!(
            "SELECT agent_id FROM {}.leases ORDER BY agent_id",
            quote_identifier(&self.config.schema)
        )];
        let outcome = self.with_session(|session| {
            let sets = self.batch(session, &statements)?;
            let rows = sets.into_iter().next().unwrap_or_default();
            Ok(rows
                .iter()
                .map(|row| row.get(0).unwrap_or("").to_owned())
                .collect())
        });
        outcome.map_err(|error| self.explain("list the agents", error, false))
    }

    /// Every lease with a holder (expired or not), in agent order: what an operator lists.
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when the table cannot be read.
    pub fn list(&self) -> Result<Vec<Lease>, LeaseError> {
        let statements = [format!(
            "SELECT agent_id, holder, epoch, expires_at_ms FROM {}.leases WHERE holder IS NOT NULL ORDER BY agent_id",
            quote_identifier(&self.config.schema)
        )];
        let outcome = self.with_session(|session| {
            let sets = self.batch(session, &statements)?;
            let rows = sets.into_iter().next().unwrap_or_default();
            rows.iter()
                .map(|row| {
                    Ok(Lease {
                        agent_id: row.get(0).unwrap_or("").to_owned(),
                        holder: row.get(1).unwrap_or("").to_owned(),
                        epoch: COLUMNS.stored(integer(row, 2)?, "epoch")?,
                        expires_at_ms: COLUMNS.stored(integer(row, 3)?, "expires_at_ms")?,
                    })
                })
                .collect::<Result<Vec<_>, LeaseError>>()
                .map_err(CallError::Reply)
        });
        outcome.map_err(|error| self.explain("list", error, false))
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
    /// [`PostgresConfig::operation_timeout_ms`], which bounds `work`'s statements too: keep the
    /// work short.
    ///
    /// `work` gets a [`Connection`]: unnamed statements (`query_typed`, `execute_typed`, one round
    /// trip each) and simple queries, which work through a transaction-pooling proxy (PgBouncer's
    /// `pool_mode = transaction`); there is no named prepared statement, which such a proxy could
    /// hand to another client's server connection. A statement that does not answer within the
    /// client's bound fails with [`StatementError::NoAnswer`], and the transaction then commits
    /// nothing. Leave the transaction to the fence: no `COMMIT` or `ROLLBACK` of your own.
    ///
    /// It protects effects that are rows of this database only; see the [module docs](self) for
    /// what it cannot cover. It does not consult the ledger: make the effect idempotent by run id
    /// (a unique key) as well.
    ///
    /// # Errors
    /// * [`FencedError::Refused`]: not the holder at `epoch`; `work` did not run.
    /// * [`FencedError::Work`]: `work` failed; rolled back.
    /// * [`FencedError::Lease`]: an invalid id, or the database failed (a statement of `work` that
    ///   did not answer in time, or one that failed while `work` returned success, included).
    ///   `may_have_applied` is set only when the commit was sent and its answer lost; then look for
    ///   the effect's rows to learn the outcome.
    ///
    /// ```no_run
    /// use fencepost::backend::postgres::{driver::types::Type, FencedError, PostgresConfig, PostgresLeaseCoordinator};
    /// use fencepost::lease::LeaseCoordinator;
    ///
    /// let coordinator = PostgresLeaseCoordinator::connect(PostgresConfig::new("postgres://app@db/app"))?;
    /// let lease = coordinator.acquire("billing-agent", "laptop", 30_000)?;
    /// let outcome = coordinator.fenced_transaction("billing-agent", "laptop", lease.epoch, |transaction| {
    ///     transaction.execute_typed(
    ///         "INSERT INTO outbox (run_id, body) VALUES ($1, $2) ON CONFLICT (run_id) DO NOTHING",
    ///         &[(&"run-42", Type::TEXT), (&"invoice #42", Type::TEXT)],
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
        work: impl FnOnce(&mut Connection<'_>) -> Result<T, E>,
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
        let read = bind(&self.statements.read, &[Literal::Text(agent_id)]);
        let limit = self.client_limit();
        let outcome = self.with_session_per_statement(|session| {
            let mut opening = session.timeouts.clone();
            opening.push_str(&read);
            // Until the transaction ends, a session left here (a closure that panicked, an
            // answer lost) is not used again.
            session.open_transaction = true;
            let began = session
                .run(limit, |client| client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"));
            match began {
                Ok(()) => {}
                // PgBouncer in statement mode answers a transaction block by closing the
                // connection, often before its message can be read.
                Err(CallError::Statement(error))
                    if error.is_closed() || describe(&error).contains("pooling mode") =>
                {
                    return Err(CallError::Reply(failure(
                        format!(
                            "fenced_transaction: the connection was closed as the transaction began ({}): a pooler in statement mode (PgBouncer's pool_mode = statement) runs no transaction block; use transaction or session pooling for the fence",
                            describe(&error)
                        ),
                        false,
                        Some(error),
                    )))
                }
                Err(error) => return Err(error),
            }
            let ended = |session: &mut Session, end: &str| {
                session.run(limit, |client| client.batch_execute(end))?;
                session.open_transaction = false;
                Ok::<(), CallError>(())
            };
            let messages = match session.simple_query_within(&opening, limit) {
                Ok(messages) => messages,
                Err(error) => {
                    let _ = ended(session, "ROLLBACK");
                    return Err(error);
                }
            };
            // The read is the last statement: its rows are those after the last but one
            // CommandComplete.
            let read_rows = messages
                .iter()
                .rev()
                .skip_while(|message| !matches!(message, SimpleQueryMessage::CommandComplete(_)))
                .skip(1)
                .take_while(|message| !matches!(message, SimpleQueryMessage::CommandComplete(_)))
                .filter_map(|message| match message {
                    SimpleQueryMessage::Row(row) => Some(row),
                    _ => None,
                })
                .last();
            let row = read_rows.map(|row| lease_row(row, agent_id)).transpose();
            let row = match row {
                Ok(row) => row,
                Err(error) => {
                    let _ = ended(session, "ROLLBACK");
                    return Err(CallError::Reply(error));
                }
            };
            let decision = match row.map(|row| (row.0, row.1)) {
                Some((Some(holder), current)) if holder == device_id && current == claimed(epoch) => None,
                Some((Some(holder), current)) => Some(FenceDecision::StaleEpoch {
                    claimed_epoch: epoch,
                    current_epoch: u64::try_from(current).unwrap_or(0),
                    current_holder: holder,
                }),
                _ => Some(FenceDecision::NotHeld { claimed_epoch: epoch }),
            };
            if let Some(decision) = decision {
                ended(session, "ROLLBACK")?;
                return Ok(Step::Refused(decision));
            }
            let done = work(&mut Connection { session, limit });
            if session.spoiled {
                return Err(CallError::NoAnswer(limit.unwrap_or_default()));
            }
            if session.client.as_ref().is_none_or(Client::is_closed) {
                return Err(CallError::Reply(failure(
                    "fenced_transaction: the connection was lost during the work; nothing was committed",
                    false,
                    None,
                )));
            }
            match done {
                Ok(value) => {
                    // A statement of the work that failed, with the failure not returned, leaves
                    // the transaction aborted, and COMMIT would then roll back without an error:
                    // the SELECT before it fails instead.
                    commit_sent = true;
                    match session.run(limit, |client| client.batch_execute("SELECT 1; COMMIT")) {
                        Ok(()) => {
                            session.open_transaction = false;
                            Ok(Step::Done(value))
                        }
                        Err(CallError::Statement(error)) if !outcome_unknown(&error) => {
                            commit_sent = false;
                            ended(session, "ROLLBACK")?;
                            Err(CallError::Reply(failure(
                                format!("fenced_transaction: the work returned success, but a statement of it had failed ({}), which aborted the transaction; nothing was committed", describe(&error)),
                                false,
                                Some(error),
                            )))
                        }
                        Err(error) => Err(error),
                    }
                }
                Err(error) => {
                    ended(session, "ROLLBACK")?;
                    Ok(Step::Work(error))
                }
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
    /// lease table itself is the coordinator's to write. Each statement is bounded like an
    /// operation, and only pooler-safe statements are offered (see [`Connection`]).
    ///
    /// # Errors
    /// [`LeaseError::Backend`] when no connection can be made, or `work` fails; `may_have_applied`
    /// is set when the connection broke (or did not answer) while `work` ran.
    pub fn with_connection<T>(
        &self,
        work: impl FnOnce(&mut Connection<'_>) -> Result<T, StatementError>,
    ) -> Result<T, LeaseError> {
        let limit = self.client_limit();
        self.with_session_per_statement(|session| {
            work(&mut Connection { session, limit }).map_err(|error| match error {
                StatementError::Driver(error) => CallError::Statement(error),
                StatementError::NoAnswer(limit) => CallError::NoAnswer(limit),
            })
        })
        .map_err(|error| self.explain("with_connection", error, true))
    }

    /// Runs the operation `work` with a connected session, reconnecting first if the last
    /// connection broke: the reconnection and every statement of `work` share one bound, the
    /// client's bound on a call.
    fn with_session<T>(
        &self,
        work: impl FnOnce(&mut Session) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        self.session_call(true, work)
    }

    /// [`with_session`](Self::with_session), with the caller's statements bounded one by one
    /// (the reconnection alone has the bound of a call).
    fn with_session_per_statement<T>(
        &self,
        work: impl FnOnce(&mut Session) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        self.session_call(false, work)
    }

    fn session_call<T>(
        &self,
        one_bound: bool,
        work: impl FnOnce(&mut Session) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let bound = self.call_bound();
        let mut slot = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        if slot
            .as_mut()
            .is_none_or(|session| session.spoiled || session.open_transaction || !session.seems_open())
        {
            *slot = None;
            *slot = Some(self.new_session(bound).map_err(CallError::Connect)?);
        }
        let Some(session) = slot.as_mut() else {
            unreachable!("connected above");
        };
        session.deadline = if one_bound { bound } else { None };
        let outcome = work(session);
        session.deadline = None;
        outcome.inspect_err(|error| {
            // Reconnect on the next call after a lost connection, and after a reply that could
            // not be used (about another agent, unreadable, a connection the server closed).
            if matches!(error, CallError::Statement(error) if outcome_unknown(error))
                || matches!(error, CallError::Reply(_) | CallError::NoAnswer(_))
            {
                *slot = None;
            }
        })
    }

    /// The error of a failed call; `write` says whether the call sent a write whose answer may be
    /// lost.
    fn explain(&self, operation: &str, error: CallError, write: bool) -> LeaseError {
        match error {
            CallError::Connect(error) | CallError::Reply(error) => error,
            CallError::NoAnswer(limit) => {
                tracing::warn!(
                    operation,
                    waited_ms = limit.as_millis() as u64,
                    "PostgreSQL did not answer in time"
                );
                passing(failure(
                    format!(
                        "{operation}: no answer within {} ms (operation_timeout plus {CLIENT_MARGIN_MS} ms): a pooler with no free server connection or unable to log in to its server, or a server or pooler that stopped answering; the connection was given up",
                        limit.as_millis()
                    ),
                    write,
                    None,
                ))
            }
            CallError::Statement(error) => {
                let unknown = outcome_unknown(&error);
                let described = describe(&error);
                let hint = match error.code() {
                    Some(code) if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::INVALID_SCHEMA_NAME => {
                        " (the fencepost schema or a table of it is missing: run `fencepost admin migrate` or migrate() once as its owner, or check the schema name)"
                    }
                    Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => {
                        " (the role lacks a grant on the fencepost schema: see the grants in the deployment docs)"
                    }
                    Some(code) if *code == SqlState::READ_ONLY_SQL_TRANSACTION => {
                        " (the server is read-only: a standby, or default_transaction_read_only is set; point the coordinator at the primary)"
                    }
                    Some(code) if (*code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE) && RELAY_OPERATIONS.contains(&operation) => {
                        " (timed out: another writer held the device's row of the ledger, or the server is slow; not applied. The bound is the lower of operation_timeout and the role's statement_timeout/lock_timeout)"
                    }
                    Some(code) if (*code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE) && LEASE_OPERATIONS.contains(&operation) => {
                        " (timed out: the lease row stayed locked, or the server is slow; not applied. The bound is the lower of operation_timeout and the role's statement_timeout/lock_timeout)"
                    }
                    Some(code) if *code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE => {
                        " (timed out: the server is slow, or another session held a lock on the fencepost schema's tables, a migration say; not applied. The bound is the lower of operation_timeout and the role's statement_timeout/lock_timeout)"
                    }
                    _ if described.contains("pooling mode") || described.contains("pool_mode") => {
                        " (a pooling proxy in a mode that cannot run transactions, such as PgBouncer's statement mode: use transaction or session pooling)"
                    }
                    _ if unknown => " (the connection was lost; the next call reconnects)",
                    _ => "",
                };
                tracing::warn!(operation, error = %described, may_have_applied = write && unknown, "PostgreSQL call failed");
                let transient = passes(&error);
                let failed = failure(
                    format!("{operation}: {described}{hint}"),
                    write && unknown,
                    Some(error),
                );
                if transient {
                    passing(failed)
                } else {
                    failed
                }
            }
        }
    }

    /// Runs one write statement followed by the share-locked read of the agent's row, in one
    /// transaction and one round trip: the write's rows, and the row as it is right after it
    /// (locked by the write when it touched it, so a verdict reads the same instant).
    ///
    /// With `commit_apart`, the transaction is explicit and its `COMMIT` is a second round trip,
    /// sent only once the first answered: a call given up before then (no answer within the
    /// bound) closes the connection, and the server rolls the write back, even one it runs late
    /// (a stopped server that resumes). So only a lost answer to the `COMMIT` leaves the outcome
    /// unknown: a `COMMIT` already sent can still run late (one waiting in a stopped server's
    /// socket), and the error then says the write may have applied. `acquire` uses it: a grant
    /// the caller never heard of would otherwise hold the agent for a whole TTL after the caller
    /// gave up, in the first round trip's window as well as the second's.
    ///
    /// Statements `before` the write run first in the same transaction (their results are not
    /// returned), and one `after` the read last (its rows are returned).
    fn write_then_read(
        &self,
        operation: &str,
        before: &[String],
        write: String,
        agent_id: &str,
        commit_apart: bool,
        after: Option<&String>,
    ) -> Result<WrittenThenRead, LeaseError> {
        let commit_apart = commit_apart && !self.autocommit_only.load(AtomicOrdering::Relaxed);
        let mut statements = before.to_vec();
        statements.push(write.clone());
        statements.push(bind(&self.statements.read, &[Literal::Text(agent_id)]));
        statements.extend(after.cloned());
        let mut commit_sent = !commit_apart;
        let outcome = self.with_session(|session| {
            let sets = if commit_apart {
                self.transaction_then_commit(session, &statements, &mut commit_sent)?
            } else {
                self.batch(session, &statements)?
            };
            let mut sets = sets.into_iter().skip(before.len());
            let written = sets.next().unwrap_or_default();
            let read = sets
                .next()
                .unwrap_or_default()
                .first()
                .map(|row| lease_row(row, agent_id))
                .transpose()?;
            let after = sets.next().unwrap_or_default();
            Ok((written, read, after))
        });
        match outcome {
            Ok(rows) => Ok(rows),
            // A pooler in statement mode runs no transaction block: it closes the connection at
            // the first message, often before its error can be read. Nothing was committed (no
            // COMMIT was sent), so the operation runs again as one implicit transaction, and the
            // coordinator keeps to those once the pooler named its mode.
            Err(CallError::Statement(error))
                if commit_apart
                    && !commit_sent
                    && (describe(&error).contains("pooling mode")
                        || (error.is_closed() && error.as_db_error().is_none())) =>
            {
                if describe(&error).contains("pooling mode") {
                    self.autocommit_only.store(true, AtomicOrdering::Relaxed);
                }
                tracing::debug!(operation, error = %describe(&error), "a transaction block was refused; running the operation as one implicit transaction");
                self.write_then_read(operation, before, write, agent_id, false, after)
            }
            Err(error) => Err(self.explain(operation, error, commit_sent)),
        }
    }

    /// Runs `statements` in an explicit READ COMMITTED transaction (the timeouts first), in one
    /// round trip, then commits in a second (see [`write_then_read`](Self::write_then_read));
    /// `commit_sent` says whether the `COMMIT` went out. A statement the server refused rolls the
    /// transaction back.
    fn transaction_then_commit(
        &self,
        session: &mut Session,
        statements: &[String],
        commit_sent: &mut bool,
    ) -> Result<ResultSets, CallError> {
        let limit = self.client_limit();
        let mut text = String::with_capacity(256 + statements.iter().map(String::len).sum::<usize>());
        text.push_str("BEGIN ISOLATION LEVEL READ COMMITTED;");
        text.push_str(&session.timeouts);
        for statement in statements {
            text.push_str(statement);
            text.push(';');
        }
        session.open_transaction = true;
        let messages = match session.simple_query_within(&text, limit) {
            Ok(messages) => messages,
            Err(CallError::Statement(error)) if !outcome_unknown(&error) => {
                session.run(limit, |client| client.batch_execute("ROLLBACK"))?;
                session.open_transaction = false;
                return Err(CallError::Statement(error));
            }
            Err(error) => return Err(error),
        };
        *commit_sent = true;
        session.run(limit, |client| client.batch_execute("COMMIT"))?;
        session.open_transaction = false;
        // `BEGIN` and the timeouts, then the statements.
        let skip = 1 + session.timeouts.matches(';').count();
        Ok(result_sets(messages)
            .into_iter()
            .skip(skip)
            .take(statements.len())
            .collect())
    }
}

/// The operations of the ledger in the database, as [`RelayError::Database`] names them.
const RELAY_OPERATIONS: [&str; 3] = ["push to", "pull from", "append to"];

/// The operations that lock an agent's lease row.
const LEASE_OPERATIONS: [&str; 6] = [
    "acquire",
    "renew",
    "release",
    "raise_epoch_floor",
    "publish_frontier",
    "fenced_transaction",
];

/// What the ledger in the database ([`PostgresRelay`](crate::relay::PostgresRelay)) runs on a
/// coordinator's session: the same bounds, reconnection and pooler-safe statements (simple query
/// protocol, values as literals, no prepared statement, no session setting).
impl PostgresLeaseCoordinator {
    /// The schema's name, quoted as an SQL identifier.
    pub(crate) fn quoted_schema(&self) -> String {
        quote_identifier(&self.config.schema)
    }

    /// Runs `statements` (reads) as one implicit transaction in one round trip; returns each one's
    /// rows. Without JIT compilation: the relay's reads are short index range scans whose bounds the
    /// planner cannot see (a frontier), so it estimates a third of a large table and would spend
    /// more on compiling (measured: 18 ms on a table of a million records) than on the read.
    pub(crate) fn read_rows(
        &self,
        operation: &'static str,
        statements: Vec<String>,
    ) -> Result<Vec<Vec<SimpleQueryRow>>, RelayError> {
        let mut all = vec!["SET LOCAL jit = off".to_owned()];
        all.extend(statements);
        self.with_session(|session| self.batch(session, &all))
            .map(|sets| sets.into_iter().skip(1).collect())
            .map_err(|error| self.relay_failure(operation, error, false))
    }

    /// Runs `statements` (writes that may be repeated: a lost answer is an error saying they may
    /// have applied) as one implicit transaction in one round trip; returns each one's rows.
    pub(crate) fn write_rows(
        &self,
        operation: &'static str,
        statements: Vec<String>,
    ) -> Result<Vec<Vec<SimpleQueryRow>>, RelayError> {
        self.with_session(|session| self.batch(session, &statements))
            .map_err(|error| self.relay_failure(operation, error, true))
    }

    /// One explicit transaction in two round trips: `first` (reads that lock what they read), then
    /// the statements `then` builds from their rows, with the `COMMIT`. `then` refusing rolls the
    /// transaction back. Only a lost answer to the second round trip leaves the outcome unknown
    /// (`may_have_applied`).
    pub(crate) fn two_round_transaction<T>(
        &self,
        operation: &'static str,
        first: &[String],
        then: impl FnOnce(Vec<Vec<SimpleQueryRow>>) -> Result<(Vec<String>, T), RelayError>,
    ) -> Result<T, RelayError> {
        let limit = self.client_limit();
        let mut refused = None;
        let mut commit_sent = false;
        let outcome = self.with_session(|session| {
            let mut text = String::with_capacity(256 + first.iter().map(String::len).sum::<usize>());
            text.push_str("BEGIN ISOLATION LEVEL READ COMMITTED;");
            text.push_str(&session.timeouts);
            for statement in first {
                text.push_str(statement);
                text.push(';');
            }
            session.open_transaction = true;
            let messages = match session.simple_query_within(&text, limit) {
                // PgBouncer in statement mode answers a transaction block by closing the
                // connection, often before its message can be read. Nothing was written.
                // A closed connection alone may also be a restart or a lost connection (found
                // by losing each query of a run in turn: it was reported as statement mode, and
                // not tried again): that passes, and the message says both.
                Err(CallError::Statement(error))
                    if (error.is_closed() && error.as_db_error().is_none())
                        || describe(&error).contains("pooling mode") =>
                {
                    let described = describe(&error);
                    let statement_mode = described.contains("pooling mode");
                    let failed = failure(
                        if statement_mode {
                            format!("the transaction was refused as it began ({described}): a pooler in statement mode (PgBouncer's pool_mode = statement) runs no transaction block; use transaction or session pooling for the ledger")
                        } else {
                            format!("the connection was closed as the transaction began ({described}): the server or a pooler restarted, or the connection was lost (or a pooler in statement mode, PgBouncer's pool_mode = statement, which runs no transaction block, closed it: use transaction or session pooling for the ledger); nothing was written")
                        },
                        false,
                        Some(error),
                    );
                    return Err(CallError::Reply(if statement_mode { failed } else { passing(failed) }));
                }
                answer => Self::or_roll_back(session, limit, answer)?,
            };
            let skip = 1 + session.timeouts.matches(';').count();
            let sets: Vec<_> = result_sets(messages).into_iter().skip(skip).take(first.len()).collect();
            let (second, value) = match then(sets) {
                Ok(planned) => planned,
                Err(error) => {
                    refused = Some(error);
                    session.run(limit, |client| client.batch_execute("ROLLBACK"))?;
                    session.open_transaction = false;
                    return Ok(None);
                }
            };
            let mut text = String::with_capacity(16 + second.iter().map(String::len).sum::<usize>());
            for statement in &second {
                text.push_str(statement);
                text.push(';');
            }
            text.push_str("COMMIT");
            commit_sent = true;
            let messages = session.simple_query_within(&text, limit);
            Self::or_roll_back(session, limit, messages)?;
            session.open_transaction = false;
            Ok(Some(value))
        });
        match outcome {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(refused.unwrap_or_else(|| unreachable!("set when `then` refused"))),
            Err(error) => Err(self.relay_failure(operation, error, commit_sent)),
        }
    }

    /// A round trip's answer; a statement the server refused has aborted the transaction, which
    /// is rolled back (the session stays usable).
    fn or_roll_back(
        session: &mut Session,
        limit: Option<Duration>,
        answer: Result<Vec<SimpleQueryMessage>, CallError>,
    ) -> Result<Vec<SimpleQueryMessage>, CallError> {
        match answer {
            Err(CallError::Statement(error)) if !outcome_unknown(&error) => {
                session.run(limit, |client| client.batch_execute("ROLLBACK"))?;
                session.open_transaction = false;
                Err(CallError::Statement(error))
            }
            other => other,
        }
    }

    /// A failed call of the relay as a [`RelayError`]; `write` says whether a write was sent
    /// whose answer may be lost.
    fn relay_failure(&self, operation: &'static str, error: CallError, write: bool) -> RelayError {
        let (message, may_have_applied, transient) = match self.explain(operation, error, write) {
            LeaseError::Backend(error) => (error.message, error.may_have_applied, error.transient),
            other => (other.to_string(), false, false),
        };
        // `explain` names the operation first; the relay's error names it too.
        let message = message
            .strip_prefix(operation)
            .and_then(|rest| rest.strip_prefix(": "))
            .map(str::to_owned)
            .unwrap_or(message);
        RelayError::Database {
            operation,
            message,
            may_have_applied,
            transient,
        }
    }
}

/// The statements that open each transaction of a session, from what the role gets by default
/// (read once per connection): `SET TRANSACTION ISOLATION LEVEL READ COMMITTED` unless that is the
/// default, and for `statement_timeout` and `lock_timeout` a `SET LOCAL` to `operation_timeout_ms`
/// where the default is no limit or a longer one: the operator's lower timeout is never raised,
/// and nothing outlives the transaction. Returns the isolation part and the timeouts part; both
/// are `SET`s (no rows).
fn opening(
    isolation: Option<&str>,
    statement_timeout: Option<&str>,
    lock_timeout: Option<&str>,
    operation_timeout_ms: u64,
) -> (&'static str, String) {
    let isolation = if isolation == Some("read committed") {
        ""
    } else {
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"
    };
    let mut timeouts = String::new();
    if operation_timeout_ms > 0 {
        for (setting, current) in [
            ("statement_timeout", statement_timeout),
            ("lock_timeout", lock_timeout),
        ] {
            let current_ms = current.and_then(setting_ms).unwrap_or(0);
            if current_ms == 0 || current_ms > operation_timeout_ms {
                // A utility statement: cheaper for the server than `SELECT set_config(…, true)`.
                timeouts.push_str(&format!("SET LOCAL {setting} = {operation_timeout_ms};"));
            }
        }
    }
    (isolation, timeouts)
}

/// What [`PostgresLeaseCoordinator::write_then_read`] returns: the write's rows, the lease row
/// read after it, and the rows of the statement after the read.
type WrittenThenRead = (Vec<SimpleQueryRow>, Option<Row>, Vec<SimpleQueryRow>);

/// The published frontier in `rows` of the `published` statement (agent, device, next seq).
fn frontier_of(rows: &[SimpleQueryRow], agent_id: &str) -> Result<Frontier, LeaseError> {
    let mut frontier = Frontier::new();
    for row in rows {
        for_agent(row, agent_id)?;
        let device = row.get(1).unwrap_or("");
        let head = row.get(3).map(|head| COLUMNS.head(head)).transpose()?;
        frontier.raise_to(device, COLUMNS.stored(integer(row, 2)?, "next seq")?, head);
    }
    Ok(frontier)
}

/// The error of a call on a connection that was given up.
fn given_up() -> LeaseError {
    failure(
        "the connection was given up after a call that did not answer",
        true,
        None,
    )
}

/// A time setting as `current_setting` shows it (`0`, `500us`, `50ms`, `10s`, `2min`, `1h`,
/// `1d`; also the URL's `operation_timeout`, in the same units), in milliseconds rounded up;
/// `None` when it does not parse.
fn setting_ms(text: &str) -> Option<u64> {
    let split = text
        .find(|character: char| !character.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits.parse().ok()?;
    let scaled = match unit.trim() {
        "" | "ms" => Some(value),
        "us" => Some(value.div_ceil(1_000)),
        "s" => value.checked_mul(1_000),
        "min" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        "d" => value.checked_mul(86_400_000),
        _ => None,
    };
    scaled
}

impl LeaseCoordinator for PostgresLeaseCoordinator {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        self.grant(agent_id, device_id, ttl_ms, false)
            .map(|(lease, _)| lease)
    }

    fn acquire_handing_over(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<(Lease, Option<Frontier>), LeaseError> {
        self.grant(agent_id, device_id, ttl_ms, true)
    }

    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        self.extend(agent_id, device_id, epoch, ttl_ms, None)
            .map(|(lease, _)| lease)
    }

    fn renew_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
        frontier: &Frontier,
    ) -> Result<(Lease, bool), LeaseError> {
        validate_frontier(frontier)?;
        self.extend(agent_id, device_id, epoch, ttl_ms, Some(frontier))
    }

    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        self.give_back(agent_id, device_id, epoch, None)
    }

    fn release_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        validate_frontier(frontier)?;
        self.give_back(agent_id, device_id, epoch, Some(frontier))
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
                epoch: COLUMNS.stored(epoch, "epoch")?,
                expires_at_ms: COLUMNS.stored(expires_at_ms, "expires_at_ms")?,
            })),
            _ => Ok(None),
        }
    }

    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_epoch_floor(floor)?;
        let floor = COLUMNS.storable(floor, "epoch floor")?;
        let statements = [bind(
            &self.statements.raise_floor,
            &[Literal::Text(agent_id), Literal::Int(floor)],
        )];
        self.with_session(|session| self.batch(session, &statements))
            .map(drop)
            .map_err(|error| self.explain("raise_epoch_floor", error, true))
    }

    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        validate_publish(agent_id, device_id, frontier)?;
        let mut statements = vec![bind(&self.statements.read, &[Literal::Text(agent_id)])];
        if !frontier.is_empty() {
            statements.push(self.publish_statement(agent_id, device_id, epoch, frontier)?);
        }
        let row = self
            .with_session(|session| {
                let sets = self.batch(session, &statements)?;
                Ok(sets
                    .first()
                    .and_then(|rows| rows.first())
                    .map(|row| lease_row(row, agent_id))
                    .transpose()?)
            })
            .map_err(|error| self.explain("publish_frontier", error, true))?;
        match row {
            Some((Some(holder), current, _, _)) if holder == device_id && current == claimed(epoch) => Ok(()),
            other => Err(COLUMNS.lost(agent_id, epoch, other.map_or(0, |row| row.1))),
        }
    }

    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        let statements = [bind(&self.statements.published, &[Literal::Text(agent_id)])];
        let rows = self
            .with_session(|session| {
                let sets = self.batch(session, &statements)?;
                Ok(sets.into_iter().next().unwrap_or_default())
            })
            .map_err(|error| self.explain("published_frontier", error, false))?;
        frontier_of(&rows, agent_id)
    }
}

impl PostgresLeaseCoordinator {
    /// Acquires (rule L1); with `read_published`, reads the published frontier in the grant's
    /// transaction and round trip (rule H3).
    fn grant(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
        read_published: bool,
    ) -> Result<(Lease, Option<Frontier>), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let ttl = COLUMNS.storable(ttl_ms, "ttl_ms")?;
        let published_statement = bind(&self.statements.published, &[Literal::Text(agent_id)]);
        let write = bind(
            &self.statements.acquire,
            &[
                Literal::Text(agent_id),
                Literal::Text(device_id),
                Literal::Int(ttl),
            ],
        );
        // The first try creates the agent's row (unheld) when it has none; the second grants.
        for _ in 0..2 {
            let (written, read, published) = self.write_then_read(
                "acquire",
                &[],
                write.clone(),
                agent_id,
                true,
                read_published.then_some(&published_statement),
            )?;
            if let Some(row) = written.first() {
                for_agent(row, agent_id)?;
                let Some(holder) = row.get(1) else {
                    continue; // the agent's row was just created, unheld: grant in the conflict branch
                };
                if holder != device_id {
                    return Err(failure(
                        format!("acquire: the server granted {agent_id:?} to {holder:?}, not {device_id:?}: statements of two clients were mixed (a pooling proxy?)"),
                        true,
                        None,
                    ));
                }
                let lease = Lease {
                    agent_id: agent_id.to_owned(),
                    holder: holder.to_owned(),
                    epoch: COLUMNS.stored(integer(row, 2)?, "epoch")?,
                    expires_at_ms: COLUMNS.stored(integer(row, 3)?, "expires_at_ms")?,
                };
                // What the earlier holders published, read in the grant's transaction (H3).
                let published = read_published
                    .then(|| frontier_of(&published, agent_id).ok())
                    .flatten();
                return Ok((lease, published));
            }
            // Refused: the write locked the row, and the read saw it under that lock.
            return match read {
                Some((_, epoch, _, _)) if epoch == i64::MAX => Err(LeaseError::EpochsExhausted {
                    agent_id: agent_id.to_owned(),
                    last_epoch: MAX_EPOCH,
                }),
                Some((Some(holder), epoch, expires_at_ms, _)) => Err(LeaseError::Held {
                    agent_id: agent_id.to_owned(),
                    holder,
                    epoch: COLUMNS.stored(epoch, "epoch")?,
                    expires_at_ms: COLUMNS.stored(expires_at_ms, "expires_at_ms")?,
                }),
                other => Err(failure(
                    format!("acquire: refused, but the lease row of {agent_id:?} reads {other:?}"),
                    false,
                    None,
                )),
            };
        }
        Err(failure(
            format!("acquire: the lease row of {agent_id:?} was created but could not be granted; was it deleted?"),
            false,
            None,
        ))
    }

    /// Renews (rule L2); with a frontier, publishes it in the same transaction and round trip
    /// (rule H2), and says whether it was.
    fn extend(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
        frontier: Option<&Frontier>,
    ) -> Result<(Lease, bool), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let ttl = COLUMNS.storable(ttl_ms, "ttl_ms")?;
        let write = bind(
            &self.statements.renew,
            &[
                Literal::Text(agent_id),
                Literal::Text(device_id),
                Literal::Int(claimed(epoch)),
                Literal::Int(ttl),
            ],
        );
        let mut statements = vec![write];
        if let Some(frontier) = frontier.filter(|frontier| !frontier.is_empty()) {
            // In the renewal's transaction, after it locked the row: only the holder it just
            // renewed publishes (rule H2).
            statements.push(self.publish_statement(agent_id, device_id, epoch, frontier)?);
        }
        let outcome = self
            .with_session(|session| {
                let sets = self.batch(session, &statements)?;
                let published = sets.get(1).is_some_and(|rows| !rows.is_empty());
                let rows = sets.into_iter().next().unwrap_or_default();
                let row = rows.first();
                if let Some(row) = row {
                    for_agent(row, agent_id)?;
                }
                match row {
                    Some(row) if row.get(1) == Some(device_id) => Ok(Ok((integer(row, 3)?, published))),
                    // The agent had no row: epoch 0.
                    Some(row) => Ok(Err(integer(row, 2)?)),
                    // Refused: read the current epoch (never the caller's again).
                    None => Ok(Err(self.lost(session, agent_id)?)),
                }
            })
            .map_err(|error| self.explain("renew", error, true))?;
        match outcome {
            Ok((expires_at_ms, published)) => Ok((
                Lease {
                    agent_id: agent_id.to_owned(),
                    holder: device_id.to_owned(),
                    epoch,
                    expires_at_ms: COLUMNS.stored(expires_at_ms, "expires_at_ms")?,
                },
                published || frontier.is_none_or(Frontier::is_empty),
            )),
            Err(current_epoch) => Err(COLUMNS.lost(agent_id, epoch, current_epoch)),
        }
    }

    /// Releases (rule L3); with a frontier, publishes it first in the same transaction and
    /// round trip (rule H2), after the share-locked read of the row, so that no grant comes
    /// between the holder check and the publication.
    fn give_back(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: Option<&Frontier>,
    ) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        let write = bind(
            &self.statements.release,
            &[
                Literal::Text(agent_id),
                Literal::Text(device_id),
                Literal::Int(claimed(epoch)),
            ],
        );
        let mut before = Vec::new();
        if let Some(frontier) = frontier.filter(|frontier| !frontier.is_empty()) {
            before.push(bind(&self.statements.read, &[Literal::Text(agent_id)]));
            before.push(self.publish_statement(agent_id, device_id, epoch, frontier)?);
        }
        let (written, read, _) = self.write_then_read("release", &before, write, agent_id, false, None)?;
        if let Some(row) = written.first() {
            return for_agent(row, agent_id);
        }
        Err(COLUMNS.lost(agent_id, epoch, read.map_or(0, |row| row.1)))
    }

    /// The `INSERT … VALUES` list of a frontier to publish.
    fn frontier_values(frontier: &Frontier) -> Result<String, LeaseError> {
        let mut values = String::new();
        for (index, (device, next_seq)) in frontier.iter().enumerate() {
            if index > 0 {
                values.push(',');
            }
            values.push('(');
            Literal::Text(device).write(&mut values);
            values.push(',');
            Literal::Int(COLUMNS.storable(next_seq, "next seq")?).write(&mut values);
            values.push(',');
            match frontier.head(device) {
                Some(head) => Literal::Text(&head.to_string()).write(&mut values),
                None => values.push_str("NULL::text"),
            }
            values.push(')');
        }
        Ok(values)
    }

    /// The statement that publishes `frontier` (non-empty) for the holder at `epoch`.
    fn publish_statement(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<String, LeaseError> {
        let values = Self::frontier_values(frontier)?;
        Ok(bind(
            &self.statements.publish,
            &[
                Literal::Text(agent_id),
                Literal::Text(device_id),
                Literal::Int(claimed(epoch)),
                Literal::Sql(&values),
            ],
        ))
    }

    /// Reads the row, share-locked, with the server clock.
    fn read(&self, session: &mut Session, agent_id: &str) -> Result<Option<Row>, CallError> {
        let statements = [bind(&self.statements.read, &[Literal::Text(agent_id)])];
        let sets = self.batch(session, &statements)?;
        Ok(sets
            .into_iter()
            .next()
            .unwrap_or_default()
            .first()
            .map(|row| lease_row(row, agent_id))
            .transpose()?)
    }

    /// The current epoch, for a `Lost`: read after the failed write, when it is still not the
    /// caller's (epochs never repeat, so it never will be again).
    fn lost(&self, session: &mut Session, agent_id: &str) -> Result<i64, CallError> {
        Ok(self.read(session, agent_id)?.map_or(0, |row| row.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that accepts TCP connections and never answers (a stopped pooler or server): the
    /// connections it accepted, kept open until the test ends.
    fn silent_server() -> (u16, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let holder = std::thread::spawn(move || {
            let mut held = Vec::new();
            listener.set_nonblocking(true).unwrap();
            let until = RealTimeLimit::starting_now(Duration::from_secs(20));
            while !until.passed() {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        (port, holder)
    }

    /// A server that answers every login with an `ErrorResponse` of SQLSTATE `code` (as
    /// PgBouncer does with `08P01` while its server's logins fail, `server_login_retry`).
    fn refusing_server(code: &'static str, message: &'static str) -> u16 {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut length = [0u8; 4];
                if stream.read_exact(&mut length).is_err() {
                    continue;
                }
                let mut rest = vec![0u8; (u32::from_be_bytes(length) as usize).saturating_sub(4)];
                let _ = stream.read_exact(&mut rest);
                let mut fields = Vec::new();
                for (kind, value) in [(b'S', "FATAL"), (b'C', code), (b'M', message)] {
                    fields.push(kind);
                    fields.extend_from_slice(value.as_bytes());
                    fields.push(0);
                }
                fields.push(0);
                let mut answer = vec![b'E'];
                answer.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                answer.extend_from_slice(&fields);
                let _ = stream.write_all(&answer);
            }
        });
        port
    }

    /// Issue 37, item 6 (rule L7): a pooler that refuses logins while its server restarts is a
    /// failure that passes (`transient`), so that callers wait it out within their bound; a
    /// wrong password is not, and neither is a missing database.
    #[test]
    fn l7_a_login_refused_by_a_restarting_pooler_is_transient_a_wrong_password_is_not() {
        let connect = |code, message| {
            let port = refusing_server(code, message);
            PostgresLeaseCoordinator::connect(PostgresConfig {
                connect_attempts: 2,
                ..PostgresConfig::new(format!("postgres://fencepost@127.0.0.1:{port}/app"))
            })
            .expect_err("the server refuses every login")
        };
        let refused = connect(
            "08P01",
            "server login has been failing, try again later (server_login_retry)",
        );
        assert!(refused.is_transient(), "{refused}");
        assert!(
            refused.to_string().contains("server login has been failing"),
            "{refused}"
        );
        let starting = connect("57P03", "the database system is starting up");
        assert!(starting.is_transient(), "{starting}");
        for (code, message) in [
            ("28P01", "password authentication failed for user \"fencepost\""),
            ("3D000", "database \"app\" does not exist"),
        ] {
            let refused = connect(code, message);
            assert!(!refused.is_transient(), "{code}: {refused}");
        }
    }

    /// A database's identity leaves out how the URL spells it (the host's outbox is keyed by it).
    #[test]
    fn a_database_identity_is_the_same_however_the_url_spells_it() {
        let identity = |url: &str| PostgresConfig::new(url).database_identity().unwrap();
        let plain = identity("postgres://fp:secret@db.internal:5432/app");
        for url in [
            "postgresql://fp:other@db.internal/app",
            "postgres://fp@DB.internal:5432/app?operation_timeout=5s&sslmode=disable",
            "postgres://db.internal/app?user=fp&password=secret",
            "postgres:///app?host=db.internal&user=fp",
        ] {
            assert_eq!(identity(url), plain, "{url}");
        }
        assert_ne!(identity("postgres://fp@db.internal/other"), plain);
        assert_ne!(identity("postgres://fp@db.internal:6432/app"), plain);
        assert!(PostgresConfig::new("not a url").database_identity().is_none());
    }

    /// Issue 14, item 4: every attempt to connect to a server that never answers shares one
    /// bound, the client's bound on a call; each attempt used to wait it out again, and the
    /// connect timeout came on top (three attempts of 5 s plus the bound).
    #[test]
    fn connecting_to_a_silent_server_is_bounded_once_for_all_attempts() {
        let (port, _holder) = silent_server();
        let config = PostgresConfig {
            connect_timeout_ms: 500,
            connect_attempts: 3,
            ..PostgresConfig::new(format!(
                "postgres://agent:secret@127.0.0.1:{port}/app?operation_timeout=200ms"
            ))
        };
        let started = RealTimeLimit::starting_now(Duration::ZERO);
        let error = PostgresLeaseCoordinator::connect(config).unwrap_err();
        let took = started.elapsed();
        let bound = Duration::from_millis(200 + CLIENT_MARGIN_MS);
        assert!(error.to_string().contains("no answer within"), "{error}");
        assert!(
            took >= bound,
            "gave up after {took:?}, before the bound {bound:?}"
        );
        assert!(
            took < bound + Duration::from_millis(1_000),
            "three attempts of {bound:?} each: {took:?}"
        );
    }

    /// Issue 14, item 4: the operator's lower timeouts are kept, unlimited or longer ones are
    /// bounded, and READ COMMITTED is set only where it is not the default.
    #[test]
    fn the_operation_timeout_never_raises_the_operators() {
        assert_eq!(setting_ms("0"), Some(0));
        assert_eq!(setting_ms("50ms"), Some(50));
        assert_eq!(setting_ms("1500"), Some(1_500));
        assert_eq!(setting_ms("10s"), Some(10_000));
        assert_eq!(setting_ms("2min"), Some(120_000));
        assert_eq!(setting_ms("1h"), Some(3_600_000));
        assert_eq!(setting_ms("1d"), Some(86_400_000));
        assert_eq!(setting_ms("500us"), Some(1));
        assert_eq!(setting_ms("soon"), None);
        let (isolation, timeouts) = opening(Some("read committed"), Some("0"), Some("0"), 10_000);
        assert_eq!(isolation, "");
        assert_eq!(
            timeouts,
            "SET LOCAL statement_timeout = 10000;SET LOCAL lock_timeout = 10000;"
        );
        let (isolation, timeouts) = opening(Some("serializable"), Some("50ms"), Some("1min"), 10_000);
        assert_eq!(isolation, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;");
        assert_eq!(
            timeouts, "SET LOCAL lock_timeout = 10000;",
            "the role's 50 ms stays"
        );
        assert_eq!(opening(Some("read committed"), Some("0"), Some("0"), 0).1, "");
        assert_eq!(
            opening(None, Some("what"), None, 300).1,
            "SET LOCAL statement_timeout = 300;SET LOCAL lock_timeout = 300;"
        );
    }

    /// Rule L8 in SQL: literals are escaped, placeholders replaced once, other dollars kept.
    #[test]
    fn literals_are_escaped_and_bound_once() {
        let bound = bind(
            "SELECT $1, $2, $$x$$, $9",
            &[Literal::Text("it's a \\ back'slash"), Literal::Int(-1)],
        );
        assert_eq!(
            bound,
            "SELECT E'it''s a \\\\ back''slash', (-1)::bigint, $$x$$, $9"
        );
    }
}
