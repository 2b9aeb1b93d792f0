//! Rule O1: content-derived op ids, hash chains and `verify_log`; the wire form; `DeviceLog`.

use std::sync::Arc;

use fencepost::clock::{HlcConfig, ManualClock};
use fencepost::id::IdError;
use fencepost::oplog::{verify_log, DeviceLog, FoldTier, LogError, OpId, OpRecord, Surface};
use proptest::prelude::*;
use serde_json::{json, Value};

fn log_of(device: &str, count: usize) -> (ManualClock, DeviceLog, Vec<OpRecord>) {
    let clock = ManualClock::new(1_000);
    let mut log = DeviceLog::new(device, clock.wall_clock()).unwrap();
    let ops = (0..count)
        .map(|index| {
            clock.advance(1);
            log.append(Surface::log("note"), json!({"n": index, "text": "hello"}))
        })
        .collect();
    (clock, log, ops)
}

/// A change to one field of a record.
type RecordChange = fn(&mut OpRecord);
/// A change to a record's JSON form.
type JsonChange = fn(&mut Value);

/// Changes `op` with `change` and gives it the id of its new content.
fn rehashed(op: &OpRecord, change: impl FnOnce(&mut OpRecord)) -> OpRecord {
    let mut changed = op.clone();
    change(&mut changed);
    changed.op_id = changed.content_id();
    changed
}

#[test]
fn o1_changing_any_single_field_changes_the_op_id() {
    let (_, _, ops) = log_of("laptop", 2);
    let op = &ops[1];
    assert!(op.has_valid_id());
    let changes: Vec<(&str, RecordChange)> = vec![
        ("hlc.wall_ms", |op| op.hlc.wall_ms += 1),
        ("hlc.counter", |op| op.hlc.counter += 1),
        ("hlc.device_id", |op| op.hlc.device_id = Arc::from("laptop2")),
        ("device_id", |op| op.device_id = Arc::from("laptop2")),
        ("seq", |op| op.seq += 1),
        ("prev (cleared)", |op| op.prev = None),
        ("prev (other)", |op| op.prev = Some(OpId([7; 32]))),
        ("surface (tier)", |op| op.surface = Surface::registry("note")),
        ("surface (kind)", |op| op.surface = Surface::log("notes")),
        ("surface (intent)", |op| op.surface = Surface::Intent),
        ("payload (value)", |op| {
            op.payload = json!({"n": 1, "text": "hellO"}).into()
        }),
        ("payload (key)", |op| {
            op.payload = json!({"n": 1, "txet": "hello"}).into()
        }),
        ("payload (type)", |op| {
            op.payload = json!({"n": "1", "text": "hello"}).into()
        }),
        ("payload (float)", |op| {
            op.payload = json!({"n": 1.0, "text": "hello"}).into()
        }),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (field, change) in changes {
        let mut changed = op.clone();
        change(&mut changed);
        assert_ne!(changed.content_id(), op.op_id, "changing {field} kept the op_id");
        assert!(!changed.has_valid_id(), "{field}");
        assert!(
            seen.insert(changed.content_id()),
            "{field} collided with another change"
        );
    }
}

#[test]
fn o1_device_id_fields_are_length_prefixed_so_moving_bytes_between_them_changes_the_id() {
    let (_, _, ops) = log_of("ab", 1);
    let moved = rehashed(&ops[0], |op| {
        op.hlc.device_id = Arc::from("a");
        op.device_id = Arc::from("bab");
    });
    assert_ne!(moved.op_id, ops[0].op_id);
}

#[test]
fn o1_wire_form_round_trips_and_matches_the_documented_shape() {
    let clock = ManualClock::new(1_764_400_000_000);
    let mut log = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
    let first = log.append(
        Surface::Intent,
        json!({"id": "run-1", "agent_id": "milo", "epoch": 1, "status": "pending"}),
    );
    let second = log.append(Surface::registry("setting"), json!({"key": "tz", "value": "UTC"}));
    for op in [&first, &second] {
        let mut line = Vec::new();
        op.write_json_line(&mut line);
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(
            line.iter().filter(|b| **b == b'\n').count(),
            1,
            "one record, one line"
        );
        let decoded = OpRecord::from_json(&line[..line.len() - 1]).unwrap();
        assert_eq!(&decoded, op);
        assert!(decoded.has_valid_id());
    }
    let value: Value = serde_json::to_value(&first).unwrap();
    assert_eq!(value["surface"], json!("intent"));
    assert_eq!(value["prev"], Value::Null);
    assert_eq!(
        value["hlc"],
        json!({"wall_ms": 1_764_400_000_000u64, "counter": 0, "device_id": "laptop"})
    );
    assert_eq!(value["op_id"].as_str().map(str::len), Some(64));
    let value: Value = serde_json::to_value(&second).unwrap();
    assert_eq!(value["surface"], json!({"registry": {"kind": "setting"}}));
    assert_eq!(value["prev"], json!(first.op_id.to_string()));
}

#[test]
fn o1_decoding_refuses_malformed_records_without_panicking() {
    let (_, _, ops) = log_of("laptop", 1);
    let good: Value = serde_json::to_value(&ops[0]).unwrap();
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), b"".to_vec()),
        ("garbage".into(), b"\xff\xfe not json".to_vec()),
        ("array".into(), b"[1,2,3]".to_vec()),
        (
            "truncated".into(),
            serde_json::to_vec(&good).unwrap()[..40].to_vec(),
        ),
    ];
    let mutations: Vec<(&str, JsonChange)> = vec![
        ("missing op_id", |v| {
            drop(v.as_object_mut().unwrap().remove("op_id"))
        }),
        ("missing payload", |v| {
            drop(v.as_object_mut().unwrap().remove("payload"))
        }),
        ("unknown field", |v| v["extra"] = json!(1)),
        ("short op_id", |v| v["op_id"] = json!("abcd")),
        ("uppercase op_id", |v| v["op_id"] = json!("A".repeat(64))),
        ("negative seq", |v| v["seq"] = json!(-1)),
        ("huge counter", |v| v["hlc"]["counter"] = json!(u64::MAX)),
        ("unknown surface", |v| v["surface"] = json!("lease")),
        ("empty device", |v| v["device_id"] = json!("")),
        ("control char device", |v| {
            v["hlc"]["device_id"] = json!("lap\ntop")
        }),
        ("long device", |v| v["device_id"] = json!("x".repeat(300))),
    ];
    for (name, mutate) in mutations {
        let mut value = good.clone();
        mutate(&mut value);
        cases.push((name.to_owned(), serde_json::to_vec(&value).unwrap()));
    }
    for (name, bytes) in cases {
        let error = OpRecord::from_json(&bytes).expect_err(&name);
        assert!(!error.to_string().is_empty(), "{name}");
    }
}

#[test]
fn o1_verify_log_accepts_a_valid_log_and_the_empty_log() {
    let (_, _, ops) = log_of("laptop", 50);
    assert_eq!(verify_log(&ops), Ok(()));
    assert_eq!(verify_log(&[]), Ok(()));
}

#[test]
fn o1_verify_log_detects_each_defect_kind() {
    let (clock, _, ops) = log_of("laptop", 4);
    let device = "laptop";

    // A seq gap.
    let gap = vec![ops[0].clone(), ops[2].clone()];
    assert!(matches!(
        verify_log(&gap),
        Err(LogError::SeqGap {
            expected: 1,
            found: 2,
            ..
        })
    ));
    // A log that does not start at 0.
    assert!(matches!(
        verify_log(&ops[1..]),
        Err(LogError::SeqGap {
            expected: 0,
            found: 1,
            ..
        })
    ));

    // A fork: a second, validly chained record at seq 1.
    let mut other = DeviceLog::resume(device, clock.wall_clock(), HlcConfig::default(), &ops[..1]).unwrap();
    let fork = other.append(Surface::log("note"), json!({"n": "fork"}));
    assert_eq!(fork.seq, 1);
    let forked = vec![ops[0].clone(), ops[1].clone(), fork.clone()];
    assert!(matches!(
        verify_log(&forked),
        Err(LogError::Fork { seq: 1, existing, conflicting, .. }) if existing == ops[1].op_id && conflicting == fork.op_id
    ));

    // The same record twice.
    let duplicated = vec![ops[0].clone(), ops[1].clone(), ops[1].clone()];
    assert!(matches!(
        verify_log(&duplicated),
        Err(LogError::Duplicate { seq: 1, .. })
    ));

    // A record altered without fixing its id.
    let mut tampered = ops.clone();
    tampered[2].payload = json!({"n": 99}).into();
    assert!(matches!(
        verify_log(&tampered),
        Err(LogError::BadId { seq: 2, .. })
    ));

    // A record whose prev points elsewhere (with a consistent id).
    let mut rechained = ops.clone();
    rechained[2] = rehashed(&ops[2], |op| op.prev = Some(ops[0].op_id));
    assert!(matches!(
        verify_log(&rechained),
        Err(LogError::PrevMismatch { seq: 2, expected: Some(e), found: Some(f), .. }) if e == ops[1].op_id && f == ops[0].op_id
    ));
    let mut first_with_prev = ops.clone();
    first_with_prev[0] = rehashed(&ops[0], |op| op.prev = Some(OpId([1; 32])));
    assert!(matches!(
        verify_log(&first_with_prev),
        Err(LogError::PrevMismatch {
            seq: 0,
            expected: None,
            ..
        })
    ));

    // A record of another device, and a stamp naming another device.
    let (_, _, foreign) = log_of("phone", 2);
    let mixed = vec![ops[0].clone(), foreign[1].clone()];
    assert!(matches!(verify_log(&mixed), Err(LogError::DeviceMismatch { found, .. }) if found == "phone"));
    let mut stamped = ops.clone();
    stamped[1] = rehashed(&ops[1], |op| op.hlc.device_id = Arc::from("phone"));
    assert!(matches!(
        verify_log(&stamped),
        Err(LogError::DeviceMismatch { seq: 1, .. })
    ));

    // A stamp that does not increase.
    let mut unordered = ops.clone();
    unordered[1] = rehashed(&ops[1], |op| op.hlc = ops[0].hlc.clone());
    unordered[2] = rehashed(&ops[2], |op| op.prev = Some(unordered[1].op_id));
    assert!(matches!(
        verify_log(&unordered),
        Err(LogError::NonIncreasingHlc { seq: 1, .. })
    ));

    // Every defect explains itself.
    for bad in [gap, forked, duplicated, tampered, rechained, mixed, unordered] {
        let message = verify_log(&bad).unwrap_err().to_string();
        assert!(message.contains("seq"), "{message}");
    }
}

#[test]
fn o1_device_log_chains_and_resumes_after_a_restart() {
    let (clock, log, ops) = log_of("laptop", 10);
    assert_eq!(log.head().next_seq(), 10);
    assert_eq!(log.head().last_op_id(), Some(ops[9].op_id));
    // The wall clock went backwards across the restart: the resumed log still stamps after.
    clock.set(0);
    let mut resumed = DeviceLog::resume("laptop", clock.wall_clock(), HlcConfig::default(), &ops).unwrap();
    let next = resumed.append(Surface::log("note"), json!({}));
    assert_eq!(next.seq, 10);
    assert_eq!(next.prev, Some(ops[9].op_id));
    assert!(next.hlc > ops[9].hlc);
    let mut all = ops.clone();
    all.push(next);
    assert_eq!(verify_log(&all), Ok(()));

    let empty = DeviceLog::resume("laptop", clock.wall_clock(), HlcConfig::default(), &[]).unwrap();
    assert_eq!(empty.head().next_seq(), 0);
}

#[test]
fn o1_resume_refuses_a_damaged_log_or_another_devices_log() {
    let (clock, _, mut ops) = log_of("laptop", 3);
    assert!(matches!(
        DeviceLog::resume("phone", clock.wall_clock(), HlcConfig::default(), &ops),
        Err(LogError::DeviceMismatch { .. })
    ));
    ops[1].seq = 5;
    assert!(matches!(
        DeviceLog::resume("laptop", clock.wall_clock(), HlcConfig::default(), &ops),
        Err(LogError::BadId { .. })
    ));
    assert!(matches!(
        DeviceLog::resume("", clock.wall_clock(), HlcConfig::default(), &[]),
        Err(LogError::InvalidDeviceId(IdError::Empty { .. }))
    ));
}

#[test]
fn l8_device_log_refuses_invalid_device_ids() {
    let clock = ManualClock::new(0).wall_clock();
    for bad in ["", "line\nbreak", &"x".repeat(257)] {
        assert!(DeviceLog::new(bad, clock.clone()).is_err(), "{bad:?}");
    }
}

#[test]
fn o1_device_log_observes_peer_stamps() {
    let clock = ManualClock::new(1_000);
    let mut log = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
    let (_, _, peer_ops) = log_of("phone", 1);
    let mut peer = peer_ops[0].hlc.clone();
    peer.wall_ms = 30_000;
    log.observe(&peer).unwrap();
    assert!(log.append(Surface::log("note"), json!({})).hlc > peer);
    peer.wall_ms = u64::MAX;
    assert!(log.observe(&peer).is_err());
}

#[test]
fn surfaces_map_to_their_fold_tiers() {
    assert_eq!(Surface::Intent.fold_tier(), FoldTier::Leased);
    assert_eq!(Surface::log("x").fold_tier(), FoldTier::GrowOnly);
    assert_eq!(Surface::registry("x").fold_tier(), FoldTier::Registry);
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// O1: whatever the payload, the wire form decodes to the same record with the same id.
    #[test]
    fn o1_any_payload_survives_the_wire_with_its_id(payload in arbitrary_json(), kind in "[a-z]{1,8}") {
        let mut log = DeviceLog::new("laptop", ManualClock::new(5).wall_clock()).unwrap();
        let op = log.append(Surface::log(kind), payload);
        let mut line = Vec::new();
        op.write_json_line(&mut line);
        let decoded = OpRecord::from_json(&line[..line.len() - 1]).unwrap();
        prop_assert!(decoded.has_valid_id());
        prop_assert_eq!(decoded.op_id, op.op_id);
        prop_assert_eq!(decoded, op);
    }
}

/// Found by the property test above: serde_json's default float parser is not exact, so a float
/// payload could change on the wire and its record would fail verification (`float_roundtrip`).
#[test]
fn o1_floats_in_payloads_round_trip_exactly() {
    let mut log = DeviceLog::new("laptop", ManualClock::new(5).wall_clock()).unwrap();
    for float in [
        940_291_478_256.811_5,
        0.1,
        -0.0,
        1e-300,
        f64::MAX,
        f64::MIN_POSITIVE,
    ] {
        let op = log.append(Surface::log("x"), json!([{"": float}]));
        let mut line = Vec::new();
        op.write_json_line(&mut line);
        let decoded = OpRecord::from_json(&line[..line.len() - 1]).unwrap();
        assert!(decoded.has_valid_id(), "{float}");
    }
}

/// Two records as an earlier version of `fencepost run` wrote them (the JSON object form), copied
/// from a ledger folder: readers still accept that form.
const OBJECT_FORM_RECORDS: [&str; 2] = [
    r#"{"op_id":"548f5d43754b96347f26434374382b90217a5eff285366a79ad4ddf22fccf76f","hlc":{"wall_ms":1796085755970,"counter":0,"device_id":"vm-0035969e"},"device_id":"vm-0035969e","seq":0,"prev":null,"surface":"intent","payload":{"agent_id":"demo","epoch":1,"id":"run-710757806a991ed791b5178e9a5ffac0","status":"pending"}}"#,
    r#"{"op_id":"d4954202ad1477682313e76d0f0447bca51d817a73ab6d517ce39330a1c2e31a","hlc":{"wall_ms":1796085755974,"counter":0,"device_id":"vm-0035969e"},"device_id":"vm-0035969e","seq":1,"prev":"548f5d43754b96347f26434374382b90217a5eff285366a79ad4ddf22fccf76f","surface":"intent","payload":{"agent_id":"demo","epoch":1,"id":"run-710757806a991ed791b5178e9a5ffac0","status":"committed"}}"#,
];

/// O1: records written in the object form by earlier versions still decode and verify, chained,
/// and are written back in the compact form with the same ids, less than half as long.
#[test]
fn o1_the_object_form_of_earlier_versions_is_read_and_rewritten_compact() {
    let ops: Vec<OpRecord> = OBJECT_FORM_RECORDS
        .iter()
        .map(|line| OpRecord::from_json(line.as_bytes()).unwrap())
        .collect();
    assert_eq!(verify_log(&ops), Ok(()));
    for (op, object_line) in ops.iter().zip(OBJECT_FORM_RECORDS) {
        let mut line = Vec::new();
        op.write_json_line(&mut line);
        assert!(line.starts_with(b"[2,\""), "{}", String::from_utf8_lossy(&line));
        assert!(
            line.len() * 2 < object_line.len(),
            "{} vs {}",
            line.len(),
            object_line.len()
        );
        assert_eq!(&OpRecord::from_json(&line).unwrap(), op);
        assert_eq!(
            serde_json::to_string(op).unwrap(),
            object_line,
            "serde keeps the object form"
        );
    }
}

/// O1 (issue 17, a smaller record): an intent record of a typical job, with a `prev`, takes at
/// most 200 bytes on disk, newline included (the object form took 379).
#[test]
fn o1_an_intent_record_takes_at_most_200_bytes() {
    let clock = ManualClock::new(1_796_085_755_970);
    let mut log = DeviceLog::new("vm-0035969e", clock.wall_clock()).unwrap();
    let intent = |status: &str| json!({"id": "run-710757806a991ed791b5178e9a5ffac0", "agent_id": "demo", "epoch": 1, "status": status});
    log.append(Surface::Intent, intent("pending"));
    clock.advance(4);
    let committed = log.append(Surface::Intent, intent("committed"));
    let mut line = Vec::new();
    committed.write_json_line(&mut line);
    assert!(
        line.len() <= 200,
        "{} bytes: {}",
        line.len(),
        String::from_utf8_lossy(&line)
    );
    assert_eq!(
        line.len(),
        180,
        "the documented size: {}",
        String::from_utf8_lossy(&line)
    );
}

/// O1: a compact line that is not exactly what the writer makes is refused with a message that
/// says what is wrong, and never panics.
#[test]
fn o1_decoding_refuses_malformed_compact_lines() {
    let (_, _, notes) = log_of("laptop", 2);
    let clock = ManualClock::new(1_000);
    let mut log = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
    let intent = log.append(
        Surface::Intent,
        json!({"id": "run-1", "agent_id": "milo", "epoch": 3, "status": "committed"}),
    );
    let line_of = |op: &OpRecord| {
        let mut line = Vec::new();
        op.write_json_line(&mut line);
        line.pop();
        serde_json::from_slice::<Value>(&line).unwrap()
    };
    let (intent_line, note_line) = (line_of(&intent), line_of(&notes[1]));
    assert_eq!(intent_line[7], json!(0));
    assert_eq!(note_line[7], json!(1));
    // `base` with element `index` set to `value` (pushed when `index` is its length), or popped.
    let with = |base: &Value, index: usize, value: Option<Value>| {
        let mut items = base.as_array().unwrap().clone();
        match value {
            Some(value) if index == items.len() => items.push(value),
            Some(value) => items[index] = value,
            None => drop(items.pop()),
        }
        Value::Array(items)
    };
    let op_id_text = intent_line[1].as_str().unwrap();
    let non_canonical = format!("{}B", &op_id_text[..op_id_text.len() - 1]);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("a newer format", json!([4, "x"]), "format 4"),
        ("a cut format-3 line", json!([3, "x"]), "before the seq"),
        ("format 1", json!([1]), "format 1"),
        ("empty", json!([]), "before the format"),
        (
            "hex op_id",
            with(&intent_line, 1, Some(json!(intent.op_id.to_string()))),
            "base64url",
        ),
        (
            "padded op_id",
            with(&intent_line, 1, Some(json!(format!("{op_id_text}=")))),
            "base64url",
        ),
        (
            "non-canonical op_id",
            with(&intent_line, 1, Some(json!(non_canonical))),
            "base64url",
        ),
        ("bad prev", with(&note_line, 6, Some(json!("nope"))), "prev"),
        ("status 3", with(&intent_line, 11, Some(json!(3))), "status 3"),
        (
            "empty agent",
            with(&intent_line, 8, Some(json!(""))),
            "well-formed intent",
        ),
        (
            "epoch over the limit",
            with(&intent_line, 9, Some(json!(u64::MAX))),
            "well-formed intent",
        ),
        ("tag 4", with(&intent_line, 7, Some(json!(4))), "surface tag 4"),
        (
            "an extra element",
            with(&intent_line, 12, Some(json!(1))),
            "more elements",
        ),
        (
            "a missing element",
            with(&note_line, 0, None),
            "before the payload",
        ),
        (
            "a string seq",
            with(&intent_line, 5, Some(json!("0"))),
            "invalid type",
        ),
        (
            "a negative counter",
            with(&intent_line, 3, Some(json!(-1))),
            "invalid value",
        ),
        ("an empty device", with(&intent_line, 4, Some(json!(""))), "empty"),
    ];
    for (name, value, expected) in cases {
        let error = OpRecord::from_json(&serde_json::to_vec(&value).unwrap()).expect_err(name);
        assert!(error.to_string().contains(expected), "{name}: {error}");
    }
    // The tag and the status are numbers: a changed one is a changed record, caught by its id.
    let mut committed_as_pending = intent_line.clone();
    committed_as_pending[11] = json!(0);
    let forged = OpRecord::from_json(&serde_json::to_vec(&committed_as_pending).unwrap()).unwrap();
    assert!(!forged.has_valid_id());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// O1: any intent, well-formed or not, under any device id, survives both wire forms with its
    /// id, and the compact form is never the longer.
    #[test]
    fn o1_intents_survive_both_wire_forms(
        device in "[a-z\"\\\\é]{1,12}",
        agent in "\\PC{0,12}",
        run in prop_oneof!["run-[0-9a-f]{32}", "\\PC{0,20}"],
        epoch in prop_oneof![0..10u64, Just(i64::MAX as u64), Just(u64::MAX)],
        status in prop_oneof![Just("pending"), Just("committed"), Just("failed"), Just("other")],
        extra in proptest::option::of(arbitrary_json()),
    ) {
        let mut log = DeviceLog::new(&device, ManualClock::new(5).wall_clock()).unwrap();
        let mut payload = json!({"id": run, "agent_id": agent, "epoch": epoch, "status": status});
        if let Some(extra) = extra {
            payload["extra"] = extra;
        }
        log.append(Surface::log("x"), json!(1));
        let op = log.append(Surface::Intent, payload);
        let mut line = Vec::new();
        op.write_json_line(&mut line);
        let object = serde_json::to_vec(&op).unwrap();
        prop_assert!(line.len() <= object.len() + 1);
        for form in [&line[..line.len() - 1], &object[..]] {
            let decoded = OpRecord::from_json(form).unwrap();
            prop_assert!(decoded.has_valid_id());
            prop_assert_eq!(&decoded, &op);
        }
    }
}
