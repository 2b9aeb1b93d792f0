//! Checkpoints compose (issue 37, rule K6) through the built binary: hosts whose ledger folders
//! are synced by copying prune before the copies carried each other's latest records, then the
//! copies catch up; every host, a new one included, goes on running new occurrences, refuses
//! every committed one, and finds the ledger intact.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{text, Shared};

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// A host: its device id and its copy of the ledger folder.
struct Host {
    device: &'static str,
    ledger: PathBuf,
}

impl Host {
    fn new(shared: &Shared, device: &'static str) -> Self {
        let ledger = shared.path(&format!("ledger-{device}"));
        std::fs::create_dir_all(&ledger).unwrap();
        Self { device, ledger }
    }

    fn run(&self, shared: &Shared, args: &[&str]) -> Output {
        shared
            .command(self.device, args)
            .env("FENCEPOST_LEDGER", &self.ledger)
            .output()
            .unwrap()
    }

    /// `fencepost run` of `agent`'s job for `salt`, appending the salt to `effects`.
    fn job(&self, shared: &Shared, agent: &str, salt: &str) -> Output {
        let effect = format!(
            "echo \"{salt} $FENCEPOST_DEVICE\" >> '{}'",
            shared.path("effects").display()
        );
        self.run(
            shared,
            &[
                "run", "--agent", agent, "--intent", "backup", "--salt", salt, "--ttl", "2s", "--wait",
                "10s", "--", "sh", "-c", &effect,
            ],
        )
    }

    /// `fencepost run` of `agent-a`'s job for `salt` that accepts the damage of `devices` and
    /// runs `effect`.
    fn accepting(&self, shared: &Shared, salt: &str, devices: &[&str], effect: &str) -> Output {
        let mut args = vec![
            "run", "--agent", "agent-a", "--intent", "backup", "--salt", salt, "--ttl", "2s",
        ];
        for device in devices {
            args.extend(["--accept-damaged", device]);
        }
        args.extend(["--", "sh", "-c", effect]);
        self.run(shared, &args)
    }

    fn commit(&self, shared: &Shared, agent: &str, salt: &str) {
        let output = self.job(shared, agent, salt);
        assert_eq!(
            code(&output),
            0,
            "{salt} on {}: {}",
            self.device,
            text(&output.stderr)
        );
    }
}

/// Copies what a sync tool would carry from `from`'s folder to `to`'s: `from`'s own device
/// file, and every checkpoint `to` lacks.
fn sync(from: &Host, to: &Host) {
    let file = |host: &Host| host.ledger.join("devices").join(format!("{}.jsonl", from.device));
    std::fs::create_dir_all(to.ledger.join("devices")).unwrap();
    if file(from).exists() {
        std::fs::copy(file(from), file(to)).unwrap();
    }
    copy_checkpoints(&from.ledger, &to.ledger);
}

fn copy_checkpoints(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from.join("checkpoints")) else {
        return;
    };
    std::fs::create_dir_all(to.join("checkpoints")).unwrap();
    for entry in entries {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("checkpoint-") {
            continue;
        }
        let target = to.join("checkpoints").join(&name);
        if !target.exists() {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn copy_folder(from: &Path, to: &Path) {
    for sub in ["devices", "checkpoints"] {
        std::fs::create_dir_all(to.join(sub)).unwrap();
        for entry in std::fs::read_dir(from.join(sub)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), to.join(sub).join(entry.file_name())).unwrap();
        }
    }
}

fn assert_once(shared: &Shared) {
    let mut salts: Vec<String> = shared
        .effects()
        .iter()
        .map(|line| line.split(' ').next().unwrap_or_default().to_owned())
        .collect();
    let all = salts.len();
    salts.sort();
    salts.dedup();
    assert_eq!(salts.len(), all, "an effect ran twice: {:?}", shared.effects());
}

/// K6 (issue 37, case 1): two hosts each prune before the copies of the folder carried the
/// other's latest records, then the copies sync both ways. Every host — the two, and a new host
/// with a copy of the folder — runs new occurrences (exit 0), refuses every committed one
/// (exit 3), compacts, and finds the ledger intact; nothing ran twice.
#[test]
fn k6_hosts_that_pruned_before_a_sync_carried_each_others_records_all_go_on() {
    let shared = Shared::sqlite();
    let alpha = Host::new(&shared, "alpha");
    let beta = Host::new(&shared, "beta");
    let mut committed: Vec<(&str, String)> = Vec::new();
    for day in 0..3 {
        for (host, agent) in [(&alpha, "agent-a"), (&beta, "agent-b")] {
            let salt = format!("{agent}-day-{day}");
            host.commit(&shared, agent, &salt);
            committed.push((agent, salt));
        }
    }
    sync(&alpha, &beta);
    sync(&beta, &alpha);
    // Offline from each other: more runs, then each prunes its own file.
    for day in 3..6 {
        for (host, agent) in [(&alpha, "agent-a"), (&beta, "agent-b")] {
            let salt = format!("{agent}-day-{day}");
            host.commit(&shared, agent, &salt);
            committed.push((agent, salt));
        }
    }
    for host in [&alpha, &beta] {
        let output = host.run(&shared, &["ledger", "compact", "--prune"]);
        assert_eq!(
            code(&output),
            0,
            "compact on {}: {}",
            host.device,
            text(&output.stderr)
        );
    }
    // The copies catch up, both ways.
    sync(&alpha, &beta);
    sync(&beta, &alpha);
    let gamma = Host::new(&shared, "gamma");
    copy_folder(&alpha.ledger, &gamma.ledger);
    // The advice the refusal used to give, taken on the new host: every commit is in one of
    // the checkpoints there, so nothing runs again (it ran a committed occurrence again).
    let effect = format!("echo again >> '{}'", shared.path("effects").display());
    let output = gamma.accepting(&shared, "agent-a-day-4", &["alpha", "beta"], &effect);
    assert_ne!(
        code(&output),
        0,
        "a committed run ran again: {}",
        text(&output.stderr)
    );

    for (host, agent) in [(&alpha, "agent-a"), (&beta, "agent-b"), (&gamma, "agent-c")] {
        let salt = format!("{agent}-after-{}", host.device);
        let output = host.job(&shared, agent, &salt);
        assert_eq!(
            code(&output),
            0,
            "a new occurrence on {}: {}",
            host.device,
            text(&output.stderr)
        );
    }
    for host in [&alpha, &beta, &gamma] {
        for (agent, salt) in &committed {
            let output = host.job(&shared, agent, salt);
            assert_eq!(
                code(&output),
                3,
                "{salt} on {} (committed before): {}",
                host.device,
                text(&output.stderr)
            );
        }
    }
    // The copies catch up with those runs too; then every host's ledger is whole.
    for from in [&alpha, &beta, &gamma] {
        for to in [&alpha, &beta, &gamma] {
            if from.device != to.device {
                sync(from, to);
            }
        }
    }
    for host in [&alpha, &beta, &gamma] {
        for args in [&["ledger", "verify"][..], &["ledger", "compact"], &["status"]] {
            let output = host.run(&shared, args);
            assert_eq!(
                code(&output),
                0,
                "{args:?} on {}: {}{}",
                host.device,
                text(&output.stdout),
                text(&output.stderr)
            );
        }
    }
    assert_once(&shared);
    assert_eq!(shared.effects().len(), committed.len() + 3);
}

/// Issue 37, item 4: a host whose copy holds a pruned file but not yet the checkpoint that
/// covers its first records is refused without advice to accept the damage (the records are
/// not lost) and, as for a record the sync has not brought yet, waits for it within --wait
/// (item 2: exit 7 when it does not come); accepting it anyway runs nothing that a checkpoint
/// it can read holds committed; once the checkpoint arrives, a waiting run goes on.
#[test]
fn k6_a_pruned_file_ahead_of_its_checkpoint_is_refused_without_advice_to_accept_it_and_accepting_it_runs_no_commit_again(
) {
    let shared = Shared::sqlite();
    let alpha = Host::new(&shared, "alpha");
    let beta = Host::new(&shared, "beta");
    let mut early = Vec::new();
    for day in 0..3 {
        let salt = format!("agent-a-day-{day}");
        alpha.commit(&shared, "agent-a", &salt);
        early.push(salt);
    }
    sync(&alpha, &beta);
    // beta's checkpoint covers alpha's early commits; alpha's own covers the later ones too.
    let output = beta.run(&shared, &["ledger", "compact"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    alpha.commit(&shared, "agent-a", "agent-a-day-3");
    let output = alpha.run(&shared, &["ledger", "compact", "--prune"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    // A new host gets alpha's pruned file and beta's checkpoint, not alpha's checkpoint yet.
    let gamma = Host::new(&shared, "gamma");
    std::fs::create_dir_all(gamma.ledger.join("devices")).unwrap();
    std::fs::copy(
        alpha.ledger.join("devices/alpha.jsonl"),
        gamma.ledger.join("devices/alpha.jsonl"),
    )
    .unwrap();
    copy_checkpoints(&beta.ledger, &gamma.ledger);
    // Item 2: the sync lags, no damage: waited for within --wait, then exit 7 (not 10).
    let output = gamma.run(
        &shared,
        &[
            "run",
            "--agent",
            "agent-a",
            "--intent",
            "backup",
            "--salt",
            "agent-a-day-4",
            "--wait",
            "3s",
            "--",
            "true",
        ],
    );
    let message = text(&output.stderr);
    assert_eq!(code(&output), 7, "{message}");
    assert!(
        message.contains("waiting for it while --wait lasts") && message.contains("not synced here yet"),
        "{message}"
    );
    assert!(
        !message.contains("--accept-damaged"),
        "advises what may run commits again: {message}"
    );
    let again = shared.path("effects-again");
    let effect = format!("echo again >> '{}'", again.display());
    for salt in &early {
        let output = gamma.accepting(&shared, salt, &["alpha"], &effect);
        assert_ne!(
            code(&output),
            0,
            "{salt}, committed in a checkpoint here, ran again: {}",
            text(&output.stderr)
        );
    }
    assert!(!again.exists(), "a committed run ran again");
    // Each accepting run recorded its acceptance once (found by an adversarial test: every
    // attempt of a run waiting for the checkpoint recorded it again).
    let log = std::fs::read_to_string(gamma.ledger.join("devices/gamma.jsonl")).unwrap_or_default();
    let accepted = log.matches("fencepost.accept-damaged").count();
    assert!(
        (1..=early.len()).contains(&accepted),
        "{accepted} acceptances recorded by {} runs",
        early.len()
    );
    // The checkpoint arrives while a run waits for it: that run goes on (refused, committed),
    // and so does every later one; a new one runs.
    let arrives = std::thread::spawn({
        let (from, to) = (alpha.ledger.clone(), gamma.ledger.clone());
        move || {
            std::thread::sleep(std::time::Duration::from_millis(1_500));
            copy_checkpoints(&from, &to);
        }
    });
    let output = gamma.job(&shared, "agent-a", &early[0]);
    arrives.join().unwrap();
    assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    for salt in early.iter().map(String::as_str).chain(["agent-a-day-3"]) {
        let output = gamma.job(&shared, "agent-a", salt);
        assert_eq!(code(&output), 3, "{salt}: {}", text(&output.stderr));
    }
    gamma.commit(&shared, "agent-a", "agent-a-day-4");
    assert_once(&shared);
}

/// K6, issue 37 item 2 (found by the torture test's lagging copy): a checkpoint that reaches a
/// host before the records of a file it covers (the file here holds fewer than the checkpoint
/// read, `ProblemKind::Behind`) is a sync that lags: a run waits for the file within --wait and
/// goes on when it comes; one whose --wait runs out first exits 7, not 10; nothing runs twice.
#[test]
fn k6_a_checkpoint_ahead_of_a_files_records_is_waited_for_not_damage() {
    let shared = Shared::sqlite();
    let alpha = Host::new(&shared, "alpha");
    let beta = Host::new(&shared, "beta");
    let gamma = Host::new(&shared, "gamma");
    alpha.commit(&shared, "agent-a", "a-0");
    beta.commit(&shared, "agent-b", "b-0");
    // gamma's copy gets beta's file as it is now; beta commits again, alpha reads it all,
    // writes a checkpoint and prunes its own file.
    sync(&beta, &gamma);
    beta.commit(&shared, "agent-b", "b-1");
    sync(&beta, &alpha);
    let output = alpha.run(&shared, &["ledger", "compact", "--prune"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    // gamma gets alpha's pruned file and the checkpoint, not beta's newer records.
    sync(&alpha, &gamma);
    let output = gamma.run(
        &shared,
        &[
            "run", "--agent", "agent-b", "--intent", "backup", "--salt", "b-2", "--wait", "3s", "--", "true",
        ],
    );
    let message = text(&output.stderr);
    assert_eq!(code(&output), 7, "{message}");
    assert!(
        message.contains("waiting for it while --wait lasts") && message.contains("let the sync bring them"),
        "{message}"
    );
    // beta's records arrive while a run waits: it goes on.
    let arrives = std::thread::spawn({
        let (from, to) = (
            beta.ledger.join("devices/beta.jsonl"),
            gamma.ledger.join("devices/beta.jsonl"),
        );
        move || {
            std::thread::sleep(std::time::Duration::from_millis(1_500));
            std::fs::copy(from, to).unwrap();
        }
    });
    let output = gamma.job(&shared, "agent-b", "b-1");
    arrives.join().unwrap();
    assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    gamma.commit(&shared, "agent-b", "b-2");
    assert_once(&shared);
}

/// Issue 37, item 4 (found by an adversarial test): a new host whose copy holds a checkpoint
/// ahead of a file's records (no file pruned) is refused; accepting that damage runs nothing
/// the checkpoint holds committed (its commits count, as its fencing epochs do, rule K2).
#[test]
fn k6_accepting_a_file_behind_its_checkpoint_runs_none_of_the_checkpoints_commits_again() {
    let shared = Shared::sqlite();
    let alpha = Host::new(&shared, "alpha");
    let beta = Host::new(&shared, "beta");
    let file = |host: &Host| host.ledger.join("devices/alpha.jsonl");
    alpha.commit(&shared, "agent-a", "q-0");
    let early = std::fs::read(file(&alpha)).unwrap();
    for salt in ["q-1", "q-2"] {
        alpha.commit(&shared, "agent-a", salt);
    }
    let output = alpha.run(&shared, &["ledger", "compact"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    copy_checkpoints(&alpha.ledger, &beta.ledger);
    std::fs::create_dir_all(beta.ledger.join("devices")).unwrap();
    std::fs::write(file(&beta), early).unwrap();
    let again = shared.path("effects-again");
    let effect = format!("echo again >> '{}'", again.display());
    for salt in ["q-1", "q-2"] {
        let output = beta.accepting(&shared, salt, &["alpha"], &effect);
        assert_eq!(code(&output), 3, "{salt}: {}", text(&output.stderr));
    }
    assert!(!again.exists(), "a run the checkpoint holds committed ran again");
    assert_once(&shared);
}

/// K6, K3 (found by the torture test's lagging copy, CI): a checkpoint that a sync brings after
/// a newer one covered its records, and after those records were pruned, cannot be checked any
/// more, and no reading uses it: it is not damage (`ledger verify` exits 0, it said "cannot be
/// checked" for good, since no compaction removed it) and the next compaction removes it.
#[test]
fn k6_k3_a_checkpoint_that_arrives_after_a_newer_one_pruned_its_records_is_no_damage_and_goes() {
    let shared = Shared::sqlite();
    let alpha = Host::new(&shared, "alpha");
    let beta = Host::new(&shared, "beta");
    alpha.commit(&shared, "agent-a", "s-0");
    sync(&alpha, &beta);
    beta.commit(&shared, "agent-b", "s-1");
    // beta's checkpoint covers both files as they are now; it stays on beta for a while.
    let output = beta.run(&shared, &["ledger", "compact"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    let late: Vec<PathBuf> = std::fs::read_dir(beta.ledger.join("checkpoints"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("checkpoint-")
        })
        .collect();
    assert_eq!(late.len(), 1, "{late:?}");
    // alpha reads beta's records (not its checkpoint yet), runs more, compacts and prunes.
    let file = |host: &Host| host.ledger.join("devices/beta.jsonl");
    std::fs::create_dir_all(alpha.ledger.join("devices")).unwrap();
    std::fs::copy(file(&beta), file(&alpha)).unwrap();
    alpha.commit(&shared, "agent-a", "s-2");
    let output = alpha.run(&shared, &["ledger", "compact", "--prune"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    // beta's checkpoint arrives now.
    copy_checkpoints(&beta.ledger, &alpha.ledger);
    let arrived = alpha
        .ledger
        .join("checkpoints")
        .join(late[0].file_name().unwrap());
    assert!(arrived.exists());
    let verify = || {
        let output = alpha.run(&shared, &["ledger", "verify"]);
        let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert_eq!(code(&output), 0, "{said}");
    };
    verify();
    let output = alpha.run(&shared, &["ledger", "compact"]);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert!(!arrived.exists(), "the compaction left the superseded checkpoint");
    verify();
    for salt in ["s-0", "s-2"] {
        let output = alpha.job(&shared, "agent-a", salt);
        assert_eq!(code(&output), 3, "{salt}: {}", text(&output.stderr));
    }
    alpha.commit(&shared, "agent-a", "s-3");
    assert_once(&shared);
}
