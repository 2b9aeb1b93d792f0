//! The linearizability model of one lease register and its published frontier ([`LeaseSpec`],
//! the sequential specification
//! the Wing–Gong–Lowe checker of `todc-utils` runs against) and the recorders of concurrent
//! histories (threads, [`record_thread_history`]; processes, [`run_history_worker`]) that rule L6
//! is checked with.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Barrier, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use todc_utils::linearizability::history::{Action, History};
use todc_utils::linearizability::WGLChecker;
use todc_utils::specifications::Specification;

use super::Harness;
use crate::lease::{expiry_after, Lease, LeaseCoordinator, LeaseError};
use crate::relay::Frontier;

/// One operation on the history's single agent, with its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LeaseOp {
    /// `acquire(device, ttl_ms)`.
    Acquire {
        /// The caller.
        device: u8,
        /// The TTL asked for.
        ttl_ms: u64,
        /// What happened.
        outcome: Outcome,
    },
    /// `renew(device, epoch, ttl_ms)`.
    Renew {
        /// The caller.
        device: u8,
        /// The epoch claimed.
        epoch: u64,
        /// The TTL asked for.
        ttl_ms: u64,
        /// What happened.
        outcome: Outcome,
    },
    /// `release(device, epoch)`.
    Release {
        /// The caller.
        device: u8,
        /// The epoch claimed.
        epoch: u64,
        /// What happened.
        outcome: Outcome,
    },
    /// `current()`.
    Current {
        /// What happened.
        outcome: Outcome,
    },
    /// `publish_frontier(device, epoch, {device: next_seq})` (rule H1).
    Publish {
        /// The caller, and the one device of the frontier it publishes.
        device: u8,
        /// The epoch claimed.
        epoch: u64,
        /// The next seq published for the caller's device.
        next_seq: u64,
        /// What happened.
        outcome: Outcome,
    },
    /// `published_frontier()` (rule H1).
    Published {
        /// What happened.
        outcome: Outcome,
    },
    /// The coordinator's clock moved forward.
    Advance {
        /// By how much.
        ms: u64,
    },
}

/// The outcome of a [`LeaseOp`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// A lease (granted, renewed, or the current one).
    Lease {
        /// The holder.
        device: u8,
        /// Its epoch.
        epoch: u64,
        /// Its expiry.
        expires_at_ms: u64,
    },
    /// `Held` by this lease.
    Held {
        /// The holder.
        device: u8,
        /// Its epoch.
        epoch: u64,
        /// Its expiry.
        expires_at_ms: u64,
    },
    /// `Lost`, with the current epoch.
    Lost {
        /// The agent's current epoch.
        current_epoch: u64,
    },
    /// `Ok(())` of release or publish, or `current()` returning `None`.
    Done,
    /// The published frontier: the next seq of each history device, by index (0 when none).
    Frontier {
        /// Device `i`'s next seq at index `i`.
        next_seq: [u64; HISTORY_DEVICES],
    },
}

/// How many devices a recorded history may have (the model's frontier has one entry each).
pub const HISTORY_DEVICES: usize = 16;

/// The sequential model of one agent's register, with the coordinator clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModelState {
    now_ms: u64,
    holder: Option<u8>,
    epoch: u64,
    expires_at_ms: u64,
    published: [u64; HISTORY_DEVICES],
}

/// The sequential specification of a lease register, for the WGL checker.
pub struct LeaseSpec;

/// Where the model's clock starts; recorded histories are rebased to it ([`rebase`]).
pub const HISTORY_START_MS: u64 = 1_000_000;

impl Specification for LeaseSpec {
    type State = ModelState;
    type Operation = LeaseOp;

    fn init() -> ModelState {
        ModelState {
            now_ms: HISTORY_START_MS,
            ..ModelState::default()
        }
    }

    fn apply(operation: &LeaseOp, state: &ModelState) -> (bool, ModelState) {
        let mut next = *state;
        let expected = match operation {
            LeaseOp::Advance { ms } => {
                next.now_ms += ms;
                return (true, next);
            }
            LeaseOp::Acquire {
                device,
                ttl_ms,
                outcome,
            } => match state.holder {
                Some(holder) if state.now_ms < state.expires_at_ms => (
                    Outcome::Held {
                        device: holder,
                        epoch: state.epoch,
                        expires_at_ms: state.expires_at_ms,
                    },
                    outcome,
                ),
                _ => {
                    // Rule L1: a grant mints an epoch above the last one; a durable backend's
                    // may skip ahead to its epoch clock (rule L5), so a recorded grant above
                    // the last epoch is the one minted.
                    next.holder = Some(*device);
                    next.epoch = match outcome {
                        Outcome::Lease { epoch, .. } if *epoch > state.epoch => *epoch,
                        _ => state.epoch + 1,
                    };
                    next.expires_at_ms = expiry_after(state.now_ms, *ttl_ms);
                    (
                        Outcome::Lease {
                            device: *device,
                            epoch: next.epoch,
                            expires_at_ms: next.expires_at_ms,
                        },
                        outcome,
                    )
                }
            },
            LeaseOp::Renew {
                device,
                epoch,
                ttl_ms,
                outcome,
            } => {
                if state.holder == Some(*device) && state.epoch == *epoch {
                    next.expires_at_ms = expiry_after(state.now_ms, *ttl_ms);
                    (
                        Outcome::Lease {
                            device: *device,
                            epoch: *epoch,
                            expires_at_ms: next.expires_at_ms,
                        },
                        outcome,
                    )
                } else {
                    (
                        Outcome::Lost {
                            current_epoch: state.epoch,
                        },
                        outcome,
                    )
                }
            }
            LeaseOp::Release {
                device,
                epoch,
                outcome,
            } => {
                if state.holder == Some(*device) && state.epoch == *epoch {
                    next.holder = None;
                    (Outcome::Done, outcome)
                } else {
                    (
                        Outcome::Lost {
                            current_epoch: state.epoch,
                        },
                        outcome,
                    )
                }
            }
            LeaseOp::Publish {
                device,
                epoch,
                next_seq,
                outcome,
            } => {
                if state.holder == Some(*device) && state.epoch == *epoch {
                    if let Some(slot) = next.published.get_mut(usize::from(*device)) {
                        *slot = (*slot).max(*next_seq);
                    }
                    (Outcome::Done, outcome)
                } else {
                    (
                        Outcome::Lost {
                            current_epoch: state.epoch,
                        },
                        outcome,
                    )
                }
            }
            LeaseOp::Published { outcome } => (
                Outcome::Frontier {
                    next_seq: state.published,
                },
                outcome,
            ),
            LeaseOp::Current { outcome } => match state.holder {
                Some(holder) => (
                    Outcome::Lease {
                        device: holder,
                        epoch: state.epoch,
                        expires_at_ms: state.expires_at_ms,
                    },
                    outcome,
                ),
                None => (Outcome::Done, outcome),
            },
        };
        let (model, recorded) = expected;
        if model == *recorded {
            (true, next)
        } else {
            (false, *state)
        }
    }
}

/// One end of an operation in a recorded history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The sequential process (thread, or process and thread) that ran the operation.
    pub process: usize,
    /// When, on a clock shared by every process of the history: each call is stamped before the
    /// operation starts and each return after it ends.
    pub at: u64,
    /// `true` for the return, `false` for the call.
    pub is_return: bool,
    /// The operation, with its outcome (the same on both ends).
    pub op: LeaseOp,
}

/// Checks a recorded history against [`LeaseSpec`]; `true` if it is linearizable.
///
/// Events are ordered by `at`; on a tie a call goes before a return (treating the two operations as
/// concurrent, which can only accept more histories, never reject a valid one).
pub fn check_history(mut events: Vec<Event>) -> bool {
    if events.is_empty() {
        return true;
    }
    events.sort_by_key(|event| (event.at, event.is_return));
    let actions = events
        .into_iter()
        .map(|event| {
            let action = if event.is_return {
                Action::Response(event.op)
            } else {
                Action::Call(event.op)
            };
            (event.process, action)
        })
        .collect();
    WGLChecker::<LeaseSpec>::is_linearizable(History::from_actions(actions))
}

/// Settings of a recorded history.
#[derive(Debug, Clone, Copy)]
pub struct HistoryConfig {
    /// How many histories to record and check.
    pub histories: usize,
    /// Worker threads per history (each with its own handle).
    pub threads: usize,
    /// Operations per worker.
    pub operations_per_thread: usize,
    /// The TTL of the history's leases (small, so that they expire mid-run).
    pub ttl_ms: u64,
    /// How far each clock step moves.
    pub advance_ms: u64,
    /// Clock steps per history.
    pub advances: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            histories: 20,
            threads: 4,
            operations_per_thread: 50,
            ttl_ms: 40,
            advance_ms: 7,
            advances: 40,
        }
    }
}

pub use crate::rng::Rng;

/// The name of device `index` in recorded histories.
pub fn history_device(index: u8) -> String {
    format!("device-{index}")
}

/// The agent recorded histories run on.
pub const HISTORY_AGENT: &str = "history";

fn outcome_of(result: Result<Option<Lease>, LeaseError>) -> Result<Outcome, LeaseError> {
    let device_of = |holder: &str| -> u8 {
        holder
            .strip_prefix("device-")
            .and_then(|index| index.parse().ok())
            .unwrap_or(u8::MAX)
    };
    match result {
        Ok(Some(lease)) => Ok(Outcome::Lease {
            device: device_of(&lease.holder),
            epoch: lease.epoch,
            expires_at_ms: lease.expires_at_ms,
        }),
        Ok(None) => Ok(Outcome::Done),
        Err(LeaseError::Held {
            holder,
            epoch,
            expires_at_ms,
            ..
        }) => Ok(Outcome::Held {
            device: device_of(&holder),
            epoch,
            expires_at_ms,
        }),
        Err(LeaseError::Lost { current_epoch, .. }) => Ok(Outcome::Lost { current_epoch }),
        Err(other) => Err(other),
    }
}

/// A published frontier as the model's outcome.
///
/// # Panics
/// On a device that is no history device: the store holds what no worker published.
fn frontier_outcome(frontier: &Frontier) -> Outcome {
    let mut next_seq = [0; HISTORY_DEVICES];
    for (device, next) in frontier.iter() {
        let index = device
            .strip_prefix("device-")
            .and_then(|index| index.parse::<usize>().ok())
            .filter(|index| *index < HISTORY_DEVICES)
            .unwrap_or_else(|| {
                panic!("H1: the published frontier names {device:?}, which no worker published")
            });
        next_seq[index] = next;
    }
    Outcome::Frontier { next_seq }
}

/// One sequential process of a recorded history.
#[derive(Debug, Clone, Copy)]
pub struct Worker {
    /// Its process number in the history (unique per history).
    pub process: usize,
    /// The device it acts as ([`history_device`]).
    pub device: u8,
    /// How many operations it runs.
    pub operations: usize,
    /// The TTL it asks for.
    pub ttl_ms: u64,
    /// The seed of its choice of operations.
    pub seed: u64,
    /// After how many of its operations it also advances the coordinator clock (0: never; a
    /// separate clock process does).
    pub advance_every: usize,
    /// How far each of its clock steps moves.
    pub advance_ms: u64,
}

/// Runs `worker`'s random operations (acquire, renew and release with the last epoch it was
/// granted, current), and its clock steps through `advance`, and reports each call and return to
/// `record`, stamped by `stamp`.
///
/// # Panics
/// If the coordinator returns an error that is not a verdict (a history with a failed operation
/// cannot be checked).
pub fn run_history_worker(
    coordinator: &dyn LeaseCoordinator,
    worker: &Worker,
    stamp: &dyn Fn() -> u64,
    advance: &dyn Fn(u64),
    record: &mut dyn FnMut(Event),
) {
    let Worker {
        process,
        device,
        operations,
        ttl_ms,
        seed,
        advance_every,
        advance_ms,
    } = *worker;
    let mut rng = Rng::new(seed);
    let name = history_device(device);
    let mut epoch = 0u64;
    let mut next_seq = 0u64;
    for done in 0..operations {
        if advance_every > 0 && done > 0 && done % advance_every == 0 {
            let at = stamp();
            advance(advance_ms);
            record_operation(
                record,
                process,
                (at, stamp()),
                LeaseOp::Advance { ms: advance_ms },
            );
        }
        let choice = rng.below(12);
        let at = stamp();
        let (op, result) = match choice {
            0..=3 => {
                let result = coordinator.acquire(HISTORY_AGENT, &name, ttl_ms).map(Some);
                (
                    LeaseOp::Acquire {
                        device,
                        ttl_ms,
                        outcome: Outcome::Done,
                    },
                    result,
                )
            }
            4..=5 => {
                let result = coordinator.renew(HISTORY_AGENT, &name, epoch, ttl_ms).map(Some);
                (
                    LeaseOp::Renew {
                        device,
                        epoch,
                        ttl_ms,
                        outcome: Outcome::Done,
                    },
                    result,
                )
            }
            6..=7 => {
                let result = coordinator.release(HISTORY_AGENT, &name, epoch).map(|()| None);
                (
                    LeaseOp::Release {
                        device,
                        epoch,
                        outcome: Outcome::Done,
                    },
                    result,
                )
            }
            10 => {
                next_seq += 1;
                let mut frontier = Frontier::new();
                frontier.raise(&name, next_seq);
                let result = coordinator
                    .publish_frontier(HISTORY_AGENT, &name, epoch, &frontier)
                    .map(|()| None);
                (
                    LeaseOp::Publish {
                        device,
                        epoch,
                        next_seq,
                        outcome: Outcome::Done,
                    },
                    result,
                )
            }
            11 => {
                let published = coordinator.published_frontier(HISTORY_AGENT);
                let returned_at = stamp();
                let outcome = match published {
                    Ok(frontier) => frontier_outcome(&frontier),
                    Err(error) => panic!("H1: a history operation failed: {error}"),
                };
                record_operation(record, process, (at, returned_at), LeaseOp::Published { outcome });
                continue;
            }
            _ => (
                LeaseOp::Current {
                    outcome: Outcome::Done,
                },
                coordinator.current(HISTORY_AGENT),
            ),
        };
        let returned_at = stamp();
        if let (LeaseOp::Acquire { .. }, Ok(Some(lease))) = (&op, &result) {
            epoch = lease.epoch;
        }
        let outcome =
            outcome_of(result).unwrap_or_else(|error| panic!("L6: a history operation failed: {error}"));
        let op = match op {
            LeaseOp::Acquire { device, ttl_ms, .. } => LeaseOp::Acquire {
                device,
                ttl_ms,
                outcome,
            },
            LeaseOp::Renew {
                device,
                epoch,
                ttl_ms,
                ..
            } => LeaseOp::Renew {
                device,
                epoch,
                ttl_ms,
                outcome,
            },
            LeaseOp::Release { device, epoch, .. } => LeaseOp::Release {
                device,
                epoch,
                outcome,
            },
            LeaseOp::Current { .. } => LeaseOp::Current { outcome },
            LeaseOp::Publish {
                device,
                epoch,
                next_seq,
                ..
            } => LeaseOp::Publish {
                device,
                epoch,
                next_seq,
                outcome,
            },
            other @ (LeaseOp::Advance { .. } | LeaseOp::Published { .. }) => other,
        };
        record_operation(record, process, (at, returned_at), op);
    }
}

/// Reports `op`'s call and return, stamped `(called, returned)`, to `record`.
fn record_operation(
    record: &mut dyn FnMut(Event),
    process: usize,
    (called, returned): (u64, u64),
    op: LeaseOp,
) {
    record(Event {
        process,
        at: called,
        is_return: false,
        op: op.clone(),
    });
    record(Event {
        process,
        at: returned,
        is_return: true,
        op,
    });
}

/// Moves every expiry in `events` so that a history whose clock started at `start_ms` reads as if
/// it had started at [`HISTORY_START_MS`], the model's start.
pub fn rebase(events: &mut [Event], start_ms: u64) {
    for event in events {
        let outcome = match &mut event.op {
            LeaseOp::Acquire { outcome, .. }
            | LeaseOp::Renew { outcome, .. }
            | LeaseOp::Release { outcome, .. }
            | LeaseOp::Current { outcome } => outcome,
            LeaseOp::Advance { .. } | LeaseOp::Publish { .. } | LeaseOp::Published { .. } => continue,
        };
        if let Outcome::Lease { expires_at_ms, .. } | Outcome::Held { expires_at_ms, .. } = outcome {
            *expires_at_ms = expires_at_ms
                .wrapping_sub(start_ms)
                .wrapping_add(HISTORY_START_MS);
        }
    }
}

/// Records one history on a fresh store of `harness`: `config.threads` workers, each with its own
/// handle, and a clock process that advances the coordinator clock in step with the workers'
/// progress, so that leases expire mid-run. Returns the events, rebased to [`HISTORY_START_MS`].
///
/// # Panics
/// If the harness does not know its clock ([`Harness::now_ms`] is `None`): the model needs it.
pub fn record_thread_history(harness: &dyn Harness, config: &HistoryConfig, seed: u64) -> Vec<Event> {
    let open = harness.fresh_store();
    let start_ms = harness
        .now_ms()
        .expect("L6 histories need a harness whose coordinator clock it knows (now_ms)");
    let sequence = AtomicU64::new(0);
    let stamp = || sequence.fetch_add(1, AtomicOrdering::SeqCst);
    let events: Mutex<Vec<Event>> = Mutex::new(Vec::new());
    let finished = AtomicUsize::new(0);
    let barrier = Barrier::new(config.threads + 1);
    let total_events = (config.threads * config.operations_per_thread * 2) as u64;
    let spacing = (total_events / (config.advances as u64 + 1)).max(1);
    std::thread::scope(|scope| {
        for thread in 0..config.threads {
            let coordinator = open();
            let (events, barrier, stamp, finished) = (&events, &barrier, &stamp, &finished);
            scope.spawn(move || {
                let worker = Worker {
                    process: thread,
                    device: thread as u8,
                    operations: config.operations_per_thread,
                    ttl_ms: config.ttl_ms,
                    seed: seed.wrapping_mul(31).wrapping_add(thread as u64),
                    advance_every: 0,
                    advance_ms: 0,
                };
                // Counts this worker as finished even if it panics, so the clock never waits for it.
                let _finished = Finished(finished);
                let mut local = Vec::new();
                barrier.wait();
                run_history_worker(&*coordinator, &worker, stamp, &|_| {}, &mut |event| {
                    local.push(event)
                });
                events
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(local);
            });
        }
        barrier.wait();
        for step in 1..=config.advances as u64 {
            // Wait until the workers have made this step's share of progress (or all finished).
            while sequence.load(AtomicOrdering::SeqCst) < step * spacing
                && finished.load(AtomicOrdering::SeqCst) < config.threads
            {
                std::thread::yield_now();
            }
            let at = stamp();
            harness.advance(config.advance_ms);
            let returned_at = stamp();
            let op = LeaseOp::Advance {
                ms: config.advance_ms,
            };
            let mut events = events.lock().unwrap_or_else(PoisonError::into_inner);
            for (stamp_at, is_return) in [(at, false), (returned_at, true)] {
                events.push(Event {
                    process: config.threads,
                    at: stamp_at,
                    is_return,
                    op: op.clone(),
                });
            }
        }
    });
    let mut events = events.into_inner().unwrap_or_else(PoisonError::into_inner);
    rebase(&mut events, start_ms);
    events
}

/// Marks a worker finished when dropped (also when it unwinds).
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, AtomicOrdering::SeqCst);
    }
}
