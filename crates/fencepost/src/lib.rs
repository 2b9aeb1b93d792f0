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
//! Modules: [`clock`], [`run_id`], [`oplog`] and [`relay`] carry records between sites; [`lease`]
//! (the coordinator and the intent vocabulary), [`fold`] and [`fence`] decide what may run;
//! [`keeper`] holds a lease alive and [`dispatch`] runs one effect under the whole protocol (the
//! call an agent runtime makes; its docs have a runnable runtime loop); [`metrics`] names what they
//! count and time through the `metrics` facade (for the recorder a program installs);
//! [`simulate`] runs the whole protocol through seeded chaos and counts what each layer prevents.
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

// The folders say which layer a module belongs to (see ARCHITECTURE.md); the module paths stay
// flat (`fencepost::lease`, `fencepost::dispatch`, …).
//
// The core: decisions over values, no I/O of its own, no thread, no OS clock.
#[path = "core/fence.rs"]
pub mod fence;
#[path = "core/fold.rs"]
pub mod fold;
#[path = "core/hex.rs"]
mod hex;
#[path = "core/id.rs"]
pub mod id;
#[path = "core/intent.rs"]
pub mod intent;
#[path = "core/lease.rs"]
pub mod lease;
#[path = "core/oplog.rs"]
pub mod oplog;
#[path = "core/rng.rs"]
pub mod rng;
#[path = "core/run_id.rs"]
pub mod run_id;
#[path = "core/tenure.rs"]
pub mod tenure;

// The edge: the OS clock, storage, threads.
#[path = "edge/backend/mod.rs"]
pub mod backend;
#[path = "edge/checkpoint.rs"]
pub mod checkpoint;
#[path = "edge/clock.rs"]
pub mod clock;
#[path = "edge/dispatch.rs"]
pub mod dispatch;
#[path = "edge/keeper.rs"]
pub mod keeper;
#[path = "edge/ledger.rs"]
pub mod ledger;
#[path = "edge/metrics.rs"]
pub mod metrics;
#[path = "edge/relay/mod.rs"]
pub mod relay;
#[path = "edge/snapshot.rs"]
pub mod snapshot;

// The tools: built on both, deciding nothing of the protocol.
#[cfg(feature = "conformance")]
#[path = "tools/conformance/mod.rs"]
pub mod conformance;
#[path = "tools/resource.rs"]
pub mod resource;
#[path = "tools/simulate/mod.rs"]
pub mod simulate;

/// The README's Rust examples, compiled (and, where they need no server, run) as doctests, so
/// that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;
