//! `fencepost ledger`: show, runs, resolve, flush, repair, import, compact and verify.

use super::*;

mod import;
mod verify;

use import::import;
use verify::verify;

/// `fencepost ledger …`.
#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Make the ledger (empty) protected, with this device its first member: its records are
    /// then sealed and signed, readable by members only. Prints the ledger's fingerprint (give
    /// it to each device that joins) and writes a recovery key to a file (mode 0600) to keep
    /// offline.
    Init {
        /// Where to write the recovery key (default: the data directory's keys folder).
        #[arg(long, value_name = "PATH")]
        recovery_key_file: Option<PathBuf>,
    },
    /// Print the fingerprint of the protected ledger this host is a member of, one line.
    Fingerprint,
    /// Agents with their fencing epochs and counts of runs, committed and in doubt (exit 1, and
    /// what is damaged, on a damaged ledger; exit 7, and what it lacks, when this host cannot
    /// count some records of a protected ledger yet).
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
    /// on a damaged ledger; exit 7, and what it lacks, when this host cannot count some records
    /// of a protected ledger yet).
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
    /// (exit 1). Into a protected ledger (run on a member, every host stopped): the whole,
    /// undamaged ledger is sealed as this device's records, and each agent's hand-off is
    /// published on this ledger's coordinator, which must be a new one (not the old ledger's).
    Import {
        /// The ledger to copy from, named as --ledger names one.
        #[arg(value_name = "DIR|sqlite:PATH|URL")]
        from: PathBuf,
        /// Into a protected ledger: the old ledger's coordinator, named as --coordinator names
        /// one. The copy read must hold every record its holders published there (a copy of a
        /// synced folder that lags is refused).
        #[arg(long, value_name = "SPEC")]
        source_coordinator: Option<String>,
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
    pub(super) after: Option<String>,
    /// For a committed run: an outcome recorded beside its commit that the fold would show
    /// (`failed@1`, a resolution and the attempt's own outcome disagreeing); the commit wins (F6).
    pub(super) also: Option<String>,
}

/// The live lease of each agent, by the coordinator (none when it cannot be reached: then every
/// unsettled attempt shows as in doubt).
pub(super) fn live_leases(settings: &Settings) -> std::collections::BTreeMap<String, Lease> {
    listed_live_leases(settings).unwrap_or_else(|error| {
        err!(
            "fencepost: warning: {}; runs whose lease is live show as in doubt",
            crate::exit::one_line(&error)
        );
        Default::default()
    })
}

/// The TTL of the lease `ledger resolve` holds while it records an outcome.
pub(super) const RESOLVE_TTL_MS: u64 = 30_000;

/// Takes `agent`'s lease for `ledger resolve`, and brings the ledger up to what its holders
/// published (rule H3: another operator's resolution included). Refused while the lease is live:
/// at the attempt's epoch the run may still be running; at another, another run or operator
/// holds it.
pub(super) fn hold_to_resolve(
    settings: &Settings,
    agent: &str,
    run: &str,
    doubt: &fencepost::ledger::InDoubtRun,
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
pub(super) fn listed_live_leases(settings: &Settings) -> Result<std::collections::BTreeMap<String, Lease>> {
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
        LedgerCommand::Init { recovery_key_file } => super::protect::init(settings, recovery_key_file),
        LedgerCommand::Fingerprint => super::protect::fingerprint(settings),
        LedgerCommand::Verify { json } => verify(settings, json),
        LedgerCommand::Flush { json } => flush(settings, json),
        LedgerCommand::Repair => {
            let mut ledger = open_ledger_with(settings, Access::Write, true, false)?;
            if repair_went_back(&mut ledger, settings, "")?.is_empty() && ledger.damage().is_empty() {
                out!("nothing to repair in {}", settings.ledger_label());
            }
            Ok(report_damage(&ledger, settings))
        }
        LedgerCommand::Import {
            from,
            source_coordinator,
        } => import(settings, &from, source_coordinator.as_deref()),
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
            compact(settings, json, forget, prune)
        }
        LedgerCommand::Resolve {
            agent,
            run,
            outcome,
            force,
        } => resolve(settings, &agent, &run, &outcome, force),
        LedgerCommand::Show { json } => show(settings, json),
        LedgerCommand::Runs { agent, json } => runs(settings, agent.as_deref(), json),
    }
}

/// `ledger flush`: what this host queued, written.
fn flush(settings: &Settings, json: bool) -> Result<i32> {
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
    Ok(EXIT_RAN_OK)
}

/// `ledger resolve`: an in-doubt run's outcome recorded, under the agent's lease unless `force`.
fn resolve(settings: &Settings, agent: &str, run: &str, outcome: &str, force: bool) -> Result<i32> {
    let agent_id = match fencepost::id::AgentId::new(agent) {
        Ok(agent_id) => agent_id,
        Err(error) => crate::exit::usage!("--agent: {error}"),
    };
    let run_id = match fencepost::id::RunId::new(run) {
        Ok(run_id) => run_id,
        Err(error) => crate::exit::usage!("--run: {error}"),
    };
    // Opened to write: what this host queued (the run's own outcome, maybe) is written
    // first (found by an adversarial test: a run resolved `failed` while its `committed`
    // waited in this host's outbox ran again elsewhere).
    let mut ledger = open_ledger_to_write(settings)?;
    let Some(doubt) = ledger
        .in_doubt(agent, u64::MAX)
        .into_iter()
        .find(|doubt| doubt.run_id == run)
    else {
        crate::exit::usage!("{run} of {agent} is not in doubt (see `fencepost ledger runs --agent {agent}`)");
    };
    refuse_queued_elsewhere(settings, agent, run)?;
    // Under the agent's lease (unless --force), so that two operators resolving one run
    // at once take turns: the second finds it resolved (found by an adversarial test:
    // both were told their opposite outcomes were recorded).
    let keeper = if force {
        None
    } else {
        Some(hold_to_resolve(settings, agent, run, &doubt, &mut ledger)?)
    };
    if keeper.is_some() && ledger.in_doubt_run(agent, run, u64::MAX).is_none() {
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
    let resolved = ledger.resolve(&agent_id, &run_id, settled);
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
    if settled == RunOutcome::Failed && ledger.sync().is_ok() && ledger.committed_run(agent, run).is_some() {
        err!("fencepost: {run} of {agent} was recorded failed, but another record commits it, and a commit stands (see `fencepost ledger runs --agent {agent}`)");
        return Ok(EXIT_RAN_FAILED);
    }
    out!("{agent}: recorded {run} as {outcome} (epoch {})", doubt.epoch);
    if let Some(older) = ledger.in_doubt_run(agent, run, u64::MAX) {
        out!(
            "{agent}: {run} is still in doubt: its attempt at epoch {} by {} has no outcome either (resolve it too)",
            older.epoch,
            older.device_id
        );
    }
    Ok(EXIT_RAN_OK)
}

/// `ledger show`: agents with their fencing epochs and counts.
fn show(settings: &Settings, json: bool) -> Result<i32> {
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
    Ok(report_listing(&ledger, settings))
}

/// `ledger runs`: every run (of `agent`), with its status.
fn runs(settings: &Settings, agent: Option<&str>, json: bool) -> Result<i32> {
    let ledger = open_ledger(settings)?;
    let rows = run_rows(&ledger, agent, &live_leases(settings));
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
    Ok(report_listing(&ledger, settings))
}

/// After a listing (`ledger show`, `ledger runs`): what [`report_damage`] says, then the
/// records of a protected ledger this host cannot count yet (not covered by a head, not opened,
/// a key not given to it): the listing lacks them, so a run it shows in doubt, or not at all,
/// may have committed there; exit 7 for them, as a run that needs them waits (found by an
/// adversary: both said nothing and exited 0).
fn report_listing(ledger: &Ledger, settings: &Settings) -> i32 {
    let damaged = report_damage(ledger, settings);
    let lacking: Vec<String> = ledger
        .not_counted()
        .into_iter()
        .filter(|(_, _, why)| verify::not_counted_kind(why) != "ignored")
        .map(|(device, seq, why)| format!("device {device:?} from record {seq}: {why}"))
        .collect();
    if lacking.is_empty() {
        return damaged;
    }
    for detail in &lacking {
        err!("fencepost: not counted yet: {detail}");
    }
    err!(
        "fencepost: the listing above lacks those records: a run it shows in doubt, or not at all, may have committed there (`fencepost ledger verify` says more)"
    );
    if damaged == EXIT_RAN_OK {
        EXIT_LEDGER_BEHIND
    } else {
        damaged
    }
}

/// After a listing or a repair: on a damaged ledger, says what is damaged
/// (the listing lacks what the damaged devices recorded) and returns exit 1; else 0.
pub(super) fn report_damage(ledger: &Ledger, settings: &Settings) -> i32 {
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

/// `fencepost ledger compact`.
pub(super) fn compact(
    settings: &Settings,
    json: bool,
    forget: Option<Retention>,
    prune: bool,
) -> Result<i32> {
    for agent in forget.iter().flat_map(|retention| &retention.agents) {
        if let Err(error) = validate_id(IdKind::Agent, agent) {
            crate::exit::usage!("--forget-agent: {error}");
        }
    }
    // Every record read and checked (no snapshot): damage anywhere refuses the checkpoint.
    let mut ledger = open_ledger(settings)?;
    refuse_damage_for(&ledger, settings, Refusing::Compaction)?;
    if ledger.is_protected() {
        // A compaction judges checkpoints, and its own, on what this ledger read: one that
        // lacks what the holders published (a revocation of this device among it) would
        // replace the others' checkpoints and prune (found by a cryptography review).
        let behind = verify::behind_published(settings, &ledger, verify::Void::Skip);
        if !behind.is_empty() {
            for (_, detail) in &behind {
                err!("fencepost: not compacting: {detail}");
            }
            err!("fencepost: let the sync bring what the holders published, then compact again");
            return Ok(EXIT_LEDGER_BEHIND);
        }
    }
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
        Err(LedgerError::Damaged { .. }) => {
            refuse_damage_for(&ledger, settings, Refusing::Compaction)?;
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
        let stored = if settings.ledger_kind == LedgerKind::Postgres || ledger.is_protected() {
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
