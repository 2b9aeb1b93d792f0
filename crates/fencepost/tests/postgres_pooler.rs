//! The PostgreSQL coordinator behind a pooler that has no server connection to give (issue 14,
//! item 4): the client's own bound holds where no server-side timeout can. A binary of its own:
//! it fills the transaction pooler's 3 server connections, which would slow the other tests.
//! Needs `scripts/test` (or FENCEPOST_POSTGRES_URL and FENCEPOST_PGBOUNCER_TRANSACTION_URL).

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator, CLIENT_MARGIN_MS};
use fencepost::lease::{LeaseCoordinator, LeaseError};

fn variable(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run scripts/test, which starts PostgreSQL and PgBouncer")
    })
}

/// Holds every server connection of the transaction pooler for `seconds`.
fn fill_the_pool(pooled: &str, seconds: u64) -> Vec<std::thread::JoinHandle<()>> {
    (0..3)
        .map(|_| {
            let pooled = pooled.to_owned();
            std::thread::spawn(move || {
                let mut client = postgres::Client::connect(&pooled, postgres::NoTls).unwrap();
                client
                    .batch_execute(&format!("BEGIN; SELECT pg_sleep({seconds}); COMMIT"))
                    .unwrap();
            })
        })
        .collect()
}

#[test]
#[ignore = "needs PostgreSQL and PgBouncer: scripts/test runs it in its PostgreSQL pass"]
fn a_pooler_with_no_free_server_connection_cannot_hold_a_call_past_the_clients_bound() {
    let server = variable("FENCEPOST_POSTGRES_URL");
    let pooled = variable("FENCEPOST_PGBOUNCER_TRANSACTION_URL");
    let schema = format!("fp_pooler_{}", std::process::id());
    let config = |url: &str| PostgresConfig {
        schema: schema.clone(),
        operation_timeout_ms: 500,
        connect_attempts: 1,
        connect_timeout_ms: 1_000,
        ..PostgresConfig::new(url)
    };
    PostgresLeaseCoordinator::connect(config(&server))
        .unwrap()
        .migrate()
        .unwrap();
    let coordinator = PostgresLeaseCoordinator::connect(config(&pooled)).unwrap();
    coordinator.acquire("milo", "laptop", 60_000).unwrap();

    let holders = fill_the_pool(&pooled, 6);
    std::thread::sleep(Duration::from_millis(500)); // the three transactions hold the pool
    let bound = Duration::from_millis(500 + CLIENT_MARGIN_MS);
    let started = Instant::now();
    let outcome = coordinator.current("milo");
    let elapsed = started.elapsed();
    match outcome {
        Err(LeaseError::Backend(error)) => {
            assert!(error.to_string().contains("no answer within"), "{error}")
        }
        other => panic!("a call queued by the pooler: {other:?}"),
    }
    assert!(
        elapsed < bound + Duration::from_millis(700),
        "the call took {elapsed:?}"
    );
    // A new connection is bounded too (the pooler accepts it, then cannot serve its first query).
    let started = Instant::now();
    let connected = PostgresLeaseCoordinator::connect(config(&pooled));
    let elapsed = started.elapsed();
    assert!(connected.is_err(), "connected through a full pool");
    assert!(
        elapsed < Duration::from_millis(1_000) + bound + Duration::from_millis(700),
        "the connection took {elapsed:?}"
    );
    for holder in holders {
        holder.join().unwrap();
    }
    // Once the pool is free again, the next call reconnects and answers.
    assert_eq!(
        coordinator.current("milo").unwrap().map(|lease| lease.holder),
        Some("laptop".to_owned())
    );
    let mut admin = postgres::Client::connect(&server, postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .unwrap();
}
