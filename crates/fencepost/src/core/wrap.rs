//! A ledger key wrapped to one member (issue 39): HPKE (RFC 9180) in base mode with
//! DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and ChaCha20-Poly1305, to the member's X25519 key,
//! with `info` binding the ledger, the generation and the recipient's device id, so that a
//! wrapped key moved to another ledger, generation or member does not open.
//!
//! The core wraps with randomness it is given ([`wrap_with_seed`]: the 32 bytes of the
//! ephemeral key); `wrap` (`edge/sealing.rs`) draws them from the operating system.
//!
//! ```
//! use fencepost::id::DeviceId;
//! use fencepost::identity::{DeviceKey, LedgerId};
//! use fencepost::wrap::{unwrap, wrap_with_seed};
//!
//! let phone = DeviceKey::from_secrets(DeviceId::new("phone")?, [1; 32], [2; 32]);
//! let ledger = LedgerId([7; 32]);
//! let wrapped = wrap_with_seed(&[9; 32], &ledger, 1, phone.device(), &phone.public(), [4; 32])?;
//! assert_eq!(*unwrap(&wrapped, &ledger, 1, &phone)?, [9; 32]);
//! assert!(unwrap(&wrapped, &ledger, 2, &phone).is_err()); // bound to its generation
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::core::identity::{DeviceKey, LedgerId, PublicIdentity};
use crate::id::DeviceId;

/// What `info` starts with.
const INFO_DOMAIN: &[u8] = b"fencepost/wrapped-ledger-key/v1\0";
/// A wrapped key's length: the encapsulated key (32), the key (32) and the tag (16).
pub const WRAPPED_BYTES: usize = 32 + 32 + 16;

/// A ledger key wrapped to one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped(pub [u8; WRAPPED_BYTES]);

/// A key could not be wrapped or unwrapped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WrapError {
    /// The recipient's key is one no wrap can be made to (a low-order point).
    #[error("cannot wrap a key to this device: its agreement key is not a usable X25519 key")]
    Recipient,
    /// Not wrapped to this device for this ledger and generation, or altered.
    #[error("not a key wrapped to this device for this ledger and generation, or altered")]
    NotForThisDevice,
    /// No random bytes could be drawn from the operating system.
    #[error("cannot draw random bytes: {0}")]
    Random(String),
}

fn info(ledger: &LedgerId, generation: u32, recipient: &DeviceId) -> Vec<u8> {
    let mut info = Vec::with_capacity(INFO_DOMAIN.len() + 44 + recipient.as_str().len());
    info.extend_from_slice(INFO_DOMAIN);
    info.extend_from_slice(&ledger.0);
    info.extend_from_slice(&generation.to_be_bytes());
    info.extend_from_slice(&(recipient.as_str().len() as u64).to_be_bytes());
    info.extend_from_slice(recipient.as_str().as_bytes());
    info
}

/// The randomness of one wrap, given: the 32 bytes of the ephemeral key, served once.
struct Seed {
    bytes: Zeroizing<[u8; 32]>,
    served: usize,
}

impl rand_core::TryRng for Seed {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut bytes = [0u8; 4];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut bytes = [0u8; 8];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, out: &mut [u8]) -> Result<(), Self::Error> {
        // The X25519 KEM asks for exactly one private key's worth; anything more would repeat
        // bytes, which the test of this module rules out.
        for byte in out {
            *byte = self.bytes[self.served % 32];
            self.served += 1;
        }
        Ok(())
    }
}

impl rand_core::TryCryptoRng for Seed {}

/// `key` wrapped for `recipient` (device id and public identity) in `ledger` at `generation`,
/// with `seed` (32 uniformly random bytes, never used again) as the ephemeral key.
///
/// # Errors
/// [`WrapError::Recipient`] when the recipient's agreement key is not usable.
pub fn wrap_with_seed(
    key: &[u8; 32],
    ledger: &LedgerId,
    generation: u32,
    recipient: &DeviceId,
    public: &PublicIdentity,
    seed: [u8; 32],
) -> Result<Wrapped, WrapError> {
    let (wrapped, served) = wrap_counting(key, ledger, generation, recipient, public, seed)?;
    debug_assert_eq!(
        served, 32,
        "the X25519 KEM takes one private key's worth of randomness"
    );
    Ok(wrapped)
}

fn wrap_counting(
    key: &[u8; 32],
    ledger: &LedgerId,
    generation: u32,
    recipient: &DeviceId,
    public: &PublicIdentity,
    seed: [u8; 32],
) -> Result<(Wrapped, usize), WrapError> {
    let recipient_key = <X25519HkdfSha256 as Kem>::PublicKey::from_bytes(&public.agreement_bytes())
        .map_err(|_| WrapError::Recipient)?;
    let mut rng = Seed {
        bytes: Zeroizing::new(seed),
        served: 0,
    };
    let (encapped, ciphertext) =
        hpke::single_shot_seal_with_rng::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
            &OpModeS::Base,
            &recipient_key,
            &info(ledger, generation, recipient),
            key,
            &[],
            &mut rng,
        )
        .map_err(|_| WrapError::Recipient)?;
    let mut wrapped = [0u8; WRAPPED_BYTES];
    let encapped = encapped.to_bytes();
    if encapped.len() + ciphertext.len() != WRAPPED_BYTES {
        return Err(WrapError::Recipient);
    }
    wrapped[..32].copy_from_slice(&encapped);
    wrapped[32..].copy_from_slice(&ciphertext);
    Ok((Wrapped(wrapped), rng.served))
}

/// The key `wrapped` holds for `device` (whose keys these are) in `ledger` at `generation`.
///
/// # Errors
/// [`WrapError::NotForThisDevice`]: wrapped to another device, ledger or generation, or altered.
pub fn unwrap(
    wrapped: &Wrapped,
    ledger: &LedgerId,
    generation: u32,
    device: &DeviceKey,
) -> Result<Zeroizing<[u8; 32]>, WrapError> {
    let secret = device.agreement_secret();
    let private = <X25519HkdfSha256 as Kem>::PrivateKey::from_bytes(&*secret)
        .map_err(|_| WrapError::NotForThisDevice)?;
    let encapped = <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(&wrapped.0[..32])
        .map_err(|_| WrapError::NotForThisDevice)?;
    let opened = Zeroizing::new(
        hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &private,
            &encapped,
            &info(ledger, generation, device.device()),
            &wrapped.0[32..],
            &[],
        )
        .map_err(|_| WrapError::NotForThisDevice)?,
    );
    let key: [u8; 32] = opened
        .as_slice()
        .try_into()
        .map_err(|_| WrapError::NotForThisDevice)?;
    Ok(Zeroizing::new(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, secret: u8) -> DeviceKey {
        DeviceKey::from_secrets(DeviceId::new(name).unwrap(), [secret; 32], [secret + 1; 32])
    }

    #[test]
    fn a_wrap_opens_for_its_recipient_ledger_and_generation_only_and_takes_32_random_bytes() {
        let phone = device("phone", 1);
        let ledger = LedgerId([7; 32]);
        let (wrapped, served) =
            wrap_counting(&[9; 32], &ledger, 3, phone.device(), &phone.public(), [5; 32]).unwrap();
        assert_eq!(served, 32);
        assert_eq!(*unwrap(&wrapped, &ledger, 3, &phone).unwrap(), [9; 32]);
        assert!(unwrap(&wrapped, &LedgerId([8; 32]), 3, &phone).is_err());
        assert!(unwrap(&wrapped, &ledger, 4, &phone).is_err());
        assert!(
            unwrap(&wrapped, &ledger, 3, &device("laptop", 1)).is_err(),
            "another device id"
        );
        assert!(
            unwrap(&wrapped, &ledger, 3, &device("phone", 3)).is_err(),
            "another key"
        );
        for at in 0..WRAPPED_BYTES {
            let mut altered = wrapped.clone();
            altered.0[at] ^= 1;
            assert!(unwrap(&altered, &ledger, 3, &phone).is_err(), "byte {at}");
        }
    }

    #[test]
    fn a_low_order_agreement_key_is_refused() {
        let zero = PublicIdentity::from_bytes(device("phone", 1).public().signing_bytes(), [0; 32]).unwrap();
        let phone = DeviceId::new("phone").unwrap();
        assert_eq!(
            wrap_with_seed(&[9; 32], &LedgerId([7; 32]), 1, &phone, &zero, [5; 32]),
            Err(WrapError::Recipient)
        );
    }
}
