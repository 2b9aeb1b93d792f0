//! The local snapshot (issue 17, item 1) through the built binary: a `run` resumes from it, and
//! a snapshot that is damaged, cut short, replaced, deleted or killed while being written never
//! makes a committed run run again (rules F6, R1).

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{text, Shared};

const HOST: &str = "host-1";

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// `fencepost run` of a job for `salt` that appends the salt to `effects`.
fn job(shared: &Shared, device: &str, salt: &str) -> Output {
    shared.run(
        device,
        &job_args(shared, salt)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
}

/// The job's arguments; a salt `agent/salt` runs for that agent.
fn job_args(shared: &Shared, salt: &str) -> Vec<String> {
    let (agent, salt) = salt.split_once('/').unwrap_or(("cron", salt));
    let effect = format!("echo {salt} >> '{}'", shared.path("effects").display());
    // A short lease, waited for: a killed holder's lease ends soon.
    [
        "run", "--agent", agent, "--intent", "backup", "--salt", salt, "--ttl", "1s", "--wait", "20s", "--",
        "sh", "-c", &effect,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The snapshot files of the site (one per ledger and device).
fn snapshots(shared: &Shared) -> Vec<PathBuf> {
    let folder = shared.path("data").join("fencepost").join("snapshots");
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .map(|listing| {
            listing
                .map(|item| item.unwrap().path())
                .filter(|path| path.extension().is_some_and(|extension| extension == "sqlite"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Commits `count` occurrences on [`HOST`]; returns their salts.
fn committed(shared: &Shared, count: usize) -> Vec<String> {
    let salts: Vec<String> = (0..count).map(|index| format!("day-{index}")).collect();
    for salt in &salts {
        let output = job(shared, HOST, salt);
        assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    }
    salts
}

/// Every salt ran at most once.
fn assert_once(shared: &Shared) {
    let effects = shared.effects();
    let mut unique = effects.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), effects.len(), "an effect ran twice: {effects:?}");
}

/// R1, F6: a `run` on a host that ran before resumes from its snapshot (reads only what was added
/// since), and a `run` of a committed occurrence is refused from it.
#[test]
fn r1_snapshot_a_run_resumes_from_its_snapshot_and_refuses_a_committed_occurrence() {
    let shared = Shared::sqlite();
    let salts = committed(&shared, 3);
    assert_eq!(snapshots(&shared).len(), 1, "one snapshot per ledger and device");
    let mut again = shared.command(
        HOST,
        &job_args(&shared, &salts[1])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let again = again.env("RUST_LOG", "fencepost=debug").output().unwrap();
    assert_eq!(code(&again), 3, "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("resumed from the snapshot"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(shared.effects().len(), 3);
}

/// A change made to a snapshot file.
type Damage<'a> = Box<dyn Fn() + 'a>;

/// R1, F6: whatever happens to the snapshot file (garbage, cut short, a stored run changed, gone,
/// another device's in its place), a committed occurrence never runs again, and new ones run
/// once.
#[test]
fn r1_snapshot_a_damaged_or_replaced_snapshot_never_runs_a_committed_occurrence_again() {
    let shared = Shared::sqlite();
    let salts = committed(&shared, 4);
    // Another device's snapshot of the same ledger, to put in this one's place.
    assert_eq!(code(&job(&shared, "host-2", &salts[0])), 3);
    let files = snapshots(&shared);
    assert_eq!(files.len(), 2);
    let (mine, theirs) = if files[0].to_string_lossy().contains(HOST) {
        (files[0].clone(), files[1].clone())
    } else {
        (files[1].clone(), files[0].clone())
    };
    let damages: Vec<(&str, Damage)> = vec![
        (
            "garbage",
            Box::new(|| std::fs::write(&mine, b"disk full garbage, not a database").unwrap()),
        ),
        (
            "cut short",
            Box::new(|| {
                let bytes = std::fs::read(&mine).unwrap();
                std::fs::write(&mine, &bytes[..bytes.len() / 2]).unwrap();
            }),
        ),
        (
            "a stored run changed",
            Box::new(|| {
                let connection = rusqlite::Connection::open(&mine).unwrap();
                let changed = connection
                    .execute("UPDATE buckets SET value = x'00' || substr(value, 2)", [])
                    .unwrap();
                assert!(changed > 0);
            }),
        ),
        ("removed", Box::new(|| std::fs::remove_file(&mine).unwrap())),
        (
            "another device's",
            Box::new(|| {
                std::fs::copy(&theirs, &mine).unwrap();
            }),
        ),
    ];
    for (index, (what, damage)) in damages.iter().enumerate() {
        // A run first, so that the snapshot is there and up to date.
        let fresh = job(&shared, HOST, &format!("new-{index}"));
        assert_eq!(code(&fresh), 0, "{what}: {}", text(&fresh.stderr));
        damage();
        for salt in &salts {
            let again = job(&shared, HOST, salt);
            let status = code(&again);
            // Refused as committed, or (a stored run that cannot be read) as damage: never run.
            assert!(
                status == 3 || status == 10,
                "{what}: {salt}: exit {status}: {}",
                text(&again.stderr)
            );
            if status == 10 {
                assert!(
                    text(&again.stderr).contains("snapshot"),
                    "{what}: {}",
                    text(&again.stderr)
                );
            }
        }
        // The next command rebuilds the snapshot: every committed occurrence refused as such.
        for salt in &salts {
            let again = job(&shared, HOST, salt);
            assert_eq!(
                code(&again),
                3,
                "{what}, rebuilt: {salt}: {}",
                text(&again.stderr)
            );
        }
        assert_once(&shared);
    }
    assert_eq!(shared.effects().len(), salts.len() + damages.len());
}

/// R1, F6: runs killed (SIGKILL) at any point, the snapshot's save included, lose nothing: every
/// occurrence whose effect happened is refused afterwards, none runs twice.
#[test]
fn r1_snapshot_runs_killed_at_any_point_never_run_an_effect_twice() {
    let shared = Shared::sqlite();
    let started = std::time::Instant::now();
    committed(&shared, 2);
    // How long a run takes here: the kills are spread over it.
    let span = started.elapsed() / 2;
    let mut salts = Vec::new();
    for index in 0..24u32 {
        // An agent each: a run killed while it holds its lease does not hold up the next.
        let salt = format!("agent-{index}/killed-{index}");
        let args = job_args(&shared, &salt);
        let mut child = shared.spawn(HOST, &args.iter().map(String::as_str).collect::<Vec<_>>());
        // From right at the start to after the end of the command.
        std::thread::sleep(span * index / 20);
        let _ = child.kill();
        let _ = child.wait();
        salts.push(salt);
    }
    let mut statuses = Vec::new();
    for salt in &salts {
        // Runs that never began run now; those killed mid-command are in doubt (exit 5); those
        // that committed are refused.
        let output = job(&shared, HOST, salt);
        statuses.push(code(&output));
        assert!(
            [0, 3, 5].contains(&code(&output)),
            "{salt}: exit {}: {}",
            code(&output),
            text(&output.stderr)
        );
    }
    eprintln!("after the kills, the runs again exited with {statuses:?}");
    for salt in &salts {
        let output = job(&shared, HOST, salt);
        assert!(
            [3, 5].contains(&code(&output)),
            "{salt}: {}",
            text(&output.stderr)
        );
    }
    assert_once(&shared);
}

/// The snapshot file of [`HOST`].
fn my_snapshot(shared: &Shared) -> PathBuf {
    snapshots(shared)
        .into_iter()
        .find(|path| path.to_string_lossy().contains(HOST))
        .unwrap()
}

/// Every committed occurrence is refused (exit 3), or the run stops on the damaged snapshot (exit
/// 10, naming it); none runs. Then (the snapshot rebuilt) each is refused as committed.
fn assert_nothing_runs_again(shared: &Shared, salts: &[String], what: &str) {
    for salt in salts {
        let again = job(shared, HOST, salt);
        let status = code(&again);
        assert!(
            status == 3 || status == 10,
            "{what}: {salt}: exit {status}: {}",
            text(&again.stderr)
        );
    }
    for salt in salts {
        let again = job(shared, HOST, salt);
        assert_eq!(
            code(&again),
            3,
            "{what}, rebuilt: {salt}: {}",
            text(&again.stderr)
        );
    }
    assert_once(shared);
}

/// R1, F6 (found by an adversarial test): stored runs deleted, moved to another key, put back
/// as an older version, or their table dropped, are damage; a committed occurrence never looks
/// new.
#[test]
fn r1_snapshot_runs_deleted_moved_or_rolled_back_in_the_snapshot_never_run_again() {
    let shared = Shared::sqlite();
    // An occurrence that failed first: its older stored state says "failed".
    let failing = [
        "run", "--agent", "cron", "--intent", "backup", "--salt", "flaky", "--", "false",
    ];
    assert_eq!(code(&shared.run(HOST, &failing)), 1);
    let mine = my_snapshot(&shared);
    let read = |sql: &str| -> Vec<(i64, Vec<u8>)> {
        let connection = rusqlite::Connection::open(&mine).unwrap();
        let mut statement = connection.prepare(sql).unwrap();
        let rows = statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap();
        rows.map(Result::unwrap).collect()
    };
    let before = read("SELECT id, value FROM buckets");
    let mut salts = committed(&shared, 4);
    // The failed occurrence now commits.
    let fixed = job(&shared, HOST, "flaky");
    assert_eq!(code(&fixed), 0, "{}", text(&fixed.stderr));
    salts.push("flaky".to_owned());
    let edits: Vec<(&str, String)> = vec![
        ("every bucket deleted", "DELETE FROM buckets".to_owned()),
        ("buckets moved", "UPDATE buckets SET id = id + 100000".to_owned()),
        ("the table dropped", "DROP TABLE buckets".to_owned()),
        ("the checksums deleted", "DELETE FROM sums".to_owned()),
        (
            "buckets and checksums deleted together",
            "DELETE FROM sums; DELETE FROM buckets".to_owned(),
        ),
        (
            "a bucket put back as it was before its run committed",
            before
                .iter()
                .map(|(id, value)| {
                    let hex: String = value.iter().map(|byte| format!("{byte:02X}")).collect();
                    format!("INSERT OR REPLACE INTO buckets (id, value) VALUES ({id}, X'{hex}');")
                })
                .collect(),
        ),
    ];
    for (what, sql) in &edits {
        // Fresh and up to date first.
        let fresh = job(&shared, HOST, &format!("before-{what}"));
        assert_eq!(code(&fresh), 0, "{what}: {}", text(&fresh.stderr));
        let mine = my_snapshot(&shared);
        rusqlite::Connection::open(&mine)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
        assert_nothing_runs_again(&shared, &salts, what);
    }
}

/// R1, F6 (found by an adversarial test): the snapshot's file restored from another time without
/// its write-ahead log, and bytes of the file changed at random, never make a committed
/// occurrence run again.
#[test]
fn r1_snapshot_a_file_restored_alone_or_with_random_bytes_changed_never_runs_again() {
    let shared = Shared::sqlite();
    let mut salts = committed(&shared, 6);
    let mine = my_snapshot(&shared);
    let checkpoint = |path: &PathBuf| {
        let connection = rusqlite::Connection::open(path).unwrap();
        connection
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    };
    checkpoint(&mine);
    let aside = shared.path("aside.sqlite");
    std::fs::copy(&mine, &aside).unwrap();
    salts.extend(committed_more(&shared, "later", 12));
    // The main file of earlier, under the log and index of now.
    std::fs::copy(&aside, &mine).unwrap();
    assert_nothing_runs_again(&shared, &salts, "main file restored alone");

    // Random bytes changed in the (checkpointed) file, many times.
    let mut seed = 0x5eed_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for trial in 0..25 {
        if !snapshots(&shared)
            .iter()
            .any(|path| path.to_string_lossy().contains(HOST))
        {
            // The last run found the damage and removed the snapshot: the next one rebuilds it.
            assert_eq!(code(&job(&shared, HOST, &salts[0])), 3);
        }
        let mine = my_snapshot(&shared);
        checkpoint(&mine);
        let mut bytes = std::fs::read(&mine).unwrap();
        for _ in 0..(1 + next() % 3) {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] ^= 1 << (next() % 8);
        }
        std::fs::write(&mine, &bytes).unwrap();
        for salt in &salts {
            let again = job(&shared, HOST, salt);
            let status = code(&again);
            assert!(
                status == 3 || status == 10,
                "trial {trial}: {salt}: exit {status}: {}",
                text(&again.stderr)
            );
        }
    }
    assert_once(&shared);
}

/// Commits `count` more occurrences named `prefix-N`.
fn committed_more(shared: &Shared, prefix: &str, count: usize) -> Vec<String> {
    let salts: Vec<String> = (0..count).map(|index| format!("{prefix}-{index}")).collect();
    for salt in &salts {
        let output = job(shared, HOST, salt);
        assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    }
    salts
}

/// R1 (found by an adversarial test: a run whose snapshot another process of the host held,
/// stopped while making it from a checkpoint, stalled for 30 s without a word): a run that
/// waits for the snapshot's lock says so, then goes on once it is free, with the right answer.
#[test]
fn r1_snapshot_a_run_waiting_for_another_process_of_the_host_says_so() {
    let shared = Shared::sqlite();
    assert_eq!(code(&job(&shared, HOST, "day-1")), 0);
    let snapshots = shared.path("data").join("fencepost").join("snapshots");
    let lock_path = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(".sqlite.lock"))
        .expect("the snapshot's lock file");
    let lock = std::fs::OpenOptions::new().write(true).open(&lock_path).unwrap();
    lock.lock().unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(2_500));
        drop(lock);
    });
    let output = job(&shared, HOST, "day-1");
    holder.join().unwrap();
    assert_eq!(code(&output), 3, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("holds the snapshot"),
        "{}",
        text(&output.stderr)
    );
}
