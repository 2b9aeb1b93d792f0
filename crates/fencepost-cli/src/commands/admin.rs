//! `fencepost admin`: the coordinator's schema.

use super::*;

/// `fencepost lease …`.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Create the coordinator's schema, or upgrade it to this fencepost's version. For PostgreSQL,
    /// run it once per database as a role that may create the schema (or owns it); the roles that
    /// run `fencepost run` then need only the grants in docs/deployment.md. Idempotent. For SQLite the
    /// file's schema is created on first use; this creates it now.
    Migrate,
}

/// `fencepost admin …`.
pub fn admin(settings: &Settings, command: AdminCommand) -> Result<i32> {
    match command {
        AdminCommand::Migrate => {
            settings.migrate_coordinator()?;
            out!("the coordinator's schema is ready");
            Ok(EXIT_RAN_OK)
        }
    }
}
