//! A protected ledger's membership records (issue 39): content in the clear, in its author's
//! log, covered by the author's head (and, for the recovery key's changes, signed by it too).
//!
//! * [`Membership::Rotate`]: a generation of the ledger key, committed to and wrapped to every
//!   member and to the recovery key;
//! * [`Membership::Admit`]: a device, under the key of its log's record 0, with every
//!   generation in use wrapped to it;
//! * [`Membership::Revoke`]: a device cut from a sequence number on.
//!
//! Their bytes start with a tag that no record 0 uses (0 and 1 are a log's origin,
//! [`Origin`](crate::protected::Origin)).

use crate::core::identity::{LedgerId, PublicIdentity, Signature, SignatureContext};
use crate::core::roster::KeyId;
use crate::core::wrap::{Wrapped, WRAPPED_BYTES};
use crate::id::DeviceId;

/// A rotation without a key commitment, as fenceposts before it wrote: no longer read.
const TAG_UNCOMMITTED_ROTATE: u8 = 2;
const TAG_ADMIT: u8 = 3;
const TAG_REVOKE: u8 = 4;
const TAG_OPEN: u8 = 5;
const TAG_ROTATE: u8 = 6;
/// The most wraps one record carries (members of a rotation, generations of an admission).
pub const MAX_WRAPS: usize = 4096;

/// A membership change, as its record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a few per ledger: their size does not matter"
)]
pub enum Membership {
    /// Generation `generation` of the ledger key, wrapped to each device named (the recovery
    /// key under [`RECOVERY`]).
    Rotate {
        /// The generation.
        generation: u32,
        /// The key's [commitment](crate::seal::LedgerKey::commitment): a wrap that opens to
        /// another key gives nothing.
        commitment: [u8; 32],
        /// To whom, and the wrap.
        wraps: Vec<(DeviceId, Wrapped)>,
    },
    /// `device` is a member under the log whose record 0 has the id `key` (which names
    /// `identity`); every generation in use wrapped to it.
    Admit {
        /// The device.
        device: DeviceId,
        /// Its log's record 0.
        key: KeyId,
        /// Its public identity (what its record 0 holds).
        identity: PublicIdentity,
        /// Each generation, wrapped to it.
        wraps: Vec<(u32, Wrapped)>,
    },
    /// Generations of the ledger key given to `device` to open records only, never to seal
    /// with or give on: those that only a change which no longer counts made (a revoked
    /// device's rotation), with which members sealed records before the revocation. Written
    /// with an admission, so that a device admitted later reads those records too.
    Open {
        /// The device.
        device: DeviceId,
        /// Each generation, wrapped to it.
        wraps: Vec<(u32, Wrapped)>,
    },
    /// `device`'s records from `cut` on are void.
    Revoke {
        /// The device.
        device: DeviceId,
        /// The first sequence number voided.
        cut: u64,
    },
}

/// The device id wraps to the recovery key are made for.
pub const RECOVERY: &str = "recovery";

/// A membership record's content: the change, and the recovery key's signature when the
/// recovery key makes it (a change of the highest authority, whoever's log carries it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipRecord {
    /// The change.
    pub change: Membership,
    /// The recovery key's signature over the change, or `None` for a member's change.
    pub by_recovery: Option<Signature>,
}

impl MembershipRecord {
    /// Whether the recovery key `recovery` signed this change for `ledger`.
    pub fn signed_by_recovery(&self, recovery: &PublicIdentity, ledger: &LedgerId) -> bool {
        self.by_recovery.as_ref().is_some_and(|signature| {
            recovery.verify(
                SignatureContext::Membership,
                ledger,
                &self.change.to_bytes(),
                signature,
            )
        })
    }

    /// Its bytes: the change, then a 0 byte, or a 1 byte and the recovery key's signature.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = self.change.to_bytes();
        match &self.by_recovery {
            None => bytes.push(0),
            Some(signature) => {
                bytes.push(1);
                bytes.extend_from_slice(&signature.0);
            }
        }
        bytes
    }

    /// The record in `bytes`.
    ///
    /// # Errors
    /// A line saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let mut reader = Reader { bytes };
        let change = Membership::read(&mut reader)?;
        let by_recovery = match reader.array::<1>("the recovery mark")? {
            [0] => None,
            [1] => Some(Signature(reader.array("the recovery key's signature")?)),
            [other] => return Err(format!("recovery mark {other} is neither 0 nor 1")),
        };
        if !reader.bytes.is_empty() {
            return Err(format!("{} bytes follow the record", reader.bytes.len()));
        }
        Ok(Self { change, by_recovery })
    }
}

impl Membership {
    /// Its bytes (what the recovery key signs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(128);
        match self {
            Membership::Rotate {
                generation,
                commitment,
                wraps,
            } => {
                bytes.push(TAG_ROTATE);
                bytes.extend_from_slice(&generation.to_be_bytes());
                bytes.extend_from_slice(commitment);
                bytes.extend_from_slice(&(wraps.len() as u32).to_be_bytes());
                for (device, wrapped) in wraps {
                    push_text(device.as_str(), &mut bytes);
                    bytes.extend_from_slice(&wrapped.0);
                }
            }
            Membership::Admit {
                device,
                key,
                identity,
                wraps,
            } => {
                bytes.push(TAG_ADMIT);
                push_text(device.as_str(), &mut bytes);
                bytes.extend_from_slice(&key.0);
                bytes.extend_from_slice(&identity.signing_bytes());
                bytes.extend_from_slice(&identity.agreement_bytes());
                bytes.extend_from_slice(&(wraps.len() as u32).to_be_bytes());
                for (generation, wrapped) in wraps {
                    bytes.extend_from_slice(&generation.to_be_bytes());
                    bytes.extend_from_slice(&wrapped.0);
                }
            }
            Membership::Open { device, wraps } => {
                bytes.push(TAG_OPEN);
                push_text(device.as_str(), &mut bytes);
                bytes.extend_from_slice(&(wraps.len() as u32).to_be_bytes());
                for (generation, wrapped) in wraps {
                    bytes.extend_from_slice(&generation.to_be_bytes());
                    bytes.extend_from_slice(&wrapped.0);
                }
            }
            Membership::Revoke { device, cut } => {
                bytes.push(TAG_REVOKE);
                push_text(device.as_str(), &mut bytes);
                bytes.extend_from_slice(&cut.to_be_bytes());
            }
        }
        bytes
    }

    fn read(reader: &mut Reader<'_>) -> Result<Self, String> {
        let [tag] = reader.array("the tag")?;
        match tag {
            TAG_ROTATE => {
                let generation = u32::from_be_bytes(reader.array("the generation")?);
                let commitment = reader.array("the key's commitment")?;
                let count = reader.count()?;
                let mut wraps = Vec::with_capacity(count);
                for _ in 0..count {
                    let device = reader.device()?;
                    wraps.push((device, Wrapped(reader.array("a wrapped key")?)));
                }
                Ok(Membership::Rotate {
                    generation,
                    commitment,
                    wraps,
                })
            }
            TAG_UNCOMMITTED_ROTATE => Err(
                "a rotation without a commitment to its key, as fenceposts before 2026-12-07 wrote: not read (make the ledger again with this version)"
                    .to_owned(),
            ),
            TAG_ADMIT => {
                let device = reader.device()?;
                let key = KeyId(reader.array("the key")?);
                let signing = reader.array("the identity")?;
                let agreement = reader.array("the identity")?;
                let identity = PublicIdentity::from_bytes(signing, agreement)
                    .map_err(|error| format!("the identity is not a key pair: {error}"))?;
                let count = reader.count()?;
                let mut wraps = Vec::with_capacity(count);
                for _ in 0..count {
                    let generation = u32::from_be_bytes(reader.array("a generation")?);
                    wraps.push((generation, Wrapped(reader.array("a wrapped key")?)));
                }
                Ok(Membership::Admit {
                    device,
                    key,
                    identity,
                    wraps,
                })
            }
            TAG_OPEN => {
                let device = reader.device()?;
                let count = reader.count()?;
                let mut wraps = Vec::with_capacity(count);
                for _ in 0..count {
                    let generation = u32::from_be_bytes(reader.array("a generation")?);
                    wraps.push((generation, Wrapped(reader.array("a wrapped key")?)));
                }
                Ok(Membership::Open { device, wraps })
            }
            TAG_REVOKE => {
                let device = reader.device()?;
                let cut = u64::from_be_bytes(reader.array("the cut")?);
                Ok(Membership::Revoke { device, cut })
            }
            other => Err(format!("membership tag {other} is none of 3, 4, 5, 6")),
        }
    }
}

fn push_text(text: &str, out: &mut Vec<u8>) {
    // Device ids are at most 256 bytes (rule L8).
    out.extend_from_slice(&(text.len() as u16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        if self.bytes.len() < N {
            return Err(format!("it ends before {what}"));
        }
        let mut array = [0u8; N];
        array.copy_from_slice(&self.bytes[..N]);
        self.bytes = &self.bytes[N..];
        Ok(array)
    }

    fn count(&mut self) -> Result<usize, String> {
        let count = u32::from_be_bytes(self.array("a count")?) as usize;
        if count > MAX_WRAPS {
            return Err(format!("{count} wraps; a record holds at most {MAX_WRAPS}"));
        }
        if self.bytes.len() < count * WRAPPED_BYTES {
            return Err(format!("it ends before its {count} wraps"));
        }
        Ok(count)
    }

    fn device(&mut self) -> Result<DeviceId, String> {
        let length = usize::from(u16::from_be_bytes(self.array("a device id")?));
        if self.bytes.len() < length {
            return Err("it ends inside a device id".to_owned());
        }
        let (text, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        let text = std::str::from_utf8(text).map_err(|_| "a device id is not UTF-8".to_owned())?;
        DeviceId::new(text).map_err(|error| error.to_string())
    }
}
