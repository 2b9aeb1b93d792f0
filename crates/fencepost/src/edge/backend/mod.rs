//! Durable lease coordinators, each behind its own feature.
//!
//! * [`sqlite`] (feature `sqlite`, on by default): one host, embedded, durable.
//! * [`postgres`] (feature `postgres`): many hosts, expiry by the database server's clock.

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::lease::{BackendError, LeaseError};

/// Conversions between the lease module's `u64`s and the signed 64-bit columns every database
/// backend stores them in. TTLs, expiries, floors and minted epochs are bounded by the lease
/// module's limits (`MAX_TTL_MS`, `MAX_EXPIRES_AT_MS`, `MAX_EPOCH`); one beyond `i64::MAX` is an
/// error, never clamped onto a real value (rule L5).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct Columns {
    /// The backend, for the errors.
    pub backend: &'static str,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Columns {
    fn failure(&self, message: String) -> LeaseError {
        LeaseError::Backend(BackendError {
            backend: self.backend,
            message,
            may_have_applied: false,
            transient: false,
            source: None,
        })
    }

    /// A stored integer that must be non-negative.
    pub fn stored(&self, value: i64, column: &str) -> Result<u64, LeaseError> {
        u64::try_from(value).map_err(|_| self.failure(format!("corrupt row: {column} is {value}")))
    }

    /// A stored published head (the id of a device's last published record).
    pub fn head(&self, value: &str) -> Result<crate::oplog::OpId, LeaseError> {
        value
            .parse()
            .map_err(|_| self.failure(format!("corrupt row: a published head is {value:?}")))
    }

    /// `Lost` of `agent_id`, claimed at `claimed_epoch`, with the stored current epoch (0 for an
    /// agent without a row); a stored epoch outside the domain is that error instead.
    pub fn lost(&self, agent_id: &str, claimed_epoch: u64, stored_epoch: i64) -> LeaseError {
        match self.stored(stored_epoch, "epoch") {
            Ok(current_epoch) => LeaseError::Lost {
                agent_id: agent_id.to_owned(),
                claimed_epoch,
                current_epoch,
            },
            Err(error) => error,
        }
    }

    /// A value to store.
    pub fn storable(&self, value: u64, what: &str) -> Result<i64, LeaseError> {
        i64::try_from(value).map_err(|_| self.failure(format!("{what} {value} is out of the storable range")))
    }
}

/// An epoch a caller claims, for a comparison with a stored one: one beyond `i64::MAX` was never
/// minted, so it becomes -1, which matches no row (it must never be clamped onto a real epoch).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn claimed(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(-1)
}
