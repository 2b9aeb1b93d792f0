//! [`PostgresConfig`]: where the coordinator's database is, its schema, and the bound on every
//! call (`operation_timeout`).

use super::*;

/// The longest schema name PostgreSQL keeps (longer names are truncated, silently).
pub(super) const MAX_SCHEMA_BYTES: usize = 63;

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
pub(super) const OPERATION_TIMEOUT_PARAMETER: &str = "operation_timeout";

/// Splits `operation_timeout=…` off a URL's query: the URL without it, and its value in
/// milliseconds (`None` when the value does not parse). `None` when the URL has no such parameter.
pub(super) fn take_operation_timeout(url: &str) -> Option<(String, Option<u64>)> {
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
