//! `ledger import`: another ledger's records copied into this one; into a protected ledger,
//! through `Ledger::import` (rule S4).

use super::*;

/// `ledger import`: every intact device of `from`, pushed to this host's ledger.
pub(in crate::commands) fn import(
    settings: &Settings,
    from: &Path,
    source_coordinator: Option<&str>,
) -> Result<i32> {
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
    if crate::membership::protected(settings)?.is_some() {
        let Some(spec) = source_coordinator else {
            crate::exit::usage!(
                "ledger import into a protected ledger needs --source-coordinator SPEC: the old ledger's coordinator, whose published frontiers the copy must reach (the protected ledger's coordinator, --coordinator, is a new one)"
            );
        };
        let source = source.with_coordinator(spec);
        // Opening a SQLite coordinator makes its file: a misspelt path would be an empty one.
        if let Some(path) = source.coordinator.strip_prefix("sqlite:") {
            if !Path::new(path).is_file() {
                crate::exit::usage!("--source-coordinator {spec}: no coordinator there ({path} is no file)");
            }
        }
        if source.coordinator == settings.coordinator {
            crate::exit::usage!(
                "--source-coordinator names this ledger's coordinator: the protected ledger needs a coordinator of its own (--coordinator), the old one's frontiers name the old logs"
            );
        }
        return import_into_protected(settings, &source, source_relay.as_ref());
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

/// `ledger import` into the protected ledger this host is a member of: the whole ledger
/// `source`, undamaged, copied as this device's records; every agent's frontier published
/// anew on this ledger's coordinator.
fn import_into_protected(settings: &Settings, source: &Settings, source_relay: &dyn Relay) -> Result<i32> {
    // Read whole and checked first: a damaged device would lose the commits after its damage.
    let checked = open_ledger(source)?;
    if let Some(damage) = checked.damage().first() {
        refuse_damage_for(&checked, source, Refusing::Import)?;
        bail!(
            "cannot import {}: it is damaged ({damage})",
            source.ledger_label()
        );
    }
    drop(checked);
    let batch = source_relay
        .pull(&Frontier::new())
        .with_context(|| format!("cannot read the ledger {}", source.ledger_label()))?;
    // Any problem, an incomplete last line included (found by an adversary: a torn line was
    // left out, and its commit became a run in doubt for good).
    if let Some(problem) = batch.problems.first() {
        bail!(
            "cannot import {}: {problem}; nothing was imported (a write in progress: stop every host; a torn line: restore the file from a copy)",
            source.ledger_label()
        );
    }
    let old_coordinator = source
        .coordinator()
        .with_context(|| format!("cannot reach the old ledger's coordinator {}", source.coordinator))?;
    let mut published = Vec::new();
    for agent in old_coordinator.agents()? {
        let frontier = old_coordinator.shared().published_frontier(&agent)?;
        published.push((agent, frontier));
    }
    let import_source = fencepost::ledger::ImportSource {
        records: batch.ops,
        published,
    };
    let mut ledger = open_ledger_to_write(settings)?;
    refuse_damage_for(&ledger, settings, Refusing::Import)?;
    let coordinator = settings.coordinator()?;
    const IMPORT_TTL_MS: u64 = 30_000;
    let imported = ledger
        .import(import_source, coordinator.shared().as_ref(), IMPORT_TTL_MS)
        .with_context(|| {
            format!(
                "cannot import {} into the protected ledger {}",
                source.ledger_label(),
                settings.ledger_label()
            )
        })?;
    if imported.already {
        out!(
            "{} was imported into {} already: published the hand-off of {} again",
            source.ledger_label(),
            settings.ledger_label(),
            plural(imported.agents.len() as u64, "agent")
        );
    } else {
        out!(
            "imported {} of {} into the protected ledger {}, sealed as records of device {}; published the hand-off of {}",
            plural(imported.records, "record"),
            source.ledger_label(),
            settings.ledger_label(),
            settings.device,
            plural(imported.agents.len() as u64, "agent")
        );
    }
    Ok(EXIT_RAN_OK)
}
