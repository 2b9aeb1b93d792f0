//! Revoking a member of a protected ledger through the built binary (issue 39, rule M2): `device
//! revoke ID [--from SEQ]`. Each host has a data directory of its own, as real hosts do.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{sealed_line, text, SealedLine, Shared};
use fencepost::relay::device_file_name;

/// `fencepost ARGS` as host `device`, with its own data directory.
fn host(shared: &Shared, device: &str, args: &[&str]) -> Output {
    shared.host(device, args)
}

const AGENT: &str = "milo-the-agent";

/// The arguments of a run of occurrence `salt` of the daily send, appending `device` to
/// `effects`, then running `then`.
fn send_args(shared: &Shared, device: &str, salt: &str, then: &str) -> Vec<String> {
    let effect = format!("echo {device} >> '{}'; {then}", shared.path("effects").display());
    [
        "run", "--agent", AGENT, "--intent", "send", "--salt", salt, "--", "sh", "-c", &effect,
    ]
    .map(str::to_owned)
    .to_vec()
}

fn send(shared: &Shared, device: &str, salt: &str) -> Output {
    let args = send_args(shared, device, salt, "true");
    host(
        shared,
        device,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn run_id(salt: &str) -> String {
    fencepost::run_id::deterministic_run_id(AGENT, "send", salt).unwrap()
}

/// Founds the ledger on `laptop` and admits each of `others` (which join first).
fn founded_with(shared: &Shared, others: &[&str]) {
    let init = host(shared, "laptop", &["ledger", "init"]);
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    for other in others {
        let key = text(&host(shared, other, &["device", "key"]).stdout)
            .trim()
            .to_owned();
        let join = host(shared, other, &["device", "join", &fingerprint]);
        assert_eq!(code(&join), 0, "{}", text(&join.stderr));
        let admit = host(shared, "laptop", &["device", "admit", &key, "--device", other]);
        assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
    }
}

/// M2 (issue 39, item 6: a revoked device writing on): the phone is revoked while its command
/// runs. Its outcome, written past the cut, is no commit: the tablet finds the occurrence in
/// doubt (exit 5) and never runs it again, until an operator resolves it. The revoked phone
/// then runs nothing (exit 10, naming the revocation); the laptop's next records are sealed
/// with a new generation of the ledger key, which the tablet reads and the phone cannot.
#[test]
fn m2_a_device_revoked_while_it_runs_writes_no_commit_and_runs_nothing_after() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "tablet"]);
    let go = shared.path("go");
    let args = send_args(
        &shared,
        "phone",
        "monday",
        &format!("while [ ! -e '{}' ]; do sleep 0.05; done", go.display()),
    );
    let running = shared
        .command("phone", &args.iter().map(String::as_str).collect::<Vec<_>>())
        .env("XDG_DATA_HOME", shared.path("data-phone"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while shared.effects().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the phone's command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let revoke = host(&shared, "laptop", &["device", "revoke", "phone"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    assert!(
        text(&revoke.stderr).contains("Generation 2") && text(&revoke.stderr).contains("tablet"),
        "{}",
        text(&revoke.stderr)
    );
    std::fs::write(&go, "").unwrap();
    let phone = running.wait_with_output().unwrap();
    eprintln!(
        "the revoked phone's run: exit {}: {}",
        code(&phone),
        text(&phone.stderr)
    );

    let tablet = send(&shared, "tablet", "monday");
    assert_eq!(
        code(&tablet),
        5,
        "M2: the outcome past the cut is no commit, the run is in doubt: {}",
        text(&tablet.stderr)
    );
    assert_eq!(shared.effects(), vec!["phone"], "M2: it ran once");

    let after = send(&shared, "phone", "tuesday");
    assert_eq!(code(&after), 10, "{}", text(&after.stderr));
    assert!(text(&after.stderr).contains("revoked"), "{}", text(&after.stderr));
    assert_eq!(code(&send(&shared, "laptop", "tuesday")), 0);
    let laptop_file = shared.device_file("laptop");
    let laptop_file = std::fs::read_to_string(laptop_file).unwrap();
    let last = laptop_file.lines().last().unwrap();
    assert_eq!(
        sealed_line(last).generation,
        2,
        "M2: sealed with the new generation: {last}"
    );
    assert_eq!(
        code(&send(&shared, "tablet", "tuesday")),
        3,
        "M2: the tablet holds the new generation"
    );
    assert_eq!(shared.effects(), vec!["phone", "laptop"]);

    let resolve = host(
        &shared,
        "tablet",
        &[
            "ledger",
            "resolve",
            "--agent",
            AGENT,
            "--run",
            &run_id("monday"),
            "--as",
            "committed",
        ],
    );
    assert_eq!(code(&resolve), 0, "{}", text(&resolve.stderr));
    assert_eq!(code(&send(&shared, "tablet", "monday")), 3, "resolved: committed");
    assert_eq!(shared.effects(), vec!["phone", "laptop"]);
}

/// M2: a stolen device revoked from before the theft (`--from`): the commits it wrote from
/// there on are no commits, their runs in doubt (never run again by themselves, exit 5) on
/// every member, the revoker included, whose reading had counted them; `revoke` says how many
/// runs are in doubt. A device revoked before it wrote anything runs nothing (exit 10). Revoking oneself, a device that is no member, or on a host that is no
/// member is a usage error (exit 2).
#[test]
fn m2_a_revocation_from_the_past_puts_the_stolen_devices_commits_in_doubt() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "watch"]);
    assert_eq!(code(&send(&shared, "phone", "monday")), 0);
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    assert_eq!(code(&send(&shared, "laptop", "tuesday")), 3);

    let revoke = host(&shared, "laptop", &["device", "revoke", "phone", "--from", "1"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    assert!(
        text(&revoke.stderr).contains("2 run(s) are in doubt"),
        "{}",
        text(&revoke.stderr)
    );
    for salt in ["monday", "tuesday"] {
        let again = send(&shared, "laptop", salt);
        assert_eq!(code(&again), 5, "M2: {salt}: {}", text(&again.stderr));
        // Found by an adversary: it was said to be a run with no outcome recorded.
        assert!(
            text(&again.stderr).contains("was revoked from record 1 of its log on"),
            "M2: {salt}: {}",
            text(&again.stderr)
        );
    }
    assert_eq!(shared.effects(), vec!["phone", "phone"]);
    // Found by an adversarial test: a device revoked before it wrote anything ran its command.
    let revoke = host(&shared, "laptop", &["device", "revoke", "watch"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    let watch = send(&shared, "watch", "friday");
    assert_eq!(code(&watch), 10, "{}", text(&watch.stderr));
    assert_eq!(shared.effects(), vec!["phone", "phone"], "M2: nothing ran");
    let status = text(&host(&shared, "laptop", &["status"]).stdout);
    assert!(
        status.contains("members:     laptop\n") && status.contains("revoked:     phone (from record 1)"),
        "{status}"
    );

    for (device, args) in [
        ("laptop", vec!["device", "revoke", "laptop"]),
        ("laptop", vec!["device", "revoke", "watch"]),
        ("laptop", vec!["device", "revoke", "phone"]),
        ("stranger", vec!["device", "revoke", "phone"]),
    ] {
        let refused = host(&shared, device, &args);
        assert_eq!(code(&refused), 2, "{args:?}: {}", text(&refused.stderr));
    }
}

/// M3: the only member's data directory is lost. A new host joins, admits itself with the
/// recovery key file `ledger init` wrote (`device admit KEY --device ID --recovery-key-file`),
/// reads every commit (the occurrence the lost host ran is not run again) and runs the next;
/// it revokes the lost device with the recovery key. Another ledger's recovery key, or
/// admitting itself without one, is a usage error (exit 2).
#[test]
fn m3_a_new_host_recovers_a_ledger_whose_only_member_is_lost_with_the_recovery_key() {
    let shared = Shared::sqlite();
    let recovery = shared.path("recovery.key").display().to_string();
    let init = host(
        &shared,
        "laptop",
        &["ledger", "init", "--recovery-key-file", &recovery],
    );
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    std::fs::remove_dir_all(shared.path("data-laptop")).unwrap();

    let key = text(&host(&shared, "spare", &["device", "key"]).stdout)
        .trim()
        .to_owned();
    let join = host(&shared, "spare", &["device", "join", &fingerprint]);
    assert_eq!(code(&join), 0, "{}", text(&join.stderr));
    let alone = host(&shared, "spare", &["device", "admit", &key, "--device", "spare"]);
    assert_eq!(code(&alone), 2, "{}", text(&alone.stderr));
    // The recovery key of another ledger.
    let wrong = shared.path("wrong.key").display().to_string();
    std::fs::create_dir(shared.path("other-ledger")).unwrap();
    let made = shared
        .command("other", &["ledger", "init", "--recovery-key-file", &wrong])
        .env("XDG_DATA_HOME", shared.path("data-other"))
        .env("FENCEPOST_LEDGER", shared.path("other-ledger"))
        .output()
        .unwrap();
    assert_eq!(code(&made), 0, "{}", text(&made.stderr));
    let admit_itself = |recovery: &str| {
        let args = [
            "device",
            "admit",
            &key,
            "--device",
            "spare",
            "--recovery-key-file",
            recovery,
        ];
        host(&shared, "spare", &args)
    };
    let forged = admit_itself(&wrong);
    assert_eq!(code(&forged), 2, "{}", text(&forged.stderr));

    let admit = admit_itself(&recovery);
    assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
    assert_eq!(
        code(&send(&shared, "spare", "monday")),
        3,
        "M3: the commit is read"
    );
    assert_eq!(code(&send(&shared, "spare", "tuesday")), 0);
    let revoke = host(
        &shared,
        "spare",
        &["device", "revoke", "laptop", "--recovery-key-file", &recovery],
    );
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    assert_eq!(code(&send(&shared, "spare", "wednesday")), 0);
    assert_eq!(shared.effects(), vec!["laptop", "spare", "spare"]);
    let status = text(&host(&shared, "spare", &["status"]).stdout);
    assert!(status.contains("members:     spare\n"), "{status}");
}

/// M2, M3 (found by an adversarial test): the laptop revokes the phone, then the recovery key
/// revokes the laptop from before that revocation: the phone is a member again. What it runs
/// counts on every host, whatever order each reads the logs in: the tablet finds its run
/// committed (it had run it a second time), and the laptop, revoked, runs nothing.
#[test]
fn m3_a_recovery_cut_before_a_revocation_never_runs_an_occurrence_twice() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "tablet"]);
    let keys = shared.path("data-laptop").join("fencepost").join("keys");
    let recovery = std::fs::read_dir(&keys)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().contains("recovery-"))
        .unwrap();
    let revoke = host(&shared, "laptop", &["device", "revoke", "phone"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    let recovery = recovery.display().to_string();
    let cut = host(
        &shared,
        "tablet",
        &[
            "device",
            "revoke",
            "laptop",
            "--from",
            "4",
            "--recovery-key-file",
            &recovery,
        ],
    );
    assert_eq!(code(&cut), 0, "{}", text(&cut.stderr));
    assert_eq!(code(&send(&shared, "phone", "monday")), 0);
    let again = send(&shared, "tablet", "monday");
    assert_eq!(code(&again), 3, "M3: {}", text(&again.stderr));
    assert_eq!(code(&send(&shared, "laptop", "monday")), 10);
    assert_eq!(shared.effects(), vec!["phone"], "M3: it ran once");
}

/// The devices named in the clear by the last membership record of `device`'s file (a
/// rotation names each device it wraps the new generation to), and the generation of its last
/// record.
fn last_rotation(shared: &Shared, device: &str) -> (String, serde_json::Value) {
    let file = std::fs::read_to_string(shared.device_file(device)).unwrap();
    let lines: Vec<SealedLine> = file.lines().map(sealed_line).collect();
    let clear = lines
        .iter()
        .rev()
        .find(|line| line.generation == 0 && line.seq != 0)
        .map(|line| line.content.clone())
        .unwrap();
    (
        String::from_utf8_lossy(&clear).into_owned(),
        serde_json::json!(lines.last().unwrap().generation),
    )
}

/// M2 through the binary (found by a cryptography review, confirmed by an adversary): the
/// laptop revokes the phone while the tablet, whose copy of the folder lacks that revocation,
/// revokes the watch; each wraps its new generation to the device the other revoked. The
/// laptop's next run writes a third generation, wrapped to neither, and seals with it; the
/// tablet reads it (the run is committed there, never run again).
#[test]
fn m2_two_revocations_at_once_through_the_binary_end_in_a_generation_neither_holds() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "tablet", "watch"]);
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    let laptop_file = shared.device_file("laptop");
    let lagging = std::fs::read(&laptop_file).unwrap();
    let revoke = host(&shared, "laptop", &["device", "revoke", "phone"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    let revoked = std::fs::read(&laptop_file).unwrap();
    std::fs::write(&laptop_file, &lagging).unwrap();
    let revoke = host(&shared, "tablet", &["device", "revoke", "watch"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    std::fs::write(&laptop_file, &revoked).unwrap();
    let (named, _) = last_rotation(&shared, "laptop");
    assert!(
        named.contains("watch"),
        "the laptop had not read the watch's revocation"
    );

    let run = send(&shared, "laptop", "tuesday");
    assert_eq!(code(&run), 0, "{}", text(&run.stderr));
    let (named, generation) = last_rotation(&shared, "laptop");
    assert_eq!(generation, 3, "M2: sealed with a third generation");
    for gone in ["phone", "watch"] {
        assert!(!named.contains(gone), "M2: the third generation went to {gone}");
    }
    assert!(named.contains("tablet"), "M2: it went to the tablet");
    assert_eq!(
        code(&send(&shared, "tablet", "tuesday")),
        3,
        "M2: the tablet reads it"
    );
    assert_eq!(shared.effects(), vec!["laptop", "laptop"]);
}

/// M4 through the binary (tried by script in an earlier session): the tablet revokes the
/// phone; the phone, whose copy of the folder lacks the revocation, runs Tuesday and commits.
/// The laptop then runs Milo's Wednesday, reading the revocation, and publishes it with its
/// hand-off. The desk, whose copy lacks the tablet's log, neither takes the phone's commit for
/// one (exit 3) nor runs Tuesday: it waits (exit 7, naming the tablet); with the tablet's log,
/// Tuesday is in doubt (exit 5), never run again.
#[test]
fn m4_a_host_lacking_a_revocation_the_last_holder_read_waits_for_it() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "tablet", "desk"]);
    assert_eq!(code(&send(&shared, "phone", "monday")), 0);
    let revoke = host(&shared, "tablet", &["device", "revoke", "phone"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    let tablet_file = shared.device_file("tablet");
    let aside = shared.path("tablet-aside");
    let hide = || std::fs::rename(&tablet_file, &aside).unwrap();
    let bring_back = || std::fs::rename(&aside, &tablet_file).unwrap();

    hide();
    let stolen = send(&shared, "phone", "tuesday");
    assert_eq!(code(&stolen), 0, "{}", text(&stolen.stderr));
    bring_back();
    let laptop = send(&shared, "laptop", "wednesday");
    assert_eq!(code(&laptop), 0, "{}", text(&laptop.stderr));

    hide();
    let waits = send(&shared, "desk", "tuesday");
    assert_eq!(code(&waits), 7, "M4: {}", text(&waits.stderr));
    assert!(
        text(&waits.stderr).contains("tablet"),
        "M4: {}",
        text(&waits.stderr)
    );
    bring_back();
    let doubt = send(&shared, "desk", "tuesday");
    assert_eq!(code(&doubt), 5, "M4, M2: {}", text(&doubt.stderr));
    assert_eq!(
        shared.effects(),
        vec!["phone", "phone", "laptop"],
        "nothing ran twice"
    );
}

/// M4, S6 (found by a cryptography review): a compaction judges checkpoints, and its own, on
/// what its ledger read. A revoked phone whose copy lacks its revocation (the tablet's log, and
/// the laptop's records after it: an older copy of the laptop's file) reads a settled ledger
/// and would compact as a member: write a checkpoint, remove the others' and prune its log.
/// Once a holder published past it (the laptop ran after reading the revocation), `ledger
/// compact` compares the ledger with what the holders published, as `run` does, and waits
/// (exit 7, naming what it lacks): no checkpoint, nothing pruned.
#[test]
fn m4_s6_a_revoked_device_lacking_its_revocation_compacts_nothing_a_holder_published_past() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "tablet"]);
    assert_eq!(code(&send(&shared, "phone", "monday")), 0);
    let devices = shared.path("ledger").join("devices");
    let file = |device: &str| devices.join(device_file_name(device));
    let laptop_before = std::fs::read(file("laptop")).unwrap();
    let revoke = host(&shared, "tablet", &["device", "revoke", "phone"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    let laptop = send(&shared, "laptop", "wednesday");
    assert_eq!(code(&laptop), 0, "{}", text(&laptop.stderr));
    let laptop_after = std::fs::read(file("laptop")).unwrap();
    let phone_bytes = std::fs::read(file("phone")).unwrap();

    // The phone's copy: the laptop's file as it was before the revocation, no tablet log.
    std::fs::write(file("laptop"), &laptop_before).unwrap();
    std::fs::rename(file("tablet"), shared.path("tablet-aside")).unwrap();
    let compact = host(&shared, "phone", &["ledger", "compact", "--prune"]);
    let said = text(&compact.stderr);
    assert_eq!(code(&compact), 7, "M4: {said}");
    assert!(
        said.contains("not compacting") && said.contains("laptop"),
        "M4: names what it lacks: {said}"
    );
    assert_eq!(
        std::fs::read(file("phone")).unwrap(),
        phone_bytes,
        "S6: nothing pruned"
    );
    let checkpoints = shared.path("ledger").join("checkpoints");
    let sealed = std::fs::read_dir(&checkpoints).map_or(0, |entries| {
        let names = entries.flatten().map(|entry| entry.file_name());
        names
            .filter(|name| name.to_string_lossy().ends_with(".sealed"))
            .count()
    });
    assert_eq!(sealed, 0, "S6: no checkpoint written");

    std::fs::write(file("laptop"), &laptop_after).unwrap();
    std::fs::rename(shared.path("tablet-aside"), file("tablet")).unwrap();
    let compact = host(&shared, "phone", &["ledger", "compact", "--prune"]);
    assert_ne!(
        code(&compact),
        0,
        "S6: a revoked device compacts nothing: {}",
        text(&compact.stdout)
    );
    assert_eq!(
        std::fs::read(file("phone")).unwrap(),
        phone_bytes,
        "S6: nothing pruned"
    );
}

/// M2, M4 (found by an adversary through the binary): records of a revoked device past its cut
/// that its holders published and that never come (a thief's, or its file cut short) no longer
/// stop compaction for good: void, they are no membership change that counts, and a compaction
/// does without them. The agent's runs still wait for them (exit 7), as they did.
#[test]
fn m2_m4_published_void_records_that_never_come_do_not_stop_compaction() {
    let shared = Shared::sqlite();
    founded_with(&shared, &["phone", "desk"]);
    assert_eq!(code(&send(&shared, "phone", "monday")), 0);
    let phone_file = shared.device_file("phone");
    let kept = std::fs::read(&phone_file).unwrap();
    let cut = kept.iter().filter(|byte| **byte == b'\n').count().to_string();
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    let revoke = host(&shared, "laptop", &["device", "revoke", "phone", "--from", &cut]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    std::fs::write(&phone_file, &kept).unwrap();

    let compact = host(&shared, "desk", &["ledger", "compact"]);
    assert_eq!(code(&compact), 0, "M4: {}", text(&compact.stderr));
    let waits = send(&shared, "desk", "wednesday");
    assert_eq!(code(&waits), 7, "H3: {}", text(&waits.stderr));
}
