//! `fencepost run` of a new occurrence on a host that ran the job before (issue 17: "warm
//! snapshot"), through the built binary: on a ledger folder that one host's job filled with 1 k
//! occurrences and with 1 M (a `pending` and a `committed` each: 2 k and 2 M records). The host
//! ran once before the measurements (that run reads everything and writes the snapshot); each
//! measured run is a new occurrence, which reads the snapshot's loaded part, looks up its run, and
//! appends two records.
//!
//! * `warm_run/occurrences/N`: the wall time of one `fencepost run ... -- true`.
//! * Printed before each group: the snapshot's size, the first (cold) run's time, and the peak
//!   RSS of a few warm runs (GNU time's `%M`, when `/usr/bin/time` is there).
//!
//! * `join/occurrences/N` (issue 17: "a new device joining a compacted ledger"): after a
//!   `fencepost ledger compact` of that ledger, the wall time of the first `fencepost run` of a
//!   new occurrence by a new device (a data directory of its own, empty before each run): it
//!   copies the checkpoint, checking it whole, reads the records after it, and runs (each with
//!   a coordinator of its own; its records are removed after it, so each joins the same ledger).
//!   Printed before it: the compaction's time and the checkpoint's size.
//!
//! `FENCEPOST_BENCH_SIZES` changes the numbers of occurrences (default `1000,1000000`);
//! `FENCEPOST_BENCH_KEEP=DIR` keeps a copy of each warm host's folder in `DIR/<occurrences>/home`.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fencepost::clock::ManualClock;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::oplog::{DeviceLog, Surface};
use fencepost::relay::device_file_name;
use fencepost::run_id::deterministic_run_id;

const DEVICE: &str = "bench-host";
const AGENT: &str = "nightly";
const INTENT: &str = "backup";

fn sizes() -> Vec<usize> {
    std::env::var("FENCEPOST_BENCH_SIZES")
        .ok()
        .map(|text| {
            text.split(',')
                .filter_map(|size| size.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![1_000, 1_000_000])
}

/// Writes `count` occurrences of the job, as `fencepost run` writes them (each at its own epoch,
/// a `pending` and a `committed`), into the ledger folder `ledger`.
fn fill(ledger: &Path, count: usize) {
    let devices = ledger.join("devices");
    std::fs::create_dir_all(&devices).unwrap();
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    // Stamps from before a day ago, 5 ms apart: the history is in the past.
    let clock = ManualClock::new(now_ms - 86_400_000 - 10 * count as u64);
    let mut log = DeviceLog::new(DEVICE, clock.wall_clock()).unwrap();
    let mut file =
        std::io::BufWriter::new(std::fs::File::create(devices.join(device_file_name(DEVICE))).unwrap());
    let mut line = Vec::new();
    for occurrence in 0..count {
        let run = deterministic_run_id(AGENT, INTENT, &format!("old-{occurrence}")).unwrap();
        let epoch = occurrence as u64 + 1;
        for status in [IntentStatus::Pending, IntentStatus::Committed] {
            clock.advance(5);
            let op = log.append(Surface::Intent, Intent::new(AGENT, &run, epoch, status).payload());
            line.clear();
            op.write_json_line(&mut line);
            file.write_all(&line).unwrap();
        }
    }
    file.into_inner().unwrap().sync_all().unwrap();
}

/// `fencepost run` of occurrence `salt` of the job, as [`DEVICE`], with its data in `home`.
fn run(home: &Path, salt: &str) -> Command {
    fencepost(
        home,
        &[
            "run", "--agent", AGENT, "--intent", INTENT, "--salt", salt, "--", "true",
        ],
    )
}

/// `fencepost ARGS` as [`DEVICE`], with its data in `home`.
fn fencepost(home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencepost"));
    command
        .args(args)
        .env(
            "FENCEPOST_COORDINATOR",
            format!("sqlite:{}", home.join("leases.db").display()),
        )
        .env("FENCEPOST_LEDGER", home.join("ledger"))
        .env("FENCEPOST_DEVICE", DEVICE)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env_remove("FENCEPOST_CONFIG")
        .env_remove("RUST_LOG");
    command
}

fn succeed(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The peak RSS, in MB, of a warm run (GNU time), if it can be measured here.
fn peak_rss_mb(home: &Path, salt: &str) -> Option<f64> {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        return None;
    }
    let inner = run(home, salt);
    let mut command = Command::new(time);
    command
        .args(["-f", "%M"])
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let output = command.output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stderr);
    let kilobytes: f64 = text.lines().last()?.trim().parse().ok()?;
    Some(kilobytes / 1024.0)
}

fn warm_run(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("warm_run/occurrences");
    group.sample_size(30).measurement_time(Duration::from_secs(10));
    for count in sizes() {
        let home = tempfile::tempdir().unwrap();
        fill(&home.path().join("ledger"), count);
        let started = Instant::now();
        succeed(&mut run(home.path(), "first"));
        // To look at a warm run by hand (a profiler, strace): the host's folder is kept there.
        if let Ok(keep) = std::env::var("FENCEPOST_BENCH_KEEP") {
            let kept = Path::new(&keep).join(count.to_string());
            let _ = std::fs::remove_dir_all(&kept);
            std::fs::create_dir_all(&kept).unwrap();
            let copied = Command::new("cp")
                .arg("-a")
                .arg(home.path())
                .arg(kept.join("home"))
                .status();
            println!(
                "kept a copy of the host's folder in {} ({copied:?})",
                kept.display()
            );
        }
        let cold = started.elapsed();
        let snapshots = home.path().join("data").join("fencepost").join("snapshots");
        let snapshot_bytes: u64 = std::fs::read_dir(&snapshots)
            .unwrap()
            .map(|item| item.unwrap().metadata().unwrap().len())
            .sum();
        let mut rss: Vec<f64> = (0..5)
            .filter_map(|index| peak_rss_mb(home.path(), &format!("rss-{index}")))
            .collect();
        rss.sort_by(f64::total_cmp);
        println!(
            "warm_run/occurrences/{count}: {} records; the first run (cold, writes the snapshot) took {:.2} s; snapshot files {:.1} MB; peak RSS of warm runs: {}",
            2 * count,
            cold.as_secs_f64(),
            snapshot_bytes as f64 / 1e6,
            match rss.get(rss.len() / 2) {
                Some(median) => format!("median {median:.1} MB (of {rss:?})"),
                None => "not measured (no /usr/bin/time)".to_owned(),
            }
        );
        // The set-up wrote hundreds of MB (the ledger, the snapshot): let the disk take them
        // before the runs are timed, or their fsyncs wait behind that write-back (37 ms instead
        // of 19 ms at 1 M occurrences, measured).
        let _ = Command::new("sync").status();
        let mut next = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(count), &count, |bencher, _| {
            bencher.iter(|| {
                next += 1;
                succeed(&mut run(home.path(), &format!("new-{next}")));
            })
        });
    }
    group.finish();
}

fn join(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("join/occurrences");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    for count in sizes() {
        let home = tempfile::tempdir().unwrap();
        fill(&home.path().join("ledger"), count);
        let started = Instant::now();
        succeed(&mut fencepost(home.path(), &["ledger", "compact"]));
        let compacted = started.elapsed();
        let checkpoints = home.path().join("ledger").join("checkpoints");
        let checkpoint_bytes: u64 = std::fs::read_dir(&checkpoints)
            .unwrap()
            .map(|item| item.unwrap().metadata().unwrap().len())
            .sum();
        println!(
            "join/occurrences/{count}: {} records; `ledger compact` (reads and checks every record, writes the checkpoint) took {:.2} s; checkpoint {:.1} MB",
            2 * count,
            compacted.as_secs_f64(),
            checkpoint_bytes as f64 / 1e6,
        );
        let _ = Command::new("sync").status(); // as above
        let mut next = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(count), &count, |bencher, _| {
            bencher.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    next += 1;
                    let data = home.path().join(format!("join-data-{next}"));
                    let device = format!("joiner-{next}");
                    let mut command = run(home.path(), &format!("join-{next}"));
                    command
                        .env("XDG_DATA_HOME", &data)
                        .env("FENCEPOST_DEVICE", &device)
                        .env(
                            "FENCEPOST_COORDINATOR",
                            format!("sqlite:{}", data.join("leases.db").display()),
                        );
                    let started = Instant::now();
                    succeed(&mut command);
                    total += started.elapsed();
                    // Each new device joins the same ledger: its records, data and coordinator
                    // (which published them) go.
                    std::fs::remove_dir_all(&data).unwrap();
                    std::fs::remove_file(
                        home.path()
                            .join("ledger")
                            .join("devices")
                            .join(device_file_name(&device)),
                    )
                    .unwrap();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, warm_run, join);
criterion_main!(benches);
