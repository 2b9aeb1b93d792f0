//! The PostgreSQL coordinator against a real server.
//!
//! These tests need a server: `scripts/test` starts a throw-away one and runs them with
//! `--include-ignored`. A plain `cargo test` lists them as ignored, with the reason, and runs nothing
//! against PostgreSQL. With `FENCEPOST_POSTGRES_URL` set, `cargo test --test postgres --
//! --include-ignored` runs them against that server (they create and drop their own schemas).

#[macro_use]
mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator};
use fencepost::conformance::{self, Harness, HistoryConfig, Opener, HISTORY_START_MS};


use fencepost::lease::{LeaseCoordinator, LeaseError};
use postgres::{Client, NoTls};

fn url() -> String {
    std::env::var("FENCEPOST_POSTGRES_URL")
        .expect("FENCEPOST_POSTGRES_URL is not set: these tests need a PostgreSQL server (scripts/test starts one)")
}

fn admin() -> Client {
    Client::connect(&url(), NoTls).expect("cannot connect to the test server")
}

static SCHEMAS: AtomicUsize = AtomicUsize::new(0);

/// A schema of this test run, with a clock table that the server reads as the coordinator clock.
struct TestSchema {
    name: String,
    admin: Mutex<Client>,
}

impl TestSchema {
    fn new() -> Self {
        let name = format!("fp_test_{}_{}", std::process::id(), SCHEMAS.fetch_add(1, Ordering::SeqCst));
        let mut admin = admin();
        admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name};
                 CREATE TABLE {name}.test_clock (now_ms bigint NOT NULL);
                 INSERT INTO {name}.test_clock VALUES ({HISTORY_START_MS});
                 CREATE FUNCTION {name}.test_now() RETURNS bigint LANGUAGE sql VOLATILE
                     AS 'SELECT now_ms FROM {name}.test_clock';"
            ))
            .unwrap();
        Self {
            name,
            admin: Mutex::new(admin),
        }
    }

    fn config(&self) -> PostgresConfig {
        PostgresConfig {
            schema: self.name.clone(),
            // Volatile, like clock_timestamp(): each evaluation reads the clock afresh.
            clock_sql: format!("{}.test_now()", self.name),
            ..PostgresConfig::new(url())
        }
    }

    fn coordinator(&self) -> PostgresLeaseCoordinator {
        let coordinator = PostgresLeaseCoordinator::connect(self.config()).unwrap();
        coordinator.migrate().unwrap();
        coordinator
    }

    fn advance(&self, ms: u64) {
        let statement = format!("UPDATE {}.test_clock SET now_ms = now_ms + $1", self.name);
        self.admin.lock().unwrap().execute(&statement, &[&(ms as i64)]).unwrap();
    }

    fn now_ms(&self) -> u64 {
        let statement = format!("SELECT now_ms FROM {}.test_clock", self.name);
        self.admin.lock().unwrap().query_one(&statement, &[]).unwrap().get::<_, i64>(0) as u64
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let statement = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        let _ = self.admin.lock().map(|mut admin| admin.batch_execute(&statement));
    }
}

/// Each fresh store is a new schema; the harness's clock is the newest schema's clock table.
pub struct PostgresHarnessForDebug;
impl PostgresHarnessForDebug { pub fn new() -> PostgresHarness { PostgresHarness::new() } }
pub struct PostgresHarness {
    current: Mutex<Option<std::sync::Arc<TestSchema>>>,
}

impl PostgresHarness {
    fn new() -> Self {
        Self {
            current: Mutex::new(None),
        }
    }

    fn schema(&self) -> std::sync::Arc<TestSchema> {
        self.current.lock().unwrap().clone().expect("fresh_store was called")
    }
}

impl Harness for PostgresHarness {
    fn fresh_store(&self) -> Opener {
        let schema = std::sync::Arc::new(TestSchema::new());
        schema.coordinator(); // migrate once
        *self.current.lock().unwrap() = Some(std::sync::Arc::clone(&schema));
        Box::new(move || Box::new(PostgresLeaseCoordinator::connect(schema.config()).unwrap()))
    }
    fn advance(&self, ms: u64) {
        self.schema().advance(ms);
    }
    fn now_ms(&self) -> Option<u64> {
        Some(self.schema().now_ms())
    }
    fn durable(&self) -> bool {
        true
    }
}

conformance_tests!(postgres_server, PostgresHarness::new(), #[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]);

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn l7_postgres_failures_are_backend_errors_not_verdicts() {
    let schema = TestSchema::new();
    // Connected, but the table is missing: every operation fails in the server.
    let coordinator = PostgresLeaseCoordinator::connect(schema.config()).unwrap();
    conformance::l7_a_backend_failure_is_an_error_not_a_verdict(&coordinator);
    let message = coordinator.current("milo").unwrap_err().to_string();
    assert!(message.contains("run migrate() first"), "{message}");
}

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn migrate_is_idempotent_and_safe_to_run_concurrently() {
    let schema = TestSchema::new();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| PostgresLeaseCoordinator::connect(schema.config()).unwrap().migrate().unwrap());
        }
    });
    let coordinator = schema.coordinator();
    coordinator.migrate().unwrap();
    assert_eq!(coordinator.acquire("milo", "laptop", 1_000).unwrap().epoch, 1);
}

fn connect_error(config: PostgresConfig) -> String {
    match PostgresLeaseCoordinator::connect(config) {
        Err(LeaseError::Backend(error)) => {
            assert!(!error.may_have_applied);
            error.to_string()
        }
        Err(other) => panic!("expected a backend error, got {other:?}"),
        Ok(_) => panic!("connected"),
    }
}

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn l8_postgres_bad_urls_passwords_schemas_and_ids_are_clear_errors() {
    let message = connect_error(PostgresConfig::new("not a url at all ://"));
    assert!(message.contains("invalid PostgreSQL URL"), "{message}");

    let wrong_password = url().replacen(":fencepost-test@", ":wrong@", 1);
    assert_ne!(wrong_password, url(), "the test server's URL carries its password");
    let message = connect_error(PostgresConfig::new(wrong_password));
    assert!(message.contains("password authentication failed"), "{message}");

    let unreachable = PostgresConfig {
        connect_attempts: 2,
        connect_timeout_ms: 500,
        ..PostgresConfig::new("postgres://postgres@127.0.0.1:1/postgres")
    };
    let message = connect_error(unreachable);
    assert!(message.contains("cannot connect"), "{message}");

    let message = connect_error(PostgresConfig {
        schema: String::new(),
        ..PostgresConfig::new(url())
    });
    assert!(message.contains("schema name"), "{message}");

    let missing = PostgresLeaseCoordinator::connect(PostgresConfig {
        schema: "fp_no_such_schema".into(),
        ..PostgresConfig::new(url())
    })
    .unwrap();
    let message = missing.acquire("milo", "laptop", 1_000).unwrap_err().to_string();
    assert!(message.contains("schema or table is missing"), "{message}");

    // A schema name with quotes and spaces is quoted, not injected.
    let odd = TestSchema::new();
    let config = PostgresConfig {
        schema: format!("{} \"odd\"; DROP TABLE x", odd.name),
        ..odd.config()
    };
    let coordinator = PostgresLeaseCoordinator::connect(config).unwrap();
    coordinator.migrate().unwrap();
    assert_eq!(coordinator.acquire("milo", "laptop", 1_000).unwrap().epoch, 1);
    admin()
        .batch_execute(&format!("DROP SCHEMA \"{} \"\"odd\"\"; DROP TABLE x\" CASCADE", odd.name))
        .unwrap();
}

/// Ends the server sessions of the coordinators (application_name `fencepost`) of this test's schema
/// connections, as an operator or a fail-over would.
fn terminate_coordinator_sessions() -> i64 {
    admin()
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'fencepost' AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0)
}

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn l7_a_terminated_connection_is_a_backend_error_then_the_next_call_reconnects() {
    let schema = TestSchema::new();
    let coordinator = schema.coordinator();
    // After an acquire: the server ends the session; the lease is intact, the next call reconnects.
    let lease = coordinator.acquire("milo", "laptop", 10_000).unwrap();
    assert!(terminate_coordinator_sessions() >= 1);
    let first = coordinator.current("milo");
    match &first {
        Err(LeaseError::Backend(error)) => assert!(!error.may_have_applied, "a read never applies anything"),
        Ok(current) => assert_eq!(current.as_ref(), Some(&lease), "reconnected at once"),
        Err(other) => panic!("{other:?}"),
    }
    assert_eq!(coordinator.current("milo").unwrap(), Some(lease.clone()), "the next call reconnects");

    // Before an acquire: the session is gone when the acquire is sent.
    assert!(terminate_coordinator_sessions() >= 1);
    schema.advance(10_000);
    match coordinator.acquire("milo", "phone", 10_000) {
        Ok(stolen) => assert_eq!(stolen.epoch, lease.epoch + 1),
        Err(LeaseError::Backend(error)) => {
            // Whether it applied is said, and `current` resolves it: never a repeated epoch.
            let current = coordinator.current("milo").unwrap().unwrap();
            if error.may_have_applied {
                assert!(current.epoch == lease.epoch || current.epoch == lease.epoch + 1);
            } else {
                assert_eq!(current.epoch, lease.epoch, "not applied");
            }
        }
        Err(other) => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn l5_epochs_continue_after_a_server_restart() {
    let (Ok(pg_ctl), Ok(data)) = (std::env::var("FENCEPOST_POSTGRES_PG_CTL"), std::env::var("FENCEPOST_POSTGRES_DATA")) else {
        panic!("FENCEPOST_POSTGRES_PG_CTL and FENCEPOST_POSTGRES_DATA are not set: scripts/test sets them for the server it starts");
    };
    let schema = TestSchema::new();
    let coordinator = schema.coordinator();
    let mut last = 0;
    for _ in 0..5 {
        let lease = coordinator.acquire("restart", "laptop", 1_000).unwrap();
        coordinator.release("restart", "laptop", lease.epoch).unwrap();
        last = lease.epoch;
    }
    let mut restart = Command::new("runuser");
    restart.args(["-u", "postgres", "--", &pg_ctl, "-D", &data, "-m", "fast", "-w", "restart"]);
    let status = restart.output().unwrap();
    assert!(status.status.success(), "pg_ctl restart failed: {}", String::from_utf8_lossy(&status.stderr));
    drop(schema.admin.lock().map(|mut admin| *admin = self::admin()));
    // The old connection is gone; the coordinator reconnects within its attempts.
    let next = (0..3).find_map(|_| coordinator.acquire("restart", "phone", 1_000).ok()).expect("reconnected");
    assert_eq!(next.epoch, last + 1, "epochs continue where they were");
}
