//! Issue 37's restarts on a protected ledger (issue 39: the PostgreSQL relay carries protected
//! ledgers): PostgreSQL restarted twice behind PgBouncer in transaction mode while three members
//! fire every occurrence of a job, through the built binary; each firing waits the restarts out
//! within `--wait`, every occurrence runs once, no epoch is used twice, no run is left in doubt.
//! Rules S2, L7, D2.
//!
//! A test binary of its own, as `restart_postgres.rs` is: the restart ends every session of the
//! server, so no other PostgreSQL test may run meanwhile.

mod common;

use common::postgres::{fresh_database, hosts_ride_out_two_restarts, in_database};
use common::{protect, Shared};

#[test]
#[ignore = "needs PostgreSQL and PgBouncer: scripts/test runs it in its PostgreSQL pass (or set FENCEPOST_POSTGRES_URL, _PG_CTL, _DATA, FENCEPOST_PGBOUNCER_TRANSACTION_URL and pass --include-ignored)"]
fn s2_l7_d2_members_of_a_protected_ledger_ride_out_two_server_restarts_behind_a_pooler() {
    let database = fresh_database("restart_protected");
    let pooler = std::env::var("FENCEPOST_PGBOUNCER_TRANSACTION_URL")
        .expect("FENCEPOST_PGBOUNCER_TRANSACTION_URL is not set: scripts/test starts PgBouncer");
    let host = Shared::database_only(
        tempfile::tempdir().unwrap(),
        in_database(&pooler, &database),
        "reports",
    );
    protect(&host, &["host-2", "host-3"]);
    hosts_ride_out_two_restarts(&host);
    let verify = host.run("host-3", &["ledger", "verify"]);
    assert!(verify.status.success(), "{}", common::text(&verify.stderr));
}
