//! What the fuzz targets check (`fuzz/`, `scripts/fuzz`) and the regression test replays
//! (`tests/fuzz_regressions.rs`): each decoder of bytes that another site wrote takes any input
//! without panicking, and what it accepts survives a round trip.
#![allow(dead_code)]

use fencepost::intent::{Intent, IntentStatus};
use fencepost::oplog::{LogHead, OpRecord};
use fencepost::relay::{device_file_name, Frontier, FsRelay, Relay};

/// A record line in either form (`OpRecord::from_json`: the compact form, the JSON object form):
/// an accepted record encodes back to a line (the compact form, or the object form for a record
/// whose stamp names another device) and to the object form, each of which decodes to the same
/// record with the same content id; its identity check answers (it may refuse) without panicking.
pub fn record_line(bytes: &[u8]) {
    let Ok(op) = OpRecord::from_json(bytes) else {
        return;
    };
    let mut line = Vec::new();
    op.write_json_line(&mut line);
    let again = OpRecord::from_json(&line).expect("an accepted record encodes to a valid line");
    assert_eq!(again, op, "a record survives a round trip");
    let object = serde_json::to_vec(&op).expect("a record has an object form");
    let from_object = OpRecord::from_json(&object).expect("the object form of an accepted record decodes");
    assert_eq!(from_object, op, "a record survives the object form");
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
