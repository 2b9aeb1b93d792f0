//! Sealing a record for a protected ledger (issue 39): what opening 10 000 sealed intents
//! costs (authenticate and decrypt, and the id over the ciphertext), and reading their lines
//! (`read_line`: format 4, each with a head, as `fencepost run` appends them), against the
//! target of a cold open of ≥ 1 M records/s with the fold (the fold alone is
//! `benches/fold.rs`).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use std::num::NonZeroU32;
use std::sync::Arc;

use fencepost::oplog::{OpRecord, SealedContent};
use fencepost::seal::{LedgerKey, Place, Sealed};

const BATCH: usize = 10_000;

/// An intent's content as a compact record would hold it: stamp, status, epoch, agent, run.
fn content(n: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(80);
    bytes.extend_from_slice(&(1_764_400_000_000u64 + n as u64).to_be_bytes());
    bytes.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 2]);
    bytes.extend_from_slice(b"\x09agent-042");
    bytes.extend_from_slice(format!("run-{n:032x}").as_bytes());
    bytes
}

fn place(seq: u64) -> Place<'static> {
    Place {
        ledger: LedgerId([7; 32]),
        device: "laptop-1",
        seq,
    }
}

fn seal(criterion: &mut Criterion) {
    let key = LedgerKey::new(NonZeroU32::MIN, [3; 32]);
    let sealed: Vec<Sealed> = (0..BATCH)
        .map(|n| key.seal(&place(n as u64), &content(n)).unwrap())
        .collect();
    let device: Arc<str> = Arc::from("laptop-1");
    let mut prev = None;
    let records: Vec<OpRecord> = sealed
        .iter()
        .enumerate()
        .map(|(n, sealed)| {
            let record = OpRecord::sealed(
                Arc::clone(&device),
                n as u64,
                prev,
                SealedContent::Sealed(sealed.clone()),
            );
            prev = Some(record.op_id);
            record
        })
        .collect();
    // Each record's line, with a head as the last record of an append carries.
    let signer = DeviceKey::from_secrets(DeviceId::new("laptop-1").unwrap(), [1; 32], [2; 32]);
    let origin = records[0].op_id;
    let mut lines: Vec<u8> = Vec::new();
    for record in &records {
        record
            .clone()
            .signed(&signer, &LedgerId([7; 32]), &origin)
            .write_json_line(&mut lines);
        lines.push(b'\n');
    }
    let mut group = criterion.benchmark_group("seal");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("seal_intent", |bencher| {
        bencher.iter(|| {
            for n in 0..BATCH {
                std::hint::black_box(key.seal(&place(n as u64), &content(n)).ok());
            }
        })
    });
    group.bench_function("open_and_id_intent", |bencher| {
        bencher.iter(|| {
            for record in &records {
                let at = place(record.seq);
                std::hint::black_box(record.content_id());
                if let Some(SealedContent::Sealed(sealed)) = record.sealed_record().map(|body| &body.content)
                {
                    std::hint::black_box(key.open(sealed, &at).ok());
                }
            }
        })
    });
    group.bench_function("id_only", |bencher| {
        bencher.iter(|| {
            for record in &records {
                std::hint::black_box(record.content_id());
            }
        })
    });
    group.bench_function("open_only", |bencher| {
        bencher.iter(|| {
            for (n, record) in sealed.iter().enumerate() {
                std::hint::black_box(key.open(record, &place(n as u64)).ok());
            }
        })
    });
    group.bench_function("read_line", |bencher| {
        bencher.iter(|| {
            for line in lines.split(|byte| *byte == b'\n').filter(|line| !line.is_empty()) {
                std::hint::black_box(OpRecord::from_json(line).ok());
            }
        })
    });
    group.finish();
}

criterion_group!(benches, seal);
criterion_main!(benches);
