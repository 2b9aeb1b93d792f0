//! Opening a ledger folder cold, with no snapshot: read, parse and verify every record of every
//! device, then fold them (issue 17's "cold open" target: 2 M records at ≥ 1.5 M records/s).
//!
//! * `ledger_open/cold/current_format`: 1 M occurrences of one host's job (a `pending` and a
//!   `committed` each, 2 M records) in the record format this version writes, opened by that
//!   host (`Ledger::open` with its own device id, so its log is resumed too).
//! * `ledger_open/cold/json_object_format`: the same records written in the JSON object form of
//!   earlier versions, which readers still accept.
//! * `ledger_open/cold/protected`: the same occurrences in a protected ledger (issue 39's target:
//!   ≥ 1 M records/s), written as `fencepost run` writes them: each record sealed
//!   (XChaCha20-Poly1305) and appended alone, so each carries a signed head. Opened by its
//!   founder: every record authenticated (a valid head covers those before it, so the last
//!   head of each device's records handed over at once is verified), opened and folded.
//!
//! * `ledger_open/cold/protected_compacted`: that protected ledger compacted and pruned by its
//!   founder (`compact_with(prune)`: one sealed checkpoint in the ledger folder, no records
//!   left in the logs), opened by the founder with an empty folder of opened checkpoints, as a
//!   new host or a reinstalled one opens it: the checkpoint's header judged, its chunks
//!   authenticated and decrypted, its signature verified, then loaded and folded.
//!
//! The bytes per record of each form are printed before the runs.
//!
//! `FENCEPOST_BENCH_OCCURRENCES` changes the number of occurrences (default 1 000 000).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fencepost::clock::ManualClock;
use fencepost::genesis::Genesis;
use fencepost::id::DeviceId;
use fencepost::identity::DeviceKey;
use fencepost::ledger::{CompactOptions, Ledger, LedgerOptions, Protected};
use fencepost::oplog::{DeviceLog, OpRecord, SealedContent, Surface};
use fencepost::protected::Origin;
use fencepost::relay::{device_file_name, FsRelay, Relay};
use fencepost::seal::LedgerKey;
use serde_json::json;

const DEVICE: &str = "vm-0035969e";
const BATCH: usize = 10_000;

fn occurrences() -> usize {
    std::env::var("FENCEPOST_BENCH_OCCURRENCES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1_000_000)
}

/// `count` occurrences of one job, each a `pending` and a `committed` at its own epoch, in
/// batches of [`BATCH`] records.
fn occurrence_batches(clock: &ManualClock, count: usize, mut each: impl FnMut(&[OpRecord])) {
    let mut log = DeviceLog::new(DEVICE, clock.wall_clock()).unwrap();
    let mut batch = Vec::with_capacity(BATCH);
    occurrence_payloads(count, |payload| {
        clock.advance(5);
        batch.push(log.append(Surface::Intent, payload));
        if batch.len() >= BATCH {
            each(&batch);
            batch.clear();
        }
    });
    if !batch.is_empty() {
        each(&batch);
    }
}

/// A protected ledger's founder, its genesis and the first generation of its key.
struct Founder {
    key: Arc<DeviceKey>,
    genesis: Genesis,
    ledger_key: LedgerKey,
}

impl Founder {
    fn new() -> Self {
        let device = DeviceId::new(DEVICE).unwrap();
        let key = Arc::new(DeviceKey::from_secrets(device.clone(), [1; 32], [2; 32]));
        let recovery = DeviceKey::from_secrets(DeviceId::new("recovery").unwrap(), [4; 32], [5; 32]);
        let genesis = Genesis {
            nonce: [3; 16],
            founder: device,
            founder_key: key.public(),
            recovery_key: recovery.public(),
        };
        let ledger_key = LedgerKey::new(std::num::NonZeroU32::MIN, [6; 32]);
        Self {
            key,
            genesis,
            ledger_key,
        }
    }

    /// How the founder opens its ledger: the key given, as a host that unwrapped it holds it.
    fn protected(&self) -> Protected {
        Protected {
            ledger: self.genesis.ledger_id(),
            device_key: Arc::clone(&self.key),
            origin: Origin::Genesis(self.genesis.clone()),
            keys: vec![self.ledger_key.clone()],
            members: Vec::new(),
        }
    }

    /// Writes `count` occurrences into `relay` as `Ledger::record` would (record 0, the
    /// genesis, the agent's naming, then each intent sealed in one size), each record signed as the last of its own append, in
    /// pushes of [`BATCH`] records (as many appends as one push, for speed).
    fn write(&self, relay: &FsRelay, clock: &ManualClock, count: usize) {
        let ledger = self.genesis.ledger_id();
        let first = OpRecord::sealed(
            Arc::from(DEVICE),
            0,
            None,
            SealedContent::Clear(Origin::Genesis(self.genesis.clone()).to_bytes().into()),
        );
        let origin = first.op_id;
        let mut log = DeviceLog::new(DEVICE, clock.wall_clock()).unwrap();
        log.append_made(&first).unwrap();
        let mut batch = vec![first];
        let push = |batch: &mut Vec<OpRecord>| {
            relay.push(batch).unwrap();
            batch.clear();
        };
        // The log names the agent once; its intents are of one size (rule S5).
        let digest: String = fencepost::oplog::agent_digest("demo")
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let naming = json!({"key": digest, "agent": "demo"});
        let draft = log
            .draft(Surface::registry(fencepost::oplog::AGENT_NAMES), naming)
            .unwrap();
        let sealed = draft.seal(&self.ledger_key, ledger).unwrap();
        log.append_made(&sealed).unwrap();
        batch.push(sealed.signed(&self.key, &ledger, &origin));
        occurrence_payloads(count, |payload| {
            clock.advance(5);
            let draft = log.draft(Surface::Intent, payload).unwrap();
            let sealed = draft.seal_named(&self.ledger_key, ledger).unwrap();
            log.append_made(&sealed).unwrap();
            batch.push(sealed.signed(&self.key, &ledger, &origin));
            if batch.len() >= BATCH {
                push(&mut batch);
            }
        });
        if !batch.is_empty() {
            push(&mut batch);
        }
    }
}

/// The payloads of `count` occurrences of one job: a `pending` and a `committed` each.
fn occurrence_payloads(count: usize, mut each: impl FnMut(serde_json::Value)) {
    for occurrence in 0..count {
        let run = format!(
            "run-{:032x}",
            (occurrence as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        );
        let epoch = occurrence as u64 + 1;
        for status in ["pending", "committed"] {
            each(json!({"id": run, "agent_id": "demo", "epoch": epoch, "status": status}));
        }
    }
}

fn folder_size(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("devices").join(device_file_name(DEVICE)))
        .map(|metadata| metadata.len())
        .unwrap_or(0)
}

fn cold_open(criterion: &mut Criterion) {
    let count = occurrences();
    let records = 2 * count as u64;
    let clock = ManualClock::new(1_796_085_755_970);

    // The current format, written by the relay.
    let current = tempfile::tempdir().unwrap();
    let relay = FsRelay::open(current.path()).unwrap();
    occurrence_batches(&clock, count, |batch| {
        relay.push(batch).unwrap();
    });
    // The JSON object form of earlier versions, written line by line.
    let object = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(object.path().join("devices")).unwrap();
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(object.path().join("devices").join(device_file_name(DEVICE))).unwrap(),
    );
    occurrence_batches(&ManualClock::new(1_796_085_755_970), count, |batch| {
        for op in batch {
            serde_json::to_writer(&mut file, op).unwrap();
            file.write_all(b"\n").unwrap();
        }
    });
    file.into_inner().unwrap().sync_all().unwrap();
    // A protected ledger of the same occurrences.
    let founder = Founder::new();
    let protected = tempfile::tempdir().unwrap();
    founder.write(
        &FsRelay::open(protected.path()).unwrap(),
        &ManualClock::new(1_796_085_755_970),
        count,
    );
    for (name, dir) in [
        ("current_format", &current),
        ("json_object_format", &object),
        ("protected", &protected),
    ] {
        println!(
            "ledger_open/cold/{name}: {records} records, {} bytes, {:.1} bytes per record",
            folder_size(dir.path()),
            folder_size(dir.path()) as f64 / records as f64
        );
    }

    let mut group = criterion.benchmark_group("ledger_open/cold");
    group.sample_size(10).measurement_time(Duration::from_secs(40));
    group.throughput(Throughput::Elements(records));
    for (name, dir) in [("current_format", &current), ("json_object_format", &object)] {
        group.bench_function(name, |bencher| {
            bencher.iter(|| {
                let relay = Arc::new(FsRelay::open(dir.path()).unwrap());
                let ledger = Ledger::open(DEVICE, clock.wall_clock(), relay).unwrap();
                assert_eq!(ledger.view().frontier().next_seq(DEVICE), records);
                ledger
            })
        });
    }
    // Every record counted, once, outside the timing.
    let relay = Arc::new(FsRelay::open(protected.path()).unwrap());
    let options = LedgerOptions::default().protected(founder.protected());
    let opened = Ledger::open_with(DEVICE, clock.wall_clock(), relay, options).unwrap();
    assert!(opened.damage().is_empty(), "{:?}", opened.damage());
    assert_eq!(
        opened.state().agent("demo").map(|agent| agent.runs().len()),
        Some(count)
    );
    drop(opened);
    group.bench_function("protected", |bencher| {
        bencher.iter(|| {
            let relay = Arc::new(FsRelay::open(protected.path()).unwrap());
            let options = LedgerOptions::default().protected(founder.protected());
            let ledger = Ledger::open_with(DEVICE, clock.wall_clock(), relay, options).unwrap();
            // Record 0, the naming and the intents.
            assert_eq!(ledger.view().frontier().next_seq(DEVICE), records + 2);
            ledger
        })
    });
    // The same ledger, compacted and pruned into one sealed checkpoint.
    let copies = tempfile::tempdir().unwrap();
    let compacting = LedgerOptions::default()
        .protected(founder.protected())
        .checkpoint_copies(copies.path().join("founder"));
    let relay = Arc::new(FsRelay::open(protected.path()).unwrap());
    let mut founding = Ledger::open_with(DEVICE, clock.wall_clock(), relay, compacting).unwrap();
    let compacted = founding.compact_with(&CompactOptions::default().prune()).unwrap();
    assert!(compacted.pruned > 0, "{compacted:?}");
    drop(founding);
    let fresh = || {
        let home = tempfile::tempdir_in(copies.path()).unwrap();
        let options = LedgerOptions::default()
            .protected(founder.protected())
            .checkpoint_copies(home.path().join("checkpoints"));
        (home, options)
    };
    group.bench_function("protected_compacted", |bencher| {
        bencher.iter_batched(
            fresh,
            |(home, options)| {
                let relay = Arc::new(FsRelay::open(protected.path()).unwrap());
                let ledger = Ledger::open_with(DEVICE, clock.wall_clock(), relay, options).unwrap();
                assert_eq!(ledger.view().frontier().next_seq(DEVICE), records + 2);
                (ledger, home)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, cold_open);
criterion_main!(benches);
