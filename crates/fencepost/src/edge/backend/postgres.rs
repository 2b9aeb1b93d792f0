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
//!   -- and for the role that compacts the ledger (`fencepost ledger compact`):
//!   -- GRANT INSERT, UPDATE, DELETE ON fencepost.relay_checkpoints, fencepost.relay_checkpoint_chunks TO …;
//!   -- and for the one that prunes it (`compact --prune`), besides:
//!   -- GRANT DELETE ON fencepost.relay_records TO …;
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

mod config;
mod coordinator;
mod failure;
mod fenced;
mod relay_access;
mod schema;
mod session;
mod sql;

use config::*;
pub use config::{PostgresConfig, CLIENT_MARGIN_MS, DEFAULT_OPERATION_TIMEOUT_MS, MAX_OPERATION_TIMEOUT_MS};
use coordinator::*;
use failure::*;
pub use fenced::FencedError;
pub use schema::{SchemaState, SCHEMA_VERSION};
use session::*;
pub use session::{Connection, StatementError};
pub use sql::SERVER_CLOCK_SQL;
use sql::*;
pub(crate) use sql::{bind, quote_identifier, Literal};

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
}

/// What the ledger in the database ([`PostgresRelay`](crate::relay::PostgresRelay)) runs on a
/// coordinator's session: the same bounds, reconnection and pooler-safe statements (simple query
/// protocol, values as literals, no prepared statement, no session setting).
impl PostgresLeaseCoordinator {}

impl PostgresLeaseCoordinator {}

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
