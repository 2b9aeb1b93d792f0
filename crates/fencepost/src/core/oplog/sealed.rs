//! A protected ledger's record as relays carry it (issue 39): [`SealedRecord`], the body of an
//! [`OpRecord`] of [`Surface::Sealed`], its id and its head. Its line (format 4, and format 3
//! that earlier versions wrote) is in `sealed_line.rs`.
//!
//! A relay checks a sealed record's chain as any other (its `op_id` over what it carries, `seq`,
//! `prev`) and learns nothing of its content: the `op_id` is computed over the ciphertext, never
//! over the content. Its stamp is not carried either: a sealed record's `hlc` is its sequence
//! number ([`sealed_stamp`]), the real stamp being inside the ciphertext.
//!
//! # How a sealed record's `op_id` is computed
//!
//! SHA-256 over, in order: the bytes `fencepost/sealed-op/v1` and a 0 byte; `device_id` as an
//! 8-byte big-endian length followed by its UTF-8; `seq` (8 bytes, big-endian); `prev` as a 0
//! byte, or a 1 byte followed by its 32 bytes; the generation (4 bytes, big-endian); for a
//! generation above 0 the nonce (24 bytes); the content's length (8 bytes, big-endian) and its
//! bytes. The line's form is not in it: a record has the same id in either format.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::record::push_text;
use super::{OpId, OpRecord, Payload, PayloadRepr, Surface};
use crate::core::clock::Hlc;
use crate::core::identity::{DeviceKey, LedgerId, PublicIdentity, Signature, SignatureContext};
use crate::core::seal::{Sealed, MAX_SEALED_CONTENT_BYTES, NONCE_BYTES, PAD_BYTES, TAG_BYTES};

/// The generation that means "in the clear".
pub const CLEAR_GENERATION: u32 = 0;
/// The longest content a sealed record carries, in bytes (the nonce and the tag included).
pub const MAX_SEALED_RECORD_BYTES: usize =
    NONCE_BYTES + (MAX_SEALED_CONTENT_BYTES + 2).div_ceil(PAD_BYTES) * PAD_BYTES + TAG_BYTES;
/// What a sealed record's id preimage starts with.
const ID_DOMAIN: &[u8] = b"fencepost/sealed-op/v1\0";

/// What a sealed record carries.
#[derive(Clone, PartialEq, Eq)]
pub enum SealedContent {
    /// Content any reader may read (a device's identity, a membership change): authenticated by
    /// the head that covers it, not encrypted.
    Clear(Box<[u8]>),
    /// Content sealed with a generation of the ledger key (never generation 0).
    Sealed(Sealed),
}

impl SealedContent {
    /// The generation of the ledger key that sealed it; [`CLEAR_GENERATION`] in the clear.
    pub fn generation(&self) -> u32 {
        match self {
            SealedContent::Clear(_) => CLEAR_GENERATION,
            SealedContent::Sealed(sealed) => sealed.generation,
        }
    }

    /// How many bytes it carries (the nonce and the tag included).
    pub fn len(&self) -> usize {
        match self {
            SealedContent::Clear(bytes) => bytes.len(),
            SealedContent::Sealed(sealed) => sealed.nonce.len() + sealed.ciphertext.len(),
        }
    }

    /// Whether it carries no byte (content in the clear that is empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for SealedContent {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealedContent::Clear(bytes) => write!(formatter, "Clear({} bytes)", bytes.len()),
            SealedContent::Sealed(sealed) => write!(
                formatter,
                "Sealed(generation {}, {} bytes)",
                sealed.generation,
                sealed.ciphertext.len()
            ),
        }
    }
}

/// The body of a record of [`Surface::Sealed`]: its content and, on the last record of an
/// append, the head its writer signed.
///
/// Its line is format 4 (earlier versions wrote format 3, still read):
///
/// ```text
/// 4 "DEVICE" SEQ GENERATION BODY
/// ```
///
/// The device id as a JSON string; `SEQ` and the generation of the ledger key that sealed the
/// content (`0`: in the clear) in decimal; the body in unpadded base64url: a flags byte (1:
/// `prev` follows, 2: the head ends the body), `prev`'s 32 bytes, the content (for a generation
/// above 0, the 24-byte nonce, the ciphertext and its tag) and the head's 64 bytes. The line
/// carries no `op_id`: it is computed, as SHA-256 over `fencepost/sealed-op/v1` and a 0 byte,
/// the device id (8-byte length and UTF-8), `seq`, `prev` (a 0 byte, or a 1 byte and its 32
/// bytes), the generation (4 bytes), the nonce (above generation 0) and the content (8-byte
/// length and bytes): over what the relay carries, never over the content. The stamp is not
/// carried either: [`sealed_stamp`]. A fencepost before format 4 refuses the line, as damage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRecord {
    /// The content, sealed or in the clear.
    pub content: SealedContent,
    /// The writer's signature over its chain up to this record, or `None`.
    pub head: Option<Signature>,
}

/// A sealed record's stamp: its sequence number, so that the chain's stamps increase and say
/// nothing the relay does not see anyway.
pub fn sealed_stamp(device_id: &Arc<str>, seq: u64) -> Hlc {
    Hlc {
        wall_ms: seq,
        counter: 0,
        device_id: Arc::clone(device_id),
    }
}

impl OpRecord {
    /// A record of [`Surface::Sealed`] at `seq` of `device_id`'s log after `prev`, with its
    /// `op_id` computed and no head (see [`with_head`](Self::with_head)).
    pub fn sealed(device_id: Arc<str>, seq: u64, prev: Option<OpId>, content: SealedContent) -> Self {
        let mut op = OpRecord {
            op_id: OpId([0; 32]),
            hlc: sealed_stamp(&device_id, seq),
            device_id,
            seq,
            prev,
            surface: Surface::Sealed,
            payload: Payload {
                repr: PayloadRepr::Sealed(Arc::new(SealedRecord { content, head: None })),
            },
        };
        op.op_id = op.content_id();
        op
    }

    /// The body of a sealed record; `None` for any other.
    pub fn sealed_record(&self) -> Option<&SealedRecord> {
        match &self.payload.repr {
            PayloadRepr::Sealed(record) => Some(record),
            _ => None,
        }
    }

    /// This record with `head` as its head, if it is a sealed record (the `op_id` stays: the
    /// head is not in it); any other record unchanged.
    #[must_use]
    pub fn with_head(mut self, head: Signature) -> Self {
        if let PayloadRepr::Sealed(record) = &mut self.payload.repr {
            Arc::make_mut(record).head = Some(head);
        }
        self
    }
}

/// What a head signs (with the context [`SignatureContext::ChainHead`] and the ledger's id): the
/// device, the sequence number, the record's id and the id of its log's record 0, whose content
/// names the key that signs.
fn head_message(op: &OpRecord, origin: &OpId) -> Vec<u8> {
    head_message_of(&op.device_id, op.seq, &op.op_id, origin)
}

fn head_message_of(device_id: &str, seq: u64, op_id: &OpId, origin: &OpId) -> Vec<u8> {
    let mut message = Vec::with_capacity(96 + device_id.len());
    push_text(&mut message, device_id);
    message.extend_from_slice(&seq.to_be_bytes());
    message.extend_from_slice(&op_id.0);
    message.extend_from_slice(&origin.0);
    message
}

/// Whether `head` is a head `public` signed for `ledger` over record `seq` (id `op_id`) of
/// `device_id`'s log whose record 0 has the id `origin`: what [`OpRecord::has_valid_head`]
/// checks, given the record's place rather than the record.
pub fn is_valid_head(
    head: &Signature,
    public: &PublicIdentity,
    ledger: &LedgerId,
    (device_id, seq, op_id): (&str, u64, &OpId),
    origin: &OpId,
) -> bool {
    public.verify(
        SignatureContext::ChainHead,
        ledger,
        &head_message_of(device_id, seq, op_id, origin),
        head,
    )
}

impl OpRecord {
    /// This record with a head signed by `key` for `ledger`: the signature covers this record
    /// and, through the chain, every record before it in its log, whose record 0 has the id
    /// `origin` (this record's own id when it is record 0).
    #[must_use]
    pub fn signed(self, key: &DeviceKey, ledger: &LedgerId, origin: &OpId) -> Self {
        let head = key.sign(SignatureContext::ChainHead, ledger, &head_message(&self, origin));
        self.with_head(head)
    }

    /// Whether this record carries a head that `public` signed for `ledger`, in the log whose
    /// record 0 has the id `origin`.
    pub fn has_valid_head(&self, public: &PublicIdentity, ledger: &LedgerId, origin: &OpId) -> bool {
        self.sealed_record()
            .and_then(|record| record.head.as_ref())
            .is_some_and(|head| {
                is_valid_head(
                    head,
                    public,
                    ledger,
                    (&self.device_id, self.seq, &self.op_id),
                    origin,
                )
            })
    }
}

/// The `op_id` of a sealed record (see the module docs).
pub(super) fn sealed_content_id(op: &OpRecord, record: &SealedRecord) -> OpId {
    // Fed to the hash field by field, as `push_text` and the rest would lay them out.
    let mut hasher = Sha256::new();
    hasher.update(ID_DOMAIN);
    hasher.update((op.device_id.len() as u64).to_be_bytes());
    hasher.update(op.device_id.as_bytes());
    hasher.update(op.seq.to_be_bytes());
    match &op.prev {
        None => hasher.update([0]),
        Some(prev) => {
            hasher.update([1]);
            hasher.update(prev.0);
        }
    }
    hasher.update(record.content.generation().to_be_bytes());
    let bytes: &[u8] = match &record.content {
        SealedContent::Clear(bytes) => bytes,
        SealedContent::Sealed(sealed) => {
            hasher.update(sealed.nonce);
            &sealed.ciphertext
        }
    };
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
    OpId(hasher.finalize().into())
}

/// What is wrong with a sealed record's shape, if anything: its stamp is not its sequence
/// number, or its content is longer than any sealer makes.
pub(super) fn sealed_shape_problem(op: &OpRecord, record: &SealedRecord) -> Option<String> {
    if op.hlc != sealed_stamp(&op.device_id, op.seq) {
        return Some("a sealed record's stamp is its sequence number".to_owned());
    }
    let length = record.content.len();
    (length > MAX_SEALED_RECORD_BYTES).then(|| {
        format!("it carries {length} bytes of sealed content; the limit is {MAX_SEALED_RECORD_BYTES}")
    })
}
