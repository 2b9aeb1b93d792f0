//! `FsRelay` push + pull: linear in the ops moved, not in the store's size (DESIGN §7, R1).
//!
//! * `fresh_store/N`: push N ops of one device into an empty folder, then pull them all with a
//!   second relay instance (a reader in another process would do the same work).
//! * `open_store/S`: on a relay that is already open over a store of S ops, push the next 1 000 ops
//!   and pull them with a reader that is up to date. The cost must not grow with S.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fencepost::clock::ManualClock;
use fencepost::oplog::{DeviceLog, OpRecord, Surface};
use fencepost::relay::{Frontier, FsRelay, Relay};
use serde_json::json;

fn make_log(device: &str) -> (ManualClock, DeviceLog) {
    let clock = ManualClock::new(1_764_400_000_000);
    let log = DeviceLog::new(device, clock.wall_clock()).unwrap();
    (clock, log)
}

fn next_ops(clock: &ManualClock, log: &mut DeviceLog, count: usize) -> Vec<OpRecord> {
    (0..count)
        .map(|n| {
            clock.advance(1);
            log.append(
                Surface::Intent,
                json!({"id": format!("run-{n:032x}"), "agent_id": "agent-042", "epoch": 2, "status": "committed"}),
            )
        })
        .collect()
}

fn fresh_store(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("fs_relay_push_pull/fresh_store");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    for count in [10_000usize, 100_000] {
        let (clock, mut log) = make_log("laptop-1");
        let ops = next_ops(&clock, &mut log, count);
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(count.to_string(), |bencher| {
            bencher.iter_batched(
                || tempfile::tempdir().unwrap(),
                |dir| {
                    FsRelay::open(dir.path()).unwrap().push(&ops).unwrap();
                    let pulled = FsRelay::open(dir.path()).unwrap().pull(&Frontier::new()).unwrap();
                    assert_eq!(pulled.ops.len(), count);
                    dir
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn open_store(criterion: &mut Criterion) {
    const MOVED: usize = 1_000;
    let mut group = criterion.benchmark_group("fs_relay_push_pull/open_store");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(MOVED as u64));
    for stored in [0usize, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        let writer = FsRelay::open(dir.path()).unwrap();
        let reader = FsRelay::open(dir.path()).unwrap();
        let (clock, mut log) = make_log("laptop-1");
        let mut frontier = Frontier::new();
        for _ in 0..stored / 10_000 {
            writer.push(&next_ops(&clock, &mut log, 10_000)).unwrap();
        }
        frontier.observe_all(&reader.pull(&frontier).unwrap().ops);
        group.bench_function(stored.to_string(), |bencher| {
            bencher.iter_custom(|iterations| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iterations {
                    let ops = next_ops(&clock, &mut log, MOVED);
                    let started = Instant::now();
                    writer.push(&ops).unwrap();
                    let pulled = reader.pull(&frontier).unwrap();
                    elapsed += started.elapsed();
                    assert_eq!(pulled.ops.len(), MOVED);
                    frontier.observe_all(&pulled.ops);
                }
                elapsed
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fresh_store, open_store);
criterion_main!(benches);
