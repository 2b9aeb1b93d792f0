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
        "4   not run: another host holds",
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
