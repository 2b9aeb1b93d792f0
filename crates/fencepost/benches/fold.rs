//! The fold and the dispatch fence (DESIGN §7):
//! * `fold/1.9M_intents`: folding the whole workload, target ≥ 5 M ops/s;
//! * `fold/apply_1k_tail`: applying 1 000 new records to the folded state in place, target ≤ 2 ms;
//! * `fence/check_dispatch_*`: the fence on the in-memory coordinator, target ≤ 1 µs.
//!
//! Peak memory is measured by `cargo run --release --example fold_memory`.

#[path = "support/workload.rs"]
mod workload;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fencepost::clock::ManualClock;
use fencepost::fence::{check_dispatch, FenceDecision};
use fencepost::fold::{fold, SyncState};
use fencepost::lease::{InMemoryLeaseCoordinator, LeaseCoordinator};

fn benches(criterion: &mut Criterion) {
    let mut workload = workload::build();
    let mut group = criterion.benchmark_group("fold");
    group.sample_size(10).measurement_time(Duration::from_secs(15));
    group.throughput(Throughput::Elements(workload.ops.len() as u64));
    group.bench_function("1.9M_intents", |bencher| {
        bencher.iter_batched(|| (), |()| fold(&workload.ops), BatchSize::PerIteration)
    });

    let mut state: SyncState = fold(&workload.ops);
    let mut next_run = 0;
    group.sample_size(50).measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(1_000));
    group.bench_function("apply_1k_tail", |bencher| {
        bencher.iter_batched(
            || {
                next_run += 500;
                workload::tail(&mut workload, next_run - 500, 1_000)
            },
            |tail| state.apply_all(&tail),
            BatchSize::PerIteration,
        )
    });
    group.finish();

    let mut group = criterion.benchmark_group("fence");
    let coordinator = InMemoryLeaseCoordinator::new(ManualClock::new(1_764_400_000_000).wall_clock());
    let lease = coordinator.acquire("agent-007", "device-1", 30_000).unwrap();
    let (committed_run, _) = state.agent("agent-007").unwrap().committed_runs()[0].clone();
    let fresh_run = "run-00000000000000000000000000000000";
    assert!(matches!(
        check_dispatch(
            &coordinator,
            &state,
            "agent-007",
            &committed_run,
            "device-1",
            lease.epoch
        ),
        Ok(FenceDecision::AlreadyCommitted { .. })
    ));
    assert_eq!(
        check_dispatch(
            &coordinator,
            &state,
            "agent-007",
            fresh_run,
            "device-1",
            lease.epoch
        )
        .unwrap(),
        FenceDecision::Proceed
    );
    group.bench_function("check_dispatch_proceed", |bencher| {
        bencher.iter(|| {
            check_dispatch(
                &coordinator,
                &state,
                "agent-007",
                fresh_run,
                "device-1",
                lease.epoch,
            )
        })
    });
    group.bench_function("check_dispatch_already_committed", |bencher| {
        bencher.iter(|| {
            check_dispatch(
                &coordinator,
                &state,
                "agent-007",
                &committed_run,
                "device-1",
                lease.epoch,
            )
        })
    });
    group.finish();
}

criterion_group!(fold_benches, benches);
criterion_main!(fold_benches);
