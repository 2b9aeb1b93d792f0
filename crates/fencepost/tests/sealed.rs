//! Rule S1: a protected ledger's record as relays carry it (issue 39): sealed content, an id and
//! links over the ciphertext, a head its device signs, a line of format 4 that an unprotected
//! reading refuses as damage.

use std::num::NonZeroU32;
use std::sync::Arc;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use fencepost::clock::ManualClock;
use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use fencepost::ledger::Ledger;
use fencepost::oplog::{
    verify_log, DeviceLog, OpId, OpRecord, OpenError, SealedContent, Surface, CLEAR_GENERATION,
};
use fencepost::relay::{InMemoryRelay, Relay};
use fencepost::run_id::deterministic_run_id;
use fencepost::seal::LedgerKey;
use proptest::prelude::*;
use serde_json::json;

const LEDGER: LedgerId = LedgerId([7; 32]);

fn key(generation: u32) -> LedgerKey {
    LedgerKey::new(NonZeroU32::new(generation).unwrap(), [3; 32])
}

fn signer(device: &str) -> DeviceKey {
    DeviceKey::from_secrets(DeviceId::new(device).unwrap(), [5; 32], [6; 32])
}

/// `plain` sealed in a chain of its device, every record signed, with nonces drawn.
fn sealed_chain(plain: &[OpRecord], key: &LedgerKey) -> Vec<OpRecord> {
    let signer = signer(&plain[0].device_id);
    let mut sealed: Vec<OpRecord> = Vec::new();
    for op in plain {
        let mut op = op.clone();
        op.prev = sealed.last().map(|last| last.op_id);
        let record = op.seal(key, LEDGER).unwrap();
        let origin = sealed.first().map_or(record.op_id, |first| first.op_id);
        sealed.push(record.signed(&signer, &LEDGER, &origin));
    }
    sealed
}

fn line_of(op: &OpRecord) -> Vec<u8> {
    let mut line = Vec::new();
    op.write_json_line(&mut line);
    line.pop();
    line
}

fn intents(agent: &str, runs: usize) -> Vec<OpRecord> {
    let clock = ManualClock::new(1_764_400_000_000);
    let mut log = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
    (0..runs)
        .map(|n| {
            let run = deterministic_run_id(agent, "send", &format!("2026-12-{n:02}")).unwrap();
            let status = if n % 2 == 0 { "pending" } else { "committed" };
            log.append(
                Surface::Intent,
                json!({"agent_id": agent, "epoch": 1_764_400_123_456u64 + n as u64, "id": run, "status": status}),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// S1: every record, of every surface, opens to the stamp, surface and payload it sealed,
    /// through its line, at its place; its id is over what the relay carries.
    #[test]
    fn s1_a_sealed_record_opens_to_the_record_it_sealed(
        agent in "[a-z0-9-]{1,40}",
        run in prop_oneof!["run-[0-9a-f]{32}", "[a-zA-Z0-9 ]{1,60}"],
        epoch in 0u64..=(1 << 63) - 1,
        status in 0..3usize,
        kind in "[a-z]{1,12}",
        text in "\\PC{0,80}",
        counter in any::<u32>(),
    ) {
        let clock = ManualClock::new(1_764_400_000_000);
        let mut log = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
        let status = ["pending", "committed", "failed"][status];
        let plain = vec![
            log.append(Surface::Intent, json!({"agent_id": agent, "epoch": epoch, "id": run, "status": status})),
            log.append(Surface::Intent, json!({"agent_id": agent, "epoch": epoch, "note": text})),
            log.append(Surface::log(kind.clone()), json!({"text": text, "n": counter})),
            log.append(Surface::registry(kind), json!({"key": text, "value": [1, {"a": null}]})),
        ];
        let key = key(2);
        let sealed = sealed_chain(&plain, &key);
        prop_assert_eq!(verify_log(&sealed), Ok(()));
        for (sealed, plain) in sealed.iter().zip(&plain) {
            let read = OpRecord::from_json(&line_of(sealed)).unwrap();
            prop_assert_eq!(&read, sealed);
            prop_assert_eq!(read.content_id(), sealed.op_id);
            let opened = read.open(&key, LEDGER).unwrap();
            prop_assert_eq!(&opened.hlc, &plain.hlc);
            prop_assert_eq!(&opened.surface, &plain.surface);
            prop_assert_eq!(opened.payload.value(), plain.payload.value());
            prop_assert_eq!((opened.op_id, opened.seq, opened.prev), (sealed.op_id, sealed.seq, sealed.prev));
        }
    }

    /// S1: any bytes sealed as content by a member open to a record or to an error, never a
    /// panic; any line decodes to a record or an error.
    #[test]
    fn s1_malformed_content_and_lines_are_errors_never_panics(
        content in proptest::collection::vec(any::<u8>(), 0..120),
        line in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let key = key(1);
        let place = fencepost::seal::Place { ledger: LEDGER, device: "laptop", seq: 0 };
        let sealed = key.seal(&place, &content).unwrap();
        let record = OpRecord::sealed("laptop".into(), 0, None, SealedContent::Sealed(sealed));
        match record.open(&key, LEDGER) {
            Ok(opened) => prop_assert_eq!(opened.op_id, record.op_id),
            Err(error) => prop_assert!(matches!(error, OpenError::Content { .. }), "{error}"),
        }
        let mut framed = b"[3,\"laptop\",0,null,1,\"".to_vec();
        framed.extend_from_slice(URL_SAFE_NO_PAD.encode(&line).as_bytes());
        framed.extend_from_slice(b"\",null]");
        let _ = OpRecord::from_json(&framed);
        for generation in ["0", "1"] {
            let mut framed = format!("4 \"laptop\" 0 {generation} ").into_bytes();
            framed.extend_from_slice(URL_SAFE_NO_PAD.encode(&line).as_bytes());
            let _ = OpRecord::from_json(&framed);
        }
        let _ = OpRecord::from_json(&line);
    }
}

/// S1: nothing the relay carries of a sealed intent tells its agent, run, epoch or salt: not
/// as text, hex or base64, not in the id; the same content sealed twice has two ids; an intent's
/// line is at most 300 bytes.
#[test]
fn s1_a_sealed_line_names_no_agent_run_epoch_or_salt_and_an_intent_line_is_at_most_300_bytes() {
    let key = key(1);
    let plain = intents("milo-the-agent", 4);
    let sealed = sealed_chain(&plain, &key);
    let text_of = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let lines: Vec<String> = sealed.iter().map(|op| text_of(&line_of(op))).collect();
    for (op, line) in plain.iter().zip(&lines) {
        let intent = op.payload.intent().unwrap();
        let hex_run = intent.run_id.trim_start_matches("run-").to_owned();
        let mut needles = vec![
            intent.agent_id.clone(),
            intent.run_id.clone(),
            hex_run.clone(),
            intent.epoch.to_string(),
            format!("{:x}", intent.epoch),
            "2026-12-0".to_owned(),
            "send".to_owned(),
        ];
        for secret in [
            intent.agent_id.as_bytes(),
            &intent.epoch.to_be_bytes()[2..],
            intent.run_id.as_bytes(),
        ] {
            needles.push(URL_SAFE_NO_PAD.encode(secret)[..8].to_owned());
            needles.push(STANDARD.encode(secret)[..8].to_owned());
        }
        for needle in &needles {
            assert!(
                !line.contains(needle.as_str()),
                "S1: {needle:?} is in the line {line}"
            );
        }
        let bytes = line.len() + 1; // and its newline
        assert!(bytes <= 300, "S1: an intent's line is {bytes} bytes");
    }
    let again = sealed_chain(&plain, &key);
    assert_ne!(again[0].op_id, sealed[0].op_id, "S1: another nonce, another id");
    assert_eq!(
        again[0].open(&key, LEDGER).unwrap().payload,
        sealed[0].open(&key, LEDGER).unwrap().payload
    );
}

/// S1: a head verifies under its device's key, for its ledger, its record and its log's record
/// 0 only; a record without one, or changed in any way, has none that verifies.
/// The layout a sealed record's id is the SHA-256 of, written out here so that no change of the
/// code that computes it changes the ids of records already written.
fn id_as_documented(op: &OpRecord) -> OpId {
    use sha2::{Digest, Sha256};
    let mut bytes = b"fencepost/sealed-op/v1\0".to_vec();
    bytes.extend_from_slice(&(op.device_id.len() as u64).to_be_bytes());
    bytes.extend_from_slice(op.device_id.as_bytes());
    bytes.extend_from_slice(&op.seq.to_be_bytes());
    match op.prev {
        None => bytes.push(0),
        Some(prev) => {
            bytes.push(1);
            bytes.extend_from_slice(&prev.0);
        }
    }
    let record = op.sealed_record().unwrap();
    let content: &[u8] = match &record.content {
        SealedContent::Clear(clear) => {
            bytes.extend_from_slice(&CLEAR_GENERATION.to_be_bytes());
            clear
        }
        SealedContent::Sealed(sealed) => {
            bytes.extend_from_slice(&sealed.generation.to_be_bytes());
            bytes.extend_from_slice(&sealed.nonce);
            &sealed.ciphertext
        }
    };
    bytes.extend_from_slice(&(content.len() as u64).to_be_bytes());
    bytes.extend_from_slice(content);
    OpId(Sha256::digest(&bytes).into())
}

#[test]
fn s1_a_sealed_records_id_is_its_place_link_and_content_hashed_as_written_down() {
    let sealed = sealed_chain(&intents("milo", 3), &key(2));
    let clear = OpRecord::sealed(
        Arc::from("laptop"),
        0,
        None,
        SealedContent::Clear(b"record 0".to_vec().into()),
    );
    for op in sealed.iter().chain([&clear]) {
        assert_eq!(op.op_id, id_as_documented(op), "S1: seq {}", op.seq);
        // Read back from its line, the id is computed again, the same.
        let read = OpRecord::from_json(&line_of(op)).unwrap();
        assert_eq!(read.op_id, op.op_id, "S1: seq {}", op.seq);
    }
}

/// The line earlier versions wrote (format 3), written out here as they laid it down.
fn format_3_line(op: &OpRecord) -> Vec<u8> {
    let record = op.sealed_record().unwrap();
    let b64 = |bytes: &[u8]| json!(URL_SAFE_NO_PAD.encode(bytes));
    let content = match &record.content {
        SealedContent::Clear(clear) => clear.to_vec(),
        SealedContent::Sealed(sealed) => [&sealed.nonce[..], &sealed.ciphertext].concat(),
    };
    let line = json!([
        3,
        &*op.device_id,
        op.seq,
        op.prev.map(|prev| b64(&prev.0)),
        record.content.generation(),
        b64(&content),
        record.head.map(|head| b64(&head.0)),
    ]);
    serde_json::to_vec(&line).unwrap()
}

/// S1: a sealed record's line is format 4 as written down (the device id as a JSON string, the
/// seq, the generation, one base64 body of flags, `prev`, nonce and ciphertext, and head), and
/// a line of format 3 that earlier versions wrote reads as the same record, with the same id.
#[test]
fn s1_a_sealed_line_is_format_4_as_written_down_and_format_3_still_reads_the_same() {
    let sealed = sealed_chain(&intents("milo", 3), &key(2));
    let unsigned = OpRecord::sealed(
        Arc::from("a \"quoted\" laptop"),
        0,
        None,
        SealedContent::Clear(b"record 0".to_vec().into()),
    );
    for op in sealed.iter().chain([&unsigned]) {
        let line = line_of(op);
        let record = op.sealed_record().unwrap();
        let device = serde_json::to_string(&*op.device_id).unwrap();
        let start = format!("4 {device} {} {} ", op.seq, record.content.generation());
        assert!(
            line.starts_with(start.as_bytes()),
            "S1: {}",
            String::from_utf8_lossy(&line)
        );
        let body = URL_SAFE_NO_PAD.decode(&line[start.len()..]).unwrap();
        let mut expected = vec![u8::from(op.prev.is_some()) | (2 * u8::from(record.head.is_some()))];
        expected.extend(op.prev.iter().flat_map(|prev| prev.0));
        match &record.content {
            SealedContent::Clear(clear) => expected.extend_from_slice(clear),
            SealedContent::Sealed(sealed) => {
                expected.extend_from_slice(&sealed.nonce);
                expected.extend_from_slice(&sealed.ciphertext);
            }
        }
        expected.extend(record.head.iter().flat_map(|head| head.0));
        assert_eq!(body, expected, "S1: the body of seq {}", op.seq);
        let old = OpRecord::from_json(&format_3_line(op)).unwrap();
        assert_eq!(&old, op, "S1: format 3 reads as the same record");
        assert_eq!(OpRecord::from_json(&line).unwrap(), old, "S1: so does format 4");
    }
}

/// S1: a line of format 4 that is not as written down is refused with a reason, never read
/// as another record or as the same record written another way: a number or a device id not
/// written as this version writes them, an unknown flag, a body shorter than its flags and
/// generation ask, a field missing, white space where none is written, a body that is not
/// canonical base64url (the reason says where).
#[test]
fn s1_a_malformed_line_of_format_4_is_refused_with_its_reason() {
    let op = &sealed_chain(&intents("milo", 2), &key(1))[1];
    let line = String::from_utf8(line_of(op)).unwrap();
    assert!(OpRecord::from_json(line.as_bytes()).is_ok());
    let body = line.rsplit(' ').next().unwrap();
    let bytes = URL_SAFE_NO_PAD.decode(body).unwrap();
    let with_body = |bytes: &[u8]| format!("4 \"laptop\" 1 1 {}", URL_SAFE_NO_PAD.encode(bytes));
    let mut flagged = bytes.clone();
    flagged[0] |= 4;
    // 200 bytes end in a character with two unused bits: set, the same bytes, another text.
    let mut non_canonical = URL_SAFE_NO_PAD.encode(&bytes[..200]);
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let last = alphabet.find(non_canonical.pop().unwrap()).unwrap();
    non_canonical.push(alphabet.as_bytes()[last | 1] as char);
    let canonical = line.replacen(body, &URL_SAFE_NO_PAD.encode(&bytes[..200]), 1);
    assert!(
        OpRecord::from_json(canonical.as_bytes()).is_ok(),
        "only the unused bits differ"
    );
    let cases = [
        (line.replacen(" 1 1 ", " 01 1 ", 1), "the seq"),
        (line.replacen(" 1 1 ", " 1 +1 ", 1), "the generation"),
        (line.replacen(" 1 1 ", " 1 4294967296 ", 1), "the generation"),
        (line.replacen("4 \"laptop\"", "4 laptop", 1), "device id"),
        (line.replacen("\" 1 1", "\"1 1", 1), "followed by a space"),
        (with_body(&flagged), "flags"),
        (with_body(&bytes[..1 + 32 + 24 + 15 + 64]), "at least"),
        (line.replacen(body, &non_canonical, 1), "base64"),
        ("4 \"laptop\" 1 1".to_owned(), "the generation"),
        (
            line.replacen("4 \"laptop\"", "4  \"laptop\"", 1),
            "as fencepost writes it",
        ),
        (
            line.replacen("4 \"laptop\"", "4 \"\\u006captop\"", 1),
            "as fencepost writes it",
        ),
        (format!("{line}\r"), "base64"),
        (format!("{line} "), "base64"),
        (line.replacen(body, &format!("{body}="), 1), "Invalid"),
        (
            line.replacen(body, &body.replacen('A', "+", 1), 1),
            "Invalid symbol",
        ),
    ];
    for (malformed, reason) in cases {
        assert_ne!(malformed, line, "the case changes the line");
        let error = OpRecord::from_json(malformed.as_bytes()).unwrap_err().to_string();
        assert!(error.contains(reason), "S1: {malformed:?}: {error}");
    }
}

#[test]
fn s1_a_head_covers_its_record_for_one_ledger_key_and_log() {
    let key = key(1);
    let sealed = sealed_chain(&intents("milo", 3), &key);
    let public = signer("laptop").public();
    let origin = sealed[0].op_id;
    for op in &sealed {
        assert!(op.has_valid_head(&public, &LEDGER, &origin), "S1: seq {}", op.seq);
        assert!(
            !op.has_valid_head(&public, &LedgerId([8; 32]), &origin),
            "S1: another ledger"
        );
        assert!(
            !op.has_valid_head(&public, &LEDGER, &OpId([1; 32])),
            "S1: another log"
        );
        let other = DeviceKey::from_secrets(DeviceId::new("laptop").unwrap(), [9; 32], [6; 32]);
        assert!(
            !op.has_valid_head(&other.public(), &LEDGER, &origin),
            "S1: another key"
        );
    }
    let last = &sealed[2];
    let unsigned = OpRecord::sealed(
        Arc::clone(&last.device_id),
        last.seq,
        last.prev,
        last.sealed_record().unwrap().content.clone(),
    );
    assert_eq!(unsigned.op_id, last.op_id, "S1: the head is not in the id");
    assert!(
        !unsigned.has_valid_head(&public, &LEDGER, &origin),
        "S1: no head, none valid"
    );
    let head = last.sealed_record().unwrap().head.unwrap();
    let moved = OpRecord::sealed(
        Arc::clone(&last.device_id),
        last.seq,
        Some(OpId([2; 32])),
        unsigned.sealed_record().unwrap().content.clone(),
    )
    .with_head(head);
    assert!(
        !moved.has_valid_head(&public, &LEDGER, &origin),
        "S1: another link, another id"
    );
    // Every byte of the line changed: the record is refused, or it is another record whose head
    // does not verify.
    let line = line_of(last);
    for at in 0..line.len() {
        let mut changed = line.clone();
        changed[at] ^= 0x01;
        if let Ok(read) = OpRecord::from_json(&changed) {
            let same = read == *last;
            assert!(
                same || !read.has_valid_head(&public, &LEDGER, &origin) || read.open(&key, LEDGER).is_err(),
                "S1: byte {at} changed, and the record still verifies"
            );
        }
    }
}

/// S1: a record in the clear (generation 0: a device's identity, a membership change) carries
/// its bytes as they are and does not open as sealed content; another generation's key opens
/// nothing.
#[test]
fn s1_clear_content_and_other_generations_do_not_open() {
    let clear = OpRecord::sealed(
        "laptop".into(),
        0,
        None,
        SealedContent::Clear(b"identity".to_vec().into()),
    );
    let read = OpRecord::from_json(&line_of(&clear)).unwrap();
    assert_eq!(read, clear);
    assert_eq!(
        read.sealed_record().unwrap().content.generation(),
        CLEAR_GENERATION
    );
    assert!(matches!(
        clear.open(&key(1), LEDGER),
        Err(OpenError::NotSealed { .. })
    ));
    let sealed = sealed_chain(&intents("milo", 1), &key(1));
    assert!(matches!(
        sealed[0].open(&key(2), LEDGER),
        Err(OpenError::Seal { .. })
    ));
    assert!(matches!(
        sealed[0].open(&key(1), LedgerId([8; 32])),
        Err(OpenError::Seal { .. })
    ));
}

/// S1: a ledger that is not protected reads a sealed record as damage of its device, never as
/// a record that folds to nothing: a sealed commit is never taken for an absent one.
#[test]
fn s1_an_unprotected_ledger_reads_a_sealed_record_as_damage() {
    let relay = Arc::new(InMemoryRelay::new());
    let plain = intents("milo", 2);
    let sealed = sealed_chain(&plain, &key(1));
    relay.push(&sealed).unwrap();
    let clock = ManualClock::new(1_764_500_000_000);
    let mut ledger = Ledger::open("phone", clock.wall_clock(), relay as Arc<dyn Relay>).unwrap();
    ledger.sync().unwrap();
    let damage = ledger.damage();
    assert!(
        damage
            .iter()
            .any(|problem| problem.device_id.as_deref() == Some("laptop")
                && problem.detail.contains("protected ledger")),
        "S1: {damage:?}"
    );
    let intent = plain[1].payload.intent().unwrap();
    assert!(ledger.committed_run(&intent.agent_id, &intent.run_id).is_none());
}
