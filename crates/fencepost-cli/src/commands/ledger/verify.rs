//! `ledger verify`: every record read again and checked, and every checkpoint against the records it covers.

use anyhow::{Context, Result};
use fencepost::lease::MAX_EPOCH;
use fencepost::ledger::Ledger;
use fencepost::oplog::Surface;
use fencepost::relay::{Frontier, ProblemKind};
use serde_json::json;

use super::{open_ledger, plural, went_back};
use crate::exit::{EXIT_RAN_FAILED, EXIT_RAN_OK};
use crate::settings::{Access, Settings};

/// `ledger verify` (exit 1 when anything is damaged).
pub(super) fn verify(settings: &Settings, json: bool) -> Result<i32> {
    // A host named to a protected ledger it has not joined touches nothing, the folder included
    // (found by an adversary: opening the relay first made its devices/ folder).
    crate::membership::protected(settings)?;
    let relay = settings.relay(Access::ReadOnly)?;
    // What this site saw before (a file that shrank or was replaced) comes from the ledger; it
    // says where a reading of every record starts (after the checkpoint that device files
    // begin after, once they were pruned).
    let ledger = open_ledger(settings)?;
    let since = ledger
        .pruned_start()
        .map(|(_, frontier)| frontier.clone())
        .unwrap_or_default();
    let (mut devices, mut findings) = read_every_record(relay.as_ref(), &since)?;
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
    // A protected ledger's records this host does not count: a head that does not verify is
    // damage; what it cannot read yet (not covered, not opened, a key not given to it) is
    // missing, and the runs that need it wait (found by an adversary: both were reported
    // "intact"); a log no member's key admitted counts for nothing and stops nothing.
    for (device, seq, why) in ledger.not_counted() {
        findings.push((
            not_counted_kind(&why),
            format!("device {device:?} from record {seq}: not counted: {why}"),
        ));
    }
    findings.extend(behind_published(settings, &ledger, Void::Report));
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
            json!({"ledger": settings.ledger_label(), "intact": bad == 0, "protected": ledger.is_protected(), "fingerprint": ledger.fingerprint().map(|fingerprint| fingerprint.to_string()), "devices": devices, "problems": findings})
        );
        return Ok(if bad == 0 { EXIT_RAN_OK } else { EXIT_RAN_FAILED });
    }
    Ok(print_verified(
        settings,
        &ledger,
        &devices,
        &findings,
        bad,
        checkpoints_bad,
    ))
}

/// Rule H3: the records the holders of each agent the ledger knows published (the
/// coordinator's frontiers) that the ledger does not hold, or holds other ones at: a device file
/// replaced by an older copy of itself, or a sync not done yet. That agent's runs wait for them
/// (exit 7), so they are `missing` (found by an adversary: `verify` said "intact" for a file
/// rolled back to an older, validly signed copy). Not compared, with a warning, when the
/// coordinator cannot be read.
///
/// `Void::Skip` leaves out the records of a revoked device past its cut: void, they are no
/// membership change that counts, and a compaction does without them (found by an adversary:
/// a thief's published records that never come stopped compaction for good).
pub(super) fn behind_published(settings: &Settings, ledger: &Ledger, void: Void) -> Findings {
    let coordinator = match settings.coordinator() {
        Ok(coordinator) => coordinator,
        Err(error) => {
            err!("fencepost: warning: cannot read the coordinator ({error:#}); the ledger was not compared with what the holders published");
            return Vec::new();
        }
    };
    let cuts: Vec<(String, u64)> = match void {
        Void::Report => Vec::new(),
        Void::Skip => ledger
            .members()
            .into_iter()
            .filter_map(|(device, cut)| Some((device.to_string(), cut?)))
            .collect(),
    };
    let counts = |missing: &fencepost::ledger::MissingRecords| {
        !cuts
            .iter()
            .any(|(device, cut)| *device == missing.device_id && missing.has >= *cut)
    };
    let mut findings = Findings::new();
    for (agent, _) in ledger.state().agents() {
        match coordinator.published_frontier(agent) {
            Ok(published) => findings.extend(ledger.behind(&published).iter().filter(|missing| counts(missing)).map(|missing| {
                let what = if missing.differs { "" } else { ", which this ledger lacks (a device file replaced by an older copy, or a sync not done yet)" };
                ("missing", format!("agent {agent:?}: its holders published {missing}{what}"))
            })),
            Err(error) => err!(
                "fencepost: warning: cannot read what the holders of {agent} published ({error}); not compared"
            ),
        }
    }
    findings
}

/// What a record this host does not count is to `ledger verify`: `damaged` (a head that does
/// not verify), `ignored` (a log no member's key admitted, which stops nothing) or `missing`
/// (what it cannot read yet: runs that need it wait).
pub(super) fn not_counted_kind(why: &fencepost::protected::Missing) -> &'static str {
    use fencepost::protected::Missing;
    match why {
        Missing::HeadNotValid => "damaged",
        Missing::NotAMember | Missing::NoOrigin(_) => "ignored",
        _ => "missing",
    }
}

/// Whether [`behind_published`] reports the records of a revoked device past its cut.
pub(super) enum Void {
    /// Reported, as any other (`verify`).
    Report,
    /// Left out (`compact`).
    Skip,
}

/// What `ledger verify` found: each kind (`damaged`, `incomplete`, `malformed`, `ignored`) with
/// its detail.
type Findings = Vec<(&'static str, String)>;

/// Every record after `since`, read as a stream (a ledger of millions of records is never held
/// whole): how many of each device, and the malformed intents.
fn read_every_record(
    relay: &dyn fencepost::relay::Relay,
    since: &Frontier,
) -> Result<(std::collections::BTreeMap<String, usize>, Findings)> {
    let mut devices = std::collections::BTreeMap::<String, usize>::new();
    let mut findings: Findings = Vec::new();
    relay
        .pull_in_batches(since, &mut |ops| {
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
    Ok((devices, findings))
}

/// `ledger verify`'s text: each device's records, the findings, and the verdict (exit 1 when
/// anything is damaged).
fn print_verified(
    settings: &Settings,
    ledger: &Ledger,
    devices: &std::collections::BTreeMap<String, usize>,
    findings: &[(&'static str, String)],
    bad: usize,
    checkpoints_bad: usize,
) -> i32 {
    let after = if let Some((start, _)) = ledger.pruned_start() {
        out!(
            "the logs begin after the checkpoint {}: the records after it were verified",
            start.display()
        );
        " after it"
    } else {
        ""
    };
    for (device, count) in devices {
        out!(
            "{device}: {}{after}, chain verified",
            plural(*count as u64, "record")
        );
    }
    for (kind, detail) in findings {
        out!("{kind}: {detail}");
    }
    match ledger.fingerprint() {
        Some(fingerprint) => out!("protected, fingerprint {fingerprint}: only records sealed and signed by members count"),
        None if ledger.is_protected() => out!("protected, but its genesis (the founder's first record) is not in the ledger: no record counts"),
        None => out!("not protected: records are neither signed nor encrypted, so intact says nothing of who wrote them (docs/security.md)"),
    }
    if bad == 0 {
        out!(
            "ledger {} is intact ({})",
            settings.ledger_label(),
            plural(devices.len() as u64, "device")
        );
        return EXIT_RAN_OK;
    }
    let missing = findings.iter().filter(|(kind, _)| *kind == "missing").count();
    if missing == bad {
        err!(
            "fencepost: {} in {}: records this host cannot count yet (the rest of the ledger has not reached it, or no member has given it that generation of the ledger key); runs that need them wait (exit 7)",
            plural(bad as u64, "problem"),
            settings.ledger_label()
        );
    } else if bad > checkpoints_bad {
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
    EXIT_RAN_FAILED
}
