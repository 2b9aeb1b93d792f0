//! Rule O1 through the built binary: the compact record form (issue 17), a ledger folder written
//! by an earlier version, and compact records damaged by hand.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{text, Shared};
use fencepost::relay::device_file_name;

/// The host that wrote [`OBJECT_FORM_RECORDS`].
const OLD_HOST: &str = "vm-0035969e";

/// What `fencepost run --agent demo --intent "say hello" --salt 2026-12-01 -- true` wrote, with the
/// release binary of the previous version, on host `vm-0035969e`: its ledger file, copied.
const OBJECT_FORM_RECORDS: &str = concat!(
    r#"{"op_id":"548f5d43754b96347f26434374382b90217a5eff285366a79ad4ddf22fccf76f","hlc":{"wall_ms":1796085755970,"counter":0,"device_id":"vm-0035969e"},"device_id":"vm-0035969e","seq":0,"prev":null,"surface":"intent","payload":{"agent_id":"demo","epoch":1,"id":"run-710757806a991ed791b5178e9a5ffac0","status":"pending"}}"#,
    "\n",
    r#"{"op_id":"d4954202ad1477682313e76d0f0447bca51d817a73ab6d517ce39330a1c2e31a","hlc":{"wall_ms":1796085755974,"counter":0,"device_id":"vm-0035969e"},"device_id":"vm-0035969e","seq":1,"prev":"548f5d43754b96347f26434374382b90217a5eff285366a79ad4ddf22fccf76f","surface":"intent","payload":{"agent_id":"demo","epoch":1,"id":"run-710757806a991ed791b5178e9a5ffac0","status":"committed"}}"#,
    "\n",
);

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn device_file(shared: &Shared, device: &str) -> PathBuf {
    shared
        .path("ledger")
        .join("devices")
        .join(device_file_name(device))
}

/// `fencepost run` of the job that wrote [`OBJECT_FORM_RECORDS`], for `salt`, appending the
/// device to `effects`.
fn hello(shared: &Shared, device: &str, salt: &str) -> Output {
    let effect = format!("echo {device} >> '{}'", shared.path("effects").display());
    shared.run(
        device,
        &[
            "run",
            "--agent",
            "demo",
            "--intent",
            "say hello",
            "--salt",
            salt,
            "--",
            "sh",
            "-c",
            &effect,
        ],
    )
}

fn lines(shared: &Shared, device: &str) -> Vec<String> {
    std::fs::read_to_string(device_file(shared, device))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// O1: a ledger folder of the previous version keeps its commits (the run it committed does not
/// run again, on its host or another), and its file grows in the compact form, which both hosts
/// read.
#[test]
fn o1_a_ledger_folder_of_the_previous_version_keeps_its_commits_and_grows_compact() {
    let shared = Shared::sqlite();
    std::fs::create_dir_all(shared.path("ledger").join("devices")).unwrap();
    std::fs::write(device_file(&shared, OLD_HOST), OBJECT_FORM_RECORDS).unwrap();

    for host in [OLD_HOST, "host-2"] {
        let again = hello(&shared, host, "2026-12-01");
        assert_eq!(code(&again), 3, "{host}: {}", text(&again.stderr));
    }
    assert!(shared.effects().is_empty(), "a committed run ran again");

    let next = hello(&shared, OLD_HOST, "2026-12-02");
    assert_eq!(code(&next), 0, "{}", text(&next.stderr));
    let written = lines(&shared, OLD_HOST);
    assert_eq!(written.len(), 4, "{written:?}");
    assert!(
        written[..2].iter().all(|line| line.starts_with('{')),
        "{written:?}"
    );
    assert!(
        written[2..].iter().all(|line| line.starts_with("[2,\"")),
        "{written:?}"
    );
    assert!(
        written[2..].iter().all(|line| line.len() < 200),
        "compact records: {written:?}"
    );

    let elsewhere = hello(&shared, "host-2", "2026-12-02");
    assert_eq!(code(&elsewhere), 3, "{}", text(&elsewhere.stderr));
    assert_eq!(shared.effects(), vec![OLD_HOST.to_owned()]);
    let verify = shared.run("host-2", &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify.stdout));
}

/// O1, R1: a compact record changed by hand (a committed run turned pending, a flipped character
/// of an id, a record of a newer format, a line cut short and completed wrongly) is damage: the
/// committed run does not run again, and `ledger verify` names the file and line.
#[test]
fn o1_a_compact_record_changed_by_hand_is_damage_and_runs_nothing() {
    let cases: Vec<(&str, LineChange, &str)> = vec![
        (
            "committed turned pending",
            |line| line.replacen(",1]", ",0]", 1),
            "does not match",
        ),
        ("a character of op_id", |line| flip_char(line, 5), ".jsonl:2:"),
        (
            "a character of prev",
            |line| {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                let prev = value[6].as_str().unwrap();
                flip_char(line, line.find(prev).unwrap() + 10)
            },
            ".jsonl:2:",
        ),
        (
            "a newer format",
            |line| line.replacen("[2,", "[4,", 1),
            "newer fencepost",
        ),
        (
            "another status",
            |line| line.replacen(",1]", ",7]", 1),
            "status 7",
        ),
        (
            "a line cut short",
            |line| format!("{}]", &line[..line.len() - 20]),
            ".jsonl:2:",
        ),
    ];
    for (what, change, says) in cases {
        let shared = Shared::sqlite();
        let first = hello(&shared, "host-1", "a");
        assert_eq!(code(&first), 0, "{what}: {}", text(&first.stderr));
        let mut written = lines(&shared, "host-1");
        assert_eq!(written.len(), 2, "{what}");
        assert!(written[1].starts_with("[2,"), "{what}: {written:?}");
        let changed = change(&written[1]);
        assert_ne!(changed, written[1], "{what}: the change changes the line");
        written[1] = changed;
        std::fs::write(device_file(&shared, "host-1"), written.join("\n") + "\n").unwrap();

        for host in ["host-1", "host-2"] {
            let again = hello(&shared, host, "a");
            assert_eq!(code(&again), 10, "{what}, {host}: {}", text(&again.stderr));
        }
        assert_eq!(shared.effects(), vec!["host-1".to_owned()], "{what}: ran again");
        let verify = shared.run("host-2", &["ledger", "verify"]);
        assert_eq!(code(&verify), 1, "{what}: {}", text(&verify.stdout));
        assert!(
            text(&verify.stdout).contains(says),
            "{what}: {}",
            text(&verify.stdout)
        );
    }
}

/// A change made by hand to a line of a device file.
type LineChange = fn(&str) -> String;

/// The line with the character at `index` replaced by another base64url character.
fn flip_char(line: &str, index: usize) -> String {
    let mut bytes = line.as_bytes().to_vec();
    bytes[index] = if bytes[index] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}
