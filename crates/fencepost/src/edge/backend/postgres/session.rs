//! One connection's session (`Session`, closed within a bound), the [`Connection`] a fenced
//! transaction's closure gets, and reading result rows.

use super::*;

/// A connection. It keeps nothing on the server between operations: no prepared statement, no
/// setting. Its I/O runs on a current-thread runtime of its own, driven only while a call runs, on
/// the caller's thread: a call is bounded by a timer of that runtime, with no thread hop.
pub(super) struct Session {
    /// The connection's runtime (the connection's task is spawned on it and runs during calls).
    pub(super) runtime: tokio::runtime::Runtime,
    /// `None` only while the session is being dropped.
    pub(super) client: Option<Client>,
    /// The connection's task, awaited (briefly) on a clean close.
    pub(super) connection: Option<tokio::task::JoinHandle<()>>,
    /// What opens each transaction: the isolation level and the operation timeout, where the
    /// server's defaults for this role do not already give them ([`opening`]).
    pub(super) prologue: String,
    /// The operation-timeout part of the prologue alone (for a transaction opened explicitly).
    pub(super) timeouts: String,
    /// Set when a call did not answer within its limit: the session is not used again.
    pub(super) spoiled: bool,
    /// Set from a `fenced_transaction`'s `BEGIN` until its end is confirmed: a session left in
    /// that state (a closure that panicked, an answer lost) is not used again.
    pub(super) open_transaction: bool,
    /// The bound of the operation running on the session (its reconnection included), which
    /// every call of [`run`](Self::run) is cut to; `None` between operations and for the
    /// caller's own statements, which are bounded one by one.
    pub(super) deadline: Option<RealTimeLimit>,
}

/// How long a session's close, or a cancel request for a call given up, may take.
pub(super) const CLOSE_LIMIT: Duration = Duration::from_secs(1);

impl Session {
    /// Runs the future `call` builds, on this session's runtime, waiting at most `limit`: a
    /// pooler that queues the client (no free server connection, a server it cannot log in to)
    /// or a server or pooler that stopped answering cannot hold the caller past it. Then the
    /// session is spoiled (the caller drops it, which sends a cancel request and closes the
    /// connection), and the outcome is unknown.
    pub(super) fn run<'s, T, F>(
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
    pub(super) fn seems_open(&mut self) -> bool {
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
    pub(super) fn simple_query_within(
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
    pub(super) session: &'a mut Session,
    pub(super) limit: Option<Duration>,
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
    pub(super) fn failed(&self, error: CallError) -> StatementError {
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
pub(super) type ResultSets = Vec<Vec<SimpleQueryRow>>;

/// The rows of each statement of a simple query's answer, in order.
pub(super) fn result_sets(messages: Vec<SimpleQueryMessage>) -> ResultSets {
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
pub(super) fn integer(row: &SimpleQueryRow, column: usize) -> Result<i64, LeaseError> {
    let text = row.get(column).unwrap_or("");
    text.parse()
        .map_err(|_| failure(format!("corrupt row: column {column} is {text:?}"), false, None))
}

/// Checks that a row answers for `agent_id` (its first column): every statement returns the agent
/// it is about, so that a reply to someone else's statement (a pooling proxy mixing two clients'
/// statements) is an error, never a verdict.
pub(super) fn for_agent(row: &SimpleQueryRow, agent_id: &str) -> Result<(), LeaseError> {
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
pub(super) fn lease_row(row: &SimpleQueryRow, agent_id: &str) -> Result<Row, LeaseError> {
    for_agent(row, agent_id)?;
    Ok((
        row.get(1).map(str::to_owned),
        integer(row, 2)?,
        integer(row, 3)?,
        integer(row, 4)?,
    ))
}
