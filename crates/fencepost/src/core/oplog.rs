//! The hash-chained, per-device op log (rule O1).
//!
//! Each site (a *device*) appends [`OpRecord`]s to its own log with a [`DeviceLog`]. A record's
//! `op_id` is the SHA-256 of every other field, so changing any field of a record is detected; its
//! `seq` counts from 0 without gaps and its `prev` names the previous record's `op_id`, so a log
//! cannot be reordered, truncated in the middle or forked without [`verify_log`] noticing.
//!
//! # Wire form
//!
//! A record travels as one line of JSON (one line in a relay file, one row of a database relay).
//! Two forms are read; [`OpRecord::write_json_line`] writes the compact one. Both are stable.
//!
//! **The compact form** (format 2), a JSON array, about 180 bytes for an intent:
//!
//! ```json
//! [2,"<op_id>",1764400000000,0,"laptop",1,"<prev>",0,"milo",1,"run-…",1]
//! ```
//!
//! In order: the format number `2`; `op_id`; `hlc.wall_ms`; `hlc.counter`; `device_id` (which
//! is also `hlc.device_id`); `seq`; `prev` (`null` for `seq` 0); a surface tag; then the body:
//!
//! * tag `0`, an intent record whose payload is a well-formed intent: its `agent_id`, `epoch`,
//!   `id` (the run id) and `status` as a number (`0` pending, `1` committed, `2` failed);
//! * tag `1`, a grow-only log: its kind, then the payload;
//! * tag `2`, a registry: its kind, then the payload;
//! * tag `3`, an intent record whose payload is not a well-formed intent: the payload.
//!
//! Op ids are their 32 bytes in unpadded base64url (43 characters); payloads are canonical JSON.
//! An array of any other length or format number is refused (a newer format is named as such).
//!
//! **The JSON object form**, written by earlier versions and still read:
//!
//! ```json
//! {"op_id":"<64 lowercase hex>",
//!  "hlc":{"wall_ms":1764400000000,"counter":0,"device_id":"laptop"},
//!  "device_id":"laptop",
//!  "seq":0,
//!  "prev":null,
//!  "surface":"intent",
//!  "payload":{"agent_id":"milo","epoch":1,"id":"run-…","status":"pending"}}
//! ```
//!
//! * `prev` is `null` for `seq` 0, else the previous record's `op_id`.
//! * `surface` is `"intent"`, `{"log":{"kind":"…"}}` or `{"registry":{"kind":"…"}}`.
//! * Unknown fields are refused.
//!
//! `OpRecord`'s `serde` implementation is the object form (what `--json` output shows). A record
//! whose `hlc.device_id` differs from its `device_id` (which no log makes, and every verifier
//! refuses) is written in the object form. Both forms of a record have the same `op_id`, which is
//! computed from the content, not from either text.
//!
//! # How `op_id` is computed
//!
//! SHA-256 over, in order: the bytes `fencepost/op/v1` and a 0 byte; `hlc.wall_ms` (8 bytes,
//! big-endian); `hlc.counter` (4 bytes, big-endian); `hlc.device_id` and then `device_id`, each as an
//! 8-byte big-endian length followed by its UTF-8; `seq` (8 bytes, big-endian); `prev` as a 0 byte,
//! or a 1 byte followed by its 32 bytes; the surface as a tag byte (0 intent, 1 log, 2 registry)
//! followed, for log and registry, by the kind as length and UTF-8; and last the payload's
//! *canonical JSON*: no white space, object keys sorted by their UTF-8 bytes, strings and numbers as
//! `serde_json` writes them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use compact_str::CompactString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::core::clock::{ClockError, Hlc, HlcClock, HlcConfig, WallClock};
use crate::id::{validate_id, IdError, IdKind};
use crate::intent::{
    Intent, IntentFields, IntentStatus, INTENT_FIELD_AGENT, INTENT_FIELD_EPOCH, INTENT_FIELD_ID,
    INTENT_FIELD_STATUS,
};
use crate::run_id::RunKey;

mod line;

/// The deepest nesting of arrays and objects a record's payload may have (`{"a":[1]}` is 2 deep).
/// Well below the JSON reader's own recursion limit, so a record within it can always be read
/// back.
pub const MAX_PAYLOAD_DEPTH: usize = 64;

/// The largest payload, in bytes of its canonical JSON (the form hashed into `op_id`, as long as
/// its wire form).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The longest kind of a [`Surface::Log`] or [`Surface::Registry`], in bytes (the limit of ids).
pub const MAX_SURFACE_KIND_BYTES: usize = crate::id::MAX_ID_BYTES;

/// The longest wire form of a record (one line, without its newline) that a reader accepts. Every
/// record within [`MAX_PAYLOAD_DEPTH`], [`MAX_PAYLOAD_BYTES`], [`MAX_SURFACE_KIND_BYTES`] and the
/// id limits encodes to fewer bytes, so whatever a log accepts, every reader can read back.
pub const MAX_RECORD_BYTES: usize = MAX_PAYLOAD_BYTES + 16 * 1024;

/// The content-derived identity of an [`OpRecord`]: a SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub [u8; 32]);

impl OpId {
    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::with_capacity(64);
        crate::hex::push_lower_hex(&mut text, &self.0);
        formatter.write_str(&text)
    }
}

impl fmt::Debug for OpId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "OpId({self})")
    }
}

/// An op id's text was not 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("an op id is 64 lowercase hex digits; got {0:?}")]
pub struct ParseOpIdError(String);

impl FromStr for OpId {
    type Err = ParseOpIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        crate::hex::decode_lower_hex::<32>(text)
            .map(OpId)
            .ok_or_else(|| ParseOpIdError(text.chars().take(80).collect()))
    }
}

impl Serialize for OpId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OpId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// How the records of a surface combine when logs are folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FoldTier {
    /// Every record is kept: the union of all records, by their stable id.
    GrowOnly,
    /// Per key, the record with the greatest HLC wins (last writer wins).
    Registry,
    /// Execution intents, folded under the fencing rules F4–F7.
    Leased,
}

/// What a record is about; decides how it folds ([`Surface::fold_tier`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Surface {
    /// An execution intent (`pending`, `committed`, `failed`), folded under the fencing rules.
    Intent,
    /// A grow-only log of records of one `kind` (for example `"note"`).
    Log {
        /// Which log.
        kind: Arc<str>,
    },
    /// A last-writer-wins registry of one `kind` (for example `"setting"`).
    Registry {
        /// Which registry.
        kind: Arc<str>,
    },
}

impl Surface {
    /// A grow-only log surface.
    pub fn log(kind: impl Into<Arc<str>>) -> Self {
        Surface::Log { kind: kind.into() }
    }

    /// A last-writer-wins registry surface.
    pub fn registry(kind: impl Into<Arc<str>>) -> Self {
        Surface::Registry { kind: kind.into() }
    }

    /// How records of this surface fold.
    pub fn fold_tier(&self) -> FoldTier {
        match self {
            Surface::Intent => FoldTier::Leased,
            Surface::Log { .. } => FoldTier::GrowOnly,
            Surface::Registry { .. } => FoldTier::Registry,
        }
    }
}

/// The JSON content of a record.
///
/// Read it with [`Payload::value`]. In memory, a well-formed intent payload (exactly the four
/// intent fields, see [`Intent::from_payload`]) is kept in a compact typed form, parsed once; every
/// other payload is kept as its JSON value. Both forms have the same canonical JSON, wire form and
/// `op_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    repr: PayloadRepr,
}

#[derive(Debug, Clone, PartialEq)]
enum PayloadRepr {
    Intent(CompactIntent),
    Json(Value),
}

/// A well-formed intent payload, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompactIntent {
    pub(crate) run: RunKey,
    pub(crate) agent: CompactString,
    pub(crate) epoch: u64,
    pub(crate) status: IntentStatus,
}

impl CompactIntent {
    /// Appends the run id as a JSON string.
    fn write_run_id(&self, out: &mut Vec<u8>) {
        match &self.run {
            RunKey::Hashed(bytes) => {
                out.push(b'"');
                out.extend_from_slice(&RunKey::hashed_text(bytes));
                out.push(b'"');
            }
            RunKey::Text(text) => write_serde_json(&**text, out),
        }
    }

    /// The compact form of `value`, if it is an object of exactly the four intent fields.
    fn from_value(value: &Value) -> Option<Self> {
        let object = value.as_object()?;
        if object.len() != 4 {
            return None;
        }
        Self::from_fields(value)
    }

    /// The compact form of any well-formed intent payload (other keys ignored).
    fn from_fields(value: &Value) -> Option<Self> {
        let fields = IntentFields::read(value)?;
        Some(Self {
            run: RunKey::new(fields.run_id),
            agent: CompactString::from(fields.agent_id),
            epoch: fields.epoch,
            status: fields.status,
        })
    }
}

impl Payload {
    /// Wraps a JSON value.
    pub fn new(value: Value) -> Self {
        let repr = match CompactIntent::from_value(&value) {
            Some(intent) => PayloadRepr::Intent(intent),
            None => PayloadRepr::Json(value),
        };
        Self { repr }
    }

    /// The JSON value (built on the fly for the compact intent form).
    pub fn value(&self) -> Cow<'_, Value> {
        match &self.repr {
            PayloadRepr::Json(value) => Cow::Borrowed(value),
            PayloadRepr::Intent(intent) => Cow::Owned(json!({
                INTENT_FIELD_AGENT: intent.agent.as_str(),
                INTENT_FIELD_EPOCH: intent.epoch,
                INTENT_FIELD_ID: intent.run.to_string(),
                INTENT_FIELD_STATUS: intent.status.as_str(),
            })),
        }
    }

    /// Consumes the payload, returning its JSON value.
    pub fn into_value(self) -> Value {
        match self.repr {
            PayloadRepr::Json(value) => value,
            PayloadRepr::Intent(_) => self.value().into_owned(),
        }
    }

    /// The intent in this payload, if it is a well-formed one ([`Intent::from_payload`]).
    pub fn intent(&self) -> Option<Intent> {
        match &self.repr {
            PayloadRepr::Intent(intent) => Some(Intent::new(
                intent.agent.as_str(),
                intent.run.to_string(),
                intent.epoch,
                intent.status,
            )),
            PayloadRepr::Json(value) => Intent::from_payload(value),
        }
    }

    /// The intent in compact form, without allocating when the payload is already compact.
    #[inline]
    pub(crate) fn compact_intent(&self) -> Option<Cow<'_, CompactIntent>> {
        match &self.repr {
            PayloadRepr::Intent(intent) => Some(Cow::Borrowed(intent)),
            PayloadRepr::Json(value) => CompactIntent::from_fields(value).map(Cow::Owned),
        }
    }

    /// Appends the canonical JSON of this payload (the form hashed into `op_id`) to `out`.
    pub fn write_canonical_json(&self, out: &mut Vec<u8>) {
        match &self.repr {
            PayloadRepr::Json(value) => write_canonical_json(value, out),
            PayloadRepr::Intent(intent) => {
                // The keys in byte order: agent_id < epoch < id < status.
                out.extend_from_slice(b"{\"agent_id\":");
                write_serde_json(intent.agent.as_str(), out);
                out.extend_from_slice(b",\"epoch\":");
                write_serde_json(&intent.epoch, out);
                out.extend_from_slice(b",\"id\":");
                intent.write_run_id(out);
                out.extend_from_slice(b",\"status\":\"");
                out.extend_from_slice(intent.status.as_str().as_bytes());
                out.extend_from_slice(b"\"}");
            }
        }
    }
}

impl From<Value> for Payload {
    fn from(value: Value) -> Self {
        Self::new(value)
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.repr {
            PayloadRepr::Json(value) => value.serialize(serializer),
            PayloadRepr::Intent(intent) => {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(Some(4))?;
                map.serialize_entry(INTENT_FIELD_AGENT, intent.agent.as_str())?;
                map.serialize_entry(INTENT_FIELD_EPOCH, &intent.epoch)?;
                map.serialize_entry(INTENT_FIELD_ID, &format_args!("{}", intent.run))?;
                map.serialize_entry(INTENT_FIELD_STATUS, intent.status.as_str())?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Payload::new)
    }
}

/// Writes `value` as canonical JSON: compact, object keys in byte order.
fn write_canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            out.push(b'{');
            // serde_json keeps keys sorted unless its `preserve_order` feature is on; stay canonical
            // either way, without sorting (or allocating) in the usual case.
            if map.keys().is_sorted() {
                write_canonical_entries(map.iter(), out);
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                write_canonical_entries(entries.into_iter(), out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_canonical_json(item, out);
            }
            out.push(b']');
        }
        scalar => write_serde_json(scalar, out),
    }
}

fn write_canonical_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (index, (key, item)) in entries.enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_serde_json(key.as_str(), out);
        out.push(b':');
        write_canonical_json(item, out);
    }
}

/// Writes a string or a scalar with serde_json's own escaping and number formatting.
fn write_serde_json<T: Serialize + ?Sized>(item: &T, out: &mut Vec<u8>) {
    let written = serde_json::to_writer(&mut *out, item);
    // Writing a string or a scalar JSON value into a Vec cannot fail: no I/O, no map keys.
    debug_assert!(written.is_ok());
}

/// One entry of a device's op log.
///
/// Fields are public so that tools can inspect them; a record whose fields were changed after it
/// was made no longer has a matching [`OpRecord::content_id`], and every verifier refuses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpRecord {
    /// SHA-256 of every other field (see the module docs).
    pub op_id: OpId,
    /// When the device recorded it, as a hybrid logical clock stamp.
    pub hlc: Hlc,
    /// The device whose log this record belongs to.
    pub device_id: Arc<str>,
    /// Position in the device's log, from 0, without gaps.
    pub seq: u64,
    /// The `op_id` of the record at `seq - 1`; `None` for `seq` 0.
    pub prev: Option<OpId>,
    /// What the record is about.
    pub surface: Surface,
    /// Its content.
    pub payload: Payload,
}

impl OpRecord {
    /// The `op_id` this record's other fields hash to.
    ///
    /// Computes it whatever the record's size; [`LogHead`] and [`DeviceLog`] check the record
    /// limits first ([`checked_content_id`](Self::checked_content_id)).
    pub fn content_id(&self) -> OpId {
        let mut preimage = Vec::with_capacity(256);
        self.write_header(&mut preimage);
        self.payload.write_canonical_json(&mut preimage);
        OpId(Sha256::digest(&preimage).into())
    }

    /// Checks the record limits ([`MAX_PAYLOAD_DEPTH`], [`MAX_PAYLOAD_BYTES`],
    /// [`MAX_SURFACE_KIND_BYTES`]) and returns the `op_id` the content hashes to.
    ///
    /// # Errors
    /// [`LogError::OverLimit`], saying which limit.
    pub fn checked_content_id(&self) -> Result<OpId, LogError> {
        let over = |detail: String| LogError::OverLimit {
            device_id: self.device_id.to_string(),
            seq: self.seq,
            detail,
        };
        if let Surface::Log { kind } | Surface::Registry { kind } = &self.surface {
            if kind.len() > MAX_SURFACE_KIND_BYTES {
                return Err(over(format!(
                    "its surface kind is {} bytes long; the limit is {MAX_SURFACE_KIND_BYTES}",
                    kind.len()
                )));
            }
        }
        if let PayloadRepr::Json(value) = &self.payload.repr {
            if exceeds_depth(value, MAX_PAYLOAD_DEPTH) {
                return Err(over(format!(
                    "its payload nests arrays and objects more than {MAX_PAYLOAD_DEPTH} deep"
                )));
            }
        }
        let mut preimage = Vec::with_capacity(256);
        self.write_header(&mut preimage);
        let header_bytes = preimage.len();
        self.payload.write_canonical_json(&mut preimage);
        let payload_bytes = preimage.len() - header_bytes;
        if payload_bytes > MAX_PAYLOAD_BYTES {
            return Err(over(format!(
                "its payload is {payload_bytes} bytes long; the limit is {MAX_PAYLOAD_BYTES}"
            )));
        }
        Ok(OpId(Sha256::digest(&preimage).into()))
    }

    /// Checks the record limits and that `op_id` is what the content hashes to
    /// ([`LogError::OverLimit`], [`LogError::BadId`]).
    pub(crate) fn check_id(&self) -> Result<(), LogError> {
        let expected = self.checked_content_id()?;
        if expected != self.op_id {
            return Err(LogError::BadId {
                device_id: self.device_id.to_string(),
                seq: self.seq,
                found: self.op_id,
                expected,
            });
        }
        Ok(())
    }

    /// Appends what `op_id` hashes before the payload's canonical JSON (see the module docs), so
    /// that the whole is hashed in one call.
    fn write_header(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"fencepost/op/v1\0");
        out.extend_from_slice(&self.hlc.wall_ms.to_be_bytes());
        out.extend_from_slice(&self.hlc.counter.to_be_bytes());
        push_text(out, &self.hlc.device_id);
        push_text(out, &self.device_id);
        out.extend_from_slice(&self.seq.to_be_bytes());
        match &self.prev {
            None => out.push(0),
            Some(prev) => {
                out.push(1);
                out.extend_from_slice(&prev.0);
            }
        }
        match &self.surface {
            Surface::Intent => out.push(0),
            Surface::Log { kind } => {
                out.push(1);
                push_text(out, kind);
            }
            Surface::Registry { kind } => {
                out.push(2);
                push_text(out, kind);
            }
        }
    }

    /// Whether `op_id` matches the content.
    pub fn has_valid_id(&self) -> bool {
        self.op_id == self.content_id()
    }

    /// Appends the wire form (the compact form, see the [module docs](self#wire-form)) and a
    /// newline to `out`.
    pub fn write_json_line(&self, out: &mut Vec<u8>) {
        if line::has_compact_form(self) {
            line::write_compact(self, out);
        } else {
            let written = serde_json::to_writer(&mut *out, self);
            // Serializing a record cannot fail: every field is a string, a number or a JSON value.
            debug_assert!(written.is_ok());
        }
        out.push(b'\n');
    }

    /// Decodes either wire form (see the [module docs](self#wire-form)): the compact form when
    /// the line starts with `[`, else the JSON object form. Checks the length
    /// ([`MAX_RECORD_BYTES`]), the shape and the ids' syntax (L8); does *not* check that `op_id`
    /// matches the content, nor the payload limits: [`LogHead`] and [`verify_log`] do that.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::from_json_sharing(bytes, None)
    }

    /// [`from_json`](Self::from_json) of a line expected to belong to `device`: a record of it
    /// shares that allocation of the device id.
    pub(crate) fn from_json_sharing(bytes: &[u8], device: Option<&Arc<str>>) -> Result<Self, DecodeError> {
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(DecodeError::TooLong {
                length_bytes: bytes.len(),
                max_bytes: MAX_RECORD_BYTES,
            });
        }
        let compact = bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'[');
        let decoded = if compact {
            line::read_compact(bytes, device)
        } else {
            serde_json::from_slice(bytes)
        };
        let record: OpRecord = decoded.map_err(|error| DecodeError::Json(error.to_string()))?;
        // The expected device's id was checked when it was first read.
        for id in [&record.device_id, &record.hlc.device_id] {
            if !device.is_some_and(|device| Arc::ptr_eq(id, device)) {
                validate_id(IdKind::Device, id)?;
            }
        }
        Ok(record)
    }
}

/// Whether `value` nests arrays and objects more than `limit` deep (a scalar is 0 deep). Stops
/// descending at the limit, so it is safe on a value of any depth.
fn exceeds_depth(value: &Value, limit: usize) -> bool {
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(map) => Box::new(map.values()),
        _ => return false,
    };
    if limit == 0 {
        return true;
    }
    let mut children = children;
    children.any(|child| exceeds_depth(child, limit - 1))
}

/// Appends `text` as its length (8 bytes, big-endian) and its UTF-8.
fn push_text(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// A record's wire form could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Not JSON, or not the shape of a record.
    #[error("not a valid op record: {0}")]
    Json(String),
    /// A device id in the record breaks rule L8.
    #[error("op record has an invalid device id: {0}")]
    Id(#[from] IdError),
    /// The line is longer than [`MAX_RECORD_BYTES`]: no log makes such a record.
    #[error("op record is {length_bytes} bytes long; the limit is {max_bytes}")]
    TooLong {
        /// Its length.
        length_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
}

/// A defect found while checking a device's log (rule O1).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LogError {
    /// The record breaks a record limit ([`MAX_PAYLOAD_DEPTH`], [`MAX_PAYLOAD_BYTES`],
    /// [`MAX_SURFACE_KIND_BYTES`]): no log makes it, and a log refuses to append it.
    #[error("device {device_id:?} seq {seq}: the record is over a limit: {detail}")]
    OverLimit {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// Which limit, and by how much.
        detail: String,
    },
    /// The record's `op_id` does not match its content: it was altered, or damaged.
    #[error("device {device_id:?} seq {seq}: op_id {found} does not match the record's content (which hashes to {expected})")]
    BadId {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// The op_id the record carries.
        found: OpId,
        /// The op_id its content hashes to.
        expected: OpId,
    },
    /// The record's seq skips ahead of the next expected one.
    #[error("device {device_id:?}: expected seq {expected}, found seq {found} (a gap)")]
    SeqGap {
        /// The device.
        device_id: String,
        /// The next seq the log expected.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// The record's seq is behind the next expected one (its predecessor is not at hand to tell a
    /// duplicate from a fork).
    #[error("device {device_id:?}: expected seq {expected}, found seq {found} again")]
    SeqRepeated {
        /// The device.
        device_id: String,
        /// The next seq the log expected.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// Two different records claim the same seq of one device.
    #[error("device {device_id:?} seq {seq}: two different records ({existing} and {conflicting}); the log has forked")]
    Fork {
        /// The device.
        device_id: String,
        /// The contested seq.
        seq: u64,
        /// The record already in the log.
        existing: OpId,
        /// The other one.
        conflicting: OpId,
    },
    /// The same record appears twice.
    #[error("device {device_id:?} seq {seq}: the record {op_id} appears twice")]
    Duplicate {
        /// The device.
        device_id: String,
        /// Its seq.
        seq: u64,
        /// Its op_id.
        op_id: OpId,
    },
    /// `prev` does not name the previous record.
    #[error("device {device_id:?} seq {seq}: prev is {found:?}, but the previous record is {expected:?}")]
    PrevMismatch {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// The previous record's op_id (`None` before seq 0).
        expected: Option<OpId>,
        /// The prev the record carries.
        found: Option<OpId>,
    },
    /// A record of another device, or whose HLC stamp names another device.
    #[error("seq {seq}: expected device {expected:?}, found {found:?}")]
    DeviceMismatch {
        /// The record's seq.
        seq: u64,
        /// The log's device.
        expected: String,
        /// The device found (in `device_id` or in `hlc.device_id`).
        found: String,
    },
    /// The record's HLC stamp is not after the previous record's.
    #[error(
        "device {device_id:?} seq {seq}: HLC stamp {found:?} is not after the previous record's {previous:?}"
    )]
    NonIncreasingHlc {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// The previous record's stamp.
        previous: Hlc,
        /// This record's stamp.
        found: Hlc,
    },
    /// The device id breaks rule L8.
    #[error(transparent)]
    InvalidDeviceId(#[from] IdError),
    /// The log's last record carries the largest HLC stamp there is, so no record can follow it
    /// (a forged or damaged record; move the device to a new id, or repair the file).
    #[error("device {device_id:?} seq {seq} ({op_id}): its HLC stamp {hlc:?} is the largest there is, so no record can follow it; repair that record or give this host a new --device id")]
    HlcExhausted {
        /// The device.
        device_id: String,
        /// The last record's seq.
        seq: u64,
        /// The last record's op_id.
        op_id: OpId,
        /// Its stamp.
        hlc: Hlc,
    },
}

/// A [`LogHead`] as a stored value: the device, the next seq, and the last record's id and HLC
/// stamp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadMark {
    pub(crate) device_id: String,
    pub(crate) next_seq: u64,
    pub(crate) last: Option<(OpId, u64, u32)>,
}

/// The end of a verified log prefix of one device: what the next record must continue.
///
/// Used to check records one at a time (relays, [`verify_log`], [`DeviceLog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHead {
    device_id: Arc<str>,
    next_seq: u64,
    last_op_id: Option<OpId>,
    last_hlc: Option<Hlc>,
}

impl LogHead {
    /// The head of an empty log of `device_id`.
    pub fn new(device_id: impl Into<Arc<str>>) -> Self {
        Self {
            device_id: device_id.into(),
            next_seq: 0,
            last_op_id: None,
            last_hlc: None,
        }
    }

    /// The head of a log whose records before `next_seq` are not at hand (a relay's file that
    /// begins after a checkpoint, see [`Relay::prune`](crate::relay::Relay::prune)), known only by
    /// the last one's id: the next record must have seq `next_seq` and name `last_op_id`; its
    /// stamp is not compared with the unknown one before it.
    pub(crate) fn after(device_id: impl Into<Arc<str>>, next_seq: u64, last_op_id: OpId) -> Self {
        Self {
            device_id: device_id.into(),
            next_seq,
            last_op_id: Some(last_op_id),
            last_hlc: None,
        }
    }

    /// The device.
    pub fn device_id(&self) -> &Arc<str> {
        &self.device_id
    }

    /// The head as a value to store (a snapshot, a relay's cursor): [`from_mark`](Self::from_mark)
    /// gives it back.
    pub(crate) fn mark(&self) -> HeadMark {
        HeadMark {
            device_id: self.device_id.to_string(),
            next_seq: self.next_seq,
            last: self
                .last_op_id
                .zip(self.last_hlc.as_ref())
                .map(|(op_id, hlc)| (op_id, hlc.wall_ms, hlc.counter)),
        }
    }

    /// The head a [`mark`](Self::mark) stands for; `None` when the mark is not one a head makes
    /// (read from a damaged store).
    pub(crate) fn from_mark(mark: &HeadMark) -> Option<Self> {
        crate::id::validate_id(crate::id::IdKind::Device, &mark.device_id).ok()?;
        let device_id: Arc<str> = Arc::from(mark.device_id.as_str());
        match (mark.next_seq, mark.last) {
            (0, None) => Some(Self::new(device_id)),
            (1.., Some((op_id, wall_ms, counter))) => Some(Self {
                last_hlc: Some(Hlc {
                    wall_ms,
                    counter,
                    device_id: Arc::clone(&device_id),
                }),
                device_id,
                next_seq: mark.next_seq,
                last_op_id: Some(op_id),
            }),
            _ => None,
        }
    }

    /// The seq the next record must have (the number of records so far).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The `op_id` of the last record, if any.
    pub fn last_op_id(&self) -> Option<OpId> {
        self.last_op_id
    }

    /// The HLC stamp of the last record, if any.
    pub fn last_hlc(&self) -> Option<&Hlc> {
        self.last_hlc.as_ref()
    }

    /// Checks that `op` belongs to this device, is within the record limits, and that its `op_id`
    /// matches its content, whatever its seq.
    pub fn check_identity(&self, op: &OpRecord) -> Result<(), LogError> {
        self.check_device(op)?;
        op.check_id()
    }

    /// Checks that `op` and its stamp name this log's device.
    pub(crate) fn check_device(&self, op: &OpRecord) -> Result<(), LogError> {
        for found in [&op.device_id, &op.hlc.device_id] {
            if **found != *self.device_id {
                return Err(LogError::DeviceMismatch {
                    seq: op.seq,
                    expected: self.device_id.to_string(),
                    found: found.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Checks that `op` is a valid next record: right device, matching `op_id`, the next seq, a
    /// `prev` naming the last record, and an HLC stamp after the last one.
    pub fn check_next(&self, op: &OpRecord) -> Result<(), LogError> {
        self.check_identity(op)?;
        self.check_order(op)
    }

    /// [`accept`](Self::accept) for a record whose identity (its `op_id` over its content, within
    /// the limits) a relay has checked already: checks the device, the seq, the chain and the HLC
    /// order, and moves past it.
    pub(crate) fn accept_identified(&mut self, op: &OpRecord) -> Result<(), LogError> {
        self.check_device(op)?;
        self.check_order(op)?;
        self.advance_unchecked(op);
        Ok(())
    }

    /// The seq, `prev` and HLC order of `op` as this log's next record.
    fn check_order(&self, op: &OpRecord) -> Result<(), LogError> {
        let device_id = || self.device_id.to_string();
        if op.seq > self.next_seq {
            return Err(LogError::SeqGap {
                device_id: device_id(),
                expected: self.next_seq,
                found: op.seq,
            });
        }
        if op.seq < self.next_seq {
            return Err(LogError::SeqRepeated {
                device_id: device_id(),
                expected: self.next_seq,
                found: op.seq,
            });
        }
        if op.prev != self.last_op_id {
            return Err(LogError::PrevMismatch {
                device_id: device_id(),
                seq: op.seq,
                expected: self.last_op_id,
                found: op.prev,
            });
        }
        if let Some(previous) = &self.last_hlc {
            if op.hlc <= *previous {
                return Err(LogError::NonIncreasingHlc {
                    device_id: device_id(),
                    seq: op.seq,
                    previous: previous.clone(),
                    found: op.hlc.clone(),
                });
            }
        }
        Ok(())
    }

    /// Checks `op` with [`check_next`](Self::check_next) and, if it passes, moves past it.
    pub fn accept(&mut self, op: &OpRecord) -> Result<(), LogError> {
        self.check_next(op)?;
        self.advance_unchecked(op);
        Ok(())
    }

    /// Moves past `op` without checking it; for records this process has just made or checked.
    pub(crate) fn advance_unchecked(&mut self, op: &OpRecord) {
        self.next_seq = op.seq + 1;
        self.last_op_id = Some(op.op_id);
        self.last_hlc = Some(op.hlc.clone());
    }
}

/// Checks a whole device log, from seq 0, in order (rule O1): one device, matching op ids,
/// contiguous seqs, an unbroken `prev` chain and strictly increasing HLC stamps. Returns the first
/// defect found. An empty log is valid.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::oplog::{verify_log, DeviceLog, LogError, Surface};
/// use serde_json::json;
///
/// let mut log = DeviceLog::new("laptop", ManualClock::new(1).wall_clock()).unwrap();
/// let mut ops = vec![
///     log.append(Surface::log("note"), json!({"text": "a"})),
///     log.append(Surface::log("note"), json!({"text": "b"})),
/// ];
/// assert!(verify_log(&ops).is_ok());
/// ops.remove(0);
/// assert!(matches!(verify_log(&ops), Err(LogError::SeqGap { .. })));
/// ```
pub fn verify_log(ops: &[OpRecord]) -> Result<(), LogError> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    validate_id(IdKind::Device, &first.device_id)?;
    let mut head = LogHead::new(Arc::clone(&first.device_id));
    for op in ops {
        head.check_identity(op)?;
        if op.seq < head.next_seq() {
            // Ops before `op` were accepted in order from seq 0, so index == seq.
            let existing = &ops[op.seq as usize];
            return Err(if existing.op_id == op.op_id {
                LogError::Duplicate {
                    device_id: head.device_id().to_string(),
                    seq: op.seq,
                    op_id: op.op_id,
                }
            } else {
                LogError::Fork {
                    device_id: head.device_id().to_string(),
                    seq: op.seq,
                    existing: existing.op_id,
                    conflicting: op.op_id,
                }
            });
        }
        head.accept(op)?;
    }
    Ok(())
}

/// The writer of one device's log: stamps, numbers and chains each new record.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::oplog::{DeviceLog, Surface};
/// use serde_json::json;
///
/// let mut log = DeviceLog::new("laptop", ManualClock::new(1_000).wall_clock()).unwrap();
/// let first = log.append(Surface::log("note"), json!({"text": "hello"}));
/// let second = log.append(Surface::registry("setting"), json!({"key": "tz", "value": "UTC"}));
/// assert_eq!((first.seq, second.seq), (0, 1));
/// assert_eq!(second.prev, Some(first.op_id));
/// assert!(second.hlc > first.hlc);
/// ```
#[derive(Debug, Clone)]
pub struct DeviceLog {
    clock: HlcClock,
    head: LogHead,
}

impl DeviceLog {
    /// A new, empty log for `device_id`, stamping with `wall_clock` and the default
    /// [`HlcConfig`]. Fails if the id breaks rule L8.
    pub fn new(device_id: &str, wall_clock: WallClock) -> Result<Self, IdError> {
        Self::with_config(device_id, wall_clock, HlcConfig::default())
    }

    /// A new, empty log with an explicit clock configuration.
    pub fn with_config(device_id: &str, wall_clock: WallClock, config: HlcConfig) -> Result<Self, IdError> {
        validate_id(IdKind::Device, device_id)?;
        let device_id: Arc<str> = Arc::from(device_id);
        Ok(Self {
            clock: HlcClock::new(Arc::clone(&device_id), wall_clock, config),
            head: LogHead::new(device_id),
        })
    }

    /// Continues the log `ops` of `device_id` (for example after a restart), after checking it
    /// with [`verify_log`]. The next record follows the last one in seq, chain and HLC.
    pub fn resume(
        device_id: &str,
        wall_clock: WallClock,
        config: HlcConfig,
        ops: &[OpRecord],
    ) -> Result<Self, LogError> {
        validate_id(IdKind::Device, device_id)?;
        let device_id: Arc<str> = Arc::from(device_id);
        let mut head = LogHead::new(Arc::clone(&device_id));
        if let Some(first) = ops.first() {
            head.check_identity(first)?;
        }
        verify_log(ops)?;
        let clock = match ops.last() {
            Some(last) => {
                head.advance_unchecked(last);
                HlcClock::resume(device_id, wall_clock, config, &last.hlc)
            }
            None => HlcClock::new(device_id, wall_clock, config),
        };
        Ok(Self { clock, head })
    }

    /// Continues after `head`, the end of a log a relay has checked (its records are not at
    /// hand): the next record follows it in seq, chain and HLC.
    pub(crate) fn continue_after(wall_clock: WallClock, config: HlcConfig, head: LogHead) -> Self {
        let device_id = Arc::clone(head.device_id());
        let clock = match head.last_hlc() {
            Some(last) => HlcClock::resume(device_id, wall_clock, config, last),
            None => HlcClock::new(device_id, wall_clock, config),
        };
        Self { clock, head }
    }

    /// Appends a record and returns it; the caller stores and relays it.
    ///
    /// # Panics
    /// If the payload breaks a record limit ([`MAX_PAYLOAD_DEPTH`], [`MAX_PAYLOAD_BYTES`],
    /// [`MAX_SURFACE_KIND_BYTES`]), or the HLC is exhausted. [`try_append`](Self::try_append)
    /// returns an error instead: use it for payloads you did not make, and on a log resumed from
    /// records you did not make.
    pub fn append(&mut self, surface: Surface, payload: Value) -> OpRecord {
        self.try_append(surface, payload)
            .expect("a record over a limit, or an exhausted HLC")
    }

    /// Appends a record and returns it; the caller stores and relays it.
    ///
    /// # Errors
    /// [`LogError::OverLimit`] when the record would break a record limit, so that no reader could
    /// read it back; [`LogError::HlcExhausted`] when the last record carries the largest HLC stamp
    /// there is. Nothing is appended.
    pub fn try_append(&mut self, surface: Surface, payload: Value) -> Result<OpRecord, LogError> {
        let Some(hlc) = self.clock.try_tick() else {
            return Err(LogError::HlcExhausted {
                device_id: self.head.device_id().to_string(),
                seq: self.head.next_seq().saturating_sub(1),
                op_id: self.head.last_op_id().unwrap_or(OpId([0; 32])),
                hlc: self.head.last_hlc().cloned().unwrap_or(Hlc {
                    wall_ms: u64::MAX,
                    counter: u32::MAX,
                    device_id: Arc::clone(self.head.device_id()),
                }),
            });
        };
        let mut op = OpRecord {
            op_id: OpId([0; 32]),
            hlc,
            device_id: Arc::clone(self.head.device_id()),
            seq: self.head.next_seq(),
            prev: self.head.last_op_id(),
            surface,
            payload: Payload::new(payload),
        };
        op.op_id = op.checked_content_id()?;
        debug_assert_eq!(self.head.check_next(&op), Ok(()));
        self.head.advance_unchecked(&op);
        Ok(op)
    }

    /// Continues past `ops`, records of this device that another writer (another process with the
    /// same device id) appended after this log's head: each must be the valid next record, and the
    /// clock moves past their stamps, so the next record follows them in seq, chain and HLC.
    ///
    /// # Errors
    /// The first record that does not continue the log; the log is unchanged up to it.
    pub fn catch_up(&mut self, ops: &[OpRecord]) -> Result<(), LogError> {
        for op in ops {
            self.head.accept(op)?;
            self.clock.observe_own(&op.hlc);
        }
        Ok(())
    }

    /// Merges a peer's HLC stamp so that this log's next records are stamped after it (see
    /// [`HlcClock::observe`]).
    pub fn observe(&mut self, remote: &Hlc) -> Result<(), ClockError> {
        self.clock.observe(remote)
    }

    /// The device.
    pub fn device_id(&self) -> &str {
        self.head.device_id()
    }

    /// The end of the log so far.
    pub fn head(&self) -> &LogHead {
        &self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// O1, F1: a well-formed intent kept in compact form has exactly the canonical JSON, wire
        /// form and value of the same payload kept as JSON.
        #[test]
        fn o1_compact_intents_encode_exactly_like_their_json(
            run in prop_oneof!["run-[0-9a-f]{32}", "run-[0-9a-fA-F]{30,34}", "\\PC{1,20}"],
            agent in "\\PC{1,20}",
            epoch in 0..=crate::intent::MAX_EPOCH,
            status in 0..3usize,
        ) {
            let status = ["pending", "committed", "failed"][status];
            let value = json!({"id": run, "agent_id": agent, "epoch": epoch, "status": status});
            let compact = Payload::new(value.clone());
            prop_assert!(matches!(compact.repr, PayloadRepr::Intent(_)));
            let plain = Payload { repr: PayloadRepr::Json(value.clone()) };
            let (mut compact_bytes, mut plain_bytes) = (Vec::new(), Vec::new());
            compact.write_canonical_json(&mut compact_bytes);
            plain.write_canonical_json(&mut plain_bytes);
            prop_assert_eq!(&compact_bytes, &plain_bytes);
            prop_assert_eq!(serde_json::to_vec(&compact).unwrap(), serde_json::to_vec(&plain).unwrap());
            prop_assert_eq!(compact.value().into_owned(), value);
        }
    }

    #[test]
    fn o1_payloads_that_are_not_exactly_an_intent_stay_json() {
        for value in [
            json!({"id": "run-1", "agent_id": "milo", "epoch": 1, "status": "pending", "extra": 1}),
            json!({"id": "run-1", "agent_id": "milo", "epoch": 1.0, "status": "pending"}),
            json!({"id": "run-1", "agent_id": "milo", "epoch": 1, "status": "other"}),
            json!({"id": "run-1", "agent_id": "milo", "epoch": u64::MAX, "status": "pending"}),
            json!({"id": "", "agent_id": "milo", "epoch": 1, "status": "pending"}),
            json!([1]),
        ] {
            assert!(
                matches!(Payload::new(value.clone()).repr, PayloadRepr::Json(_)),
                "{value}"
            );
        }
    }
}

/// Per device, how many records of its log a site has: the next seq it lacks; and, where known,
/// the id of the device's last record below it (its *head*), which names the records counted: two
/// logs of one device id that differ (a device id used by two hosts with separate ledgers, a log
/// replaced by another) have the same count and different heads.
///
/// Heads are kept by [`observe`](Self::observe) and [`raise_to`](Self::raise_to) and carried by
/// [`merge`](Self::merge) (the larger count's head; for equal counts, the first head known); a
/// plain [`raise`](Self::raise) to a larger count forgets the device's head. Equality compares
/// both. Serialized, a frontier is its counts alone.
///
/// ```
/// use fencepost::relay::Frontier;
/// let frontier = Frontier::new();
/// assert_eq!(frontier.next_seq("laptop"), 0);
/// assert_eq!(frontier.head("laptop"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "BTreeMap<Arc<str>, u64>", into = "BTreeMap<Arc<str>, u64>")]
pub struct Frontier {
    devices: BTreeMap<Arc<str>, Had>,
}

/// What a [`Frontier`] knows of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Had {
    next_seq: u64,
    head: Option<OpId>,
}

impl From<BTreeMap<Arc<str>, u64>> for Frontier {
    fn from(counts: BTreeMap<Arc<str>, u64>) -> Self {
        Self {
            devices: counts
                .into_iter()
                .map(|(device, next_seq)| (device, Had { next_seq, head: None }))
                .collect(),
        }
    }
}

impl From<Frontier> for BTreeMap<Arc<str>, u64> {
    fn from(frontier: Frontier) -> Self {
        frontier
            .devices
            .into_iter()
            .map(|(device, had)| (device, had.next_seq))
            .collect()
    }
}

impl Frontier {
    /// A frontier that has nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The first seq of `device_id` not yet had (0 for an unknown device).
    pub fn next_seq(&self, device_id: &str) -> u64 {
        self.devices.get(device_id).map_or(0, |had| had.next_seq)
    }

    /// Records that `op` is had (and so are all earlier records of its device).
    pub fn observe(&mut self, op: &OpRecord) {
        // `u64::MAX` is no seq a log reaches (a chain would need 2^64 records); a record claiming it
        // must not overflow the frontier.
        self.raise_to(&op.device_id, op.seq.saturating_add(1), Some(op.op_id));
    }

    /// The id of `device_id`'s record at `next_seq - 1`, when known.
    pub fn head(&self, device_id: &str) -> Option<OpId> {
        self.devices.get(device_id).and_then(|had| had.head)
    }

    /// Raises `device_id`'s next seq to `next_seq` (never lowers it), with `head`, the id of its
    /// record `next_seq - 1` when known: a larger count takes `head` (and forgets the head it
    /// had), an equal count keeps the head it has, or takes `head` when it had none.
    pub fn raise_to(&mut self, device_id: &str, next_seq: u64, head: Option<OpId>) {
        let head = head.filter(|_| next_seq > 0);
        match self.devices.get_mut(device_id) {
            Some(had) if had.next_seq > next_seq => {}
            Some(had) if had.next_seq == next_seq => had.head = had.head.or(head),
            Some(had) => *had = Had { next_seq, head },
            None => {
                self.devices.insert(Arc::from(device_id), Had { next_seq, head });
            }
        }
    }

    /// [`observe`](Self::observe) for each record.
    pub fn observe_all<'a>(&mut self, ops: impl IntoIterator<Item = &'a OpRecord>) {
        ops.into_iter().for_each(|op| self.observe(op));
    }

    /// The devices known, with their next seq, in device order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.devices.iter().map(|(device, had)| (&**device, had.next_seq))
    }

    /// Raises `device_id`'s next seq to `next_seq` (never lowers it), its head unknown.
    pub fn raise(&mut self, device_id: &str, next_seq: u64) {
        self.raise_to(device_id, next_seq, None);
    }

    /// Raises every device of `other` (the union, device by device the larger, with its head).
    pub fn merge(&mut self, other: &Frontier) {
        for (device, next) in other.iter() {
            self.raise_to(device, next, other.head(device));
        }
    }

    /// Whether it knows no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// What this frontier lacks of `needed`: per device, `(device, had, needed)` where it has
    /// fewer records, in device order.
    pub fn lacking(&self, needed: &Frontier) -> Vec<(String, u64, u64)> {
        needed
            .iter()
            .filter(|(device, next)| self.next_seq(device) < *next)
            .map(|(device, next)| (device.to_owned(), self.next_seq(device), next))
            .collect()
    }
}
