//! The subcommands, a room each; here, what several of them share: opening the ledger, refusing
//! its damage, writing back what a database that went back forgot.

mod admin;
mod device;
mod lease;
mod ledger;
mod outcome;
mod protect;
mod run;
mod simulate;

pub use admin::{admin, AdminCommand};
pub use device::{device, DeviceCommand};
pub use lease::{lease, LeaseCommand};
pub use ledger::{ledger, LedgerCommand};
pub(crate) use ledger::{run_rows, RunRow};
use outcome::*;
pub use protect::admit;
use run::*;
pub use run::{run_reporting, RunArgs};
pub use simulate::{simulate, SimulateArgs};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fencepost::clock::system_clock;
use fencepost::dispatch::{DispatchError, EffectOutcome, RunOutcome};
use fencepost::id::{validate_id, IdKind};
use fencepost::keeper::{KeeperConfig, KeeperError, LeaseKeeper, Shutdown};
use fencepost::lease::{IntentStatus, Lease, LeaseError, MAX_EPOCH_FLOOR};
use fencepost::ledger::{
    CompactOptions, Ledger, LedgerError, LedgerOptions, MissingRecords, Retention, StaleGrant,
};
use fencepost::oplog::OpRecord;
use fencepost::relay::{Frontier, ProblemKind, Relay, RelayError};
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
    if let Some(protected) = crate::membership::protected(settings)? {
        options = options
            .protected(protected)
            .checkpoint_copies(settings.checkpoint_copies()?);
    }
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
        // A ledger that is damaged says why itself (a checkpoint that covers pruned records
        // missing or refused, found by an adversarial test: this line named the genesis instead).
        if ledger.is_protected() && ledger.genesis().is_none() && ledger.damage().is_empty() {
            bail!(
                "{} is a protected ledger this host is a member of, but its founder's log (the genesis) is not in it: nothing of it can be read, so nothing runs (not synced yet? a ledger emptied or replaced?)",
                settings.ledger_label()
            );
        }
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

/// Refuses (exit 10) a ledger with damage that was not accepted, with one line that says what to
/// do; a [`Lagging`] error when a prune or a sync explains all of it ([`only_lagging`]).
fn refuse_damage(ledger: &Ledger, settings: &Settings) -> Result<()> {
    refuse_damage_for(ledger, settings, Refusing::Run)
}

/// What a damaged ledger stops: a run, or a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusing {
    Run,
    Compaction,
    Import,
}

impl Refusing {
    /// What is not done, as the refusal says it.
    fn not_doing(self) -> &'static str {
        match self {
            Refusing::Run => "not running anything",
            Refusing::Compaction => "not writing a checkpoint",
            Refusing::Import => "not importing anything",
        }
    }
}

/// [`refuse_damage`], saying what it refuses (`ledger compact` has no `--accept-damaged`: the
/// refusal names `run`'s).
fn refuse_damage_for(ledger: &Ledger, settings: &Settings, refusing: Refusing) -> Result<()> {
    match damage_refusal(ledger, settings, refusing) {
        None => Ok(()),
        Some(refusal) if only_lagging(ledger) => Err(anyhow::Error::new(Lagging(refusal))),
        Some(refusal) => Err(anyhow::anyhow!(refusal)),
    }
}

/// What [`refuse_damage`] says, if the ledger has damage that was not accepted.
fn damage_refusal(ledger: &Ledger, settings: &Settings, refusing: Refusing) -> Option<String> {
    let not_doing = refusing.not_doing();
    if let Some(problem) = ledger.snapshot_failure() {
        return Some(format!(
            "{not_doing}: {}. The ledger in {} is not damaged; run again",
            problem.detail,
            settings.ledger_label()
        ));
    }
    if let Some(problem) = ledger.checkpoint_failure() {
        return Some(format!("{not_doing}: {problem}"));
    }
    let damage = ledger.damage();
    let first = damage.first()?;
    if ledger.is_protected_elsewhere() {
        // Not damage a copy repairs: the ledger is protected and this host has not joined it.
        return Some(format!(
            "{not_doing}: the ledger in {} is protected (its records are sealed) and this host is not one of its members. Join it with `fencepost device join FINGERPRINT` (a member prints it: `fencepost ledger fingerprint`), then have a member run `fencepost device admit KEY --device {}` with this host's `fencepost device key`",
            settings.ledger_label(),
            settings.device
        ));
    }
    let lagging = only_lagging(ledger);
    if lagging && damage.iter().any(|problem| problem.kind == ProblemKind::Behind) {
        return Some(format!(
            "{not_doing}: {first}. This host's copy of the ledger ({}) lacks records that a checkpoint here or this host's snapshot read: let the sync bring them, then run again (if the file lost them, restore it from another host's copy)",
            settings.ledger_label()
        ));
    }
    if lagging {
        // Records pruned after a checkpoint this host cannot read yet: they are not lost, and
        // accepting the gap would run what they committed again (issue 37).
        return Some(format!(
            "{not_doing}: {first}. The records it lacks are in a checkpoint that this host's copy of the ledger ({}) does not hold yet: let the sync bring the checkpoints folder from the host that pruned, then run again",
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
    let accept = match refusing {
        Refusing::Run => format!("or run with --accept-damaged {which:?}"),
        Refusing::Compaction => format!("or accept it with `fencepost run --accept-damaged {which:?}`"),
        Refusing::Import => {
            return Some(format!(
                "the ledger in {} is damaged; {not_doing}: {first}. {} (`fencepost ledger verify` lists the damage), then import again",
                settings.ledger_label(),
                settings.repair_hint(went_back(&damage))
            ))
        }
    };
    Some(format!(
        "the ledger in {} is damaged, so runs it recorded could run again; {not_doing}: {first}{}. {} (`fencepost ledger verify` lists the damage), {accept} to accept that its runs may repeat",
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

/// `count` and `noun`, in the plural unless `count` is 1.
pub fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
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
