//! A record's payload: JSON, or a well-formed intent kept compact, hashed as canonical JSON.

use std::borrow::Cow;

use compact_str::CompactString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};

use crate::intent::{
    Intent, IntentFields, IntentStatus, INTENT_FIELD_AGENT, INTENT_FIELD_EPOCH, INTENT_FIELD_ID,
    INTENT_FIELD_STATUS,
};
use crate::run_id::RunKey;

/// The JSON content of a record.
///
/// Read it with [`Payload::value`]. In memory, a well-formed intent payload (exactly the four
/// intent fields, see [`Intent::from_payload`]) is kept in a compact typed form, parsed once; every
/// other payload is kept as its JSON value. Both forms have the same canonical JSON, wire form and
/// `op_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    pub(super) repr: PayloadRepr,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum PayloadRepr {
    Intent(CompactIntent),
    Json(Value),
    Sealed(std::sync::Arc<super::SealedRecord>),
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
    pub(super) fn write_run_id(&self, out: &mut Vec<u8>) {
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
    pub(super) fn from_value(value: &Value) -> Option<Self> {
        let object = value.as_object()?;
        if object.len() != 4 {
            return None;
        }
        Self::from_fields(value)
    }

    /// The compact form of any well-formed intent payload (other keys ignored).
    pub(super) fn from_fields(value: &Value) -> Option<Self> {
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
            PayloadRepr::Sealed(record) => Cow::Owned(sealed_value(record)),
        }
    }

    /// Consumes the payload, returning its JSON value.
    pub fn into_value(self) -> Value {
        match self.repr {
            PayloadRepr::Json(value) => value,
            PayloadRepr::Intent(_) | PayloadRepr::Sealed(_) => self.value().into_owned(),
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
            PayloadRepr::Sealed(_) => None,
        }
    }

    /// The intent in compact form, without allocating when the payload is already compact.
    #[inline]
    pub(crate) fn compact_intent(&self) -> Option<Cow<'_, CompactIntent>> {
        match &self.repr {
            PayloadRepr::Intent(intent) => Some(Cow::Borrowed(intent)),
            PayloadRepr::Json(value) => CompactIntent::from_fields(value).map(Cow::Owned),
            PayloadRepr::Sealed(_) => None,
        }
    }

    /// Appends the canonical JSON of this payload (the form hashed into `op_id`) to `out`.
    pub fn write_canonical_json(&self, out: &mut Vec<u8>) {
        match &self.repr {
            PayloadRepr::Json(value) => write_canonical_json(value, out),
            PayloadRepr::Sealed(record) => write_canonical_json(&sealed_value(record), out),
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

/// A sealed record's body as JSON (what `--json` shows): its generation, its content and its
/// head in unpadded base64url.
fn sealed_value(record: &super::SealedRecord) -> Value {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let content = match &record.content {
        super::SealedContent::Clear(bytes) => URL_SAFE_NO_PAD.encode(bytes),
        super::SealedContent::Sealed(sealed) => {
            let mut bytes = sealed.nonce.to_vec();
            bytes.extend_from_slice(&sealed.ciphertext);
            URL_SAFE_NO_PAD.encode(bytes)
        }
    };
    json!({
        "generation": record.content.generation(),
        "content": content,
        "head": record.head.map(|head| URL_SAFE_NO_PAD.encode(head.0)),
    })
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
            PayloadRepr::Sealed(record) => sealed_value(record).serialize(serializer),
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
pub(super) fn write_canonical_json(value: &Value, out: &mut Vec<u8>) {
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
pub(super) fn write_serde_json<T: Serialize + ?Sized>(item: &T, out: &mut Vec<u8>) {
    let written = serde_json::to_writer(&mut *out, item);
    // Writing a string or a scalar JSON value into a Vec cannot fail: no I/O, no map keys.
    debug_assert!(written.is_ok());
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
