//! SQLite renew against a bare one-statement write transaction on the same connection
//! (DESIGN §7: renew ≥ 80 % of the bare rate). Both are one autocommit statement that commits to
//! the write-ahead log with `synchronous = FULL`, as every durable renew must.
//!
//! * The coordinator clock moves one millisecond per renew: a renew that wrote the very same expiry
//!   would be skipped by SQLite (an identical row is not rewritten) and measure nothing.
//! * fsync latency drifts over seconds on shared disks, so the two are interleaved: every iteration
//!   of either benchmark runs both operations and times only its own.

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fencepost::backend::sqlite::SqliteLeaseCoordinator;
use fencepost::clock::ManualClock;
use fencepost::lease::{Lease, LeaseCoordinator};

struct Subject {
    clock: ManualClock,
    coordinator: SqliteLeaseCoordinator,
    lease: Lease,
}

impl Subject {
    fn bare_write(&self) {
        self.coordinator.with_connection(|connection| {
            connection
                .prepare_cached("UPDATE bench SET n = n + 1 WHERE id = 1")
                .and_then(|mut statement| statement.execute([]))
                .unwrap()
        });
    }

    fn renew(&self) {
        self.clock.advance(1);
        self.coordinator
            .renew(
                &self.lease.agent_id,
                &self.lease.holder,
                self.lease.epoch,
                3_600_000,
            )
            .unwrap();
    }
}

fn renew_versus_bare_write(criterion: &mut Criterion) {
    let folder = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_764_400_000_000);
    let coordinator =
        SqliteLeaseCoordinator::open(folder.path().join("leases.db"), clock.wall_clock()).unwrap();
    coordinator.with_connection(|connection| {
        connection
            .execute_batch("CREATE TABLE bench (id INTEGER PRIMARY KEY, n INTEGER NOT NULL); INSERT INTO bench VALUES (1, 0);")
            .unwrap()
    });
    let lease = coordinator
        .acquire("bench-agent", "bench-device", 3_600_000)
        .unwrap();
    let subject = Subject {
        clock,
        coordinator,
        lease,
    };
    let mut group = criterion.benchmark_group("sqlite");
    group.throughput(Throughput::Elements(1));
    group.bench_function("bare_one_statement_write", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, || subject.renew(), || subject.bare_write()))
    });
    group.bench_function("renew", |bencher| {
        bencher.iter_custom(|iterations| timed(iterations, || subject.bare_write(), || subject.renew()))
    });
    group.finish();
}

/// Runs `other` then `measured`, `iterations` times, and returns the time spent in `measured`.
fn timed(iterations: u64, other: impl Fn(), measured: impl Fn()) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iterations {
        other();
        let started = Instant::now();
        measured();
        elapsed += started.elapsed();
    }
    elapsed
}

criterion_group!(benches, renew_versus_bare_write);
criterion_main!(benches);
