//! Issue 37, acceptance: PostgreSQL restarted twice (at once, then down for 2 s) behind PgBouncer
//! in transaction mode while three hosts fire every occurrence of a job, through the built
//! binary. PgBouncer refuses logins for a while after a restart that failed its logins
//! (`server_login_retry`, `08P01`); every firing waits that out within
//! `--wait`: none exits 10, every occurrence runs once, no epoch is used twice, no run is left in
//! doubt. Rules L5, L7, D2.
//!
//! A test binary of its own, because the restart ends every session of the server: the other
//! PostgreSQL tests must not run at the same time. Needs the server and the PgBouncer that
//! `scripts/test` starts; ignored, with that reason, under a plain `cargo test`.

mod common;

use common::postgres::{fresh_database, hosts_ride_out_two_restarts, in_database};
use common::Shared;

#[test]
#[ignore = "needs PostgreSQL and PgBouncer: scripts/test runs it in its PostgreSQL pass (or set FENCEPOST_POSTGRES_URL, _PG_CTL, _DATA, FENCEPOST_PGBOUNCER_TRANSACTION_URL and pass --include-ignored)"]
fn l5_l7_d2_hosts_firing_through_a_transaction_pooler_ride_out_two_server_restarts() {
    let database = fresh_database("restart");
    let pooler = std::env::var("FENCEPOST_PGBOUNCER_TRANSACTION_URL")
        .expect("FENCEPOST_PGBOUNCER_TRANSACTION_URL is not set: scripts/test starts PgBouncer");
    let host = Shared::database_only(
        tempfile::tempdir().unwrap(),
        in_database(&pooler, &database),
        "reports",
    );
    hosts_ride_out_two_restarts(&host);
}
