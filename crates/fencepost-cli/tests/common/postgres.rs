//! The test server of the PostgreSQL tests (`scripts/test` starts it): its URL, a superuser's
//! connection, and databases of a test's own.

use postgres::{Client, NoTls};

use super::{text, Shared};

/// The server (`FENCEPOST_POSTGRES_URL`, as its superuser).
pub fn server_url() -> String {
    std::env::var("FENCEPOST_POSTGRES_URL").expect(
        "FENCEPOST_POSTGRES_URL is not set: these tests need a PostgreSQL server (scripts/test starts one)",
    )
}

/// A superuser's connection to the server.
pub fn admin() -> Client {
    Client::connect(&server_url(), NoTls).expect("cannot connect to the test server")
}

/// `url` naming `database` instead of its own.
pub fn in_database(url: &str, database: &str) -> String {
    let (before, after) = url.rsplit_once('/').expect("a URL with a database");
    let query = after
        .split_once('?')
        .map_or(String::new(), |(_, query)| format!("?{query}"));
    format!("{before}/{database}{query}")
}

/// A database of the test's own (`fp_<test>_<pid>`), made again and migrated (`fencepost admin
/// migrate`, as the superuser): the ledger's tables would otherwise be shared by every test.
/// Returns its name.
pub fn fresh_database(test: &str) -> String {
    let name = format!("fp_{test}_{}", std::process::id());
    let mut admin = admin();
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let folder = tempfile::tempdir().unwrap();
    let migrator = Shared::with(folder, in_database(&server_url(), &name), "admin");
    let output = migrator.run("admin-host", &["admin", "migrate"]);
    assert!(output.status.success(), "migrate: {}", text(&output.stderr));
    name
}

/// Restarts the test server with `pg_ctl` (`-m fast`: every session ends), down for `down` in
/// between (a pooler in front then fails its logins to it, and refuses its clients' for a
/// while: PgBouncer's `server_login_retry`), as the `postgres` user when the test runs as root;
/// `scripts/test` sets where `pg_ctl` and the data are.
pub fn restart_server(down: std::time::Duration) {
    let variable = |name: &str| {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} is not set: scripts/test sets it for the server it starts"))
    };
    let (pg_ctl, data) = (
        variable("FENCEPOST_POSTGRES_PG_CTL"),
        variable("FENCEPOST_POSTGRES_DATA"),
    );
    let log = format!("{data}/../restart.log");
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        .starts_with(b"0\n");
    let pg_ctl = |action: &[&str]| {
        let mut command = std::process::Command::new(if root { "runuser" } else { pg_ctl.as_str() });
        if root {
            command.args(["-u", "postgres", "--", &pg_ctl]);
        }
        let status = command
            .args(["-D", &data, "-l", &log, "-w", "-t", "60"])
            .args(action)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl {action:?} failed; see {log}");
    };
    // `start` does not reuse the server's options as `restart` does: they are in
    // postmaster.opts, each quoted, after the program and `-D DATA`.
    let options = std::fs::read_to_string(format!("{data}/postmaster.opts")).unwrap();
    let options: Vec<&str> = options.split('"').skip(1).step_by(2).skip(2).collect();
    pg_ctl(&["-m", "fast", "stop"]);
    std::thread::sleep(down);
    pg_ctl(&["-o", &options.join(" "), "start"]);
}

/// How many occurrences each host of [`hosts_ride_out_two_restarts`] fires, one a second.
const SLOTS: u64 = 24;

/// Issue 37's restarts: `host-1` to `host-3` of `host` fire an occurrence a second while the
/// server restarts twice (at once, then down for 2 s); every firing waits them out within
/// `--wait` (none exits 10), every occurrence runs once, no epoch is used twice, no run is left
/// in doubt.
pub fn hosts_ride_out_two_restarts(host: &Shared) {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};
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
