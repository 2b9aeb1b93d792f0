//! The hand-off rules every coordinator keeps (H1–H4): the published frontier, its combined
//! calls, and its durability.

use super::{expect_lost, open_one, Harness};
use crate::lease::{LeaseCoordinator, LeaseError};
use crate::oplog::OpId;
use crate::relay::Frontier;

/// A frontier of `(device, next_seq)` pairs.
fn frontier_of(pairs: &[(&str, u64)]) -> Frontier {
    let mut frontier = Frontier::new();
    for (device, next_seq) in pairs {
        frontier.raise(device, *next_seq);
    }
    frontier
}

/// H1: only the holder at its epoch publishes (expired or not, as for renew; a zombie, another
/// device, another epoch or a released holder is `Lost` and changes nothing); the published
/// frontier rises device by device and never falls, is cumulative over holders, and stays after
/// release; an invalid device id in the frontier is refused.
pub fn h1_the_holder_publishes_a_monotone_cumulative_frontier(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    let published = |rule: &str| coordinator.published_frontier("h1").expect(rule);
    assert!(
        published("H1: nothing yet").is_empty(),
        "H1: nothing published yet"
    );
    expect_lost(
        coordinator.publish_frontier("h1", "laptop", 1, &frontier_of(&[("laptop", 1)])),
        "H1: never held",
    );
    let first = coordinator.acquire("h1", "laptop", ttl).expect("H1 setup");
    coordinator
        .publish_frontier("h1", "laptop", first.epoch, &frontier_of(&[("laptop", 3)]))
        .expect("H1: the holder publishes");
    coordinator
        .publish_frontier(
            "h1",
            "laptop",
            first.epoch,
            &frontier_of(&[("laptop", 2), ("phone", 1)]),
        )
        .expect("H1: the holder publishes again");
    assert_eq!(
        published("H1"),
        frontier_of(&[("laptop", 3), ("phone", 1)]),
        "H1: the frontier rises device by device and never falls"
    );
    for (device, epoch, case) in [
        ("phone", first.epoch, "another device"),
        ("laptop", first.epoch + 1, "another epoch"),
    ] {
        expect_lost(
            coordinator.publish_frontier("h1", device, epoch, &frontier_of(&[("laptop", 9)])),
            &format!("H1: {case}"),
        );
    }
    assert!(
        matches!(
            coordinator.publish_frontier("h1", "laptop", first.epoch, &frontier_of(&[("bad\u{1}id", 1)])),
            Err(LeaseError::InvalidId(_))
        ),
        "H1: an invalid device id in the frontier is refused"
    );
    // The lease expires and another device takes it: the zombie publishes nothing.
    harness.advance(ttl);
    let second = coordinator.acquire("h1", "phone", ttl).expect("H1: steal");
    expect_lost(
        coordinator.publish_frontier("h1", "laptop", first.epoch, &frontier_of(&[("laptop", 9)])),
        "H1: a zombie",
    );
    assert_eq!(
        published("H1"),
        frontier_of(&[("laptop", 3), ("phone", 1)]),
        "H1: a refused publish changes nothing"
    );
    coordinator
        .publish_frontier(
            "h1",
            "phone",
            second.epoch,
            &frontier_of(&[("phone", 4), ("tablet", 2)]),
        )
        .expect("H1: the new holder publishes");
    coordinator
        .release("h1", "phone", second.epoch)
        .expect("H1: release");
    expect_lost(
        coordinator.publish_frontier("h1", "phone", second.epoch, &frontier_of(&[("phone", 9)])),
        "H1: after release",
    );
    assert_eq!(
        published("H1"),
        frontier_of(&[("laptop", 3), ("phone", 4), ("tablet", 2)]),
        "H1: cumulative over holders, and kept after release"
    );
    assert!(
        published_of(coordinator.as_ref(), "h1-other").is_empty(),
        "H1: another agent's frontier is its own"
    );
}

/// H1 with heads: a device's published head (the id of its last published record) goes with the
/// larger count; for an equal count the first head published stays (a second log under one device
/// id does not replace it); a larger count published without a head forgets it; the combined
/// calls carry heads like `publish_frontier`.
pub fn h1_the_published_heads_name_the_records(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    let head = |byte: u8| Some(OpId([byte; 32]));
    let with_head = |next_seq: u64, byte: u8| {
        let mut frontier = Frontier::new();
        frontier.raise_to("laptop", next_seq, head(byte));
        frontier
    };
    let published = || {
        let frontier = coordinator.published_frontier("heads").expect("H1: read");
        (frontier.next_seq("laptop"), frontier.head("laptop"))
    };
    let lease = coordinator.acquire("heads", "laptop", ttl).expect("H1 setup");
    let publish = |frontier: &Frontier| {
        coordinator
            .publish_frontier("heads", "laptop", lease.epoch, frontier)
            .expect("H1: the holder publishes");
    };
    publish(&with_head(2, 0xa0));
    assert_eq!(published(), (2, head(0xa0)), "H1: the head is kept");
    publish(&with_head(2, 0xb0));
    assert_eq!(
        published(),
        (2, head(0xa0)),
        "H1: an equal count keeps the first head"
    );
    publish(&with_head(1, 0xc0));
    assert_eq!(published(), (2, head(0xa0)), "H1: a lower count changes nothing");
    publish(&with_head(3, 0xd0));
    assert_eq!(published(), (3, head(0xd0)), "H1: a larger count brings its head");
    publish(&frontier_of(&[("laptop", 4)]));
    assert_eq!(
        published(),
        (4, None),
        "H1: a larger count without a head forgets it"
    );
    let renewed = coordinator
        .renew_publishing("heads", "laptop", lease.epoch, ttl, &with_head(5, 0xe0))
        .expect("H1: renew and publish");
    assert!(renewed.1, "H1: published with the renewal");
    assert_eq!(published(), (5, head(0xe0)), "H1: the renewal's head");
    coordinator
        .release_publishing("heads", "laptop", lease.epoch, &with_head(6, 0xf0))
        .expect("H1: publish and release");
    let (next, handed) = {
        let (lease, frontier) = coordinator
            .acquire_handing_over("heads", "phone", ttl)
            .expect("H1: acquire and read");
        let frontier = frontier.expect("H1: read with the grant");
        coordinator
            .release("heads", "phone", lease.epoch)
            .expect("H1: release");
        (frontier.next_seq("laptop"), frontier.head("laptop"))
    };
    assert_eq!((next, handed), (6, head(0xf0)), "H1: handed over with its head");
}

/// H2, H3: the combined calls, which a backend may run in one round trip, do what their parts
/// do: `acquire_handing_over` grants and reads the frontier published before the grant;
/// `renew_publishing` publishes only for the holder it renews (a refused renewal publishes
/// nothing); `release_publishing` publishes, then releases, and a zombie's does neither.
pub fn h2_h3_the_combined_calls_act_as_their_parts(harness: &dyn Harness) {
    let coordinator = open_one(harness);
    let ttl = harness.ttl_ms();
    let published = |rule: &str| coordinator.published_frontier("h23").expect(rule);
    let (first, handed_over) = coordinator
        .acquire_handing_over("h23", "laptop", ttl)
        .expect("H3: acquire_handing_over grants");
    assert_eq!(
        handed_over,
        Some(Frontier::new()),
        "H3: nothing was published before the first grant"
    );
    assert!(
        matches!(
            coordinator.acquire_handing_over("h23", "phone", ttl),
            Err(LeaseError::Held { .. })
        ),
        "H3: a valid lease is Held, as for acquire"
    );
    let (renewed, done) = coordinator
        .renew_publishing("h23", "laptop", first.epoch, ttl, &frontier_of(&[("laptop", 2)]))
        .expect("H2: renew_publishing renews the holder");
    assert!(done && renewed.epoch == first.epoch, "H2: and publishes");
    assert_eq!(published("H2"), frontier_of(&[("laptop", 2)]));
    expect_lost(
        coordinator
            .renew_publishing("h23", "phone", first.epoch, ttl, &frontier_of(&[("phone", 5)]))
            .map(|(lease, _)| lease),
        "H2: renew_publishing by another device",
    );
    assert_eq!(
        published("H2"),
        frontier_of(&[("laptop", 2)]),
        "H2: a refused renewal publishes nothing"
    );
    coordinator
        .release_publishing("h23", "laptop", first.epoch, &frontier_of(&[("laptop", 4)]))
        .expect("H2: release_publishing");
    assert_eq!(
        published("H2"),
        frontier_of(&[("laptop", 4)]),
        "H2: published before the release"
    );
    let (second, handed_over) = coordinator
        .acquire_handing_over("h23", "phone", ttl)
        .expect("H3: released, so granted at once");
    assert!(second.epoch > first.epoch, "H3: a new epoch");
    assert_eq!(
        handed_over,
        Some(frontier_of(&[("laptop", 4)])),
        "H3: the grant reads what the predecessor published"
    );
    expect_lost(
        coordinator.release_publishing("h23", "laptop", first.epoch, &frontier_of(&[("laptop", 9)])),
        "H2: a zombie's release_publishing",
    );
    assert_eq!(
        published("H2"),
        frontier_of(&[("laptop", 4)]),
        "H2: a zombie's release publishes nothing"
    );
    assert_eq!(
        coordinator
            .current("h23")
            .expect("current")
            .map(|lease| (lease.holder, lease.epoch)),
        Some(("phone".to_owned(), second.epoch)),
        "H2: and releases nothing"
    );
}

fn published_of(coordinator: &dyn LeaseCoordinator, agent: &str) -> Frontier {
    coordinator.published_frontier(agent).expect("published_frontier")
}

/// H4: the published frontier is kept by the store: a coordinator opened after every other
/// handle was dropped (a restart, for durable backends) reads it.
pub fn h4_the_published_frontier_survives_reopening(harness: &dyn Harness) {
    let opener = harness.fresh_store();
    let ttl = harness.ttl_ms();
    {
        let coordinator = opener();
        let lease = coordinator.acquire("h4", "laptop", ttl).expect("H4 setup");
        coordinator
            .publish_frontier("h4", "laptop", lease.epoch, &frontier_of(&[("laptop", 7)]))
            .expect("H4: publish");
    }
    let reopened = opener();
    assert_eq!(
        published_of(reopened.as_ref(), "h4"),
        frontier_of(&[("laptop", 7)]),
        "H4: the published frontier survives reopening"
    );
}
