//! `fencepost run`, `lease` and `ledger`, end to end: the built binary as several hosts sharing one
//! SQLite coordinator and one ledger folder.

mod common;

use common::{killed_host_leaves_an_in_doubt_run, text, three_hosts_at_once, Shared};

#[test]
fn run_three_hosts_run_the_same_occurrence_and_the_effect_happens_once() {
    let shared = Shared::sqlite();
    for (round, salt) in ["2026-11-29", "2026-11-30", "2026-12-01"].iter().enumerate() {
        // Waiting hosts take the lease after the first and find the run committed (exit 3).
        let codes = three_hosts_at_once(&shared, salt, &["--wait", "20s"]);
        assert_eq!(codes.iter().filter(|code| **code == 0).count(), 1, "{codes:?}");
        assert!(codes.iter().all(|code| [0, 3].contains(code)), "{codes:?}");
        assert_eq!(shared.effects().len(), round + 1, "once per occurrence");
    }
    // Without --wait, the others are refused while the lease is held, or find it committed.
    let codes = three_hosts_at_once(&shared, "2026-12-02", &[]);
    assert_eq!(codes.iter().filter(|code| **code == 0).count(), 1, "{codes:?}");
    assert_eq!(shared.effects().len(), 4);
    // Every host's epoch is distinct: the lease moved between hosts, never shared.
    let epochs: std::collections::BTreeSet<String> = shared
        .effects()
        .iter()
        .map(|line| line.split(' ').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(epochs.len(), 4);
    let verify = shared.run("host-1", &["ledger", "verify"]);
    assert!(verify.status.success(), "{}", text(&verify.stdout));
}

#[test]
fn run_a_host_killed_mid_command_leaves_an_in_doubt_run() {
    killed_host_leaves_an_in_doubt_run(&Shared::sqlite(), "2026-11-29");
}

#[test]
fn run_records_a_failed_command_and_reports_it() {
    let shared = Shared::sqlite();
    let failed = shared.run(
        "host-1",
        &[
            "run", "--agent", "a", "--intent", "i", "--salt", "1", "--", "sh", "-c", "exit 7",
        ],
    );
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed.stderr));
    assert!(text(&failed.stderr).contains("failed"));
    let runs = text(&shared.run("host-1", &["ledger", "runs", "--json"]).stdout);
    let runs: serde_json::Value = serde_json::from_str(&runs).unwrap();
    assert_eq!(runs[0]["status"], "failed");
    let missing = shared.run(
        "host-1",
        &[
            "run",
            "--agent",
            "a",
            "--intent",
            "i",
            "--salt",
            "2",
            "--",
            "/no/such/program",
        ],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("cannot start"),
        "{}",
        text(&missing.stderr)
    );
}

#[test]
fn ledger_resolve_records_an_in_doubt_runs_outcome() {
    let shared = Shared::sqlite();
    common::kill_mid_command(
        &shared,
        "host-1",
        &[
            "run", "--agent", "billing", "--intent", "charge", "--salt", "42", "--ttl", "1s",
        ],
        "true",
    );
    let runs_json = || -> serde_json::Value {
        serde_json::from_str(&text(&shared.run("host-2", &["ledger", "runs", "--json"]).stdout)).unwrap()
    };
    // While the dead host's lease is live, its run shows as running, and resolving it is refused
    // unless forced (its command could still be running).
    let runs = runs_json();
    assert_eq!(runs[0]["status"], "running", "{runs}");
    let run_id = runs[0]["run_id"].as_str().unwrap().to_owned();
    let resolve = |outcome: &str, extra: &[&str]| {
        let mut args = vec![
            "ledger", "resolve", "--agent", "billing", "--run", &run_id, "--as", outcome,
        ];
        args.extend_from_slice(extra);
        shared.run("host-2", &args)
    };
    let early = resolve("committed", &[]);
    assert_eq!(early.status.code(), Some(10), "{}", text(&early.stderr));
    assert!(text(&early.stderr).contains("--force"), "{}", text(&early.stderr));
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let runs = runs_json();
    assert_eq!(runs[0]["status"], "in-doubt", "{runs}");
    // The operator checked with the payment provider: the charge went through.
    let resolved = shared.run(
        "host-2",
        &[
            "ledger",
            "resolve",
            "--agent",
            "billing",
            "--run",
            &run_id,
            "--as",
            "committed",
        ],
    );
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let again = shared.run(
        "host-2",
        &[
            "run", "--agent", "billing", "--intent", "charge", "--salt", "42", "--", "true",
        ],
    );
    assert_eq!(again.status.code(), Some(3), "{}", text(&again.stderr));
    let not_in_doubt = shared.run(
        "host-2",
        &[
            "ledger", "resolve", "--agent", "billing", "--run", &run_id, "--as", "failed",
        ],
    );
    // A usage error (issue 37, item 7), not damage: nothing is wrong with the ledger.
    assert_eq!(not_in_doubt.status.code(), Some(2));
    assert!(text(&not_in_doubt.stderr).contains("is not in doubt"));
    for (agent, run) in [
        ("billing", "run-00000000000000000000000000000000"),
        ("nobody", run_id.as_str()),
    ] {
        let output = shared.run(
            "host-2",
            &[
                "ledger",
                "resolve",
                "--agent",
                agent,
                "--run",
                run,
                "--as",
                "committed",
            ],
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{agent} {run}: {}",
            text(&output.stderr)
        );
    }
}

/// Issue 37, item 7 (rule D2): two operators resolving one run at once with opposite outcomes
/// take turns under the agent's lease: one is told it was recorded, the other that it was
/// resolved meanwhile (or is being resolved), and the ledger holds one outcome.
#[test]
fn d2_two_operators_resolving_one_run_at_once_are_not_both_told_it_was_recorded() {
    let shared = Shared::sqlite();
    for round in 0..5 {
        let salt = format!("{round}");
        common::kill_mid_command(
            &shared,
            "host-1",
            &[
                "run", "--agent", "billing", "--intent", "charge", "--salt", &salt, "--ttl", "1s",
            ],
            "true",
        );
        std::thread::sleep(std::time::Duration::from_millis(1_100));
        let run_id = common::in_doubt_run(&shared, "host-2");
        let resolvers: Vec<_> = [("host-2", "committed"), ("host-3", "failed")]
            .into_iter()
            .map(|(host, outcome)| {
                let args = [
                    "ledger", "resolve", "--agent", "billing", "--run", &run_id, "--as", outcome,
                ];
                (outcome, shared.spawn(host, &args))
            })
            .collect();
        let ended: Vec<_> = resolvers
            .into_iter()
            .map(|(outcome, child)| (outcome, child.wait_with_output().unwrap()))
            .collect();
        let recorded: Vec<&str> = ended
            .iter()
            .filter(|(_, output)| output.status.success())
            .map(|(outcome, _)| *outcome)
            .collect();
        assert_eq!(recorded.len(), 1, "round {round}: {ended:?}");
        let (_, refused) = ended.iter().find(|(_, output)| !output.status.success()).unwrap();
        let told = text(&refused.stderr);
        assert!(
            // Or, when it started after the other had ended, that it is not in doubt.
            told.contains("no longer in doubt")
                || told.contains("another operator resolving")
                || told.contains("is not in doubt"),
            "round {round}: {told}"
        );
        let runs: serde_json::Value =
            serde_json::from_str(&text(&shared.run("host-2", &["ledger", "runs", "--json"]).stdout)).unwrap();
        let run = runs
            .as_array()
            .unwrap()
            .iter()
            .find(|run| run["run_id"] == run_id.as_str())
            .unwrap();
        assert_eq!(run["status"], recorded[0], "round {round}: {run}");
    }
}

#[test]
fn lease_commands_acquire_renew_release_current_list_with_json() {
    let shared = Shared::sqlite();
    let json = |output: std::process::Output| -> serde_json::Value {
        assert!(output.status.success(), "{}", text(&output.stderr));
        serde_json::from_str(&text(&output.stdout)).unwrap()
    };
    let lease = json(shared.run(
        "laptop",
        &["lease", "acquire", "--agent", "milo", "--ttl", "1m", "--json"],
    ));
    assert_eq!(lease["holder"].as_str(), Some("laptop"));
    // At least the wall clock in ms (rule L5: a restored copy of the file repeats no epoch).
    let epoch = lease["epoch"].as_u64().unwrap();
    assert!(epoch > 1_700_000_000_000, "{lease}");
    let epoch = epoch.to_string();
    let held = shared.run("phone", &["lease", "acquire", "--agent", "milo", "--json"]);
    assert_eq!(held.status.code(), Some(4));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text(&held.stdout)).unwrap()["verdict"],
        "held"
    );
    let renewed = json(shared.run(
        "laptop",
        &["lease", "renew", "--agent", "milo", "--epoch", &epoch, "--json"],
    ));
    assert_eq!(renewed["epoch"].to_string(), epoch);
    let lost = shared.run("phone", &["lease", "renew", "--agent", "milo", "--epoch", &epoch]);
    assert_eq!(lost.status.code(), Some(6));
    assert!(text(&lost.stderr).contains("lost"), "{}", text(&lost.stderr));
    assert_eq!(
        json(shared.run("phone", &["lease", "current", "--agent", "milo", "--json"]))["holder"],
        "laptop"
    );
    let list = json(shared.run("phone", &["lease", "list", "--json"]));
    assert_eq!(list.as_array().unwrap().len(), 1);
    let human = text(&shared.run("phone", &["lease", "list"]).stdout);
    assert!(
        human.contains(&format!("milo: held by laptop at epoch {epoch}")),
        "{human}"
    );
    assert!(shared
        .run(
            "laptop",
            &["lease", "release", "--agent", "milo", "--epoch", &epoch]
        )
        .status
        .success());
    assert_eq!(
        json(shared.run("phone", &["lease", "current", "--agent", "milo", "--json"])),
        serde_json::Value::Null
    );
    let next = json(shared.run("phone", &["lease", "acquire", "--agent", "milo", "--json"]));
    assert!(
        next["epoch"].as_u64() > epoch.parse().ok(),
        "a new epoch at once after a release: {next}"
    );
}

#[test]
fn errors_are_one_clear_line_and_lose_nothing() {
    let shared = Shared::sqlite();
    let first = shared.run(
        "host-1",
        &[
            "run", "--agent", "a", "--intent", "i", "--salt", "1", "--", "true",
        ],
    );
    assert!(first.status.success(), "{}", text(&first.stderr));
    let one_line = |output: &std::process::Output, code: i32, expected: &str| {
        assert_eq!(output.status.code(), Some(code), "{}", text(&output.stderr));
        let message = text(&output.stderr);
        assert!(message.contains(expected), "{message}");
        if code == 10 {
            assert_eq!(message.trim_end().lines().count(), 1, "one line: {message}");
        }
    };
    // A missing ledger folder.
    let mut command = shared.command("host-1", &["ledger", "show"]);
    command.env("FENCEPOST_LEDGER", shared.path("no-such-folder"));
    one_line(&command.output().unwrap(), 10, "does not exist: create it");
    // An unreachable database.
    let mut command = shared.command("host-1", &["lease", "list"]);
    command.env(
        "FENCEPOST_COORDINATOR",
        "postgres://fencepost@127.0.0.1:1/none?connect_timeout=1",
    );
    one_line(
        &command.output().unwrap(),
        10,
        "cannot connect to the PostgreSQL coordinator",
    );
    let mut command = shared.command("host-1", &["lease", "list"]);
    command.env("FENCEPOST_COORDINATOR", "etcd://somewhere");
    one_line(
        &command.output().unwrap(),
        2,
        "must be sqlite:PATH or a postgres:// URL",
    );
    // Malformed flags.
    one_line(
        &shared.run(
            "host-1",
            &[
                "run", "--agent", "a", "--intent", "i", "--salt", "1", "--ttl", "soon", "--", "true",
            ],
        ),
        2,
        "soon",
    );
    one_line(
        &shared.run("host-1", &["run", "--agent", "a", "--intent", "i", "--salt", "1"]),
        2,
        "COMMAND",
    );
    one_line(&shared.run("bad\ndevice", &["lease", "list"]), 2, "device id");
    // A corrupt ledger file: verify names it; the other devices' records are all still there.
    let second = shared.run(
        "host-2",
        &[
            "run", "--agent", "a", "--intent", "i", "--salt", "2", "--", "true",
        ],
    );
    assert!(second.status.success(), "{}", text(&second.stderr));
    let devices = shared.path("ledger").join("devices");
    let file = std::fs::read_dir(&devices)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().contains("host-2"))
        .unwrap();
    let original = std::fs::read(&file).unwrap();
    let mut damaged = original.clone();
    damaged.splice(10..20, b"##########".iter().copied());
    std::fs::write(&file, &damaged).unwrap();
    let verify = shared.run("host-1", &["ledger", "verify"]);
    assert_eq!(verify.status.code(), Some(1));
    assert!(
        text(&verify.stdout).contains("damaged") && text(&verify.stdout).contains("host-2"),
        "{}",
        text(&verify.stdout)
    );
    // The listing shows what could be read, says what is damaged, and exits 1 (issue 18).
    let show = shared.run("host-1", &["ledger", "runs"]);
    assert_eq!(show.status.code(), Some(1), "{}", text(&show.stderr));
    assert!(
        text(&show.stderr).contains("damaged") && text(&show.stderr).contains("host-2"),
        "{}",
        text(&show.stderr)
    );
    assert!(
        text(&show.stdout).contains("by host-1"),
        "host-1's runs are still read: {}",
        text(&show.stdout)
    );
    assert_eq!(std::fs::read(&file).unwrap(), damaged, "nothing rewritten");
}

#[test]
fn settings_come_from_flags_then_variables_then_the_config_file_and_the_device_id_is_stable() {
    let shared = Shared::sqlite();
    let config_dir = shared.path("config").join("fencepost");
    std::fs::create_dir_all(&config_dir).unwrap();
    let file_ledger = shared.path("file-ledger");
    std::fs::create_dir(&file_ledger).unwrap();
    std::fs::write(
        config_dir.join("config.toml"),
        format!(
            "coordinator = \"sqlite:{}\"\nledger = \"{}\"\ndevice = \"from-file\"\n",
            shared.path("file.db").display(),
            file_ledger.display()
        ),
    )
    .unwrap();
    // Nothing on the command line or in the environment: the config file decides.
    let mut command = shared.command(
        "ignored",
        &[
            "run",
            "--agent",
            "a",
            "--intent",
            "i",
            "--salt",
            "1",
            "--",
            "sh",
            "-c",
            "echo $FENCEPOST_DEVICE",
        ],
    );
    command
        .env_remove("FENCEPOST_COORDINATOR")
        .env_remove("FENCEPOST_LEDGER")
        .env_remove("FENCEPOST_DEVICE");
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), "from-file");
    assert!(shared.path("file.db").exists());
    assert!(std::fs::read_dir(file_ledger.join("devices")).unwrap().count() == 1);
    // A flag beats the variable, which beats the file.
    let mut command = shared.command(
        "from-variable",
        &[
            "--device",
            "from-flag",
            "lease",
            "acquire",
            "--agent",
            "b",
            "--json",
        ],
    );
    command.env_remove("FENCEPOST_COORDINATOR");
    let lease: serde_json::Value = serde_json::from_str(&text(&command.output().unwrap().stdout)).unwrap();
    assert_eq!(lease["holder"], "from-flag");
    // A config file with a typo is an error that names the file.
    std::fs::write(config_dir.join("config.toml"), "coordinater = \"sqlite:x\"\n").unwrap();
    let output = shared.run("host-1", &["lease", "list"]);
    assert_eq!(output.status.code(), Some(10));
    assert!(
        text(&output.stderr).contains("config.toml"),
        "{}",
        text(&output.stderr)
    );
    std::fs::remove_file(config_dir.join("config.toml")).unwrap();
    // Without any device setting, the id is derived from the machine, and the same every time.
    let device = || {
        let mut command = shared.command("ignored", &["lease", "acquire", "--agent", "c", "--json"]);
        command.env_remove("FENCEPOST_DEVICE");
        let output = command.output().unwrap();
        let value: serde_json::Value = serde_json::from_str(&text(&output.stdout)).unwrap();
        let holder = value["holder"].as_str().map(str::to_owned).unwrap_or_default();
        (holder, value["epoch"].to_string())
    };
    let (first, epoch) = device();
    assert!(!first.is_empty());
    // A second process derives the same id: it may renew the first one's lease.
    let mut command = shared.command(
        "ignored",
        &["lease", "renew", "--agent", "c", "--epoch", &epoch, "--json"],
    );
    command.env_remove("FENCEPOST_DEVICE");
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "a stable device id: {}",
        text(&output.stderr)
    );
    let renewed: serde_json::Value = serde_json::from_str(&text(&output.stdout)).unwrap();
    assert_eq!(renewed["holder"].as_str(), Some(first.as_str()));
}

/// Issue 37, item 7: exit 4 after `--wait` ran out says that it waited, not to use --wait.
#[test]
fn l1_exit_4_after_the_wait_ran_out_says_it_waited() {
    let shared = Shared::sqlite();
    let held = shared.run("laptop", &["lease", "acquire", "--agent", "milo", "--ttl", "1m"]);
    assert!(held.status.success(), "{}", text(&held.stderr));
    let output = shared.run(
        "phone",
        &[
            "run", "--agent", "milo", "--intent", "x", "--salt", "1", "--wait", "1s", "--", "true",
        ],
    );
    let message = text(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{message}");
    assert!(!message.contains("use --wait"), "{message}");
    assert!(message.contains("after waiting"), "{message}");
    let output = shared.run(
        "phone",
        &[
            "run", "--agent", "milo", "--intent", "x", "--salt", "1", "--", "true",
        ],
    );
    assert_eq!(output.status.code(), Some(4));
    assert!(
        text(&output.stderr).contains("use --wait"),
        "{}",
        text(&output.stderr)
    );
}
