//! Rules K5, R1: a process of a device appends after another process of the same device
//! appended records and pruned them (a checkpoint covers them) before the first one read them:
//! the append goes on after the stored log, never refused as damage, and loses nothing.

use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{CompactOptions, Ledger};
use fencepost::relay::{FsRelay, Relay, SqliteRelay};

fn commit(ledger: &mut Ledger, run: &str) {
    for status in [IntentStatus::Pending, IntentStatus::Committed] {
        ledger.record(&Intent::new("milo", run, 2, status)).unwrap();
    }
}

fn appends_after_records_pruned_before_it_read_them(relay: impl Fn() -> Arc<dyn Relay>) {
    let clock = ManualClock::new(1_764_400_000_000);
    let mut first = Ledger::open("laptop", clock.wall_clock(), relay()).unwrap();
    commit(&mut first, "run-1");
    let mut second = Ledger::open("laptop", clock.wall_clock(), relay()).unwrap();
    commit(&mut second, "run-2");
    commit(&mut second, "run-3");
    let info = second.compact_with(&CompactOptions::default().prune()).unwrap();
    assert!(info.pruned > 0, "K5: {info:?}");
    drop(second);

    commit(&mut first, "run-4");
    let mut reader = Ledger::open("reader", clock.wall_clock(), relay()).unwrap();
    assert!(reader.damage().is_empty(), "{:?}", reader.damage());
    for run in ["run-1", "run-2", "run-3", "run-4"] {
        assert!(reader.committed_run("milo", run).is_some(), "R1: {run}");
    }
}

#[test]
fn k5_r1_sqlite_an_append_after_records_pruned_before_it_read_them_goes_on() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("ledger.db");
    appends_after_records_pruned_before_it_read_them(|| Arc::new(SqliteRelay::open(&path).unwrap()));
}

#[test]
fn k5_r1_an_append_after_records_pruned_before_it_read_them_goes_on() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("ledger");
    appends_after_records_pruned_before_it_read_them(|| Arc::new(FsRelay::open(&path).unwrap()));
}
