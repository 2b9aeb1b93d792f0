//! The [`LeaseCoordinator`] contract on PostgreSQL: each operation a statement (or two) whose
//! expiry the server's clock decides.

use super::*;

impl PostgresLeaseCoordinator {
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
    pub(super) fn write_then_read(
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
    pub(super) fn transaction_then_commit(
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

/// The statements that open each transaction of a session, from what the role gets by default
/// (read once per connection): `SET TRANSACTION ISOLATION LEVEL READ COMMITTED` unless that is the
/// default, and for `statement_timeout` and `lock_timeout` a `SET LOCAL` to `operation_timeout_ms`
/// where the default is no limit or a longer one: the operator's lower timeout is never raised,
/// and nothing outlives the transaction. Returns the isolation part and the timeouts part; both
/// are `SET`s (no rows).
pub(super) fn opening(
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
pub(super) type WrittenThenRead = (Vec<SimpleQueryRow>, Option<Row>, Vec<SimpleQueryRow>);

/// The published frontier in `rows` of the `published` statement (agent, device, next seq).
pub(super) fn frontier_of(rows: &[SimpleQueryRow], agent_id: &str) -> Result<Frontier, LeaseError> {
    let mut frontier = Frontier::new();
    for row in rows {
        for_agent(row, agent_id)?;
        let device = row.get(1).unwrap_or("");
        let head = row.get(3).map(|head| COLUMNS.head(head)).transpose()?;
        frontier.raise_to(device, COLUMNS.stored(integer(row, 2)?, "next seq")?, head);
    }
    Ok(frontier)
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
    pub(super) fn grant(
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
    pub(super) fn extend(
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
    pub(super) fn give_back(
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
    pub(super) fn frontier_values(frontier: &Frontier) -> Result<String, LeaseError> {
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
    pub(super) fn publish_statement(
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
    pub(super) fn read(&self, session: &mut Session, agent_id: &str) -> Result<Option<Row>, CallError> {
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
    pub(super) fn lost(&self, session: &mut Session, agent_id: &str) -> Result<i64, CallError> {
        Ok(self.read(session, agent_id)?.map_or(0, |row| row.1))
    }
}
