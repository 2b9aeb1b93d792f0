//! `fencepost run` end to end with a PostgreSQL coordinator: several hosts, one occurrence, once;
//! a host killed mid-command leaves an in-doubt run. Needs a server: `scripts/test` starts one
//! and runs these with `--include-ignored`; a plain `cargo test` lists them as ignored.

mod common;

use common::{killed_host_leaves_an_in_doubt_run, three_hosts_at_once, Shared};

fn shared(test: &str) -> Shared {
    let url = std::env::var("FENCEPOST_POSTGRES_URL").expect(
        "FENCEPOST_POSTGRES_URL is not set: these tests need a PostgreSQL server (scripts/test starts one)",
    );
    // The coordinator's table is shared by every test on the server: one agent per test and run.
    Shared::with(
        tempfile::tempdir().unwrap(),
        url,
        &format!("reports-{test}-{}", std::process::id()),
    )
}

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn run_postgres_three_hosts_run_the_same_occurrence_and_the_effect_happens_once() {
    let shared = shared("three");
    for (round, salt) in ["2026-11-29", "2026-11-30"].iter().enumerate() {
        let codes = three_hosts_at_once(&shared, salt, &["--wait", "20s"]);
        assert_eq!(codes.iter().filter(|code| **code == 0).count(), 1, "{codes:?}");
        assert!(codes.iter().all(|code| [0, 3].contains(code)), "{codes:?}");
        assert_eq!(shared.effects().len(), round + 1, "once per occurrence");
    }
}

#[test]
#[ignore = "needs PostgreSQL: run scripts/test (or set FENCEPOST_POSTGRES_URL and pass --include-ignored)"]
fn run_postgres_a_host_killed_mid_command_leaves_an_in_doubt_run() {
    killed_host_leaves_an_in_doubt_run(&shared("killed"), "2026-11-29");
}
