//! The edge: the OS clock, storage (files, SQLite, PostgreSQL), threads; the drivers of the
//! core's machines.
//!
//! Architecture invariant: nothing here imports from `tools` (`tests/layers.rs`).

pub mod backend;
pub mod checkpoint;
pub mod clock;
pub mod dispatch;
pub mod keeper;
pub mod key_file;
pub mod ledger;
pub mod metrics;
pub(crate) mod pieces;
pub mod relay;
pub mod run;
pub mod sealing;
pub mod snapshot;
