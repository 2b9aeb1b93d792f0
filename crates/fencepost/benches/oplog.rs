//! `DeviceLog::append` (hash + chain): target ≥ 1 M ops/s (DESIGN §7).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fencepost::clock::ManualClock;
use fencepost::oplog::{DeviceLog, Surface};
use fencepost::run_id::deterministic_run_id;
use serde_json::{json, Value};

const BATCH: usize = 10_000;

fn intent_payloads() -> Vec<Value> {
    (0..BATCH)
        .map(|n| {
            let run = deterministic_run_id("agent-042", "send weekly report", &n.to_string()).unwrap();
            json!({"id": run, "agent_id": "agent-042", "epoch": 2, "status": "committed"})
        })
        .collect()
}

fn append(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("device_log");
    group.throughput(Throughput::Elements(BATCH as u64));
    let clock = ManualClock::new(1_764_400_000_000);
    let mut log = DeviceLog::new("laptop-1", clock.wall_clock()).unwrap();
    group.bench_function("append_intent", |bencher| {
        bencher.iter_batched(
            intent_payloads,
            |payloads| {
                for payload in payloads {
                    clock.advance(1);
                    std::hint::black_box(log.append(Surface::Intent, payload));
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
