//! Deterministic run ids (rule B7).
//!
//! Every site that sees the same occurrence of the same job must name it the same way, without
//! talking to the others: the run id is a hash of what the occurrence *is*. A run id is
//! `"run-"` followed by the lowercase hex of the first 16 bytes of
//! SHA-256(`agent_id` 0x1F `intent` 0x1F `salt`).
//!
//! The unit separator 0x1F keeps the fields apart, so a field that contains it would make two
//! different triples hash alike: such input is refused rather than given a colliding id.

use sha2::{Digest, Sha256};
use thiserror::Error;

/// The byte that separates the hashed fields.
pub const RUN_ID_FIELD_SEPARATOR: char = '\u{1f}';

/// The longest field accepted, in bytes.
pub const MAX_RUN_ID_FIELD_BYTES: usize = 64 * 1024;

/// The prefix of every run id.
pub const RUN_ID_PREFIX: &str = "run-";

/// Why a run id could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RunIdError {
    /// A field contains the separator byte 0x1F, which would make distinct inputs collide.
    #[error("the {field} contains the byte 0x1F (unit separator) at byte {byte_index}; run ids refuse it because it would let different inputs share one id")]
    SeparatorInField {
        /// `"agent id"`, `"intent"` or `"salt"`.
        field: &'static str,
        /// Where the separator is.
        byte_index: usize,
    },
    /// A field is longer than [`MAX_RUN_ID_FIELD_BYTES`].
    #[error("the {field} is {length_bytes} bytes long; the limit is {max_bytes}")]
    FieldTooLong {
        /// `"agent id"`, `"intent"` or `"salt"`.
        field: &'static str,
        /// Its length.
        length_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
}

/// The run id of one occurrence of `intent` for `agent_id`, distinguished by `salt` (for a
/// scheduled job, the occurrence's time; for a message, its id).
///
/// ```
/// use fencepost::run_id::deterministic_run_id;
/// let id = deterministic_run_id("agent-1", "summarize inbox", "2026-06-30").unwrap();
/// assert_eq!(id, "run-c1db7288ec018f4bc23c52424fc61f59");
/// assert!(deterministic_run_id("a\u{1f}b", "c", "").is_err());
/// ```
pub fn deterministic_run_id(agent_id: &str, intent: &str, salt: &str) -> Result<String, RunIdError> {
    let fields = [("agent id", agent_id), ("intent", intent), ("salt", salt)];
    for (field, value) in fields {
        if value.len() > MAX_RUN_ID_FIELD_BYTES {
            return Err(RunIdError::FieldTooLong {
                field,
                length_bytes: value.len(),
                max_bytes: MAX_RUN_ID_FIELD_BYTES,
            });
        }
        if let Some(byte_index) = value.find(RUN_ID_FIELD_SEPARATOR) {
            return Err(RunIdError::SeparatorInField { field, byte_index });
        }
    }
    let mut hasher = Sha256::new();
    hasher.update(agent_id.as_bytes());
    hasher.update([0x1f]);
    hasher.update(intent.as_bytes());
    hasher.update([0x1f]);
    hasher.update(salt.as_bytes());
    let digest = hasher.finalize();
    let mut first_half = [0u8; 16];
    first_half.copy_from_slice(&digest[..16]);
    Ok(RunKey::Hashed(first_half).to_string())
}

/// A run id as the fold keeps it: a deterministic id (`run-` + 32 lowercase hex digits) as its 16
/// bytes, any other id as text. Ordered as the text form is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum RunKey {
    /// `run-` followed by the lowercase hex of these bytes.
    Hashed([u8; 16]),
    /// Any other run id.
    Text(Box<str>),
}

impl RunKey {
    /// The key of `run_id`.
    pub(crate) fn new(run_id: &str) -> Self {
        run_id
            .strip_prefix(RUN_ID_PREFIX)
            .and_then(crate::hex::decode_lower_hex::<16>)
            .map_or_else(|| RunKey::Text(run_id.into()), RunKey::Hashed)
    }

    /// The text form of a hashed id: `run-` and 32 lowercase hex digits, without allocating.
    pub(crate) fn hashed_text(bytes: &[u8; 16]) -> [u8; 36] {
        let mut text = [0u8; 36];
        text[..4].copy_from_slice(RUN_ID_PREFIX.as_bytes());
        crate::hex::write_lower_hex(&mut text[4..], bytes);
        text
    }

    /// The text form, in `buffer` for hashed ids.
    fn as_bytes<'a>(&'a self, buffer: &'a mut [u8; 36]) -> &'a [u8] {
        match self {
            RunKey::Hashed(bytes) => {
                *buffer = Self::hashed_text(bytes);
                &buffer[..]
            }
            RunKey::Text(text) => text.as_bytes(),
        }
    }
}

impl std::fmt::Display for RunKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut buffer = [0u8; 36];
        // Hashed ids are ASCII; text ids are already UTF-8.
        formatter.write_str(std::str::from_utf8(self.as_bytes(&mut buffer)).map_err(|_| std::fmt::Error)?)
    }
}

impl Ord for RunKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (RunKey::Hashed(a), RunKey::Hashed(b)) => a.cmp(b),
            (RunKey::Text(a), RunKey::Text(b)) => a.cmp(b),
            _ => {
                let (mut left, mut right) = ([0u8; 36], [0u8; 36]);
                self.as_bytes(&mut left).cmp(other.as_bytes(&mut right))
            }
        }
    }
}

impl PartialOrd for RunKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b7_known_answers() {
        let cases = [
            (
                ("agent-1", "summarize inbox", "2026-06-30"),
                "run-c1db7288ec018f4bc23c52424fc61f59",
            ),
            (
                ("milo", "send weekly report", "2026-11-29T09:00Z"),
                "run-b0f6813d1bc0cbcf46511caf94b51e91",
            ),
        ];
        for ((agent, intent, salt), expected) in cases {
            assert_eq!(deterministic_run_id(agent, intent, salt).unwrap(), expected);
        }
    }

    #[test]
    fn b7_separator_in_any_field_is_refused_instead_of_colliding() {
        let first = deterministic_run_id("a\u{1f}b", "c", "");
        let second = deterministic_run_id("a", "b\u{1f}c", "");
        assert_eq!(
            first,
            Err(RunIdError::SeparatorInField {
                field: "agent id",
                byte_index: 1
            })
        );
        assert_eq!(
            second,
            Err(RunIdError::SeparatorInField {
                field: "intent",
                byte_index: 1
            })
        );
        assert!(matches!(
            deterministic_run_id("a", "b", "x\u{1f}"),
            Err(RunIdError::SeparatorInField { field: "salt", .. })
        ));
        assert!(first.unwrap_err().to_string().contains("0x1F"));
    }

    #[test]
    fn b7_ids_are_distinct_for_distinct_fields_and_stable() {
        let base = deterministic_run_id("a", "b", "c").unwrap();
        assert_eq!(base, deterministic_run_id("a", "b", "c").unwrap());
        assert_ne!(base, deterministic_run_id("a", "b", "d").unwrap());
        assert_ne!(base, deterministic_run_id("ab", "", "c").unwrap());
        assert_eq!(base.len(), RUN_ID_PREFIX.len() + 32);
        assert!(base[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn run_keys_keep_the_text_and_order_of_run_ids() {
        let hashed = deterministic_run_id("a", "b", "c").unwrap();
        let ids = [
            hashed.as_str(),
            "run-",
            "run-ABCDEF",
            "run-zzz",
            "a",
            "run-00",
            "s",
            &hashed[..35],
            "run-ffffffffffffffffffffffffffffffff0",
        ];
        for id in ids {
            assert_eq!(RunKey::new(id).to_string(), id);
        }
        assert!(matches!(RunKey::new(&hashed), RunKey::Hashed(_)));
        assert!(matches!(RunKey::new(&hashed.to_uppercase()), RunKey::Text(_)));
        for a in ids {
            for b in ids {
                assert_eq!(RunKey::new(a).cmp(&RunKey::new(b)), a.cmp(b), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn b7_over_long_field_is_refused() {
        let long = "x".repeat(MAX_RUN_ID_FIELD_BYTES + 1);
        assert!(matches!(
            deterministic_run_id("a", &long, ""),
            Err(RunIdError::FieldTooLong { field: "intent", .. })
        ));
    }
}
