//! A protected ledger's genesis and fingerprint (issue 39, under way: `ledger init` does not
//! write one yet; see `docs/proposals/protected-ledger.md`).
//!
//! The genesis names the founder (its device id and public identity) and the recovery key's
//! public identity, with 16 random bytes so that no two ledgers share one. Its SHA-256 is the
//! [`LedgerId`] every signature and every sealed record is bound to, and the first 160 bits of
//! that are the [`Fingerprint`] a joining device is given out of band: it never takes the
//! relay's word for which ledger it joins.
//!
//! ```
//! use fencepost::genesis::{Fingerprint, Genesis};
//! use fencepost::id::DeviceId;
//! use fencepost::identity::DeviceKey;
//!
//! let founder = DeviceKey::from_secrets(DeviceId::new("laptop")?, [1; 32], [2; 32]);
//! let recovery = DeviceKey::from_secrets(DeviceId::new("recovery")?, [3; 32], [4; 32]);
//! let genesis = Genesis {
//!     nonce: [5; 16],
//!     founder: founder.device().clone(),
//!     founder_key: founder.public(),
//!     recovery_key: recovery.public(),
//! };
//! let shown = genesis.fingerprint().to_string(); // "xxxx-xxxx-…", 10 groups of 4 hex digits
//! let typed: Fingerprint = shown.to_uppercase().replace('-', " ").parse()?;
//! assert!(typed.matches(&genesis.ledger_id()));
//! assert_eq!(Genesis::from_bytes(&genesis.to_bytes())?, genesis);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::core::identity::{LedgerId, PublicIdentity};
use crate::id::DeviceId;

/// What the genesis's bytes start with.
const DOMAIN: &[u8] = b"fencepost/genesis/v1\0";
/// The fingerprint's length in bytes (160 bits).
const FINGERPRINT_BYTES: usize = 20;

/// A protected ledger's first record: who founded it, and the recovery key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Genesis {
    /// Random bytes: no two ledgers have one genesis.
    pub nonce: [u8; 16],
    /// The founder's device id.
    pub founder: DeviceId,
    /// The founder's public identity.
    pub founder_key: PublicIdentity,
    /// The recovery key's public identity.
    pub recovery_key: PublicIdentity,
}

impl Genesis {
    /// Its canonical bytes: the domain, the nonce, the founder's id (length-prefixed) and
    /// keys, and the recovery key.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(DOMAIN.len() + 16 + 2 + self.founder.len() + 128);
        bytes.extend_from_slice(DOMAIN);
        bytes.extend_from_slice(&self.nonce);
        // A device id is at most 256 bytes (rule L8).
        bytes.extend_from_slice(&(self.founder.len() as u16).to_be_bytes());
        bytes.extend_from_slice(self.founder.as_bytes());
        for key in [&self.founder_key, &self.recovery_key] {
            bytes.extend_from_slice(&key.signing_bytes());
            bytes.extend_from_slice(&key.agreement_bytes());
        }
        bytes
    }

    /// Reads [`to_bytes`](Self::to_bytes)' form, as a relay hands it over.
    ///
    /// # Errors
    /// [`GenesisError`]: not that form, or a key or id that is not valid.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, GenesisError> {
        let mut rest = bytes.strip_prefix(DOMAIN).ok_or(GenesisError::Shape)?;
        let mut take = |length: usize| -> Result<&[u8], GenesisError> {
            if rest.len() < length {
                return Err(GenesisError::Shape);
            }
            let (taken, after) = rest.split_at(length);
            rest = after;
            Ok(taken)
        };
        let nonce = take(16)?.try_into().map_err(|_| GenesisError::Shape)?;
        let length = take(2)?;
        let length = usize::from(u16::from_be_bytes([length[0], length[1]]));
        let founder = std::str::from_utf8(take(length)?).map_err(|_| GenesisError::Shape)?;
        let founder = DeviceId::new(founder).map_err(|error| GenesisError::Founder(error.to_string()))?;
        let founder_key = public(take(64)?)?;
        let recovery_key = public(take(64)?)?;
        if !rest.is_empty() {
            return Err(GenesisError::Shape);
        }
        Ok(Self {
            nonce,
            founder,
            founder_key,
            recovery_key,
        })
    }

    /// The ledger's id: the SHA-256 of the genesis's bytes.
    pub fn ledger_id(&self) -> LedgerId {
        LedgerId(Sha256::digest(self.to_bytes()).into())
    }

    /// The ledger's fingerprint: the first 160 bits of its id.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.ledger_id())
    }
}

/// A public identity from its 64 bytes (signing key, agreement key).
fn public(bytes: &[u8]) -> Result<PublicIdentity, GenesisError> {
    let mut signing = [0u8; 32];
    let mut agreement = [0u8; 32];
    signing.copy_from_slice(&bytes[..32]);
    agreement.copy_from_slice(&bytes[32..64]);
    PublicIdentity::from_bytes(signing, agreement).map_err(|_| GenesisError::Key)
}

/// A genesis's bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GenesisError {
    /// Not the genesis's form (another format, truncated, or bytes after it).
    #[error("not a genesis of this format (truncated, or bytes after it)")]
    Shape,
    /// The founder's id breaks rule L8.
    #[error("the genesis's founder id is not valid: {0}")]
    Founder(String),
    /// A signing key is not a usable Ed25519 key.
    #[error("a key of the genesis is not a valid Ed25519 key")]
    Key,
}

/// A ledger's fingerprint: the first 160 bits of its [`LedgerId`], shown as 40 hex digits in
/// groups of 4 (`Display`), read back whatever the case, dashes and spaces (`FromStr`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; FINGERPRINT_BYTES]);

impl Fingerprint {
    /// The fingerprint of the ledger `ledger`.
    pub fn of(ledger: &LedgerId) -> Self {
        let mut bytes = [0u8; FINGERPRINT_BYTES];
        bytes.copy_from_slice(&ledger.0[..FINGERPRINT_BYTES]);
        Self(bytes)
    }

    /// Whether `ledger` is the ledger of this fingerprint.
    pub fn matches(&self, ledger: &LedgerId) -> bool {
        *self == Self::of(ledger)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = String::with_capacity(2 * FINGERPRINT_BYTES);
        crate::hex::push_lower_hex(&mut digits, &self.0);
        for (index, group) in digits.as_bytes().chunks(4).enumerate() {
            if index > 0 {
                formatter.write_str("-")?;
            }
            formatter.write_str(std::str::from_utf8(group).map_err(|_| fmt::Error)?)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Fingerprint({self})")
    }
}

/// A fingerprint's text was not 40 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("a ledger fingerprint is 40 hex digits (dashes and spaces between them do not matter), as `fencepost ledger fingerprint` prints it; got {0:?}")]
pub struct ParseFingerprintError(String);

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let digits: String = text
            .chars()
            .filter(|character| !matches!(character, '-' | ' '))
            .map(|character| character.to_ascii_lowercase())
            .collect();
        crate::hex::decode_lower_hex::<FINGERPRINT_BYTES>(&digits)
            .map(Self)
            .ok_or_else(|| ParseFingerprintError(text.chars().take(80).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::identity::DeviceKey;

    fn genesis(nonce: u8) -> Genesis {
        let key = |name: &str, seed: u8| {
            DeviceKey::from_secrets(DeviceId::new(name).unwrap(), [seed; 32], [seed; 32])
        };
        Genesis {
            nonce: [nonce; 16],
            founder: DeviceId::new("laptop").unwrap(),
            founder_key: key("laptop", 1).public(),
            recovery_key: key("recovery", 2).public(),
        }
    }

    #[test]
    fn a_genesis_reads_back_and_every_field_changes_the_ledger_id() {
        let original = genesis(7);
        assert_eq!(Genesis::from_bytes(&original.to_bytes()), Ok(original.clone()));
        let mut other_nonce = original.clone();
        other_nonce.nonce[15] ^= 1;
        let mut other_founder = original.clone();
        other_founder.founder = DeviceId::new("laptoq").unwrap();
        let mut swapped = original.clone();
        std::mem::swap(&mut swapped.founder_key, &mut swapped.recovery_key);
        for changed in [other_nonce, other_founder, swapped] {
            assert_ne!(changed.ledger_id(), original.ledger_id());
            assert!(!changed.fingerprint().matches(&original.ledger_id()));
        }
    }

    #[test]
    fn a_truncated_extended_or_altered_genesis_is_refused_without_a_panic() {
        let bytes = genesis(7).to_bytes();
        for length in 0..bytes.len() {
            assert!(
                Genesis::from_bytes(&bytes[..length]).is_err(),
                "{length} bytes were read"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Genesis::from_bytes(&longer), Err(GenesisError::Shape));
        let mut long_name = bytes.clone();
        let at = DOMAIN.len() + 16;
        long_name[at] = 0xff;
        assert!(Genesis::from_bytes(&long_name).is_err());
    }

    #[test]
    fn a_fingerprint_is_shown_in_groups_and_read_back_whatever_the_case_and_spacing() {
        let fingerprint = genesis(1).fingerprint();
        let shown = fingerprint.to_string();
        assert_eq!(shown.len(), 40 + 9);
        assert_eq!(shown.split('-').count(), 10);
        assert_eq!(shown.parse(), Ok(fingerprint));
        assert_eq!(shown.replace('-', "").to_uppercase().parse(), Ok(fingerprint));
        assert_eq!(shown.replace('-', " ").parse(), Ok(fingerprint));
        assert!(shown[..shown.len() - 1].parse::<Fingerprint>().is_err());
        assert!(format!("{shown}0").parse::<Fingerprint>().is_err());
        assert!("zz".parse::<Fingerprint>().is_err());
    }
}
