//! Validation of the identifiers that cross fencepost's boundaries (rule L8).
//!
//! Agent ids and device ids end up in log records, file names and database rows. They are checked
//! once, where they enter, with one rule set: not empty, at most [`MAX_ID_BYTES`] bytes, and no
//! control characters. Nothing is truncated or rewritten silently.

use thiserror::Error;

/// The longest identifier accepted, in bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 256;

/// Which identifier a check was about, so that an error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// An agent id: the unit that a lease and a fencing epoch belong to.
    Agent,
    /// A device id: the site that writes one op log.
    Device,
    /// A run id: one side effect, the unit the ledger's oracle answers for.
    Run,
}

impl std::fmt::Display for IdKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            IdKind::Agent => "agent id",
            IdKind::Device => "device id",
            IdKind::Run => "run id",
        })
    }
}

/// Why an identifier was refused (rule L8).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdError {
    /// The identifier was the empty string.
    #[error("{kind} is empty")]
    Empty {
        /// Which identifier.
        kind: IdKind,
    },
    /// The identifier is longer than [`MAX_ID_BYTES`].
    #[error("{kind} is {length_bytes} bytes long; the limit is {max_bytes}")]
    TooLong {
        /// Which identifier.
        kind: IdKind,
        /// Its length in bytes.
        length_bytes: usize,
        /// The limit, [`MAX_ID_BYTES`].
        max_bytes: usize,
    },
    /// The identifier contains a control character (a newline, a tab, NUL, …).
    #[error("{kind} contains the control character {character:?} at byte {byte_index}")]
    ControlCharacter {
        /// Which identifier.
        kind: IdKind,
        /// The offending character.
        character: char,
        /// Where it starts, in bytes.
        byte_index: usize,
    },
}

/// Checks an identifier against rule L8.
///
/// ```
/// use fencepost::id::{validate_id, IdKind};
/// assert!(validate_id(IdKind::Device, "laptop-1").is_ok());
/// assert!(validate_id(IdKind::Device, "").is_err());
/// assert!(validate_id(IdKind::Agent, "milo\n").is_err());
/// ```
pub fn validate_id(kind: IdKind, id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if id.len() > MAX_ID_BYTES {
        return Err(IdError::TooLong {
            kind,
            length_bytes: id.len(),
            max_bytes: MAX_ID_BYTES,
        });
    }
    if let Some((byte_index, character)) = id.char_indices().find(|(_, c)| c.is_control()) {
        return Err(IdError::ControlCharacter {
            kind,
            character,
            byte_index,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l8_ids_are_checked_for_emptiness_length_and_control_characters() {
        let cases: &[(&str, bool)] = &[
            ("a", true),
            ("laptop-1", true),
            ("ünïcödé ok", true),
            ("", false),
            ("tab\there", false),
            ("nul\0", false),
            ("del\u{7f}", false),
            ("c1\u{85}", false),
        ];
        for (id, ok) in cases {
            assert_eq!(validate_id(IdKind::Agent, id).is_ok(), *ok, "{id:?}");
        }
        let longest = "x".repeat(MAX_ID_BYTES);
        assert!(validate_id(IdKind::Device, &longest).is_ok());
        let too_long = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(
            validate_id(IdKind::Device, &too_long),
            Err(IdError::TooLong {
                kind: IdKind::Device,
                length_bytes: MAX_ID_BYTES + 1,
                max_bytes: MAX_ID_BYTES
            })
        );
        // A multi-byte character that crosses the limit counts in bytes, not characters.
        let multibyte = "é".repeat(MAX_ID_BYTES / 2 + 1);
        assert!(validate_id(IdKind::Device, &multibyte).is_err());
    }
}
