//! Shared checkpoints (issue 17, item 2; rules K1–K4) through the built binary: `ledger compact`
//! writes one, a new host starts from it, and a checkpoint that is damaged, of another ledger,
//! or left half-written by a killed compaction never makes a committed run run again.

mod common;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use common::{text, Shared};

const HOST: &str = "host-1";

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// `fencepost run` of a job for `salt` that appends the salt and its epoch to `effects`.
fn job(shared: &Shared, device: &str, salt: &str) -> Output {
    let effect = format!(
        "echo \"{salt} $FENCEPOST_EPOCH\" >> '{}'",
        shared.path("effects").display()
    );
    shared.run(
        device,
        &[
            "run", "--agent", "cron", "--intent", "backup", "--salt", salt, "--ttl", "1s", "--wait", "20s",
            "--", "sh", "-c", &effect,
        ],
    )
}

/// Commits `count` occurrences on [`HOST`] from `first` on; returns their salts.
fn committed(shared: &Shared, first: usize, count: usize) -> Vec<String> {
    let salts: Vec<String> = (first..first + count)
        .map(|index| format!("day-{index}"))
        .collect();
    for salt in &salts {
        let output = job(shared, HOST, salt);
        assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    }
    salts
}

fn compact(shared: &Shared) -> Output {
    shared.run(HOST, &["ledger", "compact"])
}

fn checkpoints(shared: &Shared) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(shared.path("ledger").join("checkpoints"))
        .map(|listing| listing.map(|item| item.unwrap().path()).collect())
        .unwrap_or_default();
    files.retain(|path| {
        path.file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("checkpoint-"))
    });
    files.sort();
    files
}

/// Every salt ran at most once.
fn assert_once(shared: &Shared) {
    let salts: Vec<String> = shared
        .effects()
        .iter()
        .map(|line| line.split(' ').next().unwrap_or_default().to_owned())
        .collect();
    let mut unique = salts.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), salts.len(), "an effect ran twice: {salts:?}");
}

/// K1: a new host starts from the checkpoint (and reads the records after it): every occurrence
/// committed before or after the checkpoint is refused (exit 3), a new one runs.
#[test]
fn k1_a_new_host_started_from_a_checkpoint_never_runs_a_committed_occurrence_again() {
    let shared = Shared::sqlite();
    let mut salts = committed(&shared, 0, 6);
    let output = compact(&shared);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("wrote checkpoint"),
        "{}",
        text(&output.stdout)
    );
    assert!(
        text(&output.stdout).contains("12 records of 1 device, 6 runs"),
        "{}",
        text(&output.stdout)
    );
    assert_eq!(checkpoints(&shared).len(), 1);
    salts.extend(committed(&shared, 6, 2));
    for (index, salt) in salts.iter().enumerate() {
        let mut command = shared.command("host-2", &[]);
        let effect = format!("echo \"{salt} x\" >> '{}'", shared.path("effects").display());
        command
            .args([
                "run", "--agent", "cron", "--intent", "backup", "--salt", salt, "--", "sh", "-c", &effect,
            ])
            .env("RUST_LOG", "info");
        let output = command.output().unwrap();
        assert_eq!(code(&output), 3, "{salt}: {}", text(&output.stderr));
        let started = text(&output.stderr).contains("starting from the shared checkpoint");
        assert_eq!(
            started,
            index == 0,
            "only the first run starts from it: {}",
            text(&output.stderr)
        );
    }
    let output = job(&shared, "host-2", "day-new");
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert_once(&shared);
    assert_eq!(shared.effects().len(), 9);
}

/// K2: a new host whose coordinator lost every lease (a new database) still gets an epoch above
/// every epoch of the checkpoint: the floor is raised from it.
#[test]
fn k2_a_new_host_with_a_new_coordinator_gets_an_epoch_above_the_checkpoints() {
    let shared = Shared::sqlite();
    committed(&shared, 0, 4);
    assert_eq!(code(&compact(&shared)), 0);
    let last_epoch: u64 = shared
        .effects()
        .iter()
        .filter_map(|line| line.split(' ').nth(1)?.parse().ok())
        .max()
        .unwrap();
    assert!(last_epoch >= 4, "{:?}", shared.effects());
    let fresh = format!("sqlite:{}", shared.path("new-leases.db").display());
    let effect = format!(
        "echo \"day-9 $FENCEPOST_EPOCH\" >> '{}'",
        shared.path("effects").display()
    );
    let output = shared
        .command("host-3", &[])
        .args([
            "run", "--agent", "cron", "--intent", "backup", "--salt", "day-9", "--", "sh", "-c", &effect,
        ])
        .env("FENCEPOST_COORDINATOR", &fresh)
        .output()
        .unwrap();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    let epoch: u64 = shared
        .effects()
        .last()
        .and_then(|line| line.split(' ').nth(1)?.parse().ok())
        .unwrap();
    assert!(epoch > last_epoch, "epoch {epoch} after {last_epoch}");
}

/// K3: a damaged checkpoint stops a new host (exit 10, nothing runs, the message names the
/// checkpoint); random damage never lets a committed occurrence run; once the file is removed,
/// the host reads the whole ledger.
#[test]
fn k3_a_damaged_checkpoint_stops_a_new_host_and_never_runs_a_committed_occurrence() {
    let shared = Shared::sqlite();
    let salts = committed(&shared, 0, 30);
    assert_eq!(code(&compact(&shared)), 0);
    let checkpoint = checkpoints(&shared).pop().unwrap();
    let pristine = std::fs::read(&checkpoint).unwrap();
    // Cut in half.
    std::fs::write(&checkpoint, &pristine[..pristine.len() / 2]).unwrap();
    let output = job(&shared, "host-2", &salts[3]);
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("checkpoint"),
        "{}",
        text(&output.stderr)
    );
    // Random bytes changed: refused, or (the bytes meant nothing) used whole: never run.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut refused = 0;
    for (round, salt) in salts.iter().enumerate().take(12) {
        let mut bytes = pristine.clone();
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % bytes.len() as u64) as usize;
            bytes[at] ^= 0x5a;
        }
        std::fs::write(&checkpoint, &bytes).unwrap();
        let output = job(&shared, &format!("host-r{round}"), salt);
        match code(&output) {
            10 => refused += 1,
            3 => {}
            other => panic!("round {round}: exit {other}: {}", text(&output.stderr)),
        }
    }
    assert!(refused > 0);
    std::fs::remove_file(&checkpoint).unwrap();
    let output = job(&shared, "host-2", &salts[3]);
    assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    assert_once(&shared);
    assert_eq!(shared.effects().len(), 30);
}

/// K3: `ledger verify` checks each checkpoint against the records it covers: its own passes, one
/// of another ledger fails (exit 1) and is never used by a new host.
#[test]
fn k3_ledger_verify_reports_a_checkpoint_of_another_ledger() {
    let shared = Shared::sqlite();
    let salts = committed(&shared, 0, 3);
    assert_eq!(code(&compact(&shared)), 0);
    let output = shared.run("host-9", &["ledger", "verify"]);
    assert_eq!(
        code(&output),
        0,
        "{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    // Another ledger, with the same host name and more records.
    let other = Shared::sqlite();
    committed(&other, 100, 5);
    assert_eq!(code(&compact(&other)), 0);
    for own in checkpoints(&shared) {
        std::fs::remove_file(own).unwrap();
    }
    let foreign = checkpoints(&other).pop().unwrap();
    std::fs::copy(
        &foreign,
        shared
            .path("ledger")
            .join("checkpoints")
            .join(foreign.file_name().unwrap()),
    )
    .unwrap();
    let output = shared.run("host-9", &["ledger", "verify"]);
    assert_eq!(
        code(&output),
        1,
        "{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).contains("checkpoint"),
        "{}",
        text(&output.stdout)
    );
    for salt in &salts {
        let output = job(&shared, "host-2", salt);
        assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    }
    assert_once(&shared);
}

/// K1, K4: compactions killed at any moment leave no checkpoint that a host would start from
/// half-written; two compactions at once leave checkpoints that start a host right.
#[test]
fn k4_killed_and_concurrent_compactions_never_let_a_committed_occurrence_run() {
    let shared = Shared::sqlite();
    let salts = committed(&shared, 0, 40);
    for round in 0..8u64 {
        let mut child = shared
            .command(HOST, &["ledger", "compact"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(round * 7));
        child.kill().ok();
        child.wait().unwrap();
        let output = job(&shared, &format!("host-k{round}"), &salts[round as usize]);
        assert_eq!(code(&output), 3, "round {round}: {}", text(&output.stderr));
    }
    let first = shared.command(HOST, &["ledger", "compact"]).spawn().unwrap();
    let second = shared.command("host-2", &["ledger", "compact"]).spawn().unwrap();
    for mut child in [first, second] {
        assert!(child.wait().unwrap().success());
    }
    assert!(!checkpoints(&shared).is_empty());
    for (index, salt) in salts.iter().enumerate().step_by(5) {
        let output = job(&shared, &format!("host-n{index}"), salt);
        assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    }
    assert_once(&shared);
    assert_eq!(shared.effects().len(), 40);
}

/// K1: a damaged ledger is not compacted (exit 10): a checkpoint of it would lack commits.
#[test]
fn k1_ledger_compact_refuses_a_damaged_ledger() {
    let shared = Shared::sqlite();
    committed(&shared, 0, 3);
    let file = shared.path("ledger").join("devices").join("host-1.jsonl");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&file, bytes).unwrap();
    let output = shared.run("host-2", &["ledger", "compact"]);
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    assert!(checkpoints(&shared).is_empty());
}

/// K1: a SQLite ledger keeps its checkpoints beside its file; a new site (its own data
/// directory) starts from one and refuses every committed occurrence; a PostgreSQL ledger is
/// refused with a usage error (exit 2) until it keeps checkpoints.
#[test]
fn k1_a_sqlite_ledger_is_compacted_beside_its_file_and_a_new_site_starts_from_it() {
    let shared = Shared::sqlite();
    let ledger = format!("sqlite:{}", shared.path("ledger.db").display());
    let run = |device: &str, data: &str, salt: &str| {
        let effect = format!(
            "echo \"{salt} $FENCEPOST_EPOCH\" >> '{}'",
            shared.path("effects").display()
        );
        shared
            .command(device, &[])
            .args([
                "run", "--agent", "cron", "--intent", "backup", "--salt", salt, "--", "sh", "-c", &effect,
            ])
            .env("FENCEPOST_LEDGER", &ledger)
            .env("XDG_DATA_HOME", shared.path(data))
            .env("RUST_LOG", "info")
            .output()
            .unwrap()
    };
    for day in 0..4 {
        let output = run(HOST, "data", &format!("day-{day}"));
        assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    }
    let output = shared
        .command(HOST, &["ledger", "compact"])
        .env("FENCEPOST_LEDGER", &ledger)
        .output()
        .unwrap();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert!(shared.path("ledger.db.checkpoints").is_dir());
    for day in 0..4 {
        let output = run("host-2", "data-2", &format!("day-{day}"));
        assert_eq!(code(&output), 3, "{}", text(&output.stderr));
        let started = text(&output.stderr).contains("starting from the shared checkpoint");
        assert_eq!(started, day == 0, "{}", text(&output.stderr));
    }
    assert_once(&shared);
    let output = shared
        .command(HOST, &["ledger", "compact"])
        .env("FENCEPOST_LEDGER", "postgres://fencepost@127.0.0.1:1/nowhere")
        .output()
        .unwrap();
    assert_eq!(code(&output), 2, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("keeps no checkpoints"),
        "{}",
        text(&output.stderr)
    );
}
