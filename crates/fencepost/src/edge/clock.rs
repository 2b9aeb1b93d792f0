//! The operating system's clocks, read here and nowhere else in the library (clippy's
//! `disallowed-methods` refuses any other read): the wall clock as a [`WallClock`] for callers at
//! the edge, the monotonic clock, and real-time bounds on waits at the I/O edge. The core's time
//! (`WallClock`, `ManualClock`, `Hlc`, `HlcClock`) is `core/clock.rs`; both are `fencepost::clock`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::core::clock::WallClock;

/// The operating system's clock as a [`WallClock`]. A time before 1970 reads as 0.
#[allow(clippy::disallowed_methods)] // the wall clock, read here and nowhere else
pub fn system_clock() -> WallClock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    })
}

/// A monotonic clock in milliseconds since its first read in this process (from
/// [`std::time::Instant`]): for measuring durations, such as how long ago a lease was renewed, where
/// the wall clock could step. Like [`system_clock`], for callers at the edge.
#[allow(clippy::disallowed_methods)] // the monotonic clock, read here and nowhere else
pub fn monotonic_clock() -> WallClock {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    Arc::new(move || u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// How long something took, for metrics and reports (never a protocol decision, which goes by a
/// [`WallClock`]): the monotonic clock, read here.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// A stopwatch started now.
    #[allow(clippy::disallowed_methods)] // the monotonic clock, read here and nowhere else
    pub fn start() -> Self {
        Self(std::time::Instant::now())
    }

    /// The time since [`start`](Self::start).
    pub fn elapsed(&self) -> std::time::Duration {
        self.0.elapsed()
    }
}

/// A bound in real time on a wait at the I/O edge (a file lock held by another process, a
/// database file another process is creating): never a protocol decision, which goes by a
/// [`WallClock`]. With [`system_clock`] and [`monotonic_clock`], the only reads of the OS clock in
/// the library (clippy's `disallowed-methods` refuses any other).
#[derive(Debug, Clone, Copy)]
pub struct RealTimeLimit {
    started: std::time::Instant,
    limit: std::time::Duration,
}

impl RealTimeLimit {
    /// A limit of `limit` from now.
    #[allow(clippy::disallowed_methods)] // the one place a real-time wait starts
    pub fn starting_now(limit: std::time::Duration) -> Self {
        Self {
            started: std::time::Instant::now(),
            limit,
        }
    }

    /// How long since it started.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Whether the limit has passed.
    pub fn passed(&self) -> bool {
        self.elapsed() >= self.limit
    }

    /// How long until the limit passes (zero once it has).
    pub fn remaining(&self) -> std::time::Duration {
        self.limit.saturating_sub(self.elapsed())
    }
}
