//! A record's sealed form for a protected ledger (issue 39): its content encrypted with a
//! ledger key (XChaCha20-Poly1305, a random 24-byte nonce per record), padded, and bound to its
//! place (ledger, device, sequence number) as associated data. The record that carries it
//! ([`OpRecord::sealed`](crate::oplog::OpRecord::sealed)) has an id computed over the
//! ciphertext, so that no id the relay sees lets it confirm a guess of the content.
//!
//! The core seals with a nonce it is given ([`LedgerKey::seal_with_nonce`]); `LedgerKey::seal`
//! (`edge/sealing.rs`) draws a fresh one from the operating system.
//!
//! ```
//! use std::num::NonZeroU32;
//! use fencepost::identity::LedgerId;
//! use fencepost::oplog::{OpRecord, SealedContent};
//! use fencepost::seal::{LedgerKey, Place};
//!
//! let key = LedgerKey::new(NonZeroU32::MIN, [7; 32]);
//! let place = Place { ledger: LedgerId([1; 32]), device: "laptop", seq: 0 };
//! let sealed = key.seal(&place, b"pending run-1 at epoch 4")?; // a fresh random nonce
//! assert_eq!(sealed.ciphertext.len() % 32, 16); // padded, and the tag
//! assert_eq!(&*key.open(&sealed, &place)?, b"pending run-1 at epoch 4");
//! let moved = Place { seq: 1, ..place };
//! assert!(key.open(&sealed, &moved).is_err()); // bound to its place
//! let again = key.seal(&place, b"pending run-1 at epoch 4")?;
//! let record = |sealed| OpRecord::sealed("laptop".into(), 0, None, SealedContent::Sealed(sealed));
//! assert_ne!(record(sealed).op_id, record(again).op_id); // ids over the ciphertext
//! # Ok::<(), fencepost::seal::SealError>(())
//! ```

use std::num::NonZeroU32;

use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::core::identity::LedgerId;

/// Content is padded to a multiple of this many bytes (its length prefix included), so that
/// records of similar content are the same size.
pub const PAD_BYTES: usize = 32;
/// The tag's length: the ciphertext is this much longer than the padded content.
pub const TAG_BYTES: usize = 16;
/// A nonce's length (XChaCha20's, drawn at random for each record).
pub const NONCE_BYTES: usize = 24;
/// The longest content a record seals.
pub const MAX_SEALED_CONTENT_BYTES: usize = u16::MAX as usize - 2;
/// What the associated data starts with.
const AAD_DOMAIN: &[u8] = b"fencepost/sealed-record/aad/v1\0";
/// What a key's commitment ([`LedgerKey::commitment`]) starts with.
const COMMITMENT_DOMAIN: &[u8] = b"fencepost/ledger-key-commitment/v1\0";

/// Where a sealed record sits: the associated data of its encryption, so that a ciphertext
/// moved to another ledger, device or sequence number does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place<'a> {
    /// The ledger.
    pub ledger: LedgerId,
    /// The device whose log holds it.
    pub device: &'a str,
    /// Its sequence number there.
    pub seq: u64,
}

impl Place<'_> {
    fn write(&self, out: &mut Vec<u8>, domain: &[u8], generation: u32) {
        out.extend_from_slice(domain);
        out.extend_from_slice(&self.ledger.0);
        out.extend_from_slice(&(self.device.len() as u64).to_be_bytes());
        out.extend_from_slice(self.device.as_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&generation.to_be_bytes());
    }
}

/// A record's content, sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Which generation of the ledger key sealed it.
    pub generation: u32,
    /// Its nonce.
    pub nonce: [u8; NONCE_BYTES],
    /// The padded content encrypted, then the tag.
    pub ciphertext: Vec<u8>,
}

/// One generation of a ledger's content key. Wiped from memory when dropped.
#[derive(Clone)]
pub struct LedgerKey {
    generation: u32,
    cipher: XChaCha20Poly1305,
    /// The key's bytes, to wrap it to a member.
    bytes: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for LedgerKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LedgerKey")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl LedgerKey {
    /// Generation `generation` of a ledger key, from 32 uniformly random bytes. Generation 0
    /// is none: a record of generation 0 is in the clear
    /// ([`CLEAR_GENERATION`](crate::oplog::CLEAR_GENERATION)).
    pub fn new(generation: NonZeroU32, key: [u8; 32]) -> Self {
        let key = Zeroizing::new(key);
        Self {
            generation: generation.get(),
            cipher: XChaCha20Poly1305::new(&Key::from(*key)),
            bytes: key,
        }
    }

    /// Its generation.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Its bytes, to wrap it to a member ([`wrap`](crate::wrap::wrap)).
    pub fn bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// Its commitment in `ledger`: a SHA-256 of a domain, the ledger, the generation and the
    /// key. A rotation names it beside its wraps, and a member holds a key it unwraps only
    /// when a rotation it read committed to it, so that every member that holds a generation
    /// of one rotation holds the same key (a writer cannot wrap one key to some members and
    /// another to others).
    pub fn commitment(&self, ledger: &LedgerId) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(COMMITMENT_DOMAIN);
        hasher.update(ledger.0);
        hasher.update(self.generation.to_be_bytes());
        // From where the key is kept (wiped when dropped), not a copy on the stack.
        hasher.update(&self.bytes[..]);
        hasher.finalize().into()
    }

    /// Seals `content` (at most [`MAX_SEALED_CONTENT_BYTES`]) at `place` with `nonce`, which
    /// must be uniformly random and never used again with this key: `LedgerKey::seal` draws
    /// one.
    ///
    /// # Errors
    /// [`SealError::TooLong`]; [`SealError::Encrypt`] if the cipher refuses (it never does at
    /// these lengths; no plaintext is ever returned in its place).
    pub fn seal_with_nonce(
        &self,
        nonce: [u8; NONCE_BYTES],
        place: &Place<'_>,
        content: &[u8],
    ) -> Result<Sealed, SealError> {
        if content.len() > MAX_SEALED_CONTENT_BYTES {
            return Err(SealError::TooLong {
                length_bytes: content.len(),
            });
        }
        let framed = 2 + content.len();
        let padded = framed.div_ceil(PAD_BYTES) * PAD_BYTES;
        let mut buffer = Vec::with_capacity(padded + TAG_BYTES);
        let length = u16::try_from(content.len()).map_err(|_| SealError::TooLong {
            length_bytes: content.len(),
        })?;
        buffer.extend_from_slice(&length.to_be_bytes());
        buffer.extend_from_slice(content);
        buffer.resize(padded, 0);
        let mut associated = Vec::with_capacity(96);
        place.write(&mut associated, AAD_DOMAIN, self.generation);
        let tag = self
            .cipher
            .encrypt_inout_detached(&XNonce::from(nonce), &associated, buffer.as_mut_slice().into())
            .map_err(|_| SealError::Encrypt)?;
        buffer.extend_from_slice(&tag);
        Ok(Sealed {
            generation: self.generation,
            nonce,
            ciphertext: buffer,
        })
    }

    /// The content of `sealed`, which must have been sealed at `place` with this key.
    ///
    /// # Errors
    /// [`SealError`]: another generation, not authentic (altered, moved, another key), or
    /// padding that no sealer makes.
    pub fn open(&self, sealed: &Sealed, place: &Place<'_>) -> Result<Zeroizing<Vec<u8>>, SealError> {
        if sealed.generation != self.generation {
            return Err(SealError::Generation {
                sealed: sealed.generation,
                key: self.generation,
            });
        }
        let Some(body_bytes) = sealed.ciphertext.len().checked_sub(TAG_BYTES) else {
            return Err(SealError::NotAuthentic);
        };
        let (body, tag) = sealed.ciphertext.split_at(body_bytes);
        let mut buffer = Zeroizing::new(body.to_vec());
        let mut associated = Vec::with_capacity(96);
        place.write(&mut associated, AAD_DOMAIN, self.generation);
        let tag = Tag::try_from(tag).map_err(|_| SealError::NotAuthentic)?;
        self.cipher
            .decrypt_inout_detached(
                &XNonce::from(sealed.nonce),
                &associated,
                buffer.as_mut_slice().into(),
                &tag,
            )
            .map_err(|_| SealError::NotAuthentic)?;
        unpad(buffer)
    }
}

/// The content of a decrypted, padded buffer.
fn unpad(mut buffer: Zeroizing<Vec<u8>>) -> Result<Zeroizing<Vec<u8>>, SealError> {
    if buffer.len() < 2 || !buffer.len().is_multiple_of(PAD_BYTES) {
        return Err(SealError::Padding);
    }
    let length = usize::from(u16::from_be_bytes([buffer[0], buffer[1]]));
    let framed = 2 + length;
    if framed > buffer.len()
        || buffer.len() - framed >= PAD_BYTES
        || buffer[framed..].iter().any(|byte| *byte != 0)
    {
        return Err(SealError::Padding);
    }
    buffer.truncate(framed);
    buffer.drain(..2);
    Ok(buffer)
}

/// A sealed record could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SealError {
    /// It was sealed with another generation of the key.
    #[error("sealed with generation {sealed} of the ledger key; this key is generation {key}")]
    Generation {
        /// Its generation.
        sealed: u32,
        /// The key's.
        key: u32,
    },
    /// Not sealed at this place with this key, or altered since.
    #[error("not authentic: altered, moved from another place, or sealed with another key")]
    NotAuthentic,
    /// Authentic, but padded as no sealer pads.
    #[error("padded as no sealer pads")]
    Padding,
    /// The content is longer than [`MAX_SEALED_CONTENT_BYTES`]: no record holds so much.
    #[error("{length_bytes} bytes of content; a sealed record holds at most {MAX_SEALED_CONTENT_BYTES}")]
    TooLong {
        /// Its length.
        length_bytes: usize,
    },
    /// The cipher refused to encrypt.
    #[error("the cipher refused to encrypt")]
    Encrypt,
    /// No random nonce could be drawn from the operating system.
    #[error("cannot draw a random nonce: {0}")]
    Random(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(number: u32) -> NonZeroU32 {
        NonZeroU32::new(number).unwrap()
    }

    fn place(seq: u64) -> Place<'static> {
        Place {
            ledger: LedgerId([9; 32]),
            device: "laptop",
            seq,
        }
    }

    #[test]
    fn sealed_content_opens_at_its_place_only_and_sizes_are_padded() {
        let key = LedgerKey::new(generation(2), [1; 32]);
        for length in [0usize, 1, 29, 30, 31, 62, 63, 200] {
            let content: Vec<u8> = (0..length).map(|byte| byte as u8).collect();
            let sealed = key
                .seal_with_nonce([length as u8; 24], &place(5), &content)
                .unwrap();
            assert_eq!(
                sealed.ciphertext.len(),
                (2 + length).div_ceil(PAD_BYTES) * PAD_BYTES + TAG_BYTES
            );
            assert_eq!(&*key.open(&sealed, &place(5)).unwrap(), &content);
            assert_eq!(key.open(&sealed, &place(6)), Err(SealError::NotAuthentic));
            let elsewhere = Place {
                device: "phone",
                ..place(5)
            };
            assert_eq!(key.open(&sealed, &elsewhere), Err(SealError::NotAuthentic));
            let other_ledger = Place {
                ledger: LedgerId([8; 32]),
                ..place(5)
            };
            assert_eq!(key.open(&sealed, &other_ledger), Err(SealError::NotAuthentic));
            assert_eq!(
                LedgerKey::new(generation(2), [2; 32]).open(&sealed, &place(5)),
                Err(SealError::NotAuthentic)
            );
            assert!(matches!(
                LedgerKey::new(generation(3), [1; 32]).open(&sealed, &place(5)),
                Err(SealError::Generation { .. })
            ));
        }
    }

    #[test]
    fn every_altered_byte_is_refused_and_short_input_never_panics() {
        let key = LedgerKey::new(generation(1), [1; 32]);
        let sealed = key
            .seal_with_nonce([4; 24], &place(0), b"committed run-1")
            .unwrap();
        for at in 0..sealed.ciphertext.len() {
            let mut altered = sealed.clone();
            altered.ciphertext[at] ^= 1;
            assert_eq!(
                key.open(&altered, &place(0)),
                Err(SealError::NotAuthentic),
                "byte {at}"
            );
        }
        let mut other_nonce = sealed.clone();
        other_nonce.nonce[0] ^= 1;
        assert_eq!(key.open(&other_nonce, &place(0)), Err(SealError::NotAuthentic));
        let too_long = vec![0; MAX_SEALED_CONTENT_BYTES + 1];
        assert_eq!(
            key.seal_with_nonce([4; 24], &place(0), &too_long),
            Err(SealError::TooLong {
                length_bytes: MAX_SEALED_CONTENT_BYTES + 1
            })
        );
        for length in 0..TAG_BYTES + 2 {
            let short = Sealed {
                ciphertext: vec![0; length],
                ..sealed.clone()
            };
            assert!(key.open(&short, &place(0)).is_err());
        }
    }
}
