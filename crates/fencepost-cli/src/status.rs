//! `fencepost status`: the leases joined with the ledger's runs, and the ledger's health.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::commands::{open_ledger, plural, run_rows, warn_other_outboxes, RunRow};
use crate::coordinator::Backend;
use crate::exit::{EXIT_RAN_FAILED, EXIT_RAN_OK};
use crate::settings::{data_dir, without_password, Global, Settings};
use fencepost::ledger::Ledger;

/// How many of an agent's most recent commits `status` lists.
const RECENT_COMMITS: usize = 5;

/// `fencepost status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Only this agent.
    #[arg(long)]
    agent: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub global: Global,
}

/// One run as `status` lists it.
fn run_json(row: &RunRow, at_ms: Option<u64>) -> Value {
    json!({
        "run_id": row.run, "status": row.status, "epoch": row.epoch, "device_id": row.device,
        "at_ms": at_ms,
    })
}

/// The records queued on this host that the ledger does not have yet (outcomes written while
/// the database was away: [`fencepost::ledger::read_outbox`]), as `status` lists them.
fn queued_here(settings: &Settings, agent: Option<&str>) -> Result<Queued> {
    let path = settings.outbox_file()?;
    let records = fencepost::ledger::read_outbox(&path)?;
    let others = records
        .iter()
        .filter(|record| record.device_id != settings.device)
        .count();
    if others > 0 {
        err!(
            "fencepost: warning: {} in {} name another device; no ledger of this device writes them",
            plural(others as u64, "queued record"),
            path.display()
        );
    }
    let elsewhere = settings.other_outboxes();
    warn_other_outboxes(&elsewhere);
    let values = records
        .iter()
        .filter(|record| record.device_id == settings.device)
        .map(|record| match record.intent() {
            Some(intent) => json!({
                "agent_id": intent.agent_id, "run_id": intent.run_id, "epoch": intent.epoch,
                "status": intent.status.as_str(),
            }),
            None => json!({"surface": record.surface, "payload": record.payload}),
        })
        .filter(|value| agent.is_none_or(|agent| value["agent_id"].as_str().is_none_or(|of| of == agent)))
        .collect();
    let elsewhere = elsewhere
        .iter()
        .map(|(path, _)| path.display().to_string())
        .collect();
    Ok(Queued {
        path,
        records: values,
        elsewhere,
    })
}

/// What waits on this host ([`queued_here`]).
struct Queued {
    /// This ledger's outbox.
    path: std::path::PathBuf,
    /// Its records of this device, as `status` lists them.
    records: Vec<Value>,
    /// This device's outboxes under other ledger keys that hold something.
    elsewhere: Vec<String>,
}

impl Queued {
    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.elsewhere.is_empty()
    }
}

/// `fencepost status`: what [`report`] says; when the coordinator or the ledger cannot be read,
/// what is queued on this host is said with the error.
pub fn status(settings: &Settings, args: &StatusArgs) -> Result<i32> {
    if let Some(agent) = &args.agent {
        if let Err(error) = fencepost::id::validate_id(fencepost::id::IdKind::Agent, agent) {
            crate::exit::usage!("--agent {agent:?}: {error}");
        }
    }
    let queued = queued_here(settings, args.agent.as_deref())?;
    report(settings, args, &queued).inspect_err(|_| {
        if !queued.records.is_empty() {
            err!(
                "fencepost: {} of this host wait in {} for the ledger (`fencepost ledger flush` writes them)",
                plural(queued.records.len() as u64, "queued record"),
                queued.path.display()
            );
        }
    })
}

/// The leases joined with the ledger's runs, and the ledger's health (exit 1 when it is damaged,
/// behind, or records of this host wait in its outbox): one JSON object (`--json`) or text.
fn report(settings: &Settings, args: &StatusArgs, queued: &Queued) -> Result<i32> {
    let coordinator = settings.coordinator()?;
    // Leases expire by the coordinator's clock; commits are stamped by the hosts' wall clocks.
    let now_ms = coordinator.now_ms();
    let wall_now_ms = fencepost::clock::system_clock()();
    let leases: BTreeMap<String, fencepost::lease::Lease> = coordinator
        .list()
        .context("cannot list the leases")?
        .into_iter()
        .map(|lease| (lease.agent_id.clone(), lease))
        .collect();
    let live: BTreeMap<String, fencepost::lease::Lease> = leases
        .iter()
        .filter(|(_, lease)| lease.expires_at_ms > now_ms)
        .map(|(agent, lease)| (agent.clone(), lease.clone()))
        .collect();
    let ledger = open_ledger(settings)?;
    let read = Read {
        settings,
        coordinator: &coordinator,
        ledger: &ledger,
        rows: run_rows(&ledger, args.agent.as_deref(), &live),
        leases: &leases,
        now_ms,
    };
    let mut behind_any = false;
    let mut agent_values = Vec::new();
    for agent in agents_to_report(&read, args.agent.as_deref())? {
        let (value, behind) = read.agent(&agent);
        behind_any |= behind;
        agent_values.push(value);
    }
    let damage: Vec<Value> = ledger
        .damage()
        .iter()
        .map(|problem| json!({"device_id": problem.device_id, "detail": problem.to_string()}))
        .chain(
            ledger
                .checkpoint_failure()
                .map(|problem| json!({"device_id": null, "detail": problem.to_string()})),
        )
        .collect();
    let healthy = damage.is_empty() && !behind_any && queued.is_empty();
    let ledger_kind = match settings.ledger_kind {
        crate::settings::LedgerKind::Folder => "folder",
        crate::settings::LedgerKind::Sqlite => "sqlite",
        crate::settings::LedgerKind::Postgres => "postgres",
    };
    let report = json!({
        "device_id": settings.device,
        "data_directory": data_dir().map(|dir| dir.display().to_string()).ok(),
        "coordinator": without_password(&settings.coordinator),
        "ledger": {
            "location": settings.ledger_label(), "kind": ledger_kind,
            "devices": ledger.view().frontier().iter().count(),
            "healthy": healthy, "damage": damage,
            "protected": ledger.is_protected(),
            "member": !ledger.is_protected_elsewhere(),
            "fingerprint": ledger.fingerprint().map(|fingerprint| fingerprint.to_string()),
            "members": ledger.members().iter().filter(|(_, cut)| cut.is_none()).map(|(device, _)| device.to_string()).collect::<Vec<_>>(),
            "revoked": ledger.members().iter().filter_map(|(device, cut)| cut.map(|cut| json!({"device_id": device.to_string(), "from_record": cut}))).collect::<Vec<_>>(),
        },
        "coordinator_now_ms": now_ms,
        "agents": agent_values,
        "queued": queued.records,
        "queued_elsewhere": queued.elsewhere,
    });
    if args.json {
        out!("{report}");
        return Ok(if healthy { EXIT_RAN_OK } else { EXIT_RAN_FAILED });
    }
    print_agents(&report, wall_now_ms);
    Ok(print_health(&report, queued))
}

/// What `status` read, to report each agent.
struct Read<'a> {
    settings: &'a Settings,
    coordinator: &'a Backend,
    ledger: &'a Ledger,
    rows: Vec<RunRow>,
    leases: &'a BTreeMap<String, fencepost::lease::Lease>,
    now_ms: u64,
}

/// The agents `status` reports: the ledger's, the leases', those the coordinator knows only
/// (released, with records their holders published that this host's ledger may never have
/// received: a ledger that is not shared), narrowed to `only`.
fn agents_to_report(read: &Read<'_>, only: Option<&str>) -> Result<Vec<String>> {
    let mut agents: Vec<String> = read
        .ledger
        .state()
        .agents()
        .into_iter()
        .map(|(agent, _)| agent.to_owned())
        .collect();
    agents.extend(read.leases.keys().cloned());
    agents.extend(read.coordinator.agents().context("cannot list the agents")?);
    agents.extend(only.map(str::to_owned));
    agents.sort();
    agents.dedup();
    agents.retain(|agent| only.is_none_or(|only| only == agent));
    Ok(agents)
}

impl Read<'_> {
    /// One agent as `status --json` shows it, and whether this host's ledger is behind what its
    /// holders published.
    fn agent(&self, agent: &str) -> (Value, bool) {
        let state = self.ledger.state();
        let lease = self.leases.get(agent).map(|lease| self.lease(agent, lease));
        let mine: Vec<&RunRow> = self.rows.iter().filter(|row| row.agent == agent).collect();
        let running: Vec<Value> = mine
            .iter()
            .filter(|row| row.status == "running")
            .map(|row| run_json(row, None))
            .collect();
        let in_doubt: Vec<Value> = mine
            .iter()
            .filter(|row| row.status == "in-doubt")
            .map(|row| run_json(row, None))
            .collect();
        let mut committed: Vec<(u64, &RunRow)> = mine
            .iter()
            .filter(|row| row.status == "committed")
            .map(|row| {
                let at_ms = state
                    .committed_run(agent, &row.run)
                    .map_or(0, |record| state.hlc_of(record).wall_ms);
                (at_ms, *row)
            })
            .collect();
        committed.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.run.cmp(&b.1.run)));
        let committed_count = committed.len();
        let recent: Vec<Value> = committed
            .iter()
            .take(RECENT_COMMITS)
            .map(|(at_ms, row)| run_json(row, Some(*at_ms)))
            .collect();
        // Rule H3: what the agent's holders published that this host's ledger has not received.
        let behind: Vec<Value> = match self.coordinator.published_frontier(agent) {
            Ok(published) => self
                .ledger
                .behind(&published)
                .iter()
                .map(|missing| {
                    json!({"device_id": missing.device_id, "has": missing.has, "needs": missing.needs,
                           "differs": missing.differs, "detail": missing.to_string()})
                })
                .collect(),
            Err(error) => {
                err!("fencepost: warning: cannot read what the holders of {agent} published ({error}); not checked");
                Vec::new()
            }
        };
        let behind_any = !behind.is_empty();
        let value = json!({
            "agent_id": agent,
            "fencing_epoch": state.fencing_epoch(agent),
            "lease": lease,
            "running": running,
            "in_doubt": in_doubt,
            "committed": committed_count,
            "recently_committed": recent,
            "ledger_behind": behind,
        });
        (value, behind_any)
    }

    /// An agent's lease as `status --json` shows it: its holder (a process of this host named).
    fn lease(&self, agent: &str, lease: &fencepost::lease::Lease) -> Value {
        let now_ms = self.now_ms;
        use crate::holder::HolderState;
        let process = crate::holder::find(self.settings, agent, &lease.holder, lease.epoch);
        let (state, pid, run_id) = match &process {
            HolderState::Running(process) => ("running", Some(process.pid), Some(process.run_id.clone())),
            HolderState::Gone(process) => ("gone", Some(process.pid), Some(process.run_id.clone())),
            HolderState::Unknown => ("unknown", None, None),
        };
        json!({
            "holder": lease.holder, "epoch": lease.epoch, "expires_at_ms": lease.expires_at_ms,
            "remaining_ms": lease.expires_at_ms.saturating_sub(now_ms),
            "live": lease.expires_at_ms > now_ms,
            "this_host": lease.holder == self.settings.device,
            "process": state,
            "pid": pid,
            "run_id": run_id,
        })
    }
}

/// The text report's head and its agents.
fn print_agents(report: &Value, wall_now_ms: u64) {
    out!(
        "device:      {}",
        report["device_id"].as_str().unwrap_or_default()
    );
    out!(
        "data dir:    {}",
        report["data_directory"].as_str().unwrap_or("(none: no HOME)")
    );
    out!(
        "coordinator: {}",
        report["coordinator"].as_str().unwrap_or_default()
    );
    let ledger = &report["ledger"];
    out!(
        "ledger:      {} ({}, {})",
        ledger["location"].as_str().unwrap_or_default(),
        ledger["kind"].as_str().unwrap_or_default(),
        plural(ledger["devices"].as_u64().unwrap_or_default(), "device")
    );
    if ledger["member"].as_bool() == Some(false) {
        // Found by an adversary: a host that is no member was told the ledger is not protected.
        out!("protection:  a protected ledger's sealed records, and this host is no member: it reads and writes nothing (`fencepost device join FINGERPRINT`, then a member admits it)");
    } else if ledger["protected"].as_bool() == Some(false) {
        out!("protection:  none: whoever can write the ledger can read its records and forge them (docs/security.md)");
    } else {
        out!(
            "protection:  sealed and signed, fingerprint {}: only members' records count",
            ledger["fingerprint"].as_str().unwrap_or("not read yet")
        );
        let names = |list: &serde_json::Value, show: &dyn Fn(&serde_json::Value) -> String| {
            list.as_array()
                .map_or_else(Vec::new, |list| list.iter().map(show).collect::<Vec<_>>())
                .join(", ")
        };
        out!(
            "members:     {}",
            names(&ledger["members"], &|member| member
                .as_str()
                .unwrap_or_default()
                .to_owned())
        );
        let revoked = names(&ledger["revoked"], &|revoked| {
            format!(
                "{} (from record {})",
                revoked["device_id"].as_str().unwrap_or_default(),
                revoked["from_record"]
            )
        });
        if !revoked.is_empty() {
            out!("revoked:     {revoked}");
        }
    }
    let agents = report["agents"].as_array().map_or(&[][..], Vec::as_slice);
    if agents.is_empty() {
        out!("no agent has a lease or a run yet");
    }
    for value in agents {
        let agent = value["agent_id"].as_str().unwrap_or_default();
        out!("");
        let lease_text = lease_text(&value["lease"]);
        out!(
            "agent {agent}: {lease_text}; fencing epoch {}, {} committed",
            value["fencing_epoch"],
            plural(value["committed"].as_u64().unwrap_or_default(), "run")
        );
        let list = |key: &str, label: &str| {
            for run in value[key].as_array().into_iter().flatten() {
                let at = run["at_ms"]
                    .as_u64()
                    .map(|ms| format!("  {}", ago(wall_now_ms, ms)))
                    .unwrap_or_default();
                out!(
                    "  {label:<10} {}  epoch {}  by {}{at}",
                    run["run_id"].as_str().unwrap_or_default(),
                    run["epoch"],
                    run["device_id"].as_str().unwrap_or_default()
                );
            }
        };
        list("running", "running");
        list("in_doubt", "in doubt");
        list("recently_committed", "committed");
        for missing in value["ledger_behind"].as_array().into_iter().flatten() {
            out!(
                "  behind     this host's ledger lacks {} (published by the agent's holders)",
                missing["detail"].as_str().unwrap_or_default()
            );
        }
    }
}

/// An agent's lease in words.
fn lease_text(lease: &Value) -> String {
    if lease.is_null() {
        return "not held".to_owned();
    }
    let holder = lease["holder"].as_str().unwrap_or_default();
    let who = if lease["this_host"].as_bool() == Some(true) {
        match (lease["process"].as_str(), lease["pid"].as_u64()) {
            (Some("running"), Some(pid)) => format!("{holder} (this host, process {pid})"),
            (Some("gone"), Some(pid)) => format!(
                "{holder} (this host; its process {pid} ended without giving it back, so it ends with its TTL)"
            ),
            _ => format!("{holder} (this host)"),
        }
    } else {
        holder.to_owned()
    };
    let time = if lease["live"].as_bool() == Some(true) {
        format!(
            "{:.1} s left",
            lease["remaining_ms"].as_u64().unwrap_or_default() as f64 / 1000.0
        )
    } else {
        "expired".to_owned()
    };
    format!("held by {who} at epoch {}, {time}", lease["epoch"])
}

/// The text report's queue and health; returns the exit status (1 when not healthy).
fn print_health(report: &Value, queued: &Queued) -> i32 {
    let behind_any = report["agents"].as_array().into_iter().flatten().any(|agent| {
        agent["ledger_behind"]
            .as_array()
            .is_some_and(|behind| !behind.is_empty())
    });
    let damage = report["ledger"]["damage"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for record in &queued.records {
        out!(
            "queued on this host, not yet in the ledger: {} of {} {} at epoch {} (`fencepost ledger flush` writes it)",
            record["run_id"].as_str().unwrap_or("a record"),
            record["agent_id"].as_str().unwrap_or("?"),
            record["status"].as_str().unwrap_or(""),
            record["epoch"]
        );
    }
    out!("");
    if report["ledger"]["healthy"].as_bool() == Some(true) {
        out!("ledger health: intact, and up to date with what the holders published");
        return EXIT_RAN_OK;
    }
    for problem in damage {
        out!("damaged: {}", problem["detail"].as_str().unwrap_or_default());
    }
    let mut health = Vec::new();
    if !damage.is_empty() {
        health.push(format!("damaged ({})", plural(damage.len() as u64, "problem")));
    }
    if behind_any {
        health.push(
            "behind what the holders published (a sync still copying, or a ledger not shared)".to_owned(),
        );
    }
    if !queued.is_empty() {
        health.push(format!(
            "behind this host, which holds {} it could not write yet{}",
            plural(queued.records.len() as u64, "record"),
            if queued.elsewhere.is_empty() {
                ""
            } else {
                " (and queues under another ledger key: see the warnings above)"
            }
        ));
    }
    out!("ledger health: {}", health.join("; "));
    EXIT_RAN_FAILED
}

/// How long before `now_ms` a time was, in words ("3 min ago").
fn ago(now_ms: u64, at_ms: u64) -> String {
    if at_ms > now_ms {
        return "just now".to_owned();
    }
    let seconds = (now_ms - at_ms) / 1000;
    match seconds {
        0..=119 => format!("{seconds} s ago"),
        120..=7_199 => format!("{} min ago", seconds / 60),
        7_200..=172_799 => format!("{} h ago", seconds / 3600),
        _ => format!("{} days ago", seconds / 86_400),
    }
}
