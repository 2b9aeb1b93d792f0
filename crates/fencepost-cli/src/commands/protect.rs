//! A protected ledger's membership from the command line (issue 39): `ledger init`, `ledger
//! fingerprint`, `device admit`, `device join`, `device revoke`.

use std::sync::Arc;

use super::*;
use crate::membership::{membership_file_text, read_membership_file};
use fencepost::genesis::{Fingerprint, Genesis};
use fencepost::id::DeviceId;
use fencepost::identity::PublicIdentity;
use fencepost::protected::Origin;

/// Writes the host's membership file for `genesis`, never over one of another ledger.
fn remember(settings: &Settings, genesis: &Genesis) -> Result<PathBuf> {
    let path = settings.membership_file()?;
    if let Ok(text) = std::fs::read_to_string(&path) {
        let known = read_membership_file(&text).with_context(|| format!("{} is damaged", path.display()))?;
        if known != *genesis {
            crate::exit::usage!(
                "this host is already a member of another protected ledger at {} ({}, in {})",
                settings.ledger_label(),
                known.fingerprint(),
                path.display()
            );
        }
        return Ok(path);
    }
    let folder = path.parent().context("the membership file has a folder")?;
    std::fs::create_dir_all(folder).with_context(|| format!("cannot create {}", folder.display()))?;
    let written = tempfile::NamedTempFile::new_in(folder)
        .and_then(|mut file| {
            std::io::Write::write_all(&mut file, membership_file_text(genesis).as_bytes())?;
            file.as_file().sync_all()?;
            file.persist_noclobber(&path).map_err(|error| error.error)
        })
        .with_context(|| format!("cannot write {}", path.display()));
    match written {
        Ok(_) => Ok(path),
        // Another process wrote it first: the same ledger, or not.
        Err(_) if path.exists() => remember(settings, genesis),
        Err(error) => Err(error),
    }
}

/// `fencepost ledger init`.
pub fn init(settings: &Settings, recovery_file: Option<PathBuf>) -> Result<i32> {
    if let Some(named) = settings.protected {
        crate::exit::usage!(
            "--protected (FENCEPOST_PROTECTED or the config file) names the protected ledger {named} for {} already: `ledger init` makes a new one (name it once it is made)",
            settings.ledger_label()
        );
    }
    if crate::membership::protected(settings)?.is_some() {
        crate::exit::usage!(
            "this host has already joined or founded a protected ledger at {}: `fencepost ledger fingerprint` prints it",
            settings.ledger_label()
        );
    }
    let device = DeviceId::new(&settings.device)?;
    let (key, _) = fencepost::identity::load_or_create(&crate::settings::keys_dir()?, &device)?;
    let relay = settings.relay(Access::Write)?;
    let options = LedgerOptions::default().seen_file(settings.seen_file()?);
    let (ledger, founded) = match Ledger::found(Arc::new(key), system_clock(), relay, options) {
        Err(LedgerError::NotEmpty) => crate::exit::usage!(
            "{} holds records (or files that are not records) already: `ledger init` makes an empty ledger protected (to protect an unprotected ledger, make a new one protected and copy it in with `fencepost ledger import`)",
            settings.ledger_label()
        ),
        other => other.with_context(|| format!("cannot make {} protected", settings.ledger_label()))?,
    };
    drop(ledger);
    let fingerprint = founded.genesis.fingerprint();
    let recovery_file = match recovery_file {
        Some(path) => path,
        None => crate::settings::keys_dir()?.join(format!(
            "recovery-{}.key",
            fingerprint.to_string().replace('-', "")
        )),
    };
    if !fencepost::identity::save_new(&recovery_file, &founded.recovery)? {
        bail!(
            "{} exists: the ledger is protected, but its recovery key was not written (run `ledger init` on an empty ledger with another --recovery-key-file)",
            recovery_file.display()
        );
    }
    let path = remember(settings, &founded.genesis)?;
    err!(
        "{} is protected, with device {device} its first member (this host remembers it in {}). Its recovery key is in {}: move it offline, it admits and revokes devices and reads every record. Give the fingerprint below to each device that joins.",
        settings.ledger_label(),
        path.display(),
        recovery_file.display()
    );
    out!("{fingerprint}");
    Ok(EXIT_RAN_OK)
}

/// `fencepost ledger fingerprint`.
pub fn fingerprint(settings: &Settings) -> Result<i32> {
    let path = settings.membership_file()?;
    let Ok(text) = std::fs::read_to_string(&path) else {
        crate::exit::usage!(
            "this host is a member of no protected ledger at {} (`ledger init` makes one, `device join FINGERPRINT` joins one)",
            settings.ledger_label()
        );
    };
    let genesis = read_membership_file(&text).with_context(|| format!("{} is damaged", path.display()))?;
    out!("{}", genesis.fingerprint());
    Ok(EXIT_RAN_OK)
}

/// The recovery key in `path` (`--recovery-key-file`).
fn recovery_key(path: &Path) -> Result<fencepost::identity::DeviceKey> {
    let recovery = DeviceId::new(fencepost::membership::RECOVERY)?;
    match fencepost::identity::load_file(path, &recovery) {
        Ok(key) => Ok(key),
        Err(error) => crate::exit::usage!("--recovery-key-file: {error}"),
    }
}

/// The ledger of a host that changes the members (`admit`, `revoke`: `verb`), refusing damage,
/// and the recovery key in `recovery` when given. A usage error on a host that joined no
/// protected ledger.
fn ledger_to_change(
    settings: &Settings,
    recovery: Option<&Path>,
    verb: &str,
) -> Result<(Ledger, Option<fencepost::identity::DeviceKey>)> {
    if crate::membership::protected(settings)?.is_none() {
        crate::exit::usage!(
            "this host has joined no protected ledger at {}: only a member, or a host that joined with the recovery key, {verb}",
            settings.ledger_label()
        );
    }
    let recovery = recovery.map(recovery_key).transpose()?;
    let ledger = open_ledger_to(settings, Access::Write)?;
    refuse_damage(&ledger, settings)?;
    Ok((ledger, recovery))
}

/// A membership change the ledger refused (revoking oneself, a device that is no member, …)
/// as a usage error (exit 2).
fn refused_as_usage<T>(result: std::result::Result<T, LedgerError>) -> Result<T> {
    match result {
        Err(LedgerError::Membership { detail }) => crate::exit::usage!("{detail}"),
        other => Ok(other?),
    }
}

/// `fencepost device admit KEY --device ID [--recovery-key-file FILE]`: `device` is the ID
/// (the `--device` given after `admit`; this host's own id is `settings.device`).
pub fn admit(settings: &Settings, key: &str, device: Option<&str>, recovery: Option<&Path>) -> Result<i32> {
    let Some(device) = device else {
        crate::exit::usage!("name the device to admit: `fencepost device admit KEY --device ID`");
    };
    let identity: PublicIdentity = match key.parse() {
        Ok(identity) => identity,
        Err(error) => {
            crate::exit::usage!("the device's key (the line `fencepost device key` printed on it): {error}")
        }
    };
    let device = match DeviceId::new(device) {
        Ok(device) => device,
        Err(error) => crate::exit::usage!("the device to admit: {error}"),
    };
    if device.as_str() == settings.device && recovery.is_none() {
        crate::exit::usage!(
            "device {device} is this host's own id: give this host's id with FENCEPOST_DEVICE, the config file or a --device before `device`, and the admitted one after `admit` (a device admits itself only with --recovery-key-file)"
        );
    }
    let (mut ledger, recovery) = ledger_to_change(settings, recovery, "admits")?;
    refused_as_usage(match &recovery {
        Some(recovery) => ledger.admit_by_recovery(&device, &identity, recovery),
        None => ledger.admit(&device, &identity),
    })?;
    err!(
        "admitted device {device} to {}: on it, run `fencepost device join {}`",
        settings.ledger_label(),
        ledger
            .fingerprint()
            .map_or_else(String::new, |fingerprint| fingerprint.to_string())
    );
    Ok(EXIT_RAN_OK)
}

/// `fencepost device revoke ID [--from SEQ]`.
pub fn revoke(settings: &Settings, device: &str, from: Option<u64>, recovery: Option<&Path>) -> Result<i32> {
    let device = match DeviceId::new(device) {
        Ok(device) => device,
        Err(error) => crate::exit::usage!("the device to revoke: {error}"),
    };
    let (mut ledger, recovery) = ledger_to_change(settings, recovery, "revokes")?;
    let revoked = refused_as_usage(match &recovery {
        Some(recovery) => ledger.revoke_by_recovery(&device, from, recovery),
        None => ledger.revoke(&device, from),
    })?;
    let in_doubt = ledger.runs_in_doubt();
    err!(
        "revoked device {device} from record {} of its log on: what it wrote from there counts for nothing. Generation {} of the ledger key is wrapped to {} (and to the recovery key){}",
        revoked.cut,
        revoked.generation,
        revoked
            .members
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        if in_doubt == 0 {
            String::new()
        } else {
            format!("; {in_doubt} run(s) are in doubt now (`fencepost ledger runs` lists them, `fencepost ledger resolve` settles each after checking what happened)")
        }
    );
    match &revoked.checkpoint {
        None => {}
        Some(Ok(info)) => err!(
            "wrote a checkpoint of {} records (a host that reads the revocation first starts from it, not from one the revoked device wrote)",
            info.records
        ),
        Some(Err(error)) => err!(
            "could not write a checkpoint ({error}): run `fencepost ledger compact` on a member, so that a host that reads the revocation first has one to start from"
        ),
    }
    Ok(EXIT_RAN_OK)
}

/// `fencepost device join FINGERPRINT`: finds the genesis with that fingerprint in the ledger
/// (never taking the ledger's word for which ledger it is) and remembers it.
pub fn join(settings: &Settings, fingerprint: &str) -> Result<i32> {
    let wanted: Fingerprint = match fingerprint.parse() {
        Ok(wanted) => wanted,
        Err(error) => crate::exit::usage!("the fingerprint: {error}"),
    };
    if let Some(named) = settings.protected.filter(|named| *named != wanted) {
        crate::exit::usage!(
            "--protected (FENCEPOST_PROTECTED or the config file) names the protected ledger {named}, not {wanted}"
        );
    }
    let device = DeviceId::new(&settings.device)?;
    let (key, _) = fencepost::identity::load_or_create(&crate::settings::keys_dir()?, &device)?;
    let relay = settings.relay(Access::ReadOnly)?;
    let batch = relay.pull(&Frontier::new())?;
    let origins: Vec<(String, Origin)> = batch
        .ops
        .iter()
        .filter(|op| op.seq == 0)
        .filter_map(|op| {
            Origin::of_record(op)
                .ok()
                .map(|(_, origin)| (op.device_id.to_string(), origin))
        })
        .collect();
    // The founder's log begins with it; a sealed checkpoint's header names it too, where
    // the founder's first records were pruned after a checkpoint.
    let genesis = origins
        .iter()
        .filter_map(|(_, origin)| match origin {
            Origin::Genesis(genesis) => Some(genesis.clone()),
            Origin::Identity(_) => None,
        })
        .chain(fencepost::checkpoint::sealed_geneses(&*relay))
        .find(|genesis| wanted.matches(&genesis.ledger_id()));
    if let Some((_, origin)) = origins.iter().find(|(owner, _)| *owner == device.as_str()) {
        if origin.signer() != &key.public() {
            crate::exit::usage!(
                "the ledger already has a log of device {device} under another key: another host uses this device id. Give this host an id of its own (--device, FENCEPOST_DEVICE)"
            );
        }
    }
    let Some(genesis) = genesis else {
        bail!(
            "no protected ledger with the fingerprint {wanted} in {} (not synced here yet, or another ledger)",
            settings.ledger_label()
        );
    };
    let path = remember(settings, &genesis)?;
    err!(
        "device {device} joined the protected ledger {wanted} at {} (remembered in {}); its records count once a member ran `fencepost device admit {} --device {device}`",
        settings.ledger_label(),
        path.display(),
        key.public()
    );
    Ok(EXIT_RAN_OK)
}
