//! The file where a host keeps what it knows of a protected ledger it founded or joined
//! (`Settings::membership_file`): the fingerprint it was given and the genesis that matches
//! it (decoded without I/O), and the [`protected`] ledger it makes of it.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fencepost::genesis::{Fingerprint, Genesis};

use crate::settings::Settings;

/// What the file's first line says.
const HEADER: &str = "# fencepost: this host is a member of a protected ledger. Deleting this file does not make the ledger unprotected: its records are then unreadable here.";

/// The file's text for `genesis`.
pub fn membership_file_text(genesis: &Genesis) -> String {
    format!(
        "{HEADER}\nfingerprint {}\ngenesis {}\n",
        genesis.fingerprint(),
        URL_SAFE_NO_PAD.encode(genesis.to_bytes())
    )
}

/// The genesis in the file's `text`, checked against the fingerprint beside it.
///
/// # Errors
/// A missing or malformed line, or a genesis that does not match the fingerprint.
pub fn read_membership_file(text: &str) -> Result<Genesis> {
    let mut fingerprint = None;
    let mut genesis = None;
    for line in text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
    {
        match line.split_once(' ') {
            Some(("fingerprint", value)) => {
                fingerprint = Some(value.parse::<Fingerprint>().context("its fingerprint line")?);
            }
            Some(("genesis", value)) => {
                let bytes = URL_SAFE_NO_PAD
                    .decode(value.trim())
                    .context("its genesis line is not base64url")?;
                genesis = Some(Genesis::from_bytes(&bytes).context("its genesis line")?);
            }
            _ => bail!("a line that is neither `fingerprint …` nor `genesis …`"),
        }
    }
    let (Some(fingerprint), Some(genesis)) = (fingerprint, genesis) else {
        bail!("it lacks its fingerprint or its genesis line");
    };
    if !fingerprint.matches(&genesis.ledger_id()) {
        bail!("its genesis does not have its fingerprint");
    }
    Ok(genesis)
}

/// The protected ledger this host is a member of at this location, with this device's key
/// (which must exist: a joined device never makes a new one); `None` when it joined none.
///
/// # Errors
/// Also when the settings name a protected ledger (`--protected`) that this host has not
/// joined, or another one than it joined: it reads and writes nothing then, whatever the
/// ledger holds (an empty or unprotected ledger served in its place included).
pub fn protected(settings: &Settings) -> Result<Option<fencepost::ledger::Protected>> {
    let path = settings.membership_file()?;
    let text = match std::fs::read_to_string(&path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(named) = settings.protected {
                bail!(
                    "the ledger {} is the protected ledger {named} (--protected, FENCEPOST_PROTECTED or the config file), and this host has not joined it: nothing read or written. Run `fencepost device join {named}`, then have a member run `fencepost device admit` with this host's `fencepost device key`",
                    settings.ledger_label()
                );
            }
            return Ok(None);
        }
        other => other.with_context(|| format!("cannot read {}", path.display()))?,
    };
    let genesis = read_membership_file(&text).with_context(|| format!("{} is damaged", path.display()))?;
    if let Some(named) = settings
        .protected
        .filter(|named| !named.matches(&genesis.ledger_id()))
    {
        bail!(
            "this host is a member of the protected ledger {} at {}, but --protected (FENCEPOST_PROTECTED or the config file) names {named}: nothing read or written",
            genesis.fingerprint(),
            settings.ledger_label()
        );
    }
    let device = fencepost::id::DeviceId::new(&settings.device)?;
    let key = fencepost::identity::load(&crate::settings::keys_dir()?, &device).with_context(|| {
        format!(
            "this host is a member of the protected ledger {} ({}), but device {device} has no key",
            settings.ledger_label(),
            genesis.fingerprint()
        )
    })?;
    let origin = if genesis.founder == device {
        fencepost::protected::Origin::Genesis(genesis.clone())
    } else {
        fencepost::protected::Origin::Identity(key.public())
    };
    Ok(Some(fencepost::ledger::Protected {
        ledger: genesis.ledger_id(),
        device_key: Arc::new(key),
        origin,
        keys: Vec::new(),
        members: Vec::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencepost::id::DeviceId;
    use fencepost::identity::DeviceKey;

    #[test]
    fn a_membership_file_reads_back_and_a_changed_one_is_refused() {
        let founder = DeviceKey::from_secrets(DeviceId::new("laptop").unwrap(), [1; 32], [2; 32]);
        let recovery = DeviceKey::from_secrets(DeviceId::new("recovery").unwrap(), [3; 32], [4; 32]);
        let genesis = Genesis {
            nonce: [5; 16],
            founder: founder.device().clone(),
            founder_key: founder.public(),
            recovery_key: recovery.public(),
        };
        let text = membership_file_text(&genesis);
        assert_eq!(read_membership_file(&text).unwrap(), genesis);
        let other = Genesis {
            nonce: [6; 16],
            ..genesis.clone()
        };
        let mixed = format!(
            "fingerprint {}\ngenesis {}\n",
            genesis.fingerprint(),
            URL_SAFE_NO_PAD.encode(other.to_bytes())
        );
        assert!(read_membership_file(&mixed).is_err());
        assert!(read_membership_file("fingerprint x\n").is_err());
        assert!(read_membership_file("").is_err());
    }
}
