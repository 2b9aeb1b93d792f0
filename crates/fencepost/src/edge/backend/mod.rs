//! Durable lease coordinators, each behind its own feature.
//!
//! * [`sqlite`] (feature `sqlite`, on by default): one host, embedded, durable.
//! * [`postgres`] (feature `postgres`): many hosts, expiry by the database server's clock.

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
