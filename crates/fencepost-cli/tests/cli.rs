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
fn cli_without_a_command_fails_with_a_pointer_to_help() {
    let output = fencepost(&[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr)
        .unwrap()
        .contains("fencepost --help"));
}

#[test]
fn cli_unknown_flag_is_a_usage_error() {
    let output = fencepost(&["--frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("--frobnicate"));
}
