//! What operators use around `fencepost run` (issue 18), through the built binary: the metrics
//! file, `run --json`, JSON logs, stderr without colour codes, `fencepost status`, naming the
//! holder on this host, help that shows only what applies, and listings of a damaged ledger.

mod common;

use std::process::Stdio;

use common::{kill_mid_command, text, wait_for_file, Shared};

/// `run --agent AGENT --intent i --salt SALT EXTRA -- sh -c SCRIPT`.
fn run_args<'a>(agent: &'a str, salt: &'a str, extra: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut args = vec!["run", "--agent", agent, "--intent", "i", "--salt", salt];
    args.extend_from_slice(extra);
    args.extend(["--", "sh", "-c", script]);
    args
}

/// The samples of a Prometheus text file, parsed.
fn scrape(path: &std::path::Path) -> prometheus_parse::Scrape {
    let text = std::fs::read_to_string(path).unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap()
}

/// The value of the sample `name` whose labels include `labels`.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|sample| {
            sample.metric == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(key) == Some(*value))
        })
        .map(|sample| match &sample.value {
            prometheus_parse::Value::Counter(value)
            | prometheus_parse::Value::Gauge(value)
            | prometheus_parse::Value::Untyped(value) => *value,
            prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |bucket| bucket.count),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

#[test]
fn metrics_run_writes_prometheus_text_with_the_counters_of_each_layer() {
    let shared = Shared::sqlite();
    let file = shared.path("fencepost.prom");
    let file_arg = file.to_str().unwrap();
    let ran = shared.run(
        "host-1",
        &run_args("nightly", "1", &["--metrics-file", file_arg], "true"),
    );
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let metrics = scrape(&file);
    let agent = [("agent", "nightly")];
    let counted =
        |name: &str, key: &str, value: &str| sample(&metrics, name, &[("agent", "nightly"), (key, value)]);
    assert_eq!(
        counted("fencepost_acquires_total", "outcome", "granted"),
        Some(1.0)
    );
    assert_eq!(
        counted("fencepost_fence_decisions_total", "decision", "proceed"),
        Some(1.0)
    );
    assert_eq!(
        counted("fencepost_dispatches_total", "outcome", "succeeded"),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, "fencepost_leases_held", &agent),
        Some(0.0),
        "released at the end"
    );
    assert_eq!(sample(&metrics, "fencepost_run_exit_status", &agent), Some(0.0));
    assert_eq!(sample(&metrics, "fencepost_runs_in_doubt", &agent), Some(0.0));
    assert_eq!(
        sample(&metrics, "fencepost_acquire_duration_seconds", &agent),
        Some(1.0),
        "one acquire call timed"
    );
    assert!(sample(&metrics, "fencepost_relay_pushed_records_total", &[]).unwrap() >= 2.0);
    assert!(sample(&metrics, "fencepost_relay_push_duration_seconds", &[]).unwrap() >= 1.0);
    assert!(sample(&metrics, "fencepost_relay_pull_duration_seconds", &[]).unwrap() >= 1.0);
    assert!(sample(&metrics, "fencepost_run_duration_seconds", &[("phase", "total")]).unwrap() > 0.0);
    assert!(
        metrics.docs.contains_key("fencepost_dispatches_total"),
        "help texts are written"
    );

    // The same occurrence again: the file is replaced, and says what this run did.
    let again = shared.run(
        "host-1",
        &run_args("nightly", "1", &["--metrics-file", file_arg], "true"),
    );
    assert_eq!(again.status.code(), Some(3), "{}", text(&again.stderr));
    let metrics = scrape(&file);
    assert_eq!(sample(&metrics, "fencepost_run_exit_status", &agent), Some(3.0));
    assert_eq!(
        sample(
            &metrics,
            "fencepost_run_outcome",
            &[("agent", "nightly"), ("outcome", "already_committed")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, "fencepost_dispatches_total", &agent),
        Some(0.0),
        "nothing dispatched: every outcome counted at 0"
    );
    assert_eq!(
        sample(
            &metrics,
            "fencepost_run_outcome",
            &[("agent", "nightly"), ("outcome", "succeeded")]
        ),
        Some(0.0),
        "every outcome there, 0 for the others"
    );
    let leftovers: Vec<_> = std::fs::read_dir(shared.folder.path())
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file is left: {leftovers:?}");

    // Held by another host: counted as such.
    let mut holder = shared.spawn("host-2", &run_args("nightly", "2", &[], "sleep 3"));
    wait_until_held(&shared, "nightly");
    let refused = shared.run(
        "host-1",
        &run_args("nightly", "3", &["--metrics-file", file_arg], "true"),
    );
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused.stderr));
    let metrics = scrape(&file);
    assert_eq!(
        sample(
            &metrics,
            "fencepost_acquires_total",
            &[("agent", "nightly"), ("outcome", "held")]
        ),
        Some(1.0)
    );
    assert_eq!(sample(&metrics, "fencepost_run_exit_status", &agent), Some(4.0));
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// Waits until `agent`'s lease is held (real time, at most 20 s).
fn wait_until_held(shared: &Shared, agent: &str) {
    for _ in 0..2000 {
        let current = shared.run("observer", &["lease", "current", "--agent", agent, "--json"]);
        if text(&current.stdout).trim() != "null" && current.status.success() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{agent} was never held");
}

#[test]
fn metrics_run_json_prints_one_object_that_matches_the_exit_status() {
    let shared = Shared::sqlite();
    let cases: [(&str, &str, &[&str], i32, &str); 4] = [
        ("1", "echo from the command", &[], 0, "succeeded"),
        ("2", "exit 9", &[], 1, "failed"),
        ("1", "true", &[], 3, "already_committed"),
        ("3", "true", &["--ttl", "1ms"], 2, "usage_error"),
    ];
    for (salt, script, extra, code, outcome) in cases {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let output = shared.run("host-1", &run_args("mailer", salt, &extra, script));
        assert_eq!(output.status.code(), Some(code), "{}", text(&output.stderr));
        let stdout = text(&output.stdout);
        // The command's own output comes first; the report is the last line.
        let last = stdout.lines().last().unwrap();
        let report: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(report["exit_status"], code, "{report}");
        assert_eq!(report["outcome"], outcome, "{report}");
        assert_eq!(report["agent"], "mailer");
        if code != 2 {
            assert!(report["run_id"].as_str().unwrap().starts_with("run-"), "{report}");
            assert_eq!(report["device"], "host-1");
        }
        if code <= 1 {
            assert!(report["epoch"].as_u64().unwrap() >= 1, "{report}");
            assert!(report["durations_ms"]["command"].is_u64(), "{report}");
            assert!(report["durations_ms"]["acquire"].is_u64(), "{report}");
            assert!(report["durations_ms"]["wait"].is_u64(), "{report}");
        }
        if code == 0 {
            assert!(stdout.starts_with("from the command\n"), "{stdout}");
        }
        if code == 2 {
            assert!(report["error"].as_str().unwrap().contains("--ttl"), "{report}");
        }
    }
}

#[test]
fn logs_json_format_writes_only_json_lines_with_the_runs_fields() {
    let shared = Shared::sqlite();
    for (salt, code) in [("1", 0), ("1", 3)] {
        let mut command = shared.command(
            "host-1",
            &run_args("logger", salt, &["--log-format", "json", "-v"], "true"),
        );
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(code), "{}", text(&output.stderr));
        let stderr = text(&output.stderr);
        assert!(!stderr.trim().is_empty());
        let lines: Vec<serde_json::Value> = stderr
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line:?}")))
            .collect();
        for line in &lines {
            assert!(
                line["level"].is_string() && line["fields"]["message"].is_string(),
                "{line}"
            );
        }
        let in_run = lines.iter().find(|line| line["span"]["name"] == "run").unwrap();
        assert_eq!(in_run["span"]["agent"], "logger", "{in_run}");
        assert_eq!(in_run["span"]["device"], "host-1", "{in_run}");
        assert!(in_run["span"]["run_id"].as_str().unwrap().starts_with("run-"));
        if code == 0 {
            assert!(
                lines.iter().any(|line| line["span"]["epoch"].as_u64() > Some(0)),
                "the epoch joins the span once granted: {stderr}"
            );
        } else {
            assert!(
                lines.iter().any(|line| line["fields"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("already committed")),
                "messages are events too: {stderr}"
            );
        }
    }
    // FENCEPOST_LOG_FORMAT says the same.
    let output = shared
        .command("host-1", &run_args("logger", "1", &[], "true"))
        .env("FENCEPOST_LOG_FORMAT", "json")
        .output()
        .unwrap();
    for line in text(&output.stderr).lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
}

#[test]
fn logs_stderr_to_a_pipe_has_no_escape_codes() {
    let shared = Shared::sqlite();
    // A WARN line (a ledger whose device file is damaged) and messages, -vv for every level.
    let ran = shared.run("host-1", &run_args("colour", "1", &["-vv"], "true"));
    assert_eq!(ran.status.code(), Some(0));
    let devices = shared.path("ledger").join("devices");
    let file = std::fs::read_dir(&devices)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&file, b"not a record\n").unwrap();
    for args in [
        run_args("colour", "2", &["-vv"], "true"),
        vec!["ledger", "verify", "-vv"],
    ] {
        let output = shared.run("host-2", &args);
        let stderr = text(&output.stderr);
        assert!(!stderr.is_empty(), "{args:?} wrote nothing to stderr");
        assert!(!stderr.contains('\u{1b}'), "{args:?}: escape codes in {stderr:?}");
    }
}

#[test]
fn status_shows_the_live_holder_and_its_running_run_then_the_run_in_doubt_after_a_kill() {
    let shared = Shared::sqlite();
    let started = shared.path("started");
    let script = format!("touch '{}'; sleep 30", started.display());
    let mut running = shared
        .command(
            "host-1",
            &run_args("backup", "2026-12-03", &["--ttl", "1s"], &script),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    // From this host (another process of host-1) and from another.
    for device in ["host-1", "host-2"] {
        let output = shared.run(device, &["status", "--json"]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(status["device_id"], device);
        assert!(status["data_directory"].as_str().unwrap().ends_with("fencepost"));
        assert!(status["coordinator"].as_str().unwrap().starts_with("sqlite:"));
        assert_eq!(status["ledger"]["healthy"], true, "{status}");
        let agent = &status["agents"][0];
        assert_eq!(agent["agent_id"], "backup", "{status}");
        assert_eq!(agent["lease"]["holder"], "host-1", "{status}");
        assert_eq!(agent["lease"]["live"], true, "{status}");
        assert_eq!(agent["lease"]["this_host"], device == "host-1");
        if device == "host-1" {
            assert_eq!(
                agent["lease"]["pid"],
                running.id(),
                "the holding process is named"
            );
        }
        assert_eq!(agent["running"][0]["device_id"], "host-1", "{status}");
        assert_eq!(agent["running"][0]["epoch"], agent["lease"]["epoch"]);
        assert_eq!(agent["in_doubt"].as_array().unwrap().len(), 0);
    }
    let human = text(&shared.run("host-1", &["status"]).stdout);
    assert!(human.contains("data dir:"), "{human}");
    assert!(human.contains("held by host-1 (this host, process"), "{human}");
    assert!(human.contains("running"), "{human}");
    // Killed mid-command (twice): each lease ends with its TTL, and each run is in doubt.
    running.kill().unwrap();
    running.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    kill_mid_command(
        &shared,
        "host-1",
        &[
            "run",
            "--agent",
            "backup",
            "--intent",
            "i",
            "--salt",
            "2026-12-04",
            "--ttl",
            "1s",
        ],
        "true",
    );
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    let output = shared.run("host-2", &["status", "--json", "--agent", "backup"]);
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let agent = &status["agents"][0];
    assert_eq!(agent["lease"]["live"], false, "{status}");
    let in_doubt = agent["in_doubt"].as_array().unwrap();
    assert_eq!(in_doubt.len(), 2, "both killed attempts: {status}");
    assert!(in_doubt.iter().all(|run| run["status"] == "in-doubt"));
    assert_eq!(agent["running"].as_array().unwrap().len(), 0);
    assert!(text(&shared.run("host-2", &["status"]).stdout).contains("in doubt"));
}

#[test]
fn status_reports_a_damaged_ledger_and_exits_1() {
    let shared = Shared::sqlite();
    for salt in ["1", "2"] {
        let ran = shared.run("host-1", &run_args("job", salt, &[], "true"));
        assert_eq!(ran.status.code(), Some(0));
    }
    let file = shared.path("ledger").join("devices").join("host-1.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    lines[1] = lines[1].replacen('1', "2", 1);
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let output = shared.run("host-2", &["status", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["ledger"]["healthy"], false);
    assert!(status["ledger"]["damage"][0]["detail"]
        .as_str()
        .unwrap()
        .contains("host-1"));
    let human = shared.run("host-2", &["status"]);
    assert_eq!(human.status.code(), Some(1));
    assert!(
        text(&human.stdout).contains("ledger health: damaged (1 problem)"),
        "{}",
        text(&human.stdout)
    );
}

#[test]
fn cli_exit_4_names_the_process_of_this_host_that_holds_the_lease() {
    let shared = Shared::sqlite();
    let started = shared.path("started");
    let script = format!("touch '{}'; sleep 30", started.display());
    let mut holder = shared.spawn("host-1", &run_args("cron", "1", &[], &script));
    wait_for_file(&started);
    let same_host = shared.run("host-1", &run_args("cron", "2", &[], "true"));
    assert_eq!(same_host.status.code(), Some(4));
    let said = text(&same_host.stderr);
    assert!(
        said.contains(&format!("this host (host-1), process {}", holder.id())),
        "{said}"
    );
    let other_host = shared.run("host-2", &run_args("cron", "2", &[], "true"));
    assert_eq!(other_host.status.code(), Some(4));
    let said = text(&other_host.stderr);
    assert!(said.contains("held by host-1 (another host"), "{said}");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn cli_each_subcommands_help_shows_only_what_applies_to_it() {
    let shared = Shared::sqlite();
    let help = text(&shared.run("host-1", &["simulate", "--help"]).stdout);
    for option in ["--coordinator", "--ledger", "--device", "--config"] {
        assert!(!help.contains(option), "simulate --help shows {option}: {help}");
    }
    assert!(help.contains("--png"), "{help}");
    let refused = shared.run("host-1", &["--ledger", "/tmp/x", "simulate"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    let refused = shared.run("host-1", &["simulate", "--ledger", "/tmp/x"]);
    assert_eq!(refused.status.code(), Some(2));
    for command in [
        vec!["run", "--help"],
        vec!["status", "--help"],
        vec!["ledger", "show", "--help"],
        vec!["lease", "acquire", "--help"],
    ] {
        let help = text(&shared.run("host-1", &command).stdout);
        assert!(
            help.contains("--ledger") && help.contains("--device"),
            "{command:?}: {help}"
        );
    }
    // Every option of every subcommand says what it is for.
    for command in [
        vec!["lease", "acquire"],
        vec!["lease", "renew"],
        vec!["lease", "release"],
        vec!["lease", "current"],
        vec!["lease", "list"],
        vec!["ledger", "show"],
        vec!["ledger", "runs"],
        vec!["ledger", "resolve"],
        vec!["ledger", "verify"],
        vec!["status"],
    ] {
        let mut args = command.clone();
        args.push("-h");
        let help = text(&shared.run("host-1", &args).stdout);
        for line in help.lines().filter(|line| line.trim_start().starts_with("--")) {
            let described = line.split("  ").filter(|part| !part.trim().is_empty()).count() >= 2;
            assert!(described, "{command:?}: no help text for {line:?}");
        }
    }
    // The location options work before the subcommand and after it (after wins).
    let before = shared.run("host-1", &["--device", "host-9", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&before.stdout).unwrap();
    assert_eq!(status["device_id"], "host-9");
    let both = shared.run(
        "host-1",
        &["--device", "host-9", "status", "--device", "host-8", "--json"],
    );
    let status: serde_json::Value = serde_json::from_slice(&both.stdout).unwrap();
    assert_eq!(status["device_id"], "host-8");
}

#[test]
fn cli_listings_of_a_damaged_ledger_say_what_is_damaged_and_exit_1() {
    let shared = Shared::sqlite();
    let ran = shared.run("host-1", &run_args("job", "1", &[], "true"));
    assert_eq!(ran.status.code(), Some(0));
    let file = shared.path("ledger").join("devices").join("host-1.jsonl");
    let text_of_file = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text_of_file.replacen('1', "2", 1)).unwrap();
    for args in [
        vec!["ledger", "show"],
        vec!["ledger", "runs"],
        vec!["ledger", "show", "--json"],
    ] {
        let output = shared.run("host-2", &args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains("damaged"), "{args:?}: {stderr}");
        assert!(stderr.contains("host-1"), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("device \"host-1\": device \"host-1\""),
            "doubled: {stderr}"
        );
        let stdout = text(&output.stdout);
        assert!(!stdout.contains("no intents yet"), "{args:?}: {stdout}");
    }
    let verify = shared.run("host-2", &["ledger", "verify", "--json"]);
    assert_eq!(verify.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(report["intact"], false);
    let damaged = shared.run("host-2", &["ledger", "verify"]);
    let said = text(&damaged.stderr);
    assert!(
        said.contains(" problem") && !said.contains("problem(s)"),
        "{said}"
    );
}

/// Found by an adversarial pass: `--metrics-file /dev/full` replaced the device with a text file.
/// Anything but a regular file is left alone (a warning, the exit status unchanged); a link is
/// followed, and the file it names is replaced.
#[test]
fn metrics_file_never_replaces_a_device_or_fifo_and_follows_a_link() {
    let shared = Shared::sqlite();
    let fifo = shared.path("metrics.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let output = shared.run(
        "host-1",
        &run_args("m", "1", &["--metrics-file", fifo.to_str().unwrap()], "true"),
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("not a regular file"),
        "{}",
        text(&output.stderr)
    );
    use std::os::unix::fs::FileTypeExt as _;
    assert!(
        std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO is still one"
    );

    let real = shared.path("real.prom");
    std::fs::write(&real, "old\n").unwrap();
    let link = shared.path("link.prom");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let output = shared.run(
        "host-1",
        &run_args("m", "2", &["--metrics-file", link.to_str().unwrap()], "true"),
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(),
        "the link stays"
    );
    assert!(std::fs::read_to_string(&real)
        .unwrap()
        .contains("fencepost_run_exit_status"));
    // A name near the file system's limit works: the temporary file's name is short.
    let long = shared.path(&format!("{}.prom", "m".repeat(250)));
    let output = shared.run(
        "host-1",
        &run_args("m", "3", &["--metrics-file", long.to_str().unwrap()], "true"),
    );
    assert!(long.exists(), "{}", text(&output.stderr));
}

/// Found by an adversarial pass: in JSON, fencepost's own errors (exit 2 and 10) were lost (the
/// log writer was closed before they were said), and the command line's errors were plain text.
#[test]
fn logs_json_format_says_every_error_as_a_json_line() {
    let shared = Shared::sqlite();
    let cases: [(Vec<&str>, i32, &str); 4] = [
        (run_args("e", "1", &["--ttl", "0s"], "true"), 2, "--ttl"),
        (
            run_args("e", "1", &["--ledger", "/nonexistent/ledger"], "true"),
            10,
            "/nonexistent/ledger",
        ),
        (vec!["status", "--agent", ""], 2, "--agent"),
        (
            vec!["run", "--agent", "e", "--intent", "i", "--salt", "", "--", "true"],
            2,
            "--salt",
        ),
    ];
    for (args, code, named) in cases {
        let output = shared
            .command("host-1", &args)
            .env("FENCEPOST_LOG_FORMAT", "json")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(code), "{args:?}");
        let stderr = text(&output.stderr);
        let lines: Vec<serde_json::Value> = stderr
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line:?}")))
            .collect();
        assert!(
            lines.iter().any(|line| line["level"] == "ERROR"
                && line["fields"]["message"].as_str().unwrap().contains(named)),
            "{args:?}: the error is said: {stderr:?}"
        );
    }
}

/// Found by an adversarial pass: an agent whose holders published records that this host's
/// ledger never received, with no lease held and nothing in the local ledger (a ledger folder
/// that is not shared), was invisible to `status`, which said healthy while `run` exited 7.
#[test]
fn status_sees_an_agent_known_only_to_the_coordinator_and_reports_the_ledger_behind() {
    let shared = Shared::sqlite();
    let elsewhere = shared.path("other-ledger");
    std::fs::create_dir(&elsewhere).unwrap();
    let ran = shared.run(
        "host-2",
        &[
            "run",
            "--agent",
            "quiet",
            "--intent",
            "i",
            "--salt",
            "1",
            "--ledger",
            elsewhere.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let output = shared.run("host-1", &["status", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stdout));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let agent = status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|agent| agent["agent_id"] == "quiet")
        .unwrap_or_else(|| panic!("the agent is listed: {status}"));
    assert_eq!(agent["ledger_behind"][0]["device_id"], "host-2", "{status}");
    let run = shared.run("host-1", &run_args("quiet", "1", &[], "true"));
    assert_eq!(run.status.code(), Some(7), "as run says");
}

/// Found by an adversarial pass: the holder record's pid was believed whenever some process had
/// it (a pid reused, or a record pointing at another process). A holder process killed with
/// SIGKILL is said to be gone, and a record naming a process that started after the grant is
/// not believed.
#[test]
fn status_says_a_killed_holder_process_is_gone_and_believes_no_other_process_with_its_pid() {
    let shared = Shared::sqlite();
    kill_mid_command(
        &shared,
        "host-1",
        &[
            "run", "--agent", "held", "--intent", "i", "--salt", "1", "--ttl", "30s",
        ],
        "true",
    );
    let status = |shared: &Shared| -> serde_json::Value {
        let output = shared.run("host-1", &["status", "--json", "--agent", "held"]);
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let seen = status(&shared);
    let lease = &seen["agents"][0]["lease"];
    assert_eq!(lease["live"], true, "{seen}");
    assert_eq!(lease["process"], "gone", "{seen}");
    let refused = shared.run("host-1", &run_args("held", "2", &[], "true"));
    assert_eq!(refused.status.code(), Some(4));
    assert!(
        text(&refused.stderr).contains("ended without giving it back"),
        "{}",
        text(&refused.stderr)
    );

    // The record made to name a live process that is not the holder.
    let mut impostor = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let holders = shared.path("data").join("fencepost").join("holders");
    let record = std::fs::read_dir(&holders)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut forged: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    forged["pid"] = serde_json::json!(impostor.id());
    std::fs::write(&record, forged.to_string()).unwrap();
    let seen = status(&shared);
    assert_eq!(seen["agents"][0]["lease"]["process"], "gone", "{seen}");
    assert!(!text(&shared.run("host-1", &["status"]).stdout).contains(&format!("process {})", impostor.id())));
    impostor.kill().unwrap();
    impostor.wait().unwrap();
}

/// Issue 37, item 7: `run --json` and `--metrics-file` report every usage error, also those of
/// the arguments' own parsing (an empty `--salt`, `--ttl 0.5s`), so that a metrics file from an
/// earlier run never looks current; the gauges and the counters that stayed 0 are written on
/// every exit (`fencepost_runs_in_doubt` after an exit 4 as after an exit 5).
#[test]
fn metrics_every_usage_error_and_every_exit_writes_the_report_and_its_zeros() {
    let shared = Shared::sqlite();
    let file = shared.path("fencepost.prom");
    let file_arg = file.to_str().unwrap();
    let ran = shared.run(
        "host-1",
        &run_args("mailer", "1", &["--metrics-file", file_arg], "true"),
    );
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    for bad in [&["--salt", ""][..], &["--ttl", "0.5s"]] {
        let mut args = vec![
            "run",
            "--agent",
            "mailer",
            "--intent",
            "i",
            "--json",
            "--metrics-file",
            file_arg,
        ];
        args.extend_from_slice(bad);
        args.extend(["--", "true"]);
        let output = shared.run("host-1", &args);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {}", text(&output.stderr));
        let stdout = text(&output.stdout);
        let report: serde_json::Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|error| panic!("{bad:?}: {error}: {stdout:?}"));
        assert_eq!(report["outcome"], "usage_error", "{report}");
        assert_eq!(report["agent"], "mailer", "{report}");
        let metrics = scrape(&file);
        assert_eq!(
            sample(&metrics, "fencepost_run_exit_status", &[("agent", "mailer")]),
            Some(2.0),
            "{bad:?}"
        );
    }
    // Exit 4: held by another host; every gauge and the zero counters are there.
    let held = shared.run(
        "host-2",
        &["lease", "acquire", "--agent", "mailer", "--ttl", "1m"],
    );
    assert!(held.status.success(), "{}", text(&held.stderr));
    let output = shared.run(
        "host-1",
        &run_args("mailer", "2", &["--metrics-file", file_arg], "true"),
    );
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let metrics = scrape(&file);
    let agent = [("agent", "mailer")];
    assert_eq!(sample(&metrics, "fencepost_runs_in_doubt", &agent), Some(0.0));
    for counter in [
        "fencepost_lease_losses_total",
        "fencepost_runs_left_in_doubt_total",
        "fencepost_ledger_behind_total",
        "fencepost_ledger_waits_total",
    ] {
        assert_eq!(sample(&metrics, counter, &agent), Some(0.0), "{counter}");
    }
    assert_eq!(sample(&metrics, "fencepost_leases_held", &agent), Some(0.0));
}
