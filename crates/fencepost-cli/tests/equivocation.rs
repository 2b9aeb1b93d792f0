//! Rule I1 through the built binary: a copy of a member's data directory that runs on a second
//! host, behind a synced folder that lags there, writes a second log under the member's key.
//! Another member that had read the first reports the device's log as damage, runs nothing
//! twice, and keeps the proof.

mod common;

use std::process::Output;

use common::{text, Shared};
use fencepost::relay::device_file_name;

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// A run of occurrence `salt` as `device` with the data directory `data`.
fn send(shared: &Shared, device: &str, data: &str, salt: &str) -> Output {
    send_as(shared, "milo", device, data, salt)
}

/// [`send`] of `agent`.
fn send_as(shared: &Shared, agent: &str, device: &str, data: &str, salt: &str) -> Output {
    let effect = format!("echo {data} >> '{}'", shared.path("effects").display());
    shared
        .command(
            device,
            &[
                "run", "--agent", agent, "--intent", "send", "--salt", salt, "--", "sh", "-c", &effect,
            ],
        )
        .env("XDG_DATA_HOME", shared.path(data))
        .output()
        .unwrap()
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// I1: the laptop's data directory is copied to a second host, whose copy of the synced ledger
/// folder then lags: it waits for Milo's Tuesday (the published frontier names it), but runs
/// another agent's Wednesday where the laptop wrote Tuesday, and its file comes over the
/// laptop's. The phone, which had read Tuesday, runs nothing (exit 10, the laptop's log is
/// damage), `ledger verify` says the laptop signed two logs and where the evidence is, and the
/// evidence file is there. The laptop's id has a capital (its file name is encoded, and its
/// log sorts before its admitter's, so it is released by a later pull than its own: found by
/// an adversary, such a device got no evidence).
#[test]
fn i1_a_cloned_data_directory_writing_a_second_log_is_damage_with_evidence() {
    let shared = Shared::sqlite();
    let init = shared.host("server", &["ledger", "init"]);
    assert_eq!(code(&init), 0, "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    for member in ["Laptop", "phone"] {
        let key = text(&shared.host(member, &["device", "key"]).stdout)
            .trim()
            .to_owned();
        assert_eq!(code(&shared.host(member, &["device", "join", &fingerprint])), 0);
        let admit = shared.host("server", &["device", "admit", &key, "--device", member]);
        assert_eq!(code(&admit), 0, "{}", text(&admit.stderr));
    }

    assert_eq!(code(&send(&shared, "Laptop", "data-Laptop", "monday")), 0);
    let laptop_file = shared
        .path("ledger")
        .join("devices")
        .join(device_file_name("Laptop"));
    let lagging = std::fs::read(&laptop_file).unwrap();
    copy_dir(&shared.path("data-Laptop"), &shared.path("data-clone"));
    assert_eq!(code(&send(&shared, "Laptop", "data-Laptop", "tuesday")), 0);
    assert_eq!(code(&send(&shared, "phone", "data-phone", "tuesday")), 3);

    // The second host's copy of the folder lacks Tuesday; its file wins the sync. Milo's
    // published frontier names Tuesday, so the copy runs none of Milo's occurrences (exit 7);
    // another agent's, whose frontier never named it, it runs.
    std::fs::write(&laptop_file, &lagging).unwrap();
    let waits = send(&shared, "Laptop", "data-clone", "wednesday");
    assert_eq!(code(&waits), 7, "H3: {}", text(&waits.stderr));
    let other = send_as(&shared, "otto", "Laptop", "data-clone", "wednesday");
    assert_eq!(code(&other), 0, "{}", text(&other.stderr));

    for salt in ["tuesday", "wednesday", "thursday"] {
        let run = send(&shared, "phone", "data-phone", salt);
        assert_eq!(code(&run), 10, "I1: {salt}: {}", text(&run.stderr));
    }
    let verify = shared.host("phone", &["ledger", "verify"]);
    let report = format!("{}{}", text(&verify.stdout), text(&verify.stderr));
    assert_eq!(code(&verify), 1, "I1: {report}");
    assert!(report.contains("signed both"), "I1: {report}");
    let stem = device_file_name("Laptop").replace(".jsonl", "");
    let evidence: Vec<_> = std::fs::read_dir(shared.path("data-phone").join("fencepost").join("seen"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("equivocation-") && name.contains(&format!("-{stem}-"))
        })
        .collect();
    assert_eq!(evidence.len(), 1, "I1: the evidence is kept: {report}");
    assert!(report.contains(&evidence[0].display().to_string()), "{report}");
    let effects = shared.effects();
    assert_eq!(
        effects,
        vec!["data-Laptop", "data-Laptop", "data-clone"],
        "each occurrence once, none on the phone"
    );
}
