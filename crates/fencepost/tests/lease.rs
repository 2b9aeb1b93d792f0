//! What the conformance suite (tests/conformance.rs) does not already cover for the in-memory
//! reference coordinator.

use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::lease::{InMemoryLeaseCoordinator, LeaseCoordinator, MAX_EXPIRES_AT_MS};

#[test]
fn l1_expiry_saturates_at_the_storable_maximum() {
    let clock = ManualClock::new(u64::MAX - 5);
    let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
    assert_eq!(
        coordinator.acquire("milo", "laptop", 100).unwrap().expires_at_ms,
        MAX_EXPIRES_AT_MS
    );
}

#[test]
fn l6_clones_share_one_register() {
    let coordinator = InMemoryLeaseCoordinator::new(ManualClock::new(0).wall_clock());
    let other = coordinator.clone();
    let lease = coordinator.acquire("milo", "laptop", 1_000).unwrap();
    assert_eq!(other.current("milo").unwrap(), Some(lease));
}

#[test]
fn coordinators_are_object_safe_send_sync_and_shareable() {
    fn assert_send_sync<T: Send + Sync + ?Sized>() {}
    assert_send_sync::<dyn LeaseCoordinator>();
    let shared: Arc<dyn LeaseCoordinator> =
        Arc::new(InMemoryLeaseCoordinator::new(ManualClock::new(0).wall_clock()));
    let handle: Box<dyn LeaseCoordinator> = Box::new(Arc::clone(&shared));
    assert_eq!(handle.acquire("milo", "laptop", 1_000).unwrap().epoch, 1);
    assert_eq!(shared.current("milo").unwrap().map(|lease| lease.epoch), Some(1));
}

/// Rule F1 and the seed's signature (issue 15, item 4): `Intent::new` takes the agent first, then
/// the run, as the seed's `lease` module does. Both are strings, so a swap would compile and file
/// intents under the wrong agent; this pins the order.
#[test]
fn f1_intent_new_takes_the_agent_first_as_the_seed_does() {
    let intent = fencepost::lease::Intent::new("agent", "run", 3, fencepost::lease::IntentStatus::Pending);
    assert_eq!(intent.agent_id, "agent");
    assert_eq!(intent.run_id, "run");
    assert_eq!(intent.payload()["agent_id"], "agent");
    assert_eq!(intent.payload()["id"], "run");
}
