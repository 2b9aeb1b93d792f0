//! `fencepost run`: one occurrence of a command, once across hosts: the attempts within --wait,
//! the lease, the wait for the ledger (rule H3), the fence and the supervised command.

use super::*;

use std::cell::RefCell;
use std::sync::Arc;

use crate::exit::EXIT_ERROR;
use fencepost::run::{EffectContext, Occurrence, Outcome, RunError, RunHooks, RunOptions};
use fencepost::session::{SessionEnd, Stage};

mod command;
mod ended;
mod hooks;

use command::*;
use ended::*;
use hooks::*;

/// The shortest `--ttl` accepted: the keeper renews every third of the TTL and gives the lease up
/// at two thirds, so shorter ones leave no room for a scheduling hiccup.
pub const MIN_TTL_MS: u64 = 1_000;

/// A value that must not be empty (an empty `--salt` from a failed `$(date)` would merge every
/// occurrence into one).
pub(super) fn non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("must not be empty".to_owned())
    } else {
        Ok(text.to_owned())
    }
}

/// `fencepost run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The agent: the unit that holds a lease (one job, one bot).
    #[arg(long)]
    pub agent: String,
    /// What the command does, in words ("send the daily report"): part of the run id.
    #[arg(long, value_parser = non_empty)]
    pub(super) intent: String,
    /// Which occurrence (a date, a ticket number): part of the run id. Same salt, same run. Must not
    /// be empty.
    #[arg(long, value_parser = non_empty)]
    pub(super) salt: String,
    /// The lease's time to live while the command runs; it is renewed in the background. At least
    /// 1s.
    #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
    pub(super) ttl: u64,
    /// How long to wait for another host's lease to end before giving up (exit 4), and then, all
    /// told, for this host's ledger to receive what the previous holders recorded (exit 7).
    #[arg(long, default_value = "0s", value_parser = parse_duration_ms, value_name = "DURATION")]
    pub(super) wait: u64,
    /// How long to keep trying to write the command's outcome to the ledger (a database
    /// restarting, a lost connection) before it is queued on this host instead: the next
    /// fencepost command of this host that writes to the ledger, or `fencepost ledger flush`,
    /// writes it (`fencepost status` lists what is queued). Never dropped.
    #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
    pub(super) outcome_wait: u64,
    /// Stop the command if it still runs after this long (SIGTERM to its process group, SIGKILL
    /// after --kill-after): exit 1, and unless it still exits 0 the run is in doubt (it may have
    /// done part of its effect).
    #[arg(long, value_parser = parse_nonzero_duration_ms, value_name = "DURATION")]
    pub(super) timeout: Option<u64>,
    /// How long a command has to exit after SIGTERM before it gets SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration_ms, value_name = "DURATION")]
    pub(super) kill_after: u64,
    /// Run an in-doubt occurrence again (after checking that its effect did not happen, or when
    /// running it twice is harmless).
    #[arg(long)]
    pub(super) retry_in_doubt: bool,
    /// Run although the ledger file of DEVICE is damaged, or although records of DEVICE that the
    /// agent's earlier holders published never reached this host's ledger (exit 7 names them):
    /// the runs they recorded may run again. DEVICE is a device id (a file's name only for a file
    /// whose device cannot be read). Recorded in this device's log. Repeat for several.
    #[arg(long, value_name = "DEVICE")]
    pub(super) accept_damaged: Vec<String>,
    /// At the end, print one JSON object on stdout: the run id, agent, device, epoch, outcome,
    /// exit status and the durations of the acquire, the wait for the ledger and the command.
    #[arg(long)]
    pub json: bool,
    /// At the end, write the run's metrics to FILE in Prometheus' text format (replaced whole,
    /// atomically; for node_exporter's textfile collector, name it *.prom in its folder).
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
    /// The command and its arguments (passed on byte for byte, UTF-8 or not).
    #[arg(last = true, required = true, value_name = "COMMAND", value_parser = clap::value_parser!(std::ffi::OsString))]
    pub(super) command: Vec<std::ffi::OsString>,
    #[command(flatten)]
    pub global: crate::settings::Global,
}

/// Refuses (exit 10) to decide on `run` of `agent` while this host holds an outcome of it in a
/// queue of another ledger key (the same database named otherwise, `localhost` for
/// `127.0.0.1`): found by an adversarial test, a run resolved `failed` so ran again elsewhere.
pub(super) fn refuse_queued_elsewhere(settings: &Settings, agent: &str, run: &str) -> Result<()> {
    match settings.queued_elsewhere(agent, run) {
        Some(path) => bail!(
            "an outcome of {run} of {agent} waits on this host in {}, queued for another ledger or for this one named otherwise (another host name for the server): write it with `fencepost ledger flush` and the --ledger or --coordinator it was queued for, then run again",
            path.display()
        ),
        None => Ok(()),
    }
}

/// How many times a reading that finds only a device file pruned while it read starts over
/// (pauses of 50 ms more each time, 1.4 s in all): three were not always enough while three
/// hosts pruned one folder in a loop (1 compaction of 1 452 refused in CI).
pub(super) const PRUNED_READINGS: u32 = 8;

/// Whether the ledger's only damage is what another host's prune while it read, or a sync that
/// has not brought everything yet, explains: a device file that begins after what the reading
/// lacks ([`ProblemKind::Pruned`]), or that holds less than a checkpoint or the snapshot read
/// ([`ProblemKind::Behind`]).
pub(super) fn only_lagging(ledger: &Ledger) -> bool {
    let damage = ledger.damage();
    !damage.is_empty()
        && damage
            .iter()
            .all(|problem| matches!(problem.kind, ProblemKind::Pruned | ProblemKind::Behind))
}

/// A refusal ([`refuse_damage`]) whose only damage a prune or a sync explains ([`only_lagging`]):
/// `run` starts its attempt over (a file pruned while the ledger read it is read again from the
/// newest checkpoint), then, in a ledger folder, waits for the sync within --wait; its last
/// attempt reports it (exit 7). It says what the refusal says.
#[derive(Debug)]
pub(super) struct Lagging(pub(super) String);

impl std::fmt::Display for Lagging {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for Lagging {}

/// `fencepost run` with its report: the run, then `--metrics-file` and `--json`.
pub fn run_reporting(args: RunArgs) -> Result<i32> {
    let prometheus = match &args.metrics_file {
        Some(_) => Some(report::install_recorder()?),
        None => None,
    };
    if prometheus.is_some() {
        report::register_zeros(&args.agent);
    }
    let mut report = RunReport::new(&args.agent);
    let outcome = Settings::resolve(&args.global).and_then(|settings| {
        report.device = Some(settings.device.clone());
        run(&settings, &args, &mut report)
    });
    let (exit_status, error) = match &outcome {
        Ok(code) => (*code, None),
        Err(error) => (
            crate::exit::exit_status_of_error(error),
            Some(crate::exit::one_line(error)),
        ),
    };
    report.finish(exit_status, error);
    if let (Some(path), Some(handle)) = (&args.metrics_file, &prometheus) {
        if let Err(error) = report::write_metrics(handle, &report, path) {
            err!("fencepost: warning: {}", crate::exit::one_line(&error));
        }
    }
    if args.json {
        match serde_json::to_string(&report) {
            Ok(line) => out!("{line}"),
            Err(error) => err!("fencepost: warning: cannot write the report as JSON: {error}"),
        }
    }
    outcome
}

/// `fencepost run`: an attempt, started over before its command ran when a device file was
/// pruned while it read the ledger (up to 7 times; found by an adversarial test: hosts pruning
/// while others ran stopped healthy runs with exit 10, as damage), and when the database failed
/// in a way that passes by itself (a restart, PgBouncer refusing logins meanwhile, a lost
/// connection: [`transient`]) while `--wait` lasts. The last attempt reports what stopped it.
pub fn run(settings: &Settings, args: &RunArgs, report: &mut RunReport) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_millis(args.wait);
    let mut pruned = 0;
    let mut pause = Duration::from_millis(100);
    let mut told = false;
    loop {
        match run_attempt(settings, args, report, deadline) {
            // A file pruned while the ledger read it: read again at once, a few times. Not when
            // damage is accepted: each attempt would record its acceptance again (found by an
            // adversarial test: 52 records of one run waiting with --accept-damaged).
            Err(error)
                if args.accept_damaged.is_empty()
                    && pruned + 1 < PRUNED_READINGS
                    && error.chain().any(|cause| cause.is::<Lagging>()) =>
            {
                pruned += 1;
                tracing::debug!(
                    attempt = pruned,
                    "a device file was pruned while the ledger read it; starting over"
                );
                std::thread::sleep(Duration::from_millis(50 * u64::from(pruned)));
            }
            // Still lagging: a device file came before the checkpoint that covers what was
            // removed from it, or a checkpoint before the records of a file (a synced folder
            // carries files in any order; issue 37, item 2). The sync brings them as it brings
            // any record: waited for within --wait, as exit 7 waits for records the previous
            // holder published, and then exit 7, not damage (at once when damage is accepted).
            // (A database has no sync to wait for: there it stays damage.)
            Err(error)
                if settings.ledger_kind == LedgerKind::Folder
                    && error.chain().any(|cause| cause.is::<Lagging>()) =>
            {
                if !args.accept_damaged.is_empty() || Instant::now() + pause >= deadline {
                    err!("fencepost: {}", crate::exit::one_line(&error));
                    return Ok(EXIT_LEDGER_BEHIND);
                }
                if !told {
                    told = true;
                    err!(
                        "fencepost: {}; waiting for it while --wait lasts",
                        crate::exit::one_line(&error)
                    );
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(error) if transient(&error) && Instant::now() + pause < deadline => {
                if !told {
                    told = true;
                    err!(
                        "fencepost: {}; trying again while --wait lasts",
                        crate::exit::one_line(&error)
                    );
                }
                tracing::debug!(error = %crate::exit::one_line(&error), "a failure that may pass; starting over");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            ended => return ended,
        }
    }
}

/// Whether `error` may pass by itself ([`RelayError::is_transient`],
/// [`LeaseError::is_transient`], [`DispatchError::is_transient`],
/// [`LedgerError::is_transient`]): a database or pooler that
/// restarts, refuses logins for a while, lost the connection or did not answer in time.
pub(crate) fn transient(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<RelayError>().is_some_and(RelayError::is_transient)
            || cause.downcast_ref::<LeaseError>().is_some_and(LeaseError::is_transient)
            || cause.downcast_ref::<DispatchError>().is_some_and(DispatchError::is_transient)
            || cause.downcast_ref::<LedgerError>().is_some_and(LedgerError::is_transient)
            || matches!(cause.downcast_ref::<KeeperError>(), Some(KeeperError::Lease(error)) if error.is_transient())
    })
}

/// What is left of the time until `deadline`, in ms.
pub(super) fn remaining_ms(deadline: Instant) -> u64 {
    u64::try_from(deadline.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
}

pub(super) fn run_attempt(
    settings: &Settings,
    args: &RunArgs,
    report: &mut RunReport,
    deadline: Instant,
) -> Result<i32> {
    if args.ttl < MIN_TTL_MS {
        crate::exit::usage!(
            "--ttl {} ms is too short: at least {} ms, so that the lease can be renewed while the command runs",
            args.ttl,
            MIN_TTL_MS
        );
    }
    if let Err(error) = validate_id(IdKind::Agent, &args.agent) {
        crate::exit::usage!("--agent {:?}: {error}", args.agent);
    }
    let run_id = match deterministic_run_id(&args.agent, &args.intent, &args.salt) {
        Ok(run_id) => run_id,
        Err(error) => crate::exit::usage!("cannot name the run: {error}"),
    };
    let agent = args.agent.as_str();
    report.run_id = Some(run_id.clone());
    // Every log line of the run carries these (`--log-format json`: the span's fields).
    let span = tracing::error_span!(
        "run",
        agent = %agent,
        run_id = %run_id,
        device = %settings.device,
        epoch = tracing::field::Empty
    );
    let _in_span = span.enter();
    let mut ledger = open_ledger_with(settings, Access::Write, true, false)?;
    let repaired = repair_went_back(&mut ledger, settings, ", and runs on")?;
    accept_damaged(settings, args, &mut ledger, &repaired)?;
    refuse_damage(&ledger, settings)?;
    ledger.refuse_if_revoked()?;
    refuse_queued_elsewhere(settings, agent, &run_id)?;
    // Known from here on, whatever the run ends with (exit 3, 4, 7 too).
    report.runs_in_doubt = Some(ledger.in_doubt(agent, u64::MAX).len());
    // On a protected ledger the session decides (a commit counts only once the ledger has the
    // revocations the agent's earlier holders read: rule M4).
    if !ledger.is_protected() && ledger.committed_run(agent, &run_id).is_some() {
        err!("fencepost: {run_id} of {agent} already committed; not running it again");
        return Ok(EXIT_ALREADY_COMMITTED);
    }
    run_session(settings, args, report, deadline, &mut ledger, &run_id, &span)
}

/// `--accept-damaged`: records each device's damage and published records lost as accepted
/// (a usage error when there is nothing of the device to accept).
fn accept_damaged(
    settings: &Settings,
    args: &RunArgs,
    ledger: &mut Ledger,
    repaired: &BTreeSet<String>,
) -> Result<()> {
    // What earlier holders published, read once: accepting a device's lost records waives only
    // those published by now (rule H3); any published later are waited for.
    let mut published = None;
    for device in &args.accept_damaged {
        let covered = ledger
            .accept_damage(device)
            .context("cannot record the accepted damage")?;
        if covered > 0 {
            err!(
                "fencepost: accepting the damage of {device:?} ({}); runs it recorded may run again",
                plural(covered as u64, "problem")
            );
        }
        // Records of the device that earlier holders published and that never arrived (exit 7
        // names them): lost for good, the operator says.
        if published.is_none() {
            published = Some(
                settings
                    .coordinator()?
                    .published_frontier(&args.agent)
                    .with_context(|| format!("cannot read what the holders of {} published", args.agent))?,
            );
        }
        let missing = match &published {
            Some(frontier) => ledger
                .accept_missing(device, frontier)
                .context("cannot record the accepted loss")?,
            None => 0,
        };
        if missing > 0 {
            err!(
                "fencepost: accepting that {} of {device:?} that earlier holders of {} published {} lost; runs they recorded may run again",
                plural(missing, "record"),
                args.agent,
                if missing == 1 { "is" } else { "are" }
            );
        }
        if covered == 0 && missing == 0 && !repaired.contains(device) {
            crate::exit::usage!(
                "--accept-damaged {device:?}: no damage of that device (or file) in {}, and no record of it missing; `fencepost ledger verify` lists what is damaged",
                settings.ledger_label()
            );
        }
    }
    Ok(())
}

/// The run session of `run` ([`fencepost::run::run_once_with`]): the lease, the wait for the
/// ledger, the fence, the supervised command and its outcome, reported with `run`'s words and
/// exit statuses.
fn run_session(
    settings: &Settings,
    args: &RunArgs,
    report: &mut RunReport,
    deadline: Instant,
    ledger: &mut Ledger,
    run_id: &str,
    span: &tracing::Span,
) -> Result<i32> {
    let agent = args.agent.as_str();
    let coordinator = settings.coordinator()?;
    // A waiting host tries again at least every second, so that it follows a release promptly.
    let options = RunOptions::new(args.ttl)
        .wait_ms(remaining_ms(deadline))
        .poll_ms(LEDGER_POLL_MS)
        .retry_in_doubt(args.retry_in_doubt);
    if let Err(error) = options.keeper_config().validate() {
        crate::exit::usage!("--ttl {} ms: {error}", args.ttl);
    }
    // From before the first request for the lease to its release, SIGTERM, SIGINT and SIGHUP
    // are caught: one that comes while the lease is being granted ends fencepost only after it
    // gave the lease back (it used to end it holding the lease for the whole --ttl, so every
    // other host was refused until then). One during a wait for the lease ends the wait.
    let signals = Signals::catch().context("cannot catch SIGTERM and SIGINT")?;
    let came = signals.came();
    let options = options.stop_when(Arc::new(came));
    let occurrence = match Occurrence::of_run(agent, run_id) {
        Ok(occurrence) => occurrence,
        Err(error) => crate::exit::usage!("cannot name the run: {error}"),
    };
    let report = RefCell::new(report);
    let mut hooks = CliHooks {
        settings,
        args,
        report: &report,
        signals: &signals,
        span,
        run_id,
        deadline,
        holding: None,
        dispatched: false,
        stored: None,
        release: None,
    };
    let mut command = CommandRun::default();
    let ran = fencepost::run::run_once_with(
        coordinator.shared(),
        ledger,
        &occurrence,
        &options,
        &mut hooks,
        |context| command.run(settings, args, &signals, &report, context),
    );
    signals.release();
    let CliHooks {
        dispatched,
        stored,
        release,
        ..
    } = hooks;
    let report = report.into_inner();
    if dispatched {
        report.runs_in_doubt = Some(ledger.in_doubt(agent, u64::MAX).len());
    }
    let outcome = match ran {
        Ok(outcome) => outcome,
        Err(error) => return run_error(error, ledger, settings, run_id, agent, stored),
    };
    if dispatched {
        report.dispatch = Some(outcome.kind());
    }
    let ended = Ended {
        settings,
        args,
        agent,
        run_id,
        epoch: report.epoch.unwrap_or_default(),
        command: &command,
        signal: signals.pending(),
        revoked: ledger
            .members()
            .into_iter()
            .filter_map(|(device, cut)| Some((device.to_string(), cut?)))
            .collect(),
    };
    ended.warn_release(release.as_ref());
    if let Some(stored) = stored {
        if let Some(status) = ended.report_stored(stored, outcome.executed(), report)? {
            return Ok(status);
        }
    }
    Ok(ended.exit_status(outcome, report))
}

/// How often `run` syncs its ledger while it waits for what the previous holders published.
pub(super) const LEDGER_POLL_MS: u64 = 200;

/// The devices and records missing, in a line.
pub(super) fn describe_missing(missing: &[MissingRecords]) -> String {
    missing
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What exit 7 says.
pub(super) fn ledger_behind_message(
    agent: &str,
    run_id: &str,
    missing: &[MissingRecords],
    settings: &Settings,
) -> String {
    let protected = settings.membership_file().is_ok_and(|path| path.exists());
    let unread = if protected {
        format!(
            ". The ledger is protected: records this host cannot open are missing too. If device {} is not admitted yet, a member runs `fencepost device admit KEY --device {}` with the line `fencepost device key` prints here; `fencepost ledger verify` says why each record is not counted",
            settings.device, settings.device
        )
    } else {
        String::new()
    };
    format!(
        "fencepost: not run: this host's ledger has not yet received what the previous holder of {agent} recorded (missing: {}), so {run_id} could have run or be running elsewhere. \
Check that {} is the ledger every host shares (FENCEPOST_LEDGER) and that it syncs or is reachable, then run again, or wait longer with --wait \
(if those records are lost for good, --accept-damaged DEVICE runs without them, and what they recorded may run again){unread}",
        describe_missing(missing),
        settings.ledger_label()
    )
}

/// Releases after a failure; the failure is what gets reported.
pub(super) fn release_quietly(keeper: &LeaseKeeper) {
    if let Err(error) = keeper.shutdown() {
        tracing::warn!(%error, "could not release the lease");
    }
}
