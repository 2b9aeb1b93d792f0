//! A record's content as a protected ledger seals it (issue 39): its stamp, surface and payload
//! in a compact binary form ([`OpRecord::seal_with_nonce`]), and the record a sealed one opens to
//! ([`OpRecord::open`]).
//!
//! The content, in order: `hlc.wall_ms` (8 bytes, big-endian), `hlc.counter` (4 bytes), a
//! surface tag, then the body:
//!
//! * tag 0, a well-formed intent: its status (1 byte: 0 pending, 1 committed, 2 failed), its
//!   epoch (8 bytes), its run id (a 0 byte and the 16 bytes of a `run-` id of 32 hex digits, or
//!   a 1 byte, a 2-byte length and the text), then the agent id (the rest);
//! * tag 1, a grow-only log, and tag 2, a registry: the kind (a 2-byte length and the text),
//!   then the payload's canonical JSON (the rest);
//! * tag 3, an intent whose payload is not a well-formed intent: its canonical JSON (the rest);
//! * tag 4, a well-formed intent of one size ([`OpRecord::seal_named_with_nonce`], what a
//!   ledger writes): its status, its epoch, the [`agent_digest`] of its agent id (16 bytes), its
//!   run id as tag 0 has it, then zero bytes up to the size of the longest run id of its form.
//!   A record of its log before it names the agent ([`AGENT_NAMES`]); it opens to an intent whose
//!   agent id is a stand-in ([`named_agent_digest`] reads it) until the reader puts the name in.
//!
//! A well-formed intent of tag 4 takes 55 bytes with a `run-` id of 32 hex digits, whatever its
//! agent id, so it seals into 80 bytes (padded to 64, and the tag); with a run id of another
//! form, 297 bytes, sealed into 336.

use std::sync::Arc;

use compact_str::CompactString;
use serde_json::Value;
use thiserror::Error;
use zeroize::Zeroizing;

use super::record::exceeds_depth;
use super::{
    CompactIntent, OpRecord, Payload, PayloadRepr, SealedContent, Surface, MAX_PAYLOAD_DEPTH,
    MAX_SURFACE_KIND_BYTES,
};
use crate::core::clock::Hlc;
use crate::core::identity::LedgerId;
use crate::core::seal::{LedgerKey, Place, SealError};
use crate::intent::{IntentStatus, MAX_EPOCH};
use crate::run_id::RunKey;

const TAG_INTENT: u8 = 0;
const TAG_LOG: u8 = 1;
const TAG_REGISTRY: u8 = 2;
const TAG_INTENT_JSON: u8 = 3;
const TAG_INTENT_NAMED: u8 = 4;

/// The registry kind of the records that name agents: `{"key": DIGEST, "agent": AGENT}`, the
/// digest the [`agent_digest`] of the agent id in hex. A device's log names an agent before its
/// first intent of tag 4 for it.
pub const AGENT_NAMES: &str = "fencepost.agent";

/// The bytes of an [`agent_digest`].
pub const AGENT_DIGEST_BYTES: usize = 16;

/// The digest an intent of one size names its agent by: the first 16 bytes of a SHA-256 of the
/// agent id (sealed, so it tells the relay nothing).
pub fn agent_digest(agent: &str) -> [u8; AGENT_DIGEST_BYTES] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"fencepost/agent/v1\0");
    hasher.update(agent.as_bytes());
    let mut digest = [0u8; AGENT_DIGEST_BYTES];
    digest.copy_from_slice(&hasher.finalize()[..AGENT_DIGEST_BYTES]);
    digest
}

/// What an intent of tag 4 opens to in place of its agent id: a character no agent id holds
/// (rule L8), then the digest in base64 (23 bytes: kept inline).
const STAND_IN: char = '\u{1}';

/// The digest an opened intent's agent id stands in for, when it is a stand-in.
pub fn named_agent_digest(agent: &str) -> Option<[u8; AGENT_DIGEST_BYTES]> {
    use base64::Engine;
    let encoded = agent.strip_prefix(STAND_IN)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()?;
    bytes.try_into().ok()
}

/// The text an opened intent holds in place of an agent id named by `digest`.
pub(crate) fn stand_in(digest: &[u8; AGENT_DIGEST_BYTES]) -> CompactString {
    use base64::Engine;
    // Encoded on the stack: one per intent opened, on the cold open's path.
    let mut encoded = [0u8; 22];
    let written = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode_slice(digest, &mut encoded)
        .unwrap_or(0);
    let mut text = CompactString::default();
    text.push(STAND_IN);
    text.push_str(std::str::from_utf8(&encoded[..written]).unwrap_or_default());
    text
}

/// The longest run id of the text form an intent of tag 4 is padded to.
const NAMED_TEXT_RUN_BYTES: usize = crate::core::id::MAX_ID_BYTES;

/// A sealed record did not open.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OpenError {
    /// The record is not sealed content (another surface, or content in the clear).
    #[error("device {device_id:?} seq {seq}: not a sealed record")]
    NotSealed {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
    },
    /// The cipher refused it: another key or generation, altered, or moved.
    #[error("device {device_id:?} seq {seq}: {error}")]
    Seal {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// Why.
        error: SealError,
    },
    /// Authentic, but its content is not a record's (a member sealed nonsense).
    #[error("device {device_id:?} seq {seq}: its sealed content is malformed: {detail}")]
    Content {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// What is wrong.
        detail: String,
    },
}

impl OpRecord {
    /// This record's stamp, surface and payload as the content a protected ledger seals.
    pub fn content_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.hlc.wall_ms.to_be_bytes());
        out.extend_from_slice(&self.hlc.counter.to_be_bytes());
        match (&self.surface, &self.payload.repr) {
            (Surface::Intent, PayloadRepr::Intent(intent)) => {
                out.push(TAG_INTENT);
                out.push(status_code(intent.status));
                out.extend_from_slice(&intent.epoch.to_be_bytes());
                push_run(&intent.run, &mut out);
                out.extend_from_slice(intent.agent.as_bytes());
            }
            (Surface::Log { kind } | Surface::Registry { kind }, _) => {
                let tag = if matches!(self.surface, Surface::Log { .. }) {
                    TAG_LOG
                } else {
                    TAG_REGISTRY
                };
                out.push(tag);
                push_short(kind.as_bytes(), &mut out);
                self.payload.write_canonical_json(&mut out);
            }
            (Surface::Intent | Surface::Sealed, _) => {
                out.push(TAG_INTENT_JSON);
                self.payload.write_canonical_json(&mut out);
            }
        }
        out
    }

    /// [`content_bytes`](Self::content_bytes), an intent of one size: its agent named by
    /// digest (tag 4). Any other record as `content_bytes` has it.
    pub fn content_bytes_named(&self) -> Vec<u8> {
        let (Surface::Intent, PayloadRepr::Intent(intent)) = (&self.surface, &self.payload.repr) else {
            return self.content_bytes();
        };
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.hlc.wall_ms.to_be_bytes());
        out.extend_from_slice(&self.hlc.counter.to_be_bytes());
        out.push(TAG_INTENT_NAMED);
        out.push(status_code(intent.status));
        out.extend_from_slice(&intent.epoch.to_be_bytes());
        out.extend_from_slice(&agent_digest(&intent.agent));
        push_run(&intent.run, &mut out);
        if let RunKey::Text(text) = &intent.run {
            out.resize(out.len() + NAMED_TEXT_RUN_BYTES.saturating_sub(text.len()), 0);
        }
        out
    }

    /// [`seal_with_nonce`](Self::seal_with_nonce) of [`content_bytes_named`](Self::content_bytes_named).
    ///
    /// # Errors
    /// As [`seal_with_nonce`](Self::seal_with_nonce).
    pub fn seal_named_with_nonce(
        &self,
        key: &LedgerKey,
        ledger: LedgerId,
        nonce: [u8; 24],
    ) -> Result<OpRecord, SealError> {
        self.seal_content(key, ledger, nonce, &Zeroizing::new(self.content_bytes_named()))
    }

    /// This record sealed with `key` for `ledger` and `nonce` (which must be random and never
    /// used again: `OpRecord::seal` draws one): the record of [`Surface::Sealed`] at the same
    /// place, whose `op_id` is over the ciphertext.
    ///
    /// # Errors
    /// [`SealError::TooLong`] when the content is over
    /// [`MAX_SEALED_CONTENT_BYTES`](crate::seal::MAX_SEALED_CONTENT_BYTES).
    pub fn seal_with_nonce(
        &self,
        key: &LedgerKey,
        ledger: LedgerId,
        nonce: [u8; 24],
    ) -> Result<OpRecord, SealError> {
        self.seal_content(key, ledger, nonce, &Zeroizing::new(self.content_bytes()))
    }

    fn seal_content(
        &self,
        key: &LedgerKey,
        ledger: LedgerId,
        nonce: [u8; 24],
        content: &[u8],
    ) -> Result<OpRecord, SealError> {
        let place = Place {
            ledger,
            device: &self.device_id,
            seq: self.seq,
        };
        let sealed = key.seal_with_nonce(nonce, &place, content)?;
        Ok(OpRecord::sealed(
            Arc::clone(&self.device_id),
            self.seq,
            self.prev,
            SealedContent::Sealed(sealed),
        ))
    }

    /// The record this sealed record opens to with `key` in `ledger`: its `op_id`, `device_id`,
    /// `seq` and `prev` (the sealed record's), and the stamp, surface and payload sealed in it.
    ///
    /// # Errors
    /// [`OpenError`]: not sealed content, not authentic under this key, or malformed content.
    pub fn open(&self, key: &LedgerKey, ledger: LedgerId) -> Result<OpRecord, OpenError> {
        let Some(SealedContent::Sealed(sealed)) = self.sealed_record().map(|record| &record.content) else {
            return Err(OpenError::NotSealed {
                device_id: self.device_id.to_string(),
                seq: self.seq,
            });
        };
        let place = Place {
            ledger,
            device: &self.device_id,
            seq: self.seq,
        };
        let content = key.open(sealed, &place).map_err(|error| OpenError::Seal {
            device_id: self.device_id.to_string(),
            seq: self.seq,
            error,
        })?;
        let (hlc, surface, payload) =
            decode_content(&content, &self.device_id).map_err(|detail| OpenError::Content {
                device_id: self.device_id.to_string(),
                seq: self.seq,
                detail,
            })?;
        Ok(OpRecord {
            op_id: self.op_id,
            hlc,
            device_id: Arc::clone(&self.device_id),
            seq: self.seq,
            prev: self.prev,
            surface,
            payload,
        })
    }
}

impl OpRecord {
    /// The digest this opened intent names its agent by (tag 4), while no name is put in.
    pub(crate) fn agent_stand_in(&self) -> Option<[u8; AGENT_DIGEST_BYTES]> {
        match (&self.surface, &self.payload.repr) {
            (Surface::Intent, PayloadRepr::Intent(intent)) => named_agent_digest(&intent.agent),
            _ => None,
        }
    }

    /// The agent id this opened intent holds as it is (a stand-in, while no name is put in).
    pub(crate) fn opened_agent(&self) -> Option<&str> {
        match (&self.surface, &self.payload.repr) {
            (Surface::Intent, PayloadRepr::Intent(intent)) => Some(&intent.agent),
            _ => None,
        }
    }

    /// Puts `agent` in place of this opened intent's stand-in.
    pub(crate) fn put_agent(&mut self, agent: &CompactString) {
        if let PayloadRepr::Intent(intent) = &mut self.payload.repr {
            intent.agent = agent.clone();
        }
    }

    /// This opened intent read as a `pending`, whatever status it says (a void record's).
    pub(crate) fn read_as_pending(&mut self) {
        if self.surface != Surface::Intent {
            return;
        }
        if let PayloadRepr::Intent(intent) = &mut self.payload.repr {
            intent.status = IntentStatus::Pending;
        } else if let Some(mut intent) = self.payload.intent() {
            intent.status = IntentStatus::Pending;
            self.payload = Payload::new(intent.payload());
        }
    }
}

fn status_code(status: IntentStatus) -> u8 {
    match status {
        IntentStatus::Pending => 0,
        IntentStatus::Committed => 1,
        IntentStatus::Failed => 2,
    }
}

/// A run id: a 0 byte and the 16 bytes of a `run-` id, or a 1 byte and the text.
fn push_run(run: &RunKey, out: &mut Vec<u8>) {
    match run {
        RunKey::Hashed(bytes) => {
            out.push(0);
            out.extend_from_slice(bytes);
        }
        RunKey::Text(text) => {
            out.push(1);
            push_short(text.as_bytes(), out);
        }
    }
}

fn push_short(bytes: &[u8], out: &mut Vec<u8>) {
    // Longer text makes content over the sealing limit, which `seal_with_nonce` refuses.
    let length = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&bytes[..usize::from(length)]);
}

/// Reads a sealed record's content.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize, what: &str) -> Result<&'a [u8], String> {
        if self.bytes.len() < count {
            return Err(format!("it ends before {what}"));
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N, what)?);
        Ok(array)
    }

    fn short_text(&mut self, what: &str) -> Result<&'a str, String> {
        let length = u16::from_be_bytes(self.array(what)?);
        let bytes = self.take(usize::from(length), what)?;
        std::str::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn json(&mut self) -> Result<Value, String> {
        let value: Value = serde_json::from_slice(self.bytes)
            .map_err(|error| format!("its payload is not JSON: {error}"))?;
        self.bytes = &[];
        if exceeds_depth(&value, MAX_PAYLOAD_DEPTH) {
            return Err(format!("its payload nests deeper than {MAX_PAYLOAD_DEPTH}"));
        }
        Ok(value)
    }
}

fn decode_content(content: &[u8], device_id: &Arc<str>) -> Result<(Hlc, Surface, Payload), String> {
    let mut reader = Reader { bytes: content };
    let hlc = Hlc {
        wall_ms: u64::from_be_bytes(reader.array("the stamp")?),
        counter: u32::from_be_bytes(reader.array("the stamp")?),
        device_id: Arc::clone(device_id),
    };
    let [tag] = reader.array("the surface")?;
    let (surface, payload) = match tag {
        TAG_INTENT => (Surface::Intent, decode_intent(&mut reader)?),
        TAG_LOG | TAG_REGISTRY => {
            let kind = reader.short_text("the kind")?;
            if kind.len() > MAX_SURFACE_KIND_BYTES {
                return Err(format!("its kind is over {MAX_SURFACE_KIND_BYTES} bytes"));
            }
            let kind: Arc<str> = Arc::from(kind);
            let surface = if tag == TAG_LOG {
                Surface::Log { kind }
            } else {
                Surface::Registry { kind }
            };
            (surface, Payload::new(reader.json()?))
        }
        TAG_INTENT_JSON => (Surface::Intent, Payload::new(reader.json()?)),
        TAG_INTENT_NAMED => (Surface::Intent, decode_named_intent(&mut reader)?),
        other => return Err(format!("surface tag {other} is none of 0 to 4")),
    };
    Ok((hlc, surface, payload))
}

fn decode_intent(reader: &mut Reader<'_>) -> Result<Payload, String> {
    let (status, epoch) = decode_status_and_epoch(reader)?;
    let run = decode_run(reader)?;
    let agent = std::str::from_utf8(reader.bytes).map_err(|_| "the agent id is not UTF-8".to_owned())?;
    if agent.is_empty() {
        return Err("the agent id is empty".to_owned());
    }
    Ok(intent_payload(run, CompactString::from(agent), epoch, status))
}

/// Tag 4: the agent by digest (a stand-in), the run id, and zero bytes only.
fn decode_named_intent(reader: &mut Reader<'_>) -> Result<Payload, String> {
    let (status, epoch) = decode_status_and_epoch(reader)?;
    let digest: [u8; AGENT_DIGEST_BYTES] = reader.array("the agent's digest")?;
    let run = decode_run(reader)?;
    if reader.bytes.iter().any(|byte| *byte != 0) {
        return Err("bytes that are not zero after the run id".to_owned());
    }
    Ok(intent_payload(run, stand_in(&digest), epoch, status))
}

fn decode_status_and_epoch(reader: &mut Reader<'_>) -> Result<(IntentStatus, u64), String> {
    let [status] = reader.array("the status")?;
    let status = match status {
        0 => IntentStatus::Pending,
        1 => IntentStatus::Committed,
        2 => IntentStatus::Failed,
        other => return Err(format!("intent status {other} is none of 0, 1, 2")),
    };
    let epoch = u64::from_be_bytes(reader.array("the epoch")?);
    if epoch > MAX_EPOCH {
        return Err(format!("epoch {epoch} is over the largest, {MAX_EPOCH}"));
    }
    Ok((status, epoch))
}

fn decode_run(reader: &mut Reader<'_>) -> Result<RunKey, String> {
    let [run_form] = reader.array("the run id")?;
    match run_form {
        0 => Ok(RunKey::Hashed(reader.array("the run id")?)),
        1 => {
            let text = reader.short_text("the run id")?;
            if text.is_empty() {
                return Err("the run id is empty".to_owned());
            }
            Ok(RunKey::new(text))
        }
        other => Err(format!("run id form {other} is neither 0 nor 1")),
    }
}

fn intent_payload(run: RunKey, agent: CompactString, epoch: u64, status: IntentStatus) -> Payload {
    Payload {
        repr: PayloadRepr::Intent(CompactIntent {
            run,
            agent,
            epoch,
            status,
        }),
    }
}
