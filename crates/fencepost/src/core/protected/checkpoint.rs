//! A protected ledger's checkpoint as the shared place holds it (issue 39): sealed, signed, and
//! named by the digest of its bytes.
//!
//! The bytes are a header line in the clear (JSON: the ledger, the writer and its log's record
//! 0, the generation of the ledger key, the records covered and every device's head there, the
//! record 0s and membership records with their proofs, the nonce), then the checkpoint's file
//! encrypted in chunks with that generation (XChaCha20-Poly1305 in the STREAM construction,
//! each chunk bound to the header's digest), then the writer's signature (its own context and
//! the ledger's id) over the digest of the header and the ciphertext. A reader builds the
//! roster from the header's changes, each checked against its author's key
//! (`ProtectedMark::check_proofs`), so it takes nobody's word for who is a member; it opens a
//! checkpoint only when the writer was a member where the checkpoint ends its log, and when it
//! holds the generation.
//!
//! Nothing in the header names an agent, a run or an epoch: the same device ids, counts, ids
//! over ciphertext and membership records lie in the clear in the ledger itself.

use std::io::{BufRead, Read, Write};

use aead_stream::{DecryptorBE32, EncryptorBE32};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chacha20poly1305::aead::KeyInit;
use chacha20poly1305::XChaCha20Poly1305;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::ProtectedMark;
use crate::core::identity::{DeviceKey, LedgerId, PublicIdentity, Signature, SignatureContext};
use crate::core::seal::LedgerKey;
use crate::oplog::OpId;

/// The format a sealed checkpoint's header names.
pub const SEALED_CHECKPOINT_FORMAT: &str = "fencepost-sealed-checkpoint/1";

/// Plaintext bytes per chunk.
const CHUNK_BYTES: usize = 64 * 1024;
/// The tag each chunk carries.
const TAG_BYTES: usize = 16;
/// Bytes of the random nonce (XChaCha's 24 less STREAM's counter and last-chunk flag).
pub const STREAM_NONCE_BYTES: usize = 19;
/// The longest header read (its proofs grow with the membership records, a few per change).
const MAX_HEADER_BYTES: u64 = 16 * 1024 * 1024;
/// What each chunk's associated data begins with.
const CHUNK_DOMAIN: &[u8] = b"fencepost sealed checkpoint chunk\0";

/// A sealed checkpoint's header, in the clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedHeader {
    /// [`SEALED_CHECKPOINT_FORMAT`].
    pub format: String,
    /// The ledger's id, in hex.
    pub ledger: String,
    /// The device that wrote it.
    pub writer: String,
    /// The id of the writer's log's record 0 (its key).
    pub writer_origin: OpId,
    /// The generation of the ledger key it is sealed with.
    pub generation: u32,
    /// How many records it covers.
    pub records: u64,
    /// The cut-off of the committed runs it leaves out, if any (its name says it too).
    pub forgets_before_ms: Option<u64>,
    /// Per device: how many records it covers and the id of the last one.
    pub heads: Vec<(String, u64, OpId)>,
    /// Every log's record 0 and every membership record read, with their proofs.
    pub roster: ProtectedMark,
    /// The length of the checkpoint's file.
    pub plain_bytes: u64,
    /// The STREAM nonce, unpadded base64url.
    pub nonce: String,
}

impl SealedHeader {
    /// How many records of the writer's log it covers (where its membership is judged).
    pub fn writer_count(&self) -> u64 {
        self.heads
            .iter()
            .find(|(device, _, _)| *device == self.writer)
            .map_or(0, |(_, count, _)| *count)
    }
}

/// The digest a sealed checkpoint's name carries: SHA-256 over all of its bytes.
pub type BlobDigest = [u8; 32];

/// Writes `header` (its nonce set here from `nonce`, which must be uniformly random), then
/// `plain` (exactly `header.plain_bytes` bytes) sealed with `key`, then `writer`'s signature,
/// into `out`. Returns the digest of all that was written.
///
/// # Errors
/// A line saying what failed: reading `plain`, writing `out`, a key of another generation.
pub fn seal_checkpoint(
    mut header: SealedHeader,
    nonce: [u8; STREAM_NONCE_BYTES],
    key: &LedgerKey,
    writer: &DeviceKey,
    ledger: &LedgerId,
    plain: &mut dyn Read,
    out: &mut dyn Write,
) -> Result<BlobDigest, String> {
    if key.generation() != header.generation {
        return Err(format!(
            "the key is of generation {}, the header names {}",
            key.generation(),
            header.generation
        ));
    }
    header.nonce = URL_SAFE_NO_PAD.encode(nonce);
    let mut line = serde_json::to_vec(&header).map_err(|error| error.to_string())?;
    line.push(b'\n');
    let associated = associated_data(&line);
    let mut put = Written {
        signed: Sha256::new(),
        out,
    };
    put.add(&line)?;
    let cipher = XChaCha20Poly1305::new(key.bytes().into());
    let mut encryptor = EncryptorBE32::from_aead(cipher, (&nonce).into());
    let mut left = header.plain_bytes;
    loop {
        let take = left.min(CHUNK_BYTES as u64) as usize;
        let mut chunk = Zeroizing::new(vec![0u8; take]);
        plain
            .read_exact(&mut chunk)
            .map_err(|error| format!("cannot read the checkpoint's file: {error}"))?;
        left -= take as u64;
        let mut buffer: Vec<u8> = chunk.to_vec();
        if left == 0 {
            encryptor
                .encrypt_last_in_place(&associated, &mut buffer)
                .map_err(|_| "the cipher refused a chunk".to_owned())?;
            put.add(&buffer)?;
            break;
        }
        encryptor
            .encrypt_next_in_place(&associated, &mut buffer)
            .map_err(|_| "the cipher refused a chunk".to_owned())?;
        put.add(&buffer)?;
    }
    let mut extra = [0u8; 1];
    if plain.read(&mut extra).map_err(|error| error.to_string())? != 0 {
        return Err("the checkpoint's file is longer than the header says".to_owned());
    }
    let mut whole = put.signed.clone();
    let digest: [u8; 32] = put.signed.finalize().into();
    let signature = writer.sign(SignatureContext::Checkpoint, ledger, &digest);
    put.out
        .write_all(&signature.0)
        .map_err(|error| format!("cannot write: {error}"))?;
    whole.update(signature.0);
    Ok(whole.finalize().into())
}

/// Reads a sealed checkpoint's header line from `input`; returns it and its bytes.
///
/// # Errors
/// A line saying why it is no sealed checkpoint's header of `ledger`.
pub fn read_header(input: &mut dyn BufRead, ledger: &LedgerId) -> Result<(SealedHeader, Vec<u8>), String> {
    let (header, line) = read_any_header_line(input)?;
    let mut ours = String::new();
    crate::core::hex::push_lower_hex(&mut ours, &ledger.0);
    if header.ledger != ours {
        return Err("it is another ledger's".to_owned());
    }
    Ok((header, line))
}

/// Reads a sealed checkpoint's header line from `input`, of any ledger.
///
/// # Errors
/// A line saying why it is no sealed checkpoint's header.
pub fn read_any_header(input: &mut dyn BufRead) -> Result<SealedHeader, String> {
    read_any_header_line(input).map(|(header, _)| header)
}

fn read_any_header_line(input: &mut dyn BufRead) -> Result<(SealedHeader, Vec<u8>), String> {
    let mut line = Vec::new();
    input
        .take(MAX_HEADER_BYTES)
        .read_until(b'\n', &mut line)
        .map_err(|error| format!("cannot read its header: {error}"))?;
    if line.last() != Some(&b'\n') {
        return Err("its header is cut short or too long".to_owned());
    }
    let header: SealedHeader =
        serde_json::from_slice(&line).map_err(|error| format!("its header does not read: {error}"))?;
    if header.format != SEALED_CHECKPOINT_FORMAT {
        return Err(format!(
            "it is of format {:?}, not {SEALED_CHECKPOINT_FORMAT:?}",
            header.format
        ));
    }
    Ok((header, line))
}

/// Reads the rest of a sealed checkpoint whose header is `header` (its bytes `line`) from
/// `input`, opening its chunks with `key` into `out`, and checks the signature with `writer`;
/// returns the digest of all its bytes. What was written to `out` is of no use on an error.
///
/// # Errors
/// A line saying what does not hold: a chunk not authentic (another key, altered, moved), the
/// file cut short or longer, the signature not the writer's.
pub fn open_checkpoint(
    header: &SealedHeader,
    line: &[u8],
    key: &LedgerKey,
    writer: &PublicIdentity,
    ledger: &LedgerId,
    input: &mut dyn Read,
    out: &mut dyn Write,
) -> Result<BlobDigest, String> {
    let nonce: [u8; STREAM_NONCE_BYTES] = URL_SAFE_NO_PAD
        .decode(&header.nonce)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or("its nonce is not 19 bytes of base64url")?;
    let associated = associated_data(line);
    // What the signature covers is the start of the whole: one pass over the bytes serves both.
    let mut signed = Sha256::new();
    signed.update(line);
    let cipher = XChaCha20Poly1305::new(key.bytes().into());
    let mut decryptor = DecryptorBE32::from_aead(cipher, (&nonce).into());
    let mut left = header.plain_bytes;
    loop {
        let take = left.min(CHUNK_BYTES as u64) as usize;
        let mut buffer = Zeroizing::new(vec![0u8; take + TAG_BYTES]);
        input
            .read_exact(&mut buffer)
            .map_err(|error| format!("its ciphertext is cut short: {error}"))?;
        signed.update(&buffer[..]);
        left -= take as u64;
        let mut plain = buffer;
        let last = left == 0;
        let opened = if last {
            let decryptor = std::mem::replace(
                &mut decryptor,
                DecryptorBE32::from_aead(XChaCha20Poly1305::new(key.bytes().into()), (&nonce).into()),
            );
            decryptor.decrypt_last_in_place(&associated, &mut *plain)
        } else {
            decryptor.decrypt_next_in_place(&associated, &mut *plain)
        };
        opened.map_err(|_| "a chunk of it is not authentic (another key, or altered)".to_owned())?;
        out.write_all(&plain)
            .map_err(|error| format!("cannot write: {error}"))?;
        if last {
            break;
        }
    }
    let mut signature = [0u8; 64];
    input
        .read_exact(&mut signature)
        .map_err(|_| "its signature is cut short".to_owned())?;
    let mut whole = signed.clone();
    whole.update(signature);
    let mut extra = [0u8; 1];
    if input.read(&mut extra).map_err(|error| error.to_string())? != 0 {
        return Err("it goes on after its signature".to_owned());
    }
    let digest: [u8; 32] = signed.finalize().into();
    if !writer.verify(
        SignatureContext::Checkpoint,
        ledger,
        &digest,
        &Signature(signature),
    ) {
        return Err(format!("its signature is not {:?}'s", header.writer));
    }
    Ok(whole.finalize().into())
}

/// The bytes of a sealed checkpoint as they are written, and the digest of what the signature
/// covers (the header and the ciphertext: the start of the whole, whose digest names it).
struct Written<'a> {
    signed: Sha256,
    out: &'a mut dyn Write,
}

impl Written<'_> {
    fn add(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.signed.update(bytes);
        self.out
            .write_all(bytes)
            .map_err(|error| format!("cannot write: {error}"))
    }
}

/// The length of a sealed checkpoint whose header line is `line_bytes` long and whose file is
/// `plain_bytes` long (`None` past what a length holds).
pub fn sealed_length(line_bytes: usize, plain_bytes: u64) -> Option<u64> {
    let chunks = plain_bytes.div_ceil(CHUNK_BYTES as u64).max(1);
    let tags = chunks.checked_mul(TAG_BYTES as u64)?;
    (line_bytes as u64)
        .checked_add(plain_bytes)?
        .checked_add(tags)?
        .checked_add(64)
}

/// What each chunk is bound to: the domain and the header's digest.
fn associated_data(line: &[u8]) -> Vec<u8> {
    let mut associated = CHUNK_DOMAIN.to_vec();
    associated.extend_from_slice(&Sha256::digest(line));
    associated
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::id::DeviceId;

    fn header(plain_bytes: u64) -> SealedHeader {
        SealedHeader {
            format: SEALED_CHECKPOINT_FORMAT.to_owned(),
            ledger: "01".repeat(32),
            writer: "laptop".to_owned(),
            writer_origin: OpId([3; 32]),
            generation: 1,
            records: 4,
            forgets_before_ms: None,
            heads: vec![("laptop".to_owned(), 4, OpId([4; 32]))],
            roster: ProtectedMark::default(),
            plain_bytes,
            nonce: String::new(),
        }
    }

    fn sealed(plain: &[u8], key: &LedgerKey, writer: &DeviceKey) -> (Vec<u8>, BlobDigest) {
        let mut out = Vec::new();
        let digest = seal_checkpoint(
            header(plain.len() as u64),
            [5; STREAM_NONCE_BYTES],
            key,
            writer,
            &LedgerId([1; 32]),
            &mut &plain[..],
            &mut out,
        )
        .unwrap();
        (out, digest)
    }

    fn opened(bytes: &[u8], key: &LedgerKey, writer: &DeviceKey) -> Result<(Vec<u8>, BlobDigest), String> {
        let ledger = LedgerId([1; 32]);
        let mut input = bytes;
        let (header, line) = read_header(&mut input, &ledger)?;
        let mut out = Vec::new();
        let digest = open_checkpoint(
            &header,
            &line,
            key,
            &writer.public(),
            &ledger,
            &mut input,
            &mut out,
        )?;
        Ok((out, digest))
    }

    /// S6: a checkpoint's file goes through sealing and opening whole (empty, one chunk, several
    /// chunks), and the digest of its bytes is the one its name takes.
    #[test]
    fn s6_a_sealed_checkpoint_opens_to_its_file_whatever_its_length() {
        let key = LedgerKey::new(NonZeroU32::MIN, [7; 32]);
        let writer = DeviceKey::from_secrets(DeviceId::new("laptop").unwrap(), [8; 32], [9; 32]);
        for length in [0, 10, CHUNK_BYTES, CHUNK_BYTES * 2 + 3] {
            let plain: Vec<u8> = (0..length).map(|index| (index % 251) as u8).collect();
            let (bytes, digest) = sealed(&plain, &key, &writer);
            let sha: [u8; 32] = Sha256::digest(&bytes).into();
            assert_eq!(digest, sha);
            let line = bytes.iter().position(|byte| *byte == b'\n').unwrap() + 1;
            assert_eq!(sealed_length(line, length as u64), Some(bytes.len() as u64));
            assert_eq!(opened(&bytes, &key, &writer).unwrap(), (plain, digest));
        }
    }

    /// S6: another key, another signer, a chunk dropped, bytes after the signature, another
    /// ledger: none opens.
    #[test]
    fn s6_a_sealed_checkpoint_does_not_open_otherwise() {
        let key = LedgerKey::new(NonZeroU32::MIN, [7; 32]);
        let writer = DeviceKey::from_secrets(DeviceId::new("laptop").unwrap(), [8; 32], [9; 32]);
        let plain = vec![1u8; CHUNK_BYTES + 5];
        let (bytes, _) = sealed(&plain, &key, &writer);
        let other_key = LedgerKey::new(NonZeroU32::MIN, [6; 32]);
        assert!(opened(&bytes, &other_key, &writer)
            .unwrap_err()
            .contains("not authentic"));
        let stranger = DeviceKey::from_secrets(DeviceId::new("laptop").unwrap(), [18; 32], [19; 32]);
        assert!(opened(&bytes, &key, &stranger).unwrap_err().contains("signature"));
        let line = bytes.iter().position(|byte| *byte == b'\n').unwrap() + 1;
        let mut dropped = bytes[..line].to_vec();
        dropped.extend_from_slice(&bytes[line + CHUNK_BYTES + TAG_BYTES..]);
        assert!(opened(&dropped, &key, &writer).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(opened(&longer, &key, &writer)
            .unwrap_err()
            .contains("after its signature"));
        let mut input = &bytes[..];
        assert!(read_header(&mut input, &LedgerId([2; 32]))
            .unwrap_err()
            .contains("another ledger"));
    }
}
