//! Rule S6 through the built binary: `ledger compact --prune` on a protected ledger writes a
//! sealed checkpoint into the shared place; a device admitted after the prune joins (the
//! genesis it needs is in the checkpoint's header), starts from it and runs each occurrence
//! once; a checkpoint altered in the shared place stops nothing and `ledger verify` names it.
//! Each host has a data directory of its own, as real hosts do.

mod common;

use std::process::Output;

use common::{secrets_found, text, Shared};

fn host(shared: &Shared, device: &str, args: &[&str]) -> Output {
    shared.host(device, args)
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// A run of occurrence `salt` of the daily send on `device`, appending `device` and the salt to
/// `effects`.
fn send(shared: &Shared, device: &str, salt: &str) -> Output {
    let effect = format!("echo {device}-{salt} >> '{}'", shared.path("effects").display());
    host(
        shared,
        device,
        &[
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
        ],
    )
}

/// `laptop` makes `shared`'s ledger protected; its fingerprint.
fn init(shared: &Shared) -> String {
    let init = host(shared, "laptop", &["ledger", "init"]);
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    text(&init.stdout).trim().to_owned()
}

/// `device` joins the ledger `fingerprint` and `admitter` admits it.
fn join(shared: &Shared, device: &str, fingerprint: &str, admitter: &str) {
    let key = text(&host(shared, device, &["device", "key"]).stdout)
        .trim()
        .to_owned();
    let joined = host(shared, device, &["device", "join", fingerprint]);
    assert_eq!(code(&joined), 0, "{}", text(&joined.stderr));
    let admit = host(shared, admitter, &["device", "admit", &key, "--device", device]);
    assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
}

/// The shared checkpoints folder of `shared`'s ledger (a folder's, or a SQLite file's).
fn shared_checkpoints(shared: &Shared, sqlite: bool) -> std::path::PathBuf {
    if sqlite {
        shared.path("ledger.db.checkpoints")
    } else {
        shared.path("ledger").join("checkpoints")
    }
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every byte under `path` (a folder's files, recursively, or one file).
fn all_bytes(path: &std::path::Path) -> Vec<u8> {
    if path.is_file() {
        return std::fs::read(path).unwrap();
    }
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(path).into_iter().flatten() {
        bytes.extend(all_bytes(&entry.unwrap().path()));
    }
    bytes
}

/// S6, K1, K5 on `shared`'s ledger (a folder, or a SQLite file when `sqlite`): the founder
/// runs two occurrences and compacts with a prune; the shared place then holds one sealed
/// checkpoint and no agent id, salt or run id in any form; a tablet admitted after the prune
/// joins, starts from the checkpoint and runs only what nobody ran; `ledger verify` says intact.
fn compacted_and_joined_after_the_prune(shared: &Shared, sqlite: bool) {
    let fingerprint = init(shared);
    join(shared, "phone", &fingerprint, "laptop");
    for salt in ["monday", "tuesday"] {
        assert_eq!(code(&send(shared, "laptop", salt)), 0);
    }
    let compact = host(shared, "laptop", &["ledger", "compact", "--prune"]);
    assert_eq!(code(&compact), 0, "{}", text(&compact.stderr));
    assert!(
        text(&compact.stdout).contains("removed"),
        "K5: {}",
        text(&compact.stdout)
    );
    let names = names_in(&shared_checkpoints(shared, sqlite));
    assert_eq!(names.len(), 1, "S6: {names:?}");
    assert!(names[0].ends_with(".sealed"), "S6: only sealed: {names:?}");

    join(shared, "tablet", &fingerprint, "laptop");
    assert_eq!(
        code(&send(shared, "tablet", "tuesday")),
        3,
        "K1: committed before the prune"
    );
    assert_eq!(code(&send(shared, "tablet", "wednesday")), 0);
    assert_eq!(code(&send(shared, "phone", "wednesday")), 3);
    assert_eq!(code(&send(shared, "laptop", "wednesday")), 3);
    assert_eq!(
        shared.effects(),
        vec!["laptop-monday", "laptop-tuesday", "tablet-wednesday"],
        "each occurrence once"
    );
    let verify = host(shared, "tablet", &["ledger", "verify"]);
    assert_eq!(
        code(&verify),
        0,
        "{}{}",
        text(&verify.stdout),
        text(&verify.stderr)
    );

    let ledger = if sqlite {
        shared.path("ledger.db")
    } else {
        shared.path("ledger")
    };
    let mut stored = all_bytes(&ledger);
    stored.extend(all_bytes(&shared_checkpoints(shared, sqlite)));
    let mut secrets: Vec<String> = ["milo-the-agent", "monday", "tuesday", "wednesday", "committed"]
        .map(str::to_owned)
        .to_vec();
    for salt in ["monday", "tuesday", "wednesday"] {
        let run = fencepost::run_id::deterministic_run_id("milo-the-agent", "send", salt).unwrap();
        secrets.push(run.trim_start_matches("run-").to_owned());
    }
    assert_eq!(
        secrets_found(&stored, &secrets),
        vec![],
        "S6: the shared place holds no secret"
    );
}

#[test]
fn s6_k5_a_protected_folder_ledger_compacted_and_pruned_takes_a_member_admitted_after() {
    compacted_and_joined_after_the_prune(&Shared::sqlite(), false);
}

#[test]
fn s6_k5_a_protected_sqlite_ledger_compacted_and_pruned_takes_a_member_admitted_after() {
    compacted_and_joined_after_the_prune(&Shared::sqlite_ledger(), true);
}

/// S6, K3: a sealed checkpoint whose bytes a writer of the folder changed (its name kept) is
/// never used: a host that never opened it reads every record instead and runs nothing twice,
/// and `ledger verify` names it (exit 1); a new compaction writes a good one.
#[test]
fn s6_an_altered_sealed_checkpoint_stops_nothing_and_verify_names_it_through_the_binary() {
    let shared = Shared::sqlite();
    let fingerprint = init(&shared);
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    let compact = host(&shared, "laptop", &["ledger", "compact"]);
    assert_eq!(code(&compact), 0, "{}", text(&compact.stderr));
    let dir = shared_checkpoints(&shared, false);
    let name = names_in(&dir).remove(0);
    let path = dir.join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    join(&shared, "phone", &fingerprint, "laptop");
    assert_eq!(
        code(&send(&shared, "phone", "monday")),
        3,
        "S6: read from the records"
    );
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    assert_eq!(shared.effects(), vec!["laptop-monday", "phone-tuesday"]);
    let verify = host(&shared, "phone", &["ledger", "verify"]);
    let said = format!("{}{}", text(&verify.stdout), text(&verify.stderr));
    assert_eq!(code(&verify), 1, "{said}");
    assert!(
        said.contains(&name) && said.contains("does not open"),
        "S6: {said}"
    );

    std::fs::remove_file(&path).unwrap();
    let compact = host(&shared, "phone", &["ledger", "compact"]);
    assert_eq!(code(&compact), 0, "{}", text(&compact.stderr));
    let verify = host(&shared, "laptop", &["ledger", "verify"]);
    assert_eq!(
        code(&verify),
        0,
        "{}{}",
        text(&verify.stdout),
        text(&verify.stderr)
    );
}

/// S6 (found by an adversarial test: every command of every host hung): a FIFO and a symbolic
/// link to `/dev/zero` named as sealed checkpoints in the shared folder are refused, never read:
/// runs go on, `device join` finds the genesis, and `ledger verify` names both.
#[test]
fn s6_a_fifo_or_a_link_named_as_a_checkpoint_stops_nothing_through_the_binary() {
    let shared = Shared::sqlite();
    let fingerprint = init(&shared);
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    let compact = host(&shared, "laptop", &["ledger", "compact", "--prune"]);
    assert_eq!(code(&compact), 0, "{}", text(&compact.stderr));
    let dir = shared_checkpoints(&shared, false);
    let digest = "a".repeat(64);
    let fifo = dir.join(format!("checkpoint-99-{digest}.sealed"));
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", dir.join(format!("checkpoint-98-{digest}.sealed"))).unwrap();

    assert_eq!(
        code(&send(&shared, "laptop", "tuesday")),
        0,
        "S6: the run goes on"
    );
    join(&shared, "phone", &fingerprint, "laptop");
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 3);
    let verify = host(&shared, "phone", &["ledger", "verify"]);
    let said = format!("{}{}", text(&verify.stdout), text(&verify.stderr));
    assert_eq!(code(&verify), 1, "{said}");
    assert!(
        said.contains("not a regular file") && said.contains("symbolic link"),
        "S6: {said}"
    );
    assert_eq!(shared.effects(), vec!["laptop-monday", "laptop-tuesday"]);
}

/// S6, M2 (found by an adversarial test: new hosts stopped until a member compacted): a member
/// whose checkpoint replaced the others' is revoked; the revoking member writes a checkpoint of
/// its own, so a host admitted after the revocation (which never uses the revoked device's)
/// starts from it and runs nothing twice.
#[test]
fn s6_m2_a_revocation_of_the_last_checkpoints_writer_leaves_one_to_start_from() {
    let shared = Shared::sqlite();
    let fingerprint = init(&shared);
    join(&shared, "phone", &fingerprint, "laptop");
    assert_eq!(code(&send(&shared, "laptop", "monday")), 0);
    assert_eq!(
        code(&host(&shared, "laptop", &["ledger", "compact", "--prune"])),
        0
    );
    assert_eq!(code(&send(&shared, "phone", "tuesday")), 0);
    let compact = host(&shared, "phone", &["ledger", "compact", "--prune"]);
    assert_eq!(code(&compact), 0, "{}", text(&compact.stderr));
    let revoke = host(&shared, "laptop", &["device", "revoke", "phone"]);
    assert_eq!(code(&revoke), 0, "{}", text(&revoke.stderr));
    assert!(
        text(&revoke.stderr).contains("wrote a checkpoint"),
        "{}",
        text(&revoke.stderr)
    );

    join(&shared, "tablet", &fingerprint, "laptop");
    assert_eq!(code(&send(&shared, "tablet", "monday")), 3);
    assert_eq!(code(&send(&shared, "tablet", "tuesday")), 3);
    assert_eq!(code(&send(&shared, "tablet", "wednesday")), 0);
    assert_eq!(
        shared.effects(),
        vec!["laptop-monday", "phone-tuesday", "tablet-wednesday"]
    );
}
