//! The core: decisions over values, no I/O of its own, no thread, no OS clock (time enters as a
//! [`WallClock`](crate::clock::WallClock) value, randomness as a seed).
//!
//! Architecture invariant: nothing here imports from `edge` or `tools` (`tests/layers.rs`).

pub mod clock;
pub mod fence;
pub mod fold;
pub mod frontier;
pub mod genesis;
pub(crate) mod hex;
pub mod id;
pub mod identity;
pub mod intent;
pub mod lease;
pub mod membership;
pub mod oplog;
pub mod protected;
#[cfg(any(feature = "conformance", feature = "simulate"))]
pub mod rng;
pub mod roster;
pub mod run_id;
pub mod seal;
pub mod session;
pub mod tenure;
pub mod wrap;
