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
