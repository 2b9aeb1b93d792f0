//! The hand-off (rules H2 and H3) through the built binary: two hosts share a coordinator, but
//! each has a ledger folder of its own that the test syncs by copying files, as a synced folder
//! that lags would. The second host must wait (exit 7) while its ledger lacks what the first one
//! published, and never run the occurrence a second time.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{kill_mid_command, text, Shared};
use fencepost::relay::device_file_name;

/// Host `device`, with a ledger folder and a data directory of its own.
fn host(shared: &Shared, device: &str, args: &[&str]) -> Command {
    let mut command = shared.command(device, args);
    command
        .env("FENCEPOST_LEDGER", ledger_of(shared, device))
        .env("XDG_DATA_HOME", shared.path(&format!("data-{device}")));
    command
}

fn ledger_of(shared: &Shared, device: &str) -> PathBuf {
    let folder = shared.path(&format!("ledger-{device}"));
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

fn run_as(shared: &Shared, device: &str, args: &[&str]) -> Output {
    host(shared, device, args).output().unwrap()
}

/// What the sync does: copies `from`'s device file into `to`'s ledger folder.
fn sync(shared: &Shared, from: &str, to: &str) {
    copy_device_file(&ledger_of(shared, from), &ledger_of(shared, to), from);
}

fn copy_device_file(from_ledger: &Path, to_ledger: &Path, device: &str) {
    let source = from_ledger.join("devices").join(device_file_name(device));
    let target = to_ledger.join("devices").join(device_file_name(device));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::copy(&source, &target)
        .unwrap_or_else(|error| panic!("cannot copy {}: {error}", source.display()));
}

fn report(shared: &Shared, salt: &str, extra: &[&str], sleep: &str) -> Vec<String> {
    shared.report_args(salt, extra, sleep)
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Rule H3 (and H2, the outcome published at the release): the second host's ledger lacks the
/// first host's commit, so it exits 7 and runs nothing; once the file is copied, it finds the
/// run committed (exit 3). The effect ran once.
#[test]
fn h3_a_host_whose_ledger_lacks_the_commit_waits_then_finds_it_committed() {
    let shared = Shared::sqlite();
    let args = report(&shared, "2026-11-30", &[], "0");
    let first = run_as(&shared, "host-1", &strs(&args));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert_eq!(shared.effects().len(), 1);

    let metrics_file = shared.path("host-2.prom");
    let behind = run_as(
        &shared,
        "host-2",
        &strs(&report(
            &shared,
            "2026-11-30",
            &["--wait", "1s", "--metrics-file", metrics_file.to_str().unwrap()],
            "0",
        )),
    );
    let message = text(&behind.stderr);
    assert_eq!(behind.status.code(), Some(7), "{message}");
    assert!(
        message.contains("has not yet received what the previous holder")
            && message.contains("host-1 records 0..=1"),
        "names the device and the records missing: {message}"
    );
    assert_eq!(shared.effects().len(), 1, "nothing ran on a ledger that lags");
    // The wait is counted and timed (issue 18).
    let metrics = std::fs::read_to_string(&metrics_file).unwrap();
    let agent = &shared.agent;
    for line in [
        format!("fencepost_ledger_waits_total{{agent=\"{agent}\"}} 1"),
        format!("fencepost_run_outcome{{agent=\"{agent}\",outcome=\"ledger_behind\"}} 1"),
        format!("fencepost_run_exit_status{{agent=\"{agent}\"}} 7"),
    ] {
        assert!(
            metrics.lines().any(|found| found == line),
            "{line} missing from {metrics}"
        );
    }
    let waited = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(&format!(
                "fencepost_run_duration_seconds{{agent=\"{agent}\",phase=\"wait\"}} "
            ))
        })
        .and_then(|seconds| seconds.parse::<f64>().ok())
        .unwrap();
    assert!(waited >= 0.9, "waited {waited} s of --wait 1s");

    sync(&shared, "host-1", "host-2");
    let after = run_as(&shared, "host-2", &strs(&args));
    assert_eq!(after.status.code(), Some(3), "{}", text(&after.stderr));
    assert_eq!(shared.effects().len(), 1, "the effect ran once");
}

/// Rule H3 (and H2, the `pending` published before the command): the first host is SIGKILLed
/// mid-command, so only its `pending` exists. The second host exits 7 until it has that
/// `pending`, then 5 (in doubt). The effect ran once.
#[test]
fn h3_a_host_whose_ledger_lacks_a_dead_holders_pending_waits_then_finds_it_in_doubt() {
    let shared = Shared::sqlite();
    let salt = "2026-12-01";
    let effect = format!(
        "echo \"$FENCEPOST_DEVICE $FENCEPOST_EPOCH\" >> '{}'",
        shared.path("effects").display()
    );
    let agent = shared.agent.clone();
    let run_args = [
        "run",
        "--agent",
        &agent,
        "--intent",
        "daily report",
        "--salt",
        salt,
        "--ttl",
        "1s",
    ];
    // kill_mid_command runs `fencepost` through `shared.command`; point it at host-1's own ledger.
    let host_1 = Shared {
        folder: tempfile::tempdir_in(shared.folder.path()).unwrap(),
        coordinator: shared.coordinator.clone(),
        agent: agent.clone(),
        database_ledger: false,
        ledger_spec: None,
    };
    std::fs::create_dir_all(host_1.path("ledger")).unwrap();
    kill_mid_command(&host_1, "host-1", &run_args, &effect);
    assert_eq!(
        shared.effects().len(),
        1,
        "the effect happened once, and its host died"
    );
    // host-1's ledger is host_1's folder; the test's sync copies from there.
    copy_device_file(&host_1.path("ledger"), &ledger_of(&shared, "host-1"), "host-1");

    // The dead host's lease ends within its TTL; host-2 gets it, then waits for its ledger.
    let next = report(&shared, salt, &["--wait", "3s"], "0");
    let behind = run_as(&shared, "host-2", &strs(&next));
    let message = text(&behind.stderr);
    assert_eq!(behind.status.code(), Some(7), "{message}");
    assert!(message.contains("host-1 record 0"), "{message}");
    assert_eq!(shared.effects().len(), 1, "nothing ran on a ledger that lags");

    sync(&shared, "host-1", "host-2");
    let after = run_as(&shared, "host-2", &strs(&next));
    let message = text(&after.stderr);
    assert_eq!(after.status.code(), Some(5), "{message}");
    assert!(message.contains("in doubt"), "{message}");
    assert_eq!(shared.effects().len(), 1, "the effect ran once");
}

/// Rule H3: a host that waits with --wait runs as soon as its ledger catches up within it.
#[test]
fn h3_a_waiting_host_proceeds_once_its_ledger_catches_up_within_wait() {
    let shared = Shared::sqlite();
    let first = run_as(&shared, "host-1", &strs(&report(&shared, "a", &[], "0")));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    // Another occurrence: host-2 must have host-1's records before running it.
    let mut waiting = host(
        &shared,
        "host-2",
        &strs(&report(&shared, "b", &["--wait", "20s"], "0")),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "host-2 waits for its ledger"
    );
    sync(&shared, "host-1", "host-2");
    let output = waiting.wait_with_output().unwrap();
    let message = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{message}");
    assert!(message.contains("waiting for this host's ledger"), "{message}");
    assert_eq!(shared.effects().len(), 2, "each occurrence ran once");
}

/// Rule H3's way out: records that will never arrive (the first host's ledger folder was never
/// shared, and is gone) are accepted as lost with --accept-damaged, recorded in the log; only
/// then does the second host run, knowing it may repeat what they recorded.
#[test]
fn h3_records_lost_for_good_are_accepted_explicitly_and_only_then_run_again() {
    let shared = Shared::sqlite();
    let args = report(&shared, "lost", &[], "0");
    assert_eq!(run_as(&shared, "host-1", &strs(&args)).status.code(), Some(0));
    std::fs::remove_dir_all(ledger_of(&shared, "host-1")).unwrap();
    let behind = run_as(&shared, "host-2", &strs(&args));
    let message = text(&behind.stderr);
    assert_eq!(behind.status.code(), Some(7), "{message}");
    assert!(
        message.contains("--accept-damaged"),
        "says the way out: {message}"
    );
    let unknown = run_as(
        &shared,
        "host-2",
        &strs(&report(&shared, "lost", &["--accept-damaged", "host-9"], "0")),
    );
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "nothing of host-9 is missing: {}",
        text(&unknown.stderr)
    );
    let accepted = run_as(
        &shared,
        "host-2",
        &strs(&report(&shared, "lost", &["--accept-damaged", "host-1"], "0")),
    );
    let message = text(&accepted.stderr);
    assert_eq!(accepted.status.code(), Some(0), "{message}");
    assert!(message.contains("are lost"), "{message}");
    assert_eq!(shared.effects().len(), 2, "run again, as the operator accepted");
    let log = std::fs::read_to_string(
        ledger_of(&shared, "host-2")
            .join("devices")
            .join(device_file_name("host-2")),
    )
    .unwrap();
    assert!(
        log.contains("fencepost.accept-missing"),
        "the decision is recorded: {log}"
    );
}

/// Rule H3 (found by an adversarial run): accepting a device's lost records waives only those
/// published when they were accepted. A host that accepted them and then waited for the lease
/// ran an occurrence that the other host ran in the meantime: the acceptance covered the whole
/// device, records published later included.
#[test]
fn h3_accepting_lost_records_waives_only_those_published_by_then() {
    let shared = Shared::sqlite();
    let first = run_as(&shared, "host-1", &strs(&report(&shared, "s0", &[], "0")));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    // A third party holds the lease, so host-2 waits for it after accepting host-1's records.
    let agent = shared.agent.clone();
    let held = run_as(
        &shared,
        "host-3",
        &["lease", "acquire", "--agent", &agent, "--ttl", "60s"],
    );
    assert!(held.status.success(), "{}", text(&held.stderr));
    let waiting = host(
        &shared,
        "host-2",
        &strs(&report(
            &shared,
            "s1",
            &["--accept-damaged", "host-1", "--wait", "3s"],
            "0",
        )),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Once its acceptance is recorded, host-2 is stopped while host-1 runs s1.
    let log = ledger_of(&shared, "host-2")
        .join("devices")
        .join(device_file_name("host-2"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&log).is_ok_and(|text| text.contains("fencepost.accept-missing")) {
        assert!(
            std::time::Instant::now() < deadline,
            "host-2 never recorded its acceptance"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = waiting.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let epoch = text(&run_as(&shared, "host-3", &["lease", "current", "--agent", &agent]).stdout);
    let epoch = epoch
        .split_whitespace()
        .skip_while(|word| *word != "epoch")
        .nth(1)
        .unwrap_or("1")
        .trim_end_matches(',')
        .to_owned();
    let released = run_as(
        &shared,
        "host-3",
        &["lease", "release", "--agent", &agent, "--epoch", &epoch],
    );
    assert!(released.status.success(), "{}", text(&released.stderr));
    let ran = run_as(&shared, "host-1", &strs(&report(&shared, "s1", &[], "0")));
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    let output = waiting.wait_with_output().unwrap();
    let message = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(7),
        "host-1's later records are waited for: {message}"
    );
    let s1 = shared.effects().len();
    assert_eq!(s1, 2, "s0 and s1 once each: {:?}", shared.effects());
}

/// Rule H3 (found by an adversarial run): a host that holds the lease while it waits for its
/// ledger gives the lease back when it is told to stop (SIGTERM): it used to die holding it, so
/// every other host was refused (exit 4) until the TTL ran out.
#[test]
fn h3_a_host_stopped_while_it_waits_for_its_ledger_gives_the_lease_back() {
    let shared = Shared::sqlite();
    let first = run_as(&shared, "host-1", &strs(&report(&shared, "s1", &[], "0")));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let waiting = host(
        &shared,
        "host-2",
        &strs(&report(&shared, "s2", &["--wait", "30s", "--ttl", "30s"], "0")),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let agent = shared.agent.clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !text(&run_as(&shared, "host-3", &["lease", "current", "--agent", &agent]).stdout)
        .contains("held by host-2")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "host-2 never took the lease"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500)); // in its wait for the ledger
    let pid = waiting.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let output = waiting.wait_with_output().unwrap();
    let message = text(&output.stderr);
    assert_eq!(output.status.code(), Some(143), "{message}");
    assert!(
        message.contains("the lease of") && message.contains("given back"),
        "{message}"
    );
    let current = text(&run_as(&shared, "host-3", &["lease", "current", "--agent", &agent]).stdout);
    assert!(
        !current.contains("held by host-2"),
        "the lease was given back: {current}"
    );
    assert_eq!(shared.effects().len(), 1, "s2 did not run");
}

/// H3 with a broken setup (found by an adversarial run, F2): two hosts that use one device id
/// with ledger folders of their own. Host Y's records of another agent filled its ledger to the
/// count host X published, and Y ran X's committed occurrence again (exit 0). The published head
/// names X's record: Y exits 7 at once (waiting would not help), naming the device id.
#[test]
fn h3_a_device_id_used_by_two_hosts_with_ledgers_of_their_own_runs_nothing_twice() {
    let shared = Shared::sqlite();
    let as_site = |site: &str, args: &[&str]| {
        shared
            .command("h1", args)
            .env("FENCEPOST_LEDGER", ledger_of(&shared, site))
            .env("XDG_DATA_HOME", shared.path(&format!("data-{site}")))
            .output()
            .unwrap()
    };
    let other = as_site(
        "y",
        &[
            "run", "--agent", "other", "--intent", "b", "--salt", "1", "--", "true",
        ],
    );
    assert_eq!(other.status.code(), Some(0), "{}", text(&other.stderr));
    let args = report(&shared, "2026-11-30", &[], "0");
    let first = as_site("x", &strs(&args));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert_eq!(shared.effects().len(), 1);

    let started = std::time::Instant::now();
    let again = as_site(
        "y",
        &strs(&report(&shared, "2026-11-30", &["--wait", "20s"], "0")),
    );
    let message = text(&again.stderr);
    assert_eq!(again.status.code(), Some(7), "{message}");
    assert!(
        message.contains("h1 record 1 (this ledger has another record there"),
        "{message}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "no use waiting"
    );
    assert_eq!(shared.effects().len(), 1, "ran once");
}

/// Rule L5 (and D1): records that a sync brings right after the grant are read before the fence.
/// The coordinator forgot its state, so nothing published tells the second host to wait; its
/// ledger receives the first host's commit while the lease is being granted (a test seam holds
/// that window open). The grant's check syncs the ledger after that window, so the second host
/// finds the run committed (exit 3) and the effect ran once. Found by an adversarial test of the
/// run session: the check had moved before the window, and the command ran a second time.
#[test]
fn l5_d1_records_that_arrive_while_the_lease_is_granted_are_read_before_the_fence() {
    let shared = Shared::sqlite();
    let args = report(&shared, "2026-12-06", &[], "0");
    let first = run_as(&shared, "host-1", &strs(&args));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    for file in ["leases.db", "leases.db-wal", "leases.db-shm"] {
        let _ = std::fs::remove_file(shared.path(file)); // the coordinator forgot its state
    }
    let second = host(&shared, "host-2", &strs(&args))
        .env("FENCEPOST_TEST_PAUSE_AFTER_ACQUIRE_MS", "3000")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1_000));
    sync(&shared, "host-1", "host-2");
    let second = second.wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(3), "{}", text(&second.stderr));
    assert_eq!(shared.effects().len(), 1, "the effect ran once");
}

/// Rule H3 (found by an adversary through the binary): `ledger verify` said "intact" on a host
/// whose copy of another device's file is older than what that device published (a file
/// replaced by an older copy of itself, or a sync not done), while `run` there waited. It now
/// names the records the holders published that the ledger lacks (exit 1), and says intact
/// once the copy is whole.
#[test]
fn h3_ledger_verify_names_the_records_the_holders_published_that_the_ledger_lacks() {
    let shared = Shared::sqlite();
    let first = run_as(&shared, "host-1", &strs(&report(&shared, "2026-11-30", &[], "0")));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    sync(&shared, "host-1", "host-2");
    let second = run_as(&shared, "host-1", &strs(&report(&shared, "2026-12-01", &[], "0")));
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));

    let verified = run_as(&shared, "host-2", &["ledger", "verify"]);
    let said = format!("{}{}", text(&verified.stdout), text(&verified.stderr));
    assert_eq!(verified.status.code(), Some(1), "H3: not intact: {said}");
    assert!(
        said.contains("host-1 records 2..=3") && said.contains("which this ledger lacks"),
        "names the device and the records: {said}"
    );
    sync(&shared, "host-1", "host-2");
    let verified = run_as(&shared, "host-2", &["ledger", "verify"]);
    let said = format!("{}{}", text(&verified.stdout), text(&verified.stderr));
    assert_eq!(verified.status.code(), Some(0), "{said}");
}
