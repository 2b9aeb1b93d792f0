//! What the fuzz targets check (`fuzz/`, `scripts/fuzz`) and the regression test replays
//! (`tests/fuzz_regressions.rs`): each decoder of bytes that another site wrote takes any input
//! without panicking, and what it accepts survives a round trip.
#![allow(dead_code)]

use fencepost::lease::{Intent, IntentStatus};
use fencepost::oplog::{LogHead, OpRecord};
use fencepost::relay::{device_file_name, Frontier, FsRelay, Relay};

/// A record line in any form (`OpRecord::from_json`: the compact form, a sealed record's format
/// 3, the JSON object form): an accepted record encodes back to a line (the compact form, format
/// 3, or the object form for a record whose stamp names another device) and to the object form,
/// each of which decodes to the same record with the same content id (a sealed record's object
/// form is shown, never read); its identity check answers (it may refuse) without panicking.
pub fn record_line(bytes: &[u8]) {
    let Ok(op) = OpRecord::from_json(bytes) else {
        return;
    };
    let mut line = Vec::new();
    op.write_json_line(&mut line);
    let again = OpRecord::from_json(&line).expect("an accepted record encodes to a valid line");
    assert_eq!(again, op, "a record survives a round trip");
    let object = serde_json::to_vec(&op).expect("a record has an object form");
    if op.sealed_record().is_some() {
        assert!(
            OpRecord::from_json(&object).is_err(),
            "a sealed record is read from its line of format 4 or 3 only"
        );
    } else {
        let from_object =
            OpRecord::from_json(&object).expect("the object form of an accepted record decodes");
        assert_eq!(from_object, op, "a record survives the object form");
    }
    assert_eq!(again.content_id(), op.content_id(), "both forms hash alike");
    let _ = LogHead::new(op.device_id.clone()).check_identity(&op);
}

/// A device file of a ledger folder, as a synced folder may deliver it (any bytes): a pull reports
/// problems and returns verified records, without panicking.
pub fn device_file(folder: &std::path::Path, bytes: &[u8]) {
    let devices = folder.join("devices");
    std::fs::create_dir_all(&devices).expect("a scratch folder");
    std::fs::write(devices.join(device_file_name("fuzzed")), bytes).expect("a scratch file");
    let relay = FsRelay::open(folder).expect("the folder opens");
    if let Ok(batch) = relay.pull(&Frontier::new()) {
        for op in &batch.ops {
            assert_eq!(
                &*op.device_id, "fuzzed",
                "a device file holds its own device's records"
            );
        }
    }
}

/// An intent payload (any JSON) and a status word: read or refused, never a panic; what is read
/// encodes back to the same intent.
pub fn intent_payload(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = IntentStatus::parse(text);
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return;
    };
    if let Some(intent) = Intent::from_payload(&value) {
        assert_eq!(
            Intent::from_payload(&intent.payload()),
            Some(intent),
            "an intent survives a round trip"
        );
    }
}

/// A ledger folder with a checkpoint, for [`checkpoint`]: the folder, the checkpoint's path and
/// bytes, and the runs of agent `milo` with whether each committed.
#[cfg(feature = "sqlite")]
pub struct CheckpointFixture {
    pub folder: std::path::PathBuf,
    pub checkpoint: std::path::PathBuf,
    pub pristine: Vec<u8>,
    pub runs: Vec<(String, bool)>,
}

/// Writes a ledger of two devices (committed, failed and in-doubt runs) and its checkpoint
/// under `scratch`.
#[cfg(feature = "sqlite")]
pub fn checkpoint_fixture(scratch: &std::path::Path) -> CheckpointFixture {
    use fencepost::clock::ManualClock;
    use fencepost::ledger::Ledger;
    use std::sync::Arc;

    let folder = scratch.join("ledger");
    let clock = ManualClock::new(1_000);
    let mut runs = Vec::new();
    for (index, device) in ["laptop", "phone"].iter().enumerate() {
        let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(&folder).expect("a scratch ledger"));
        let mut ledger = Ledger::open(device, clock.wall_clock(), relay).expect("a scratch ledger");
        for run in 0..6 {
            let run_id = format!("run-{index}-{run}");
            let epoch = 1 + index as u64;
            ledger
                .record(&Intent::new("milo", run_id.clone(), epoch, IntentStatus::Pending))
                .expect("a record");
            let outcome = [
                IntentStatus::Committed,
                IntentStatus::Failed,
                IntentStatus::Pending,
            ][run % 3];
            if outcome != IntentStatus::Pending {
                ledger
                    .record(&Intent::new("milo", run_id.clone(), epoch, outcome))
                    .expect("a record");
            }
            runs.push((run_id, outcome == IntentStatus::Committed));
        }
    }
    let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(&folder).expect("a scratch ledger"));
    let mut ledger = Ledger::open("laptop", clock.wall_clock(), relay).expect("a scratch ledger");
    let written = ledger.compact().expect("a checkpoint");
    CheckpointFixture {
        folder,
        pristine: std::fs::read(&written.path).expect("the checkpoint"),
        checkpoint: written.path,
        runs,
    }
}

/// A checkpoint as a synced folder may deliver it: damaged anywhere (`bytes`: the first byte
/// says how, the rest where: byte patches of five bytes each, a 32-bit offset and a value, or a
/// cut at an offset). A new site that starts from it reports damage or answers as the records
/// say (rule K3): never "not committed" for a committed run, never a commit that is not there,
/// never a panic.
#[cfg(feature = "sqlite")]
pub fn checkpoint(fixture: &CheckpointFixture, scratch: &std::path::Path, bytes: &[u8]) {
    use fencepost::clock::ManualClock;
    use fencepost::ledger::Ledger;
    use fencepost::ledger::LedgerOptions;
    use std::sync::Arc;

    let Some((mode, rest)) = bytes.split_first() else {
        return;
    };
    let mut content = fixture.pristine.clone();
    let offset = |chunk: &[u8], length: usize| {
        let mut word = [0u8; 4];
        word.copy_from_slice(&chunk[..4]);
        u32::from_le_bytes(word) as usize % length.max(1)
    };
    if mode % 2 == 0 {
        for patch in rest.chunks_exact(5) {
            let at = offset(patch, content.len());
            content[at] = patch[4];
        }
    } else if rest.len() >= 4 {
        let at = offset(rest, content.len());
        content.truncate(at);
        content.extend_from_slice(&rest[4..]);
    }
    // The checkpoint as written needs starting from once per run of the fuzzer.
    static PRISTINE_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if content == fixture.pristine && PRISTINE_STARTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    std::fs::write(&fixture.checkpoint, &content).expect("a scratch checkpoint");
    // Read whole and checked as a new site does; only a checkpoint that passes (bytes that
    // meant nothing were changed) is started from, the slower path.
    if fencepost::checkpoint::inspect(&fixture.checkpoint).is_err() {
        std::fs::write(&fixture.checkpoint, &fixture.pristine).expect("a scratch checkpoint");
        return;
    }
    let snapshot = scratch.join("snapshot.sqlite");
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", snapshot.display()));
    }
    let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(&fixture.folder).expect("the scratch ledger"));
    let options = LedgerOptions::default().snapshot(&snapshot);
    let clock = ManualClock::new(1_000_000);
    let mut ledger =
        Ledger::open_with("newcomer", clock.wall_clock(), relay, options).expect("the ledger opens");
    for (run, committed) in &fixture.runs {
        let found = ledger.committed_run("milo", run).is_some();
        if ledger.damage().is_empty() {
            assert_eq!(found, *committed, "{run}: the oracle answers as the records say");
        }
    }
    std::fs::write(&fixture.checkpoint, &fixture.pristine).expect("a scratch checkpoint");
}

/// A device's public key line (which an operator pastes into `device admit`) and a key file's
/// text: either decoder refuses what it cannot read, never panics, and what it reads writes
/// back as the same keys (rule I1).
pub fn device_key(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Ok(public) = text.parse::<fencepost::identity::PublicIdentity>() {
        assert_eq!(
            public.to_string().parse(),
            Ok(public),
            "a public key line survives a round trip"
        );
    }
    if let Ok(key) = fencepost::identity::DeviceKey::from_file_text(text) {
        let again =
            fencepost::identity::DeviceKey::from_file_text(&key.to_file_text()).expect("its own text reads");
        assert_eq!(again.public(), key.public(), "a key file survives a round trip");
        assert_eq!(again.device(), key.device());
    }
}

/// A protected ledger's genesis as a relay hands it over: refused or read, never a panic, and
/// what is read is its canonical form (one genesis, one ledger id).
pub fn genesis(bytes: &[u8]) {
    if let Ok(genesis) = fencepost::genesis::Genesis::from_bytes(bytes) {
        assert_eq!(genesis.to_bytes(), bytes, "a genesis has one form");
    }
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(fingerprint) = text.parse::<fencepost::genesis::Fingerprint>() {
            assert_eq!(fingerprint.to_string().parse(), Ok(fingerprint));
        }
    }
}

/// A sealed checkpoint as the shared place hands it over (rule S6): its header refused or
/// read, its body opened with a key or refused, never a panic, never more written than its
/// header says.
pub fn sealed_checkpoint(bytes: &[u8]) {
    use fencepost::protected::checkpoint::{open_checkpoint, read_any_header, read_header};
    let mut input = bytes;
    let Ok(header) = read_any_header(&mut input) else {
        return;
    };
    let ledger = fencepost::identity::LedgerId([1; 32]);
    let mut input = bytes;
    let Ok((header_again, line)) = read_header(&mut input, &ledger) else {
        return;
    };
    assert_eq!(header, header_again);
    let key = fencepost::seal::LedgerKey::new(std::num::NonZeroU32::MIN, [7; 32]);
    let writer = fencepost::identity::DeviceKey::from_secrets(
        fencepost::id::DeviceId::new("laptop").unwrap(),
        [8; 32],
        [9; 32],
    );
    let mut out = Vec::new();
    if open_checkpoint(
        &header,
        &line,
        &key,
        &writer.public(),
        &ledger,
        &mut input,
        &mut out,
    )
    .is_ok()
    {
        assert_eq!(out.len() as u64, header.plain_bytes);
    }
}
