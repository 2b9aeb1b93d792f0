//! [`FencedResource`]: the reference cooperating resource, which checks fencing tokens the way a
//! service with idempotency keys does (tests, examples and the simulator's `token` mode use it).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use crate::fence::FencingToken;

/// Why a [`FencedResource`] refused an effect; nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceRefusal {
    /// The token's epoch is older than one the resource has seen for the agent: the caller is a
    /// zombie (it lost its lease after the fence said `Proceed`).
    #[error(
        "stale fencing token: epoch {epoch} of {agent_id:?}, but the resource has seen epoch {highest_epoch}"
    )]
    StaleEpoch {
        /// The agent.
        agent_id: String,
        /// The token's epoch.
        epoch: u64,
        /// The highest epoch the resource has seen for the agent.
        highest_epoch: u64,
    },
    /// The token's epoch is outside `1..=`[`MAX_EPOCH`](crate::lease::MAX_EPOCH): no coordinator
    /// minted it, and accepting it would make every real epoch look stale.
    #[error(
        "fencing token epoch {epoch} of {agent_id:?} is outside the epoch range: no coordinator minted it"
    )]
    EpochOutOfRange {
        /// The agent.
        agent_id: String,
        /// The token's epoch.
        epoch: u64,
    },
    /// The run was applied before (under `applied_epoch`): the run id is the idempotency key, so a
    /// second execution of a run, whoever sends it, changes nothing.
    #[error("run {run_id:?} of {agent_id:?} was already applied under epoch {applied_epoch}")]
    AlreadyApplied {
        /// The agent.
        agent_id: String,
        /// The run.
        run_id: String,
        /// The epoch of the token it was applied under.
        applied_epoch: u64,
    },
}

/// A resource that cooperates with the fence the way a real service must, for tests, examples and
/// the simulator: atomically with each write it checks
///
/// 1. the **fencing token**: it remembers the highest epoch it has seen per agent and refuses a
///    lower one ([`ResourceRefusal::StaleEpoch`]), which stops a zombie whose effect arrives after
///    a successor's;
/// 2. the **idempotency key**: it remembers every run it applied per agent and refuses the same
///    run again ([`ResourceRefusal::AlreadyApplied`]), which stops a zombie whose effect arrived
///    *first*, and makes retrying an in-doubt run under a new epoch harmless.
///
/// Only both checks together close the window between the fence and the effect. A service that
/// checks only the epoch still runs a run twice when the stale effect lands first; one that
/// checks only the run id still lets a zombie act for an agent it no longer holds.
///
/// ```
/// use fencepost::fence::FencingToken;
/// use fencepost::resource::{FencedResource, ResourceRefusal};
///
/// let resource = FencedResource::new();
/// let token = |run: &str, epoch| FencingToken { agent_id: "milo".into(), run_id: run.into(), epoch };
/// resource.apply(&token("run-a", 1), "sent")?;            // a zombie's effect lands first
/// assert!(matches!(                                        // the successor's retry is refused
///     resource.apply(&token("run-a", 2), "sent"),
///     Err(ResourceRefusal::AlreadyApplied { applied_epoch: 1, .. })
/// ));
/// resource.apply(&token("run-b", 2), "sent")?;
/// assert!(matches!(                                        // epoch 1 is stale from now on
///     resource.apply(&token("run-c", 1), "sent"),
///     Err(ResourceRefusal::StaleEpoch { highest_epoch: 2, .. })
/// ));
/// assert_eq!(resource.applied().len(), 2);
/// # Ok::<(), ResourceRefusal>(())
/// ```
#[derive(Debug)]
pub struct FencedResource<T> {
    inner: Mutex<ResourceState<T>>,
}

#[derive(Debug)]
struct ResourceState<T> {
    highest_epoch: BTreeMap<String, u64>,
    /// Per (agent, run), the epoch it was applied under.
    applied_runs: BTreeMap<(String, String), u64>,
    applied: Vec<(FencingToken, T)>,
}

impl<T> Default for FencedResource<T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(ResourceState {
                highest_epoch: BTreeMap::new(),
                applied_runs: BTreeMap::new(),
                applied: Vec::new(),
            }),
        }
    }
}

impl<T: Clone> FencedResource<T> {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `effect` under `token`, unless a higher epoch of its agent was seen before or its
    /// run was applied before. Both checks and the write are one atomic step.
    ///
    /// # Errors
    /// [`ResourceRefusal`]: nothing applied, nothing remembered.
    pub fn apply(&self, token: &FencingToken, effect: T) -> Result<(), ResourceRefusal> {
        if !(1..=crate::lease::MAX_EPOCH).contains(&token.epoch) {
            return Err(ResourceRefusal::EpochOutOfRange {
                agent_id: token.agent_id.clone(),
                epoch: token.epoch,
            });
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let highest = inner.highest_epoch.get(&token.agent_id).copied().unwrap_or(0);
        if token.epoch < highest {
            return Err(ResourceRefusal::StaleEpoch {
                agent_id: token.agent_id.clone(),
                epoch: token.epoch,
                highest_epoch: highest,
            });
        }
        let key = (token.agent_id.clone(), token.run_id.clone());
        if let Some(applied_epoch) = inner.applied_runs.get(&key) {
            return Err(ResourceRefusal::AlreadyApplied {
                agent_id: token.agent_id.clone(),
                run_id: token.run_id.clone(),
                applied_epoch: *applied_epoch,
            });
        }
        inner.highest_epoch.insert(token.agent_id.clone(), token.epoch);
        inner.applied_runs.insert(key, token.epoch);
        inner.applied.push((token.clone(), effect));
        Ok(())
    }

    /// Every applied effect, in order, with its token.
    pub fn applied(&self) -> Vec<(FencingToken, T)> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .applied
            .clone()
    }

    /// The highest epoch seen for `agent_id` (0 if none).
    pub fn highest_epoch(&self, agent_id: &str) -> u64 {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.highest_epoch.get(agent_id).copied().unwrap_or(0)
    }

    /// The epoch `run_id` of `agent_id` was applied under, if it was.
    pub fn applied_epoch(&self, agent_id: &str, run_id: &str) -> Option<u64> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .applied_runs
            .get(&(agent_id.to_owned(), run_id.to_owned()))
            .copied()
    }
}
