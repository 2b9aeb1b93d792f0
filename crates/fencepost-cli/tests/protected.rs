//! A protected ledger through the built binary (issue 39, rules S1, S2, M1): `ledger init`,
//! `device join`, `device admit`, runs on it, and what a writer of the ledger folder can and
//! cannot do to it. Each host has a data directory of its own, as real hosts do.

mod common;

use std::process::Output;

use common::{sealed_line, secrets_found, text, Shared};
use fencepost::relay::device_file_name;

/// `fencepost ARGS` as host `device`, with its own data directory.
fn host(shared: &Shared, device: &str, args: &[&str]) -> Output {
    shared.host(device, args)
}

/// A run of occurrence `salt` of the daily send, appending `device` to `effects`.
fn send(shared: &Shared, device: &str, salt: &str) -> Output {
    send_with(shared, device, salt, &[])
}

/// [`send`], with `global` options before the command (`--ledger …`).
fn send_with(shared: &Shared, device: &str, salt: &str, global: &[&str]) -> Output {
    let effect = format!("echo {device} >> '{}'", shared.path("effects").display());
    let mut args = global.to_vec();
    args.extend_from_slice(&[
        "run",
        "--agent",
        "milo-the-agent",
        "--intent",
        "send",
        "--salt",
        salt,
        "--",
        "sh",
        "-c",
        &effect,
    ]);
    host(shared, device, &args)
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// What a protected ledger's stores must not hold in any form (text, hex, base64: secrets long
/// enough that a random match in ciphertext is out of the question): the agent, the salts, the
/// statuses, the run ids.
fn long_secrets() -> Vec<String> {
    let mut secrets: Vec<String> = ["milo-the-agent", "monday", "tuesday", "committed", "pending"]
        .map(str::to_owned)
        .to_vec();
    for salt in ["monday", "tuesday"] {
        let run = fencepost::run_id::deterministic_run_id("milo-the-agent", "send", salt).unwrap();
        secrets.push(run.trim_start_matches("run-").to_owned());
    }
    secrets
}

/// Founds the ledger on `laptop` and admits `phone` (which joins first): returns the
/// fingerprint.
fn founded_with_phone(shared: &Shared) -> String {
    let init = host(shared, "laptop", &["ledger", "init"]);
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    let key = host(shared, "phone", &["device", "key"]);
    let key = text(&key.stdout).trim().to_owned();
    let join = host(shared, "phone", &["device", "join", &fingerprint]);
    assert_eq!(code(&join), 0, "{}", text(&join.stderr));
    let admit = host(shared, "laptop", &["device", "admit", &key, "--device", "phone"]);
    assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
    fingerprint
}

/// A protected ledger of the laptop and the phone in which the laptop ran Monday's occurrence:
/// the laptop's file, its text, and the body of its last line (the commit, under its head).
fn laptop_committed_monday(shared: &Shared) -> (std::path::PathBuf, String, String) {
    founded_with_phone(shared);
    assert_eq!(code(&send(shared, "laptop", "monday")), 0);
    let file = shared.device_file("laptop");
    let original = std::fs::read_to_string(&file).unwrap();
    let body = sealed_line(original.lines().last().unwrap()).body;
    (file, original, body)
}

/// S1, S2, M1: `ledger init` makes the ledger protected and prints its fingerprint (the
/// recovery key goes to a file of mode 0600, never to the output); a device that joined but is
/// not admitted yet reads nothing and runs nothing (exit 7: it waits); once admitted, each
/// host runs an occurrence once whoever ran it; the folder holds no agent id, intent or salt;
/// `status` and `ledger verify` say it is protected, with its fingerprint; `ledger fingerprint`
/// prints it on every member.
#[test]
fn s2_m1_init_join_admit_and_runs_once_across_members_through_the_binary() {
    let shared = Shared::sqlite();
    let init = host(&shared, "laptop", &["ledger", "init"]);
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    assert_eq!(
        fingerprint.len(),
        49,
        "40 hex digits in groups of 4: {fingerprint}"
    );
    let keys = shared.path("data-laptop").join("fencepost").join("keys");
    let recovery: Vec<_> = std::fs::read_dir(&keys)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().contains("recovery-"))
        .collect();
    assert_eq!(recovery.len(), 1, "{recovery:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&recovery[0]).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let secret = std::fs::read_to_string(&recovery[0]).unwrap();
    assert!(!text(&init.stdout).contains(secret.lines().last().unwrap()));

    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    let key = text(&host(&shared, "phone", &["device", "key"]).stdout)
        .trim()
        .to_owned();
    let join = host(&shared, "phone", &["device", "join", &fingerprint]);
    assert_eq!(code(&join), 0, "{}", text(&join.stderr));
    let early = send(&shared, "phone", "monday");
    assert_eq!(
        code(&early),
        7,
        "S2: not admitted yet, it waits: {}",
        text(&early.stderr)
    );
    assert!(
        text(&early.stderr).contains("device admit"),
        "{}",
        text(&early.stderr)
    );
    let admit = host(&shared, "laptop", &["device", "admit", &key, "--device", "phone"]);
    assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
    assert_eq!(
        code(&send(&shared, "phone", "monday")),
        3,
        "M1: the commit is read"
    );
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    assert_eq!(
        code(&send(&shared, "laptop", "tuesday")),
        3,
        "M1: the phone's commit counts"
    );
    assert_eq!(shared.effects(), vec!["laptop", "phone"]);

    for device in ["laptop", "phone"] {
        let file = std::fs::read_to_string(shared.device_file(device)).unwrap();
        for secret in ["milo", "send", "monday", "tuesday", "committed", "pending"] {
            assert!(
                !file.contains(secret),
                "S1: {secret:?} in {device}'s file: {file}"
            );
        }
        let found = secrets_found(file.as_bytes(), &long_secrets());
        assert!(found.is_empty(), "S1: {device}'s file names {found:?}: {file}");
        let printed = host(&shared, device, &["ledger", "fingerprint"]);
        assert_eq!(text(&printed.stdout).trim(), fingerprint);
    }
    let status = host(&shared, "phone", &["status"]);
    assert!(
        text(&status.stdout).contains(&format!("fingerprint {fingerprint}")),
        "{}",
        text(&status.stdout)
    );
    let verify = host(&shared, "phone", &["ledger", "verify", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(
        (report["protected"].as_bool(), report["intact"].as_bool()),
        (Some(true), Some(true)),
        "{report}"
    );
}

/// S2 (issue 39, item 6): what a writer of the folder can do. A `committed` line in the clear
/// appended to a member's file is damage (exit 10, nothing runs, never a commit); a log under
/// a non-member id, sealed and signed with its own key, counts for nothing and stops nothing
/// (the occurrence it claims committed runs, once; `ledger verify` names it as not counted); a
/// host whose membership file was deleted does not read the ledger as unprotected (exit 10);
/// `ledger init` on a ledger with records is refused; `device join` with another fingerprint
/// finds nothing.
#[test]
fn s2_forged_lines_foreign_logs_and_a_deleted_membership_never_run_twice_or_hide_a_commit() {
    use fencepost::clock::ManualClock;
    use fencepost::id::DeviceId;
    use fencepost::identity::DeviceKey;
    use fencepost::oplog::{DeviceLog, OpRecord, SealedContent, Surface};
    use fencepost::protected::Origin;

    let shared = Shared::sqlite();
    let fingerprint = founded_with_phone(&shared);
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);

    // A non-member's log, sealed and signed by its own key for this ledger, claiming Tuesday
    // committed.
    let ledger = ledger_id(&shared);
    let thief = DeviceKey::from_secrets(DeviceId::new("host-7").unwrap(), [7; 32], [8; 32]);
    let first = OpRecord::sealed(
        "host-7".into(),
        0,
        None,
        SealedContent::Clear(Origin::Identity(thief.public()).to_bytes().into()),
    );
    let origin = first.op_id;
    let clock = ManualClock::new(1_764_400_000_000);
    let mut log = DeviceLog::new("host-7", clock.wall_clock()).unwrap();
    log.append(Surface::log("origin"), serde_json::json!(0));
    let run = fencepost::run_id::deterministic_run_id("milo-the-agent", "send", "tuesday").unwrap();
    let mut claim = log.append(
        Surface::Intent,
        serde_json::json!({"agent_id": "milo-the-agent", "epoch": 1, "id": run, "status": "committed"}),
    );
    claim.prev = Some(origin);
    let key = fencepost::seal::LedgerKey::new(std::num::NonZeroU32::MIN, [9; 32]);
    let claim = claim.seal(&key, ledger).unwrap().signed(&thief, &ledger, &origin);
    let mut lines = Vec::new();
    first.write_json_line(&mut lines);
    claim.write_json_line(&mut lines);
    std::fs::write(shared.device_file("host-7"), &lines).unwrap();
    assert_eq!(
        code(&send(&shared, "phone", "tuesday")),
        0,
        "S2: a non-member's log hides nothing"
    );
    assert_eq!(code(&send(&shared, "laptop", "tuesday")), 3);
    let verify = host(&shared, "laptop", &["ledger", "verify"]);
    assert_eq!(
        code(&verify),
        0,
        "S2: a non-member's log does not stop the ledger: {}",
        text(&verify.stdout)
    );
    assert!(
        text(&verify.stdout).contains("host-7"),
        "{}",
        text(&verify.stdout)
    );

    // A committed line in the clear appended to the laptop's file.
    let mut forger = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
    let forged = forger.append(
        Surface::Intent,
        serde_json::json!({"agent_id": "milo-the-agent", "epoch": 1, "id": "run-wednesday", "status": "committed"}),
    );
    let clean = std::fs::read(shared.device_file("laptop")).unwrap();
    let mut changed = clean.clone();
    forged.write_json_line(&mut changed);
    std::fs::write(shared.device_file("laptop"), &changed).unwrap();
    for device in ["laptop", "phone"] {
        let run = send(&shared, device, "wednesday");
        assert_eq!(code(&run), 10, "S2: {device}: {}", text(&run.stderr));
    }
    std::fs::write(shared.device_file("laptop"), &clean).unwrap();

    // The phone forgets it is a member: the ledger is not read as unprotected.
    let membership: Vec<_> = std::fs::read_dir(shared.path("data-phone").join("fencepost").join("ledgers"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(membership.len(), 1);
    std::fs::remove_file(&membership[0]).unwrap();
    let downgraded = send(&shared, "phone", "wednesday");
    assert_eq!(code(&downgraded), 10, "S1: {}", text(&downgraded.stderr));
    // Found by an adversary: `status` said the ledger was not protected.
    let status = host(&shared, "phone", &["status"]);
    assert!(
        text(&status.stdout).contains("this host is no member"),
        "S1: {}",
        text(&status.stdout)
    );
    // Nor does accepting the damage let it write in the clear into the protected ledger (found
    // by an adversarial test: it ran the occurrence again and wrote format-2 records).
    let phone_file = std::fs::read(shared.device_file("phone")).unwrap();
    let effect = format!("echo phone >> '{}'", shared.path("effects").display());
    let accepting = host(
        &shared,
        "phone",
        &[
            "run",
            "--agent",
            "milo-the-agent",
            "--intent",
            "send",
            "--salt",
            "monday",
            "--accept-damaged",
            "laptop",
            "--accept-damaged",
            "phone",
            "--",
            "sh",
            "-c",
            &effect,
        ],
    );
    assert_ne!(code(&accepting), 0, "S1: {}", text(&accepting.stderr));
    assert_eq!(
        std::fs::read(shared.device_file("phone")).unwrap(),
        phone_file,
        "S1: nothing written"
    );
    assert_eq!(
        shared.effects(),
        vec!["laptop", "phone"],
        "nothing ran twice, nothing forged ran"
    );

    let again = host(&shared, "laptop", &["ledger", "init"]);
    assert_ne!(code(&again), 0, "{}", text(&again.stderr));
    let mut another = fingerprint.clone();
    let first_digit = if another.starts_with('0') { "1" } else { "0" };
    another.replace_range(0..1, first_digit);
    let other = host(&shared, "tablet", &["device", "join", &another]);
    assert_ne!(code(&other), 0, "{}", text(&other.stderr));
}

/// The ledger's id, from the founder's membership file (its genesis).
fn ledger_id(shared: &Shared) -> fencepost::identity::LedgerId {
    use base64::Engine;
    let folder = shared.path("data-laptop").join("fencepost").join("ledgers");
    let path = std::fs::read_dir(folder).unwrap().next().unwrap().unwrap().path();
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("genesis "))
        .unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(line)
        .unwrap();
    fencepost::genesis::Genesis::from_bytes(&bytes)
        .unwrap()
        .ledger_id()
}

/// S2, M1: a protected ledger in a SQLite file (the relay every host of one machine shares):
/// init, join, admit and runs, once each; the file holds no agent id, intent or salt.
#[test]
fn s2_m1_a_protected_sqlite_ledger_runs_each_occurrence_once() {
    let shared = Shared::sqlite_ledger();
    founded_with_phone(&shared);
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    assert_eq!(code(&send(&shared, "phone", "monday")), 3);
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    assert_eq!(code(&send(&shared, "laptop", "tuesday")), 3);
    assert_eq!(shared.effects(), vec!["laptop", "phone"]);
    for file in ["ledger.db", "ledger.db-wal"] {
        let bytes = std::fs::read(shared.path(file)).unwrap_or_default();
        let found = secrets_found(&bytes, &long_secrets());
        assert!(found.is_empty(), "S1: {file} names {found:?}");
    }
}

/// S1, R1: four processes of one newly admitted device id run four jobs at once, racing to
/// write its log's record 0 under the relay's claim: each runs once, the log begins once, and
/// every member reads every commit.
#[test]
fn s1_r1_processes_sharing_a_device_id_begin_its_protected_log_once_and_each_run_once() {
    let shared = Shared::sqlite();
    founded_with_phone(&shared);
    let children: Vec<_> = (0..4)
        .map(|n| {
            let effect = format!("echo phone-{n} >> '{}'", shared.path("effects").display());
            let agent = format!("agent-{n}");
            shared
                .command(
                    "phone",
                    &[
                        "run", "--agent", &agent, "--intent", "send", "--salt", "monday", "--", "sh", "-c",
                        &effect,
                    ],
                )
                .env("XDG_DATA_HOME", shared.path("data-phone"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    }
    let mut effects = shared.effects();
    effects.sort();
    assert_eq!(effects, vec!["phone-0", "phone-1", "phone-2", "phone-3"]);
    for n in 0..4 {
        let agent = format!("agent-{n}");
        let again = host(
            &shared,
            "laptop",
            &[
                "run", "--agent", &agent, "--intent", "send", "--salt", "monday", "--", "true",
            ],
        );
        assert_eq!(code(&again), 3, "{}", text(&again.stderr));
    }
    let log = std::fs::read_to_string(shared.device_file("phone")).unwrap();
    let firsts = log
        .lines()
        .filter(|line| line.starts_with("4 \"phone\" 0 "))
        .count();
    assert_eq!(firsts, 1, "one record 0: {log}");
    let verify = host(&shared, "laptop", &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify.stdout));
}

/// S4: `ledger import` copies an unprotected ledger with commits into a new protected one: no
/// occurrence the old ledger committed runs again on any member, the new folder names none of
/// them; the import is refused onto the old ledger's coordinator and from a damaged ledger
/// (nothing copied), and made once (run again, it copies nothing).
#[test]
fn s4_ledger_import_carries_the_commits_into_a_protected_ledger_through_the_binary() {
    let shared = Shared::sqlite();
    // The old ledger: the default folder and coordinator of `shared`.
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    let new = shared.path("protected");
    std::fs::create_dir(&new).unwrap();
    let new_coordinator = format!("sqlite:{}", shared.path("new-leases.db").display());
    let on_new_ledger = [
        "--ledger",
        new.to_str().unwrap(),
        "--coordinator",
        &new_coordinator,
    ];
    let on_new = |device: &str, coordinator: &str, args: &[&str]| {
        let mut all = vec!["--ledger", new.to_str().unwrap(), "--coordinator", coordinator];
        all.extend_from_slice(args);
        host(&shared, device, &all)
    };
    let init = on_new("laptop", &new_coordinator, &["ledger", "init"]);
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    let old = shared.path("ledger");
    let old = old.to_str().unwrap();

    let from_old = [
        "ledger",
        "import",
        old,
        "--source-coordinator",
        &shared.coordinator,
    ];
    let unnamed = on_new("laptop", &new_coordinator, &["ledger", "import", old]);
    assert_eq!(
        code(&unnamed),
        2,
        "the old coordinator is named: {}",
        text(&unnamed.stderr)
    );
    let onto_old = on_new("laptop", &shared.coordinator, &from_old);
    assert_ne!(code(&onto_old), 0);
    assert!(
        text(&onto_old.stderr).contains("coordinator of its own"),
        "S4: the old ledger's coordinator is refused: {}",
        text(&onto_old.stderr)
    );
    let protected_file = new.join("devices").join(device_file_name("laptop"));
    let before = std::fs::read_to_string(&protected_file).unwrap();

    // A copy of the old folder that lacks the phone's records, which its coordinator
    // published, is not imported (found by an adversary: the phone's commit ran again).
    let phone_file = shared.device_file("phone");
    let whole = std::fs::read(&phone_file).unwrap();
    std::fs::remove_file(&phone_file).unwrap();
    let lagging = on_new("laptop", &new_coordinator, &from_old);
    assert_eq!(code(&lagging), 10, "S4: {}", text(&lagging.stderr));
    assert!(
        text(&lagging.stderr).contains("lacks records"),
        "{}",
        text(&lagging.stderr)
    );
    std::fs::write(&phone_file, &whole).unwrap();

    // A damaged ledger is not imported.
    std::fs::write(&phone_file, &whole[..whole.len() - 20]).unwrap();
    let damaged = on_new("laptop", &new_coordinator, &from_old);
    assert_eq!(
        code(&damaged),
        10,
        "S4: a damaged ledger is refused: {}",
        text(&damaged.stderr)
    );
    let said = text(&damaged.stderr);
    assert!(
        said.contains("phone")
            && (said.contains("not importing anything") || said.contains("nothing was imported")),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&protected_file).unwrap(),
        before,
        "nothing copied"
    );
    std::fs::write(&phone_file, &whole).unwrap();

    // A misspelt old coordinator is no empty coordinator (found by an adversary), nor is a fresh one.
    let misspelt = format!("sqlite:{}", shared.path("leases-typo.db").display());
    let typo = on_new(
        "laptop",
        &new_coordinator,
        &["ledger", "import", old, "--source-coordinator", &misspelt],
    );
    assert_eq!(code(&typo), 2, "{}", text(&typo.stderr));
    assert!(!shared.path("leases-typo.db").exists());
    let fresh = format!("sqlite:{}", shared.path("fresh.db").display());
    let made = host(&shared, "laptop", &["--coordinator", &fresh, "lease", "list"]);
    assert_eq!(code(&made), 0, "{}", text(&made.stderr));
    let unknown = on_new(
        "laptop",
        &new_coordinator,
        &["ledger", "import", old, "--source-coordinator", &fresh],
    );
    assert_eq!(code(&unknown), 10, "{}", text(&unknown.stderr));
    assert!(
        text(&unknown.stderr).contains("does not know agent"),
        "{}",
        text(&unknown.stderr)
    );
    // The phone joins the new ledger before the import.
    let key = text(&on_new("phone", &new_coordinator, &["device", "key"]).stdout)
        .trim()
        .to_owned();
    let join = on_new("phone", &new_coordinator, &["device", "join", &fingerprint]);
    assert_eq!(code(&join), 0, "{}", text(&join.stderr));
    let admit = on_new(
        "laptop",
        &new_coordinator,
        &["device", "admit", &key, "--device", "phone"],
    );
    assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
    let admitted = std::fs::read(&protected_file).unwrap();

    let import = on_new("laptop", &new_coordinator, &from_old);
    assert_eq!(code(&import), 0, "{}", text(&import.stderr));
    assert!(
        text(&import.stdout).contains("imported 4 records"),
        "{}",
        text(&import.stdout)
    );
    let again = on_new("laptop", &new_coordinator, &from_old);
    assert_eq!(code(&again), 0, "{}", text(&again.stderr));
    assert!(text(&again.stdout).contains("already"), "{}", text(&again.stdout));
    let copied = std::fs::read(&protected_file).unwrap();
    let copied_text = String::from_utf8_lossy(&copied);
    for secret in ["milo", "send", "monday", "tuesday", "committed", "pending"] {
        assert!(
            !copied_text.contains(secret),
            "S4: {secret:?} in the protected file"
        );
    }

    // Neither host runs an imported occurrence again.
    // The phone's copy of the folder lags: the laptop's file as it was before the import. The
    // hand-off published by the import makes it wait, never run.
    std::fs::write(&protected_file, &admitted).unwrap();
    let lagging = send_with(&shared, "phone", "monday", &on_new_ledger);
    assert_eq!(
        code(&lagging),
        7,
        "S4: H3 over the import: {}",
        text(&lagging.stderr)
    );
    std::fs::write(&protected_file, &copied).unwrap();
    for (device, salt) in [("phone", "monday"), ("laptop", "tuesday"), ("phone", "tuesday")] {
        let run = send_with(&shared, device, salt, &on_new_ledger);
        assert_eq!(
            code(&run),
            3,
            "S4: {salt} committed before the import: {}",
            text(&run.stderr)
        );
    }
    assert_eq!(shared.effects(), vec!["laptop", "phone"]);
}

/// S2: a host told which protected ledger its ledger is (`--protected FINGERPRINT`,
/// `FENCEPOST_PROTECTED` or `protected` in the config file) reads and writes nothing until it
/// has joined that ledger: an empty folder served in the ledger's place (no roster to delete,
/// nothing sealed to see) runs nothing and gets no record; it joins no other ledger, and
/// `ledger init` is refused while a fingerprint is named.
#[test]
fn s2_a_host_that_names_its_protected_ledger_runs_nothing_before_joining_it() {
    let shared = Shared::sqlite();
    let fingerprint = founded_with_phone(&shared);
    let decoy = shared.path("decoy");
    std::fs::create_dir_all(decoy.join("devices")).unwrap();
    let decoy = decoy.to_str().unwrap();
    let named = ["--protected", fingerprint.as_str()];

    // The server has not joined; the relay hands it an empty ledger.
    let mut on_decoy = vec!["--ledger", decoy];
    on_decoy.extend_from_slice(&named);
    let early = send_with(&shared, "server", "monday", &on_decoy);
    assert_eq!(code(&early), 10, "{}", text(&early.stderr));
    assert!(
        text(&early.stderr).contains("device join"),
        "{}",
        text(&early.stderr)
    );
    assert!(shared.effects().is_empty(), "S2: nothing ran");
    assert_eq!(
        std::fs::read_dir(shared.path("decoy").join("devices"))
            .unwrap()
            .count(),
        0
    );

    // `ledger verify` touches nothing either (found by an adversary: it made devices/), and an
    // empty FENCEPOST_PROTECTED is an error, not the unprotected default.
    let bare = shared.path("bare");
    std::fs::create_dir(&bare).unwrap();
    let mut verify = vec!["--ledger", bare.to_str().unwrap()];
    verify.extend_from_slice(&named);
    verify.extend_from_slice(&["ledger", "verify"]);
    assert_eq!(code(&host(&shared, "server", &verify)), 10);
    assert_eq!(std::fs::read_dir(&bare).unwrap().count(), 0, "nothing written");
    let empty = shared
        .command("server", &["--ledger", decoy, "ledger", "show"])
        .env("XDG_DATA_HOME", shared.path("data-server"))
        .env("FENCEPOST_PROTECTED", "")
        .output()
        .unwrap();
    assert_eq!(code(&empty), 2, "{}", text(&empty.stderr));

    // Not named, on the real ledger: its sealed records are no damage a copy repairs.
    let stranger = send(&shared, "server", "monday");
    assert_eq!(code(&stranger), 10, "{}", text(&stranger.stderr));
    assert!(
        text(&stranger.stderr).contains("device join")
            && !text(&stranger.stderr).contains("--accept-damaged"),
        "the advice is to join: {}",
        text(&stranger.stderr)
    );

    let other = "0000-0000-0000-0000-0000-0000-0000-0000-0000-0000";
    let mut join = named.to_vec();
    join.extend_from_slice(&["device", "join", other]);
    assert_eq!(
        code(&host(&shared, "server", &join)),
        2,
        "it joins no other ledger"
    );
    let mut init = named.to_vec();
    init.extend_from_slice(&["ledger", "init"]);
    assert_eq!(code(&host(&shared, "server", &init)), 2, "nor makes one");

    // Named in the config file: the phone, a member, runs; a bad fingerprint there is a clear
    // error; the laptop, named another ledger, reads nothing.
    let config = shared.path("config").join("fencepost");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        format!("protected = \"{fingerprint}\"\n"),
    )
    .unwrap();
    assert_eq!(code(&send(&shared, "phone", "monday")), 0);
    let wrong = send_with(&shared, "laptop", "tuesday", &["--protected", other]);
    assert_eq!(code(&wrong), 10, "{}", text(&wrong.stderr));
    assert!(text(&wrong.stderr).contains(other), "{}", text(&wrong.stderr));
    std::fs::write(config.join("config.toml"), "protected = \"not a fingerprint\"\n").unwrap();
    let bad = send(&shared, "phone", "tuesday");
    assert_ne!(code(&bad), 0);
    assert!(text(&bad.stderr).contains("protected"), "{}", text(&bad.stderr));
    assert_eq!(shared.effects(), vec!["phone"]);
}

/// S2, found by an adversary: one character of the laptop's last record (its ciphertext)
/// changed in the folder. Its head no longer verifies: `ledger verify` says so (damaged, exit
/// 1, where it said intact), the phone waits for the record the laptop published (exit 7),
/// the laptop signs nothing over it (its next run is refused, where it once chained new
/// records onto the altered one, so that restoring the line damaged the ledger for good), and
/// once the line is restored the occurrence is found committed everywhere.
#[test]
fn s2_an_altered_record_is_damage_never_signed_over_and_a_restored_line_heals() {
    let shared = Shared::sqlite();
    let (file, original, sealed) = laptop_committed_monday(&shared);
    let middle = sealed.len() / 2;
    let flipped = if &sealed[middle..=middle] == "A" { "B" } else { "A" };
    let altered_field = format!("{}{flipped}{}", &sealed[..middle], &sealed[middle + 1..]);
    let altered = original.replace(&sealed, &altered_field);
    assert_ne!(altered, original);
    std::fs::write(&file, &altered).unwrap();

    let verify = host(&shared, "phone", &["ledger", "verify"]);
    assert_eq!(code(&verify), 1, "S2: {}", text(&verify.stdout));
    assert!(
        text(&verify.stdout).contains("damaged: device \"laptop\""),
        "{}",
        text(&verify.stdout)
    );
    assert_eq!(
        code(&send(&shared, "phone", "monday")),
        7,
        "S2: the phone waits for the record the laptop published"
    );
    let refused = send(&shared, "laptop", "tuesday");
    assert_ne!(code(&refused), 0, "S2: the laptop signs nothing over it");
    // Its seen file finds the record changed (damage); a host without one is refused by the
    // signing check (`s2_a_device_never_signs_a_record_it_did_not_write_into_its_log`).
    let said = text(&refused.stderr);
    assert!(
        said.contains("carries no head this device signed") || said.contains("is damaged"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        altered,
        "nothing written"
    );

    std::fs::write(&file, &original).unwrap();
    assert_eq!(code(&send(&shared, "phone", "monday")), 3);
    assert_eq!(code(&send(&shared, "laptop", "tuesday")), 0);
    assert_eq!(shared.effects(), vec!["laptop", "laptop"]);
}

/// S2, found by an adversary: `ledger runs` and `ledger show` on a host that cannot count some
/// records yet (here the laptop's commit, whose head was taken off its line: covered by no
/// head) said nothing and exited 0, listing the committed run as in doubt. They now name what
/// they lack and exit 7, as a run that needs those records waits; with the line as written,
/// they list the run committed and exit 0.
#[test]
fn s2_listings_name_the_records_a_host_cannot_count_yet_and_exit_7() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let shared = Shared::sqlite();
    let (file, original, body) = laptop_committed_monday(&shared);
    let mut bytes = URL_SAFE_NO_PAD.decode(&body).unwrap();
    assert_eq!(bytes[0] & 2, 2, "the last record carries a head");
    bytes[0] &= !2;
    bytes.truncate(bytes.len() - 64);
    let headless = original.replace(&body, &URL_SAFE_NO_PAD.encode(&bytes));
    std::fs::write(&file, &headless).unwrap();

    for listing in [&["ledger", "runs"][..], &["ledger", "show"]] {
        let listed = host(&shared, "phone", listing);
        let said = text(&listed.stderr);
        assert_eq!(code(&listed), 7, "S2: {listing:?}: {said}");
        assert!(
            said.contains("not counted yet: device \"laptop\"") && said.contains("no head"),
            "S2: {said}"
        );
    }
    std::fs::write(&file, &original).unwrap();
    let runs = host(&shared, "phone", &["ledger", "runs"]);
    assert_eq!(code(&runs), 0, "{}", text(&runs.stderr));
    assert!(text(&runs.stdout).contains("committed"), "{}", text(&runs.stdout));
}
