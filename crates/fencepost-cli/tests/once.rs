//! Once means once: the ordinary situations that ran an effect twice, lost an outcome or left a
//! command running after its lease, reproduced through the built binary (several processes, real
//! signals, real files). Each test names the rule it checks.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{text, wait_for_file, Shared};
use fencepost::clock::{Hlc, ManualClock};
use fencepost::lease::LeaseCoordinator as _;
use fencepost::oplog::{DeviceLog, OpId, OpRecord, Surface};
use fencepost::relay::{device_file_name, FsRelay, Relay};
use serde_json::json;

fn run_args<'a>(agent: &'a str, salt: &'a str, extra: &[&'a str], command: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--agent", agent, "--intent", "job", "--salt", salt];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    args
}

fn device_file(shared: &Shared, device: &str) -> PathBuf {
    shared
        .path("ledger")
        .join("devices")
        .join(device_file_name(device))
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn append_effect(shared: &Shared, tag: &str) -> String {
    format!(
        "echo \"{tag} $FENCEPOST_DEVICE $FENCEPOST_EPOCH\" >> '{}'",
        shared.path("effects").display()
    )
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

fn alive(pid: &str) -> bool {
    Command::new("kill")
        .args(["-0", pid.trim()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// This host's seen file of `device` (in the tests' data directory), or its lock (`suffix`).
fn seen_file(shared: &Shared, device: &str, suffix: &str) -> PathBuf {
    let wanted = format!("-{}{suffix}", device_file_name(device));
    std::fs::read_dir(shared.path("data").join("fencepost").join("seen"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(&wanted))
        .unwrap_or_else(|| panic!("no seen file of {device}"))
}

/// Waits (at most `seconds`) until process `pid` is gone; whether it is.
fn gone_within(pid: &str, seconds: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// Waits (at most `seconds`) for `child` to exit; kills it and fails with `what` if it does not.
fn exit_within(child: &mut std::process::Child, seconds: u64, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what}: no exit within {seconds} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs occurrence "1" of agent "a" as host-1 with a command that someone else kills (SIGKILL)
/// mid-run; fencepost's output.
fn command_killed_from_outside(shared: &Shared) -> Output {
    let pid_file = shared.path("command.pid");
    let script = format!(
        "echo $$ > '{pid}.tmp'; mv '{pid}.tmp' '{pid}'; exec sleep 30",
        pid = pid_file.display()
    );
    let child = shared.spawn("host-1", &run_args("a", "1", &[], &["sh", "-c", &script]));
    wait_for_file(&pid_file);
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    signal(pid.trim().parse().unwrap(), "KILL");
    child.wait_with_output().unwrap()
}

/// D2: a run whose older attempt failed and whose newer attempt was killed mid-command is in doubt;
/// no host runs it again without a decision, and `ledger runs` shows both attempts.
#[test]
fn d2_a_retried_run_killed_mid_command_is_in_doubt_although_an_older_attempt_failed() {
    let shared = Shared::sqlite();
    let failed = shared.run("host-1", &run_args("a", "s", &[], &["sh", "-c", "exit 1"]));
    assert_eq!(code(&failed), 1, "{}", text(&failed.stderr));
    // The retry (a later epoch) is killed with SIGKILL mid-command.
    common::kill_mid_command(
        &shared,
        "host-1",
        &[
            "run", "--agent", "a", "--intent", "job", "--salt", "s", "--ttl", "1s",
        ],
        &append_effect(&shared, "first"),
    );
    assert_eq!(shared.effects().len(), 1);
    std::thread::sleep(Duration::from_millis(1_100)); // the dead host's lease runs out
    let runs = text(&shared.run("host-2", &["ledger", "runs", "--agent", "a"]).stdout);
    assert!(
        runs.contains("in-doubt") && runs.contains("after failed@"),
        "{runs}"
    );
    let again = shared.run(
        "host-2",
        &run_args(
            "a",
            "s",
            &["--wait", "10s"],
            &["sh", "-c", &append_effect(&shared, "second")],
        ),
    );
    assert_eq!(code(&again), 5, "{}", text(&again.stderr));
    assert_eq!(shared.effects().len(), 1, "not run twice");
}

/// R1: processes that share one device id (two cron lines on one host) interleave their appends;
/// none forks the log, none loses an outcome.
#[test]
fn r1_processes_sharing_a_device_id_never_fork_the_log_or_lose_an_outcome() {
    let shared = Shared::sqlite();
    let agents: Vec<String> = (0..8).map(|index| format!("agent-{index}")).collect();
    let children: Vec<_> = agents
        .iter()
        .map(|agent| {
            let effect = append_effect(&shared, agent);
            let args = run_args(agent, "s", &[], &["sh", "-c", &effect]);
            shared.spawn("host-1", &args)
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    }
    assert_eq!(shared.effects().len(), 8);
    let verify = shared.run("host-2", &["ledger", "verify"]);
    assert_eq!(code(&verify), 0, "{}", text(&verify.stdout));
    let runs: serde_json::Value =
        serde_json::from_slice(&shared.run("host-2", &["ledger", "runs", "--json"]).stdout).unwrap();
    let committed = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|run| run["status"] == "committed")
        .count();
    assert_eq!(committed, 8, "every outcome is in the ledger: {runs}");
}

/// R1: a command never dispatches on a ledger it knows is incomplete; `--accept-damaged` is the
/// explicit override, and `verify` reports every kind of damage.
#[test]
fn r1_a_damaged_ledger_stops_every_run_until_repaired_or_accepted() {
    type Damage = fn(&std::path::Path, &[u8]);
    let damages: [(&str, Damage); 5] = [
        ("a flipped byte", |file, original| {
            let mut bytes = original.to_vec();
            let middle = bytes.iter().position(|byte| *byte == b'\n').unwrap() + 30;
            bytes[middle] ^= 0x01;
            std::fs::write(file, bytes).unwrap();
        }),
        ("a deleted middle line", |file, original| {
            let text = String::from_utf8(original.to_vec()).unwrap();
            let mut lines: Vec<&str> = text.lines().collect();
            lines.remove(1);
            std::fs::write(file, lines.join("\n") + "\n").unwrap();
        }),
        ("a folder in its place", |file, _| {
            std::fs::remove_file(file).unwrap();
            std::fs::create_dir(file).unwrap();
        }),
        ("a file that shrank", |file, original| {
            let text = String::from_utf8(original.to_vec()).unwrap();
            let first = text.lines().next().unwrap();
            std::fs::write(file, format!("{first}\n")).unwrap();
        }),
        ("a deleted file", |file, _| std::fs::remove_file(file).unwrap()),
    ];
    for (what, damage) in damages {
        let shared = Shared::sqlite();
        let effect = append_effect(&shared, "ran");
        for salt in ["1", "2"] {
            let ran = shared.run("host-1", &run_args("a", salt, &[], &["sh", "-c", &effect]));
            assert_eq!(code(&ran), 0, "{what}: {}", text(&ran.stderr));
        }
        // host-2 has seen host-1's records.
        assert_eq!(code(&shared.run("host-2", &["ledger", "show"])), 0);
        let file = device_file(&shared, "host-1");
        let original = std::fs::read(&file).unwrap();
        damage(&file, &original);

        let verify = shared.run("host-2", &["ledger", "verify"]);
        assert_eq!(code(&verify), 1, "{what}: verify says {}", text(&verify.stdout));
        assert!(
            text(&verify.stdout).contains("damaged"),
            "{what}: {}",
            text(&verify.stdout)
        );
        let refused = shared.run("host-2", &run_args("a", "2", &[], &["sh", "-c", &effect]));
        assert_eq!(code(&refused), 10, "{what}: {}", text(&refused.stderr));
        let message = text(&refused.stderr);
        assert!(
            message.contains("damaged") && message.contains("--accept-damaged"),
            "{what}: {message}"
        );
        assert_eq!(
            message.trim_end().lines().count(),
            1,
            "{what}: one line: {message}"
        );
        assert_eq!(
            shared.effects().len(),
            2,
            "{what}: a committed run did not run again"
        );

        // The operator accepts the loss explicitly: the decision is recorded.
        let accepted = shared.run(
            "host-2",
            &run_args("a", "3", &["--accept-damaged", "host-1"], &["sh", "-c", &effect]),
        );
        assert_eq!(code(&accepted), 0, "{what}: {}", text(&accepted.stderr));
        let own = std::fs::read_to_string(device_file(&shared, "host-2")).unwrap();
        assert!(own.contains("fencepost.accept-damaged"), "{what}: {own}");
    }
}

/// R1: an incomplete last line (a write or a sync in progress, a truncated file) is reported by
/// `verify`, not called intact.
#[test]
fn r1_verify_reports_an_incomplete_last_line() {
    let shared = Shared::sqlite();
    assert_eq!(
        code(&shared.run("host-1", &run_args("a", "1", &[], &["true"]))),
        0
    );
    let file = device_file(&shared, "host-1");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(b"{\"op_id\":\"12");
    std::fs::write(&file, bytes).unwrap();
    let verify = shared.run("host-2", &["ledger", "verify"]);
    assert_eq!(code(&verify), 1, "{}", text(&verify.stdout));
    assert!(
        text(&verify.stdout).contains("incomplete"),
        "{}",
        text(&verify.stdout)
    );
    assert!(
        !text(&verify.stdout).contains("is intact"),
        "{}",
        text(&verify.stdout)
    );
}

/// L6 (one shared register): coordinator specs that would give each process a private store are
/// usage errors.
#[test]
fn l6_coordinator_specs_private_to_one_process_are_refused() {
    let shared = Shared::sqlite();
    for spec in [
        "sqlite:",
        "sqlite::memory:",
        "sqlite:file::memory:?cache=shared",
        "sqlite: ",
        // Relative: another file in each working directory.
        "sqlite:leases.db",
        "sqlite:./state/leases.db",
    ] {
        let mut command = shared.command("host-1", &run_args("a", "1", &[], &["true"]));
        command.env("FENCEPOST_COORDINATOR", spec);
        let output = command.output().unwrap();
        assert_eq!(code(&output), 2, "{spec:?}: {}", text(&output.stderr));
        let message = text(&output.stderr);
        assert!(
            message.contains("private") || message.contains("absolute"),
            "{message}"
        );
    }
    assert!(shared.effects().is_empty());
}

/// L8: values that used to be adjusted silently, and invalid ids, are usage errors (exit 2).
#[test]
fn l8_short_ttls_zero_timeouts_empty_names_and_invalid_ids_are_usage_errors() {
    let shared = Shared::sqlite();
    let long = "x".repeat(300);
    let cases: Vec<Vec<&str>> = vec![
        run_args("a", "1", &["--ttl", "0"], &["true"]),
        run_args("a", "1", &["--ttl", "1ms"], &["true"]),
        run_args("a", "1", &["--ttl", "999ms"], &["true"]),
        run_args("a", "", &[], &["true"]),
        run_args("a", " ", &[], &["true"]),
        vec!["run", "--agent", "a", "--intent", "", "--salt", "1", "--", "true"],
        run_args("bad\u{7}agent", "1", &[], &["true"]),
        run_args(&long, "1", &[], &["true"]),
        // A zero timeout would stop the command as it starts, leaving the run in doubt.
        run_args("a", "1", &["--timeout", "0s"], &["true"]),
        run_args("a", "1", &["--timeout", "0"], &["true"]),
    ];
    for args in cases {
        let output = shared.run("host-1", &args);
        assert_eq!(code(&output), 2, "{args:?}: {}", text(&output.stderr));
    }
    let output = shared.run(&long, &["lease", "list"]);
    assert_eq!(code(&output), 2, "{}", text(&output.stderr));
    // The lease subcommands refuse the same bad input as usage errors, before any lease is
    // asked for (they exited 10).
    let leases: Vec<Vec<&str>> = vec![
        vec!["lease", "acquire", "--agent", ""],
        vec!["lease", "acquire", "--agent", "bad\u{7}agent"],
        vec!["lease", "acquire", "--agent", &long],
        vec!["lease", "acquire", "--agent", "a", "--ttl", "0s"],
        vec!["lease", "renew", "--agent", "a", "--epoch", "1", "--ttl", "0"],
        vec!["lease", "release", "--agent", "", "--epoch", "1"],
        vec!["lease", "current", "--agent", ""],
    ];
    for args in leases {
        let output = shared.run("host-1", &args);
        assert_eq!(code(&output), 2, "{args:?}: {}", text(&output.stderr));
    }
    assert!(shared.effects().is_empty());
    let ran = shared.run("host-1", &run_args("a", "1", &["--ttl", "1s"], &["true"]));
    assert_eq!(code(&ran), 0, "{}", text(&ran.stderr));
}

/// A command whose lease is lost while it runs (fencepost paused past its TTL, the lease taken)
/// is stopped, fencepost exits 6, and the run is in doubt (the command may have done its effect).
#[test]
fn keeper_a_command_whose_lease_is_lost_is_stopped_and_left_in_doubt() {
    let shared = Shared::sqlite();
    let started = shared.path("started");
    let script = format!(
        "touch '{}'; sleep 30; {}",
        started.display(),
        append_effect(&shared, "late")
    );
    let mut child = shared.spawn(
        "host-1",
        &run_args("a", "1", &["--ttl", "1s"], &["sh", "-c", &script]),
    );
    wait_for_file(&started);
    signal(child.id(), "STOP");
    std::thread::sleep(Duration::from_millis(1_500));
    // Another host takes the expired lease.
    let taken = shared.run(
        "host-2",
        &["lease", "acquire", "--agent", "a", "--ttl", "60s", "--json"],
    );
    assert_eq!(code(&taken), 0, "{}", text(&taken.stderr));
    let taken: serde_json::Value = serde_json::from_slice(&taken.stdout).unwrap();
    let epoch = taken["epoch"].as_u64().unwrap().to_string();
    let resumed = Instant::now();
    signal(child.id(), "CONT");
    let status = child.wait().unwrap();
    assert!(resumed.elapsed() < Duration::from_secs(10), "stopped promptly");
    assert_eq!(status.code(), Some(6));
    assert!(shared.effects().is_empty(), "the command never finished");
    assert_eq!(
        code(&shared.run("host-2", &["lease", "release", "--agent", "a", "--epoch", &epoch])),
        0
    );
    let runs = text(&shared.run("host-3", &["ledger", "runs"]).stdout);
    assert!(runs.contains("in-doubt"), "{runs}");
    let again = shared.run("host-3", &run_args("a", "1", &[], &["true"]));
    assert_eq!(
        code(&again),
        5,
        "not run again without a decision: {}",
        text(&again.stderr)
    );
}

/// SIGTERM to fencepost reaches the command; fencepost leaves the interrupted run in doubt and
/// releases the lease.
#[test]
fn keeper_sigterm_is_forwarded_and_the_lease_released() {
    let shared = Shared::sqlite();
    let started = shared.path("started");
    let script = format!(
        "trap 'echo terminated >> {}; exit 143' TERM; touch '{}'; sleep 30 & wait",
        shared.path("effects").display(),
        started.display()
    );
    let child = shared.spawn("host-1", &run_args("a", "1", &[], &["sh", "-c", &script]));
    wait_for_file(&started);
    signal(child.id(), "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), 1, "{}", text(&output.stderr));
    assert_eq!(shared.effects().len(), 1, "the command got SIGTERM");
    let current = text(&shared.run("host-2", &["lease", "current", "--agent", "a"]).stdout);
    assert!(current.contains("not held"), "released: {current}");
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("in-doubt"), "{runs}");
}

/// A fencepost killed with SIGKILL takes its command with it, and everything the command started
/// (its process group): nothing runs on unnoticed.
#[test]
fn keeper_a_killed_fencepost_takes_its_command_and_its_children_with_it() {
    let shared = Shared::sqlite();
    let pid_file = shared.path("command.pid");
    let child_file = shared.path("child.pid");
    let script = format!(
        "sh -c 'sleep 30; {late}' & echo $! > '{child}'; echo $$ > '{pid}.tmp'; mv '{pid}.tmp' '{pid}'; wait",
        late = append_effect(&shared, "late").replace('\'', "\""),
        child = child_file.display(),
        pid = pid_file.display()
    );
    let mut fencepost = shared.spawn("host-1", &run_args("a", "1", &[], &["sh", "-c", &script]));
    wait_for_file(&pid_file);
    let pids = [
        std::fs::read_to_string(&pid_file).unwrap(),
        std::fs::read_to_string(&child_file).unwrap(),
    ];
    assert!(pids.iter().all(|pid| alive(pid)));
    fencepost.kill().unwrap();
    fencepost.wait().unwrap();
    for pid in &pids {
        assert!(gone_within(pid, 5), "process {} outlived fencepost", pid.trim());
    }
}

/// A command's arguments need not be UTF-8 (a file name in Latin-1): they reach the command byte
/// for byte, and the run commits; a `--salt` that is not UTF-8 is a usage error (exit 2), and
/// nothing runs. (`std::env::args` made fencepost panic on either, exit 101.)
#[test]
fn cli_arguments_that_are_not_utf8_reach_the_command_or_are_a_usage_error_never_a_panic() {
    use std::os::unix::ffi::OsStrExt as _;
    let shared = Shared::sqlite();
    let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let output = shared
        .command("host-1", &run_args("a", "1", &[], &["printf", "%s"]))
        .arg(latin1)
        .output()
        .unwrap();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert_eq!(
        output.stdout, b"caf\xe9",
        "the argument reached the command byte for byte"
    );
    let mut args = run_args("a", "2", &[], &["sh", "-c", "echo ran >> effects"]);
    let salt = args.iter().position(|arg| *arg == "2").unwrap();
    args.remove(salt);
    let mut command = shared.command("host-1", &args[..salt]);
    command
        .arg(latin1)
        .args(&args[salt..])
        .current_dir(shared.path("."));
    let output = command.output().unwrap();
    assert_eq!(code(&output), 2, "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("UTF-8"), "{}", text(&output.stderr));
    assert!(!shared.path("effects").exists(), "nothing ran");
}

/// A process, as `ps` shows it.
#[derive(Debug, Clone)]
struct Process {
    pid: String,
    parent: String,
    name: String,
    group: String,
    /// Its arguments, joined by spaces.
    command_line: String,
}

/// Every process of this machine (`/proc`).
fn processes() -> Vec<Process> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let pid = entry.ok()?.file_name().to_str()?.to_owned();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // pid (name) state ppid pgrp ...
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let fields: Vec<&str> = rest.split(' ').collect();
            let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some(Process {
                parent: fields.get(1)?.to_string(),
                group: fields.get(2)?.to_string(),
                name: name.to_owned(),
                command_line: String::from_utf8_lossy(&command_line).replace('\0', " "),
                pid,
            })
        })
        .collect()
}

/// The watchdog (a fork of fencepost that kills the command's group if fencepost dies) holds
/// nothing of fencepost's but its pipe: not its output (a reader of `fencepost run | …` would
/// wait for the watchdog), not its files and their locks. It has a process group and a name of
/// its own, and a command line of its own: an operator's `pkill -9 -f 'fencepost run'` kills
/// fencepost, not the watchdog, which then kills what the command started (with the watchdog's
/// command line fencepost's, both died at once and the command's children lived on, 6 times in 20).
#[test]
fn keeper_the_watchdog_holds_only_its_pipe_and_outlives_a_pkill_of_fencepost_run() {
    let shared = Shared::sqlite();
    let pid_file = shared.path("command.pid");
    let child_file = shared.path("child.pid");
    let script = format!(
        "sleep 30 & echo $! > '{child}'; echo $$ > '{pid}.tmp'; mv '{pid}.tmp' '{pid}'; wait",
        child = child_file.display(),
        pid = pid_file.display()
    );
    let mut fencepost = shared.spawn("host-1", &run_args("a", "1", &[], &["sh", "-c", &script]));
    wait_for_file(&pid_file);
    let command = std::fs::read_to_string(&pid_file).unwrap();
    let background = std::fs::read_to_string(&child_file).unwrap();
    let parent = fencepost.id().to_string();
    let children: Vec<Process> = processes()
        .into_iter()
        .filter(|each| each.parent == parent)
        .collect();
    let watchdogs: Vec<&Process> = children
        .iter()
        .filter(|child| child.pid != command.trim())
        .collect();
    assert_eq!(watchdogs.len(), 1, "fencepost's children: {children:?}");
    let watchdog = watchdogs[0];
    let pid = watchdog.pid.clone();
    assert_eq!(watchdog.name, "fp-watchdog", "the watchdog is named apart");
    assert_eq!(
        watchdog.command_line.trim(),
        "fp-watchdog",
        "its command line is its own"
    );
    assert_eq!(watchdog.group, pid, "the watchdog has a process group of its own");
    let open: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        open,
        ["0"],
        "the watchdog holds its pipe only, not fencepost's descriptors"
    );
    // `pkill -9 -f <this run's command line>`: every process whose command line holds it
    // (fencepost's, the command's), found as pkill finds them.
    let marker = pid_file.display().to_string();
    let matching: Vec<String> = processes()
        .into_iter()
        .filter(|each| each.command_line.contains(&marker))
        .map(|each| each.pid)
        .collect();
    assert!(matching.contains(&fencepost.id().to_string()), "{matching:?}");
    assert!(
        !matching.contains(&pid),
        "the watchdog's command line is not fencepost's"
    );
    let _ = Command::new("kill").arg("-KILL").args(&matching).status();
    fencepost.wait().unwrap();
    assert!(
        gone_within(&background, 5),
        "the command's background child outlived fencepost"
    );
    assert!(gone_within(&command, 5), "the command outlived fencepost");
}

/// A fencepost killed the moment its command starts (here by the command itself) still takes
/// the command's whole group with it: the watchdog starts before the command, and the command's
/// own process tells it its group before it runs the program. (The watchdog used to start after
/// the command: a SIGKILL in between left the command's children alive, 10 times in 30.)
#[test]
fn keeper_a_fencepost_killed_as_its_command_starts_takes_the_command_group_with_it() {
    let shared = Shared::sqlite();
    let marks = shared.path("marks");
    const ATTEMPTS: usize = 12;
    for attempt in 0..ATTEMPTS {
        let script = format!(
            "(sleep 2; echo late >> '{marks}') & kill -KILL $PPID; sleep 30",
            marks = marks.display()
        );
        // An agent each: the killed fencepost's lease stays until its TTL.
        let agent = format!("a{attempt}");
        let mut fencepost = shared.spawn("host-1", &run_args(&agent, "1", &[], &["sh", "-c", &script]));
        let status = fencepost.wait().unwrap();
        assert_eq!(status.code(), None, "fencepost was killed");
    }
    std::thread::sleep(Duration::from_millis(2_500));
    let late = std::fs::read_to_string(&marks).unwrap_or_default();
    assert_eq!(
        late.lines().count(),
        0,
        "the command's background child outlived fencepost in some of {ATTEMPTS} attempts"
    );
}

/// What a command leaves running in its process group when it exits is stopped too: it would
/// act after the outcome was recorded and the lease released.
#[test]
fn keeper_what_the_command_leaves_behind_is_stopped_when_it_exits() {
    let shared = Shared::sqlite();
    let child_file = shared.path("child.pid");
    let script = format!("sleep 30 & echo $! > '{}'; exit 0", child_file.display());
    let output = shared.run("host-1", &run_args("a", "1", &[], &["sh", "-c", &script]));
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    let pid = std::fs::read_to_string(&child_file).unwrap();
    assert!(gone_within(&pid, 2), "the background child outlived the run");
}

/// `--timeout` stops a command (SIGTERM, then SIGKILL after `--kill-after` if it ignores it);
/// fencepost exits 1, says it timed out, and the run is in doubt.
#[test]
fn keeper_timeout_stops_the_command_and_leaves_the_run_in_doubt() {
    let shared = Shared::sqlite();
    let started = Instant::now();
    let output = shared.run(
        "host-1",
        &run_args(
            "a",
            "1",
            &["--timeout", "1s", "--kill-after", "1s"],
            &["sh", "-c", "trap '' TERM; sleep 30"],
        ),
    );
    assert_eq!(code(&output), 1, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("timed out"),
        "{}",
        text(&output.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("in-doubt"), "{runs}");
}

/// F7, L5: a forged intent with an epoch beyond what any coordinator stores is malformed: it is
/// reported by `verify` and does not brick the agent.
#[test]
fn f7_a_forged_epoch_beyond_the_range_does_not_brick_the_agent() {
    let shared = Shared::sqlite();
    let relay = FsRelay::open(shared.path("ledger")).unwrap();
    let mut forger = DeviceLog::new("forger", ManualClock::new(1_000).wall_clock()).unwrap();
    let forged = forger.append(
        Surface::Intent,
        json!({"id": "run-x", "agent_id": "a", "epoch": 1u64 << 63, "status": "pending"}),
    );
    relay.push(&[forged]).unwrap();
    for salt in ["1", "2"] {
        let ran = shared.run("host-1", &run_args("a", salt, &[], &["true"]));
        assert_eq!(code(&ran), 0, "{}", text(&ran.stderr));
    }
    let verify = shared.run("host-1", &["ledger", "verify"]);
    assert_eq!(code(&verify), 1);
    assert!(
        text(&verify.stdout).contains("malformed"),
        "{}",
        text(&verify.stdout)
    );
}

/// C1: a device log whose last record carries the largest HLC stamp is an error that names the
/// record, not a panic.
#[test]
fn c1_a_log_ending_in_the_largest_hlc_stamp_is_an_error_not_a_panic() {
    let shared = Shared::sqlite();
    let relay = FsRelay::open(shared.path("ledger")).unwrap();
    let mut op = OpRecord {
        op_id: OpId([0; 32]),
        hlc: Hlc {
            wall_ms: u64::MAX,
            counter: u32::MAX,
            device_id: "host-1".into(),
        },
        device_id: "host-1".into(),
        seq: 0,
        prev: None,
        surface: Surface::log("note"),
        payload: fencepost::oplog::Payload::new(json!({"text": "the end of time"})),
    };
    op.op_id = op.content_id();
    relay.push(std::slice::from_ref(&op)).unwrap();
    let output = shared.run("host-1", &run_args("a", "1", &[], &["true"]));
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    let message = text(&output.stderr);
    assert!(
        message.contains("largest") && message.contains("seq 0"),
        "{message}"
    );
}

/// The `--wait` rule: when some attempt reached the coordinator and was refused, running out of
/// time is exit 4 (not obtained), naming the last error too; exit 10 only when no attempt did.
#[test]
fn wait_exit_4_when_the_lease_was_held_even_if_the_last_attempt_failed() {
    let shared = Shared::sqlite();
    let held = shared.run("host-1", &["lease", "acquire", "--agent", "a", "--ttl", "60s"]);
    assert_eq!(code(&held), 0, "{}", text(&held.stderr));
    let database = shared.coordinator.strip_prefix("sqlite:").unwrap().to_owned();
    let locked = shared.path("locked");
    // After the first refusals, the coordinator's database becomes unusable (another process
    // holds its write lock past the busy timeout) until the wait has run out.
    let script = format!(
        "import sqlite3, time, pathlib\n\
         time.sleep(1.5)\n\
         c = sqlite3.connect({database:?}, isolation_level=None)\n\
         c.execute('BEGIN EXCLUSIVE')\n\
         pathlib.Path({locked:?}).touch()\n\
         time.sleep(14)\n",
        locked = locked.display().to_string()
    );
    let mut blocker = Command::new("python3").args(["-c", &script]).spawn().unwrap();
    let output = shared.run("host-2", &run_args("a", "1", &["--wait", "7s"], &["true"]));
    let _ = blocker.kill();
    let _ = blocker.wait();
    assert!(locked.exists(), "the database was locked during the wait");
    assert_eq!(code(&output), 4, "{}", text(&output.stderr));
    let message = text(&output.stderr);
    assert!(
        message.contains("held by \"host-1\"") && message.contains("last attempt"),
        "{message}"
    );
    // Never reached at all: exit 10.
    let mut unreachable = shared.command("host-2", &run_args("a", "2", &["--wait", "1s"], &["true"]));
    unreachable.env(
        "FENCEPOST_COORDINATOR",
        "postgres://fencepost@127.0.0.1:1/none?connect_timeout=1",
    );
    assert_eq!(code(&unreachable.output().unwrap()), 10);
}

/// `fencepost ARGS` as `device`, its wall clock shifted by `offset` with libfaketime (an NTP step
/// or a VM resume); the boot-time clock is left alone, as such a step leaves it.
fn shifted(shared: &Shared, device: &str, offset: &str, args: &[&str]) -> Output {
    let command = shared.command(device, args);
    let program = command.get_program().to_owned();
    let mut faked = Command::new("faketime");
    faked
        .args(["-f", offset])
        .arg(program)
        .args(command.get_args())
        .envs(command.get_envs().filter_map(|(key, value)| Some((key, value?))))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    faked
        .output()
        .expect("faketime is needed (scripts/test installs it): apt-get install faketime")
}

/// L1 on one host: the SQLite coordinator measures expiry on the boot-time clock, so a process
/// whose wall clock jumped an hour ahead cannot take a live lease, and a lease granted while the
/// wall clock was an hour behind is not kept for an hour.
#[test]
#[ignore = "needs libfaketime: scripts/test installs it and runs this"]
fn l1_sqlite_expiry_ignores_wall_clock_steps() {
    let shared = Shared::sqlite();
    let held = shared.run("host-1", &["lease", "acquire", "--agent", "a", "--ttl", "30s"]);
    assert_eq!(code(&held), 0, "{}", text(&held.stderr));
    let ahead = shifted(&shared, "host-2", "+1h", &["lease", "acquire", "--agent", "a"]);
    assert_eq!(
        code(&ahead),
        4,
        "a wall clock an hour ahead took a live lease: {}",
        text(&ahead.stdout)
    );
    let run = shifted(&shared, "host-3", "+1d", &run_args("a", "1", &[], &["true"]));
    assert_eq!(code(&run), 4, "{}", text(&run.stderr));

    let behind = shifted(
        &shared,
        "host-2",
        "-1h",
        &["lease", "acquire", "--agent", "b", "--ttl", "1s"],
    );
    assert_eq!(code(&behind), 0, "{}", text(&behind.stderr));
    std::thread::sleep(Duration::from_millis(1_200));
    let next = shared.run("host-1", &["lease", "acquire", "--agent", "b"]);
    assert_eq!(
        code(&next),
        0,
        "a lease granted an hour behind was kept: {}",
        text(&next.stderr)
    );
}

/// L5: `lease acquire` raises the coordinator's epoch floor from the ledger, as `run` does, so a
/// new (or reset) coordinator never grants an epoch the ledger has seen.
#[test]
fn l5_lease_acquire_raises_the_epoch_floor_from_the_ledger() {
    let shared = Shared::sqlite();
    let relay = FsRelay::open(shared.path("ledger")).unwrap();
    let mut other = DeviceLog::new("elsewhere", ManualClock::new(1_000).wall_clock()).unwrap();
    let committed = other.append(
        Surface::Intent,
        // Above the wall clock in ms, which the epoch clock would mint above anyway.
        json!({"id": "run-old", "agent_id": "a", "epoch": 10_000_000_000_005u64, "status": "committed"}),
    );
    relay.push(&[committed]).unwrap();
    let acquired = shared.run("host-1", &["lease", "acquire", "--agent", "a", "--json"]);
    assert_eq!(code(&acquired), 0, "{}", text(&acquired.stderr));
    let lease: serde_json::Value = serde_json::from_slice(&acquired.stdout).unwrap();
    assert_eq!(lease["epoch"], 10_000_000_000_006u64, "{lease}");
}

/// R1, D2: an outcome that cannot be written for a cause that does not pass (a damaged device
/// file) is never dropped: fencepost says so, exits 10, and queues it on the host; the run is in
/// doubt elsewhere (its `pending` is in the ledger) until `ledger flush` writes it after the
/// repair.
#[test]
fn r1_an_outcome_that_cannot_be_written_is_reported_and_the_run_stays_in_doubt() {
    let shared = Shared::sqlite();
    let file = device_file(&shared, "host-1");
    // The command replaces the device's file with a folder: the outcome cannot be appended.
    let script = format!(
        "cp '{file}' '{file}.saved' && rm '{file}' && mkdir '{file}'",
        file = file.display()
    );
    let output = shared.run("host-1", &run_args("a", "1", &[], &["sh", "-c", &script]));
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    let message = text(&output.stderr);
    assert!(
        message.contains("could not be written") && message.contains("in doubt"),
        "{message}"
    );
    // Put the file back: the run is in doubt, not lost, and not run again without a decision.
    std::fs::remove_dir(&file).unwrap();
    std::fs::rename(format!("{}.saved", file.display()), &file).unwrap();
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("in-doubt"), "{runs}");
    let again = shared.run("host-2", &run_args("a", "1", &[], &["true"]));
    assert_eq!(code(&again), 5, "{}", text(&again.stderr));
    assert!(message.contains("queued on this host"), "{message}");
    let flushed = shared.run("host-1", &["ledger", "flush"]);
    assert_eq!(code(&flushed), 0, "{}", text(&flushed.stderr));
    let again = shared.run("host-2", &run_args("a", "1", &[], &["true"]));
    assert_eq!(code(&again), 3, "committed once written: {}", text(&again.stderr));
}

/// D2: a command killed by a signal fencepost did not send (an operator's `kill -9`, the OOM
/// killer) did not finish and may have done part of its effect: the run is in doubt, not failed.
#[test]
fn d2_a_command_killed_from_outside_leaves_the_run_in_doubt() {
    let shared = Shared::sqlite();
    let output = command_killed_from_outside(&shared);
    assert_eq!(code(&output), 1, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("in doubt"),
        "{}",
        text(&output.stderr)
    );
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("in-doubt"), "{runs}");
}

/// R1: a device file replaced by an older copy (a VM snapshot restored with its host's memory)
/// stays damage for a host that saw the newer records, even once the file has grown back past
/// what that host saw; no run recorded only in the lost records runs again.
#[test]
fn r1_a_replaced_device_file_stays_damage_after_it_grows_back() {
    let shared = Shared::sqlite();
    let effect = append_effect(&shared, "ran");
    let run_as = |agent: &str, device: &str, intent: &str| {
        shared.run(
            device,
            &[
                "run", "--agent", agent, "--intent", intent, "--salt", "s", "--", "sh", "-c", &effect,
            ],
        )
    };
    let run = |device: &str, intent: &str| run_as("a", device, intent);
    assert_eq!(code(&run("host-1", "x")), 0);
    let file = device_file(&shared, "host-1");
    let seen = seen_file(&shared, "host-1", "");
    // The VM's snapshot: the device file and host-1's memory (its seen file and its snapshot of
    // the ledger, with SQLite's files beside it).
    let memory_files = || -> Vec<std::path::PathBuf> {
        let folder = shared.path("data").join("fencepost").join("snapshots");
        let mut files: Vec<_> = std::fs::read_dir(folder)
            .unwrap()
            .map(|item| item.unwrap().path())
            .filter(|path| path.to_string_lossy().contains("host-1"))
            .collect();
        files.extend([file.clone(), seen.clone()]);
        files
    };
    let vm_snapshot: Vec<(std::path::PathBuf, Vec<u8>)> = memory_files()
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    assert_eq!(code(&run("host-1", "y")), 0);
    assert_eq!(code(&run("host-2", "other")), 0, "host-2 has seen y");
    for path in memory_files() {
        std::fs::remove_file(path).unwrap();
    }
    for (path, bytes) in &vm_snapshot {
        std::fs::write(path, bytes).unwrap();
    }
    assert_eq!(code(&run("host-2", "y")), 10, "the file shrank");
    // host-1 remembers nothing newer, but the coordinator does: agent a's holders published
    // host-1's lost records (rule H3), so host-1 runs nothing of a on what is left.
    let stopped = run("host-1", "z");
    assert_eq!(code(&stopped), 7, "{}", text(&stopped.stderr));
    assert!(
        text(&stopped.stderr).contains("host-1 records 2..=3"),
        "{}",
        text(&stopped.stderr)
    );
    // Another agent's run grows the file back past what host-2 saw, with other records.
    assert_eq!(code(&run_as("b", "host-1", "z")), 0, "nothing of b was published");
    let again = run("host-2", "y");
    assert_eq!(code(&again), 10, "y ran again: {}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("replaced"),
        "{}",
        text(&again.stderr)
    );
    let ys = shared.effects().len();
    assert_eq!(ys, 4, "x, y, other, z: {:?}", shared.effects());
}

/// Exit statuses are kept when standard output or error is a closed pipe (`… | head`): no panic.
#[test]
fn exit_statuses_survive_a_closed_pipe() {
    let shared = Shared::sqlite();
    let closed = || {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        std::process::Stdio::from(write)
    };
    let mut first = shared.command("host-1", &run_args("a", "1", &[], &["true"]));
    first.stdout(closed()).stderr(closed());
    assert_eq!(code(&first.output().unwrap()), 0);
    for (args, expected) in [
        (run_args("a", "1", &[], &["true"]), 3),
        (run_args("a", "2", &[], &["sh", "-c", "exit 1"]), 1),
        (vec!["ledger", "runs"], 0),
        (vec!["ledger", "show"], 0),
        (vec!["lease", "list"], 0),
    ] {
        let mut command = shared.command("host-1", &args);
        command.stdout(closed()).stderr(closed());
        assert_eq!(code(&command.output().unwrap()), expected, "{args:?}");
    }
}

/// R1: a FIFO (or a dangling symbolic link) where a device log should be is damage, reported at
/// once; nothing blocks on it.
#[test]
fn r1_a_fifo_or_a_dangling_link_in_the_ledger_is_damage_not_a_hang() {
    for (what, make) in [("a FIFO", "mkfifo"), ("a dangling link", "ln -s /nonexistent")] {
        let shared = Shared::sqlite();
        let file = device_file(&shared, "host-7");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let status = Command::new("sh")
            .args(["-c", &format!("{make} '{}'", file.display())])
            .status()
            .unwrap();
        assert!(status.success());
        for (args, expected) in [
            (run_args("a", "1", &[], &["true"]), 10),
            (vec!["ledger", "verify"], 1),
        ] {
            let mut child = shared.spawn("host-1", &args);
            let status = exit_within(&mut child, 10, &format!("{what}: {args:?}"));
            assert_eq!(status.code(), Some(expected), "{what}: {args:?}");
        }
    }
}

/// A process stopped while it holds the seen file's lock does not stall the other processes of
/// its device: they skip that update after a moment.
#[test]
fn r1_a_stopped_holder_of_the_seen_files_lock_stalls_nobody() {
    let shared = Shared::sqlite();
    assert_eq!(
        code(&shared.run("host-1", &run_args("a", "1", &[], &["true"]))),
        0
    );
    let lock = seen_file(&shared, "host-1", ".lock");
    let holding = shared.path("holding");
    let script = format!(
        "import fcntl, pathlib, time\n\
         f = open({lock:?}, 'w')\n\
         fcntl.flock(f, fcntl.LOCK_EX)\n\
         pathlib.Path({holding:?}).touch()\n\
         time.sleep(20)\n",
        lock = lock.display().to_string(),
        holding = holding.display().to_string()
    );
    let mut holder = Command::new("python3").args(["-c", &script]).spawn().unwrap();
    wait_for_file(&holding);
    let started = Instant::now();
    let output = shared.run("host-1", &run_args("a", "2", &[], &["true"]));
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stalled {:?}",
        started.elapsed()
    );
}

/// `--wait` covers raising the epoch floor too: a coordinator busy for a while (its database
/// locked by another process past the busy timeout) is waited for, not an error.
#[test]
fn wait_covers_a_busy_coordinator_before_the_first_acquire() {
    let shared = Shared::sqlite();
    // A ledger epoch, so the floor must be raised before acquiring.
    assert_eq!(
        code(&shared.run("host-1", &run_args("a", "1", &[], &["true"]))),
        0
    );
    let database = shared.coordinator.strip_prefix("sqlite:").unwrap().to_owned();
    let locked = shared.path("locked");
    let script = format!(
        "import sqlite3, time, pathlib\n\
         c = sqlite3.connect({database:?}, isolation_level=None)\n\
         c.execute('BEGIN EXCLUSIVE')\n\
         pathlib.Path({locked:?}).touch()\n\
         time.sleep(6)\n\
         c.execute('COMMIT')\n",
        locked = locked.display().to_string()
    );
    let mut blocker = Command::new("python3").args(["-c", &script]).spawn().unwrap();
    wait_for_file(&locked);
    let output = shared.run("host-1", &run_args("a", "2", &["--wait", "20s"], &["true"]));
    let _ = blocker.wait();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
}

/// A lease lost while fencepost was paused, noticed only at the release (the command had already
/// finished), is said on stderr; the command's own outcome is recorded.
#[test]
fn keeper_a_loss_noticed_only_at_release_is_reported() {
    let shared = Shared::sqlite();
    let started = shared.path("started");
    // The command outlasts the test's reaction to `started` (even on a loaded machine), so the
    // stop comes while it runs; the stop outlasts the command and the lease's TTL.
    let script = format!("touch '{}'; sleep 1", started.display());
    let child = shared.spawn(
        "host-1",
        &run_args("a", "1", &["--ttl", "1s"], &["sh", "-c", &script]),
    );
    wait_for_file(&started);
    signal(child.id(), "STOP");
    std::thread::sleep(Duration::from_millis(2_500)); // the command ends; the lease runs out
    signal(child.id(), "CONT");
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    let message = text(&output.stderr);
    assert!(message.contains("lost before it could be released"), "{message}");
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("committed"), "{runs}");
}

/// A stderr that nobody reads (a full pipe) never delays stopping the command: `--timeout` (and
/// a lost lease) act on time, whatever fencepost has to log.
#[test]
fn keeper_a_full_stderr_pipe_never_delays_a_stop() {
    let shared = Shared::sqlite();
    let pid_file = shared.path("command.pid");
    let script = format!(
        "echo $$ > '{pid}.tmp'; mv '{pid}.tmp' '{pid}'; head -c 65536 /dev/zero >&2; exec sleep 12",
        pid = pid_file.display()
    );
    let (read, write) = nix::unistd::pipe().unwrap();
    let write_again = write.try_clone().unwrap();
    let mut command = shared.command(
        "host-1",
        &run_args(
            "a",
            "1",
            &["--timeout", "1s", "--kill-after", "1s"],
            &["sh", "-c", &script],
        ),
    );
    command
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::from(write_again));
    let mut child = command.spawn().unwrap();
    drop(command); // our copies of the write end
    wait_for_file(&pid_file);
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let stopped = gone_within(&pid, 5);
    // Now read the pipe, so that fencepost can write its last words and exit.
    let drain = std::thread::spawn(move || {
        use std::io::Read;
        let mut sink = Vec::new();
        let _ = std::fs::File::from(read).read_to_end(&mut sink);
    });
    let status = child.wait().unwrap();
    drain.join().unwrap();
    assert!(stopped, "the timeout waited for the stderr pipe");
    assert_eq!(status.code(), Some(1));
}

/// A relative ledger path names another folder in each working directory: a usage error, like a
/// relative coordinator path; `~/` in the config file is the home folder.
#[test]
fn r1_a_relative_ledger_path_is_refused_and_home_is_expanded() {
    let shared = Shared::sqlite();
    for ledger in ["ledger", "./ledger"] {
        let mut command = shared.command("host-1", &run_args("a", "1", &[], &["true"]));
        command
            .env("FENCEPOST_LEDGER", ledger)
            .current_dir(shared.folder.path());
        let output = command.output().unwrap();
        assert_eq!(code(&output), 2, "{ledger}: {}", text(&output.stderr));
        assert!(
            text(&output.stderr).contains("absolute"),
            "{}",
            text(&output.stderr)
        );
    }
    // HOME is the shared folder in these tests.
    let config = shared.path("config").join("fencepost");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.toml"), "ledger = \"~/ledger\"\n").unwrap();
    let mut command = shared.command("host-1", &run_args("a", "1", &[], &["true"]));
    command.env_remove("FENCEPOST_LEDGER");
    let output = command.output().unwrap();
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    assert!(
        device_file(&shared, "host-1").exists(),
        "~/ledger is the shared ledger"
    );
}

/// R1: the memory of what this host saw is never dropped silently: a damaged seen file stops the
/// run (exit 10, naming it); `--accept-damaged` of a device with no damage is a usage error.
#[test]
fn r1_a_damaged_seen_file_stops_the_run_and_accepting_nothing_is_refused() {
    let shared = Shared::sqlite();
    assert_eq!(
        code(&shared.run("host-1", &run_args("a", "1", &[], &["true"]))),
        0
    );
    let nothing = shared.run(
        "host-1",
        &run_args("a", "2", &["--accept-damaged", "nosuch"], &["true"]),
    );
    assert_eq!(code(&nothing), 2, "{}", text(&nothing.stderr));
    let seen = seen_file(&shared, "host-1", "");
    std::fs::write(&seen, "not json{").unwrap();
    let output = shared.run("host-1", &run_args("a", "2", &[], &["true"]));
    assert_eq!(code(&output), 10, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("damaged"),
        "{}",
        text(&output.stderr)
    );
    std::fs::remove_file(&seen).unwrap();
    assert_eq!(
        code(&shared.run("host-1", &run_args("a", "2", &[], &["true"]))),
        0
    );
}

/// A stderr that nobody reads and that is already full does not keep fencepost from exiting with
/// its status: its last lines are given up after a moment.
#[test]
fn exit_statuses_survive_a_full_stderr_nobody_reads() {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let shared = Shared::sqlite();
    assert_eq!(
        code(&shared.run("host-1", &run_args("a", "1", &[], &["true"]))),
        0
    );
    let (read, write) = nix::unistd::pipe().unwrap();
    fcntl(&write, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    let mut file = std::fs::File::from(write.try_clone().unwrap());
    while std::io::Write::write(&mut file, &[b'x'; 4096]).is_ok() {}
    fcntl(&write, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    let mut command = shared.command("host-1", &run_args("a", "1", &[], &["true"]));
    command.stderr(std::process::Stdio::from(write));
    let mut child = command.spawn().unwrap();
    drop(command);
    let status = exit_within(&mut child, 10, "fencepost with a full stderr");
    drop(read);
    assert_eq!(status.code(), Some(3), "already committed");
}

/// L5: a coordinator that loses its state while a host waits for the lease (restored from an old
/// backup; here its rows are deleted) grants the waiter the epoch the first host still holds: the
/// floor the waiter raised before its first attempt went with that state. The ledger shows the
/// first host's `pending` at that epoch, so the waiter gives the lease back and acquires again
/// above it: no two commands ever run under one fencing token.
#[test]
fn l5_a_coordinator_that_loses_its_state_during_a_wait_never_grants_one_token_twice() {
    coordinator_loss_during_a_wait("host-p", "host-w");
}

/// L5, as above with two processes sharing one device id (two cron lines on one host): the
/// first one's `pending` at the epoch is this device id's own, and the fresh grant must still be
/// above it.
#[test]
fn l5_a_coordinator_that_loses_its_state_never_grants_one_token_twice_to_one_device_id() {
    coordinator_loss_during_a_wait("host-d", "host-d");
}

/// A host runs a long command; another waits for the lease; the coordinator loses its rows; the
/// waiter must run under an epoch of its own (F + 2), never the first host's (F + 1). The floor F
/// is far above the wall clock, as epochs are after the clock was set back behind them: the
/// epoch clock alone (rule L5, `SqliteConfig::epoch_clock`) would mint above the lost epochs.
fn coordinator_loss_during_a_wait(first_device: &str, second_device: &str) {
    let shared = Shared::sqlite();
    const F: u64 = 10_000_000_000_000;
    fencepost::backend::sqlite::SqliteLeaseCoordinator::open(
        shared.path("leases.db"),
        fencepost::clock::system_clock(),
    )
    .unwrap()
    .raise_epoch_floor(&shared.agent, F)
    .unwrap();
    let first_effect = format!("{}; sleep 8", append_effect(&shared, "p"));
    let mut first = shared.spawn(
        first_device,
        &run_args(&shared.agent, "p", &["--ttl", "3s"], &["sh", "-c", &first_effect]),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while shared.effects().is_empty() {
        assert!(Instant::now() < deadline, "the first command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second_effect = append_effect(&shared, "w");
    let mut second = shared.spawn(
        second_device,
        &run_args(
            &shared.agent,
            "w",
            &["--ttl", "3s", "--wait", "30s"],
            &["sh", "-c", &second_effect],
        ),
    );
    std::thread::sleep(Duration::from_millis(1_500)); // the waiter raised the floor, and waits
    let database = rusqlite::Connection::open(shared.path("leases.db")).unwrap();
    database.busy_timeout(Duration::from_secs(10)).unwrap();
    let forgotten = database.execute("DELETE FROM fencepost_leases", []).unwrap();
    assert_eq!(forgotten, 1, "the coordinator held one lease");
    drop(database);
    let waiter = exit_within(&mut second, 30, "the waiter");
    let stderr = {
        use std::io::Read;
        let mut text = String::new();
        second.stderr.take().unwrap().read_to_string(&mut text).unwrap();
        text
    };
    assert_eq!(waiter.code(), Some(0), "{stderr}");
    assert!(stderr.contains("acquiring again above it"), "{stderr}");
    exit_within(&mut first, 30, "the first host");
    let effects = shared.effects();
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert_eq!(effects[0], format!("p {first_device} {}", F + 1), "{effects:?}");
    assert_eq!(
        effects[1],
        format!("w {second_device} {}", F + 2),
        "one token, one holder: {effects:?}"
    );
}

/// D2: `ledger resolve` settles a run only once it knows the attempt is not still running. When
/// the coordinator cannot say (unreachable, unreadable), it refuses without `--force` instead of
/// recording an outcome for a command that may still be running.
#[test]
fn d2_resolve_refuses_when_the_coordinator_cannot_say_whether_the_attempt_still_runs() {
    let shared = Shared::sqlite();
    assert_eq!(code(&command_killed_from_outside(&shared)), 1);
    let run = fencepost::run_id::deterministic_run_id("a", "job", "1").unwrap();
    let resolve = |force: bool| {
        let mut args = vec![
            "ledger",
            "resolve",
            "--agent",
            "a",
            "--run",
            &run,
            "--as",
            "committed",
        ];
        if force {
            args.push("--force");
        }
        shared
            .command("host-2", &args)
            .env("FENCEPOST_COORDINATOR", "sqlite:/nonexistent/folder/leases.db")
            .output()
            .unwrap()
    };
    let refused = resolve(false);
    assert_eq!(code(&refused), 10, "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("cannot tell whether") && text(&refused.stderr).contains("--force"),
        "{}",
        text(&refused.stderr)
    );
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("in-doubt"), "nothing was recorded: {runs}");
    let forced = resolve(true);
    assert_eq!(code(&forced), 0, "{}", text(&forced.stderr));
    let again = shared.run("host-2", &run_args("a", "1", &[], &["true"]));
    assert_eq!(code(&again), 3, "{}", text(&again.stderr));
}

/// F6: a commit wins over an outcome recorded beside it at its epoch (an operator resolved the
/// run as committed while the paused attempt later recorded `failed`). `run` refuses it (exit 3),
/// and `ledger runs` and `ledger show` say committed too, showing the other outcome, instead of
/// contradicting `run`.
#[test]
fn f6_a_commit_beside_a_failed_of_its_epoch_shows_as_committed_everywhere() {
    let shared = Shared::sqlite();
    let relay = FsRelay::open(shared.path("ledger")).unwrap();
    let run = fencepost::run_id::deterministic_run_id("a", "job", "1").unwrap();
    let intent = |status: &str| json!({"id": run, "agent_id": "a", "epoch": 1, "status": status});
    let mut attempt = DeviceLog::new("host-1", ManualClock::new(1_000).wall_clock()).unwrap();
    let pending = attempt.append(Surface::Intent, intent("pending"));
    let mut operator = DeviceLog::new("host-2", ManualClock::new(2_000).wall_clock()).unwrap();
    let resolved = operator.append(Surface::Intent, intent("committed"));
    // The attempt wakes up later and records its own outcome: the fold's view shows it.
    let late = DeviceLog::resume(
        "host-1",
        ManualClock::new(3_000).wall_clock(),
        fencepost::clock::HlcConfig::default(),
        std::slice::from_ref(&pending),
    )
    .unwrap()
    .append(Surface::Intent, intent("failed"));
    relay.push(&[pending, late, resolved]).unwrap();
    let again = shared.run("host-3", &run_args("a", "1", &[], &["true"]));
    assert_eq!(code(&again), 3, "{}", text(&again.stderr));
    let runs = text(&shared.run("host-3", &["ledger", "runs"]).stdout);
    assert!(
        runs.contains("committed") && runs.contains("by host-2") && runs.contains("(failed@1 also recorded)"),
        "{runs}"
    );
    let show = text(&shared.run("host-3", &["ledger", "show"]).stdout);
    assert!(show.contains("1 committed"), "{show}");
}

/// L8: `ledger resolve` checks its ids like every other command: an empty, over-long or
/// control-character id is a usage error (exit 2), not "not in doubt".
#[test]
fn l8_ledger_resolve_refuses_invalid_ids_as_usage_errors() {
    let shared = Shared::sqlite();
    let long = "r".repeat(300);
    for (agent, run) in [("", "run-1"), ("a", ""), ("a", "run\n1"), ("a", long.as_str())] {
        let output = shared.run(
            "host-1",
            &[
                "ledger", "resolve", "--agent", agent, "--run", run, "--as", "failed",
            ],
        );
        assert_eq!(code(&output), 2, "{agent:?} {run:?}: {}", text(&output.stderr));
    }
}

/// Starts `run` of occurrence (a, 1) on host-1 with the command `sh -c effect` and `extra`
/// arguments, holding the window between the fence and the start open for `pause_ms` (a debug
/// build's test seam); returns once the run is inside that window.
fn paused_before_the_start(
    shared: &Shared,
    extra: &[&str],
    effect: &str,
    pause_ms: u64,
) -> std::process::Child {
    let child = shared
        .command("host-1", &run_args("a", "1", extra, &["sh", "-c", effect]))
        .env("FENCEPOST_TEST_PAUSE_BEFORE_COMMAND_MS", pause_ms.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ledger_file = device_file(shared, "host-1");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&ledger_file)
        .unwrap_or_default()
        .lines()
        .count()
        < 1
    {
        assert!(Instant::now() < deadline, "no pending was written");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300)); // past the fence, inside the pause
    child
}

/// D2: a signal that comes after the fence but before the command starts stops fencepost as the
/// signal says (143 for SIGTERM), as one during the wait does; nothing ran, and the `failed` it
/// records settles the `pending`, so the next run runs it. (The window is held open with a debug
/// build's test seam.)
#[test]
fn d2_a_signal_between_the_fence_and_the_start_exits_as_the_signal_says() {
    let shared = Shared::sqlite();
    let effect = append_effect(&shared, "ran");
    let child = paused_before_the_start(&shared, &[], &effect, 3_000);
    signal(child.id(), "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), 143, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("did not run"),
        "{}",
        text(&output.stderr)
    );
    assert!(shared.effects().is_empty(), "nothing ran");
    let runs = text(&shared.run("host-2", &["ledger", "runs"]).stdout);
    assert!(runs.contains("failed"), "{runs}");
    let again = shared.run("host-2", &run_args("a", "1", &[], &["sh", "-c", &effect]));
    assert_eq!(code(&again), 0, "{}", text(&again.stderr));
    assert_eq!(shared.effects().len(), 1);
}

/// D1: no command starts once the holder's own timing says the lease is lost. fencepost stopped
/// (SIGSTOP) between the fence and the start for longer than its lease, then resumed, does not
/// start the command: it records `failed` (so the next run runs it) and exits 6. It used to start
/// the command anyway, and with a lagging ledger another host had run it meanwhile. (The window is
/// held open with a debug build's test seam.)
#[test]
fn d1_a_holder_stopped_past_its_lease_before_the_start_does_not_start_the_command() {
    let shared = Shared::sqlite();
    let effect = append_effect(&shared, "ran");
    let child = paused_before_the_start(&shared, &["--ttl", "1s"], &effect, 4_000);
    signal(child.id(), "STOP");
    std::thread::sleep(Duration::from_millis(2_500)); // past the 1 s lease and its renew deadline
    signal(child.id(), "CONT");
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), 6, "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("did not run"),
        "{}",
        text(&output.stderr)
    );
    assert!(
        shared.effects().is_empty(),
        "the command started after the lease was lost"
    );
    let again = shared.run("host-2", &run_args("a", "1", &[], &["sh", "-c", &effect]));
    assert_eq!(code(&again), 0, "{}", text(&again.stderr));
    assert_eq!(shared.effects().len(), 1);
}

/// Waits (at most 20 s) until `lease current` of agent "a" names `device` as its holder.
fn wait_for_holder(shared: &Shared, device: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text(&shared.run("host-3", &["lease", "current", "--agent", "a"]).stdout)
        .contains(&format!("held by {device}"))
    {
        assert!(Instant::now() < deadline, "{device} never took the lease");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// L3: a signal that comes while the lease is being granted ends fencepost as the signal says
/// (143 for SIGTERM) only after it gave the lease back, so the next host takes it at once. It
/// used to come before fencepost caught signals, which ended it holding the lease for the whole
/// --ttl: every other host was refused (exit 4) until then. (The window just after the grant is
/// held open with a debug build's test seam.)
#[test]
fn l3_a_signal_while_the_lease_is_granted_ends_fencepost_after_it_gave_the_lease_back() {
    let shared = Shared::sqlite();
    let effect = append_effect(&shared, "ran");
    let child = shared
        .command(
            "host-1",
            &run_args("a", "1", &["--ttl", "120s"], &["sh", "-c", &effect]),
        )
        .env("FENCEPOST_TEST_PAUSE_AFTER_ACQUIRE_MS", "3000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_holder(&shared, "host-1");
    signal(child.id(), "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), 143, "{}", text(&output.stderr));
    // Said as what it was (an adversarial test of the run session found it said "while waiting
    // for the ledger" when the grant's check had moved before the window).
    assert!(
        text(&output.stderr)
            .contains("got SIGTERM while the lease of a was being granted; it was given back"),
        "{}",
        text(&output.stderr)
    );
    assert!(shared.effects().is_empty(), "nothing ran");
    let current = text(&shared.run("host-3", &["lease", "current", "--agent", "a"]).stdout);
    assert!(current.contains("not held"), "released: {current}");
    let again = shared.run("host-2", &run_args("a", "1", &[], &["sh", "-c", &effect]));
    assert_eq!(code(&again), 0, "{}", text(&again.stderr));
    assert_eq!(shared.effects().len(), 1);
}

/// L3: a signal that comes while fencepost waits for a lease another host holds (`--wait`) ends
/// the wait at once, as the signal says (143 for SIGTERM): it takes nothing, runs nothing, and
/// the holder keeps its lease.
#[test]
fn l3_a_signal_during_a_wait_for_the_lease_ends_the_wait_and_takes_nothing() {
    let shared = Shared::sqlite();
    let started = shared.path("started");
    let holding = format!("touch '{}'; sleep 5", started.display());
    let mut holder = shared.spawn("host-1", &run_args("a", "1", &[], &["sh", "-c", &holding]));
    wait_for_file(&started);
    let effect = append_effect(&shared, "ran");
    let mut waiting = shared
        .command(
            "host-2",
            &run_args("a", "2", &["--wait", "60s"], &["sh", "-c", &effect]),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800)); // refused, waiting
    let sent = Instant::now();
    signal(waiting.id(), "TERM");
    let status = exit_within(&mut waiting, 3, "a waiting run after SIGTERM");
    assert!(sent.elapsed() < Duration::from_secs(2), "{:?}", sent.elapsed());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut waiting.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("while waiting for the lease"), "{stderr}");
    assert!(shared.effects().is_empty(), "nothing ran");
    let current = text(&shared.run("host-3", &["lease", "current", "--agent", "a"]).stdout);
    assert!(current.contains("held by host-1"), "{current}");
    assert!(holder.wait().unwrap().success());
}
