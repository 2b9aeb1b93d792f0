//! The dispatch fence (rule D1): the last check before a side effect.
//!
//! [`check_dispatch`] first asks the ledger's oracle whether the run already committed (on any site,
//! at any epoch), and only then asks the coordinator whether the caller still holds the agent's
//! lease at the epoch it claims. Only [`FenceDecision::Proceed`] authorizes the effect.
//!
//! The fence narrows the window in which a stale holder can act; it cannot close it. Between a
//! `Proceed` and the effect landing, the holder can pause and lose the lease. Pass the epoch to the
//! resource as a fencing token (and the run id as an idempotency key) where the resource can check
//! them; where the effect lives in the coordinator's own database, use its transactional fence.

use crate::core::frontier::Frontier;
use crate::fold::SyncState;
use crate::id::{validate_id, IdKind};
use crate::lease::{LeaseCoordinator, LeaseError};
use crate::oplog::OpId;

/// What a site hands to the resource along with the effect: who acts, for which run, under which
/// epoch. A resource that refuses an epoch lower than one it has seen for the agent, *and* a run id
/// it has already applied, stops a zombie that passed the fence before it paused, whichever effect
/// lands first ([`FencedResource`](crate::resource::FencedResource) shows both checks).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FencingToken {
    /// The agent.
    pub agent_id: String,
    /// The run: an idempotency key for the resource.
    pub run_id: String,
    /// The epoch of the lease the effect runs under.
    pub epoch: u64,
}

/// The verdict of [`check_dispatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceDecision {
    /// The run has not committed and the caller holds the lease at its epoch: go ahead.
    Proceed,
    /// The run already committed (the ledger's oracle); do not act again.
    AlreadyCommitted {
        /// The committing record.
        committed_op_id: OpId,
    },
    /// Nobody holds the lease (it was released, or never acquired).
    NotHeld {
        /// The epoch the caller claimed.
        claimed_epoch: u64,
    },
    /// Another holder, or another epoch, holds the lease: the caller is a zombie.
    StaleEpoch {
        /// The epoch the caller claimed.
        claimed_epoch: u64,
        /// The lease's current epoch.
        current_epoch: u64,
        /// Its current holder.
        current_holder: String,
    },
}

impl FenceDecision {
    /// Whether this decision authorizes the side effect (only [`FenceDecision::Proceed`] does).
    pub fn may_dispatch(&self) -> bool {
        matches!(self, FenceDecision::Proceed)
    }
}

/// Decides whether `device_id`, claiming `epoch`, may perform run `run_id` of `agent_id` (rule D1).
///
/// Reads the oracle in `state` first, then the coordinator's [`current`](LeaseCoordinator::current).
/// A coordinator failure is returned as the error; it is never a `Proceed`. An invalid run id
/// (empty, too long: rule L8) is [`LeaseError::InvalidId`], never a `Proceed`; the agent and
/// device ids are checked by the coordinator.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::fence::{check_dispatch, FenceDecision};
/// use fencepost::fold::SyncState;
/// use fencepost::lease::{InMemoryLeaseCoordinator, LeaseCoordinator};
///
/// let coordinator = InMemoryLeaseCoordinator::new(ManualClock::new(0).wall_clock());
/// let lease = coordinator.acquire("milo", "laptop", 30_000)?;
/// let state = SyncState::new();
/// let decision = check_dispatch(&coordinator, &state, "milo", "run-1", "laptop", lease.epoch)?;
/// assert_eq!(decision, FenceDecision::Proceed);
/// # Ok::<(), fencepost::lease::LeaseError>(())
/// ```
pub fn check_dispatch(
    coordinator: &dyn LeaseCoordinator,
    state: &SyncState,
    agent_id: &str,
    run_id: &str,
    device_id: &str,
    epoch: u64,
) -> Result<FenceDecision, LeaseError> {
    // A run id the fold would ignore as malformed (F7) could never be recorded: refuse it here too.
    validate_id(IdKind::Run, run_id)?;
    if let Some(committed) = state.committed_run(agent_id, run_id) {
        return Ok(FenceDecision::AlreadyCommitted {
            committed_op_id: committed.op_id,
        });
    }
    let current = coordinator.current(agent_id)?;
    Ok(holder_verdict(
        current.map(|lease| (lease.holder, lease.epoch)),
        device_id,
        epoch,
    ))
}

/// The fence's verdict on the agent's current holder and epoch, if it has one (rule D1):
/// `Proceed` when `device_id` holds it at `epoch`. [`check_dispatch`] reads the holder from
/// [`current`](LeaseCoordinator::current); the PostgreSQL transactional fence from the row it
/// locks.
pub(crate) fn holder_verdict(current: Option<(String, u64)>, device_id: &str, epoch: u64) -> FenceDecision {
    match current {
        None => FenceDecision::NotHeld { claimed_epoch: epoch },
        Some((holder, current)) if holder == device_id && current == epoch => FenceDecision::Proceed,
        Some((holder, current)) => FenceDecision::StaleEpoch {
            claimed_epoch: epoch,
            current_epoch: current,
            current_holder: holder,
        },
    }
}

/// Who a dispatch runs for: the agent, the device, the epoch it holds, whether the lease still
/// counts as held by the holder's own timing (its renew deadline), and the coordinator the fence
/// asks. [`WorkGuard`](crate::keeper::WorkGuard) is the holder under a
/// [`LeaseKeeper`](crate::keeper::LeaseKeeper); the simulator has its own, over the same
/// [`Renewal`](crate::keeper::Renewal) machine in simulated time.
pub trait Holder {
    /// The agent.
    fn agent_id(&self) -> &str;
    /// The device that holds the lease (a ledger of another device refuses to dispatch for it).
    fn device_id(&self) -> &str;
    /// The epoch held: the fencing token.
    fn epoch(&self) -> u64;
    /// Whether the lease still counts as held (the holder's renew deadline has not passed and no
    /// loss was reported).
    fn holds(&self) -> bool;
    /// The coordinator to check the lease with.
    fn coordinator(&self) -> &dyn LeaseCoordinator;
    /// What the agent's earlier holders published (rule H3), if the holder read it when it was
    /// granted the lease; `None` (the default) makes a dispatch ask the coordinator.
    fn handed_over(&self) -> Option<Frontier> {
        None
    }
    /// Told that the holder's ledger pushed its records up to `frontier` (rule H2), to publish
    /// at the next renewal or at the release. The default does nothing.
    fn pushed(&self, frontier: &Frontier) {
        let _ = frontier;
    }
}
