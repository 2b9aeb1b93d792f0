//! Validation of the identifiers that cross fencepost's boundaries (rule L8), and the typed values
//! that carry them once checked.
//!
//! Agent ids and device ids end up in log records, file names and database rows. They are checked
//! once, where they enter, with one rule set: not empty, at most [`MAX_ID_BYTES`] bytes, and no
//! control characters. Nothing is truncated or rewritten silently. [`AgentId`], [`DeviceId`] and
//! [`RunId`] are such ids, checked when built; [`Epoch`] is a fencing epoch a coordinator can
//! mint (`1..=`[`MAX_EPOCH`]); a [`Claim`] is the three that travel together: who holds which
//! agent at which epoch.
//!
//! ```
//! use fencepost::id::{AgentId, Claim, DeviceId, Epoch};
//! let claim = Claim {
//!     agent: AgentId::new("milo")?,
//!     device: DeviceId::new("laptop")?,
//!     epoch: Epoch::new(7)?,
//! };
//! assert_eq!(claim.to_string(), "milo held by laptop at epoch 7");
//! assert!(AgentId::new("milo\n").is_err());
//! assert!(Epoch::new(0).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use thiserror::Error;

use crate::intent::MAX_EPOCH;

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

/// Defines a string id checked against rule L8 when built.
macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Checks `id` against rule L8 and keeps it.
            ///
            /// # Errors
            /// [`IdError`] when it is empty, too long or holds a control character.
            pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
                let id = id.into();
                validate_id($kind, &id)?;
                Ok(Self(id))
            }

            /// The id.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // Its order, equality and hash are the string's: maps keyed by it are looked up by `&str`.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str(&self.0)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(id: &str) -> Result<Self, IdError> {
                Self::new(id)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(id: String) -> Result<Self, IdError> {
                Self::new(id)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

typed_id!(
    /// An agent id (the unit a lease and a fencing epoch belong to), checked (rule L8).
    AgentId,
    IdKind::Agent
);
typed_id!(
    /// A device id (the site that writes one op log), checked (rule L8).
    DeviceId,
    IdKind::Device
);
typed_id!(
    /// A run id (one side effect, the unit the ledger's oracle answers for), checked (rule L8).
    RunId,
    IdKind::Run
);

impl RunId {
    /// The run id every site gives one occurrence of a job:
    /// [`deterministic_run_id`](crate::run_id::deterministic_run_id) of the agent, the intent
    /// and the salt (always a valid id).
    ///
    /// ```
    /// use fencepost::id::RunId;
    ///
    /// let run = RunId::derive("milo", "send the daily report", "2026-12-06")?;
    /// assert!(run.as_str().starts_with("run-"));
    /// # Ok::<(), fencepost::run_id::RunIdError>(())
    /// ```
    ///
    /// # Errors
    /// As [`deterministic_run_id`](crate::run_id::deterministic_run_id).
    pub fn derive(agent_id: &str, intent: &str, salt: &str) -> Result<Self, crate::run_id::RunIdError> {
        crate::run_id::deterministic_run_id(agent_id, intent, salt).map(Self)
    }
}

/// A fencing epoch a coordinator can mint: `1..=`[`MAX_EPOCH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u64);

/// An epoch no coordinator mints (0, or above [`MAX_EPOCH`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("epoch {epoch} is outside 1..={max}: no coordinator mints it", max = MAX_EPOCH)]
pub struct EpochError {
    /// The epoch.
    pub epoch: u64,
}

impl Epoch {
    /// Checks `epoch`.
    ///
    /// # Errors
    /// [`EpochError`] for 0 or an epoch above [`MAX_EPOCH`].
    pub fn new(epoch: u64) -> Result<Self, EpochError> {
        if (1..=MAX_EPOCH).contains(&epoch) {
            Ok(Self(epoch))
        } else {
            Err(EpochError { epoch })
        }
    }

    /// The epoch as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}", self.0)
    }
}

impl TryFrom<u64> for Epoch {
    type Error = EpochError;
    fn try_from(epoch: u64) -> Result<Self, EpochError> {
        Self::new(epoch)
    }
}

impl From<Epoch> for u64 {
    fn from(epoch: Epoch) -> u64 {
        epoch.0
    }
}

impl PartialEq<u64> for Epoch {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

/// Who holds which agent at which epoch: the three values a fence, a token and a release are
/// about, as one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim {
    /// The agent.
    pub agent: AgentId,
    /// The device that holds it.
    pub device: DeviceId,
    /// At which epoch.
    pub epoch: Epoch,
}

impl std::fmt::Display for Claim {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} held by {} at epoch {}",
            self.agent, self.device, self.epoch
        )
    }
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

    #[test]
    fn l8_typed_ids_are_checked_once_when_built() {
        assert_eq!(AgentId::new("milo").unwrap(), "milo");
        assert_eq!(DeviceId::new(""), Err(IdError::Empty { kind: IdKind::Device }));
        assert!(matches!(
            RunId::try_from("run\t1"),
            Err(IdError::ControlCharacter {
                kind: IdKind::Run,
                ..
            })
        ));
        assert_eq!(Epoch::new(0), Err(EpochError { epoch: 0 }));
        assert_eq!(Epoch::new(MAX_EPOCH).map(Epoch::get), Ok(MAX_EPOCH));
        assert_eq!(
            Epoch::new(MAX_EPOCH + 1),
            Err(EpochError { epoch: MAX_EPOCH + 1 })
        );
    }
}
