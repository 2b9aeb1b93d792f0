//! The subcommands.

use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use fencepost::clock::system_clock;
use fencepost::dispatch::{dispatch, DispatchOutcome, Ledger};
use fencepost::keeper::{KeeperConfig, KeeperError, LeaseKeeper};
use fencepost::lease::{Intent, IntentStatus, Lease, LeaseCoordinator, LeaseError};
use fencepost::relay::{Frontier, Relay};
use fencepost::run_id::deterministic_run_id;
use serde_json::json;

use crate::settings::{parse_duration_ms, Settings};
use crate::{
    EXIT_ALREADY_COMMITTED, EXIT_HELD_ELSEWHERE, EXIT_IN_DOUBT, EXIT_LEASE_LOST, EXIT_RAN_FAILED, EXIT_RAN_OK,
};

/// `fencepost run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The agent: the unit that holds a lease (one job, one bot).
    #[arg(long)]
    agent: String,
    /// What the command does, in words ("send the daily report"): part of the run id.
    #[arg(long)]
    intent: String,
    /// Which occurrence (a date, a ticket number): part of the run id. Same salt, same run.
    #[arg(long)]
    salt: String,
    /// The lease's time to live while the command runs; it is renewed in the background.
    #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
    ttl: u64,
    /// How long to wait for another host's lease to end before giving up (exit 4).
    #[arg(long, default_value = "0s", value_parser = parse_duration_ms, value_name = "DURATION")]
    wait: u64,
    /// Run an in-doubt occurrence again (after checking that its effect did not happen, or when
    /// running it twice is harmless).
    #[arg(long)]
    retry_in_doubt: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Opens the site's ledger on the ledger folder and syncs it.
fn open_ledger(settings: &Settings) -> Result<Ledger> {
    let relay: Arc<dyn Relay> = Arc::new(settings.relay()?);
    let mut ledger = Ledger::open(&settings.device, system_clock(), relay)
        .with_context(|| format!("cannot open the ledger in {}", settings.ledger.display()))?;
    ledger.sync().context("cannot sync the ledger")?;
    Ok(ledger)
}

pub fn run(settings: &Settings, args: RunArgs) -> Result<i32> {
    let run_id =
        deterministic_run_id(&args.agent, &args.intent, &args.salt).context("cannot name the run")?;
    let agent = args.agent.as_str();
    let mut ledger = open_ledger(settings)?;
    if ledger.state().committed_run(agent, &run_id).is_some() {
        eprintln!("fencepost: {run_id} of {agent} already committed; not running it again");
        return Ok(EXIT_ALREADY_COMMITTED);
    }
    let coordinator = settings.coordinator()?;
    let ttl_ms = args.ttl.max(3);
    // A waiting host tries again at least every second, so that it follows a release promptly.
    let config = KeeperConfig {
        acquire_every_ms: (ttl_ms / 4).clamp(1, 1_000),
        ..KeeperConfig::new(ttl_ms)
    };
    config
        .validate()
        .map_err(|error| anyhow::anyhow!("--ttl {ttl_ms} ms: {error}"))?;
    let builder = LeaseKeeper::builder(
        coordinator.clone() as Arc<dyn LeaseCoordinator>,
        agent,
        &settings.device,
    )
    .config(config)
    .ledger_epoch(ledger.state().fencing_epoch(agent));
    let keeper = match builder.wait_to_acquire(args.wait) {
        Ok(keeper) => keeper,
        Err(KeeperError::Lease(LeaseError::Held { holder, epoch, .. })) => {
            eprintln!("fencepost: {agent} is held by {holder} at epoch {epoch}; not running {run_id} (use --wait to wait for it)");
            return Ok(EXIT_HELD_ELSEWHERE);
        }
        Err(error) => return Err(error).context(format!("cannot acquire the lease of {agent}")),
    };
    let epoch = keeper.epoch();
    // What the previous holder pushed before it released is in the folder now.
    ledger.sync().context("cannot sync the ledger")?;
    if let Some(run) = ledger
        .in_doubt(agent, epoch)
        .into_iter()
        .find(|run| run.run_id == run_id)
    {
        if !args.retry_in_doubt {
            keeper.shutdown()?;
            eprintln!(
                "fencepost: {run_id} of {agent} is in doubt: {} started it at epoch {} and never recorded an outcome. \
Check whether its effect happened, then rerun with --retry-in-doubt, or record it with \
`fencepost ledger resolve --agent {agent} --run {run_id} --as committed|failed`",
                run.device_id, run.epoch
            );
            return Ok(EXIT_IN_DOUBT);
        }
        eprintln!(
            "fencepost: retrying in-doubt {run_id} (started by {} at epoch {})",
            run.device_id, run.epoch
        );
    }
    let outcome = dispatch(&keeper, &mut ledger, &run_id, |token| {
        let status = Command::new(&args.command[0])
            .args(&args.command[1..])
            .env("FENCEPOST_AGENT", &token.agent_id)
            .env("FENCEPOST_RUN_ID", &token.run_id)
            .env("FENCEPOST_EPOCH", token.epoch.to_string())
            .env("FENCEPOST_DEVICE", &settings.device)
            .status();
        match status {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("the command exited with {status}")),
            Err(error) => Err(format!("cannot start {:?}: {error}", args.command[0])),
        }
    });
    let lost = keeper.loss();
    let shutdown = keeper.shutdown();
    let outcome = outcome.context("the run could not be recorded")?;
    if let Err(error) = shutdown {
        eprintln!("fencepost: warning: could not release the lease ({error:#}); it ends with its TTL");
    }
    if ledger.unsent() > 0 {
        eprintln!(
            "fencepost: warning: {} ledger record(s) could not be written to {}; they are written by the next fencepost command on this host",
            ledger.unsent(),
            settings.ledger.display()
        );
    }
    if let Some(loss) = lost {
        eprintln!("fencepost: warning: the lease was lost while the command ran ({:?}); another host may run this occurrence too", loss.reason);
    }
    Ok(match outcome {
        DispatchOutcome::Executed { result: Ok(()), .. } => EXIT_RAN_OK,
        DispatchOutcome::Executed {
            result: Err(reason), ..
        } => {
            eprintln!("fencepost: {run_id} of {agent} ran at epoch {epoch} and failed: {reason}");
            EXIT_RAN_FAILED
        }
        DispatchOutcome::AlreadyCommitted { .. } => {
            eprintln!("fencepost: {run_id} of {agent} already committed; not running it again");
            EXIT_ALREADY_COMMITTED
        }
        DispatchOutcome::StaleEpoch {
            current_epoch,
            current_holder,
            ..
        } => {
            eprintln!("fencepost: lost {agent} to {current_holder} (epoch {current_epoch}) before {run_id} could start");
            EXIT_LEASE_LOST
        }
        DispatchOutcome::NotHeld { .. } => {
            eprintln!("fencepost: lost the lease of {agent} before {run_id} could start");
            EXIT_LEASE_LOST
        }
        _ => bail!("an outcome this fencepost does not know"),
    })
}

/// `fencepost lease …`.
#[derive(Debug, clap::Subcommand)]
pub enum LeaseCommand {
    /// Take the agent's lease for this device (exit 4 if another holds it).
    Acquire {
        #[arg(long)]
        agent: String,
        #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
        ttl: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Extend this device's lease at EPOCH (exit 6 if it was lost).
    Renew {
        #[arg(long)]
        agent: String,
        #[arg(long)]
        epoch: u64,
        #[arg(long, default_value = "30s", value_parser = parse_duration_ms, value_name = "DURATION")]
        ttl: u64,
        #[arg(long)]
        json: bool,
    },
    /// Give this device's lease at EPOCH up, so another host can take it at once (exit 6 if lost).
    Release {
        #[arg(long)]
        agent: String,
        #[arg(long)]
        epoch: u64,
        #[arg(long)]
        json: bool,
    },
    /// Show who holds the agent, at which epoch, until when.
    Current {
        #[arg(long)]
        agent: String,
        #[arg(long)]
        json: bool,
    },
    /// Show every held lease.
    List {
        #[arg(long)]
        json: bool,
    },
}

fn lease_json(lease: &Lease) -> serde_json::Value {
    json!({"agent_id": lease.agent_id, "holder": lease.holder, "epoch": lease.epoch, "expires_at_ms": lease.expires_at_ms})
}

fn describe(lease: &Lease) -> String {
    let now = system_clock()();
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

fn print_lease(lease: &Lease, json: bool) {
    if json {
        println!("{}", lease_json(lease));
    } else {
        println!("{}", describe(lease));
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
        println!("{value}");
    } else {
        eprintln!("fencepost: {text}");
    }
    Ok(code)
}

pub fn lease(settings: &Settings, command: LeaseCommand) -> Result<i32> {
    let coordinator = settings.coordinator()?;
    let device = settings.device.as_str();
    match command {
        LeaseCommand::Acquire { agent, ttl, json } => match coordinator.acquire(&agent, device, ttl) {
            Ok(lease) => print_lease(&lease, json),
            Err(error) => return verdict(error, json),
        },
        LeaseCommand::Renew {
            agent,
            epoch,
            ttl,
            json,
        } => match coordinator.renew(&agent, device, epoch, ttl) {
            Ok(lease) => print_lease(&lease, json),
            Err(error) => return verdict(error, json),
        },
        LeaseCommand::Release { agent, epoch, json } => match coordinator.release(&agent, device, epoch) {
            Ok(()) if json => println!("{}", json!({"released": true, "agent_id": agent, "epoch": epoch})),
            Ok(()) => println!("{agent}: released epoch {epoch}"),
            Err(error) => return verdict(error, json),
        },
        LeaseCommand::Current { agent, json } => match coordinator.current(&agent)? {
            Some(lease) => print_lease(&lease, json),
            None if json => println!("null"),
            None => println!("{agent}: not held"),
        },
        LeaseCommand::List { json } => {
            let leases = coordinator.list()?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(leases.iter().map(lease_json).collect())
                );
            } else if leases.is_empty() {
                println!("no leases are held");
            } else {
                for lease in &leases {
                    println!("{}", describe(lease));
                }
            }
        }
    }
    Ok(EXIT_RAN_OK)
}

/// `fencepost ledger …`.
#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Agents with their fencing epochs and counts of runs, committed and in doubt.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Check every device file's hash chain; list damaged files (exit 1 if any).
    Verify,
    /// Every run: status, epoch, device; in-doubt runs are marked.
    Runs {
        /// Only this agent's runs.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Record the outcome of an in-doubt run after checking what really happened.
    Resolve {
        #[arg(long)]
        agent: String,
        /// The run id (as `ledger runs` shows it).
        #[arg(long)]
        run: String,
        /// What happened.
        #[arg(long = "as", value_parser = ["committed", "failed"])]
        outcome: String,
    },
}

/// One row of `ledger runs`.
struct RunRow {
    agent: String,
    run: String,
    status: &'static str,
    epoch: u64,
    device: String,
}

fn run_rows(ledger: &Ledger, only: Option<&str>) -> Vec<RunRow> {
    let state = ledger.state();
    let mut rows = Vec::new();
    for (agent, folded) in state.agents() {
        if only.is_some_and(|only| only != agent) {
            continue;
        }
        for (run, record) in folded.runs() {
            rows.push(RunRow {
                agent: agent.to_owned(),
                run,
                status: record.status.as_str(),
                epoch: record.epoch,
                device: state.hlc_of(record).device_id.to_string(),
            });
        }
        // Fenced pendings are not in the fold's view; the in-doubt index has them.
        for doubt in ledger.in_doubt(agent, u64::MAX) {
            match rows
                .iter_mut()
                .find(|row| row.agent == agent && row.run == doubt.run_id)
            {
                Some(row) => row.status = "in-doubt",
                None => rows.push(RunRow {
                    agent: agent.to_owned(),
                    run: doubt.run_id,
                    status: "in-doubt",
                    epoch: doubt.epoch,
                    device: doubt.device_id,
                }),
            }
        }
    }
    rows.sort_by(|a, b| (&a.agent, &a.run).cmp(&(&b.agent, &b.run)));
    rows
}

pub fn ledger(settings: &Settings, command: LedgerCommand) -> Result<i32> {
    match command {
        LedgerCommand::Verify => return verify(settings),
        LedgerCommand::Resolve { agent, run, outcome } => {
            let mut ledger = open_ledger(settings)?;
            let Some(doubt) = ledger
                .in_doubt(&agent, u64::MAX)
                .into_iter()
                .find(|doubt| doubt.run_id == run)
            else {
                bail!("{run} of {agent} is not in doubt (see `fencepost ledger runs --agent {agent}`)");
            };
            let status = if outcome == "committed" {
                IntentStatus::Committed
            } else {
                IntentStatus::Failed
            };
            ledger.record(&Intent::new(&run, &agent, doubt.epoch, status))?;
            ledger
                .flush()
                .context("cannot write the outcome to the ledger folder")?;
            println!("{agent}: recorded {run} as {outcome} (epoch {})", doubt.epoch);
        }
        LedgerCommand::Show { json } => {
            let ledger = open_ledger(settings)?;
            let rows = run_rows(&ledger, None);
            let mut agents = Vec::new();
            for (agent, folded) in ledger.state().agents() {
                let mine = rows.iter().filter(|row| row.agent == agent);
                let committed = mine.clone().filter(|row| row.status == "committed").count();
                let in_doubt = mine.clone().filter(|row| row.status == "in-doubt").count();
                agents.push(json!({
                    "agent_id": agent, "fencing_epoch": folded.fencing_epoch(),
                    "runs": mine.count(), "committed": committed, "in_doubt": in_doubt,
                }));
            }
            if json {
                println!("{}", serde_json::Value::Array(agents));
            } else if agents.is_empty() {
                println!("the ledger in {} has no intents yet", settings.ledger.display());
            } else {
                for agent in agents {
                    println!(
                        "{}: fencing epoch {}, {} runs, {} committed, {} in doubt",
                        agent["agent_id"].as_str().unwrap_or_default(),
                        agent["fencing_epoch"],
                        agent["runs"],
                        agent["committed"],
                        agent["in_doubt"]
                    );
                }
            }
        }
        LedgerCommand::Runs { agent, json } => {
            let ledger = open_ledger(settings)?;
            let rows = run_rows(&ledger, agent.as_deref());
            if json {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|row| json!({"agent_id": row.agent, "run_id": row.run, "status": row.status, "epoch": row.epoch, "device_id": row.device}))
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                for row in &rows {
                    println!(
                        "{}  {}  {:<9}  epoch {}  by {}",
                        row.agent, row.run, row.status, row.epoch, row.device
                    );
                }
            }
        }
    }
    Ok(EXIT_RAN_OK)
}

fn verify(settings: &Settings) -> Result<i32> {
    let relay = settings.relay()?;
    let batch = relay
        .pull(&Frontier::new())
        .context("cannot read the ledger folder")?;
    let mut devices = std::collections::BTreeMap::<&str, usize>::new();
    for op in &batch.ops {
        *devices.entry(&op.device_id).or_default() += 1;
    }
    for (device, count) in &devices {
        println!("{device}: {count} records, chain verified");
    }
    if batch.problems.is_empty() {
        println!(
            "ledger {} is intact ({} devices)",
            settings.ledger.display(),
            devices.len()
        );
        return Ok(EXIT_RAN_OK);
    }
    for problem in &batch.problems {
        println!("damaged: {problem}");
    }
    eprintln!(
        "fencepost: {} problem(s) in {}: each device stops at its first bad line; restore that file from a backup or another host's copy",
        batch.problems.len(),
        settings.ledger.display()
    );
    Ok(EXIT_RAN_FAILED)
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
    /// Write an SVG timeline of the (first) seed: per site, leases held, pauses, crashes,
    /// partitions, effects and duplicates.
    #[arg(long, value_name = "FILE")]
    svg: Option<std::path::PathBuf>,
    /// Run the coordinator in SQLite databases (in a temporary folder) instead of in memory.
    #[arg(long)]
    sqlite: bool,
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
    if let Some(path) = &args.svg {
        std::fs::write(path, render_svg(&first))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.seeds == 1 {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&first)?);
        } else {
            print!("{}", render_table(&first));
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
            total.refused_at_fence += mode.refused_at_fence;
            total.refused_at_resource += mode.refused_at_resource;
            total.converged &= mode.converged;
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
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"first_seed": args.seed, "seeds": args.seeds, "modes": modes})
            )?
        );
    } else {
        let table = render_table(&sum);
        let body = table.split_once('\n').map_or(table.as_str(), |(_, rest)| rest);
        println!(
            "seeds {}..{}: {} faults in all",
            args.seed,
            args.seed + args.seeds - 1,
            sum.schedule.faults.len()
        );
        print!("{body}");
    }
    Ok(EXIT_RAN_OK)
}
