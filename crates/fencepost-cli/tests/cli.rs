//! The built `fencepost` binary, run as an operator would.

use std::process::Command;

fn fencepost(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fencepost"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_help_explains_the_tool_and_exits_zero() {
    let output = fencepost(&["--help"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("Run each side effect once across hosts"), "{text}");
    assert!(text.contains("Usage: fencepost"), "{text}");
}

#[test]
fn cli_version_prints_the_crate_version() {
    let output = fencepost(&["--version"]);
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap().trim(),
        format!("fencepost {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn cli_without_a_command_is_a_usage_error_that_lists_the_commands() {
    let output = fencepost(&[]);
    assert_eq!(output.status.code(), Some(2));
    let text = String::from_utf8(output.stderr).unwrap();
    for command in ["run", "lease", "ledger"] {
        assert!(text.contains(command), "{text}");
    }
}

#[test]
fn cli_run_help_documents_every_exit_status() {
    let output = fencepost(&["run", "--help"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for line in [
        "0   ran, and the command succeeded",
        "3   not run: this occurrence already committed",
        "4   not run: another host, or another process of this host, holds",
        "5   not run: in doubt",
        "10  error",
    ] {
        assert!(text.contains(line), "{line:?} missing from: {text}");
    }
    assert!(text.contains("FENCEPOST_EPOCH"), "{text}");
}

#[test]
fn cli_unknown_flag_is_a_usage_error() {
    let output = fencepost(&["--frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("--frobnicate"));
}

/// Issue 14, item 4, through the binary: a PostgreSQL coordinator that accepts connections and
/// never answers (a stopped pooler) ends `fencepost run --wait 1s` with exit 10 within one
/// operation timeout (plus the client's margin), not once per connection attempt and not with the
/// connect timeout on top; the command never runs.
#[cfg(feature = "postgres")]
#[test]
#[allow(clippy::disallowed_methods)] // a harness measures real time
fn cli_run_against_a_silent_postgres_coordinator_gives_up_within_one_bound() {
    use std::time::{Duration, Instant};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let home = std::env::temp_dir().join(format!("fencepost-silent-{}", std::process::id()));
    let ledger = home.join("ledger");
    std::fs::create_dir_all(&ledger).unwrap();
    let marker = home.join("ran");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_fencepost"))
        .env("HOME", &home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .args([
            "run",
            "--coordinator",
            &format!("postgres://agent:secret@127.0.0.1:{port}/app?operation_timeout=500ms"),
            "--ledger",
            ledger.to_str().unwrap(),
            "--agent",
            "nightly",
            "--intent",
            "backup",
            "--salt",
            "2026-11-30",
            "--wait",
            "1s",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(10), "{stderr}");
    assert!(stderr.contains("no answer within"), "{stderr}");
    assert!(!marker.exists(), "the command ran without a coordinator");
    // 500 ms + the 1 s margin; three attempts of 5 s connect timeout + that took 19.5 s.
    assert!(took < Duration::from_millis(1_500 + 2_500), "took {took:?}");
    let _ = std::fs::remove_dir_all(&home);
}
