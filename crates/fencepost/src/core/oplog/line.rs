//! The compact line form of a record (format 2, see the [module docs](super#wire-form)): its
//! writer, and its reader, which [`OpRecord::from_json`] calls for a line that starts with `[`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use compact_str::CompactString;
use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};
use serde_json::Value;

use super::{write_serde_json, CompactIntent, OpId, OpRecord, Payload, PayloadRepr, Surface};
use crate::core::clock::Hlc;
use crate::intent::{IntentStatus, MAX_EPOCH};
use crate::run_id::RunKey;

/// The format number, the line's first element.
const FORMAT: u64 = 2;
/// The body is a well-formed intent: agent id, epoch, run id, status.
const TAG_INTENT: u8 = 0;
/// The body is a grow-only log's kind and the payload.
const TAG_LOG: u8 = 1;
/// The body is a registry's kind and the payload.
const TAG_REGISTRY: u8 = 2;
/// The body is the payload of an intent record that is not a well-formed intent.
const TAG_INTENT_JSON: u8 = 3;
/// The length of an op id in unpadded base64url.
const OP_ID_TEXT_BYTES: usize = 43;

fn status_code(status: IntentStatus) -> u8 {
    match status {
        IntentStatus::Pending => 0,
        IntentStatus::Committed => 1,
        IntentStatus::Failed => 2,
    }
}

fn status_of(code: u8) -> Option<IntentStatus> {
    match code {
        0 => Some(IntentStatus::Pending),
        1 => Some(IntentStatus::Committed),
        2 => Some(IntentStatus::Failed),
        _ => None,
    }
}

/// Whether `op` has the compact form: its stamp names its own device, as every record a log makes.
pub(super) fn has_compact_form(op: &OpRecord) -> bool {
    op.hlc.device_id == op.device_id
}

fn push_op_id(op_id: &OpId, out: &mut Vec<u8>) {
    let mut text = [0u8; OP_ID_TEXT_BYTES];
    let written = URL_SAFE_NO_PAD.encode_slice(op_id.0, &mut text);
    debug_assert_eq!(written, Ok(OP_ID_TEXT_BYTES));
    out.push(b'"');
    out.extend_from_slice(&text);
    out.push(b'"');
}

/// `device` as a record's device id: `shared`'s allocation when it is that id (the records of
/// one device's file share one), else a new one.
pub(super) fn device_id_sharing(device: &str, shared: Option<&Arc<str>>) -> Arc<str> {
    match shared {
        Some(shared) if **shared == *device => Arc::clone(shared),
        _ => Arc::from(device),
    }
}

/// Appends `op`'s device id, seq and prev, each followed by a comma.
fn push_device_seq_prev(op: &OpRecord, out: &mut Vec<u8>) {
    write_serde_json(&*op.device_id, out);
    out.push(b',');
    write_serde_json(&op.seq, out);
    out.push(b',');
    match &op.prev {
        Some(prev) => push_op_id(prev, out),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
}

/// Appends the compact form of `op` (which [`has_compact_form`]), without a newline.
pub(super) fn write_compact(op: &OpRecord, out: &mut Vec<u8>) {
    debug_assert!(has_compact_form(op));
    out.extend_from_slice(b"[2,");
    push_op_id(&op.op_id, out);
    out.push(b',');
    write_serde_json(&op.hlc.wall_ms, out);
    out.push(b',');
    write_serde_json(&op.hlc.counter, out);
    out.push(b',');
    push_device_seq_prev(op, out);
    match (&op.surface, &op.payload.repr) {
        (Surface::Intent, PayloadRepr::Intent(intent)) => {
            out.extend_from_slice(b"0,");
            write_serde_json(intent.agent.as_str(), out);
            out.push(b',');
            write_serde_json(&intent.epoch, out);
            out.push(b',');
            intent.write_run_id(out);
            out.push(b',');
            write_serde_json(&status_code(intent.status), out);
        }
        (Surface::Intent, PayloadRepr::Json(_) | PayloadRepr::Sealed(_)) => {
            out.extend_from_slice(b"3,");
            op.payload.write_canonical_json(out);
        }
        (Surface::Sealed, _) => {
            // A sealed record with a sealed body is written in format 3; this one is malformed,
            // and goes as a payload that no reader takes for a sealed record.
            out.extend_from_slice(b"3,");
            op.payload.write_canonical_json(out);
        }
        (Surface::Log { kind } | Surface::Registry { kind }, _) => {
            let tag = if matches!(op.surface, Surface::Log { .. }) {
                TAG_LOG
            } else {
                TAG_REGISTRY
            };
            write_serde_json(&tag, out);
            out.push(b',');
            write_serde_json(&**kind, out);
            out.push(b',');
            op.payload.write_canonical_json(out);
        }
    }
    out.push(b']');
}

/// Decodes a compact line (already within the length limit). The ids' syntax is checked by the
/// caller.
/// `device`, when given, is the device the line is expected to belong to: a record of it shares
/// that allocation of the id.
pub(super) fn read_compact(bytes: &[u8], device: Option<&Arc<str>>) -> Result<OpRecord, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let op = deserializer.deserialize_seq(LineVisitor { device })?;
    deserializer.end()?;
    Ok(op)
}

/// A string, borrowed from the input when it has no escapes.
pub(super) struct Text<'de>(pub(super) Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

pub(super) fn op_id_of<E: de::Error>(text: &str, what: &str) -> Result<OpId, E> {
    let mut bytes = [0u8; 33];
    match URL_SAFE_NO_PAD.decode_slice(text.as_bytes(), &mut bytes) {
        Ok(32) if text.len() == OP_ID_TEXT_BYTES => {
            let mut id = [0u8; 32];
            id.copy_from_slice(&bytes[..32]);
            Ok(OpId(id))
        }
        _ => Err(E::custom(format_args!(
            "{what} is 43 characters of unpadded base64url; got {:?}",
            text.chars().take(80).collect::<String>()
        ))),
    }
}

struct LineVisitor<'a> {
    device: Option<&'a Arc<str>>,
}

impl LineVisitor<'_> {
    fn next<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
        seq: &mut A,
        index: usize,
        what: &str,
    ) -> Result<T, A::Error> {
        next_element(seq, index, what)
    }
}

/// The next element of a line, `what` at `index`: an error when the line ends before it.
pub(super) fn next_element<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
    index: usize,
    what: &str,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom(format_args!("the line ends at element {index}, before {what}")))
}

impl<'de> Visitor<'de> for LineVisitor<'_> {
    type Value = OpRecord;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(
            "a record in the compact form: [2, op_id, wall_ms, counter, device_id, seq, prev, tag, …] or [3, device_id, seq, prev, generation, content, head]",
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OpRecord, A::Error> {
        let format: u64 = Self::next(&mut seq, 0, "the format")?;
        if format == super::sealed_line::FORMAT_3 {
            return super::sealed_line::read_sealed_line_3(seq, self.device);
        }
        if format != FORMAT {
            return Err(de::Error::custom(format_args!(
                "record format {format} is not one this version of fencepost reads (the JSON object form, formats {FORMAT} and 3, and format 4, which starts \"4 \"); a newer fencepost may have written it"
            )));
        }
        let op_id: Text = Self::next(&mut seq, 1, "the op_id")?;
        let op_id = op_id_of(&op_id.0, "op_id")?;
        let wall_ms: u64 = Self::next(&mut seq, 2, "hlc.wall_ms")?;
        let counter: u32 = Self::next(&mut seq, 3, "hlc.counter")?;
        let device: Text = Self::next(&mut seq, 4, "the device_id")?;
        let device_id = device_id_sharing(&device.0, self.device);
        let seq_number: u64 = Self::next(&mut seq, 5, "the seq")?;
        let prev: Option<Text> = Self::next(&mut seq, 6, "prev")?;
        let prev = prev.map(|prev| op_id_of(&prev.0, "prev")).transpose()?;
        let tag: u8 = Self::next(&mut seq, 7, "the surface tag")?;
        let (surface, payload) = match tag {
            TAG_INTENT => {
                let agent: Text = Self::next(&mut seq, 8, "the intent's agent_id")?;
                let epoch: u64 = Self::next(&mut seq, 9, "the intent's epoch")?;
                let run: Text = Self::next(&mut seq, 10, "the intent's id")?;
                let status: u8 = Self::next(&mut seq, 11, "the intent's status")?;
                let Some(status) = status_of(status) else {
                    return Err(de::Error::custom(format_args!(
                        "intent status {status} is not 0 (pending), 1 (committed) or 2 (failed)"
                    )));
                };
                if agent.0.is_empty() || run.0.is_empty() || epoch > MAX_EPOCH {
                    return Err(de::Error::custom(
                        "tag 0 holds a well-formed intent: a non-empty agent_id and id, and an epoch of at most 2^63 - 1",
                    ));
                }
                let intent = CompactIntent {
                    run: RunKey::new(&run.0),
                    agent: CompactString::from(&*agent.0),
                    epoch,
                    status,
                };
                (
                    Surface::Intent,
                    Payload {
                        repr: PayloadRepr::Intent(intent),
                    },
                )
            }
            TAG_LOG | TAG_REGISTRY => {
                let kind: Text = Self::next(&mut seq, 8, "the surface's kind")?;
                let kind: Arc<str> = Arc::from(kind.0);
                let payload: Value = Self::next(&mut seq, 9, "the payload")?;
                let surface = if tag == TAG_LOG {
                    Surface::Log { kind }
                } else {
                    Surface::Registry { kind }
                };
                (surface, Payload::new(payload))
            }
            TAG_INTENT_JSON => {
                let payload: Value = Self::next(&mut seq, 8, "the payload")?;
                (Surface::Intent, Payload::new(payload))
            }
            other => {
                return Err(de::Error::custom(format_args!(
                    "surface tag {other} is not 0 (intent), 1 (log), 2 (registry) or 3 (intent, JSON payload)"
                )))
            }
        };
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "the line has more elements than its surface tag allows",
            ));
        }
        Ok(OpRecord {
            op_id,
            hlc: Hlc {
                wall_ms,
                counter,
                device_id: Arc::clone(&device_id),
            },
            device_id,
            seq: seq_number,
            prev,
            surface,
            payload,
        })
    }
}
