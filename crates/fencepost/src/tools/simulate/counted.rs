//! The coordinator of the simulated world, counting the calls the protocol makes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::lease::{LeaseCoordinator, LeaseError};
use crate::relay::Frontier;

/// The coordinator, counting the calls the protocol makes (the simulator's own bookkeeping asks
/// `inner` directly, uncounted).
pub(super) struct Counted {
    pub(super) inner: Box<dyn LeaseCoordinator>,
    pub(super) calls: Mutex<BTreeMap<&'static str, u64>>,
}

impl Counted {
    pub(super) fn new(inner: Box<dyn LeaseCoordinator>) -> Self {
        Self {
            inner,
            calls: Mutex::new(BTreeMap::new()),
        }
    }

    fn count(&self, call: &'static str) {
        *self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(call)
            .or_insert(0) += 1;
    }

    pub(super) fn calls(&self) -> BTreeMap<String, u64> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(call, count)| ((*call).to_owned(), *count))
            .collect()
    }
}

impl LeaseCoordinator for Counted {
    fn acquire(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<crate::lease::Lease, LeaseError> {
        self.count("acquire");
        self.inner.acquire(agent_id, device_id, ttl_ms)
    }
    fn renew(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<crate::lease::Lease, LeaseError> {
        self.count("renew");
        self.inner.renew(agent_id, device_id, epoch, ttl_ms)
    }
    fn release(&self, agent_id: &str, device_id: &str, epoch: u64) -> Result<(), LeaseError> {
        self.count("release");
        self.inner.release(agent_id, device_id, epoch)
    }
    fn current(&self, agent_id: &str) -> Result<Option<crate::lease::Lease>, LeaseError> {
        self.count("current");
        self.inner.current(agent_id)
    }
    fn raise_epoch_floor(&self, agent_id: &str, floor: u64) -> Result<(), LeaseError> {
        self.count("raise_epoch_floor");
        self.inner.raise_epoch_floor(agent_id, floor)
    }
    fn publish_frontier(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        self.count("publish_frontier");
        self.inner.publish_frontier(agent_id, device_id, epoch, frontier)
    }
    fn published_frontier(&self, agent_id: &str) -> Result<Frontier, LeaseError> {
        self.count("published_frontier");
        self.inner.published_frontier(agent_id)
    }
    // The combined calls are one round trip each where the backend can: counted as one.
    fn acquire_handing_over(
        &self,
        agent_id: &str,
        device_id: &str,
        ttl_ms: u64,
    ) -> Result<(crate::lease::Lease, Option<Frontier>), LeaseError> {
        self.count("acquire");
        self.inner.acquire_handing_over(agent_id, device_id, ttl_ms)
    }
    fn renew_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        ttl_ms: u64,
        frontier: &Frontier,
    ) -> Result<(crate::lease::Lease, bool), LeaseError> {
        self.count("renew");
        self.inner
            .renew_publishing(agent_id, device_id, epoch, ttl_ms, frontier)
    }
    fn release_publishing(
        &self,
        agent_id: &str,
        device_id: &str,
        epoch: u64,
        frontier: &Frontier,
    ) -> Result<(), LeaseError> {
        self.count("release");
        self.inner
            .release_publishing(agent_id, device_id, epoch, frontier)
    }
}
