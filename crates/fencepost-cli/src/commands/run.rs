//! `fencepost run`: one occurrence of a command, once across hosts: the attempts within --wait,
//! the lease, the wait for the ledger (rule H3), the fence and the supervised command.

use super::*;

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
/// [`LeaseError::is_transient`], [`DispatchError::is_transient`]): a database or pooler that
/// restarts, refuses logins for a while, lost the connection or did not answer in time.
pub(crate) fn transient(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<RelayError>().is_some_and(RelayError::is_transient)
            || cause.downcast_ref::<LeaseError>().is_some_and(LeaseError::is_transient)
            || cause.downcast_ref::<DispatchError>().is_some_and(DispatchError::is_transient)
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
                plural(missing as u64, "record"),
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
    refuse_damage(&ledger, settings)?;
    refuse_queued_elsewhere(settings, agent, &run_id)?;
    // Known from here on, whatever the run ends with (exit 3, 4, 7 too).
    report.runs_in_doubt = Some(ledger.in_doubt(agent, u64::MAX).len());
    if ledger.committed_run(agent, &run_id).is_some() {
        err!("fencepost: {run_id} of {agent} already committed; not running it again");
        return Ok(EXIT_ALREADY_COMMITTED);
    }
    let coordinator = settings.coordinator()?;
    // A waiting host tries again at least every second, so that it follows a release promptly.
    let config = KeeperConfig {
        acquire_every_ms: (args.ttl / 4).clamp(1, 1_000),
        ..KeeperConfig::new(args.ttl)
    };
    if let Err(error) = config.validate() {
        crate::exit::usage!("--ttl {} ms: {error}", args.ttl);
    }
    // From before the first request for the lease to its release, SIGTERM, SIGINT and SIGHUP
    // are caught: one that comes while the lease is being granted ends fencepost only after it
    // gave the lease back (it used to end it holding the lease for the whole --ttl, so every
    // other host was refused until then). One during a wait for the lease ends the wait.
    let signals = Signals::catch().context("cannot catch SIGTERM and SIGINT")?;
    report.started_acquiring();
    let acquire = |ledger_epoch: u64| {
        LeaseKeeper::builder(coordinator.shared(), agent, &settings.device)
            .config(config)
            .ledger_epoch(ledger_epoch)
            .stop_waiting_when(signals.came())
            .wait_to_acquire(remaining_ms(deadline))
    };
    let mut acquired = acquire(ledger.state().fencing_epoch(agent));
    // A seam for the tests (debug builds only): hold the window just after the grant open, so
    // that a signal can be sent into it.
    #[cfg(debug_assertions)]
    if let Some(pause) = std::env::var("FENCEPOST_TEST_PAUSE_AFTER_ACQUIRE_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        std::thread::sleep(Duration::from_millis(pause));
    }
    // A fresh grant is above every epoch the ledger has seen (the floor was raised to it first).
    // A coordinator that lost or rolled back its state may grant one the ledger has seen: another
    // host's, or this device id's own (another process sharing it, an earlier run); the floor went
    // with that state. Give it back and acquire again above the ledger's epoch, so that no two
    // commands ever hold one fencing token.
    for attempt in 0..=3 {
        let Ok(keeper) = &acquired else {
            break;
        };
        if signals.pending().is_some() {
            break; // given back below
        }
        let synced = ledger.sync().context("cannot sync the ledger");
        if let Err(error) = synced.and_then(|_| refuse_damage(&ledger, settings)) {
            release_quietly(keeper);
            return Err(error);
        }
        let epoch = keeper.epoch();
        let Some(stale) = ledger.stale_grant(agent, epoch, &settings.device) else {
            break;
        };
        let why = match stale {
            StaleGrant::BelowLedger { fencing_epoch } => format!("below the ledger's epoch {fencing_epoch}"),
            StaleGrant::HeldBy { device_id } => format!("already held by {device_id}"),
            _ => format!(
                "already used by device id {} (another process sharing it, or an earlier run)",
                settings.device
            ),
        };
        release_quietly(keeper);
        if attempt == 3 {
            bail!("the coordinator granted epoch {epoch} of {agent}, {why}, four times in a row (it lost or rolled back its state, and keeps doing so); not running {run_id}");
        }
        err!("fencepost: warning: the coordinator granted epoch {epoch} of {agent}, {why} (it lost or rolled back its state); acquiring again above it");
        acquired = acquire(ledger.state().fencing_epoch(agent));
    }
    report.acquired();
    let keeper = match acquired {
        Ok(keeper) => keeper,
        Err(KeeperError::Lease(LeaseError::Held { holder, epoch, .. })) => {
            let named = crate::holder::describe(settings, agent, &holder, epoch);
            if args.wait == 0 {
                err!("fencepost: {agent} is held by {named} at epoch {epoch}; not running {run_id} (use --wait to wait for it)");
            } else {
                err!(
                    "fencepost: {agent} is still held by {named} at epoch {epoch} after waiting {} ms (--wait); not running {run_id}",
                    args.wait
                );
            }
            report.holder = Some(holder);
            return Ok(EXIT_HELD_ELSEWHERE);
        }
        // Exit 4 whenever some attempt reached the coordinator and was refused; 10 only when none
        // did (docs/running.md's exit-status table says so).
        Err(KeeperError::HeldThenFailed { held, last_error }) => {
            err!("fencepost: {held}, and when the wait ran out the last attempt failed ({last_error}); not running {run_id}");
            return Ok(EXIT_HELD_ELSEWHERE);
        }
        Err(KeeperError::Interrupted) => match signals.pending() {
            Some(signal) => {
                err!("fencepost: got {signal} while waiting for the lease of {agent}; {run_id} did not run");
                return Ok(128 + signal as i32);
            }
            None => bail!("the wait for the lease of {agent} was stopped; {run_id} did not run"),
        },
        Err(error) => return Err(error).context(format!("cannot acquire the lease of {agent}")),
    };
    let epoch = keeper.epoch();
    span.record("epoch", epoch);
    report.epoch = Some(epoch);
    // Names this process as the holder, for `status` and for the refusals of other processes
    // of this host (exit 4); removed when the run ends.
    let _holding = crate::holder::Holding::record(settings, agent, epoch, &run_id);
    if let Some(signal) = signals.pending() {
        release_quietly(&keeper);
        signals.release();
        err!("fencepost: got {signal} while the lease of {agent} was being granted; it was given back, and {run_id} did not run");
        return Ok(128 + signal as i32);
    }
    // Rule H3: nothing runs until this host's ledger has every record the earlier holders
    // published (their `pending`s and outcomes): waited for within --wait, holding the lease.
    // From here on the lease is held: a signal gives it back before fencepost ends.
    let waited = wait_for_ledger(&keeper, &mut ledger, settings, &signals, deadline);
    report.waited_for_ledger();
    match waited {
        Ok(LedgerWait::Ready) => {}
        Ok(LedgerWait::Behind(missing)) => {
            release_quietly(&keeper);
            err!("{}", ledger_behind_message(agent, &run_id, &missing, settings));
            return Ok(EXIT_LEDGER_BEHIND);
        }
        Ok(LedgerWait::Signalled(signal)) => {
            release_quietly(&keeper);
            signals.release();
            err!("fencepost: got {signal} while waiting for the ledger; the lease of {agent} was given back, and {run_id} did not run");
            return Ok(128 + signal as i32);
        }
        Err(error) => {
            release_quietly(&keeper);
            return Err(error);
        }
    }
    let options = DispatchOptions::default().retry_in_doubt(args.retry_in_doubt);
    let mut ending = None;
    let mut stopped_before_start = None;
    let mut lost_before_start = false;
    let outcome = dispatch_effect(&keeper, &mut ledger, &run_id, options, |token| {
        // Should fencepost die, the watchdog kills what the command started. It starts before the
        // command, whose process tells it its group before it runs the program, and before the
        // last looks below, so that nothing but the start follows them (a fork and its reads of
        // /proc are no part of that window).
        let watchdog = match Watchdog::start() {
            Ok(watchdog) => Some(watchdog),
            Err(error) => {
                tracing::warn!(%error, "cannot start the watchdog of the command's process group");
                None
            }
        };
        // The command did not start: the watchdog has nothing to kill.
        let stand_down = |watchdog: Option<Watchdog>| {
            if let Some(watchdog) = watchdog {
                watchdog.disarm();
            }
        };
        // A seam for the tests (debug builds only): hold the window between the fence and the
        // start open, so that a signal can be sent into it.
        #[cfg(debug_assertions)]
        if let Some(pause) = std::env::var("FENCEPOST_TEST_PAUSE_BEFORE_COMMAND_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(pause));
        }
        if let Some(signal) = signals.pending() {
            stopped_before_start = Some(signal);
            stand_down(watchdog);
            return EffectOutcome::Failed(format!("fencepost got {signal} before the command started"));
        }
        // The last look before the start, with no I/O: fencepost may have been stopped (SIGSTOP,
        // a suspended machine) since the fence, past its renew deadline.
        if !keeper.holds() {
            lost_before_start = true;
            stand_down(watchdog);
            return EffectOutcome::Failed("the lease was lost before the command started".to_owned());
        }
        let mut command = Command::new(&args.command[0]);
        command
            .args(&args.command[1..])
            .env("FENCEPOST_AGENT", &token.agent_id)
            .env("FENCEPOST_RUN_ID", &token.run_id)
            .env("FENCEPOST_EPOCH", token.epoch.to_string())
            .env("FENCEPOST_DEVICE", &settings.device);
        report.command_started();
        let mut child = match child::spawn(command, watchdog.as_ref()) {
            Ok(child) => child,
            Err(error) => {
                stand_down(watchdog);
                return EffectOutcome::Failed(format!("cannot start {:?}: {error}", args.command[0]));
            }
        };
        let holds = || keeper.holds();
        let supervision = Supervision {
            holds: &holds,
            timeout: args.timeout.map(Duration::from_millis),
            kill_after: Duration::from_millis(args.kill_after),
            signals: &signals,
        };
        let end = child::supervise(&mut child, &supervision);
        report.command_ended();
        let end = match end {
            Ok(end) => end,
            Err(error) => return EffectOutcome::Unknown(format!("cannot wait for the command: {error}")),
        };
        child::stop_leftovers(child.id(), Duration::from_millis(args.kill_after));
        if let Some(watchdog) = watchdog {
            watchdog.disarm();
        }
        // A command that exits by itself reports its outcome; one that fencepost had to stop may
        // have done part of its effect, or all of it: the run stays in doubt unless it exits 0.
        let outcome = match &end {
            Ending::Exited(status) if status.success() => EffectOutcome::Succeeded(()),
            // Killed by a signal fencepost did not send (an operator, the OOM killer): it did not
            // finish, and it may have done part of its effect.
            Ending::Exited(status) if status.code().is_none() => {
                EffectOutcome::Unknown(format!("the command was killed ({status})"))
            }
            Ending::Exited(status) => EffectOutcome::Failed(format!("the command exited with {status}")),
            Ending::LeaseLost(status) | Ending::TimedOut(status) | Ending::Interrupted(_, status)
                if status.success() =>
            {
                EffectOutcome::Succeeded(())
            }
            Ending::LeaseLost(status) => EffectOutcome::Unknown(format!(
                "the lease was lost while the command ran, so it was stopped ({status})"
            )),
            Ending::TimedOut(status) => EffectOutcome::Unknown(format!(
                "the command timed out after {} ms and was stopped ({status})",
                args.timeout.unwrap_or_default()
            )),
            Ending::Interrupted(signal, status) => EffectOutcome::Unknown(format!(
                "fencepost got {signal} and forwarded it to the command, which ended with {status}"
            )),
        };
        ending = Some(end);
        outcome
    });
    // What the run recorded and could not store yet (its outcome; or, when nothing ran, its
    // `pending` and the `failed` that settles it) is written, or queued on this host, before the
    // release, so that the release publishes it (rule H2), and with the signals still caught: one
    // that comes meanwhile queues it at once (it used to end fencepost and lose the outcome).
    let outcome_wait = if outcome.is_ok() {
        args.outcome_wait
    } else {
        remaining_ms(deadline)
    };
    let stored = store_outcome(settings, &mut ledger, outcome_wait, &signals);
    keeper.pushed(&ledger.pushed());
    let shutdown = keeper.shutdown();
    signals.release();
    report.runs_in_doubt = Some(ledger.in_doubt(agent, u64::MAX).len());
    let outcome = match outcome {
        Ok(outcome) => {
            report.dispatch = Some(outcome.kind());
            outcome
        }
        Err(DispatchError::Damaged { .. }) => {
            refuse_damage(&ledger, settings)?;
            bail!("the ledger is damaged")
        }
        Err(error) => {
            if let Err(unstored) = stored {
                tracing::warn!(error = %crate::exit::one_line(&unstored), "could not write nor queue the record of an attempt that did not run");
            }
            return Err(error).context(format!("{run_id} of {agent} could not be dispatched"));
        }
    };
    match shutdown {
        Err(error) => {
            err!("fencepost: warning: could not release the lease of {agent} at epoch {epoch} ({error:#}); it ends with its TTL");
        }
        // A loss the command did not already report (it was noticed only at the release).
        Ok(Shutdown::Lost(loss)) if !matches!(ending, Some(Ending::LeaseLost(_))) => {
            err!(
                "fencepost: warning: the lease of {agent} at epoch {epoch} was lost before it could be released ({:?}); another host may have taken it",
                loss.reason
            );
        }
        Ok(_) => {}
    }
    let ran = if outcome.executed() {
        "ran, but its outcome"
    } else {
        "did not run; its record"
    };
    match stored {
        Ok(Stored::Written) => {}
        Ok(Stored::Queued {
            count,
            path,
            cause,
            passes,
            signal,
        }) => {
            report.queued = count;
            let queued = format!(
                "{run_id} of {agent} {ran} could not be written to {} ({cause}); it is queued on this host in {} ({}), and the next fencepost command of this host that writes to the ledger, or `fencepost ledger flush`, writes it",
                settings.ledger_label(),
                path.display(),
                plural(count as u64, "record")
            );
            if let Some(signal) = signal {
                err!("fencepost: got {signal} while writing the outcome: {queued}");
                return Ok(128 + signal as i32);
            }
            if !passes {
                // The ledger needs a repair first: until then the run is in doubt elsewhere.
                bail!("{queued} once the ledger is repaired; until then other hosts find the run in doubt");
            }
            err!("fencepost: warning: {queued} (it did not come back within --outcome-wait)");
        }
        Err(error) => bail!(
            "{run_id} of {agent} {ran} could not be written to {}, nor queued on this host ({}); the run stays in doubt until `fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed` records it",
            settings.ledger_label(),
            crate::exit::one_line(&error)
        ),
    }
    Ok(match outcome {
        DispatchOutcome::Executed { result: Ok(()), .. } => EXIT_RAN_OK,
        DispatchOutcome::Executed {
            result: Err(reason), ..
        } => {
            match stopped_before_start {
                // Nothing ran: `failed` settles the `pending`, and fencepost exits as the signal
                // says, as it does when the signal comes while it waits.
                Some(signal) => {
                    err!("fencepost: {reason}: {run_id} of {agent} did not run (recorded failed at epoch {epoch})");
                    128 + signal as i32
                }
                None if lost_before_start => {
                    err!("fencepost: {reason}: {run_id} of {agent} did not run (recorded failed at epoch {epoch}; the next run runs it)");
                    EXIT_LEASE_LOST
                }
                None => {
                    err!("fencepost: {run_id} of {agent} ran at epoch {epoch} and failed: {reason}");
                    EXIT_RAN_FAILED
                }
            }
        }
        DispatchOutcome::Interrupted { error, .. } => {
            err!(
                "fencepost: {run_id} of {agent} ran at epoch {epoch} and was interrupted: {error}. \
It may have done its effect, or part of it, so it is in doubt: check, then record it with \
`fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed` or rerun with --retry-in-doubt"
            );
            match ending {
                Some(Ending::LeaseLost(_)) => EXIT_LEASE_LOST,
                _ => EXIT_RAN_FAILED,
            }
        }
        DispatchOutcome::AlreadyCommitted { .. } => {
            err!("fencepost: {run_id} of {agent} already committed; not running it again");
            EXIT_ALREADY_COMMITTED
        }
        DispatchOutcome::InDoubt { run } => {
            err!(
                "fencepost: {run_id} of {agent} is in doubt: {} started it at epoch {} and has recorded no outcome \
(it may still be running there, or its host died mid-command). Check whether its effect happened, then rerun with --retry-in-doubt, or record it with \
`fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed`",
                run.device_id, run.epoch
            );
            EXIT_IN_DOUBT
        }
        DispatchOutcome::ConcurrentAttempt { run } => {
            err!(
                "fencepost: {run_id} of {agent} was started at epoch {} by another process with device id {} just before this one; not running it again (see `fencepost ledger runs`)",
                run.epoch, run.device_id
            );
            EXIT_IN_DOUBT
        }
        DispatchOutcome::StaleEpoch {
            current_epoch,
            current_holder,
            ..
        } => {
            err!("fencepost: lost {agent} to {current_holder} (epoch {current_epoch}) before {run_id} could start");
            EXIT_LEASE_LOST
        }
        DispatchOutcome::NotHeld { .. } => {
            err!("fencepost: lost the lease of {agent} before {run_id} could start");
            EXIT_LEASE_LOST
        }
        DispatchOutcome::LedgerBehind { missing } => {
            err!("{}", ledger_behind_message(agent, &run_id, &missing, settings));
            EXIT_LEDGER_BEHIND
        }
        _ => bail!("an outcome this fencepost does not know"),
    })
}

/// How often `run` syncs its ledger while it waits for what the previous holders published.
pub(super) const LEDGER_POLL: Duration = Duration::from_millis(200);

/// How [`wait_for_ledger`] ended.
pub(super) enum LedgerWait {
    /// The ledger has everything (or the lease was lost meanwhile, which the dispatch reports).
    Ready,
    /// `--wait` ran out; what is still missing.
    Behind(Vec<MissingRecords>),
    /// SIGTERM, SIGINT or SIGHUP came.
    Signalled(nix::sys::signal::Signal),
}

/// Waits, syncing the ledger, until it has every record the agent's earlier holders published
/// (rule H3), until `wait_ms` after `started`, or until a signal comes.
pub(super) fn wait_for_ledger(
    keeper: &LeaseKeeper,
    ledger: &mut Ledger,
    settings: &Settings,
    signals: &Signals,
    deadline: Instant,
) -> Result<LedgerWait> {
    let mut told = false;
    loop {
        // Read right after the grant by the keeper; asked again only when that read failed.
        let published = match keeper.handed_over() {
            Some(frontier) => Ok(frontier),
            None => keeper.coordinator().published_frontier(keeper.agent_id()),
        };
        let now = std::time::Instant::now();
        let missing = match published {
            Ok(frontier) => Some(ledger.behind(&frontier)),
            Err(error) if now >= deadline => {
                return Err(error).context(format!(
                    "cannot read what the previous holders of {} published",
                    keeper.agent_id()
                ));
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the published frontier; trying again");
                None
            }
        };
        let missing = match missing {
            Some(missing) if missing.is_empty() => return Ok(LedgerWait::Ready),
            Some(missing) => missing,
            None => Vec::new(),
        };
        if !keeper.holds() {
            return Ok(LedgerWait::Ready); // the dispatch reports the loss
        }
        if let Some(signal) = signals.pending() {
            return Ok(LedgerWait::Signalled(signal));
        }
        // Another log under a published device id does not turn into the published one by
        // syncing: no use waiting.
        if now >= deadline || missing.iter().any(|missing| missing.differs) {
            return Ok(LedgerWait::Behind(missing));
        }
        if !told && !missing.is_empty() {
            told = true;
            metrics::counter!(crate::report::LEDGER_WAITS, "agent" => keeper.agent_id().to_owned())
                .increment(1);
            err!(
                "fencepost: waiting for this host's ledger to receive what the previous holder of {} recorded: {}",
                keeper.agent_id(),
                describe_missing(&missing)
            );
        }
        std::thread::sleep(LEDGER_POLL.min(deadline - now));
        ledger.sync().context("cannot sync the ledger")?;
        refuse_damage(ledger, settings)?;
    }
}

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
    format!(
        "fencepost: not run: this host's ledger has not yet received what the previous holder of {agent} recorded (missing: {}), so {run_id} could have run or be running elsewhere. \
Check that {} is the ledger every host shares (FENCEPOST_LEDGER) and that it syncs or is reachable, then run again, or wait longer with --wait \
(if those records are lost for good, --accept-damaged DEVICE runs without them, and what they recorded may run again)",
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
