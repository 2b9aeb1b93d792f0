//! The transactional fence: a transaction that commits only while the caller holds the lease at
//! its epoch (see the module docs).

use super::*;

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

impl PostgresLeaseCoordinator {
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
    /// It protects effects that are rows of this database only; see the [module docs](crate::backend::postgres) for
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
            let messages = begin_and_read(session, limit, &read)?;
            let decision = match decide(&messages, agent_id, device_id, epoch) {
                Ok(decision) => decision,
                Err(error) => {
                    let _ = end_transaction(session, limit, "ROLLBACK");
                    return Err(CallError::Reply(error));
                }
            };
            if let Some(decision) = decision {
                end_transaction(session, limit, "ROLLBACK")?;
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
                Ok(value) => commit(session, limit, &mut commit_sent).map(|()| Step::Done(value)),
                Err(error) => {
                    end_transaction(session, limit, "ROLLBACK")?;
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
}

/// Begins the fence's transaction on `session` and runs `read` (the agent's row) after the
/// session's timeouts: the messages of that batch. Until the transaction ends, a session left
/// here (a closure that panicked, an answer lost) is not used again.
fn begin_and_read(
    session: &mut Session,
    limit: Option<Duration>,
    read: &str,
) -> Result<Vec<SimpleQueryMessage>, CallError> {
    let mut opening = session.timeouts.clone();
    opening.push_str(read);
    session.open_transaction = true;
    let began = session.run(limit, |client| {
        client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    });
    match began {
        Ok(()) => {}
        // PgBouncer in statement mode answers a transaction block by closing the connection,
        // often before its message can be read.
        Err(CallError::Statement(error)) if error.is_closed() || describe(&error).contains("pooling mode") => {
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
    match session.simple_query_within(&opening, limit) {
        Ok(messages) => Ok(messages),
        Err(error) => {
            let _ = end_transaction(session, limit, "ROLLBACK");
            Err(error)
        }
    }
}

/// Ends the fence's transaction with `end` (`COMMIT` or `ROLLBACK`).
fn end_transaction(session: &mut Session, limit: Option<Duration>, end: &str) -> Result<(), CallError> {
    session.run(limit, |client| client.batch_execute(end))?;
    session.open_transaction = false;
    Ok(())
}

/// The fence's verdict on the row read (rule D1): `None` when `device_id` holds `agent_id` at
/// `epoch`, else why not.
fn decide(
    messages: &[SimpleQueryMessage],
    agent_id: &str,
    device_id: &str,
    epoch: u64,
) -> Result<Option<FenceDecision>, LeaseError> {
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
    let row = read_rows.map(|row| lease_row(row, agent_id)).transpose()?;
    let current = row.and_then(|(holder, current, ..)| Some((holder?, u64::try_from(current).unwrap_or(0))));
    Ok(match crate::fence::holder_verdict(current, device_id, epoch) {
        FenceDecision::Proceed => None,
        refused => Some(refused),
    })
}

/// Commits the fence's transaction after the work succeeded. A statement of the work that failed,
/// with the failure not returned, leaves the transaction aborted, and COMMIT would then roll back
/// without an error: the SELECT before it fails instead. `commit_sent` says whether the COMMIT
/// may have been applied (an answer lost after it was sent).
fn commit(session: &mut Session, limit: Option<Duration>, commit_sent: &mut bool) -> Result<(), CallError> {
    *commit_sent = true;
    match session.run(limit, |client| client.batch_execute("SELECT 1; COMMIT")) {
        Ok(()) => {
            session.open_transaction = false;
            Ok(())
        }
        Err(CallError::Statement(error)) if !outcome_unknown(&error) => {
            *commit_sent = false;
            end_transaction(session, limit, "ROLLBACK")?;
            Err(CallError::Reply(failure(
                format!("fenced_transaction: the work returned success, but a statement of it had failed ({}), which aborted the transaction; nothing was committed", describe(&error)),
                false,
                Some(error),
            )))
        }
        Err(error) => Err(error),
    }
}
