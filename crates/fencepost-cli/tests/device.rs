//! A device's identity through the built binary (issue 39, rule I1): `fencepost device key`
//! makes the key once per device id, processes racing to make it share one, and a key file that
//! is damaged, readable by others or not a file is a clear error that leaves it as it is. And
//! what a host that is no member makes of a protected ledger's records (rule S1).

mod common;

use common::{text, Shared};

fn key_file(shared: &Shared, device: &str) -> std::path::PathBuf {
    shared
        .path("data")
        .join("fencepost")
        .join("keys")
        .join(format!("{device}.key"))
}

#[test]
fn i1_device_key_is_made_once_per_device_id_and_racing_processes_print_one_key() {
    let shared = Shared::sqlite();
    let children: Vec<_> = (0..8)
        .map(|_| shared.spawn("host-a", &["device", "key"]))
        .collect();
    let mut lines = Vec::new();
    let mut made = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        let stdout = text(&output.stdout);
        assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
        lines.push(stdout.trim().to_owned());
        made += usize::from(text(&output.stderr).contains("made the key of device host-a"));
    }
    assert!(lines.windows(2).all(|pair| pair[0] == pair[1]), "{lines:?}");
    assert_eq!(made, 1, "exactly one process made the key");
    assert!(
        lines[0].starts_with("fpdev1.") && lines[0].len() == 98,
        "{}",
        lines[0]
    );
    let again = shared.run("host-a", &["device", "key"]);
    assert_eq!(text(&again.stdout).trim(), lines[0]);
    assert!(text(&again.stderr).is_empty(), "{}", text(&again.stderr));
    let other = shared.run("host-b", &["device", "key"]);
    assert_ne!(
        text(&other.stdout).trim(),
        lines[0],
        "each device id has its own key"
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let file = key_file(&shared, "host-a");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let folder = file.parent().unwrap();
        assert_eq!(
            std::fs::metadata(folder).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let names: Vec<_> = std::fs::read_dir(folder)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
    }
}

#[test]
fn i1_a_damaged_open_or_misplaced_key_file_is_a_clear_error_and_is_never_replaced() {
    use std::os::unix::fs::PermissionsExt as _;
    let shared = Shared::sqlite();
    assert!(shared.run("host-a", &["device", "key"]).status.success());
    let file = key_file(&shared, "host-a");
    let original = std::fs::read_to_string(&file).unwrap();
    let refused = |expected: &str| {
        let before = std::fs::read(&file).ok();
        let output = shared.run("host-a", &["device", "key"]);
        assert_eq!(output.status.code(), Some(10), "{}", text(&output.stderr));
        assert!(output.stdout.is_empty());
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(expected) && stderr.contains("host-a.key"),
            "{stderr}"
        );
        assert_eq!(std::fs::read(&file).ok(), before, "the key file was changed");
    };
    std::fs::write(&file, &original[..original.len() / 2]).unwrap();
    refused("is damaged");
    std::fs::write(&file, original.replace("device host-a", "device host-b")).unwrap();
    refused("belongs to device \"host-b\"");
    std::fs::write(&file, b"\xff\xfe not text").unwrap();
    refused("not UTF-8");
    std::fs::write(&file, &original).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    refused("chmod 600");
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    refused("is not a file");
}

/// Issue 39, item 2: a ledger made without `ledger init` keeps working, and `status` and
/// `ledger verify` say it is not protected (in text and in JSON).
#[test]
fn status_and_ledger_verify_say_a_ledger_is_not_protected() {
    let shared = Shared::sqlite();
    let ran = shared.run(
        "host-a",
        &[
            "run", "--agent", "a", "--intent", "i", "--salt", "s", "--", "true",
        ],
    );
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let status = shared.run("host-a", &["status"]);
    assert!(
        text(&status.stdout).contains("protection:  none"),
        "{}",
        text(&status.stdout)
    );
    let status = shared.run("host-a", &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(report["ledger"]["protected"], serde_json::Value::Bool(false));
    let verify = shared.run("host-a", &["ledger", "verify"]);
    assert!(verify.status.success(), "{}", text(&verify.stderr));
    assert!(
        text(&verify.stdout).contains("not protected"),
        "{}",
        text(&verify.stdout)
    );
    let verify = shared.run("host-a", &["ledger", "verify", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(report["protected"], serde_json::Value::Bool(false));
    assert_eq!(report["intact"], serde_json::Value::Bool(true));
}

/// S1: a protected ledger's log (sealed records, format 4: here a `committed` of tomorrow's
/// occurrence under a device id nobody else uses) in a ledger folder that this host reads as
/// unprotected is damage of that device: no host takes the sealed commit for an absent one and
/// runs the occurrence, none takes it for a commit either, and `ledger verify` names the device
/// and says why.
#[test]
fn s1_a_sealed_log_in_a_ledger_read_as_unprotected_is_damage_and_runs_nothing() {
    use std::num::NonZeroU32;

    use fencepost::clock::ManualClock;
    use fencepost::id::DeviceId;
    use fencepost::identity::{DeviceKey, LedgerId};
    use fencepost::oplog::{DeviceLog, OpRecord, Surface};
    use fencepost::relay::device_file_name;
    use fencepost::run_id::deterministic_run_id;
    use fencepost::seal::LedgerKey;

    let shared = Shared::sqlite();
    let first = shared.run(
        "host-1",
        &[
            "run", "--agent", "demo", "--intent", "i", "--salt", "today", "--", "true",
        ],
    );
    assert!(first.status.success(), "{}", text(&first.stderr));
    let run = deterministic_run_id("demo", "i", "tomorrow").unwrap();
    let clock = ManualClock::new(1_764_400_000_000);
    let mut log = DeviceLog::new("host-7", clock.wall_clock()).unwrap();
    let ledger = LedgerId([1; 32]);
    let key = LedgerKey::new(NonZeroU32::MIN, [2; 32]);
    let signer = DeviceKey::from_secrets(DeviceId::new("host-7").unwrap(), [3; 32], [4; 32]);
    let mut lines = Vec::new();
    let mut origin = None;
    let mut prev = None;
    for status in ["pending", "committed"] {
        let mut plain = log.append(
            Surface::Intent,
            serde_json::json!({"agent_id": "demo", "epoch": 1, "id": run, "status": status}),
        );
        plain.prev = prev;
        let sealed: OpRecord = plain.seal(&key, ledger).unwrap();
        let origin = *origin.get_or_insert(sealed.op_id);
        let sealed = sealed.signed(&signer, &ledger, &origin);
        prev = Some(sealed.op_id);
        sealed.write_json_line(&mut lines);
    }
    let file = shared
        .path("ledger")
        .join("devices")
        .join(device_file_name("host-7"));
    std::fs::write(&file, &lines).unwrap();

    for host in ["host-1", "host-2"] {
        let effect = format!("echo {host} >> '{}'", shared.path("effects").display());
        let again = shared.run(
            host,
            &[
                "run", "--agent", "demo", "--intent", "i", "--salt", "tomorrow", "--", "sh", "-c", &effect,
            ],
        );
        assert_eq!(again.status.code(), Some(10), "{host}: {}", text(&again.stderr));
    }
    assert!(
        shared.effects().is_empty(),
        "a run went ahead beside a sealed log"
    );
    let verify = shared.run("host-2", &["ledger", "verify"]);
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify.stdout));
    let report = text(&verify.stdout);
    assert!(
        report.contains("host-7") && report.contains("protected ledger"),
        "{report}"
    );
}
