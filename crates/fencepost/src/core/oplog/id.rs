//! A record's identity: [`OpId`], the SHA-256 of its content (rule O1).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// The content-derived identity of an [`OpRecord`](super::OpRecord): a SHA-256 digest.
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
