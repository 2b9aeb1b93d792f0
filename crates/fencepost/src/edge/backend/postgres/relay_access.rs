//! What the PostgreSQL relay uses of the coordinator: its schema, sessions and transactions.

use super::*;

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
    pub(super) fn or_roll_back(
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
}
