//! What `fencepost run` reports at its end: one JSON object on stdout (`--json`) and its
//! metrics in Prometheus' text format (`--metrics-file`), both from one [`RunReport`].

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::exit::{
    EXIT_ALREADY_COMMITTED, EXIT_HELD_ELSEWHERE, EXIT_IN_DOUBT, EXIT_LEASE_LOST, EXIT_LEDGER_BEHIND,
    EXIT_RAN_FAILED, EXIT_RAN_OK, EXIT_USAGE,
};

/// Metric: the exit status of the agent's last run (gauge; label `agent`).
pub const RUN_EXIT_STATUS: &str = "fencepost_run_exit_status";
/// Metric: the durations of the last run's phases in seconds (gauge; labels `agent`, `phase` =
/// `acquire`, `wait`, `command`, `total`).
pub const RUN_DURATION_SECONDS: &str = "fencepost_run_duration_seconds";
/// Metric: when the last run ended, in seconds since the Unix epoch (gauge; label `agent`).
pub const RUN_END_TIMESTAMP: &str = "fencepost_run_end_timestamp_seconds";
/// Metric: the last run's outcome, 1 for the outcome it had (gauge; labels `agent`, `outcome`).
pub const RUN_OUTCOME: &str = "fencepost_run_outcome";
/// Metric: waits of `run` for this host's ledger to receive what earlier holders published
/// (rule H3; counter; label `agent`): how long it waited is the `wait` phase.
pub const LEDGER_WAITS: &str = "fencepost_ledger_waits_total";
/// Metric: the agent's runs in doubt in this host's ledger when the run ended (gauge; label
/// `agent`).
pub const RUNS_IN_DOUBT: &str = "fencepost_runs_in_doubt";
/// Metric: records of the agent's last run queued on this host, not yet in the ledger (gauge;
/// label `agent`).
pub const RUN_QUEUED: &str = "fencepost_run_queued_records";

/// The durations of a run's phases, in milliseconds (absent when the run did not get there).
#[derive(Debug, Default, Clone, Serialize)]
pub struct Durations {
    /// From the first request for the lease to the grant (waiting for another holder included).
    pub acquire: Option<u64>,
    /// From the grant until this host's ledger had what earlier holders published (rule H3).
    pub wait: Option<u64>,
    /// From the command's start to its end.
    pub command: Option<u64>,
    /// The whole of `fencepost run`.
    pub total: u64,
}

/// What one `fencepost run` did.
#[derive(Debug, Default, Serialize)]
pub struct RunReport {
    /// The run id (absent when the arguments could not name one).
    pub run_id: Option<String>,
    /// The agent.
    pub agent: String,
    /// This host's device id (absent when the settings could not be resolved).
    pub device: Option<String>,
    /// The epoch granted (the fencing token), if one was.
    pub epoch: Option<u64>,
    /// What happened, by the exit status: `succeeded`, `failed`, `usage_error`,
    /// `already_committed`, `held_elsewhere`, `in_doubt`, `lease_lost`, `ledger_behind`,
    /// `error` or `signalled`.
    pub outcome: &'static str,
    /// fencepost's exit status.
    pub exit_status: i32,
    /// The dispatch's own outcome when it got that far (`succeeded`, `failed`, `interrupted`,
    /// `in_doubt`, …: `DispatchOutcome::kind`).
    pub dispatch: Option<&'static str>,
    /// Whether the run is in doubt now (interrupted, or found in doubt): check whether its
    /// effect happened before running it again.
    pub in_doubt: bool,
    /// The agent's runs in doubt in this host's ledger at the end.
    pub runs_in_doubt: Option<usize>,
    /// How many records of the run (its outcome) are queued on this host, not yet in the ledger
    /// (`--outcome-wait` ran out; the next command, or `fencepost ledger flush`, writes them).
    pub queued: usize,
    /// The holder that refused the lease (exit 4).
    pub holder: Option<String>,
    /// The error (exit 2 and 10).
    pub error: Option<String>,
    /// How long each phase took.
    pub durations_ms: Durations,
    #[serde(skip)]
    started: Option<Instant>,
    #[serde(skip)]
    phase_started: Option<Instant>,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl RunReport {
    pub(crate) fn new(agent: &str) -> Self {
        Self {
            agent: agent.to_owned(),
            outcome: "error",
            started: Some(Instant::now()),
            ..Self::default()
        }
    }

    /// The first request for the lease is about to go out.
    pub fn started_acquiring(&mut self) {
        self.phase_started = Some(Instant::now());
        self.durations_ms.wait = None;
        self.durations_ms.command = None;
    }

    /// The lease was granted (or refused).
    pub fn acquired(&mut self) {
        self.durations_ms.acquire = self.phase_started.map(|started| millis(started.elapsed()));
        self.phase_started = Some(Instant::now());
    }

    /// The wait for the ledger ended.
    pub fn waited_for_ledger(&mut self) {
        self.durations_ms.wait = self.phase_started.map(|started| millis(started.elapsed()));
    }

    /// The command is about to start.
    pub fn command_started(&mut self) {
        self.phase_started = Some(Instant::now());
    }

    /// The command ended.
    pub fn command_ended(&mut self) {
        self.durations_ms.command = self.phase_started.map(|started| millis(started.elapsed()));
    }

    pub(crate) fn finish(&mut self, exit_status: i32, error: Option<String>) {
        self.exit_status = exit_status;
        self.error = error;
        self.outcome = match exit_status {
            EXIT_RAN_OK => "succeeded",
            EXIT_RAN_FAILED => "failed",
            EXIT_USAGE => "usage_error",
            EXIT_ALREADY_COMMITTED => "already_committed",
            EXIT_HELD_ELSEWHERE => "held_elsewhere",
            EXIT_IN_DOUBT => "in_doubt",
            EXIT_LEASE_LOST => "lease_lost",
            EXIT_LEDGER_BEHIND => "ledger_behind",
            code if code > 128 => "signalled",
            _ => "error",
        };
        self.in_doubt = matches!(
            self.dispatch,
            Some("interrupted" | "in_doubt" | "concurrent_attempt")
        );
        self.durations_ms.total = self.started.map_or(0, |started| millis(started.elapsed()));
    }
}

/// A `fencepost run` whose arguments could not be parsed (clap's usage error, `error`): its
/// report all the same when the arguments ask for one (`--json`, `--metrics-file PATH`), as
/// for every other usage error, so that a stale metrics file never looks current. Looks at the
/// raw `arguments` (the program's name first); does nothing for another subcommand.
pub fn report_unparsed_run(arguments: &[String], error: &str) {
    let Some(run) = unparsed_run(arguments) else {
        return;
    };
    let mut report = RunReport::new(run.agent.as_deref().unwrap_or(""));
    report.finish(EXIT_USAGE, Some(error.trim().to_owned()));
    if let Some(path) = &run.metrics_file {
        let written = install_recorder().and_then(|handle| {
            register_zeros(&report.agent);
            write_metrics(&handle, &report, Path::new(path))
        });
        if let Err(error) = written {
            err!("fencepost: warning: {}", crate::exit::one_line(&error));
        }
    }
    if run.json {
        match serde_json::to_string(&report) {
            Ok(line) => out!("{line}"),
            Err(error) => err!("fencepost: warning: cannot write the report as JSON: {error}"),
        }
    }
}

/// The library's counters of `agent` that stayed 0, and this binary's, written as 0
/// ([`fencepost::metrics::register_zeros`]).
pub(crate) fn register_zeros(agent: &str) {
    fencepost::metrics::register_zeros(agent);
    metrics::counter!(LEDGER_WAITS, "agent" => agent.to_owned()).increment(0);
}

/// What the raw arguments of a `run` say of its report.
#[derive(Debug, Default, PartialEq, Eq)]
struct UnparsedRun {
    agent: Option<String>,
    json: bool,
    metrics_file: Option<String>,
}

/// The report options of `arguments` when their subcommand is `run` (the first argument that
/// is neither an option nor an option's value); up to `--`, after which the command's own are.
fn unparsed_run(arguments: &[String]) -> Option<UnparsedRun> {
    const TAKES_VALUE: [&str; 5] = [
        "--coordinator",
        "--ledger",
        "--device",
        "--config",
        "--log-format",
    ];
    let mut rest = arguments.iter().skip(1);
    loop {
        let argument = rest.next()?;
        if TAKES_VALUE.contains(&argument.as_str()) {
            rest.next();
        } else if !argument.starts_with('-') {
            if argument != "run" {
                return None;
            }
            break;
        }
    }
    let mut run = UnparsedRun::default();
    let mut rest = rest.take_while(|argument| *argument != "--");
    while let Some(argument) = rest.next() {
        let (name, inline) = match argument.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (argument.as_str(), None),
        };
        match name {
            "--json" => run.json = true,
            "--metrics-file" => run.metrics_file = inline.or_else(|| rest.next().cloned()),
            "--agent" => run.agent = inline.or_else(|| rest.next().cloned()),
            _ => {}
        }
    }
    Some(run)
}

/// Installs the Prometheus recorder that `--metrics-file` renders (duration histograms with
/// buckets from 1 ms to 60 s).
pub(crate) fn install_recorder() -> Result<metrics_exporter_prometheus::PrometheusHandle> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0])
        .context("cannot set up the metrics")?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .context("cannot set up the metrics (a recorder is installed already)")?;
    fencepost::metrics::describe();
    metrics::describe_gauge!(RUN_EXIT_STATUS, "Exit status of the agent's last fencepost run.");
    metrics::describe_gauge!(
        RUN_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Durations of the last run's phases: acquire, wait (for the ledger), command, total."
    );
    metrics::describe_gauge!(
        RUN_END_TIMESTAMP,
        metrics::Unit::Seconds,
        "When the agent's last fencepost run ended (seconds since the Unix epoch)."
    );
    metrics::describe_gauge!(RUN_OUTCOME, "The last run's outcome: 1 for the outcome it had.");
    metrics::describe_counter!(
        LEDGER_WAITS,
        "Waits for this host's ledger to receive what earlier holders published."
    );
    metrics::describe_gauge!(
        RUN_QUEUED,
        "Records of the agent's last run queued on this host because the ledger could not be written (--outcome-wait ran out)."
    );
    metrics::describe_gauge!(
        RUNS_IN_DOUBT,
        "The agent's runs in doubt in this host's ledger when the run ended."
    );
    Ok(handle)
}

/// Every value of [`RunReport::outcome`].
const OUTCOMES: [&str; 10] = [
    "succeeded",
    "failed",
    "usage_error",
    "already_committed",
    "held_elsewhere",
    "in_doubt",
    "lease_lost",
    "ledger_behind",
    "signalled",
    "error",
];

/// Sets the run's gauges, renders every metric and replaces `path` with them atomically (a
/// temporary file beside it, renamed over it: the textfile collector never reads half a file).
pub(crate) fn write_metrics(
    handle: &metrics_exporter_prometheus::PrometheusHandle,
    report: &RunReport,
    path: &Path,
) -> Result<()> {
    let agent = report.agent.clone();
    metrics::gauge!(RUN_EXIT_STATUS, "agent" => agent.clone()).set(f64::from(report.exit_status));
    let phases = [
        ("acquire", report.durations_ms.acquire),
        ("wait", report.durations_ms.wait),
        ("command", report.durations_ms.command),
        ("total", Some(report.durations_ms.total)),
    ];
    for (phase, ms) in phases {
        if let Some(ms) = ms {
            metrics::gauge!(RUN_DURATION_SECONDS, "agent" => agent.clone(), "phase" => phase)
                .set(ms as f64 / 1000.0);
        }
    }
    let now_ms = fencepost::clock::system_clock()();
    metrics::gauge!(RUN_END_TIMESTAMP, "agent" => agent.clone()).set(now_ms as f64 / 1000.0);
    // Every outcome, 1 for the one the run had and 0 for the others (no series left missing).
    for outcome in OUTCOMES {
        let value = if outcome == report.outcome { 1.0 } else { 0.0 };
        metrics::gauge!(RUN_OUTCOME, "agent" => agent.clone(), "outcome" => outcome).set(value);
    }
    metrics::gauge!(RUN_QUEUED, "agent" => agent.clone()).set(report.queued as f64);
    if let Some(count) = report.runs_in_doubt {
        metrics::gauge!(RUNS_IN_DOUBT, "agent" => agent).set(count as f64);
    }
    let text = handle.render();
    // A link is followed (the file it names is replaced); anything but a regular file is left
    // alone (found by an adversarial run: `--metrics-file /dev/full` replaced the device).
    let path = match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_symlink() => std::fs::canonicalize(path)
            .with_context(|| format!("--metrics-file {}: cannot follow the link", path.display()))?,
        _ => path.to_path_buf(),
    };
    if let Ok(metadata) = std::fs::metadata(&path) {
        if !metadata.is_file() {
            anyhow::bail!(
                "--metrics-file {} is not a regular file (a device, a folder, a FIFO?): not replacing it; the metrics were not written",
                path.display()
            );
        }
    }
    path.file_name()
        .with_context(|| format!("--metrics-file {}: not a file name", path.display()))?;
    // Hidden, and short whatever the file's name (a name near the limit must still work).
    let temporary = path.with_file_name(format!(".fencepost-metrics.tmp-{}", std::process::id()));
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, &path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&temporary);
        })
        .with_context(|| format!("cannot write the metrics to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(arguments: &[&str]) -> Vec<String> {
        arguments.iter().map(|argument| (*argument).to_owned()).collect()
    }

    #[test]
    fn cli_the_report_options_of_an_unparsed_run_are_found_up_to_the_command() {
        let found = unparsed_run(&strings(&[
            "fencepost",
            "--coordinator",
            "run",
            "run",
            "--agent=a",
            "--json",
            "--metrics-file",
            "m.prom",
            "--",
            "--json",
        ]));
        assert_eq!(
            found,
            Some(UnparsedRun {
                agent: Some("a".to_owned()),
                json: true,
                metrics_file: Some("m.prom".to_owned())
            })
        );
        assert_eq!(
            unparsed_run(&strings(&[
                "fencepost",
                "run",
                "--agent",
                "a",
                "--",
                "x",
                "--json"
            ])),
            Some(UnparsedRun {
                agent: Some("a".to_owned()),
                ..UnparsedRun::default()
            })
        );
        assert_eq!(unparsed_run(&strings(&["fencepost", "status", "--json"])), None);
        assert_eq!(unparsed_run(&strings(&["fencepost"])), None);
    }

    #[test]
    fn report_outcome_follows_the_exit_status() {
        for (code, outcome) in [
            (0, "succeeded"),
            (1, "failed"),
            (2, "usage_error"),
            (3, "already_committed"),
            (4, "held_elsewhere"),
            (5, "in_doubt"),
            (6, "lease_lost"),
            (7, "ledger_behind"),
            (10, "error"),
            (143, "signalled"),
        ] {
            let mut report = RunReport::new("agent");
            report.finish(code, None);
            assert_eq!(report.outcome, outcome, "exit {code}");
        }
    }
}
