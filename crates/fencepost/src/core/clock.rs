//! Time, as fencepost's core sees it: injected, never read from the OS.
//!
//! * [`WallClock`] is a function returning milliseconds since the Unix epoch. The core receives one
//!   and never calls the OS clock itself; `system_clock` (the edge's `clock`) is the one place that
//!   does, for callers at the edge (the CLI, a backend). Tests drive a [`ManualClock`].
//! * [`Hlc`] is a hybrid logical clock stamp `(wall_ms, counter, device_id)` with a total order, and
//!   [`HlcClock`] issues strictly increasing stamps for one device (rule C1). `observe` merges a
//!   remote stamp, but refuses one further ahead of the local wall clock than a configured maximum
//!   skew, so that a single forged stamp cannot drag the clock to `u64::MAX`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Milliseconds since the Unix epoch, injected wherever time is needed.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A clock that moves only when told to: for tests and the simulator.
///
/// Clones share one time, across threads.
///
/// ```
/// use fencepost::clock::ManualClock;
/// let clock = ManualClock::new(1_000);
/// let wall = clock.wall_clock();
/// clock.advance(500);
/// assert_eq!(wall(), 1_500);
/// clock.set(10);
/// assert_eq!(wall(), 10);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// The current reading.
    pub fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    /// Sets the reading; it may go backwards, as a real wall clock can.
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the reading forward by `delta_ms`, saturating at `u64::MAX`.
    pub fn advance(&self, delta_ms: u64) {
        // fetch_update never fails when the closure always returns Some.
        let _ = self
            .now_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(delta_ms))
            });
    }

    /// This clock as a [`WallClock`] (sharing the same reading).
    pub fn wall_clock(&self) -> WallClock {
        let now_ms = Arc::clone(&self.now_ms);
        Arc::new(move || now_ms.load(Ordering::SeqCst))
    }
}

/// A hybrid logical clock stamp.
///
/// Ordered by `wall_ms`, then `counter`, then `device_id`: a total order in which stamps from
/// different devices never tie.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hlc {
    /// Physical part: milliseconds since the Unix epoch (or ahead of it, after merging a peer).
    pub wall_ms: u64,
    /// Logical part: orders stamps within one `wall_ms`.
    pub counter: u32,
    /// The device that issued the stamp.
    pub device_id: Arc<str>,
}

/// Settings of an [`HlcClock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HlcConfig {
    /// How far ahead of the local wall clock a remote stamp may be and still be merged.
    pub max_skew_ms: u64,
}

impl HlcConfig {
    /// The default maximum skew: one minute.
    pub const DEFAULT_MAX_SKEW_MS: u64 = 60_000;
}

impl Default for HlcConfig {
    fn default() -> Self {
        Self {
            max_skew_ms: Self::DEFAULT_MAX_SKEW_MS,
        }
    }
}

/// Why a remote stamp was not merged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClockError {
    /// The remote stamp is further ahead of the local wall clock than the configured maximum skew.
    #[error(
        "stamp from device {device_id:?} is {ahead_ms} ms ahead of the local wall clock \
         ({remote_wall_ms} vs {local_wall_ms}); at most {max_skew_ms} ms is accepted"
    )]
    TooFarAhead {
        /// The device named in the remote stamp.
        device_id: String,
        /// The remote stamp's wall time.
        remote_wall_ms: u64,
        /// The local wall clock when the stamp was refused.
        local_wall_ms: u64,
        /// How far ahead the remote stamp was.
        ahead_ms: u64,
        /// The configured limit.
        max_skew_ms: u64,
    },
}

/// Issues strictly increasing [`Hlc`] stamps for one device (rule C1).
///
/// ```
/// use fencepost::clock::{HlcClock, HlcConfig, ManualClock};
/// let wall = ManualClock::new(1_000);
/// let mut clock = HlcClock::new("laptop", wall.wall_clock(), HlcConfig::default());
/// let first = clock.tick();
/// wall.set(900); // the wall clock goes backwards
/// let second = clock.tick();
/// assert!(second > first);
/// ```
#[derive(Clone)]
pub struct HlcClock {
    device_id: Arc<str>,
    wall_clock: WallClock,
    config: HlcConfig,
    last_wall_ms: u64,
    last_counter: u32,
}

impl std::fmt::Debug for HlcClock {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("HlcClock")
            .field("device_id", &self.device_id)
            .field("config", &self.config)
            .field("last_wall_ms", &self.last_wall_ms)
            .field("last_counter", &self.last_counter)
            .finish_non_exhaustive()
    }
}

impl HlcClock {
    /// A clock for `device_id` that has issued nothing yet.
    pub fn new(device_id: impl Into<Arc<str>>, wall_clock: WallClock, config: HlcConfig) -> Self {
        Self {
            device_id: device_id.into(),
            wall_clock,
            config,
            last_wall_ms: 0,
            last_counter: 0,
        }
    }

    /// A clock whose next stamp follows `last`, a stamp this device issued before (for example
    /// the last op of its own log after a restart). No skew limit applies: these are the device's
    /// own stamps.
    pub fn resume(
        device_id: impl Into<Arc<str>>,
        wall_clock: WallClock,
        config: HlcConfig,
        last: &Hlc,
    ) -> Self {
        let mut clock = Self::new(device_id, wall_clock, config);
        clock.last_wall_ms = last.wall_ms;
        clock.last_counter = last.counter;
        clock
    }

    /// The device this clock stamps for.
    pub fn device_id(&self) -> &Arc<str> {
        &self.device_id
    }

    /// The configuration.
    pub fn config(&self) -> HlcConfig {
        self.config
    }

    /// A new stamp, strictly greater than every stamp issued or observed before.
    ///
    /// # Panics
    /// Only if the stamp space is exhausted (see [`try_tick`](Self::try_tick), which says so with
    /// an error instead).
    pub fn tick(&mut self) -> Hlc {
        self.try_tick()
            .expect("HLC exhausted: the last stamp is the largest there is")
    }

    /// A new stamp, strictly greater than every stamp issued or observed before; `None` when the
    /// last stamp is `(u64::MAX, u32::MAX)`, the largest there is (a forged or damaged record of
    /// this device can carry it, and a [`WallClock`] that reads `u64::MAX` can reach it). The
    /// clock is unchanged then.
    pub fn try_tick(&mut self) -> Option<Hlc> {
        let now_ms = (self.wall_clock)();
        if now_ms > self.last_wall_ms {
            self.last_wall_ms = now_ms;
            self.last_counter = 0;
        } else if self.last_counter < u32::MAX {
            self.last_counter += 1;
        } else {
            self.last_wall_ms = self.last_wall_ms.checked_add(1)?;
            self.last_counter = 0;
        }
        Some(Hlc {
            wall_ms: self.last_wall_ms,
            counter: self.last_counter,
            device_id: Arc::clone(&self.device_id),
        })
    }

    /// Moves the clock past `own`, a stamp this device issued (read back from its own log, for
    /// example written by another process of the same device). No skew limit applies.
    pub fn observe_own(&mut self, own: &Hlc) {
        if (own.wall_ms, own.counter) > (self.last_wall_ms, self.last_counter) {
            self.last_wall_ms = own.wall_ms;
            self.last_counter = own.counter;
        }
    }

    /// Merges a stamp received from a peer, so that every later [`tick`](Self::tick) is greater.
    ///
    /// A stamp more than `max_skew_ms` ahead of the local wall clock is refused with
    /// [`ClockError::TooFarAhead`] and the clock is left unchanged.
    pub fn observe(&mut self, remote: &Hlc) -> Result<(), ClockError> {
        let local_wall_ms = (self.wall_clock)();
        let limit_ms = local_wall_ms.saturating_add(self.config.max_skew_ms);
        if remote.wall_ms > limit_ms {
            return Err(ClockError::TooFarAhead {
                device_id: remote.device_id.to_string(),
                remote_wall_ms: remote.wall_ms,
                local_wall_ms,
                ahead_ms: remote.wall_ms - local_wall_ms,
                max_skew_ms: self.config.max_skew_ms,
            });
        }
        if (remote.wall_ms, remote.counter) > (self.last_wall_ms, self.last_counter) {
            self.last_wall_ms = remote.wall_ms;
            self.last_counter = remote.counter;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock_at(start_ms: u64) -> (ManualClock, HlcClock) {
        let wall = ManualClock::new(start_ms);
        let clock = HlcClock::new("local", wall.wall_clock(), HlcConfig { max_skew_ms: 1_000 });
        (wall, clock)
    }

    fn remote(wall_ms: u64, counter: u32) -> Hlc {
        Hlc {
            wall_ms,
            counter,
            device_id: Arc::from("remote"),
        }
    }

    #[test]
    fn c1_tick_is_strictly_increasing_under_wall_clock_regression() {
        let (wall, mut clock) = clock_at(10_000);
        let mut previous = clock.tick();
        for now in [9_000, 5_000, 10_000, 10_000, 0, 10_001, 10_001] {
            wall.set(now);
            let next = clock.tick();
            assert!(next > previous, "{next:?} after {previous:?} at wall {now}");
            previous = next;
        }
        assert_eq!(previous.wall_ms, 10_001);
    }

    #[test]
    fn c1_tick_is_strictly_increasing_in_a_same_millisecond_burst() {
        let (_wall, mut clock) = clock_at(42);
        let stamps: Vec<Hlc> = (0..10_000).map(|_| clock.tick()).collect();
        assert!(stamps.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(stamps.last().map(|s| (s.wall_ms, s.counter)), Some((42, 9_999)));
    }

    #[test]
    fn c1_counter_overflow_carries_into_wall_time() {
        let (_wall, mut clock) = clock_at(5);
        clock.observe(&remote(5, u32::MAX)).unwrap();
        let next = clock.tick();
        assert_eq!((next.wall_ms, next.counter), (6, 0));
    }

    #[test]
    fn c1_observe_makes_later_ticks_exceed_a_peer_future_stamp() {
        let (_wall, mut clock) = clock_at(1_000);
        let peer = remote(1_800, 7);
        clock.observe(&peer).unwrap();
        let next = clock.tick();
        assert!((next.wall_ms, next.counter) > (peer.wall_ms, peer.counter));
        assert_eq!((next.wall_ms, next.counter), (1_800, 8));
        // An older remote stamp changes nothing.
        clock.observe(&remote(10, 0)).unwrap();
        assert_eq!(
            (clock.tick().wall_ms, clock.tick().counter),
            (1_800, 10),
            "observing an old stamp must not move the clock back"
        );
    }

    #[test]
    fn c1_observe_refuses_a_stamp_beyond_max_skew_and_leaves_the_clock_unchanged() {
        let (_wall, mut clock) = clock_at(1_000);
        let before = clock.tick();
        for forged in [remote(2_001, 0), remote(u64::MAX, u32::MAX)] {
            let error = clock.observe(&forged).unwrap_err();
            assert!(matches!(
                error,
                ClockError::TooFarAhead {
                    local_wall_ms: 1_000,
                    max_skew_ms: 1_000,
                    ..
                }
            ));
            assert!(error.to_string().contains("ahead of the local wall clock"));
        }
        let after = clock.tick();
        assert_eq!(
            (after.wall_ms, after.counter),
            (before.wall_ms, before.counter + 1)
        );
        // Exactly at the limit is accepted.
        clock.observe(&remote(2_000, 0)).unwrap();
        assert_eq!(clock.tick().wall_ms, 2_000);
    }

    #[test]
    fn c1_skew_is_measured_against_the_wall_clock_not_a_ratcheted_hlc() {
        let (_wall, mut clock) = clock_at(1_000);
        clock.observe(&remote(2_000, 0)).unwrap();
        // A second stamp within max_skew of the *HLC* but not of the wall clock is refused.
        assert!(clock.observe(&remote(2_500, 0)).is_err());
    }

    #[test]
    fn c1_resume_continues_after_the_devices_own_last_stamp() {
        let wall = ManualClock::new(100);
        let last = Hlc {
            wall_ms: 5_000,
            counter: 3,
            device_id: Arc::from("local"),
        };
        let mut clock = HlcClock::resume("local", wall.wall_clock(), HlcConfig::default(), &last);
        assert!(clock.tick() > last);
    }

    #[test]
    fn hlc_order_is_total_wall_then_counter_then_device() {
        let a = Hlc {
            wall_ms: 1,
            counter: 5,
            device_id: Arc::from("z"),
        };
        let b = Hlc {
            wall_ms: 2,
            counter: 0,
            device_id: Arc::from("a"),
        };
        let c = Hlc {
            wall_ms: 2,
            counter: 0,
            device_id: Arc::from("b"),
        };
        assert!(a < b && b < c);
    }

    #[test]
    fn manual_clock_is_shared_across_clones_and_threads() {
        let clock = ManualClock::new(0);
        let wall = clock.wall_clock();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let clock = clock.clone();
                std::thread::spawn(move || (0..1_000).for_each(|_| clock.advance(1)))
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(wall(), 4_000);
        clock.advance(u64::MAX);
        assert_eq!(clock.now_ms(), u64::MAX);
    }
}
