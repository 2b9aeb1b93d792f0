//! One record of a device's log: [`OpRecord`], its [`Surface`] and how it is checked, hashed and
//! decoded (rule O1).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::{
    LogError, OpId, Payload, PayloadRepr, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH, MAX_RECORD_BYTES,
    MAX_SURFACE_KIND_BYTES,
};
use crate::core::clock::Hlc;
use crate::id::{validate_id, IdError, IdKind};

/// How the records of a surface combine when logs are folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FoldTier {
    /// Every record is kept: the union of all records, by their stable id.
    GrowOnly,
    /// Per key, the record with the greatest HLC wins (last writer wins).
    Registry,
    /// Execution intents, folded under the fencing rules F4–F7.
    Leased,
    /// Sealed records: not folded until opened.
    Sealed,
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
    /// A protected ledger's record as the relay carries it ([`SealedRecord`](super::SealedRecord),
    /// made by [`OpRecord::sealed`]): never folded as it is, only as the record its content
    /// opens to.
    Sealed,
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
            Surface::Sealed => FoldTier::Sealed,
        }
    }
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
    /// Computes it whatever the record's size; [`LogHead`](super::LogHead) and [`DeviceLog`](super::DeviceLog) check the record
    /// limits first ([`checked_content_id`](Self::checked_content_id)).
    pub fn content_id(&self) -> OpId {
        if let (Surface::Sealed, PayloadRepr::Sealed(record)) = (&self.surface, &self.payload.repr) {
            return super::sealed::sealed_content_id(self, record);
        }
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
        match (&self.surface, &self.payload.repr) {
            (Surface::Sealed, PayloadRepr::Sealed(record)) => {
                return match super::sealed::sealed_shape_problem(self, record) {
                    Some(problem) => Err(over(problem)),
                    None => Ok(super::sealed::sealed_content_id(self, record)),
                };
            }
            (Surface::Sealed, _) => {
                return Err(over("a sealed record's body is sealed content".to_owned()));
            }
            _ => {}
        }
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
            Surface::Sealed => out.push(3),
        }
    }

    /// Whether `op_id` matches the content.
    pub fn has_valid_id(&self) -> bool {
        self.op_id == self.content_id()
    }

    /// Appends the wire form (the compact form, see the [module docs](crate::oplog#wire-form)) and a
    /// newline to `out`.
    pub fn write_json_line(&self, out: &mut Vec<u8>) {
        if let (Surface::Sealed, Some(record)) = (&self.surface, self.sealed_record()) {
            super::sealed_line::write_sealed_line(self, record, out);
        } else if super::line::has_compact_form(self) {
            super::line::write_compact(self, out);
        } else {
            let written = serde_json::to_writer(&mut *out, self);
            // Serializing a record cannot fail: every field is a string, a number or a JSON value.
            debug_assert!(written.is_ok());
        }
        out.push(b'\n');
    }

    /// Decodes either wire form (see the [module docs](crate::oplog#wire-form)): the compact form when
    /// the line starts with `[`, else the JSON object form. Checks the length
    /// ([`MAX_RECORD_BYTES`]), the shape and the ids' syntax (L8); does *not* check that `op_id`
    /// matches the content, nor the payload limits: [`LogHead`](super::LogHead) and [`verify_log`](super::verify_log) do that.
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
        let record: OpRecord = if bytes.starts_with(super::sealed_line::FORMAT_4_START) {
            super::sealed_line::read_sealed_line_4(bytes, device).map_err(DecodeError::Json)?
        } else {
            let compact = bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'[');
            let decoded = if compact {
                super::line::read_compact(bytes, device)
            } else {
                serde_json::from_slice(bytes)
            };
            decoded.map_err(|error| DecodeError::Json(error.to_string()))?
        };
        if record.surface == Surface::Sealed && record.sealed_record().is_none() {
            return Err(DecodeError::Json(
                "a sealed record is read from a line of format 4 or 3 only".to_owned(),
            ));
        }
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
pub(super) fn exceeds_depth(value: &Value, limit: usize) -> bool {
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
pub(super) fn push_text(out: &mut Vec<u8>, text: &str) {
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
