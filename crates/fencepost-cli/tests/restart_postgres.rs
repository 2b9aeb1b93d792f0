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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::postgres::{fresh_database, in_database, restart_server};
use common::{text, Shared};

/// How many occurrences each host fires, one a second.
const SLOTS: u64 = 24;

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
    let start = Instant::now();
    let firings = std::thread::scope(|scope| {
        let hosts: Vec<_> = (1..=3)
            .map(|number| {
                let host = &host;
                scope.spawn(move || {
                    let device = format!("host-{number}");
                    let mut ended = Vec::new();
                    for slot in 0..SLOTS {
                        let due = start + Duration::from_secs(slot);
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        let args =
                            host.report_args(&format!("slot-{slot}"), &["--wait", "40s", "--ttl", "5s"], "0");
                        let args: Vec<&str> = args.iter().map(String::as_str).collect();
                        let output = host.run(&device, &args);
                        ended.push((slot, device.clone(), output.status.code(), text(&output.stderr)));
                    }
                    ended
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(4));
        restart_server(Duration::ZERO);
        std::thread::sleep(Duration::from_secs(4));
        // Down for long enough that PgBouncer's logins to it fail: it then refuses its clients'
        // logins for `server_login_retry` (15 s by default), `08P01`.
        restart_server(Duration::from_secs(2));
        hosts
            .into_iter()
            .flat_map(|host| host.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (slot, device, code, stderr) in &firings {
        assert!(
            matches!(code, Some(0 | 3)),
            "slot {slot} on {device} exited {code:?}: {stderr}"
        );
    }
    // The restarts met firings (else this test shows nothing).
    let waited: Vec<&str> = firings
        .iter()
        .filter_map(|(_, _, _, stderr)| {
            stderr
                .lines()
                .find(|line| line.contains("trying again while --wait lasts"))
        })
        .collect();
    assert!(!waited.is_empty(), "no firing met a restart");
    eprintln!(
        "{} of {} firings waited out a restart: {waited:#?}",
        waited.len(),
        firings.len()
    );
    // Each occurrence once; each run at an epoch of its own.
    let mut per_slot = BTreeMap::new();
    for (slot, _, code, _) in &firings {
        if *code == Some(0) {
            *per_slot.entry(*slot).or_insert(0) += 1;
        }
    }
    assert_eq!(per_slot.len() as u64, SLOTS, "every occurrence ran: {per_slot:?}");
    assert!(per_slot.values().all(|ran| *ran == 1), "once each: {per_slot:?}");
    let effects = host.effects();
    assert_eq!(effects.len() as u64, SLOTS, "{effects:?}");
    let mut epochs: Vec<&str> = effects.iter().filter_map(|line| line.split(' ').nth(1)).collect();
    epochs.sort_unstable();
    let before = epochs.len();
    epochs.dedup();
    assert_eq!(epochs.len(), before, "an epoch used twice: {effects:?}");
    let runs = host.run("host-1", &["ledger", "runs", "--json"]);
    assert_eq!(runs.status.code(), Some(0), "{}", text(&runs.stderr));
    assert!(!text(&runs.stdout).contains("in-doubt"), "{}", text(&runs.stdout));
}
