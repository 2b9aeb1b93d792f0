//! The PostgreSQL server restarts while a coordinator works: epochs continue where they were.
//!
//! A test binary of its own, because the restart ends every session of the server: the other
//! PostgreSQL tests must not run at the same time. Needs the server that `scripts/test` starts
//! (it sets `FENCEPOST_POSTGRES_PG_CTL` and `FENCEPOST_POSTGRES_DATA` so that the test can restart
//! it); ignored, with that reason, under a plain `cargo test`.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator};
use fencepost::lease::{LeaseCoordinator, LeaseError};

fn variable(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: scripts/test sets it for the throw-away server it starts")
    })
}

/// Restarts the server with `pg_ctl` (as the `postgres` user when the test runs as root).
fn restart_server() {
    let (pg_ctl, data) = (
        variable("FENCEPOST_POSTGRES_PG_CTL"),
        variable("FENCEPOST_POSTGRES_DATA"),
    );
    let log = format!("{data}/../restart.log");
    let as_root = Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        .starts_with(b"0\n");
    let mut command = if as_root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--", &pg_ctl]);
        command
    } else {
        Command::new(&pg_ctl)
    };
    // `-l`: the restarted server writes to a file, not to this process's pipes.
    command
        .args(["-D", &data, "-l", &log, "-m", "fast", "-w", "-t", "60", "restart"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let status = command.status().unwrap();
    assert!(status.success(), "pg_ctl restart failed; see {log}");
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test runs it in its PostgreSQL pass (or set FENCEPOST_POSTGRES_URL, _PG_CTL, _DATA and pass --include-ignored)"]
fn l5_epochs_continue_after_a_server_restart_mid_run() {
    let url = variable("FENCEPOST_POSTGRES_URL");
    let schema = format!("fp_restart_{}", std::process::id());
    let config = PostgresConfig {
        schema: schema.clone(),
        connect_attempts: 5,
        ..PostgresConfig::new(url.clone())
    };
    let coordinator = PostgresLeaseCoordinator::connect(config).unwrap();
    coordinator.migrate().unwrap();
    let stop = AtomicBool::new(false);
    // One site acquires and releases without pause; the server restarts under it.
    let ((epochs, failures), restarting, restarted) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let (mut epochs, mut failures) = (Vec::new(), Vec::new());
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                let epoch = match coordinator.acquire("restart", "laptop", 60_000) {
                    Ok(lease) => lease.epoch,
                    // Its own lease: an acquire whose answer was lost in the restart but that had
                    // applied, or a release that was lost.
                    Err(LeaseError::Held { holder, epoch, .. }) if holder == "laptop" => epoch,
                    Err(LeaseError::Backend(error)) => {
                        failures.push(error.to_string());
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    Err(other) => panic!("{other:?}"),
                };
                // `Held` by itself at the last epoch: a release lost in the restart, not a grant.
                if epochs.last().map(|(last, _)| last) != Some(&epoch) {
                    epochs.push((epoch, Instant::now()));
                }
                if let Err(LeaseError::Backend(error)) = coordinator.release("restart", "laptop", epoch) {
                    failures.push(error.to_string());
                }
            }
            (epochs, failures)
        });
        std::thread::sleep(Duration::from_millis(500));
        let restarting = Instant::now();
        restart_server();
        let restarted = Instant::now();
        std::thread::sleep(Duration::from_millis(1_500));
        stop.store(true, Ordering::SeqCst);
        (worker.join().unwrap(), restarting, restarted)
    });
    // The restart was mid-run: grants before it and after it. (A call in flight when the server
    // went down fails; one that starts after the connection was seen closed reconnects first.)
    assert!(
        epochs.iter().any(|(_, at)| *at < restarting) && epochs.iter().any(|(_, at)| *at > restarted),
        "the test did not restart the server mid-run"
    );
    let epochs: Vec<u64> = epochs.into_iter().map(|(epoch, _)| epoch).collect();
    // Issue 14, item 5: a lost connection keeps its cause, not only "error connecting".
    for failure in &failures {
        assert!(
            !failure.contains("error connecting")
                || failure.contains("os error")
                || failure.contains("refused"),
            "a connection error without its cause: {failure}"
        );
    }
    assert!(epochs.len() > 10, "too few grants: {}", epochs.len());
    for pair in epochs.windows(2) {
        assert!(pair[0] < pair[1], "L5: epoch {} after {}", pair[1], pair[0]);
    }
    let after = PostgresLeaseCoordinator::connect(PostgresConfig {
        schema: schema.clone(),
        ..PostgresConfig::new(url.clone())
    })
    .unwrap();
    let next = after.acquire("restart", "phone", 1_000).unwrap();
    assert!(
        next.epoch > *epochs.last().unwrap(),
        "L5: epochs continue where they were"
    );
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .unwrap();
}
