//! PostgreSQL coordinator benchmarks (DESIGN §7, issues 5 and 14):
//!
//! * `postgres/<path>/renew` against `postgres/<path>/bare_update` (a one-row autocommit `UPDATE`
//!   in one round trip, which flushes the WAL like every durable renew; target: renew ≥ 80 % of
//!   its rate) and `postgres/<path>/select_1` (a bare round trip), where `<path>` is `direct` (the
//!   server) and `pgbouncer_transaction` (PgBouncer in transaction mode in front of it). Every
//!   statement is unnamed or simple, as the coordinator's own are, so each works through the
//!   pooler. The three are interleaved (every iteration runs each and times one) so that drift in
//!   fsync latency hits them alike. `postgres/direct/renew_without_wal_flush` is the renew on a
//!   `synchronous_commit = off` session, to show what the flush costs.
//! * **The ratio, paired**: criterion measures one function after the other, and on a small shared
//!   machine the fsync latency drifts by ±30 % between those windows, more than the margin of the
//!   target. So before each group the benchmark also runs renew and the bare write alternately
//!   ([`PAIRS`] times each) and prints both medians and their ratio, measured in one window:
//!   `postgres/<path>: paired over … pairs: renew … µs, bare write … µs; renew rate = …% of the bare
//!   write rate`.
//! * `postgres_contention/acquire_8_way`: 8 threads, each with its own coordinator, acquire one
//!   agent over and over (a winner releases at once); the time is per acquire, all threads
//!   together.
//!
//! Uses the server at `FENCEPOST_POSTGRES_URL` and the pooler at
//! `FENCEPOST_PGBOUNCER_TRANSACTION_URL`, or starts throw-away ones with `scripts/postgres-sandbox`
//! (and stops them at the end). Run: `cargo bench --bench postgres`.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

#[path = "support/postgres_server.rs"]
mod postgres_server;

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator};
use fencepost::lease::{LeaseCoordinator, LeaseError};

use postgres_server::{median_us, timed};

fn coordinator(url: &str) -> PostgresLeaseCoordinator {
    let coordinator = PostgresLeaseCoordinator::connect(PostgresConfig {
        schema: "fencepost_bench".into(),
        ..PostgresConfig::new(url)
    })
    .unwrap();
    coordinator.migrate().unwrap();
    coordinator
}

/// How many (renew, bare write) pairs the paired ratio runs.
const PAIRS: usize = 2_000;

/// Runs `renew` and `bare` alternately, [`PAIRS`] times each, and prints their medians and ratio.
fn paired_ratio(path: &str, renew: &dyn Fn(), bare: &dyn Fn()) {
    let (mut renews, mut bares) = (Vec::with_capacity(PAIRS), Vec::with_capacity(PAIRS));
    for _ in 0..PAIRS {
        let started = Instant::now();
        renew();
        renews.push(started.elapsed());
        let started = Instant::now();
        bare();
        bares.push(started.elapsed());
    }
    let (renew, bare) = (median_us(&mut renews), median_us(&mut bares));
    println!(
        "postgres/{path}: paired over {PAIRS} pairs: renew {renew:.0} µs, bare write {bare:.0} µs; renew rate = {:.0}% of the bare write rate",
        100.0 * bare / renew
    );
}

/// `renew`, `bare_update` and `select_1` through `url`, as `postgres/<path>/…`, after the paired
/// ratio of renew and the bare write.
fn renew_against_a_bare_write(criterion: &mut Criterion, path: &str, url: &str) {
    let coordinator = coordinator(url);
    coordinator
        .with_connection(|client| {
            client.batch_execute(
                "CREATE TABLE IF NOT EXISTS fencepost_bench.counter (id int PRIMARY KEY, n bigint NOT NULL);
                 INSERT INTO fencepost_bench.counter VALUES (1, 0) ON CONFLICT DO NOTHING;",
            )
        })
        .unwrap();
    let agent = format!("bench-renew-{path}");
    let lease = match coordinator.acquire(&agent, "bench", 3_600_000) {
        Ok(lease) => lease,
        Err(LeaseError::Held { epoch, .. }) => coordinator.renew(&agent, "bench", epoch, 3_600_000).unwrap(),
        Err(other) => panic!("{other}"),
    };
    let select_1 = || {
        coordinator
            .with_connection(|client| client.simple_query("SELECT 1"))
            .unwrap();
    };
    let bare_update = || {
        coordinator
            .with_connection(|client| {
                client.simple_query("UPDATE fencepost_bench.counter SET n = n + 1 WHERE id = 1")
            })
            .unwrap();
    };
    let renew = || {
        coordinator
            .renew(&lease.agent_id, &lease.holder, lease.epoch, 3_600_000)
            .unwrap();
    };
    paired_ratio(path, &renew, &bare_update);
    let mut group = criterion.benchmark_group(format!("postgres/{path}"));
    group.throughput(Throughput::Elements(1));
    group.bench_function("select_1", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, &[&renew, &bare_update], &select_1))
    });
    group.bench_function("renew", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, &[&select_1, &bare_update], &renew))
    });
    group.bench_function("bare_update", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, &[&select_1, &renew], &bare_update))
    });
    if path == "direct" {
        // For comparison only: the same renew on a session that does not wait for the WAL flush
        // (`synchronous_commit = off`, session state a pooler would not keep), which the
        // coordinator never sets (a renewal lost in a crash would shorten a lease its holder
        // believes it has).
        let unflushed = self::coordinator(url);
        unflushed
            .with_connection(|client| client.batch_execute("SET synchronous_commit = off"))
            .unwrap();
        let renew_unflushed = || {
            unflushed
                .renew(&lease.agent_id, &lease.holder, lease.epoch, 3_600_000)
                .unwrap();
        };
        group.bench_function("renew_without_wal_flush", |bencher| {
            bencher.iter_custom(|iterations| timed(iterations, &[&select_1, &renew], &renew_unflushed))
        });
    }
    group.finish();
}

fn benchmarks(criterion: &mut Criterion) {
    let (url, pooled, _sandbox) = postgres_server::server();
    renew_against_a_bare_write(criterion, "direct", &url);
    renew_against_a_bare_write(criterion, "pgbouncer_transaction", &pooled);

    const THREADS: usize = 8;
    let contenders: Vec<_> = (0..THREADS).map(|_| self::coordinator(&url)).collect();
    let mut group = criterion.benchmark_group("postgres_contention");
    group.throughput(Throughput::Elements(1));
    group.bench_function("acquire_8_way", |bencher| {
        bencher.iter_custom(|iterations| {
            let per_thread = iterations.div_ceil(THREADS as u64);
            let started = Instant::now();
            std::thread::scope(|scope| {
                for (index, contender) in contenders.iter().enumerate() {
                    scope.spawn(move || {
                        let device = format!("contender-{index}");
                        for _ in 0..per_thread {
                            match contender.acquire("bench-contended", &device, 60_000) {
                                Ok(lease) => contender
                                    .release("bench-contended", &device, lease.epoch)
                                    .unwrap(),
                                Err(LeaseError::Held { .. }) => {}
                                Err(other) => panic!("{other}"),
                            }
                        }
                    });
                }
            });
            started
                .elapsed()
                .mul_f64(iterations as f64 / (per_thread * THREADS as u64) as f64)
        })
    });
    group.finish();
}

criterion_group!(benches, benchmarks);
criterion_main!(benches);
