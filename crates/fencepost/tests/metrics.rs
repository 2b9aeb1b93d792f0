//! The library's metrics (`fencepost::metrics`), recorded through the `metrics` facade: a
//! keeper's acquires and holding, the fence's verdicts, dispatch outcomes and the relay's
//! traffic, as a recorder installed by the program sees them. (A binary of its own: the recorder
//! is global.)

use std::sync::Arc;

use fencepost::clock::system_clock;
use fencepost::dispatch::{dispatch, dispatch_effect, DispatchOptions, EffectOutcome};
use fencepost::keeper::{KeeperConfig, LeaseKeeper};
use fencepost::lease::InMemoryLeaseCoordinator;
use fencepost::ledger::Ledger;
use fencepost::metrics;
use fencepost::relay::InMemoryRelay;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// The value of metric `name` with exactly `labels`, in a snapshot.
fn value<'a>(
    snapshot: &'a [(
        metrics_util::CompositeKey,
        Option<::metrics::Unit>,
        Option<::metrics::SharedString>,
        DebugValue,
    )],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let key = key.key();
        let mut found: Vec<(String, String)> = key
            .labels()
            .map(|label| (label.key().to_owned(), label.value().to_owned()))
            .collect();
        found.sort();
        let mut wanted: Vec<(String, String)> = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        wanted.sort();
        (key.name() == name && found == wanted).then_some(value)
    })
}

#[test]
fn metrics_count_acquires_holding_fence_decisions_dispatches_and_relay_traffic() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    metrics::describe();

    let coordinator = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let relay = Arc::new(InMemoryRelay::new());
    let mut ledger = Ledger::open("laptop", system_clock(), relay.clone()).unwrap();
    let keeper = LeaseKeeper::builder(coordinator.clone(), "milo", "laptop")
        .config(KeeperConfig::new(30_000))
        .acquire()
        .unwrap();
    // (A snapshot takes the counts it shows: the next one shows what came after.)
    let held = snapshotter.snapshot().into_vec();
    assert!(matches!(
        value(&held, metrics::LEASES_HELD, &[("agent", "milo")]),
        Some(DebugValue::Gauge(held)) if held.into_inner() == 1.0
    ));
    assert!(matches!(
        value(
            &held,
            metrics::ACQUIRES,
            &[("agent", "milo"), ("outcome", "granted")]
        ),
        Some(DebugValue::Counter(1))
    ));
    // Another site is refused the lease.
    let refused = LeaseKeeper::builder(coordinator.clone(), "milo", "phone")
        .config(KeeperConfig::new(30_000))
        .acquire();
    assert!(refused.is_err());

    let outcome = dispatch(&keeper, &mut ledger, &run("run-1"), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(outcome.kind(), "succeeded");
    let again = dispatch(&keeper, &mut ledger, &run("run-1"), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(again.kind(), "already_committed");
    let interrupted = dispatch_effect(
        &keeper,
        &mut ledger,
        &run("run-2"),
        DispatchOptions::default(),
        |_| EffectOutcome::<(), _>::Unknown("killed".to_owned()),
    )
    .unwrap();
    assert_eq!(interrupted.kind(), "interrupted");
    let in_doubt = dispatch(&keeper, &mut ledger, &run("run-2"), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(in_doubt.kind(), "in_doubt");
    keeper.shutdown().unwrap();

    // Renewals: a short TTL renews every 100 ms; the lease released behind the keeper's back is
    // then lost at its next renewal.
    use fencepost::lease::LeaseCoordinator as _;
    let renewing = LeaseKeeper::builder(coordinator.clone(), "rex", "laptop")
        .config(KeeperConfig::new(300))
        .acquire()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(350));
    coordinator.release("rex", "laptop", renewing.epoch()).unwrap();
    assert!(renewing.wait_lost(std::time::Duration::from_secs(5)).is_some());

    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, labels: &[(&str, &str)]| match value(&snapshot, name, labels) {
        Some(DebugValue::Counter(count)) => *count,
        other => panic!("{name} {labels:?}: {other:?}"),
    };
    let milo = |key: &'static str, value: &'static str| [("agent", "milo"), (key, value)];
    assert_eq!(counter(metrics::ACQUIRES, &milo("outcome", "held")), 1);
    assert_eq!(counter(metrics::FENCE_DECISIONS, &milo("decision", "proceed")), 2);
    assert_eq!(
        counter(metrics::FENCE_DECISIONS, &milo("decision", "already_committed")),
        1
    );
    assert_eq!(
        counter(metrics::FENCE_DECISIONS, &milo("decision", "in_doubt")),
        1
    );
    assert_eq!(counter(metrics::DISPATCHES, &milo("outcome", "succeeded")), 1);
    assert_eq!(
        counter(metrics::DISPATCHES, &milo("outcome", "already_committed")),
        1
    );
    assert_eq!(counter(metrics::DISPATCHES, &milo("outcome", "interrupted")), 1);
    assert_eq!(counter(metrics::DISPATCHES, &milo("outcome", "in_doubt")), 1);
    assert_eq!(counter(metrics::RUNS_LEFT_IN_DOUBT, &[("agent", "milo")]), 1);
    // pending + committed, pending of the interrupted run.
    assert_eq!(counter(metrics::RELAY_PUSHED_RECORDS, &[]), 3);
    match value(&snapshot, metrics::RELAY_PUSH_SECONDS, &[]) {
        Some(DebugValue::Histogram(times)) => assert_eq!(times.len(), 3),
        other => panic!("{other:?}"),
    }
    match value(&snapshot, metrics::ACQUIRE_SECONDS, &[("agent", "milo")]) {
        Some(DebugValue::Histogram(times)) => assert_eq!(times.len(), 1, "the refused one"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        value(&snapshot, metrics::LEASES_HELD, &[("agent", "milo")]),
        Some(DebugValue::Gauge(held)) if held.into_inner() == 0.0
    ));
    let rex = |key: &'static str, value: &'static str| [("agent", "rex"), (key, value)];
    assert!(counter(metrics::RENEWALS, &rex("outcome", "ok")) >= 2);
    assert_eq!(counter(metrics::RENEWALS, &rex("outcome", "lost")), 1);
    assert_eq!(counter(metrics::LEASE_LOSSES, &[("agent", "rex")]), 1);
    match value(&snapshot, metrics::RENEW_SECONDS, &[("agent", "rex")]) {
        Some(DebugValue::Histogram(times)) => assert!(times.len() >= 3),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        value(&snapshot, metrics::LEASES_HELD, &[("agent", "rex")]),
        Some(DebugValue::Gauge(held)) if held.into_inner() == 0.0
    ));
}

/// A run id of the tests' own (valid).
fn run(id: &str) -> fencepost::id::RunId {
    fencepost::id::RunId::new(id).unwrap()
}
