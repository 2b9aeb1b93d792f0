//! Durable lease coordinators, each behind its own feature.
//!
//! * [`sqlite`] (feature `sqlite`, on by default): one host, embedded, durable.

#[cfg(feature = "sqlite")]
pub mod sqlite;
