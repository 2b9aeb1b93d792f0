//! `fencepost lease`: acquire, renew, release and read a lease by hand.

use super::*;

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

pub(super) fn lease_json(lease: &Lease) -> serde_json::Value {
    json!({"agent_id": lease.agent_id, "holder": lease.holder, "epoch": lease.epoch, "expires_at_ms": lease.expires_at_ms})
}

pub(super) fn describe(lease: &Lease, now: u64) -> String {
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

pub(super) fn print_lease(lease: &Lease, json: bool, now: u64) {
    if json {
        out!("{}", lease_json(lease));
    } else {
        out!("{}", describe(lease, now));
    }
}

/// Prints a lease verdict and returns its exit status; other errors propagate.
pub(super) fn verdict(error: LeaseError, json: bool) -> Result<i32> {
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
    refuse_bad_input(&command)?;
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

/// Refuses an invalid agent id or TTL as a usage error (exit 2, rule L8), before any lease is
/// asked for.
fn refuse_bad_input(command: &LeaseCommand) -> Result<()> {
    let (agent, ttl) = match command {
        LeaseCommand::Acquire { agent, ttl, .. } | LeaseCommand::Renew { agent, ttl, .. } => {
            (Some(agent), Some(*ttl))
        }
        LeaseCommand::Release { agent, .. } | LeaseCommand::Current { agent, .. } => (Some(agent), None),
        LeaseCommand::List { .. } => (None, None),
    };
    if let Some(agent) = agent {
        if let Err(error) = validate_id(IdKind::Agent, agent) {
            crate::exit::usage!("--agent {agent:?}: {error}");
        }
    }
    if let Some(ttl) = ttl {
        if let Err(error) = fencepost::lease::validate_ttl(ttl) {
            crate::exit::usage!("--ttl {ttl} ms: {error}");
        }
    }
    Ok(())
}
