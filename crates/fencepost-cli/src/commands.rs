//! The subcommands.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fencepost::clock::system_clock;
use fencepost::dispatch::{
    dispatch_effect, DispatchError, DispatchOptions, DispatchOutcome, EffectOutcome, Ledger, LedgerOptions,
    MissingRecords, RunOutcome, StaleGrant,
};
use fencepost::id::{validate_id, IdKind};
use fencepost::keeper::{KeeperConfig, KeeperError, LeaseKeeper, Shutdown};
use fencepost::lease::{IntentStatus, Lease, LeaseError, MAX_EPOCH, MAX_EPOCH_FLOOR};
use fencepost::ledger::{CompactOptions, Retention};
use fencepost::oplog::{OpRecord, Surface};
use fencepost::relay::{Frontier, ProblemKind, RelayError};
use fencepost::run_id::deterministic_run_id;
use serde_json::json;

use crate::child::{self, Ending, Signals, Supervision, Watchdog};
use crate::exit::{
    EXIT_ALREADY_COMMITTED, EXIT_HELD_ELSEWHERE, EXIT_IN_DOUBT, EXIT_LEASE_LOST, EXIT_LEDGER_BEHIND,
    EXIT_RAN_FAILED, EXIT_RAN_OK,
};
use crate::report::{self, RunReport};
use crate::settings::{
    parse_duration_ms, parse_nonzero_duration_ms, parse_retention_ms, Access, LedgerKind, Settings,
};

/// The shortest `--ttl` accepted: the keeper renews every third of the TTL and gives the lease up
/// at two thirds, so shorter ones leave no room for a scheduling hiccup.
pub const MIN_TTL_MS: u64 = 1_000;

/// A value that must not be empty (an empty `--salt` from a failed `$(date)` would merge every
/// occurrence into one).
fn non_empty(text: &str) -> Result<String, String> {
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
    intent: String,
    /// Which occurrence (a date, a ticket number): part of the run id. Same salt, same run. Must not
    /// be empty.
    #[arg(long, value_parser = non_empty)]
    salt: String,
    /// The lease's time to live while the command runs; it is renewed in the background. At least
    /// 1s.
    #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
    ttl: u64,
    /// How long to wait for another host's lease to end before giving up (exit 4), and then, all
    /// told, for this host's ledger to receive what the previous holders recorded (exit 7).
    #[arg(long, default_value = "0s", value_parser = parse_duration_ms, value_name = "DURATION")]
    wait: u64,
    /// How long to keep trying to write the command's outcome to the ledger (a database
    /// restarting, a lost connection) before it is queued on this host instead: the next
    /// fencepost command of this host that writes to the ledger, or `fencepost ledger flush`,
    /// writes it (`fencepost status` lists what is queued). Never dropped.
    #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
    outcome_wait: u64,
    /// Stop the command if it still runs after this long (SIGTERM to its process group, SIGKILL
    /// after --kill-after): exit 1, and unless it still exits 0 the run is in doubt (it may have
    /// done part of its effect).
    #[arg(long, value_parser = parse_nonzero_duration_ms, value_name = "DURATION")]
    timeout: Option<u64>,
    /// How long a command has to exit after SIGTERM before it gets SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration_ms, value_name = "DURATION")]
    kill_after: u64,
    /// Run an in-doubt occurrence again (after checking that its effect did not happen, or when
    /// running it twice is harmless).
    #[arg(long)]
    retry_in_doubt: bool,
    /// Run although the ledger file of DEVICE is damaged, or although records of DEVICE that the
    /// agent's earlier holders published never reached this host's ledger (exit 7 names them):
    /// the runs they recorded may run again. DEVICE is a device id (a file's name only for a file
    /// whose device cannot be read). Recorded in this device's log. Repeat for several.
    #[arg(long, value_name = "DEVICE")]
    accept_damaged: Vec<String>,
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
    command: Vec<std::ffi::OsString>,
    #[command(flatten)]
    pub global: crate::settings::Global,
}

/// Opens the site's ledger on the ledger folder and syncs it.
pub(crate) fn open_ledger(settings: &Settings) -> Result<Ledger> {
    open_ledger_to(settings, Access::ReadOnly)
}

/// Opens the site's ledger to write to it (`run`, `lease acquire`): a SQLite ledger file is
/// created when missing.
fn open_ledger_to_write(settings: &Settings) -> Result<Ledger> {
    open_ledger_to(settings, Access::Write)
}

fn open_ledger_to(settings: &Settings, access: Access) -> Result<Ledger> {
    open_ledger_with(settings, access, false, true)
}

/// Opens the ledger; with `snapshot`, from this site's snapshot of a ledger folder (what `run`
/// does: it asks about one run). The commands that list or check everything read it all. With
/// `reopen_if_pruned`, a ledger whose only damage is a device file pruned while it was read
/// ([`only_lagging`]) is opened again, a few times (`run` starts its whole attempt over instead:
/// it may have read the ledger before).
fn open_ledger_with(
    settings: &Settings,
    access: Access,
    snapshot: bool,
    reopen_if_pruned: bool,
) -> Result<Ledger> {
    if let Some(folder) = settings.folder_left_behind() {
        crate::exit::usage!(
            "the ledger is in PostgreSQL, but {} holds this host's embedded ledger folder (the ledger fencepost keeps in the data directory when no ledger is in a database: this host ran with the embedded default, or an earlier version, before), whose commits the database may not have (or cannot be read: a link to a share that is not mounted?). Copy it in once with `fencepost ledger import {}` and then move the folder away, or keep using it with --ledger {}",
            folder.display(),
            folder.display(),
            folder.display()
        );
    }
    let mut options = LedgerOptions::default().seen_file(settings.seen_file()?);
    if access == Access::Write {
        // What this host could not write before (an outcome while the database was away) is
        // written first, and nothing is decided while it cannot be.
        options = options.outbox(settings.outbox_file()?);
    }
    if snapshot {
        if let Some(path) = settings.snapshot_file()? {
            options = options.snapshot(path);
        }
    }
    // A reading that finds a device file beginning after records it lacks (pruned) may have
    // started from a checkpoint just before another host wrote a newer one and pruned (found
    // by an adversarial test: hosts pruning while others ran stopped healthy runs with exit 10):
    // it is read again, from the newest checkpoint, a few times before that is damage.
    let mut attempt = 0u32;
    loop {
        let relay = settings.relay(access)?;
        // Opening pulls everything once; a sync right after it would pull again for nothing.
        let ledger = Ledger::open_with(&settings.device, system_clock(), relay, options.clone())
            .with_context(|| format!("cannot open the ledger in {}", settings.ledger_label()))?;
        if !reopen_if_pruned || !only_lagging(&ledger) || attempt == PRUNED_READINGS - 1 {
            return Ok(ledger);
        }
        attempt += 1;
        tracing::debug!(
            attempt,
            "a device file begins after what this reading lacks (pruned while it read?): reading again"
        );
        drop(ledger);
        std::thread::sleep(std::time::Duration::from_millis(50 * u64::from(attempt)));
    }
}

/// Refuses (exit 10) to decide on `run` of `agent` while this host holds an outcome of it in a
/// queue of another ledger key (the same database named otherwise, `localhost` for
/// `127.0.0.1`): found by an adversarial test, a run resolved `failed` so ran again elsewhere.
fn refuse_queued_elsewhere(settings: &Settings, agent: &str, run: &str) -> Result<()> {
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
const PRUNED_READINGS: u32 = 8;

/// Whether the ledger's only damage is what another host's prune while it read, or a sync that
/// has not brought everything yet, explains: a device file that begins after what the reading
/// lacks ([`ProblemKind::Pruned`]), or that holds less than a checkpoint or the snapshot read
/// ([`ProblemKind::Behind`]).
fn only_lagging(ledger: &Ledger) -> bool {
    let damage = ledger.damage();
    !damage.is_empty()
        && damage
            .iter()
            .all(|problem| matches!(problem.kind, ProblemKind::Pruned | ProblemKind::Behind))
}

/// Refuses (exit 10) a ledger with damage that was not accepted, with one line that says what to
/// do; a [`Lagging`] error when a prune or a sync explains all of it ([`only_lagging`]).
fn refuse_damage(ledger: &Ledger, settings: &Settings) -> Result<()> {
    match damage_refusal(ledger, settings) {
        None => Ok(()),
        Some(refusal) if only_lagging(ledger) => Err(anyhow::Error::new(Lagging(refusal))),
        Some(refusal) => Err(anyhow::anyhow!(refusal)),
    }
}

/// What [`refuse_damage`] says, if the ledger has damage that was not accepted.
fn damage_refusal(ledger: &Ledger, settings: &Settings) -> Option<String> {
    if let Some(problem) = ledger.snapshot_failure() {
        return Some(format!(
            "not running anything: {}. The ledger in {} is not damaged; run again",
            problem.detail,
            settings.ledger_label()
        ));
    }
    if let Some(problem) = ledger.checkpoint_failure() {
        return Some(format!("not running anything: {problem}"));
    }
    let damage = ledger.damage();
    let first = damage.first()?;
    let lagging = only_lagging(ledger);
    if lagging && damage.iter().any(|problem| problem.kind == ProblemKind::Behind) {
        return Some(format!(
            "not running anything: {first}. This host's copy of the ledger ({}) lacks records that a checkpoint here or this host's snapshot read: let the sync bring them, then run again (if the file lost them, restore it from another host's copy)",
            settings.ledger_label()
        ));
    }
    if lagging {
        // Records pruned after a checkpoint this host cannot read yet: they are not lost, and
        // accepting the gap would run what they committed again (issue 37).
        return Some(format!(
            "not running anything: {first}. The records it lacks are in a checkpoint that this host's copy of the ledger ({}) does not hold yet: let the sync bring the checkpoints folder from the host that pruned, then run again",
            settings.ledger_label()
        ));
    }
    let which = first
        .device_id
        .clone()
        .or_else(|| {
            first
                .file
                .as_ref()
                .and_then(|file| file.file_name())
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    Some(format!(
        "the ledger in {} is damaged, so runs it recorded could run again; not running anything: {first}{}. {} (`fencepost ledger verify` lists the damage), or run with --accept-damaged {which:?} to accept that its runs may repeat",
        settings.ledger_label(),
        if damage.len() > 1 {
            format!(" (and {} more)", plural(damage.len() as u64 - 1, "problem"))
        } else {
            String::new()
        },
        settings.repair_hint(went_back(&damage))
    ))
}

/// Writes back into a database that went back what this host had read of it
/// (`Ledger::repair_went_back`), and says so: the devices repaired (none when there was
/// nothing to repair, or it could not be: the damage then stays and is refused).
fn repair_went_back(ledger: &mut Ledger, settings: &Settings, then: &str) -> Result<BTreeSet<String>> {
    let Some(repair) = ledger
        .repair_went_back()
        .context("this database went back, and what this host had read of it cannot be written back")?
    else {
        return Ok(BTreeSet::new());
    };
    let in_doubt = if repair.in_doubt.is_empty() {
        String::new()
    } else {
        let runs: Vec<String> = repair
            .in_doubt
            .iter()
            .map(|(agent, run, _)| format!("{run} of {agent}"))
            .collect();
        format!(
            ", and the {} it had seen in doubt, which stay in doubt ({}: check whether each effect happened, then `fencepost ledger resolve`)",
            plural(runs.len() as u64, "run"),
            runs.join(", ")
        )
    };
    let what = if repair.commits.is_empty() && repair.in_doubt.is_empty() {
        ", and holds again every run among them that this host had seen committed or in doubt (another host wrote them back)".to_owned()
    } else {
        format!(
            "; wrote the {} it had seen back into {}{in_doubt} (`fencepost ledger runs` lists them)",
            plural(repair.commits.len() as u64, "commit"),
            settings.ledger_label()
        )
    };
    err!(
        "fencepost: this database went back (restored, or failed over to a copy that lagged): it forgot records of {} that this host had read{what}{then}",
        repair.devices.join(", ")
    );
    Ok(repair.devices.into_iter().collect())
}

/// Whether the damage is a database that went back (`ProblemKind::WentBack`).
fn went_back(damage: &[&fencepost::relay::RelayProblem]) -> bool {
    damage.iter().any(|problem| problem.kind == ProblemKind::WentBack)
}

/// A refusal ([`refuse_damage`]) whose only damage a prune or a sync explains ([`only_lagging`]):
/// `run` starts its attempt over (a file pruned while the ledger read it is read again from the
/// newest checkpoint), then, in a ledger folder, waits for the sync within --wait; its last
/// attempt reports it (exit 7). It says what the refusal says.
#[derive(Debug)]
struct Lagging(String);

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
fn remaining_ms(deadline: Instant) -> u64 {
    u64::try_from(deadline.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
}

fn run_attempt(
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
        // did (the README's exit-status table says so).
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

/// Where [`store_outcome`] put the records of a run.
enum Stored {
    /// In the ledger (or there was nothing to write).
    Written,
    /// On this host, in the outbox, for the next command (the ledger could not be written);
    /// `passes`: whether the cause may pass by itself (else the ledger needs repair first).
    Queued {
        count: usize,
        path: PathBuf,
        cause: String,
        passes: bool,
        /// A signal that came meanwhile (the write was given up for it).
        signal: Option<nix::sys::signal::Signal>,
    },
}

/// Writes the records of the run that are not in the ledger yet (its outcome), trying again
/// for `wait_ms` while the failure may pass by itself, through this ledger and then through
/// the ledger opened again (this one may no longer continue the device's log: another process
/// of this device id appended and a prune removed those records since it read: found by a
/// flaky test, the outcome of a run was lost); then queues them on this host (the outbox). A
/// signal given to fencepost meanwhile stops the tries: the records are queued at once.
fn store_outcome(
    settings: &Settings,
    ledger: &mut Ledger,
    wait_ms: u64,
    signals: &Signals,
) -> Result<Stored> {
    if ledger.unsent() == 0 {
        return Ok(Stored::Written);
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let within = |deadline: Instant| deadline.saturating_duration_since(Instant::now());
    let no_signal = || signals.pending().is_none();
    let (mut cause, mut passes) = match ledger.flush_while(within(deadline), no_signal) {
        Ok(_) => return Ok(Stored::Written),
        Err(error) => (error.to_string(), error.is_transient()),
    };
    // A failure that passes (the time is up) or a signal: queued at once. Another (a device
    // file pruned meanwhile) may be cured by reading the ledger again.
    if passes || !no_signal() {
        return queue(ledger, cause, passes, signals.pending());
    }
    err!("fencepost: warning: could not write the outcome ({cause}); trying through the ledger opened again");
    let mut pause = Duration::from_millis(100);
    loop {
        match open_ledger_with(settings, Access::Write, false, true) {
            Ok(mut fresh) => {
                // The records move to `fresh`, and stay in its queue if it cannot write them.
                let written = match ledger.flush_through(&mut fresh) {
                    Err(error) if error.is_transient() => fresh.flush_while(within(deadline), no_signal),
                    other => other,
                };
                return match written {
                    Ok(_) => {
                        tracing::info!("stored the outcome through the ledger opened again");
                        Ok(Stored::Written)
                    }
                    Err(error) => queue(
                        &mut fresh,
                        error.to_string(),
                        error.is_transient(),
                        signals.pending(),
                    ),
                };
            }
            Err(error) if transient(&error) && no_signal() && Instant::now() + pause < deadline => {
                (cause, passes) = (crate::exit::one_line(&error), true);
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(error) => {
                if transient(&error) {
                    (cause, passes) = (crate::exit::one_line(&error), true);
                }
                return queue(ledger, cause, passes, signals.pending());
            }
        }
    }
}

/// Queues the ledger's unwritten records on this host ([`Ledger::queue_unsent`]).
fn queue(
    ledger: &mut Ledger,
    cause: String,
    passes: bool,
    signal: Option<nix::sys::signal::Signal>,
) -> Result<Stored> {
    let Some(path) = ledger.outbox_file().map(Path::to_path_buf) else {
        bail!("the ledger could not be written ({cause}), and it has no outbox to queue the records in");
    };
    let count = ledger
        .queue_unsent()
        .with_context(|| format!("the ledger could not be written ({cause})"))?;
    Ok(Stored::Queued {
        count,
        path,
        cause,
        passes,
        signal,
    })
}

/// How often `run` syncs its ledger while it waits for what the previous holders published.
const LEDGER_POLL: Duration = Duration::from_millis(200);

/// How [`wait_for_ledger`] ended.
enum LedgerWait {
    /// The ledger has everything (or the lease was lost meanwhile, which the dispatch reports).
    Ready,
    /// `--wait` ran out; what is still missing.
    Behind(Vec<MissingRecords>),
    /// SIGTERM, SIGINT or SIGHUP came.
    Signalled(nix::sys::signal::Signal),
}

/// Waits, syncing the ledger, until it has every record the agent's earlier holders published
/// (rule H3), until `wait_ms` after `started`, or until a signal comes.
fn wait_for_ledger(
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
fn describe_missing(missing: &[MissingRecords]) -> String {
    missing
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What exit 7 says.
fn ledger_behind_message(
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
fn release_quietly(keeper: &LeaseKeeper) {
    if let Err(error) = keeper.shutdown() {
        tracing::warn!(%error, "could not release the lease");
    }
}

/// `fencepost lease …`.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Create the coordinator's schema, or upgrade it to this fencepost's version. For PostgreSQL,
    /// run it once per database as a role that may create the schema (or owns it); the roles that
    /// run `fencepost run` then need only the grants in the README. Idempotent. For SQLite the
    /// file's schema is created on first use; this creates it now.
    Migrate,
}

/// `fencepost admin …`.
pub fn admin(settings: &Settings, command: AdminCommand) -> Result<i32> {
    match command {
        AdminCommand::Migrate => {
            settings.migrate_coordinator()?;
            out!("the coordinator's schema is ready");
            Ok(EXIT_RAN_OK)
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum LeaseCommand {
    /// Take the agent's lease for this device (exit 4 if another holds it).
    Acquire {
        /// The agent whose lease to take.
        #[arg(long)]
        agent: String,
        /// How long the lease lasts unless renewed.
        #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
        ttl: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Extend this device's lease at EPOCH (exit 6 if it was lost).
    Renew {
        /// The agent whose lease to renew.
        #[arg(long)]
        agent: String,
        /// The epoch this device holds (as `lease acquire` printed it).
        #[arg(long)]
        epoch: u64,
        /// How long the lease lasts from now unless renewed again.
        #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
        ttl: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give this device's lease at EPOCH up, so another host can take it at once (exit 6 if lost).
    Release {
        /// The agent whose lease to give up.
        #[arg(long)]
        agent: String,
        /// The epoch this device holds.
        #[arg(long)]
        epoch: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show who holds the agent, at which epoch, until when.
    Current {
        /// The agent.
        #[arg(long)]
        agent: String,
        /// Print JSON (`null` when nobody holds it).
        #[arg(long)]
        json: bool,
    },
    /// Show every held lease.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn lease_json(lease: &Lease) -> serde_json::Value {
    json!({"agent_id": lease.agent_id, "holder": lease.holder, "epoch": lease.epoch, "expires_at_ms": lease.expires_at_ms})
}

fn describe(lease: &Lease, now: u64) -> String {
    let remaining = if lease.expires_at_ms > now {
        format!("expires in {:.1} s", (lease.expires_at_ms - now) as f64 / 1000.0)
    } else {
        "expired".to_owned()
    };
    format!(
        "{}: held by {} at epoch {}, {remaining} (expires_at_ms {})",
        lease.agent_id, lease.holder, lease.epoch, lease.expires_at_ms
    )
}

fn print_lease(lease: &Lease, json: bool, now: u64) {
    if json {
        out!("{}", lease_json(lease));
    } else {
        out!("{}", describe(lease, now));
    }
}

/// Prints a lease verdict and returns its exit status; other errors propagate.
fn verdict(error: LeaseError, json: bool) -> Result<i32> {
    let (code, text, value) = match &error {
        LeaseError::Held {
            agent_id,
            holder,
            epoch,
            expires_at_ms,
        } => (
            EXIT_HELD_ELSEWHERE,
            format!("{agent_id}: held by {holder} at epoch {epoch}"),
            json!({"verdict": "held", "agent_id": agent_id, "holder": holder, "epoch": epoch, "expires_at_ms": expires_at_ms}),
        ),
        LeaseError::Lost {
            agent_id,
            claimed_epoch,
            current_epoch,
        } => (
            EXIT_LEASE_LOST,
            format!("{agent_id}: lost; epoch {claimed_epoch} is not held by this device (current epoch {current_epoch})"),
            json!({"verdict": "lost", "agent_id": agent_id, "claimed_epoch": claimed_epoch, "current_epoch": current_epoch}),
        ),
        _ => return Err(error.into()),
    };
    if json {
        out!("{value}");
    } else {
        err!("fencepost: {text}");
    }
    Ok(code)
}

pub fn lease(settings: &Settings, command: LeaseCommand) -> Result<i32> {
    let coordinator = settings.coordinator()?;
    let device = settings.device.as_str();
    match command {
        LeaseCommand::Acquire { agent, ttl, json } => {
            // As `run` does (rule L5): a coordinator that lost its state never reuses an epoch.
            let ledger = open_ledger_to_write(settings)?;
            let floor = ledger.state().fencing_epoch(&agent).min(MAX_EPOCH_FLOOR);
            coordinator
                .raise_epoch_floor(&agent, floor)
                .context("cannot raise the epoch floor from the ledger")?;
            match coordinator.acquire(&agent, device, ttl) {
                Ok(lease) => print_lease(&lease, json, coordinator.now_ms()),
                Err(error) => return verdict(error, json),
            }
        }
        LeaseCommand::Renew {
            agent,
            epoch,
            ttl,
            json,
        } => match coordinator.renew(&agent, device, epoch, ttl) {
            Ok(lease) => print_lease(&lease, json, coordinator.now_ms()),
            Err(error) => return verdict(error, json),
        },
        LeaseCommand::Release { agent, epoch, json } => match coordinator.release(&agent, device, epoch) {
            Ok(()) if json => out!("{}", json!({"released": true, "agent_id": agent, "epoch": epoch})),
            Ok(()) => out!("{agent}: released epoch {epoch}"),
            Err(error) => return verdict(error, json),
        },
        LeaseCommand::Current { agent, json } => match coordinator.current(&agent)? {
            Some(lease) => print_lease(&lease, json, coordinator.now_ms()),
            None if json => out!("null"),
            None => out!("{agent}: not held"),
        },
        LeaseCommand::List { json } => {
            let leases = coordinator.list()?;
            if json {
                out!(
                    "{}",
                    serde_json::Value::Array(leases.iter().map(lease_json).collect())
                );
            } else if leases.is_empty() {
                out!("no leases are held");
            } else {
                for lease in &leases {
                    out!("{}", describe(lease, coordinator.now_ms()));
                }
            }
        }
    }
    Ok(EXIT_RAN_OK)
}

/// `fencepost ledger …`.
#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Agents with their fencing epochs and counts of runs, committed and in doubt (exit 1, and
    /// what is damaged, on a damaged ledger).
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check every device file's hash chain; list damaged files, incomplete last lines and
    /// malformed intents (exit 1 if any).
    Verify {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every run: status, epoch, device; in-doubt runs are marked (exit 1, and what is damaged,
    /// on a damaged ledger).
    Runs {
        /// Only this agent's runs.
        #[arg(long)]
        agent: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy every record of another ledger into this one (a folder, sqlite:PATH or a postgres://
    /// URL): to move from a ledger folder to the database. Idempotent (records already there are
    /// skipped) and verified (each device's chain); damaged devices are reported and not copied
    /// (exit 1).
    Import {
        /// The ledger to copy from, named as --ledger names one.
        #[arg(value_name = "DIR|sqlite:PATH|URL")]
        from: PathBuf,
    },
    /// Write a checkpoint of the ledger (its folded state: every committed run, the fencing
    /// epochs, the runs in doubt, each device's head) into its checkpoints/ folder. A new site
    /// starts from the latest checkpoint and reads only the records after it. Refused on a
    /// damaged ledger (exit 10). A SQLite ledger keeps them beside its file (FILE.checkpoints/),
    /// a ledger in PostgreSQL in its tables (each host copies the one it starts from into its
    /// data directory).
    Compact {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Leave out of the checkpoint the committed runs that an earlier compaction, written at
        /// least this long ago (by this host's clock; at least 1d, e.g. 400d), already covered:
        /// every host that uses a snapshot moves to such a checkpoint and stops keeping them, so
        /// a job's state stays bounded. Only for run ids that can never be asked for again (a
        /// --salt naming a date or a time slot): a forgotten run asked for again runs again.
        /// Runs in doubt and the fencing epochs are always kept. Run compactions only on hosts
        /// whose clock you trust. Off by default.
        #[arg(long, value_parser = parse_retention_ms, value_name = "DURATION")]
        forget_commits_older_than: Option<u64>,
        /// With --forget-commits-older-than: only this agent's runs (repeat for several; all
        /// agents when left out).
        #[arg(long, value_name = "AGENT", requires = "forget_commits_older_than")]
        forget_agent: Vec<String>,
        /// Then remove from this host's own device file the records the checkpoint covers (the
        /// file is rewritten without them; the last record stays). Run it on every host now and
        /// then (weekly, say) and the ledger folder stays bounded. Every host then starts from a
        /// checkpoint: keep the checkpoints/ folder synced with the devices/ folder. A ledger
        /// folder only, on Unix.
        #[arg(long)]
        prune: bool,
    },
    /// Write what this host queued because the ledger could not be written then (the outcome of
    /// a command that ran while the database was away; `fencepost status` lists it). Every
    /// `fencepost run` of this host does it first. Exit 0 when nothing is left queued, 10 when
    /// the ledger still cannot be written (nothing queued is lost).
    Flush {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write back into a database that went back (restored from a dump, failed over to a copy
    /// that lagged) the commits this host had read that it forgot, and the runs it had read in
    /// doubt: as `committed` and `pending` records of this host, so that every host refuses
    /// those runs again (or finds them in doubt). Every `fencepost run` of this
    /// host does it first. Exit 0 when the ledger is not damaged then, 1 when it still is (it
    /// says what is).
    Repair,
    /// Record the outcome of an in-doubt run after checking what really happened.
    Resolve {
        /// The agent whose run it is.
        #[arg(long)]
        agent: String,
        /// The run id (as `ledger runs` shows it).
        #[arg(long)]
        run: String,
        /// What happened.
        #[arg(long = "as", value_parser = ["committed", "failed"])]
        outcome: String,
        /// Record it even though the attempt's lease is still live (its command may be running).
        #[arg(long)]
        force: bool,
    },
}

/// One row of `ledger runs`.
pub(crate) struct RunRow {
    pub agent: String,
    pub run: String,
    /// `committed`, `failed`, `pending`, `running` or `in-doubt`.
    pub status: &'static str,
    pub epoch: u64,
    pub device: String,
    /// For an in-doubt or running attempt: the fold's view of the run before it (`failed@1`).
    after: Option<String>,
    /// For a committed run: an outcome recorded beside its commit that the fold would show
    /// (`failed@1`, a resolution and the attempt's own outcome disagreeing); the commit wins (F6).
    also: Option<String>,
}

/// The live lease of each agent, by the coordinator (none when it cannot be reached: then every
/// unsettled attempt shows as in doubt).
fn live_leases(settings: &Settings) -> std::collections::BTreeMap<String, Lease> {
    listed_live_leases(settings).unwrap_or_else(|error| {
        err!(
            "fencepost: warning: {}; runs whose lease is live show as in doubt",
            crate::exit::one_line(&error)
        );
        Default::default()
    })
}

/// The TTL of the lease `ledger resolve` holds while it records an outcome.
const RESOLVE_TTL_MS: u64 = 30_000;

/// Takes `agent`'s lease for `ledger resolve`, and brings the ledger up to what its holders
/// published (rule H3: another operator's resolution included). Refused while the lease is live:
/// at the attempt's epoch the run may still be running; at another, another run or operator
/// holds it.
fn hold_to_resolve(
    settings: &Settings,
    agent: &str,
    run: &str,
    doubt: &fencepost::dispatch::InDoubtRun,
    ledger: &mut Ledger,
) -> Result<LeaseKeeper> {
    let cannot_tell = || {
        format!(
            "cannot tell whether {run} of {agent} is still running; resolve it once you know its lease (epoch {}, {}) has ended, with --force",
            doubt.epoch, doubt.device_id
        )
    };
    let coordinator = settings.coordinator().with_context(cannot_tell)?;
    let acquired = LeaseKeeper::builder(coordinator.shared(), agent, &settings.device)
        .config(KeeperConfig::new(RESOLVE_TTL_MS))
        .ledger_epoch(ledger.state().fencing_epoch(agent))
        .acquire();
    let keeper = match acquired {
        Ok(keeper) => keeper,
        Err(KeeperError::Lease(LeaseError::Held { holder, epoch, .. })) if epoch == doubt.epoch => bail!(
            "{run} of {agent} may still be running: {holder} holds the lease at its epoch {epoch}, and it is live. Resolve it once that lease ends, or pass --force"
        ),
        Err(KeeperError::Lease(LeaseError::Held { holder, epoch, .. })) => bail!(
            "{agent} is held by {holder} at epoch {epoch} (another run, or another operator resolving): resolve {run} once that lease ends, or pass --force"
        ),
        Err(error) => return Err(error).with_context(cannot_tell),
    };
    let published = match keeper.handed_over() {
        Some(frontier) => Ok(frontier),
        None => coordinator.published_frontier(agent),
    };
    let caught_up = published
        .context("cannot read what the holders published")
        .and_then(|published| Ok((ledger.sync().map(|_| ())?, published)))
        .map(|((), published)| ledger.behind(&published));
    match caught_up {
        Ok(missing) if missing.is_empty() => Ok(keeper),
        Ok(missing) => {
            release_quietly(&keeper);
            bail!(
                "this host's ledger lacks what the holders of {agent} recorded ({}); resolve {run} once it has synced",
                describe_missing(&missing)
            )
        }
        Err(error) => {
            release_quietly(&keeper);
            Err(error)
        }
    }
}

/// The live lease of each agent, or why the coordinator could not say.
fn listed_live_leases(settings: &Settings) -> Result<std::collections::BTreeMap<String, Lease>> {
    let coordinator = settings.coordinator().context("cannot reach the coordinator")?;
    let now = coordinator.now_ms();
    let leases = coordinator.list().context("cannot list the leases")?;
    Ok(leases
        .into_iter()
        .filter(|lease| lease.expires_at_ms > now)
        .map(|lease| (lease.agent_id.clone(), lease))
        .collect())
}

pub(crate) fn run_rows(
    ledger: &Ledger,
    only: Option<&str>,
    live: &std::collections::BTreeMap<String, Lease>,
) -> Vec<RunRow> {
    let state = ledger.state();
    let mut rows = Vec::new();
    for (agent, folded) in state.agents() {
        if only.is_some_and(|only| only != agent) {
            continue;
        }
        for (run, record) in folded.runs() {
            // The oracle (F6) decides what `run` does with the run: a commit wins over an outcome
            // recorded beside it (which the fold's view would show), and both are shown.
            let (shown, also) = match state.committed_run(agent, &run) {
                Some(commit) if record.status != IntentStatus::Committed => (
                    commit,
                    Some(format!("{}@{}", record.status.as_str(), record.epoch)),
                ),
                _ => (record, None),
            };
            rows.push(RunRow {
                agent: agent.to_owned(),
                run,
                status: shown.status.as_str(),
                epoch: shown.epoch,
                device: state.hlc_of(shown).device_id.to_string(),
                after: None,
                also,
            });
        }
        // Unsettled attempts (D2): the fold's view may show an older outcome or nothing at all.
        for doubt in ledger.in_doubt(agent, u64::MAX) {
            let running = live
                .get(agent)
                .is_some_and(|lease| lease.epoch == doubt.epoch && lease.holder == doubt.device_id);
            let status = if running { "running" } else { "in-doubt" };
            match rows
                .iter_mut()
                .find(|row| row.agent == agent && row.run == doubt.run_id)
            {
                Some(row) => {
                    if row.epoch != doubt.epoch || row.status != "pending" {
                        row.after = Some(format!("{}@{}", row.status, row.epoch));
                    }
                    row.status = status;
                    row.epoch = doubt.epoch;
                    row.device = doubt.device_id;
                }
                None => rows.push(RunRow {
                    agent: agent.to_owned(),
                    run: doubt.run_id,
                    status,
                    epoch: doubt.epoch,
                    device: doubt.device_id,
                    after: None,
                    also: None,
                }),
            }
        }
    }
    rows.sort_by(|a, b| (&a.agent, &a.run).cmp(&(&b.agent, &b.run)));
    rows
}

pub fn ledger(settings: &Settings, command: LedgerCommand) -> Result<i32> {
    match command {
        LedgerCommand::Verify { json } => return verify(settings, json),
        LedgerCommand::Flush { json } => {
            let ledger = open_ledger_to_write(settings)?;
            let stored = ledger.stored_from_outbox();
            warn_other_outboxes(&settings.other_outboxes());
            if json {
                out!("{}", json!({"stored": stored, "ledger": settings.ledger_label()}));
            } else if stored == 0 {
                out!("nothing of this host was queued for {}", settings.ledger_label());
            } else {
                out!(
                    "wrote {} queued on this host to {}",
                    plural(stored as u64, "record"),
                    settings.ledger_label()
                );
            }
            return Ok(EXIT_RAN_OK);
        }
        LedgerCommand::Repair => {
            let mut ledger = open_ledger_with(settings, Access::Write, true, false)?;
            if repair_went_back(&mut ledger, settings, "")?.is_empty() && ledger.damage().is_empty() {
                out!("nothing to repair in {}", settings.ledger_label());
            }
            return Ok(report_damage(&ledger, settings));
        }
        LedgerCommand::Import { from } => return import(settings, &from),
        LedgerCommand::Compact {
            json,
            forget_commits_older_than,
            forget_agent,
            prune,
        } => {
            let forget = forget_commits_older_than.map(|older_than_ms| Retention {
                older_than_ms,
                agents: forget_agent,
            });
            return compact(settings, json, forget, prune);
        }
        LedgerCommand::Resolve {
            agent,
            run,
            outcome,
            force,
        } => {
            if let Err(error) = validate_id(IdKind::Agent, &agent) {
                crate::exit::usage!("--agent: {error}");
            }
            if let Err(error) = validate_id(IdKind::Run, &run) {
                crate::exit::usage!("--run: {error}");
            }
            // Opened to write: what this host queued (the run's own outcome, maybe) is written
            // first (found by an adversarial test: a run resolved `failed` while its `committed`
            // waited in this host's outbox ran again elsewhere).
            let mut ledger = open_ledger_to_write(settings)?;
            let Some(doubt) = ledger
                .in_doubt(&agent, u64::MAX)
                .into_iter()
                .find(|doubt| doubt.run_id == run)
            else {
                crate::exit::usage!(
                    "{run} of {agent} is not in doubt (see `fencepost ledger runs --agent {agent}`)"
                );
            };
            refuse_queued_elsewhere(settings, &agent, &run)?;
            // Under the agent's lease (unless --force), so that two operators resolving one run
            // at once take turns: the second finds it resolved (found by an adversarial test:
            // both were told their opposite outcomes were recorded).
            let keeper = if force {
                None
            } else {
                Some(hold_to_resolve(settings, &agent, &run, &doubt, &mut ledger)?)
            };
            if keeper.is_some() && ledger.in_doubt_run(&agent, &run, u64::MAX).is_none() {
                if let Some(keeper) = &keeper {
                    release_quietly(keeper);
                }
                crate::exit::usage!(
                    "{run} of {agent} is no longer in doubt: an outcome was recorded meanwhile (another operator?); see `fencepost ledger runs --agent {agent}`"
                );
            }
            let settled = if outcome == "committed" {
                RunOutcome::Committed
            } else {
                RunOutcome::Failed
            };
            let resolved = ledger.resolve(&agent, &run, settled);
            if let Some(keeper) = &keeper {
                // Published with the release (rule H2): the next holder waits for it.
                keeper.pushed(&ledger.pushed());
                if let Err(error) = keeper.shutdown() {
                    err!("fencepost: warning: could not release the lease of {agent} ({error:#}); it ends with its TTL");
                }
            }
            resolved.with_context(|| format!("cannot write the outcome to {}", settings.ledger_label()))?;
            // With --force, another record may have settled it differently meanwhile: a commit
            // stands whatever else is recorded.
            if settled == RunOutcome::Failed
                && ledger.sync().is_ok()
                && ledger.committed_run(&agent, &run).is_some()
            {
                err!("fencepost: {run} of {agent} was recorded failed, but another record commits it, and a commit stands (see `fencepost ledger runs --agent {agent}`)");
                return Ok(EXIT_RAN_FAILED);
            }
            out!("{agent}: recorded {run} as {outcome} (epoch {})", doubt.epoch);
            if let Some(older) = ledger.in_doubt_run(&agent, &run, u64::MAX) {
                out!(
                    "{agent}: {run} is still in doubt: its attempt at epoch {} by {} has no outcome either (resolve it too)",
                    older.epoch,
                    older.device_id
                );
            }
        }
        LedgerCommand::Show { json } => {
            let ledger = open_ledger(settings)?;
            let rows = run_rows(&ledger, None, &live_leases(settings));
            let mut agents = Vec::new();
            for (agent, folded) in ledger.state().agents() {
                let mine = rows.iter().filter(|row| row.agent == agent);
                let committed = mine.clone().filter(|row| row.status == "committed").count();
                let in_doubt = mine.clone().filter(|row| row.status == "in-doubt").count();
                let running = mine.clone().filter(|row| row.status == "running").count();
                agents.push(json!({
                    "agent_id": agent, "fencing_epoch": folded.fencing_epoch(),
                    "runs": mine.count(), "committed": committed, "in_doubt": in_doubt, "running": running,
                }));
            }
            let damaged = !ledger.damage().is_empty();
            if json {
                out!("{}", serde_json::Value::Array(agents));
            } else if agents.is_empty() && damaged {
                out!(
                    "the ledger in {} has no intents that could be read",
                    settings.ledger_label()
                );
            } else if agents.is_empty() {
                out!("the ledger in {} has no intents yet", settings.ledger_label());
            } else {
                for agent in agents {
                    let count = |key: &str| agent[key].as_u64().unwrap_or_default();
                    out!(
                        "{}: fencing epoch {}, {}, {} committed, {} running, {} in doubt",
                        agent["agent_id"].as_str().unwrap_or_default(),
                        agent["fencing_epoch"],
                        plural(count("runs"), "run"),
                        count("committed"),
                        count("running"),
                        count("in_doubt")
                    );
                }
            }
            return Ok(report_damage(&ledger, settings));
        }
        LedgerCommand::Runs { agent, json } => {
            let ledger = open_ledger(settings)?;
            let rows = run_rows(&ledger, agent.as_deref(), &live_leases(settings));
            if json {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|row| json!({"agent_id": row.agent, "run_id": row.run, "status": row.status, "epoch": row.epoch, "device_id": row.device, "after": row.after, "also": row.also}))
                    .collect();
                out!("{}", serde_json::Value::Array(rows));
            } else {
                for row in &rows {
                    let after = row
                        .after
                        .as_ref()
                        .map(|after| format!("  after {after}"))
                        .unwrap_or_default();
                    let also = row
                        .also
                        .as_ref()
                        .map(|also| format!("  ({also} also recorded)"))
                        .unwrap_or_default();
                    out!(
                        "{}  {}  {:<9}  epoch {}  by {}{after}{also}",
                        row.agent,
                        row.run,
                        row.status,
                        row.epoch,
                        row.device
                    );
                }
            }
            return Ok(report_damage(&ledger, settings));
        }
    }
    Ok(EXIT_RAN_OK)
}

/// After a listing (`ledger show`, `ledger runs`): on a damaged ledger, says what is damaged
/// (the listing lacks what the damaged devices recorded) and returns exit 1; else 0.
fn report_damage(ledger: &Ledger, settings: &Settings) -> i32 {
    let damage = ledger.damage();
    if damage.is_empty() && ledger.checkpoint_failure().is_none() {
        return EXIT_RAN_OK;
    }
    if let Some(problem) = ledger.checkpoint_failure() {
        err!("fencepost: {problem}");
    }
    for problem in &damage {
        err!("fencepost: damaged: {problem}");
    }
    if !damage.is_empty() {
        err!(
            "fencepost: the ledger in {} is damaged ({}): what the damaged devices recorded after the damage is missing above. {} (`fencepost ledger verify` checks everything)",
            settings.ledger_label(),
            plural(damage.len() as u64, "problem"),
            settings.repair_hint(went_back(&damage))
        );
    }
    EXIT_RAN_FAILED
}

/// `ledger import`: every intact device of `from`, pushed to this host's ledger.
fn import(settings: &Settings, from: &Path) -> Result<i32> {
    let source = settings.with_ledger(from)?;
    if source.ledger_label() == settings.ledger_label() {
        crate::exit::usage!(
            "ledger import {}: that is this host's ledger already",
            source.ledger_label()
        );
    }
    // A folder to import from must hold a ledger: an empty or wrong folder would import nothing
    // and say so quietly, and the operator would then move the real one away.
    if source.ledger_kind == LedgerKind::Folder && !source.ledger.join("devices").is_dir() {
        crate::exit::usage!(
            "ledger import {}: no ledger there (a ledger folder has a devices/ folder; the old default is <data dir>/fencepost/ledger)",
            source.ledger_label()
        );
    }
    let source_relay = source.relay(Access::ReadOnly)?;
    // A pruned ledger's first records are only in its checkpoint: copying the rest would make
    // logs that begin after records the new ledger never gets (found by an adversarial run: the
    // import copied what was left, and a committed occurrence ran again on the new ledger).
    let pruned = source_relay
        .log_starts()
        .with_context(|| format!("cannot read the ledger {}", source.ledger_label()))?;
    if !pruned.is_empty() {
        let devices: Vec<&str> = pruned.keys().map(String::as_str).collect();
        bail!(
            "cannot import {}: the logs of {} were pruned (their first records are only in its checkpoints), and a ledger cannot be imported from a checkpoint yet; nothing was imported",
            source.ledger_label(),
            devices.join(", ")
        );
    }
    let batch = source_relay
        .pull(&Frontier::new())
        .with_context(|| format!("cannot read the ledger {}", source.ledger_label()))?;
    let damaged: BTreeSet<&str> = batch
        .problems
        .iter()
        .filter(|problem| problem.is_damage())
        .filter_map(|problem| problem.device_id.as_deref())
        .collect();
    // A damaged device's records up to the damage are intact, but its later ones are missing:
    // copying part of it would make a log that looks whole. It is left out, and named.
    let records: Vec<OpRecord> = batch
        .ops
        .into_iter()
        .filter(|op| !damaged.contains(&*op.device_id))
        .collect();
    let devices: BTreeSet<&str> = records.iter().map(|op| &*op.device_id).collect();
    let report = settings
        .relay(Access::Write)?
        .push(&records)
        .with_context(|| format!("cannot write to the ledger {}", settings.ledger_label()))?;
    out!(
        "imported {} of {} from {} into {} ({} already there)",
        plural(report.appended as u64, "record"),
        plural(devices.len() as u64, "device"),
        source.ledger_label(),
        settings.ledger_label(),
        report.already_present
    );
    for problem in &batch.problems {
        err!("fencepost: not imported: {problem}");
    }
    Ok(if damaged.is_empty() {
        EXIT_RAN_OK
    } else {
        EXIT_RAN_FAILED
    })
}

/// `fencepost ledger compact`.
fn compact(settings: &Settings, json: bool, forget: Option<Retention>, prune: bool) -> Result<i32> {
    for agent in forget.iter().flat_map(|retention| &retention.agents) {
        if let Err(error) = validate_id(IdKind::Agent, agent) {
            crate::exit::usage!("--forget-agent: {error}");
        }
    }
    // Every record read and checked (no snapshot): damage anywhere refuses the checkpoint.
    let mut ledger = open_ledger(settings)?;
    refuse_damage(&ledger, settings)?;
    if ledger.view().frontier().iter().next().is_none() {
        out!(
            "the ledger in {} has no records yet: nothing to compact",
            settings.ledger_label()
        );
        return Ok(EXIT_RAN_OK);
    }
    let asked = forget.is_some();
    // A clock before this build's year is not set yet (a device without a real-time clock).
    const CLOCK_FLOOR_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
    let mut options = CompactOptions::default().clock_floor(CLOCK_FLOOR_MS);
    if let Some(retention) = forget {
        options = options.forget(retention);
    }
    if prune {
        options = options.prune();
    }
    let written = match ledger.compact_with(&options) {
        Ok(written) => written,
        Err(DispatchError::Damaged { .. }) => {
            refuse_damage(&ledger, settings)?;
            bail!(
                "the ledger in {} is damaged: not writing a checkpoint",
                settings.ledger_label()
            );
        }
        Err(error) => return Err(error).context("cannot compact the ledger"),
    };
    if json {
        out!(
            "{}",
            json!({
                "checkpoint": written.path, "id": written.id, "records": written.records,
                "devices": written.devices, "runs": written.runs,
                "forgotten_runs": written.forgotten_runs, "pruned_records": written.pruned,
                "forgets_covered_by_compaction_at_ms": written.forgotten.as_ref().map(|rule| rule.anchor_written_at_ms),
            })
        );
    } else {
        let stored = if settings.ledger_kind == LedgerKind::Postgres {
            format!(
                " into {} (this host's copy: {})",
                settings.ledger_label(),
                written.path.display()
            )
        } else {
            format!(" {}", written.path.display())
        };
        out!(
            "wrote checkpoint{stored} ({} of {}, {}): a new host starts from it",
            plural(written.records, "record"),
            plural(written.devices as u64, "device"),
            plural(written.runs, "run")
        );
        if prune {
            out!(
                "removed {} of device {} from its {} (the checkpoint covers them)",
                plural(written.pruned, "record"),
                settings.device,
                if settings.ledger_kind == LedgerKind::Folder {
                    "file"
                } else {
                    "log"
                }
            );
        }
        if let Some(rule) = &written.forgotten {
            out!(
                "it leaves out {} committed by the time of the compaction of {} ms since the Unix epoch{}: a host that asks for one again runs it again",
                plural(written.forgotten_runs, "run"),
                rule.anchor_written_at_ms,
                if rule.agents.is_empty() {
                    String::new()
                } else {
                    format!(" (agents {})", rule.agents.join(", "))
                }
            );
        } else if asked {
            out!(
                "it forgets nothing yet: no earlier compaction is that old (a commit's age is counted from the first compaction that covered it; keep compacting, daily is plenty)"
            );
        }
    }
    Ok(EXIT_RAN_OK)
}

/// `count` and `noun`, in the plural unless `count` is 1.
pub fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

fn verify(settings: &Settings, json: bool) -> Result<i32> {
    let relay = settings.relay(Access::ReadOnly)?;
    // What this site saw before (a file that shrank or was replaced) comes from the ledger; it
    // says where a reading of every record starts (after the checkpoint that device files
    // begin after, once they were pruned).
    let ledger = open_ledger(settings)?;
    let since = ledger
        .pruned_start()
        .map(|(_, frontier)| frontier.clone())
        .unwrap_or_default();
    let mut devices = std::collections::BTreeMap::<String, usize>::new();
    let mut findings: Vec<(&'static str, String)> = Vec::new();
    // Read as a stream: a ledger of millions of records is never held whole.
    relay
        .pull_in_batches(&since, &mut |ops| {
            for op in &ops {
                match devices.get_mut(&*op.device_id) {
                    Some(count) => *count += 1,
                    None => drop(devices.insert(op.device_id.to_string(), 1)),
                }
                if op.surface == Surface::Intent && op.payload.intent().is_none() {
                    findings.push((
                        "malformed",
                        format!(
                            "device {:?} seq {}: a malformed intent (missing or invalid fields, or an epoch above {MAX_EPOCH}); it is ignored by the fold",
                            op.device_id, op.seq
                        ),
                    ));
                }
            }
        })
        .context("cannot read the ledger folder")?;
    // The devices whose records the start checkpoint covers, none of them read after it.
    for (device, _) in since.iter() {
        devices.entry(device.to_owned()).or_insert(0);
    }
    for problem in ledger.problems() {
        let kind = match problem.kind {
            ProblemKind::Damage | ProblemKind::Pruned | ProblemKind::WentBack | ProblemKind::Behind => {
                "damaged"
            }
            ProblemKind::IncompleteLine => "incomplete",
            _ => "ignored",
        };
        findings.push((kind, problem.to_string()));
    }
    // Each checkpoint against the records it covers (rule K3).
    let mut checkpoints_bad = 0;
    for problem in ledger
        .verify_checkpoints()
        .context("cannot check the ledger's checkpoints")?
    {
        checkpoints_bad += 1;
        findings.push(("damaged", problem.to_string()));
    }
    findings.sort();
    findings.dedup();
    let bad = findings.iter().filter(|(kind, _)| *kind != "ignored").count();
    if json {
        let findings: Vec<_> = findings
            .iter()
            .map(|(kind, detail)| json!({"kind": kind, "detail": detail}))
            .collect();
        out!(
            "{}",
            json!({"ledger": settings.ledger_label(), "intact": bad == 0, "devices": devices, "problems": findings})
        );
        return Ok(if bad == 0 { EXIT_RAN_OK } else { EXIT_RAN_FAILED });
    }
    let after = if let Some((start, _)) = ledger.pruned_start() {
        out!(
            "the logs begin after the checkpoint {}: the records after it were verified",
            start.display()
        );
        " after it"
    } else {
        ""
    };
    for (device, count) in &devices {
        out!(
            "{device}: {}{after}, chain verified",
            plural(*count as u64, "record")
        );
    }
    for (kind, detail) in &findings {
        out!("{kind}: {detail}");
    }
    if bad == 0 {
        out!(
            "ledger {} is intact ({})",
            settings.ledger_label(),
            plural(devices.len() as u64, "device")
        );
        return Ok(EXIT_RAN_OK);
    }
    if bad > checkpoints_bad {
        err!(
            "fencepost: {} in {}: each device stops at its first bad record; {} (an incomplete last line of a folder's file may be a write or a sync in progress)",
            plural(bad as u64, "problem"),
            settings.ledger_label(),
            settings
                .repair_hint(went_back(&ledger.problems().iter().collect::<Vec<_>>()))
                .to_lowercase()
        );
    } else {
        // Only checkpoints: the records are intact.
        err!(
            "fencepost: {} in {}; its records are intact: write a new checkpoint with `fencepost ledger compact`",
            plural(bad as u64, "damaged checkpoint"),
            settings.ledger_label()
        );
    }
    Ok(EXIT_RAN_FAILED)
}

/// Says what this device's queues for other ledger keys hold (`status`, `ledger flush`).
pub(crate) fn warn_other_outboxes(
    elsewhere: &[(
        std::path::PathBuf,
        Result<Vec<fencepost::ledger::QueuedRecord>, String>,
    )],
) {
    for (other, records) in elsewhere {
        match records {
            Ok(records) => err!(
                "fencepost: warning: {} of this device wait in {} for another ledger, or this one named otherwise (another host name for the server): run `fencepost ledger flush` with the --ledger or --coordinator they were queued for",
                plural(records.len() as u64, "queued record"),
                other.display()
            ),
            Err(error) => err!("fencepost: warning: {error}"),
        }
    }
}

/// `fencepost simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The seed: the same seed replays the same run exactly.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many seeds to run, from --seed on; the table then sums them.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG timeline of the (first) seed: per site (with its clock skew), leases held,
    /// pauses, crashes, partitions, effects (in their agent's colour), duplicates, and the
    /// effects the resource refused, over a time axis.
    #[arg(long, value_name = "FILE")]
    svg: Option<std::path::PathBuf>,
    /// Write the same timeline as a PNG picture.
    #[arg(long, value_name = "FILE")]
    png: Option<std::path::PathBuf>,
    /// Run the coordinator in SQLite databases (in a temporary folder) instead of in memory.
    #[arg(long)]
    sqlite: bool,
}

/// Renders an SVG picture into a PNG file (text in the system's fonts).
fn write_png(svg: &str, path: &Path) -> Result<()> {
    let mut options = resvg::usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    // The picture asks for `sans-serif`: the first of these families that is installed, else
    // any installed family (the generic names' defaults are not Linux fonts).
    let families: Vec<String> = fonts
        .faces()
        .flat_map(|face| face.families.iter().map(|(family, _)| family.clone()))
        .collect();
    let chosen = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans", "Arial"]
        .iter()
        .find(|wanted| families.iter().any(|family| family == *wanted))
        .map(|family| (*family).to_owned())
        .or_else(|| families.first().cloned());
    match chosen {
        Some(family) => fonts.set_sans_serif_family(family),
        None => err!("fencepost: warning: no fonts are installed, so the PNG has no text (the SVG has it)"),
    }
    let tree = resvg::usvg::Tree::from_str(svg, &options).context("cannot read the timeline back as SVG")?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .context("cannot make a picture of the timeline's size")?;
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let png = pixmap.encode_png().context("cannot encode the timeline as PNG")?;
    std::fs::write(path, png).with_context(|| format!("cannot write {}", path.display()))
}

pub fn simulate(args: SimulateArgs) -> Result<i32> {
    use fencepost::simulate::{compare, render_svg, render_table, SimConfig};
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let folder = if args.sqlite {
        Some(tempfile::tempdir().context("cannot create a temporary folder for the SQLite coordinator")?)
    } else {
        None
    };
    let config = |seed| SimConfig {
        sqlite_folder: folder.as_ref().map(|folder| folder.path().to_path_buf()),
        ..SimConfig::new(seed)
    };
    let first = compare(&config(args.seed));
    if args.svg.is_some() || args.png.is_some() {
        let svg = render_svg(&first);
        if let Some(path) = &args.svg {
            std::fs::write(path, &svg).with_context(|| format!("cannot write {}", path.display()))?;
        }
        if let Some(path) = &args.png {
            write_png(&svg, path)?;
        }
    }
    if args.seeds == 1 {
        if args.json {
            out!("{}", serde_json::to_string_pretty(&first)?);
        } else {
            out_raw!("{}", render_table(&first));
        }
        return Ok(EXIT_RAN_OK);
    }
    let progress = indicatif::ProgressBar::new(args.seeds);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {eta} left")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.inc(1);
    let mut sum = first.clone();
    for seed in args.seed + 1..args.seed.saturating_add(args.seeds) {
        let report = compare(&config(seed));
        for (total, mode) in sum.modes.iter_mut().zip(&report.modes) {
            total.occurrences += mode.occurrences;
            total.effects += mode.effects;
            total.duplicates += mode.duplicates;
            total.never_executed += mode.never_executed;
            total.in_doubt += mode.in_doubt;
            total.in_doubt_retried += mode.in_doubt_retried;
            total.in_doubt_resolved += mode.in_doubt_resolved;
            total.refused_at_fence += mode.refused_at_fence;
            total.refused_at_resource += mode.refused_at_resource;
            total.converged &= mode.converged;
            total.ledger_wait_ms.extend(&mode.ledger_wait_ms);
            for (call, count) in &mode.coordinator_calls {
                *total.coordinator_calls.entry(call.clone()).or_insert(0) += count;
            }
            for (cause, count) in &mode.duplicates_by_cause {
                *total.duplicates_by_cause.entry(*cause).or_insert(0) += count;
            }
        }
        sum.schedule.faults.extend(report.schedule.faults);
        progress.inc(1);
    }
    progress.finish_and_clear();
    if args.json {
        let modes: Vec<_> = sum
            .modes
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        out!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"first_seed": args.seed, "seeds": args.seeds, "modes": modes})
            )?
        );
    } else {
        let table = render_table(&sum);
        let body = table.split_once('\n').map_or(table.as_str(), |(_, rest)| rest);
        out!(
            "seeds {}..{}: {} faults in all",
            args.seed,
            args.seed + args.seeds - 1,
            sum.schedule.faults.len()
        );
        out_raw!("{body}");
    }
    Ok(EXIT_RAN_OK)
}
