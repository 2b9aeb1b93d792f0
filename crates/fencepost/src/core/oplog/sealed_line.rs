//! A sealed record's line: format 4, which this version writes, and format 3, which earlier
//! versions wrote and every reader still reads. Both carry the same fields and give the same
//! record, with the same `op_id` (computed from the fields, never from the text): see
//! [`SealedRecord`] for the layout of format 4.
//!
//! Format 4 is one base64 body between three short fields rather than a JSON array: reading it
//! is one decode and no JSON, which is most of a protected ledger's cold open that is not
//! cryptography, and it is about 10 bytes shorter.
//!
//! Format 3, one JSON array: `[3, device_id, seq, prev, generation, content, head]`, `prev`
//! and the head `null` when absent, the content, `prev` and the head in unpadded base64url.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::de::{self, SeqAccess};

use super::line::{device_id_sharing, next_element, op_id_of, Text};
use super::{write_serde_json, OpId, OpRecord, SealedContent, SealedRecord};
use crate::core::identity::Signature;
use crate::core::seal::{Sealed, NONCE_BYTES, TAG_BYTES};
use crate::oplog::{CLEAR_GENERATION, MAX_SEALED_RECORD_BYTES};

/// The format number of the JSON array form of earlier versions.
pub(super) const FORMAT_3: u64 = 3;
/// What a line of format 4 starts with.
pub(super) const FORMAT_4_START: &[u8] = b"4 ";
/// The body's flag: `prev` follows the flags byte.
const HAS_PREV: u8 = 1;
/// The body's flag: the head ends the body.
const HAS_HEAD: u8 = 2;
const SIGNATURE_BYTES: usize = 64;
/// The longest body of a format-4 line, decoded.
const MAX_BODY_BYTES: usize = 1 + 32 + MAX_SEALED_RECORD_BYTES + SIGNATURE_BYTES;

/// Appends the line of a sealed record (format 4), without a newline.
pub(super) fn write_sealed_line(op: &OpRecord, record: &SealedRecord, out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(1 + 32 + record.content.len() + SIGNATURE_BYTES);
    let flags =
        if op.prev.is_some() { HAS_PREV } else { 0 } | if record.head.is_some() { HAS_HEAD } else { 0 };
    body.push(flags);
    if let Some(prev) = &op.prev {
        body.extend_from_slice(&prev.0);
    }
    match &record.content {
        SealedContent::Clear(clear) => body.extend_from_slice(clear),
        SealedContent::Sealed(sealed) => {
            body.extend_from_slice(&sealed.nonce);
            body.extend_from_slice(&sealed.ciphertext);
        }
    }
    if let Some(head) = &record.head {
        body.extend_from_slice(&head.0);
    }
    out.extend_from_slice(FORMAT_4_START);
    write_serde_json(&*op.device_id, out);
    out.push(b' ');
    write_serde_json(&op.seq, out);
    out.push(b' ');
    write_serde_json(&record.content.generation(), out);
    out.push(b' ');
    push_base64(&body, out);
}

fn push_base64(bytes: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let written = URL_SAFE_NO_PAD.encode_slice(bytes, &mut out[start..]);
    debug_assert!(written.is_ok());
    out.truncate(start + written.unwrap_or(0));
}

/// A decimal number as format 4 writes it, ended by a space: digits only, no leading zero,
/// within `max`. Returns it and what follows the space.
fn decimal<'a>(text: &'a [u8], what: &str, max: u64) -> Result<(u64, &'a [u8]), String> {
    let digits = text.iter().take_while(|byte| byte.is_ascii_digit()).count();
    let value = text[..digits].iter().try_fold(0u64, |value, digit| {
        value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
    });
    let canonical = digits > 0 && (text[0] != b'0' || digits == 1) && text.get(digits) == Some(&b' ');
    match value.filter(|value| canonical && *value <= max) {
        Some(value) => Ok((value, &text[digits + 1..])),
        None => Err(format!(
            "{what} is a decimal number of at most {max} without leading zeros, then a space; got {:?}",
            String::from_utf8_lossy(&text[..text.len().min(24)])
        )),
    }
}

/// The device id that starts a format-4 line's fields, a JSON string (read without the JSON
/// reader when it holds nothing to unescape), then a space. Returns it and what follows.
fn device_of<'a>(text: &'a [u8], shared: Option<&Arc<str>>) -> Result<(Arc<str>, &'a [u8]), String> {
    let plain_end = text.strip_prefix(b"\"").and_then(|inner| {
        let end = inner
            .iter()
            .position(|byte| matches!(byte, b'"' | b'\\') || *byte < 0x20)?;
        (inner[end] == b'"').then_some(end)
    });
    let owned;
    let (device, rest): (&str, &[u8]) = match plain_end {
        Some(end) => (
            std::str::from_utf8(&text[1..1 + end]).map_err(|_| "the device id is not UTF-8".to_owned())?,
            &text[end + 2..],
        ),
        None => {
            let mut reader = serde_json::Deserializer::from_slice(text).into_iter::<String>();
            owned = match reader.next() {
                Some(Ok(device)) => device,
                _ => return Err("a format-4 line's device id is a JSON string".to_owned()),
            };
            let (written, rest) = text.split_at(reader.byte_offset());
            // Only as this version writes it (no space before it, no escape it does not
            // need): one record has one line (found by an adversary).
            if serde_json::to_string(&owned).ok().as_deref().map(str::as_bytes) != Some(written) {
                return Err(
                    "a format-4 line's device id is a JSON string as fencepost writes it (no space before it, no escape it does not need)"
                        .to_owned(),
                );
            }
            (&owned, rest)
        }
    };
    let rest = rest
        .strip_prefix(b" ")
        .ok_or("a format-4 line's device id is followed by a space")?;
    Ok((device_id_sharing(device, shared), rest))
}

/// Reads a line of format 4 (it starts with [`FORMAT_4_START`]; a newline may end it), only
/// as this version writes it.
pub(super) fn read_sealed_line_4(line: &[u8], shared: Option<&Arc<str>>) -> Result<OpRecord, String> {
    let rest = line
        .strip_suffix(b"\n")
        .unwrap_or(line)
        .strip_prefix(FORMAT_4_START)
        .ok_or("a format-4 line starts with \"4 \"")?;
    let (device_id, rest) = device_of(rest, shared)?;
    let (seq, rest) = decimal(rest, "the seq", u64::MAX)?;
    let (generation, body) = decimal(rest, "the generation", u32::MAX.into())?;
    let generation = generation as u32;
    if body.len() > MAX_BODY_BYTES.div_ceil(3) * 4 {
        return Err(format!(
            "the body is longer than {MAX_BODY_BYTES} bytes, the limit"
        ));
    }
    // The body is most of what a cold open reads that is not cryptography: decoded with SIMD.
    let body = base64_simd::URL_SAFE_NO_PAD.decode_to_vec(body).map_err(|_| {
        // That decoder does not say why: the other one does, where and what.
        let why = URL_SAFE_NO_PAD
            .decode(body)
            .err()
            .map_or_else(|| "it does not decode".to_owned(), |error| error.to_string());
        format!("the body is not unpadded base64url: {why}")
    })?;
    let (prev, content, head) = split_body(body, generation)?;
    Ok(sealed_record(device_id, seq, prev, content, head))
}

/// The record a sealed line reads as, its `op_id` computed (from its fields, never its text).
fn sealed_record(
    device_id: Arc<str>,
    seq: u64,
    prev: Option<OpId>,
    content: SealedContent,
    head: Option<Signature>,
) -> OpRecord {
    let op = OpRecord::sealed(device_id, seq, prev, content);
    match head {
        Some(head) => op.with_head(head),
        None => op,
    }
}

/// A format-4 body taken apart: `prev`, the content and the head.
fn split_body(
    mut body: Vec<u8>,
    generation: u32,
) -> Result<(Option<OpId>, SealedContent, Option<Signature>), String> {
    let Some(&flags) = body.first() else {
        return Err("the body is empty; it starts with a flags byte".to_owned());
    };
    if flags & !(HAS_PREV | HAS_HEAD) != 0 {
        return Err(format!(
            "the body's flags byte is {flags}; only 1 (prev) and 2 (head) are defined"
        ));
    }
    let prev_bytes = if flags & HAS_PREV != 0 { 32 } else { 0 };
    let head_bytes = if flags & HAS_HEAD != 0 { SIGNATURE_BYTES } else { 0 };
    let least = 1 + prev_bytes + head_bytes;
    if body.len() < least {
        return Err(format!(
            "the body is {} bytes; its flags ask for at least {least}",
            body.len()
        ));
    }
    let head = (head_bytes > 0).then(|| {
        let mut signature = [0u8; SIGNATURE_BYTES];
        signature.copy_from_slice(&body[body.len() - SIGNATURE_BYTES..]);
        Signature(signature)
    });
    body.truncate(body.len() - head_bytes);
    let prev = (prev_bytes > 0).then(|| {
        let mut id = [0u8; 32];
        id.copy_from_slice(&body[1..33]);
        OpId(id)
    });
    let content = content_of(body, 1 + prev_bytes, generation)?;
    Ok((prev, content, head))
}

/// The content that `bytes` carry from `start` on, sealed with `generation` (for a generation
/// above 0: the nonce, then the ciphertext and its tag). It keeps the allocation of `bytes`.
fn content_of(mut bytes: Vec<u8>, start: usize, generation: u32) -> Result<SealedContent, String> {
    if generation == CLEAR_GENERATION {
        bytes.drain(..start);
        return Ok(SealedContent::Clear(bytes.into_boxed_slice()));
    }
    if bytes.len() < start + NONCE_BYTES + TAG_BYTES {
        return Err("sealed content is a 24-byte nonce and at least a 16-byte tag".to_owned());
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&bytes[start..start + NONCE_BYTES]);
    bytes.drain(..start + NONCE_BYTES);
    Ok(SealedContent::Sealed(Sealed {
        generation,
        nonce,
        ciphertext: bytes,
    }))
}

fn base64_of<E: de::Error>(text: &str, what: &str, limit: usize) -> Result<Vec<u8>, E> {
    if text.len() > limit.div_ceil(3) * 4 {
        return Err(E::custom(format_args!(
            "{what} is longer than {limit} bytes, the limit"
        )));
    }
    URL_SAFE_NO_PAD
        .decode(text.as_bytes())
        .map_err(|error| E::custom(format_args!("{what} is not unpadded base64url: {error}")))
}

/// Reads the rest of a format-3 line, after its format number (the record's `op_id` computed).
pub(super) fn read_sealed_line_3<'de, A: SeqAccess<'de>>(
    mut seq: A,
    shared: Option<&Arc<str>>,
) -> Result<OpRecord, A::Error> {
    let device: Text = next_element(&mut seq, 1, "the device_id")?;
    let device_id = device_id_sharing(&device.0, shared);
    let seq_number: u64 = next_element(&mut seq, 2, "the seq")?;
    let prev: Option<Text> = next_element(&mut seq, 3, "prev")?;
    let prev = prev.map(|prev| op_id_of(&prev.0, "prev")).transpose()?;
    let generation: u32 = next_element(&mut seq, 4, "the generation")?;
    let content: Text = next_element(&mut seq, 5, "the content")?;
    let bytes = base64_of(&content.0, "the content", MAX_SEALED_RECORD_BYTES)?;
    let content = content_of(bytes, 0, generation).map_err(de::Error::custom)?;
    let head: Option<Text> = next_element(&mut seq, 6, "the head")?;
    let head = match head {
        None => None,
        Some(head) => {
            let bytes = base64_of(&head.0, "the head", SIGNATURE_BYTES)?;
            let signature: [u8; SIGNATURE_BYTES] = bytes
                .try_into()
                .map_err(|_| de::Error::custom("the head is a 64-byte signature"))?;
            Some(Signature(signature))
        }
    };
    if seq.next_element::<de::IgnoredAny>()?.is_some() {
        return Err(de::Error::custom("a format-3 line has 7 elements"));
    }
    Ok(sealed_record(device_id, seq_number, prev, content, head))
}
