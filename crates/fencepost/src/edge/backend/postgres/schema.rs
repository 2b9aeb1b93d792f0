//! The schema: its version, `migrate`, and the check every coordinator makes when it connects.

use super::*;

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
    /// Creates or upgrades the schema: the schema, the `leases` table and a `schema_version`
    /// table, to [`SCHEMA_VERSION`]. Idempotent, and safe to run from several processes at once.
    /// An administration step (`fencepost admin migrate`), run as a role that may create the
    /// schema (or owns it); the roles that then run coordinators need only the grants listed in
    /// the [module docs](crate::backend::postgres).
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
}
