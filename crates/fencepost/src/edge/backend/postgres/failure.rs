//! What a failed call means: a verdict, an ambiguous outcome (rule L7) or a failure that may pass
//! (a restart, a pooler's login retry), with the words an operator needs.

use super::*;

pub(super) fn failure(
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
pub(super) fn passing(mut error: LeaseError) -> LeaseError {
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
pub(super) fn passes(error: &tokio_postgres::Error) -> bool {
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
pub(super) fn outcome_unknown(error: &tokio_postgres::Error) -> bool {
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
pub(super) fn permanent_login_failure(code: &SqlState) -> bool {
    *code == SqlState::INVALID_PASSWORD
        || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        || *code == SqlState::INVALID_CATALOG_NAME
}

pub(super) fn describe(error: &tokio_postgres::Error) -> String {
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
pub(super) enum ConnectFailure {
    Driver(tokio_postgres::Error),
    /// No answer within the bound.
    NoAnswer(Duration),
    /// No runtime for the connection could be made.
    Local(std::io::Error),
}

/// Why a call failed: before a statement could be sent, or in a statement.
pub(super) enum CallError {
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

impl PostgresLeaseCoordinator {
    /// The error of a failed call; `write` says whether the call sent a write whose answer may be
    /// lost.
    pub(super) fn explain(&self, operation: &str, error: CallError, write: bool) -> LeaseError {
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
}

/// The operations of the ledger in the database, as [`RelayError::Database`] names them.
pub(super) const RELAY_OPERATIONS: [&str; 3] = ["push to", "pull from", "append to"];

/// The operations that lock an agent's lease row.
pub(super) const LEASE_OPERATIONS: [&str; 6] = [
    "acquire",
    "renew",
    "release",
    "raise_epoch_floor",
    "publish_frontier",
    "fenced_transaction",
];

impl PostgresLeaseCoordinator {
    /// A failed call of the relay as a [`RelayError`]; `write` says whether a write was sent
    /// whose answer may be lost.
    pub(super) fn relay_failure(&self, operation: &'static str, error: CallError, write: bool) -> RelayError {
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

/// The error of a call on a connection that was given up.
pub(super) fn given_up() -> LeaseError {
    failure(
        "the connection was given up after a call that did not answer",
        true,
        None,
    )
}

/// A time setting as `current_setting` shows it (`0`, `500us`, `50ms`, `10s`, `2min`, `1h`,
/// `1d`; also the URL's `operation_timeout`, in the same units), in milliseconds rounded up;
/// `None` when it does not parse.
pub(super) fn setting_ms(text: &str) -> Option<u64> {
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
