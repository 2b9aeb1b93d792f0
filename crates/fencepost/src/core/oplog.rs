//! The hash-chained, per-device op log (rule O1).
//!
//! Each site (a *device*) appends [`OpRecord`]s to its own log with a [`DeviceLog`]. A record's
//! `op_id` is the SHA-256 of every other field, so changing any field of a record is detected; its
//! `seq` counts from 0 without gaps and its `prev` names the previous record's `op_id`, so a log
//! cannot be reordered, truncated in the middle or forked without [`verify_log`] noticing.
//!
//! # Wire form
//!
//! A record travels as one line (one line in a relay file, one row of a database relay). Two
//! JSON forms are read; [`OpRecord::write_json_line`] writes the compact one. Both are stable. A
//! protected ledger's record ([`Surface::Sealed`], [`SealedRecord`]) has its own line, format 4
//! (`4 "laptop" 7 1 <base64 body>`: not JSON; format 3, a JSON array, was written by earlier
//! versions and is still read), whose `op_id` is over its ciphertext (see [`SealedRecord`]).
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

mod chain;
mod device_log;
mod id;
mod line;
mod opened;
mod payload;
mod record;
mod sealed;
mod sealed_line;

pub(crate) use chain::HeadMark;
pub use chain::{verify_log, LogError, LogHead};
pub use device_log::DeviceLog;
pub use id::{OpId, ParseOpIdError};
pub(crate) use opened::stand_in;
pub use opened::{agent_digest, named_agent_digest, OpenError, AGENT_DIGEST_BYTES, AGENT_NAMES};
pub(crate) use payload::CompactIntent;
pub use payload::Payload;
use payload::{write_serde_json, PayloadRepr};
pub use record::{DecodeError, FoldTier, OpRecord, Surface};
pub use sealed::{
    is_valid_head, sealed_stamp, SealedContent, SealedRecord, CLEAR_GENERATION, MAX_SEALED_RECORD_BYTES,
};

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
