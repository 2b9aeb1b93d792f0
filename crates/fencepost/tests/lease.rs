//! Rules L1–L8 on the in-memory reference coordinator.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier, Mutex};

use fencepost::clock::ManualClock;
use fencepost::id::{IdError, MAX_ID_BYTES};
use fencepost::lease::{
    InMemoryLeaseCoordinator, Lease, LeaseCoordinator, LeaseError, MAX_EPOCH_FLOOR, MAX_TTL_MS,
};

const TTL_MS: u64 = 10_000;

fn coordinator() -> (ManualClock, InMemoryLeaseCoordinator) {
    let clock = ManualClock::new(1_000_000);
    let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
    (clock, coordinator)
}

#[test]
fn l1_acquire_grants_a_free_agent_with_epoch_one_and_expiry_now_plus_ttl() {
    let (clock, coordinator) = coordinator();
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    assert_eq!(
        lease,
        Lease {
            agent_id: "milo".into(),
            holder: "laptop".into(),
            epoch: 1,
            expires_at_ms: clock.now_ms() + TTL_MS
        }
    );
}

#[test]
fn l1_acquire_of_a_valid_lease_is_held_even_for_the_holder() {
    let (clock, coordinator) = coordinator();
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    for device in ["laptop", "phone"] {
        match coordinator.acquire("milo", device, TTL_MS) {
            Err(LeaseError::Held {
                agent_id,
                holder,
                epoch,
                expires_at_ms,
            }) => {
                assert_eq!((agent_id.as_str(), holder.as_str()), ("milo", "laptop"));
                assert_eq!((epoch, expires_at_ms), (1, lease.expires_at_ms));
            }
            other => panic!("{device}: expected Held, got {other:?}"),
        }
    }
    // One millisecond before expiry it is still held; at expiry it can be taken.
    clock.advance(TTL_MS - 1);
    assert!(matches!(
        coordinator.acquire("milo", "phone", TTL_MS),
        Err(LeaseError::Held { .. })
    ));
    clock.advance(1);
    let stolen = coordinator.acquire("milo", "phone", TTL_MS).unwrap();
    assert_eq!((stolen.holder.as_str(), stolen.epoch), ("phone", 2));
}

#[test]
fn l1_expiry_saturates_instead_of_overflowing() {
    let clock = ManualClock::new(u64::MAX - 5);
    let coordinator = InMemoryLeaseCoordinator::new(clock.wall_clock());
    assert_eq!(
        coordinator.acquire("milo", "laptop", 100).unwrap().expires_at_ms,
        u64::MAX
    );
}

#[test]
fn l2_renew_succeeds_past_expiry_until_stolen() {
    let (clock, coordinator) = coordinator();
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    clock.advance(TTL_MS * 3); // expired, but nobody took it
    let renewed = coordinator.renew("milo", "laptop", lease.epoch, TTL_MS).unwrap();
    assert_eq!(renewed.epoch, lease.epoch, "renew never bumps the epoch");
    assert_eq!(renewed.expires_at_ms, clock.now_ms() + TTL_MS);
    clock.advance(TTL_MS);
    let stolen = coordinator.acquire("milo", "phone", TTL_MS).unwrap();
    match coordinator.renew("milo", "laptop", lease.epoch, TTL_MS) {
        Err(LeaseError::Lost {
            claimed_epoch,
            current_epoch,
            ..
        }) => assert_eq!((claimed_epoch, current_epoch), (1, stolen.epoch)),
        other => panic!("expected Lost, got {other:?}"),
    }
}

#[test]
fn l2_renew_with_a_wrong_device_or_epoch_or_never_held_is_lost() {
    let (_, coordinator) = coordinator();
    assert!(matches!(
        coordinator.renew("milo", "laptop", 1, TTL_MS),
        Err(LeaseError::Lost { current_epoch: 0, .. })
    ));
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    assert!(matches!(
        coordinator.renew("milo", "phone", lease.epoch, TTL_MS),
        Err(LeaseError::Lost { .. })
    ));
    assert!(matches!(
        coordinator.renew("milo", "laptop", lease.epoch + 1, TTL_MS),
        Err(LeaseError::Lost { current_epoch: 1, .. })
    ));
    // A failed renew changed nothing.
    assert_eq!(coordinator.current("milo").unwrap(), Some(lease));
}

#[test]
fn l3_release_clears_the_holder_and_keeps_the_epoch() {
    let (_, coordinator) = coordinator();
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    assert!(matches!(
        coordinator.release("milo", "phone", lease.epoch),
        Err(LeaseError::Lost { .. })
    ));
    assert!(matches!(
        coordinator.release("milo", "laptop", 7),
        Err(LeaseError::Lost { .. })
    ));
    coordinator.release("milo", "laptop", lease.epoch).unwrap();
    assert_eq!(coordinator.current("milo").unwrap(), None);
    // Released twice: the second is Lost, with the kept epoch.
    assert!(matches!(
        coordinator.release("milo", "laptop", lease.epoch),
        Err(LeaseError::Lost { current_epoch: 1, .. })
    ));
    // The next acquire succeeds at once (no waiting out the TTL) with the next epoch.
    assert_eq!(coordinator.acquire("milo", "phone", TTL_MS).unwrap().epoch, 2);
}

#[test]
fn l4_current_reports_an_expired_but_unstolen_holder_and_none_when_free() {
    let (clock, coordinator) = coordinator();
    assert_eq!(coordinator.current("milo").unwrap(), None);
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    clock.advance(TTL_MS * 10);
    assert_eq!(coordinator.current("milo").unwrap(), Some(lease.clone()));
    coordinator.release("milo", "laptop", lease.epoch).unwrap();
    assert_eq!(coordinator.current("milo").unwrap(), None);
}

#[test]
fn l5_epochs_never_repeat_across_release_steal_and_floor() {
    let (clock, coordinator) = coordinator();
    let mut epochs = Vec::new();
    for round in 0..20 {
        let device = if round % 2 == 0 { "laptop" } else { "phone" };
        let lease = coordinator.acquire("milo", device, TTL_MS).unwrap();
        epochs.push(lease.epoch);
        if round % 3 == 0 {
            coordinator.release("milo", device, lease.epoch).unwrap();
        } else {
            clock.advance(TTL_MS); // let it expire: the next acquire steals
        }
    }
    assert_eq!(epochs, (1..=20).collect::<Vec<_>>());
}

#[test]
fn l5_raise_epoch_floor_is_monotone_and_idempotent() {
    let (clock, coordinator) = coordinator();
    coordinator.raise_epoch_floor("milo", 41).unwrap();
    coordinator.raise_epoch_floor("milo", 41).unwrap();
    coordinator.raise_epoch_floor("milo", 3).unwrap(); // lower: no effect
    assert_eq!(coordinator.acquire("milo", "laptop", TTL_MS).unwrap().epoch, 42);
    clock.advance(TTL_MS);
    // A floor below the current epoch does not lower it.
    coordinator.raise_epoch_floor("milo", 10).unwrap();
    assert_eq!(coordinator.acquire("milo", "phone", TTL_MS).unwrap().epoch, 43);
    // A floor does not disturb a held lease, and applies to the next grant.
    coordinator.raise_epoch_floor("milo", 100).unwrap();
    assert_eq!(coordinator.current("milo").unwrap().unwrap().epoch, 43);
    clock.advance(TTL_MS);
    assert_eq!(coordinator.acquire("milo", "laptop", TTL_MS).unwrap().epoch, 101);
    assert!(matches!(
        coordinator.raise_epoch_floor("milo", MAX_EPOCH_FLOOR + 1),
        Err(LeaseError::InvalidEpochFloor { .. })
    ));
}

#[test]
fn l5_agents_have_independent_epochs() {
    let (_, coordinator) = coordinator();
    assert_eq!(coordinator.acquire("a", "laptop", TTL_MS).unwrap().epoch, 1);
    assert_eq!(coordinator.acquire("b", "laptop", TTL_MS).unwrap().epoch, 1);
}

#[test]
fn l6_sixteen_threads_contending_never_see_two_holders_and_get_dense_unique_epochs() {
    let (clock, coordinator) = coordinator();
    const THREADS: usize = 16;
    const ROUNDS: usize = 200;
    let granted: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let coordinator = coordinator.clone();
            let clock = clock.clone();
            let granted = Arc::clone(&granted);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let device = format!("device-{thread}");
                for _ in 0..ROUNDS {
                    barrier.wait();
                    if let Ok(lease) = coordinator.acquire("milo", &device, TTL_MS) {
                        // While we hold it, nobody else may: `current` names us.
                        assert_eq!(coordinator.current("milo").unwrap().unwrap().holder, device);
                        granted.lock().unwrap().push((lease.epoch, device.clone()));
                        coordinator.release("milo", &device, lease.epoch).unwrap();
                    }
                    barrier.wait();
                    if thread == 0 {
                        clock.advance(1);
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let granted = granted.lock().unwrap();
    let epochs: BTreeSet<u64> = granted.iter().map(|(epoch, _)| *epoch).collect();
    assert_eq!(epochs.len(), granted.len(), "an epoch was granted twice");
    assert_eq!(epochs, (1..=granted.len() as u64).collect(), "epochs are dense");
    assert!(granted.len() >= ROUNDS, "at least one grant per round");
}

#[test]
fn l6_of_concurrent_acquires_on_a_free_agent_exactly_one_wins() {
    let (_, coordinator) = coordinator();
    for round in 0..50 {
        let agent = format!("agent-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|thread| {
                let coordinator = coordinator.clone();
                let barrier = Arc::clone(&barrier);
                let agent = agent.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    coordinator.acquire(&agent, &format!("d{thread}"), TTL_MS).is_ok()
                })
            })
            .collect();
        let winners = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|won| *won)
            .count();
        assert_eq!(winners, 1, "round {round}");
    }
}

#[test]
fn l8_bad_ids_and_ttls_are_clear_errors_and_change_nothing() {
    let (_, coordinator) = coordinator();
    let long = "x".repeat(MAX_ID_BYTES + 1);
    for bad in ["", "tab\t", "nl\n", long.as_str()] {
        assert!(
            matches!(
                coordinator.acquire(bad, "laptop", TTL_MS),
                Err(LeaseError::InvalidId(_))
            ),
            "{bad:?}"
        );
        assert!(
            matches!(
                coordinator.acquire("milo", bad, TTL_MS),
                Err(LeaseError::InvalidId(_))
            ),
            "{bad:?}"
        );
        assert!(matches!(
            coordinator.renew(bad, "laptop", 1, TTL_MS),
            Err(LeaseError::InvalidId(_))
        ));
        assert!(matches!(
            coordinator.release("milo", bad, 1),
            Err(LeaseError::InvalidId(_))
        ));
        assert!(matches!(coordinator.current(bad), Err(LeaseError::InvalidId(_))));
        assert!(matches!(
            coordinator.raise_epoch_floor(bad, 1),
            Err(LeaseError::InvalidId(_))
        ));
    }
    for ttl in [0, MAX_TTL_MS + 1, u64::MAX] {
        let error = coordinator.acquire("milo", "laptop", ttl).unwrap_err();
        assert!(matches!(error, LeaseError::InvalidTtl { .. }), "{ttl}");
        assert!(error.to_string().contains("ttl_ms"));
    }
    assert!(matches!(
        coordinator.acquire("milo", "", TTL_MS),
        Err(LeaseError::InvalidId(IdError::Empty { .. }))
    ));
    assert_eq!(coordinator.current("milo").unwrap(), None, "nothing was granted");
    assert_eq!(
        coordinator.acquire("milo", "laptop", MAX_TTL_MS).unwrap().epoch,
        1
    );
}

#[test]
fn l8_every_error_says_what_happened() {
    let (_, coordinator) = coordinator();
    let lease = coordinator.acquire("milo", "laptop", TTL_MS).unwrap();
    let held = coordinator
        .acquire("milo", "phone", TTL_MS)
        .unwrap_err()
        .to_string();
    assert!(held.contains("held by \"laptop\""), "{held}");
    let lost = coordinator
        .renew("milo", "phone", lease.epoch, TTL_MS)
        .unwrap_err()
        .to_string();
    assert!(
        lost.contains("lost") && lost.contains("current epoch is 1"),
        "{lost}"
    );
}

#[test]
fn coordinator_is_object_safe_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + ?Sized>() {}
    assert_send_sync::<dyn LeaseCoordinator>();
    let (_, coordinator) = coordinator();
    let shared: Arc<dyn LeaseCoordinator> = Arc::new(coordinator);
    assert_eq!(shared.acquire("milo", "laptop", TTL_MS).unwrap().epoch, 1);
}
