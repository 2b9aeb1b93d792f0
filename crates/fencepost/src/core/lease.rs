//! Execution leases with fencing tokens, and the intent vocabulary ([`Intent`], [`IntentStatus`],
//! the `intent_*` readers), which is written in its own room and public here only, as the seed
//! pins it.
//!
//! # The lease is for liveness; only the fence is for safety
//!
//! A [`LeaseCoordinator`] is a linearizable compare-and-swap register per agent:
//! `{agent_id, holder, epoch, expires_at_ms}`. Every successful [`acquire`](LeaseCoordinator::acquire)
//! mints a new **epoch**, strictly greater than every epoch the agent had before: the fencing token.
//!
//! Holding a lease does **not** make an effect safe. A holder can pause (a GC, a laptop lid, a
//! network partition) past its TTL, lose the lease to another site, wake up and act anyway. What
//! makes execution safe is the *fence*: each site records [`Intent`]s in its op log at its epoch,
//! the fold fences intents of stale epochs and remembers every commit, and
//! [`check_dispatch`](crate::fence::check_dispatch) runs right before the effect.
//!
//! What this module does **not** deliver: exactly-once against a resource that ignores the token. A
//! holder can pass the fence and pause before its write lands; only a resource that checks the
//! fencing token (or an idempotency key) closes that window.
//!

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use thiserror::Error;

use crate::core::clock::WallClock;
use crate::core::frontier::Frontier;
use crate::id::{validate_id, IdError, IdKind};

pub use crate::intent::{
    intent_agent, intent_epoch, intent_is_committed, intent_status_rank, Intent, IntentStatus,
    INTENT_FIELD_AGENT, INTENT_FIELD_EPOCH, INTENT_FIELD_ID, INTENT_FIELD_STATUS, MAX_EPOCH,
};

/// The longest TTL accepted: ten years. Longer ones are refused rather than saturated, so that every
/// backend can store `expires_at_ms` as a signed 64-bit number.
pub const MAX_TTL_MS: u64 = 10 * 365 * 24 * 60 * 60 * 1000;

/// The highest epoch floor accepted (epochs fit a signed 64-bit column in every backend).
pub const MAX_EPOCH_FLOOR: u64 = MAX_EPOCH - 1;

/// The latest expiry any coordinator records: `now + ttl_ms` saturates here, so that every backend
/// stores the same value in a signed 64-bit column (rule L1).
pub const MAX_EXPIRES_AT_MS: u64 = i64::MAX as u64;

/// `now_ms + ttl_ms`, saturating at [`MAX_EXPIRES_AT_MS`] (rule L1).
pub fn expiry_after(now_ms: u64, ttl_ms: u64) -> u64 {
    now_ms.saturating_add(ttl_ms).min(MAX_EXPIRES_AT_MS)
}

/// A granted lease: `holder` may act for `agent_id` at `epoch` until `expires_at_ms` (by the
/// coordinator's clock), and should renew well before then.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The agent.
    pub agent_id: String,
    /// The device holding it.
    pub holder: String,
    /// The fencing token minted by the grant.
    pub epoch: u64,
    /// When it expires, in milliseconds since the Unix epoch, by the coordinator's clock.
    pub expires_at_ms: u64,
}

/// A failure of the coordinator's storage (rule L7): not a verdict on the lease.
///
/// `may_have_applied` says whether the operation might have taken effect anyway (for example a
/// connection lost after the compare-and-swap was sent). When it is `true`, call
/// [`LeaseCoordinator::current`] to find out before acting.
#[derive(Debug, Error)]
#[error("{backend} coordinator failed: {message} ({})", if *.may_have_applied {
    "the operation may have taken effect; read current() to find out"
} else {
    "the operation did not take effect"
})]
pub struct BackendError {
    /// Which backend (`"sqlite"`, `"postgres"`, …).
    pub backend: &'static str,
    /// What went wrong.
    pub message: String,
    /// Whether the operation may have taken effect.
    pub may_have_applied: bool,
    /// Whether the failure may pass by itself: the server or a pooler in front of it
    /// restarting, refusing logins for a while, a lost connection, no answer in time, a lock
    /// held by another writer. Trying again (after a pause) may succeed; a wrong password, a
    /// missing schema or a corrupt row will not.
    pub transient: bool,
    /// The underlying error, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Why a lease operation did not succeed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A still-valid lease exists (held by anyone, the caller included) (rule L1).
    #[error("agent {agent_id:?} is held by {holder:?} at epoch {epoch} until {expires_at_ms} ms")]
    Held {
        /// The agent.
        agent_id: String,
        /// Who holds it.
        holder: String,
        /// At which epoch.
        epoch: u64,
        /// Until when.
        expires_at_ms: u64,
    },
    /// The caller does not hold the lease at the epoch it claims (rules L2, L3).
    #[error("the lease of agent {agent_id:?} at epoch {claimed_epoch} is lost; the current epoch is {current_epoch}")]
    Lost {
        /// The agent.
        agent_id: String,
        /// The epoch the caller claimed.
        claimed_epoch: u64,
        /// The agent's current (latest) epoch; 0 when it was never held.
        current_epoch: u64,
    },
    /// An agent or device id breaks rule L8.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// A TTL of 0 or above [`MAX_TTL_MS`] (rule L8).
    #[error("ttl_ms {ttl_ms} is not allowed; it must be between 1 and {max_ttl_ms}")]
    InvalidTtl {
        /// The TTL given.
        ttl_ms: u64,
        /// The largest accepted.
        max_ttl_ms: u64,
    },
    /// An epoch floor above [`MAX_EPOCH_FLOOR`].
    #[error("epoch floor {floor} is above the largest allowed, {max_floor}")]
    InvalidEpochFloor {
        /// The floor given.
        floor: u64,
        /// The largest accepted.
        max_floor: u64,
    },
    /// A frontier to publish names a seq beyond what a coordinator stores (rule L8).
    #[error(
        "device {device_id:?}: next seq {next_seq} is above the largest a coordinator stores, {max_seq}"
    )]
    InvalidFrontier {
        /// The device.
        device_id: String,
        /// The seq given.
        next_seq: u64,
        /// The largest accepted.
        max_seq: u64,
    },
    /// The coordinator's storage failed (rule L7); see [`BackendError::may_have_applied`].
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The agent's next epoch would be above [`MAX_EPOCH`] (rule L5): no lease can be granted
    /// without reusing an epoch. Nothing changed. Only a forged or damaged epoch floor gets here;
    /// use a new agent id.
    #[error("agent {agent_id:?} has used every epoch up to {last_epoch}; no new epoch can be minted (use a new agent id)")]
    EpochsExhausted {
        /// The agent.
        agent_id: String,
        /// The last epoch (or floor) it has.
        last_epoch: u64,
    },
}

impl LeaseError {
    /// Whether trying again later may succeed: a storage failure that may pass by itself
    /// ([`BackendError::transient`]). A verdict (held, lost) and bad input are not.
    pub fn is_transient(&self) -> bool {
        matches!(self, LeaseError::Backend(error) if error.transient)
    }
}

/// A linearizable compare-and-swap register of leases, one per agent.
///
/// Every method is linearizable: it takes effect atomically at one instant between its call and its
/// return. Time is the **coordinator's** clock. Methods take `&self`; the trait is object safe.
///
/// Errors common to all methods: [`LeaseError::InvalidId`] (and [`LeaseError::InvalidTtl`] where a
/// TTL is taken) for bad input, before anything is read or written; [`LeaseError::Backend`] for a
/// storage failure, which says whether the operation may have taken effect (rule L7).
pub trait LeaseCoordinator: Send + Sync {
    /// Grants the lease to `device_id` for `ttl_ms` (rule L1).
    ///
    /// * `Ok(lease)` — the agent had no holder, or its lease had expired (`now ≥ expires_at_ms`).
    ///   `lease.epoch` is one more than the agent's previous epoch (or than the epoch floor, if
    ///   higher); `lease.expires_at_ms = now + ttl_ms`, saturating at [`MAX_EXPIRES_AT_MS`].
    /// * `Err(Held)` — a still-valid lease exists, whoever holds it (the caller too). Nothing changed.
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError>;

    /// Extends the caller's lease to `now + ttl_ms` (rule L2), keeping its epoch.
    ///
    /// * `Ok(lease)` — `device_id` holds the agent at `epoch`, expired or not (nobody took it).
    /// * `Err(Lost)` — another holder, another epoch, or no holder. Nothing changed.
    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError>;

    /// Gives the lease up (rule L3): the holder is cleared and the epoch kept, so the next acquire
    /// succeeds at once with the next epoch.
    ///
    /// * `Ok(())` — `device_id` held the agent at `epoch`.
    /// * `Err(Lost)` — it did not. Nothing changed.
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError>;

    /// The agent's current lease (rule L4): `Some` while a holder is set, expired or not; `None` if
    /// the agent was never held or was released.
    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError>;

    /// Makes every later grant of the agent mint an epoch of at least `floor + 1` (rule L5).
    /// Monotone and idempotent: a lower floor than the current one changes nothing. Callers seed it
    /// from the ledger (the folded fencing epoch) after coordinator state may have been lost.
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError>;

    /// Publishes what the holder has pushed of its ledger (rule H1): for each device, the next
    /// seq of the records pushed to the relay. Conditional on `device_id` holding the agent at
    /// `epoch` (expired or not, as for [`renew`](Self::renew)), so that a zombie publishes
    /// nothing; monotone, device by device (a lower seq than the published one changes nothing);
    /// cumulative over every holder of the agent, and kept across release and, for durable
    /// backends, restarts (rule H4).
    ///
    /// * `Ok(())` — published.
    /// * `Err(Lost)` — `device_id` does not hold the agent at `epoch`. Nothing changed.
    /// * `Err(InvalidId)` — an invalid agent or device id, the frontier's included.
    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError>;

    /// The agent's published frontier (rule H1): every device's largest published next seq, over
    /// every holder; empty when nothing was published. A new holder dispatches nothing until its
    /// ledger has received at least this (rule H3).
    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError>;

    /// [`acquire`](Self::acquire), then [`published_frontier`](Self::published_frontier): what a
    /// new holder reads right after its grant (rule H3), in one round trip where the backend can
    /// (SQLite and PostgreSQL do; the default makes the two calls). The frontier is `None` when
    /// the lease was granted and the read failed: the lease is held either way.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    fn acquire_handing_over(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<(Lease, Option<Frontier>), LeaseError> {
        let lease = self.acquire(agent_id, device_id, ttl_ms)?;
        Ok((lease, self.published_frontier(agent_id).ok()))
    }

    /// [`renew`](Self::renew), then [`publish_frontier`](Self::publish_frontier) of `frontier`:
    /// outcomes ride on a renewal (rule H2), in one round trip where the backend can (SQLite and
    /// PostgreSQL do, in one transaction). `Ok((lease, true))` when both took effect;
    /// `Ok((lease, false))` when the renewal did and the publication did not (send it again with
    /// the next renewal). Nothing is published when the renewal is refused.
    ///
    /// # Errors
    /// As [`renew`](Self::renew).
    fn renew_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
        frontier: &Frontier,
    ) -> Result<(Lease, bool), LeaseError> {
        let lease = self.renew(agent_id, device_id, epoch, ttl_ms)?;
        let published = self
            .publish_frontier(agent_id, device_id, epoch, frontier)
            .is_ok();
        Ok((lease, published))
    }

    /// [`publish_frontier`](Self::publish_frontier) of `frontier`, then
    /// [`release`](Self::release): the last outcomes published before the lease is given back
    /// (rule H2), in one round trip where the backend can (SQLite and PostgreSQL do, in one
    /// transaction). A publication that fails does not keep the lease from being released.
    ///
    /// # Errors
    /// As [`release`](Self::release).
    fn release_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        if let Err(error) = self.publish_frontier(agent_id, device_id, epoch, frontier) {
            tracing::debug!(agent_id, %error, "publishing before the release failed");
        }
        self.release(agent_id, device_id, epoch)
    }
}

/// A shared coordinator is a coordinator (so `Arc<dyn LeaseCoordinator>` can be handed around).
impl<T: LeaseCoordinator + ?Sized> LeaseCoordinator for Arc<T> {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        (**self).acquire(agent_id, device_id, ttl_ms)
    }
    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        (**self).renew(agent_id, device_id, epoch, ttl_ms)
    }
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        (**self).release(agent_id, device_id, epoch)
    }
    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        (**self).current(agent_id)
    }
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        (**self).raise_epoch_floor(agent_id, floor)
    }
    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        (**self).publish_frontier(agent_id, device_id, epoch, frontier)
    }
    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError> {
        (**self).published_frontier(agent_id)
    }
    fn acquire_handing_over(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<(Lease, Option<Frontier>), LeaseError> {
        (**self).acquire_handing_over(agent_id, device_id, ttl_ms)
    }
    fn renew_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
        frontier: &Frontier,
    ) -> Result<(Lease, bool), LeaseError> {
        (**self).renew_publishing(agent_id, device_id, epoch, ttl_ms, frontier)
    }
    fn release_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        (**self).release_publishing(agent_id, device_id, epoch, frontier)
    }
}

/// Checks the arguments of [`LeaseCoordinator::publish_frontier`] (rule L8): the agent and device
/// ids, and the frontier's ([`validate_frontier`]).
pub fn validate_publish(agent_id: &str, device_id: &str, frontier: &Frontier) -> Result<(), LeaseError> {
    validate_id(IdKind::Agent, agent_id)?;
    validate_id(IdKind::Device, device_id)?;
    validate_frontier(frontier)
}

/// Checks the ids and seqs of a frontier to publish (rule L8): every device id valid, every seq
/// within the signed 64-bit range a database column holds.
pub fn validate_frontier(frontier: &Frontier) -> Result<(), LeaseError> {
    for (device, next_seq) in frontier.iter() {
        validate_id(IdKind::Device, device)?;
        if next_seq > i64::MAX as u64 {
            return Err(LeaseError::InvalidFrontier {
                device_id: device.to_owned(),
                next_seq,
                max_seq: i64::MAX as u64,
            });
        }
    }
    Ok(())
}

/// Checks a TTL (rule L8).
pub fn validate_ttl(ttl_ms: u64) -> Result<(), LeaseError> {
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(LeaseError::InvalidTtl {
            ttl_ms,
            max_ttl_ms: MAX_TTL_MS,
        });
    }
    Ok(())
}

/// Checks an epoch floor.
pub fn validate_epoch_floor(floor: u64) -> Result<(), LeaseError> {
    if floor > MAX_EPOCH_FLOOR {
        return Err(LeaseError::InvalidEpochFloor {
            floor,
            max_floor: MAX_EPOCH_FLOOR,
        });
    }
    Ok(())
}

/// One agent's register.
#[derive(Debug, Clone, Default)]
struct Register {
    holder: Option<String>,
    /// The last epoch minted (kept across release).
    epoch: u64,
    expires_at_ms: u64,
    /// The epoch floor (rule L5).
    floor: u64,
    /// The published frontier (rule H1).
    published: Frontier,
}

/// The reference coordinator: a map of registers behind a mutex, with an injected clock.
///
/// Linearizable within one process (every operation holds the mutex). Its epochs live as long as
/// the process: for durability use a database backend, or seed the floor from the ledger after a
/// restart (rule L5). `Clone` shares one set of registers.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::lease::{InMemoryLeaseCoordinator, LeaseCoordinator, LeaseError};
///
/// let clock = ManualClock::new(0);
/// let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
/// let lease = coordinator.acquire("milo", "laptop", 10_000)?;
/// assert_eq!(lease.epoch, 1);
/// assert!(matches!(coordinator.acquire("milo", "phone", 10_000), Err(LeaseError::Held { .. })));
/// clock.advance(10_000); // the laptop paused past its TTL
/// let stolen = coordinator.acquire("milo", "phone", 10_000)?;
/// assert_eq!(stolen.epoch, 2);
/// assert!(matches!(coordinator.renew("milo", "laptop", 1, 10_000), Err(LeaseError::Lost { .. })));
/// # Ok::<(), LeaseError>(())
/// ```
#[derive(Clone)]
pub struct InMemoryLeaseCoordinator {
    clock: WallClock,
    registers: Arc<Mutex<BTreeMap<String, Register>>>,
}

impl std::fmt::Debug for InMemoryLeaseCoordinator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("InMemoryLeaseCoordinator")
            .finish_non_exhaustive()
    }
}

impl InMemoryLeaseCoordinator {
    /// A coordinator with no leases, reading time from `clock`.
    pub fn new(clock: WallClock) -> Self {
        Self {
            clock,
            registers: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    fn registers(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Register>> {
        // Every operation checks before it writes, and writes one register in one assignment, so a
        // panic elsewhere cannot leave a register half-changed.
        self.registers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn lease_of(agent_id: &str, register: &Register) -> Option<Lease> {
    register.holder.as_ref().map(|holder| Lease {
        agent_id: agent_id.to_owned(),
        holder: holder.clone(),
        epoch: register.epoch,
        expires_at_ms: register.expires_at_ms,
    })
}

fn lost(agent_id: &str, claimed_epoch: u64, register: Option<&Register>) -> LeaseError {
    LeaseError::Lost {
        agent_id: agent_id.to_owned(),
        claimed_epoch,
        current_epoch: register.map_or(0, |register| register.epoch),
    }
}

impl LeaseCoordinator for InMemoryLeaseCoordinator {
    fn acquire(&self, agent_id: &str, device_id: &str, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let mut registers = self.registers();
        let now_ms = (self.clock)();
        let register = registers.entry(agent_id.to_owned()).or_default();
        if let Some(holder) = &register.holder {
            if now_ms < register.expires_at_ms {
                return Err(LeaseError::Held {
                    agent_id: agent_id.to_owned(),
                    holder: holder.clone(),
                    epoch: register.epoch,
                    expires_at_ms: register.expires_at_ms,
                });
            }
        }
        let last_epoch = register.epoch.max(register.floor);
        if last_epoch >= MAX_EPOCH {
            return Err(LeaseError::EpochsExhausted {
                agent_id: agent_id.to_owned(),
                last_epoch,
            });
        }
        let epoch = last_epoch + 1;
        register.holder = Some(device_id.to_owned());
        register.epoch = epoch;
        register.expires_at_ms = expiry_after(now_ms, ttl_ms);
        Ok(lease_of(agent_id, register).expect("the holder was just set"))
    }

    fn renew(&self, agent_id: &str, device_id: &str, epoch: u64, ttl_ms: u64) -> Result<Lease, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        validate_ttl(ttl_ms)?;
        let mut registers = self.registers();
        let now_ms = (self.clock)();
        match registers.get_mut(agent_id) {
            Some(register) if register.holder.as_deref() == Some(device_id) && register.epoch == epoch => {
                register.expires_at_ms = expiry_after(now_ms, ttl_ms);
                Ok(lease_of(agent_id, register).expect("the holder is set"))
            }
            other => Err(lost(agent_id, epoch, other.as_deref())),
        }
    }

    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_id(IdKind::Device, device_id)?;
        let mut registers = self.registers();
        match registers.get_mut(agent_id) {
            Some(register) if register.holder.as_deref() == Some(device_id) && register.epoch == epoch => {
                register.holder = None;
                Ok(())
            }
            other => Err(lost(agent_id, epoch, other.as_deref())),
        }
    }

    fn current(&self, agent_id: &str) -> Result<Option<Lease>, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        let registers = self.registers();
        Ok(registers
            .get(agent_id)
            .and_then(|register| lease_of(agent_id, register)))
    }

    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        validate_epoch_floor(floor)?;
        let mut registers = self.registers();
        let register = registers.entry(agent_id.to_owned()).or_default();
        register.floor = register.floor.max(floor);
        Ok(())
    }

    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        validate_publish(agent_id, device_id, frontier)?;
        let mut registers = self.registers();
        match registers.get_mut(agent_id) {
            Some(register) if register.holder.as_deref() == Some(device_id) && register.epoch == epoch => {
                register.published.merge(frontier);
                Ok(())
            }
            other => Err(lost(agent_id, epoch, other.as_deref())),
        }
    }

    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError> {
        validate_id(IdKind::Agent, agent_id)?;
        let registers = self.registers();
        Ok(registers
            .get(agent_id)
            .map(|register| register.published.clone())
            .unwrap_or_default())
    }
}
