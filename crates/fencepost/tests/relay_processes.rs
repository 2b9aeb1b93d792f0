//! Rule R1 across processes: writers on one host push their own devices while another process
//! pulls, and every op arrives exactly once.
//!
//! The writers are this test binary again, running the ignored test `child_writer` with its
//! instructions in environment variables (it does nothing without them).

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fencepost::clock::{system_clock, ManualClock};
use fencepost::oplog::{verify_log, DeviceLog, OpRecord, Surface};
use fencepost::relay::{Frontier, FsRelay, Relay};
use serde_json::json;

const OPS_PER_WRITER: usize = 10_000;
const BATCH: usize = 100;
const DIR_VARIABLE: &str = "FENCEPOST_TEST_RELAY_DIR";
const DEVICE_VARIABLE: &str = "FENCEPOST_TEST_DEVICE";
const DETERMINISTIC_VARIABLE: &str = "FENCEPOST_TEST_DETERMINISTIC";

#[test]
#[ignore = "a child process of r1_fs_two_writer_processes_and_a_concurrent_reader_see_every_op_once"]
fn child_writer() {
    let dir = std::env::var(DIR_VARIABLE).expect("run by the parent test, which sets the folder");
    let device = std::env::var(DEVICE_VARIABLE).expect("run by the parent test, which sets the device");
    let relay = FsRelay::open(&dir).unwrap();
    let deterministic = std::env::var_os(DETERMINISTIC_VARIABLE).is_some();
    let wall_clock = if deterministic {
        ManualClock::new(1_000).wall_clock()
    } else {
        system_clock()
    };
    let mut log = DeviceLog::new(&device, wall_clock).unwrap();
    let mut batch = Vec::with_capacity(BATCH);
    for n in 0..OPS_PER_WRITER {
        batch.push(log.append(Surface::log("work"), json!({"n": n, "device": device})));
        if batch.len() == BATCH {
            let report = relay.push(&batch).unwrap();
            assert_eq!(report.appended + report.already_present, BATCH);
            if !deterministic {
                assert_eq!(report.appended, BATCH);
            }
            batch.clear();
        }
    }
    relay.push(&batch).unwrap();
}

fn spawn_writer(dir: &Path, device: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_writer", "--quiet"])
        .env(DIR_VARIABLE, dir)
        .env(DEVICE_VARIABLE, device)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn r1_fs_two_writer_processes_and_a_concurrent_reader_see_every_op_once() {
    let dir = tempfile::tempdir().unwrap();
    let devices = ["writer-a", "writer-b"];
    let mut writers: Vec<Child> = devices
        .iter()
        .map(|device| spawn_writer(dir.path(), device))
        .collect();

    let reader = FsRelay::open(dir.path()).unwrap();
    let mut frontier = Frontier::new();
    let mut received: Vec<OpRecord> = Vec::new();
    let mut pulls_with_ops = 0;
    let pull = |frontier: &mut Frontier, received: &mut Vec<OpRecord>| {
        let batch = reader.pull(frontier).unwrap();
        // A line being written is reported as incomplete; nothing else is a problem.
        assert!(
            batch
                .problems
                .iter()
                .all(|problem| problem.kind == fencepost::relay::ProblemKind::IncompleteLine),
            "{:?}",
            batch.problems
        );
        for op in &batch.ops {
            assert_eq!(
                op.seq,
                frontier.next_seq(&op.device_id),
                "each pull continues exactly where the last ended"
            );
            frontier.observe(op);
        }
        let had_ops = !batch.ops.is_empty();
        received.extend(batch.ops);
        had_ops
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut statuses = Vec::new();
    while !writers.is_empty() {
        assert!(Instant::now() < deadline, "writers did not finish in time");
        if pull(&mut frontier, &mut received) {
            pulls_with_ops += 1;
        }
        let mut running = Vec::new();
        for mut writer in writers {
            match writer.try_wait().unwrap() {
                Some(status) => statuses.push(status),
                None => running.push(writer),
            }
        }
        writers = running;
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(statuses.iter().all(|status| status.success()), "{statuses:?}");
    pull(&mut frontier, &mut received);

    assert_eq!(received.len(), devices.len() * OPS_PER_WRITER);
    let unique: BTreeSet<_> = received.iter().map(|op| op.op_id).collect();
    assert_eq!(unique.len(), received.len(), "no op arrived twice");
    let mut by_device: BTreeMap<&str, Vec<OpRecord>> = BTreeMap::new();
    for op in &received {
        by_device.entry(&op.device_id).or_default().push(op.clone());
    }
    for device in devices {
        let log = &by_device[device];
        assert_eq!(log.len(), OPS_PER_WRITER);
        assert_eq!(verify_log(log), Ok(()));
    }
    assert!(
        pulls_with_ops > 1,
        "the reader should have pulled while the writers were writing"
    );
    // A reader that starts afresh agrees.
    let fresh = FsRelay::open(dir.path()).unwrap().pull(&Frontier::new()).unwrap();
    assert_eq!(fresh.ops.len(), received.len());
}

#[test]
fn r1_fs_two_processes_pushing_one_device_are_ordered_by_the_file_lock() {
    // Both children build the identical log (a manual clock), and push it concurrently in batches.
    // Without the lock their appends could interleave into duplicate lines; with it, each batch
    // either appends or finds its records present, and the file holds one clean chain.
    let dir = tempfile::tempdir().unwrap();
    let mut children: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "child_writer", "--quiet"])
                .env(DIR_VARIABLE, dir.path())
                .env(DEVICE_VARIABLE, "shared")
                .env(DETERMINISTIC_VARIABLE, "1")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    let pulled = FsRelay::open(dir.path()).unwrap().pull(&Frontier::new()).unwrap();
    assert!(pulled.problems.is_empty(), "{:?}", pulled.problems);
    assert_eq!(pulled.ops.len(), OPS_PER_WRITER);
    assert_eq!(verify_log(&pulled.ops), Ok(()));
    let text = std::fs::read_to_string(dir.path().join("devices").join("shared.jsonl")).unwrap();
    assert_eq!(text.lines().count(), OPS_PER_WRITER, "no line was written twice");
}
