//! The ledger in PostgreSQL (`PostgresRelay`, issue 16):
//!
//! * `postgres_relay/push_1_record`: a push of one new record (one transaction in two round trips:
//!   lock the device's row and read its head, then insert and commit), beside
//!   `postgres_relay/bare_insert` (a one-row autocommit `INSERT` of a record-sized text in one round
//!   trip: the least a durable write of one record costs) and `postgres_relay/pull_new` (another
//!   handle's pull of what is new since its frontier: the record just pushed). The three are
//!   interleaved, each iteration runs each and times one, and before the group they run
//!   alternately [`PAIRS`] times and their medians are printed from that one window (the fsync
//!   latency of a small machine drifts between criterion's windows).
//! * `postgres_relay_scale/pull_1k_new_of_10k` and `…_of_1M`: a pull of 1 000 new records (10 from
//!   each of 100 devices) from a relay that holds 10 000 records, and from one that holds
//!   1 000 000: a pull reads only what is after the frontier (an index range scan per device), so
//!   the two should cost the same.
//!
//! The stores of the scale group are filled once (with `COPY`, in schemas of their own) and kept
//! for later runs on the same server. Uses the server at `FENCEPOST_POSTGRES_URL`, or starts a
//! throw-away one with `scripts/postgres-sandbox`. Run: `cargo bench -p fencepost --features
//! postgres --bench postgres_relay`.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

#[path = "support/postgres_server.rs"]
mod postgres_server;

use std::cell::RefCell;
use std::io::Write;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator};
use fencepost::clock::ManualClock;
use fencepost::oplog::{DeviceLog, OpRecord, Surface};
use fencepost::relay::Frontier;
use fencepost::relay::{PostgresRelay, Relay};
use postgres::{Client, NoTls};
use serde_json::json;

use postgres_server::{median_us, timed};

/// How many (push, pull, bare insert) triples the paired medians run.
const PAIRS: usize = 1_000;

/// Devices of the scale stores, and new records per device that a pull returns.
const DEVICES: u64 = 100;
const NEW_PER_DEVICE: u64 = 10;

fn config(url: &str, schema: &str) -> PostgresConfig {
    PostgresConfig {
        schema: schema.to_owned(),
        ..PostgresConfig::new(url)
    }
}

/// Migrates `schema` (the relay's tables are the coordinator schema's).
fn migrate(url: &str, schema: &str) {
    PostgresLeaseCoordinator::connect(config(url, schema))
        .unwrap()
        .migrate()
        .unwrap();
}

/// A record's payload, about the size of an intent's.
fn payload(n: u64) -> serde_json::Value {
    json!({"agent_id": "billing-agent", "run_id": format!("run-{n:016x}"), "epoch": 3, "status": "committed"})
}

fn push_pull_and_a_bare_insert(criterion: &mut Criterion, url: &str) {
    let schema = "fencepost_bench_relay";
    migrate(url, schema);
    let writer = PostgresRelay::connect(config(url, schema)).unwrap();
    let reader = PostgresRelay::connect(config(url, schema)).unwrap();
    let bare = PostgresLeaseCoordinator::connect(config(url, schema)).unwrap();
    bare.with_connection(|client| {
        client.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.bare_records (device_id text NOT NULL, seq bigint NOT NULL, record text NOT NULL, PRIMARY KEY (device_id, seq));
             TRUNCATE {schema}.bare_records"
        ))
    })
    .unwrap();
    // A device of this run of the benchmark, continued from what the relay holds.
    let clock = ManualClock::new(1_000);
    let device = format!("bench-{}", std::process::id());
    let log = RefCell::new(DeviceLog::new(&device, clock.wall_clock()).unwrap());
    let frontier = RefCell::new(reader.pull(&Frontier::new()).map_or_else(
        |_| Frontier::new(),
        |batch| {
            let mut frontier = Frontier::new();
            frontier.observe_all(&batch.ops);
            frontier
        },
    ));
    let sample = {
        let mut line = Vec::new();
        DeviceLog::new("sample", clock.wall_clock())
            .unwrap()
            .append(Surface::log("intent"), payload(0))
            .write_json_line(&mut line);
        String::from_utf8(line).unwrap().trim_end().replace('\'', "''")
    };
    let next_bare = RefCell::new(0u64);

    let push = || {
        let mut log = log.borrow_mut();
        let n = log.head().next_seq();
        let op = log.append(Surface::log("intent"), payload(n));
        writer.push(std::slice::from_ref(&op)).unwrap();
    };
    let pull = || {
        let mut frontier = frontier.borrow_mut();
        let batch = reader.pull(&frontier).unwrap();
        assert!(batch.problems.is_empty(), "{:?}", batch.problems);
        frontier.observe_all(&batch.ops);
    };
    let bare_insert = || {
        let mut n = next_bare.borrow_mut();
        *n += 1;
        let statement = format!(
            "INSERT INTO {schema}.bare_records (device_id, seq, record) VALUES ('{device}', {n}, '{sample}')"
        );
        bare.with_connection(|client| client.simple_query(&statement))
            .unwrap();
    };

    let (mut pushes, mut pulls, mut bares) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        for (samples, call) in [
            (&mut pushes, &push as &dyn Fn()),
            (&mut pulls, &pull),
            (&mut bares, &bare_insert),
        ] {
            let started = Instant::now();
            call();
            samples.push(started.elapsed());
        }
    }
    let (push_us, pull_us, bare_us) = (
        median_us(&mut pushes),
        median_us(&mut pulls),
        median_us(&mut bares),
    );
    println!(
        "postgres_relay: paired over {PAIRS} rounds: push of 1 record {push_us:.0} µs, pull of the new record {pull_us:.0} µs, bare one-row insert {bare_us:.0} µs; push = {:.2}× the bare insert",
        push_us / bare_us
    );

    let mut group = criterion.benchmark_group("postgres_relay");
    group.throughput(Throughput::Elements(1));
    group.bench_function("push_1_record", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, &[&pull, &bare_insert], &push))
    });
    group.bench_function("pull_new", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, &[&push, &bare_insert], &pull))
    });
    group.bench_function("bare_insert", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, &[&push, &pull], &bare_insert))
    });
    group.finish();
}

/// A schema whose relay holds `total` records, [`DEVICES`] devices of `total / DEVICES` each
/// (filled with `COPY` unless an earlier run did); returns the frontier that lacks the last
/// [`NEW_PER_DEVICE`] records of each device.
fn filled_store(url: &str, schema: &str, total: u64) -> Frontier {
    migrate(url, schema);
    let per_device = total / DEVICES;
    let mut admin = Client::connect(url, NoTls).unwrap();
    let stored: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {schema}.relay_records"), &[])
        .unwrap()
        .get(0);
    if stored as u64 != per_device * DEVICES {
        println!("postgres_relay_scale: filling {schema} with {total} records (once; later runs reuse it)");
        admin
            .batch_execute(&format!(
                "TRUNCATE {schema}.relay_records, {schema}.relay_devices"
            ))
            .unwrap();
        let clock = ManualClock::new(1_000);
        let mut copy = admin
            .copy_in(&format!(
                "COPY {schema}.relay_records (device_id, seq, record) FROM STDIN"
            ))
            .unwrap();
        let mut line = Vec::new();
        for device in 0..DEVICES {
            let name = format!("device-{device:03}");
            let mut log = DeviceLog::new(&name, clock.wall_clock()).unwrap();
            for n in 0..per_device {
                let op: OpRecord = log.append(Surface::log("intent"), payload(n));
                line.clear();
                op.write_json_line(&mut line);
                let record = String::from_utf8_lossy(line.trim_ascii_end()).replace('\\', "\\\\");
                writeln!(copy, "{name}\t{n}\t{record}").unwrap();
            }
        }
        copy.finish().unwrap();
        admin
            .batch_execute(&format!(
                "INSERT INTO {schema}.relay_devices (device_id, next_seq)
                     SELECT device_id, max(seq) + 1 FROM {schema}.relay_records GROUP BY device_id;
                 ANALYZE {schema}.relay_records; ANALYZE {schema}.relay_devices;"
            ))
            .unwrap();
    }
    let mut frontier = Frontier::new();
    for device in 0..DEVICES {
        frontier.raise(&format!("device-{device:03}"), per_device - NEW_PER_DEVICE);
    }
    frontier
}

fn pull_by_frontier_at_scale(criterion: &mut Criterion, url: &str) {
    let stores = [
        ("pull_1k_new_of_10k", "fencepost_bench_relay_10k", 10_000),
        ("pull_1k_new_of_1M", "fencepost_bench_relay_1m", 1_000_000),
    ];
    let mut group = criterion.benchmark_group("postgres_relay_scale");
    group.throughput(Throughput::Elements(DEVICES * NEW_PER_DEVICE));
    for (name, schema, total) in stores {
        let frontier = filled_store(url, schema, total);
        let relay = PostgresRelay::connect(config(url, schema)).unwrap();
        let batch = relay.pull(&frontier).unwrap();
        assert!(batch.problems.is_empty(), "{:?}", batch.problems);
        assert_eq!(batch.ops.len() as u64, DEVICES * NEW_PER_DEVICE);
        group.bench_function(name, |bencher| {
            bencher.iter(|| relay.pull(&frontier).unwrap().ops.len())
        });
    }
    group.finish();
}

fn benchmarks(criterion: &mut Criterion) {
    let (url, _pooled, _sandbox) = postgres_server::server();
    push_pull_and_a_bare_insert(criterion, &url);
    pull_by_frontier_at_scale(criterion, &url);
}

criterion_group!(benches, benchmarks);
criterion_main!(benches);
