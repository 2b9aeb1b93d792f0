//! The SQL text: the coordinator's statements in one schema, and literals bound into a
//! template (one round trip, through any pooler).

use super::*;

/// The database server's clock in milliseconds since the Unix epoch: the coordinator clock.
pub const SERVER_CLOCK_SQL: &str = "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint";

/// The SQL of each operation, built once from the schema and clock of the config.
#[derive(Debug)]
pub(super) struct Statements {
    /// Creates or upgrades the schema to [`SCHEMA_VERSION`] (several statements).
    pub(super) migrate: String,
    /// Returns the schema's version.
    pub(super) version: String,
    /// `$1` agent, `$2` device, `$3` ttl. Inserts an unheld row for a new agent (no clock read
    /// outside the row lock); grants on a free or expired row. Returns `holder, epoch, expires`.
    pub(super) acquire: String,
    /// `$1` agent, `$2` device, `$3` epoch, `$4` ttl. Returns `holder, epoch, expires`: the
    /// renewed lease, or an unheld row it just created.
    pub(super) renew: String,
    /// `$1` agent, `$2` device, `$3` epoch.
    pub(super) release: String,
    /// `$1` agent. Returns `holder, epoch, expires, now`.
    pub(super) read: String,
    /// `$1` agent, `$2` floor.
    pub(super) raise_floor: String,
    /// `$1` agent, `$2` device, `$3` epoch, `$4` the `VALUES` list of `(device_id, next_seq,
    /// last_op_id)`.
    /// Raises the published frontier if the caller holds the agent at the epoch. Returns the agent.
    pub(super) publish: String,
    /// `$1` agent. Returns `agent_id, device_id, next_seq, last_op_id`.
    pub(super) published: String,
}

impl Statements {
    pub(super) fn new(schema_name: &str, clock: &str, epoch_clock: Option<&str>) -> Self {
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
pub(super) type Row = (Option<String>, i64, i64, i64);

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

/// Quotes an SQL identifier.
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The conversions to and from this backend's signed 64-bit columns.
pub(super) const COLUMNS: Columns = Columns { backend: "postgres" };
