//! Pruning (issue 17, item 2; rule K5) through the built binary: `ledger compact --prune`
//! removes from this host's own device file the records the checkpoint covers, and no host,
//! new, up to date or long away, runs a committed occurrence again; a pruned ledger whose
//! checkpoint is missing, or whose file lost records since, runs nothing; runs of the same
//! device during prunes lose no record. The same for a SQLite ledger (its logs' rows deleted in
//! one transaction).

mod common;

use std::process::Output;

use common::{text, Shared};

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// `fencepost run` of a job for `salt` that appends the salt and the device to `effects`.
fn job(shared: &Shared, device: &str, salt: &str) -> Output {
    job_waiting(shared, device, salt, "30s")
}

/// [`job`] with its `--wait`.
fn job_waiting(shared: &Shared, device: &str, salt: &str, wait: &str) -> Output {
    let effect = format!(
        "echo \"{salt} $FENCEPOST_DEVICE\" >> '{}'",
        shared.path("effects").display()
    );
    shared.run(
        device,
        &[
            "run", "--agent", "cron", "--intent", "backup", "--salt", salt, "--ttl", "2s", "--wait", wait,
            "--", "sh", "-c", &effect,
        ],
    )
}

fn commit(shared: &Shared, device: &str, salt: &str) {
    let output = job(shared, device, salt);
    assert_eq!(code(&output), 0, "{salt} on {device}: {}", text(&output.stderr));
}

fn prune(shared: &Shared, device: &str) -> Output {
    shared.run(device, &["ledger", "compact", "--prune"])
}

/// The records of `device` that its log holds (its file's lines, or its rows).
fn lines(shared: &Shared, device: &str) -> usize {
    if shared.ledger_spec.is_some() {
        let database = rusqlite::Connection::open(shared.path("ledger.db")).unwrap();
        let rows: i64 = database
            .query_row(
                "SELECT count(*) FROM fencepost_relay_records WHERE device_id = ?1",
                [device],
                |row| row.get(0),
            )
            .unwrap();
        return usize::try_from(rows).unwrap();
    }
    std::fs::read_to_string(
        shared
            .path("ledger")
            .join("devices")
            .join(format!("{device}.jsonl")),
    )
    .unwrap_or_default()
    .lines()
    .count()
}

/// Where the hosts' ledger keeps its checkpoints.
fn checkpoints_dir(shared: &Shared) -> std::path::PathBuf {
    if shared.ledger_spec.is_some() {
        shared.path("ledger.db.checkpoints")
    } else {
        shared.path("ledger").join("checkpoints")
    }
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

fn assert_refused_everywhere(shared: &Shared, devices: &[&str], salts: &[String]) {
    for device in devices {
        for salt in salts {
            let output = job(shared, device, salt);
            assert_eq!(code(&output), 3, "{salt} on {device}: {}", text(&output.stderr));
        }
    }
}

/// K5 (with K1): both hosts prune their files; their files shrink to what follows the
/// checkpoint; every committed occurrence is refused (exit 3) by both, by a new host, and by a
/// host whose snapshot was made before both prunes; `ledger verify` finds the ledger intact, and
/// new occurrences run.
#[test]
fn k5_k1_after_every_host_pruned_no_host_runs_a_committed_occurrence_again() {
    k5_k1_after_every_host_pruned_no_host_runs_a_committed_occurrence_again_in(Shared::sqlite());
}

/// The same for a SQLite ledger.
#[test]
fn k5_k1_sqlite_after_every_host_pruned_no_host_runs_a_committed_occurrence_again() {
    k5_k1_after_every_host_pruned_no_host_runs_a_committed_occurrence_again_in(Shared::sqlite_ledger());
}

fn k5_k1_after_every_host_pruned_no_host_runs_a_committed_occurrence_again_in(shared: Shared) {
    commit(&shared, "away", "day-away");
    let mut salts = vec!["day-away".to_owned()];
    for index in 0..6 {
        for device in ["laptop", "server"] {
            let salt = format!("day-{index}-{device}");
            commit(&shared, device, &salt);
            salts.push(salt);
        }
    }
    assert_eq!(lines(&shared, "laptop"), 12);
    let pruned = prune(&shared, "laptop");
    assert_eq!(code(&pruned), 0, "{}", text(&pruned.stderr));
    assert!(
        text(&pruned.stdout).contains("removed 11 records"),
        "{}",
        text(&pruned.stdout)
    );
    assert_eq!(lines(&shared, "laptop"), 1, "the last record stays");
    commit(&shared, "laptop", "day-7-laptop");
    salts.push("day-7-laptop".to_owned());
    let pruned = prune(&shared, "server");
    assert_eq!(code(&pruned), 0, "{}", text(&pruned.stderr));
    assert_eq!(lines(&shared, "server"), 1);
    assert_eq!(lines(&shared, "laptop"), 3);
    let listed = std::fs::read_dir(checkpoints_dir(&shared)).unwrap().count();
    assert_eq!(listed, 1, "the checkpoint the newer one contains is removed");
    assert_refused_everywhere(&shared, &["laptop", "server", "new-host", "away"], &salts);
    let verified = shared.run("new-host", &["ledger", "verify"]);
    assert_eq!(
        code(&verified),
        0,
        "{}{}",
        text(&verified.stdout),
        text(&verified.stderr)
    );
    commit(&shared, "away", "day-8");
    commit(&shared, "new-host", "day-9");
    assert_once(&shared);
}

/// K5, K3: a device file that begins after a checkpoint, with no checkpoint here that covers
/// what it lacks (not synced yet, removed), runs nothing on a host that does not know the
/// records (in a folder, exit 7 once --wait ran out: a sync may bring it, issue 37 item 2), and
/// the committed occurrences run again nowhere.
#[test]
fn k5_k3_a_pruned_ledger_without_its_checkpoint_runs_nothing() {
    k5_k3_a_pruned_ledger_without_its_checkpoint_runs_nothing_in(Shared::sqlite(), 7);
}

/// The same for a SQLite ledger (exit 10: a database brings nothing later, its rows are gone).
#[test]
fn k5_k3_sqlite_a_pruned_ledger_without_its_checkpoint_runs_nothing() {
    k5_k3_a_pruned_ledger_without_its_checkpoint_runs_nothing_in(Shared::sqlite_ledger(), 10);
}

fn k5_k3_a_pruned_ledger_without_its_checkpoint_runs_nothing_in(shared: Shared, exit: i32) {
    let salts: Vec<String> = (0..4).map(|index| format!("day-{index}")).collect();
    for salt in &salts {
        commit(&shared, "laptop", salt);
    }
    assert_eq!(code(&prune(&shared, "laptop")), 0);
    let folder = checkpoints_dir(&shared);
    let aside = shared.path("aside");
    std::fs::rename(&folder, &aside).unwrap();
    for salt in &salts {
        let output = job_waiting(&shared, "new-host", salt, "1s");
        assert_eq!(code(&output), exit, "{salt}: {}", text(&output.stderr));
        assert!(
            text(&output.stderr).contains("covers the records removed"),
            "{}",
            text(&output.stderr)
        );
    }
    let verified = shared.run("other-host", &["ledger", "verify"]);
    assert_ne!(code(&verified), 0, "{}", text(&verified.stdout));
    std::fs::rename(&aside, &folder).unwrap();
    assert_refused_everywhere(&shared, &["new-host", "laptop"], &salts);
    assert_once(&shared);
}

/// K5 (the "once" rule that a device that shrank is damage): records appended after a prune
/// and then lost from the file are damage for a host that read them (exit 10), not a reason to
/// run their occurrence again; records cut from the start of a file without a checkpoint that
/// covers them run nothing either.
#[test]
fn k5_a_pruned_file_that_lost_records_since_is_still_damage() {
    let shared = Shared::sqlite();
    for index in 0..3 {
        commit(&shared, "laptop", &format!("day-{index}"));
    }
    assert_eq!(code(&prune(&shared, "laptop")), 0);
    commit(&shared, "laptop", "day-after");
    // The server reads the commit of day-after.
    commit(&shared, "server", "day-server");
    let path = shared.path("ledger").join("devices").join("laptop.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(kept.len(), 3);
    std::fs::write(&path, format!("{}\n", kept[0])).unwrap();
    let output = job(&shared, "server", "day-after");
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    // Cut from the start instead (its last record kept): no checkpoint covers the gap. A host
    // cannot tell that from a checkpoint the sync has not brought yet (exit 7, issue 37 item 2):
    // either way it runs nothing.
    std::fs::write(&path, format!("{}\n", kept[2])).unwrap();
    let output = job_waiting(&shared, "new-host", "day-0", "1s");
    assert_eq!(code(&output), 7, "{}", text(&output.stderr));
    assert_once(&shared);
}

/// K5, R1: runs of the device (several processes at once) while it prunes its file again and
/// again lose no record: every run that ran is committed, its occurrence is refused afterwards,
/// and the ledger verifies (found by reading the code: a run waiting for the file's lock while a
/// prune replaced the file would have appended to the file removed).
#[test]
fn k5_r1_runs_of_the_device_during_its_prunes_lose_no_record() {
    k5_r1_runs_of_the_device_during_its_prunes_lose_no_record_in(Shared::sqlite());
}

/// The same for a SQLite ledger.
#[test]
fn k5_r1_sqlite_runs_of_the_device_during_its_prunes_lose_no_record() {
    k5_r1_runs_of_the_device_during_its_prunes_lose_no_record_in(Shared::sqlite_ledger());
}

fn k5_r1_runs_of_the_device_during_its_prunes_lose_no_record_in(shared: Shared) {
    commit(&shared, "laptop", "day-first");
    let effect = format!(
        "echo \"$FENCEPOST_RUN_ID\" >> '{}'",
        shared.path("effects").display()
    );
    let mut runners = Vec::new();
    for worker in 0..3 {
        let shared_effect = effect.clone();
        let command = move |shared: &Shared, index: usize| {
            shared.spawn(
                "laptop",
                &[
                    "run",
                    "--agent",
                    &format!("job-{worker}"),
                    "--intent",
                    "sync",
                    "--salt",
                    &format!("{index}"),
                    "--ttl",
                    "5s",
                    "--wait",
                    "60s",
                    "--",
                    "sh",
                    "-c",
                    &shared_effect,
                ],
            )
        };
        runners.push(command);
    }
    let mut ran = Vec::new();
    for round in 0..8 {
        let children: Vec<_> = runners
            .iter()
            .enumerate()
            .map(|(worker, command)| (worker, command(&shared, round)))
            .collect();
        let pruned = prune(&shared, "laptop");
        assert!(matches!(code(&pruned), 0 | 10), "{}", text(&pruned.stderr));
        for (worker, child) in children {
            let output = child.wait_with_output().unwrap();
            assert_eq!(
                code(&output),
                0,
                "round {round}, worker {worker}: {}",
                text(&output.stderr)
            );
            ran.push((worker, round));
        }
    }
    let pruned = prune(&shared, "laptop");
    assert_eq!(code(&pruned), 0, "{}", text(&pruned.stderr));
    let verified = shared.run("laptop", &["ledger", "verify"]);
    assert_eq!(
        code(&verified),
        0,
        "{}{}",
        text(&verified.stdout),
        text(&verified.stderr)
    );
    for device in ["laptop", "new-host"] {
        for (worker, round) in &ran {
            let output = shared.run(
                device,
                &[
                    "run",
                    "--agent",
                    &format!("job-{worker}"),
                    "--intent",
                    "sync",
                    "--salt",
                    &format!("{round}"),
                    "--ttl",
                    "5s",
                    "--wait",
                    "30s",
                    "--",
                    "sh",
                    "-c",
                    &effect,
                ],
            );
            assert_eq!(
                code(&output),
                3,
                "job-{worker} {round} on {device}: {}",
                text(&output.stderr)
            );
        }
    }
    let effects = shared.effects();
    let mut unique = effects.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), effects.len(), "an effect ran twice");
}

/// K5 (a device that shrank is damage), in a SQLite ledger: rows appended after a prune and
/// then deleted (the length edited to match) are, for a host that read them, a database that
/// went back (rule R1): it writes the commit it read back and refuses that run (exit 3); rows
/// deleted from the start of a log without a checkpoint that covers them are damage for a
/// new host; neither runs a committed occurrence again.
#[test]
fn k5_sqlite_a_pruned_log_that_lost_records_since_is_still_damage() {
    let shared = Shared::sqlite_ledger();
    for index in 0..3 {
        commit(&shared, "laptop", &format!("day-{index}"));
    }
    assert_eq!(code(&prune(&shared, "laptop")), 0);
    assert_eq!(lines(&shared, "laptop"), 1);
    commit(&shared, "laptop", "day-after");
    commit(&shared, "server", "day-server");
    let database = rusqlite::Connection::open(shared.path("ledger.db")).unwrap();
    let edit = |sql: &str| database.execute_batch(sql).unwrap();
    let top: i64 = database
        .query_row(
            "SELECT max(seq) FROM fencepost_relay_records WHERE device_id = 'laptop'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    edit(&format!(
        "BEGIN; DELETE FROM fencepost_relay_records WHERE device_id = 'laptop' AND seq > {first};
         UPDATE fencepost_relay_devices SET next_seq = {next} WHERE device_id = 'laptop'; COMMIT;",
        first = top - 2,
        next = top - 1
    ));
    let output = job(&shared, "server", "day-after");
    assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("this database went back")
            && text(&output.stderr).contains("wrote the 1 commit it had seen back"),
        "{}",
        text(&output.stderr)
    );
    // The checkpoint removed instead, the log as pruned: a new host lacks what it covered.
    std::fs::remove_dir_all(checkpoints_dir(&shared)).unwrap();
    let output = job(&shared, "new-host", "day-0");
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("covers the records removed"),
        "{}",
        text(&output.stderr)
    );
    assert_once(&shared);
}

/// K5: a prune killed with SIGKILL at any point leaves the file whole or pruned, never less:
/// afterwards every committed occurrence is refused and the ledger verifies.
#[test]
fn k5_a_prune_killed_at_any_point_leaves_the_file_whole_or_pruned() {
    k5_a_prune_killed_at_any_point_leaves_the_file_whole_or_pruned_in(Shared::sqlite());
}

/// The same (a transaction) for a SQLite ledger.
#[test]
fn k5_sqlite_a_prune_killed_at_any_point_leaves_the_log_whole_or_pruned() {
    k5_a_prune_killed_at_any_point_leaves_the_file_whole_or_pruned_in(Shared::sqlite_ledger());
}

fn k5_a_prune_killed_at_any_point_leaves_the_file_whole_or_pruned_in(shared: Shared) {
    let mut salts = Vec::new();
    for round in 0..6u64 {
        for index in 0..3 {
            let salt = format!("day-{round}-{index}");
            commit(&shared, "laptop", &salt);
            salts.push(salt);
        }
        let mut child = shared.spawn("laptop", &["ledger", "compact", "--prune"]);
        std::thread::sleep(std::time::Duration::from_millis(round * 7));
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_refused_everywhere(&shared, &["laptop", "new-host"], &salts);
    let verified = shared.run("laptop", &["ledger", "verify"]);
    assert_eq!(
        code(&verified),
        0,
        "{}{}",
        text(&verified.stdout),
        text(&verified.stderr)
    );
    assert_once(&shared);
}

/// K5, R1: two hosts pruning in turn while both run jobs and new hosts ask for committed ones:
/// no run is stopped as if the ledger were damaged (exit 10), and every job runs once. Found by
/// an adversarial test: a reading that started from a checkpoint (or read a file) just before
/// another host wrote a newer one and pruned found the file beginning after what it lacked and
/// stopped healthy runs with exit 10 (now `run` reads again from the newest checkpoint), and a
/// reading went on at an old offset, in the middle of a line, of a file pruned twice whose new
/// copy the file system had given the old one's number.
#[test]
fn k5_r1_hosts_pruning_while_others_run_stop_no_healthy_run() {
    hosts_pruning_while_others_run(Shared::sqlite());
}

/// The same for a SQLite ledger.
#[test]
fn k5_r1_sqlite_hosts_pruning_while_others_run_stop_no_healthy_run() {
    hosts_pruning_while_others_run(Shared::sqlite_ledger());
}

fn hosts_pruning_while_others_run(shared: Shared) {
    let shared = std::sync::Arc::new(shared);
    let codes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for device in ["p1", "p2"] {
        let (shared, codes) = (shared.clone(), codes.clone());
        threads.push(std::thread::spawn(move || {
            for index in 0..40 {
                let output = job(&shared, device, &format!("{device}-{index}"));
                codes
                    .lock()
                    .unwrap()
                    .push((device.to_owned(), code(&output), text(&output.stderr)));
            }
        }));
    }
    {
        let shared = shared.clone();
        threads.push(std::thread::spawn(move || {
            // A SQLite ledger is made by the first run: compacting one that does not exist yet
            // is an error ("no ledger at …"), which a loaded machine let the first prune meet.
            if let Some(file) = shared
                .ledger_spec
                .as_deref()
                .and_then(|spec| spec.strip_prefix("sqlite:"))
            {
                common::wait_for_file(std::path::Path::new(file));
            }
            for round in 0..30 {
                let output = prune(&shared, ["p1", "p2"][round % 2]);
                assert_eq!(code(&output), 0, "prune {round}: {}", text(&output.stderr));
            }
        }));
    }
    {
        let (shared, codes) = (shared.clone(), codes.clone());
        threads.push(std::thread::spawn(move || {
            for round in 0..30 {
                let device = format!("new-{round}");
                let salt = format!("p{}-{}", round % 2 + 1, round % 20);
                let output = job(&shared, &device, &salt);
                codes
                    .lock()
                    .unwrap()
                    .push((device, code(&output), text(&output.stderr)));
            }
        }));
    }
    for thread in threads {
        thread.join().unwrap();
    }
    for (device, code, stderr) in codes.lock().unwrap().iter() {
        assert!([0, 3].contains(code), "{device}: exit {code}: {stderr}");
    }
    assert_once(&shared);
    assert_eq!(shared.effects().len(), 80, "every job ran");
    let verify = shared.run("p1", &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify.stdout));
}

/// K5: `ledger import` from a pruned folder is refused whole (found by an adversarial run: it
/// copied the records left in the files, and a committed occurrence ran again on the new
/// ledger), and nothing is imported.
#[test]
fn k5_ledger_import_refuses_a_pruned_folder() {
    k5_ledger_import_refuses_a_pruned_folder_in(Shared::sqlite());
}

/// The same for a SQLite ledger.
#[test]
fn k5_ledger_import_refuses_a_pruned_sqlite_ledger() {
    k5_ledger_import_refuses_a_pruned_folder_in(Shared::sqlite_ledger());
}

fn k5_ledger_import_refuses_a_pruned_folder_in(shared: Shared) {
    for salt in ["day-1", "day-2"] {
        commit(&shared, "laptop", salt);
    }
    let output = prune(&shared, "laptop");
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    let target = format!("sqlite:{}", shared.path("imported.db").display());
    let from = shared
        .ledger_spec
        .clone()
        .unwrap_or_else(|| shared.path("ledger").display().to_string());
    let output = shared
        .command("laptop", &["ledger", "import", &from])
        .env("FENCEPOST_LEDGER", &target)
        .output()
        .unwrap();
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("were pruned"),
        "{}",
        text(&output.stderr)
    );
    let show = shared
        .command("laptop", &["ledger", "runs", "--json"])
        .env("FENCEPOST_LEDGER", &target)
        .output()
        .unwrap();
    assert!(
        !text(&show.stdout).contains("committed"),
        "nothing imported: {}",
        text(&show.stdout)
    );
}

/// K5, R1: a device file replaced by another log of the same device id in its pruned form,
/// with that log's checkpoint copied in, stays damage for a host that had read the first log,
/// run after run (found by an adversarial test: refused once, then run on, since the record the
/// host saw last is in the pruned part and was never read again to be compared).
#[test]
fn k5_r1_a_device_file_replaced_by_another_pruned_log_stays_damage() {
    let shared = Shared::sqlite();
    for day in 1..=6 {
        commit(&shared, "laptop", &format!("day-{day}"));
    }
    commit(&shared, "phone", "phone-1");
    // Another log of device "laptop", elsewhere: pruned, then written on.
    let other = Shared::sqlite();
    for index in 0..30 {
        commit(&other, "laptop", &format!("other-{index}"));
    }
    let output = prune(&other, "laptop");
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    for index in 30..40 {
        commit(&other, "laptop", &format!("other-{index}"));
    }
    let checkpoints = shared.path("ledger").join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    for file in std::fs::read_dir(other.path("ledger").join("checkpoints")).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), checkpoints.join(file.file_name())).unwrap();
    }
    let replaced = std::fs::read(other.path("ledger/devices/laptop.jsonl")).unwrap();
    std::fs::write(shared.path("ledger/devices/laptop.jsonl"), replaced).unwrap();
    for attempt in 0..3 {
        let output = job(&shared, "phone", &format!("phone-next-{attempt}"));
        assert_eq!(code(&output), 10, "attempt {attempt}: {}", text(&output.stderr));
    }
    let verify = shared.run("phone", &["ledger", "verify"]);
    assert_eq!(code(&verify), 1, "{}", text(&verify.stdout));
    assert_eq!(shared.effects().len(), 7, "nothing ran on the replaced file");
}
