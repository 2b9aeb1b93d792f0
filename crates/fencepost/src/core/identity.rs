//! A device's identity (issue 39): a signing key pair (Ed25519) and a separate key-agreement key
//! (X25519, for wrapping a ledger's keys to the device), as values.
//!
//! [`DeviceKey`] is the secret half, [`PublicIdentity`] the public half, which
//! `fencepost device key` prints as one line ([`PublicIdentity`]'s `Display`, read back by its
//! `FromStr`): `fpdev1.` and the base64url of both public keys and a 4-byte checksum, so that a
//! line mangled in a copy is refused rather than read as another key. A signature is made for a
//! [`SignatureContext`] and a [`LedgerId`], which it covers with the message: none made for one
//! ledger or role verifies for another.
//!
//! The key file's text ([`DeviceKey::to_file_text`], [`DeviceKey::from_file_text`]) is decoded
//! here, without I/O; `fencepost::identity::load_or_create` keeps it in the data directory.
//!
//! ```
//! use fencepost::id::DeviceId;
//! use fencepost::identity::{DeviceKey, LedgerId, PublicIdentity, SignatureContext};
//!
//! let key = DeviceKey::from_secrets(DeviceId::new("laptop")?, [7; 32], [9; 32]);
//! let line = key.public().to_string();
//! let public: PublicIdentity = line.parse()?;
//! let ledger = LedgerId([1; 32]);
//! let signature = key.sign(SignatureContext::ChainHead, &ledger, b"head");
//! assert!(public.verify(SignatureContext::ChainHead, &ledger, b"head", &signature));
//! assert!(!public.verify(SignatureContext::Membership, &ledger, b"head", &signature));
//! assert!(!public.verify(SignatureContext::ChainHead, &LedgerId([2; 32]), b"head", &signature));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::id::DeviceId;

/// What the public line starts with (the format's version is its last character).
const PUBLIC_PREFIX: &str = "fpdev1.";
/// The bytes a public line encodes: both public keys and the checksum.
const PUBLIC_BYTES: usize = 32 + 32 + CHECKSUM_BYTES;
/// The checksum's length: the first bytes of a SHA-256 of the prefix and both keys.
const CHECKSUM_BYTES: usize = 4;
/// The key file's first line that is not a comment.
const FILE_FORMAT_LINE: &str = "format 1";
/// What the key file says above its fields.
const FILE_COMMENT: &str = "# fencepost device key: this device's identity. Keep it secret (mode 0600), never copy it to another host.";
/// What every signature's preimage starts with.
const SIGNATURE_DOMAIN: &[u8] = b"fencepost/signature/v1\0";

/// A ledger's identity, which every signature made for it covers: the SHA-256 of its genesis
/// (all 256 bits, so that nobody can found another ledger with the same id and replay a shared
/// device's records from one into the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LedgerId(pub [u8; 32]);

/// What a signature is for: a signature made for one context never verifies for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignatureContext {
    /// A device's chain head: covers every record of its log up to the head.
    ChainHead,
    /// A change of a ledger's members (an admission, a revocation).
    Membership,
    /// A checkpoint's digest.
    Checkpoint,
}

impl SignatureContext {
    fn tag(self) -> &'static [u8] {
        match self {
            SignatureContext::ChainHead => b"chain-head\0",
            SignatureContext::Membership => b"membership\0",
            SignatureContext::Checkpoint => b"checkpoint\0",
        }
    }
}

/// An Ed25519 signature made by [`DeviceKey::sign`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; 64]);

impl fmt::Debug for Signature {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Signature({})", URL_SAFE_NO_PAD.encode(self.0))
    }
}

/// What a signature covers: the domain, the context, the ledger and the message.
fn preimage(context: SignatureContext, ledger: &LedgerId, message: &[u8]) -> Vec<u8> {
    let tag = context.tag();
    let mut bytes = Vec::with_capacity(SIGNATURE_DOMAIN.len() + tag.len() + 32 + message.len());
    bytes.extend_from_slice(SIGNATURE_DOMAIN);
    bytes.extend_from_slice(tag);
    bytes.extend_from_slice(&ledger.0);
    bytes.extend_from_slice(message);
    bytes
}

/// A device's secret keys: Ed25519 for signing, X25519 for key agreement. Both are wiped from
/// memory when dropped.
pub struct DeviceKey {
    device: DeviceId,
    signing: SigningKey,
    agreement: x25519_dalek::StaticSecret,
}

impl fmt::Debug for DeviceKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("DeviceKey")
            .field("device", &self.device)
            .field("public", &self.public().to_string())
            .finish_non_exhaustive()
    }
}

impl DeviceKey {
    /// The keys of `device` made from two 32-byte secrets (the signing key's seed and the
    /// agreement key), which must be uniformly random and never reused.
    pub fn from_secrets(device: DeviceId, signing: [u8; 32], agreement: [u8; 32]) -> Self {
        let signing = Zeroizing::new(signing);
        let agreement = Zeroizing::new(agreement);
        Self {
            device,
            signing: SigningKey::from_bytes(&signing),
            agreement: x25519_dalek::StaticSecret::from(*agreement),
        }
    }

    /// The agreement key's secret bytes, for unwrapping a key wrapped to this device.
    pub(crate) fn agreement_secret(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.agreement.to_bytes())
    }

    /// The device these keys belong to.
    pub fn device(&self) -> &DeviceId {
        &self.device
    }

    /// The public half: what another device checks signatures with and wraps keys to.
    pub fn public(&self) -> PublicIdentity {
        PublicIdentity {
            signing: self.signing.verifying_key(),
            agreement: x25519_dalek::PublicKey::from(&self.agreement),
        }
    }

    /// Signs `message` for `context` in `ledger`.
    pub fn sign(&self, context: SignatureContext, ledger: &LedgerId, message: &[u8]) -> Signature {
        Signature(self.signing.sign(&preimage(context, ledger, message)).to_bytes())
    }

    /// The key file's text: a comment, the format, the device id and both secrets.
    pub fn to_file_text(&self) -> Zeroizing<String> {
        let signing = Zeroizing::new(URL_SAFE_NO_PAD.encode(self.signing.to_bytes()));
        let agreement = Zeroizing::new(URL_SAFE_NO_PAD.encode(self.agreement.to_bytes()));
        Zeroizing::new(format!(
            "{FILE_COMMENT}\n{FILE_FORMAT_LINE}\ndevice {}\nsigning {}\nagreement {}\n",
            self.device, *signing, *agreement
        ))
    }

    /// Reads [`to_file_text`](Self::to_file_text)'s form: every field once, nothing else but
    /// comments (`#`) and blank lines.
    ///
    /// # Errors
    /// [`KeyTextError`], naming the line and what is wrong with it.
    pub fn from_file_text(text: &str) -> Result<Self, KeyTextError> {
        let mut fields = KeyFields::default();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            fields.take(line).map_err(|detail| KeyTextError::Line {
                line: index + 1,
                detail,
            })?;
        }
        fields.finish()
    }
}

/// The fields of a key file as they are read.
#[derive(Default)]
struct KeyFields {
    format: bool,
    device: Option<DeviceId>,
    signing: Option<Zeroizing<[u8; 32]>>,
    agreement: Option<Zeroizing<[u8; 32]>>,
}

impl KeyFields {
    fn take(&mut self, line: &str) -> Result<(), String> {
        if !self.format {
            if line != FILE_FORMAT_LINE {
                return Err(format!(
                    "expected {FILE_FORMAT_LINE:?} (a key file of another format or not a key file)"
                ));
            }
            self.format = true;
            return Ok(());
        }
        let (name, value) = line.split_once(' ').unwrap_or((line, ""));
        let value = value.trim();
        match name {
            "device" if self.device.is_none() => {
                self.device = Some(DeviceId::new(value).map_err(|error| error.to_string())?);
            }
            "signing" if self.signing.is_none() => self.signing = Some(secret(value)?),
            "agreement" if self.agreement.is_none() => self.agreement = Some(secret(value)?),
            "device" | "signing" | "agreement" => return Err(format!("{name} is given twice")),
            _ => {
                return Err(format!(
                    "unknown field {:?}",
                    name.chars().take(40).collect::<String>()
                ))
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<DeviceKey, KeyTextError> {
        let missing = |field: &'static str| KeyTextError::Missing { field };
        if !self.format {
            return Err(missing("format"));
        }
        let device = self.device.ok_or(missing("device"))?;
        let signing = self.signing.ok_or(missing("signing"))?;
        let agreement = self.agreement.ok_or(missing("agreement"))?;
        Ok(DeviceKey::from_secrets(device, *signing, *agreement))
    }
}

/// A secret's text: 32 bytes in unpadded base64url.
fn secret(text: &str) -> Result<Zeroizing<[u8; 32]>, String> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    let mut decoded = Zeroizing::new([0u8; 48]);
    match URL_SAFE_NO_PAD.decode_slice(text, &mut *decoded) {
        Ok(32) => {
            bytes.copy_from_slice(&decoded[..32]);
            Ok(bytes)
        }
        _ => Err("a secret is 32 bytes in unpadded base64url (43 characters)".to_owned()),
    }
}

/// A key file's text could not be read as a device key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyTextError {
    /// A line is not what the format has there.
    #[error("line {line}: {detail}")]
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// A field is missing (the file is truncated, or not a key file).
    #[error("it has no {field} line (a truncated file, or not a key file)")]
    Missing {
        /// Which field.
        field: &'static str,
    },
}

/// A device's public identity: its Ed25519 verifying key and its X25519 public key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicIdentity {
    signing: VerifyingKey,
    agreement: x25519_dalek::PublicKey,
}

impl fmt::Debug for PublicIdentity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "PublicIdentity({self})")
    }
}

impl PublicIdentity {
    /// The Ed25519 verifying key's bytes.
    pub fn signing_bytes(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// The X25519 public key's bytes.
    pub fn agreement_bytes(&self) -> [u8; 32] {
        self.agreement.to_bytes()
    }

    /// Whether `signature` is this device's, over `message` for `context` in `ledger` (strict
    /// verification: no malleable or small-order forms).
    pub fn verify(
        &self,
        context: SignatureContext,
        ledger: &LedgerId,
        message: &[u8],
        signature: &Signature,
    ) -> bool {
        let signature = ed25519_dalek::Signature::from_bytes(&signature.0);
        self.signing
            .verify_strict(&preimage(context, ledger, message), &signature)
            .is_ok()
    }

    /// The identity of these two public keys' bytes (a genesis or a membership record holds
    /// them so).
    ///
    /// # Errors
    /// [`ParsePublicError::Signing`] when the signing key is not a usable Ed25519 key.
    pub fn from_bytes(signing: [u8; 32], agreement: [u8; 32]) -> Result<Self, ParsePublicError> {
        let signing = VerifyingKey::from_bytes(&signing).map_err(|_| ParsePublicError::Signing)?;
        if signing.is_weak() {
            return Err(ParsePublicError::Signing);
        }
        Ok(Self {
            signing,
            agreement: x25519_dalek::PublicKey::from(agreement),
        })
    }

    fn checksum(signing: &[u8; 32], agreement: &[u8; 32]) -> [u8; CHECKSUM_BYTES] {
        let mut hasher = Sha256::new();
        hasher.update(PUBLIC_PREFIX.as_bytes());
        hasher.update(signing);
        hasher.update(agreement);
        let digest = hasher.finalize();
        let mut checksum = [0u8; CHECKSUM_BYTES];
        checksum.copy_from_slice(&digest[..CHECKSUM_BYTES]);
        checksum
    }
}

impl fmt::Display for PublicIdentity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let signing = self.signing_bytes();
        let agreement = self.agreement_bytes();
        let mut bytes = [0u8; PUBLIC_BYTES];
        bytes[..32].copy_from_slice(&signing);
        bytes[32..64].copy_from_slice(&agreement);
        bytes[64..].copy_from_slice(&Self::checksum(&signing, &agreement));
        write!(formatter, "{PUBLIC_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }
}

/// A public identity's line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParsePublicError {
    /// It is not a line `fencepost device key` prints.
    #[error(
        "a device key is the line `fencepost device key` prints ({PUBLIC_PREFIX}…, 98 characters); got {0:?}"
    )]
    Shape(String),
    /// The checksum does not match: a character was changed in the copy.
    #[error("the device key's checksum does not match: the line was changed in the copy (copy it again)")]
    Checksum,
    /// The signing key is not a usable Ed25519 key.
    #[error("the device key's signing key is not a valid Ed25519 key")]
    Signing,
}

impl FromStr for PublicIdentity {
    type Err = ParsePublicError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let shape = || ParsePublicError::Shape(text.chars().take(120).collect());
        let body = text.strip_prefix(PUBLIC_PREFIX).ok_or_else(shape)?;
        let mut bytes = [0u8; PUBLIC_BYTES + 3];
        let length = URL_SAFE_NO_PAD
            .decode_slice(body, &mut bytes)
            .map_err(|_| shape())?;
        if length != PUBLIC_BYTES {
            return Err(shape());
        }
        let mut signing = [0u8; 32];
        let mut agreement = [0u8; 32];
        signing.copy_from_slice(&bytes[..32]);
        agreement.copy_from_slice(&bytes[32..64]);
        if bytes[64..PUBLIC_BYTES] != Self::checksum(&signing, &agreement) {
            return Err(ParsePublicError::Checksum);
        }
        Self::from_bytes(signing, agreement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(device: &str, seed: u8) -> DeviceKey {
        DeviceKey::from_secrets(
            DeviceId::new(device).unwrap(),
            [seed; 32],
            [seed.wrapping_add(1); 32],
        )
    }

    #[test]
    fn the_public_line_reads_back_and_a_changed_character_is_refused() {
        let public = key("laptop", 3).public();
        let line = public.to_string();
        assert!(line.starts_with(PUBLIC_PREFIX));
        assert_eq!(line.len(), PUBLIC_PREFIX.len() + 91);
        assert_eq!(line.parse::<PublicIdentity>(), Ok(public));
        for position in PUBLIC_PREFIX.len()..line.len() {
            let mut changed = line.clone().into_bytes();
            changed[position] = if changed[position] == b'A' { b'B' } else { b'A' };
            let changed = String::from_utf8(changed).unwrap();
            assert!(
                changed.parse::<PublicIdentity>().is_err(),
                "a change at {position} was accepted"
            );
        }
        assert!(matches!(
            "fpdev1.short".parse::<PublicIdentity>(),
            Err(ParsePublicError::Shape(_))
        ));
        assert!(matches!(
            line[1..].parse::<PublicIdentity>(),
            Err(ParsePublicError::Shape(_))
        ));
    }

    #[test]
    fn the_key_file_text_reads_back_as_the_same_keys() {
        let original = key("host A", 5);
        let text = original.to_file_text();
        let read = DeviceKey::from_file_text(&text).unwrap();
        assert_eq!(read.device(), original.device());
        assert_eq!(read.public(), original.public());
    }

    #[test]
    fn a_truncated_or_altered_key_file_is_refused_with_its_line() {
        let text = key("laptop", 5).to_file_text();
        let lines: Vec<&str> = text.lines().collect();
        for keep in 0..lines.len() {
            let truncated = lines[..keep].join("\n");
            assert!(
                DeviceKey::from_file_text(&truncated).is_err(),
                "{keep} lines were accepted"
            );
        }
        let doubled = format!("{}\ndevice other\n", text.as_str());
        assert_eq!(
            DeviceKey::from_file_text(&doubled).unwrap_err(),
            KeyTextError::Line {
                line: 7,
                detail: "device is given twice".to_owned()
            }
        );
        let short_secret = text.replace("signing ", "signing A");
        assert!(matches!(
            DeviceKey::from_file_text(&short_secret),
            Err(KeyTextError::Line { line: 4, .. })
        ));
        assert!(DeviceKey::from_file_text("format 2\n").is_err());
        assert!(DeviceKey::from_file_text("\u{0}\u{ff}garbage").is_err());
    }

    #[test]
    fn a_signature_covers_its_context_its_ledger_and_its_message() {
        let signer = key("laptop", 5);
        let other = key("phone", 6);
        let ledger = LedgerId([4; 32]);
        let signature = signer.sign(SignatureContext::Membership, &ledger, b"admit phone");
        let public = signer.public();
        assert!(public.verify(SignatureContext::Membership, &ledger, b"admit phone", &signature));
        assert!(!public.verify(SignatureContext::Membership, &ledger, b"admit phonE", &signature));
        assert!(!public.verify(SignatureContext::Checkpoint, &ledger, b"admit phone", &signature));
        assert!(!public.verify(
            SignatureContext::Membership,
            &LedgerId([5; 32]),
            b"admit phone",
            &signature
        ));
        assert!(!other
            .public()
            .verify(SignatureContext::Membership, &ledger, b"admit phone", &signature));
    }
}
