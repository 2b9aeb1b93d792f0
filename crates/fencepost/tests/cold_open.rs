//! Rule S2 for a cold open: a protected ledger read from its start by a host with no snapshot,
//! in batches long enough that the records are opened on one thread and folded on another
//! (`edge/ledger/open_ahead.rs`), folds what the writer folded.

mod members;

use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::genesis::Genesis;
use fencepost::id::DeviceId;
use fencepost::identity::DeviceKey;
use fencepost::ledger::{Ledger, LedgerOptions, Protected};
use fencepost::oplog::{agent_digest, DeviceLog, OpRecord, SealedContent, Surface, AGENT_NAMES};
use fencepost::protected::Origin;
use fencepost::relay::{FsRelay, Relay};
use fencepost::seal::LedgerKey;
use members::{device_key, run, Members};

const DEVICE: &str = "laptop";

/// S2, M2: a member that holds no key yet reads a long protected log cold, as a cold open
/// reads it (opened on the thread the relay hands records over on, folded on another): the
/// keys come from the log as it is read, and a revocation midway makes a generation the
/// opening thread does not hold yet. Every commit counts, at its own epoch, as the writer
/// folded it.
#[test]
fn s2_m2_a_long_log_read_cold_by_a_member_folds_every_record_across_a_rotation() {
    let (phone, tablet) = (device_key("phone", 11), device_key("tablet", 21));
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let (before, after) = (1_500u64, 500u64);
    for n in 0..before {
        run(&mut founder, &format!("before-{n}"), n + 1);
    }
    founder.revoke(tablet.device(), None).unwrap();
    for n in 0..after {
        run(&mut founder, &format!("after-{n}"), before + n + 1);
    }
    assert!(
        members.file("laptop").len() > 1 << 20,
        "long enough to be read in several batches"
    );
    let reading = members.open(&phone);
    assert!(reading.damage().is_empty(), "{:?}", reading.damage());
    assert_eq!(reading.not_counted(), vec![]);
    let agent = reading.state().agent("milo").unwrap();
    assert_eq!(
        agent.committed_runs().len() as u64,
        before + after,
        "S2: every commit counts"
    );
    for (name, epoch) in (0..before)
        .map(|n| (format!("before-{n}"), n + 1))
        .chain((0..after).map(|n| (format!("after-{n}"), before + n + 1)))
    {
        assert_eq!(
            agent.committed_run(&name).map(|run| run.epoch),
            Some(epoch),
            "S2: {name} at its own epoch"
        );
    }
    assert_eq!(
        reading.view().frontier().next_seq("laptop"),
        founder.view().frontier().next_seq("laptop"),
        "S2: every record settled"
    );
}

/// A founder's protected log in a ledger folder: record 0, the naming of agent "milo", then
/// `runs` runs (a `pending` and a `committed` at its own epoch, run ids `run-<epoch in hex>`),
/// a head on every `every`-th record and on the last. Returns the folder, how the founder
/// opens it and how many records it holds.
fn founder_log_with_heads_every(every: usize, runs: u64) -> (tempfile::TempDir, Protected, u64) {
    let key = Arc::new(DeviceKey::from_secrets(
        DeviceId::new(DEVICE).unwrap(),
        [1; 32],
        [2; 32],
    ));
    let recovery = DeviceKey::from_secrets(DeviceId::new("recovery").unwrap(), [4; 32], [5; 32]);
    let genesis = Genesis {
        nonce: [3; 16],
        founder: key.device().clone(),
        founder_key: key.public(),
        recovery_key: recovery.public(),
    };
    let ledger = genesis.ledger_id();
    let ledger_key = LedgerKey::new(std::num::NonZeroU32::MIN, [6; 32]);
    let clock = ManualClock::new(1_796_085_755_970);
    let first = OpRecord::sealed(
        Arc::from(DEVICE),
        0,
        None,
        SealedContent::Clear(Origin::Genesis(genesis.clone()).to_bytes().into()),
    );
    let origin = first.op_id;
    let mut log = DeviceLog::new(DEVICE, clock.wall_clock()).unwrap();
    log.append_made(&first).unwrap();
    let mut records = vec![first];
    let digest: String = agent_digest("milo")
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let naming = serde_json::json!({"key": digest, "agent": "milo"});
    let naming = log.draft(Surface::registry(AGENT_NAMES), naming).unwrap();
    records.push(naming.seal(&ledger_key, ledger).unwrap());
    log.append_made(&records[1]).unwrap();
    for epoch in 1..=runs {
        for status in ["pending", "committed"] {
            clock.advance(5);
            let payload = serde_json::json!({
                "id": format!("run-{epoch:032x}"), "agent_id": "milo", "epoch": epoch, "status": status
            });
            let draft = log.draft(Surface::Intent, payload).unwrap();
            let sealed = draft.seal_named(&ledger_key, ledger).unwrap();
            log.append_made(&sealed).unwrap();
            records.push(sealed);
        }
    }
    let last = records.len() - 1;
    for (index, record) in records.iter_mut().enumerate() {
        if index % every == every - 1 || index == last {
            *record = record.clone().signed(&key, &ledger, &origin);
        }
    }
    let folder = tempfile::tempdir().unwrap();
    FsRelay::open(folder.path()).unwrap().push(&records).unwrap();
    let protected = Protected {
        ledger,
        device_key: key,
        origin: Origin::Genesis(genesis),
        keys: vec![ledger_key],
        members: Vec::new(),
    };
    (folder, protected, records.len() as u64)
}

/// S2, found reading the open-ahead stage again: a log whose heads are far apart (here one in
/// every 300 records, as a writer that appends many records at once signs them) is handed over
/// in batches that cut between heads, so the records covered by a head include records handed
/// over in the batch before, which were not opened ahead. Each record folds as itself: every
/// commit at its own epoch, none taken for another.
#[test]
fn s2_a_log_with_heads_far_apart_read_cold_folds_each_record_as_itself() {
    let runs = 1_500u64;
    let (folder, protected, records) = founder_log_with_heads_every(300, runs);
    assert!(
        std::fs::metadata(folder.path().join("devices").join("laptop.jsonl"))
            .unwrap()
            .len()
            > 512 << 10,
        "long enough to be handed over in several batches"
    );
    // Another relay than the one that wrote the file: it reads the file, as another host.
    let relay = Arc::new(FsRelay::open(folder.path()).unwrap());
    let options = LedgerOptions::default().protected(protected);
    let clock = ManualClock::new(1_796_085_755_970);
    let reading = Ledger::open_with(DEVICE, clock.wall_clock(), relay, options).unwrap();
    assert!(reading.damage().is_empty(), "{:?}", reading.damage());
    let agent = reading.state().agent("milo").unwrap();
    assert_eq!(
        agent.committed_runs().len() as u64,
        runs,
        "S2: every commit counts"
    );
    for epoch in 1..=runs {
        assert_eq!(
            agent
                .committed_run(&format!("run-{epoch:032x}"))
                .map(|run| run.epoch),
            Some(epoch),
            "S2: run {epoch} at its own epoch"
        );
    }
    assert_eq!(
        reading.view().frontier().next_seq(DEVICE),
        records,
        "S2: every record settled"
    );
}
