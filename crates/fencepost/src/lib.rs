//! # fencepost
//!
//! A program that runs on several sites at once (an agent runtime on a laptop, a phone and a
//! server; the same cron job on three hosts) must perform each side effect **once**, even when
//! sites pause, partition, fail over and come back. fencepost separates two mechanisms:
//!
//! * **The lease is for liveness**: a linearizable compare-and-swap register per agent whose every
//!   grant mints a new, never-reused *epoch* (the fencing token).
//! * **The fence is for safety**: every site appends execution *intents* to its own hash-chained op
//!   log; logs travel through an eventually consistent *relay*; every site folds them into the same
//!   state, and right before a side effect the dispatch fence asks "did this run already commit?"
//!   and "am I still the holder at epoch N?".
//!
//! [`run_once`] is the call most programs make: it runs one occurrence of a job once across every
//! site that shares a coordinator and a ledger (what `fencepost run` does), through the steps of
//! the [`session`] machine. The pieces under it: [`clock`], [`run_id`], [`oplog`] and [`relay`]
//! carry records between sites; [`lease`] (the coordinator and the intent vocabulary), [`fold`]
//! and [`fence`] decide what may run; [`keeper`] holds a lease alive and [`dispatch`] runs one
//! effect under a lease already held (its docs have a runtime loop with many runs under one
//! lease); [`metrics`] names what they count and time through the `metrics` facade (for the
//! recorder a program installs); `simulate` (the feature `simulate`) runs the whole protocol
//! through seeded chaos and counts what each layer prevents.
//!
//! ```
//! use std::sync::Arc;
//! use fencepost::clock::system_clock;
//! use fencepost::ledger::Ledger;
//! use fencepost::lease::InMemoryLeaseCoordinator;
//! use fencepost::relay::InMemoryRelay;
//! use fencepost::run::{Occurrence, Outcome, RunOptions};
//!
//! let coordinator = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
//! let mut ledger = Ledger::open("laptop", system_clock(), Arc::new(InMemoryRelay::new()))?;
//! let backup = Occurrence::new("milo", "back up the notes", "2026-12-06")?;
//! let outcome = fencepost::run_once(coordinator, &mut ledger, &backup, &RunOptions::new(30_000), |context| {
//!     // The side effect, with context.token() to pass on.
//!     Ok::<_, std::io::Error>(())
//! })?;
//! assert!(matches!(outcome, Outcome::Committed { epoch, .. } if epoch == 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## A tour
//!
//! Every site that sees the same occurrence of a job names it the same way, without talking to the
//! others ([`run_id`]):
//!
//! ```
//! use fencepost::run_id::deterministic_run_id;
//! let run = deterministic_run_id("milo", "send weekly report", "2026-11-29T09:00Z")?;
//! assert_eq!(run, "run-b0f6813d1bc0cbcf46511caf94b51e91");
//! # Ok::<(), fencepost::run_id::RunIdError>(())
//! ```
//!
//! Each site writes its own op log ([`oplog`]). Time is injected: the core never reads the OS clock,
//! so tests and the simulator drive a [`clock::ManualClock`] and programs pass
//! [`clock::system_clock`]:
//!
//! ```
//! use fencepost::clock::ManualClock;
//! use fencepost::oplog::{verify_log, DeviceLog, Surface};
//! use serde_json::json;
//!
//! let clock = ManualClock::new(1_764_400_000_000);
//! let mut laptop = DeviceLog::new("laptop", clock.wall_clock())?;
//! let pending = laptop.append(
//!     Surface::Intent,
//!     json!({"id": "run-b0f6813d1bc0cbcf46511caf94b51e91", "agent_id": "milo", "epoch": 1, "status": "pending"}),
//! );
//! let committed = laptop.append(
//!     Surface::Intent,
//!     json!({"id": "run-b0f6813d1bc0cbcf46511caf94b51e91", "agent_id": "milo", "epoch": 1, "status": "committed"}),
//! );
//! assert_eq!(committed.prev, Some(pending.op_id)); // hash-chained
//! verify_log(&[pending, committed])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Logs travel through a [`relay`]: a folder (possibly a synced one) or, in tests, memory. A site
//! pushes its own records and pulls what it lacks, tracked by a [`relay::Frontier`]:
//!
//! ```
//! use fencepost::clock::ManualClock;
//! use fencepost::oplog::{DeviceLog, Surface};
//! use fencepost::relay::{Frontier, FsRelay, Relay};
//! use serde_json::json;
//!
//! let folder = tempfile::tempdir()?;
//! let clock = ManualClock::new(1_000);
//! let mut laptop = DeviceLog::new("laptop", clock.wall_clock())?;
//! let mut phone = DeviceLog::new("phone", clock.wall_clock())?;
//!
//! // Each site pushes its own log (the same folder, as a synced folder would deliver it).
//! let mine = laptop.append(Surface::log("note"), json!({"text": "from the laptop"}));
//! FsRelay::open(folder.path())?.push(&[mine.clone()])?;
//! FsRelay::open(folder.path())?.push(&[phone.append(Surface::log("note"), json!({"text": "from the phone"}))])?;
//!
//! // The laptop has its own record and pulls what it lacks: the phone's.
//! let mut seen = Frontier::new();
//! seen.observe(&mine);
//! let batch = FsRelay::open(folder.path())?.pull(&seen)?;
//! assert_eq!(batch.ops.len(), 1);
//! assert_eq!(&*batch.ops[0].device_id, "phone");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A steal fences the zombie; the oracle stops a second execution:
//!
//! ```
//! use fencepost::clock::ManualClock;
//! use fencepost::fence::{check_dispatch, FenceDecision};
//! use fencepost::fold::fold;
//! use fencepost::lease::{InMemoryLeaseCoordinator, Intent, IntentStatus, LeaseCoordinator};
//! use fencepost::oplog::{DeviceLog, Surface};
//!
//! let clock = ManualClock::new(0);
//! let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
//! let mut laptop = DeviceLog::new("laptop", clock.wall_clock())?;
//! let mut phone = DeviceLog::new("phone", clock.wall_clock())?;
//! let run = "run-b0f6813d1bc0cbcf46511caf94b51e91";
//!
//! // The laptop holds epoch 1, writes its pending intent, then pauses past its TTL.
//! let first = coordinator.acquire("milo", "laptop", 10_000)?;
//! let mut ledger = vec![laptop.append(Surface::Intent, Intent::new("milo", run, first.epoch, IntentStatus::Pending).payload())];
//! clock.advance(10_000);
//!
//! // The phone takes over at epoch 2, passes the fence, acts, and commits.
//! let second = coordinator.acquire("milo", "phone", 10_000)?;
//! assert_eq!(check_dispatch(&coordinator, &fold(&ledger), "milo", run, "phone", second.epoch)?, FenceDecision::Proceed);
//! ledger.push(phone.append(Surface::Intent, Intent::new("milo", run, second.epoch, IntentStatus::Committed).payload()));
//!
//! // The laptop wakes up: the fence refuses it, whatever it believes.
//! let decision = check_dispatch(&coordinator, &fold(&ledger), "milo", run, "laptop", first.epoch)?;
//! assert!(matches!(decision, FenceDecision::AlreadyCommitted { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Principles
//!
//! * The core does no I/O and never reads the clock or a random source; only [`relay::FsRelay`],
//!   the database coordinators in [`backend`], the keeper's renewal thread and the CLI touch the
//!   outside world.
//! * Bad input gets a clear error, never a panic: ids are checked by [`id::validate_id`] (rule L8),
//!   records by [`oplog::verify_log`], relay files line by line.
#![warn(missing_docs)]

// The module tree is the folder tree: `core`, `edge` and `tools` are the layers (see
// ARCHITECTURE.md; `tests/layers.rs` checks that a layer imports nothing from the layers above
// it). The layers are private; the public paths stay flat (`fencepost::lease`,
// `fencepost::dispatch`, …), one per module.
mod core;
mod edge;
mod tools;

pub(crate) use crate::core::hex;
#[cfg(any(feature = "conformance", feature = "simulate"))]
pub(crate) use crate::core::rng;
pub use crate::core::{
    fence, fold, genesis, id, lease, membership, oplog, protected, roster, run_id, seal, session,
};
pub(crate) use crate::core::{intent, tenure};
pub use crate::edge::run::run_once;
pub use crate::edge::{backend, checkpoint, dispatch, keeper, ledger, metrics, relay, run, snapshot};
#[cfg(feature = "conformance")]
pub use crate::tools::conformance;
pub use crate::tools::resource;
#[cfg(feature = "simulate")]
pub use crate::tools::simulate;

/// Time, injected: the core never reads the OS clock.
///
/// * [`WallClock`](clock::WallClock) is a function returning milliseconds since the Unix epoch.
///   The core receives one and never calls the OS clock itself;
///   [`system_clock`](clock::system_clock) is the one place that does, for callers at the edge
///   (the CLI, a backend). Tests drive a [`ManualClock`](clock::ManualClock).
/// * [`Hlc`](clock::Hlc) is a hybrid logical clock stamp `(wall_ms, counter, device_id)` with a
///   total order, and [`HlcClock`](clock::HlcClock) issues strictly increasing stamps for one
///   device (rule C1). `observe` merges a remote stamp, but refuses one further ahead of the local
///   wall clock than a configured maximum skew, so that a single forged stamp cannot drag the
///   clock to `u64::MAX`.
///
/// The values and the stamps are the core's (`core/clock.rs`); the reads of the OS clock are the
/// edge's (`edge/clock.rs`).
pub mod clock {
    pub use crate::core::clock::{ClockError, Hlc, HlcClock, HlcConfig, ManualClock, WallClock};
    pub use crate::edge::clock::{monotonic_clock, system_clock, RealTimeLimit, Stopwatch};
}

/// Wrapping a ledger key to a member (issue 39): HPKE (RFC 9180, X25519, HKDF-SHA256,
/// ChaCha20-Poly1305) bound to the ledger, the generation and the recipient's device id.
/// [`wrap_with_seed`](wrap::wrap_with_seed) and [`unwrap`](wrap::unwrap) are the core's
/// (`core/wrap.rs`); [`wrap`](wrap::wrap) draws the ephemeral key from the operating system
/// (`edge/sealing.rs`).
pub mod wrap {
    pub use crate::core::wrap::{unwrap, wrap_with_seed, WrapError, Wrapped, WRAPPED_BYTES};
    pub use crate::edge::sealing::wrap;
}

/// A device's identity (issue 39): its signing key (Ed25519) and its key-agreement key
/// (X25519), and the key file that keeps them in the data directory.
///
/// The keys and their text are the core's (`core/identity.rs`: [`DeviceKey`](identity::DeviceKey),
/// [`PublicIdentity`](identity::PublicIdentity), signatures bound to a
/// [`SignatureContext`](identity::SignatureContext) and a [`LedgerId`](identity::LedgerId)); the
/// file, made once per device id and readable by its owner only, is the edge's
/// (`edge/key_file.rs`: [`load_or_create`](identity::load_or_create)).
///
/// ```
/// use fencepost::id::DeviceId;
/// use fencepost::identity::load_or_create;
///
/// let folder = tempfile::tempdir()?;
/// let laptop = DeviceId::new("laptop")?;
/// let (key, created) = load_or_create(folder.path(), &laptop)?;
/// assert!(created);
/// let (again, created) = load_or_create(folder.path(), &laptop)?;
/// assert!(!created && again.public() == key.public());
/// println!("{}", key.public()); // the line `fencepost device key` prints
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub mod identity {
    pub use crate::core::identity::{
        DeviceKey, KeyTextError, LedgerId, ParsePublicError, PublicIdentity, Signature, SignatureContext,
    };
    pub use crate::edge::key_file::{key_path, load, load_file, load_or_create, save_new, KeyFileError};
}

/// The README's Rust examples, compiled (and, where they need no server, run) as doctests, so
/// that they stay true; the same for the pages of `docs/` that have some.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

/// `docs/library.md`'s examples, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryDocExamples;

/// `docs/deployment.md`'s examples, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/deployment.md")]
pub struct DeploymentDocExamples;
