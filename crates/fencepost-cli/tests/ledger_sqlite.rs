//! `--ledger sqlite:PATH`: the ledger in a SQLite file (`SqliteRelay`), for the processes of one
//! host, through the built binary (rule R1: one relay among others, the same guarantees).

mod common;

use std::process::{Command, Output};

use common::{kill_mid_command, text, Shared};

/// A shared coordinator and a SQLite ledger beside it.
fn shared() -> Shared {
    Shared::sqlite()
}

fn ledger_spec(shared: &Shared) -> String {
    format!("sqlite:{}", shared.path("ledger.db").display())
}

fn host(shared: &Shared, device: &str, args: &[&str]) -> Command {
    let mut command = shared.command(device, args);
    command.env("FENCEPOST_LEDGER", ledger_spec(shared));
    command
}

fn run_as(shared: &Shared, device: &str, args: &[&str]) -> Output {
    host(shared, device, args).output().unwrap()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// R1, and "When the database goes away for a while" (docs/running.md): a SQLite ledger that
/// another process holds locked past its busy timeout (10 s) is waited out within `--wait`, and
/// the command runs once when it lets go. (It exited 10 at once, its attempt recorded `failed`:
/// the SQLite relay's busy error was not transient, unlike the SQLite coordinator's.)
#[test]
fn r1_sqlite_ledger_locked_past_its_busy_timeout_is_waited_out_within_wait() {
    let shared = shared();
    let first = run_as(
        &shared,
        "host-1",
        &strs(&shared.report_args("2026-12-01", &[], "0")),
    );
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let locker = rusqlite::Connection::open(shared.path("ledger.db")).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let child = host(
        &shared,
        "host-2",
        &strs(&shared.report_args("2026-12-02", &["--wait", "90s"], "0")),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(13));
    locker.execute_batch("COMMIT").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(shared.effects().len(), 2, "each occurrence ran once");
    let again = run_as(
        &shared,
        "host-3",
        &strs(&shared.report_args("2026-12-02", &[], "0")),
    );
    assert_eq!(again.status.code(), Some(3), "{}", text(&again.stderr));
}

/// R1 (several processes on one store): three processes run the same occurrence at once; the
/// effect happens once, and the others find it committed or held.
#[test]
fn r1_sqlite_ledger_three_processes_one_effect() {
    let shared = shared();
    let args = shared.report_args("2026-11-30", &["--wait", "10s"], "0.3");
    let children: Vec<_> = ["host-1", "host-2", "host-3"]
        .iter()
        .map(|device| {
            host(&shared, device, &strs(&args))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut codes: Vec<i32> = children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            output.status.code().unwrap_or(-1)
        })
        .collect();
    codes.sort_unstable();
    assert_eq!(codes, vec![0, 3, 3], "one ran, the others found it committed");
    assert_eq!(shared.effects().len(), 1);
    assert!(shared.path("ledger.db").is_file());
    let runs = run_as(&shared, "host-1", &["ledger", "runs"]);
    assert!(text(&runs.stdout).contains("committed"), "{}", text(&runs.stdout));
    let verify = run_as(&shared, "host-1", &["ledger", "verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stderr));
}

/// D2 with a SQLite ledger: a process SIGKILLed mid-command leaves the run in doubt (exit 5).
#[test]
fn d2_sqlite_ledger_a_killed_process_leaves_the_run_in_doubt() {
    let shared = shared();
    let agent = shared.agent.clone();
    // kill_mid_command runs `fencepost` through a Shared of its own (host-1's data directory);
    // the flag names the same ledger file (a flag wins over the variable).
    let host_1 = Shared {
        folder: tempfile::tempdir_in(shared.folder.path()).unwrap(),
        coordinator: shared.coordinator.clone(),
        agent: agent.clone(),
        database_ledger: false,
        ledger_spec: None,
    };
    let ledger = ledger_spec(&shared);
    let effect = format!(
        "echo \"$FENCEPOST_DEVICE $FENCEPOST_EPOCH\" >> '{}'",
        shared.path("effects").display()
    );
    let args = [
        "run",
        "--agent",
        &agent,
        "--intent",
        "daily report",
        "--salt",
        "s",
        "--ttl",
        "1s",
        "--ledger",
        &ledger,
    ];
    kill_mid_command(&host_1, "host-1", &args, &effect);
    assert_eq!(shared.effects().len(), 1);
    let next = shared.report_args("s", &["--wait", "10s"], "0");
    let refused = run_as(&shared, "host-2", &strs(&next));
    assert_eq!(refused.status.code(), Some(5), "{}", text(&refused.stderr));
    assert_eq!(shared.effects().len(), 1, "not run again without a decision");
}

/// Usage errors: the coordinator's own file as the ledger, a folder named as a SQLite file.
#[test]
fn sqlite_ledger_usage_errors_are_clear() {
    let shared = shared();
    let coordinator_file = shared.coordinator.trim_start_matches("sqlite:").to_owned();
    let same = shared
        .command("host-1", &["ledger", "runs"])
        .env("FENCEPOST_LEDGER", format!("sqlite:{coordinator_file}"))
        .output()
        .unwrap();
    assert_eq!(same.status.code(), Some(2), "{}", text(&same.stderr));
    assert!(
        text(&same.stderr).contains("coordinator's file"),
        "{}",
        text(&same.stderr)
    );
    // The coordinator's file through a hard link, or through a folder that does not exist (found
    // by an adversarial run: both wrote the relay's tables into the coordinator's database).
    let warm = shared.run("host-1", &["lease", "list"]);
    assert!(warm.status.success(), "{}", text(&warm.stderr));
    std::fs::hard_link(&coordinator_file, shared.path("hard.db")).unwrap();
    for ledger in [
        format!("sqlite:{}", shared.path("hard.db").display()),
        format!("sqlite:{}/missing/../leases.db", shared.folder.path().display()),
    ] {
        let refused = shared
            .command("host-1", &["ledger", "runs"])
            .env("FENCEPOST_LEDGER", &ledger)
            .output()
            .unwrap();
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{ledger}: {}",
            text(&refused.stderr)
        );
    }
    // A command that only reads does not create a missing ledger file (a mistyped path used to
    // read as an intact, empty ledger).
    for command in [["ledger", "runs"], ["ledger", "verify"]] {
        let missing = shared
            .command("host-1", &command)
            .env(
                "FENCEPOST_LEDGER",
                format!("sqlite:{}", shared.path("typo.db").display()),
            )
            .output()
            .unwrap();
        assert_eq!(missing.status.code(), Some(10), "{}", text(&missing.stderr));
        assert!(
            text(&missing.stderr).contains("no ledger at"),
            "{}",
            text(&missing.stderr)
        );
    }
    assert!(!shared.path("typo.db").exists(), "nothing was created");
    let intact = shared.run("host-1", &["lease", "list"]);
    assert!(
        intact.status.success(),
        "the coordinator is intact: {}",
        text(&intact.stderr)
    );
    let folder = shared
        .command("host-1", &["ledger", "runs"])
        .env(
            "FENCEPOST_LEDGER",
            format!("sqlite:{}", shared.folder.path().display()),
        )
        .output()
        .unwrap();
    assert_eq!(folder.status.code(), Some(10), "{}", text(&folder.stderr));
    assert!(
        text(&folder.stderr).contains("that is a folder"),
        "{}",
        text(&folder.stderr)
    );
}

/// R1: a SQLite file that holds no ledger (another coordinator's file) is refused by the commands
/// that only read a ledger, and left as it was (found by an adversarial run: `ledger import
/// sqlite:<a coordinator's file>` read it as an empty ledger and made the relay's tables in it).
#[test]
fn sqlite_ledger_a_file_that_holds_no_ledger_is_refused_and_left_unchanged() {
    let shared = shared();
    let other = shared.path("other-leases.db");
    let listed = shared.run(
        "host-1",
        &[
            "--coordinator",
            &format!("sqlite:{}", other.display()),
            "lease",
            "list",
        ],
    );
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let tables = || {
        rusqlite::Connection::open(&other)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'fencepost_relay%'",
                [],
                |row| row.get::<_, i64>(0),
            )
            .unwrap()
    };
    assert_eq!(tables(), 0);
    let spec = format!("sqlite:{}", other.display());
    let import = shared.run("host-1", &["ledger", "import", &spec]);
    assert_eq!(import.status.code(), Some(10), "{}", text(&import.stderr));
    assert!(
        text(&import.stderr).contains("holds no fencepost ledger"),
        "{}",
        text(&import.stderr)
    );
    let runs = shared.run("host-1", &["--ledger", &spec, "ledger", "runs"]);
    assert_eq!(runs.status.code(), Some(10), "{}", text(&runs.stderr));
    assert_eq!(tables(), 0, "the file is left as it was");
}
