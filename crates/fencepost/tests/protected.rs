//! Rule S2: which records of a protected ledger's logs count (`fencepost::protected`): covered
//! by a head its log's key signed, written by a member, opened; the rest held as void or
//! missing, never folded and never taken for absent.

use std::num::NonZeroU32;
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::genesis::Genesis;
use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use fencepost::oplog::{DeviceLog, OpId, OpRecord, SealedContent, Surface};
use fencepost::protected::{LogReader, Missing, Origin, Protection, Verdict};
use fencepost::roster::{Change, KeyId, MembershipChange, Position, Roster};
use fencepost::seal::LedgerKey;
use proptest::prelude::*;
use serde_json::json;

const LEDGER: LedgerId = LedgerId([7; 32]);

fn device_key(device: &str, secret: u8) -> DeviceKey {
    DeviceKey::from_secrets(DeviceId::new(device).unwrap(), [secret; 32], [secret + 1; 32])
}

fn ledger_key(generation: u32) -> LedgerKey {
    LedgerKey::new(NonZeroU32::new(generation).unwrap(), [generation as u8; 32])
}

/// A protected log of `device` signed by `signer`: record 0 names `origin`, then one sealed
/// intent per entry of `appends` (a number of records each), a head on the last of each append.
fn log_of(signer: &DeviceKey, origin: &Origin, key: &LedgerKey, appends: &[usize]) -> Vec<OpRecord> {
    let device: Arc<str> = Arc::from(signer.device().as_str());
    let first = OpRecord::sealed(
        Arc::clone(&device),
        0,
        None,
        SealedContent::Clear(origin.to_bytes().into()),
    );
    let origin_id = first.op_id;
    let mut log = vec![first.signed(signer, &LEDGER, &origin_id)];
    let clock = ManualClock::new(1_764_400_000_000);
    let mut plain_log = DeviceLog::new(&device, clock.wall_clock()).unwrap();
    plain_log.append(Surface::log("origin"), json!(0)); // seq 0 is the origin
    for (append, &count) in appends.iter().enumerate() {
        for n in 0..count {
            let mut plain = plain_log.append(
                Surface::Intent,
                json!({"agent_id": "milo", "epoch": 5, "id": format!("run-{append}-{n}"), "status": "committed"}),
            );
            plain.prev = log.last().map(|last| last.op_id);
            let mut sealed = plain.seal(key, LEDGER).unwrap();
            if n + 1 == count {
                sealed = sealed.signed(signer, &LEDGER, &origin_id);
            }
            log.push(sealed);
        }
    }
    log
}

fn admitted(device: &str, origin: OpId) -> MembershipChange {
    let id = DeviceId::new(device).unwrap();
    MembershipChange::by_recovery(
        Position {
            device: id.clone(),
            seq: 0,
        },
        KeyId(origin.0),
        Change::Admit {
            device: id,
            key: KeyId(origin.0),
        },
    )
}

/// Offers `log` to a reader and classifies what it covers.
fn read(protection: &Protection, log: &[OpRecord]) -> (Vec<Verdict>, LogReader) {
    let mut reader = LogReader::new(Arc::clone(&log[0].device_id));
    let mut verdicts = Vec::new();
    for op in log {
        for covered in reader.offer(op.clone(), protection.ledger()) {
            let origin = reader.origin().unwrap().as_ref().unwrap().0;
            verdicts.push(protection.classify(covered, &origin));
        }
    }
    (verdicts, reader)
}

fn folded_runs(verdicts: &[Verdict]) -> Vec<String> {
    verdicts
        .iter()
        .filter_map(|verdict| match verdict {
            Verdict::Folded(op) => op.payload.intent().map(|intent| intent.run_id),
            _ => None,
        })
        .collect()
}

/// S2: records handed over at once are covered by their last valid head, which covers those
/// before it: one signature verified, not one per head (a ledger written by `fencepost run`
/// carries a head on every record). A forged last head is passed over for the valid one before
/// it; the records after that wait.
#[test]
fn s2_records_handed_over_at_once_are_covered_by_their_last_valid_head_alone() {
    let laptop = device_key("laptop", 1);
    let origin = Origin::Identity(laptop.public());
    let log = log_of(&laptop, &origin, &ledger_key(1), &[1, 1, 1, 1, 1]);
    let heads = log
        .iter()
        .filter(|op| op.sealed_record().unwrap().head.is_some())
        .count();
    assert_eq!(heads, 6, "every record carries a head");
    let mut reader = LogReader::new(Arc::clone(&log[0].device_id));
    let covered = reader.offer_all(log.clone(), &LEDGER);
    assert_eq!(covered, log, "S2: every record covered, in order");
    assert_eq!(
        reader.heads_verified(),
        1,
        "S2: one signature verified for six heads"
    );

    let thief = device_key("laptop", 9);
    let mut forged = log.clone();
    let last = forged.pop().unwrap();
    let origin_id = log[0].op_id;
    forged.push(last.signed(&thief, &LEDGER, &origin_id));
    let mut reader = LogReader::new(Arc::clone(&log[0].device_id));
    let covered = reader.offer_all(forged.clone(), &LEDGER);
    assert_eq!(covered, log[..5], "S2: covered up to the last valid head");
    assert_eq!(
        reader.held(),
        &forged[5..],
        "S2: the record under a forged head waits"
    );
    assert_eq!(reader.heads_verified(), 2);
    // Offered one by one, the same records are covered.
    let mut one_by_one = LogReader::new(Arc::clone(&log[0].device_id));
    let covered: Vec<OpRecord> = forged
        .iter()
        .flat_map(|op| one_by_one.offer(op.clone(), &LEDGER))
        .collect();
    assert_eq!(covered, log[..5]);
}

/// S2: a member's records count once a head of its log's key covers them, in order, opened to
/// their content with the sealed record's id and links; records after the last head wait.
#[test]
fn s2_records_count_once_a_head_of_the_logs_key_covers_them() {
    let laptop = device_key("laptop", 1);
    let origin = Origin::Identity(laptop.public());
    let log = log_of(&laptop, &origin, &ledger_key(1), &[2, 3]);
    let unsigned_tail = {
        let last = &log[log.len() - 1];
        OpRecord::sealed(
            Arc::clone(&last.device_id),
            last.seq,
            last.prev,
            last.sealed_record().unwrap().content.clone(),
        )
    };
    let mut protection = Protection::new(LEDGER, Roster::compute(&[admitted("laptop", log[0].op_id)]));
    protection.hold(ledger_key(1));
    let mut cut = log.clone();
    *cut.last_mut().unwrap() = unsigned_tail;
    let (verdicts, reader) = read(&protection, &cut);
    assert_eq!(
        folded_runs(&verdicts),
        vec!["run-0-0", "run-0-1"],
        "S2: the first append only"
    );
    assert!(
        matches!(verdicts[0], Verdict::Clear(_)),
        "S2: record 0 is in the clear"
    );
    assert_eq!(
        (reader.covered(), reader.held().len()),
        (3, 3),
        "S2: the second append waits"
    );
    let (verdicts, reader) = read(&protection, &log);
    assert_eq!(
        folded_runs(&verdicts),
        vec!["run-0-0", "run-0-1", "run-1-0", "run-1-1", "run-1-2"]
    );
    assert_eq!(reader.covered(), 6);
    for verdict in &verdicts[1..] {
        let Verdict::Folded(op) = verdict else {
            panic!("S2: {verdict:?}")
        };
        let sealed = &log[op.seq as usize];
        assert_eq!(
            (op.op_id, op.prev),
            (sealed.op_id, sealed.prev),
            "S2: the sealed record's id and link"
        );
    }
}

/// S2: what a writer of the relay can make counts for nothing: a log under a member's id whose
/// record 0 names another key (not a member under it), a record appended to a member's log and
/// signed by another key (never covered), a head moved from another record.
#[test]
fn s2_a_forged_log_or_record_or_head_counts_for_nothing() {
    let laptop = device_key("laptop", 1);
    let real = log_of(&laptop, &Origin::Identity(laptop.public()), &ledger_key(1), &[1]);
    let mut protection = Protection::new(LEDGER, Roster::compute(&[admitted("laptop", real[0].op_id)]));
    protection.hold(ledger_key(1));

    let thief = device_key("laptop", 9);
    let forged = log_of(&thief, &Origin::Identity(thief.public()), &ledger_key(1), &[2]);
    let (verdicts, _) = read(&protection, &forged);
    assert!(
        verdicts
            .iter()
            .all(|verdict| matches!(verdict, Verdict::Missing(_, Missing::NotAMember))),
        "S2: {verdicts:?}"
    );

    let mut appended = real.clone();
    let extra = log_of(&thief, &Origin::Identity(laptop.public()), &ledger_key(1), &[2]);
    let content = extra[1].sealed_record().unwrap().content.clone();
    appended.push(
        OpRecord::sealed(
            Arc::clone(&real[1].device_id),
            2,
            Some(real[1].op_id),
            content.clone(),
        )
        .signed(&thief, &LEDGER, &real[0].op_id),
    );
    let (verdicts, reader) = read(&protection, &appended);
    assert_eq!(
        folded_runs(&verdicts),
        vec!["run-0-0"],
        "S2: the appended record is not covered"
    );
    assert_eq!(reader.held().len(), 1);

    let head = real[1].sealed_record().unwrap().head.unwrap();
    let mut moved = real.clone();
    moved.push(
        OpRecord::sealed(Arc::clone(&real[1].device_id), 2, Some(real[1].op_id), content).with_head(head),
    );
    let (_, reader) = read(&protection, &moved);
    assert_eq!(
        (reader.covered(), reader.held().len()),
        (2, 1),
        "S2: a moved head covers nothing"
    );
}

/// S2: a record of a device cut before it is void; one sealed under a generation this reader
/// does not hold, or under another ledger, is missing and says why.
#[test]
fn s2_cut_records_are_void_and_unopened_ones_missing_with_a_reason() {
    let laptop = device_key("laptop", 1);
    let log = log_of(
        &laptop,
        &Origin::Identity(laptop.public()),
        &ledger_key(2),
        &[1, 1, 1],
    );
    let laptop_id = DeviceId::new("laptop").unwrap();
    let revoke = MembershipChange::by_recovery(
        Position {
            device: DeviceId::new("phone").unwrap(),
            seq: 4,
        },
        KeyId([0; 32]),
        Change::Revoke {
            device: laptop_id,
            cut: 2,
        },
    );
    let mut protection = Protection::new(
        LEDGER,
        Roster::compute(&[admitted("laptop", log[0].op_id), revoke]),
    );
    protection.hold(ledger_key(2));
    let (verdicts, _) = read(&protection, &log);
    assert!(matches!(verdicts[1], Verdict::Folded(_)), "{:?}", verdicts[1]);
    assert!(
        matches!(verdicts[2], Verdict::Void(_)) && matches!(verdicts[3], Verdict::Void(_)),
        "S2: {verdicts:?}"
    );

    let mut without_key = Protection::new(LEDGER, Roster::compute(&[admitted("laptop", log[0].op_id)]));
    without_key.hold(ledger_key(1));
    let (verdicts, _) = read(&without_key, &log);
    assert!(
        verdicts[1..].iter().all(|verdict| matches!(
            verdict,
            Verdict::Missing(_, Missing::KeyNotHeld { generation: 2 })
        )),
        "S2: {verdicts:?}"
    );
    let mut other_ledger = Protection::new(
        LedgerId([8; 32]),
        Roster::compute(&[admitted("laptop", log[0].op_id)]),
    );
    other_ledger.hold(ledger_key(2));
    let (verdicts, reader) = read(&other_ledger, &log);
    assert!(
        verdicts.is_empty(),
        "S2: heads of another ledger cover nothing: {verdicts:?}"
    );
    assert_eq!(reader.covered(), 0);
}

/// S2: the founder's log is rooted in the genesis, which its record 0 holds.
#[test]
fn s2_the_founders_log_begins_with_the_genesis() {
    let laptop = device_key("laptop", 1);
    let genesis = Genesis {
        nonce: [3; 16],
        founder: laptop.device().clone(),
        founder_key: laptop.public(),
        recovery_key: device_key("recovery", 20).public(),
    };
    let origin = Origin::Genesis(genesis.clone());
    assert_eq!(Origin::from_bytes(&origin.to_bytes()).unwrap(), origin);
    assert_eq!(origin.signer(), &laptop.public());
    let log = log_of(&laptop, &origin, &ledger_key(1), &[1]);
    let mut protection = Protection::new(LEDGER, Roster::compute(&[admitted("laptop", log[0].op_id)]));
    protection.hold(ledger_key(1));
    let (verdicts, reader) = read(&protection, &log);
    assert_eq!(folded_runs(&verdicts), vec!["run-0-0"]);
    assert!(matches!(reader.origin(), Some(Ok((_, Origin::Genesis(read)))) if *read == genesis));
}

proptest! {
    /// S2: any bytes as record 0 name a key or say why not, never a panic.
    #[test]
    fn s2_any_record_0_names_a_key_or_says_why_not(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Origin::from_bytes(&bytes);
    }
}

/// A founder, its genesis and a ledger key: what `ledger init` will make.
struct Founded {
    genesis: Genesis,
    key: LedgerKey,
}

fn founded(founder: &DeviceKey) -> Founded {
    Founded {
        genesis: Genesis {
            nonce: [9; 16],
            founder: founder.device().clone(),
            founder_key: founder.public(),
            recovery_key: device_key("recovery", 40).public(),
        },
        key: ledger_key(1),
    }
}

fn protected(
    founded: &Founded,
    device: DeviceKey,
    members: Vec<MembershipChange>,
) -> fencepost::ledger::Protected {
    let origin = if device.device() == &founded.genesis.founder {
        Origin::Genesis(founded.genesis.clone())
    } else {
        Origin::Identity(device.public())
    };
    fencepost::ledger::Protected {
        ledger: founded.genesis.ledger_id(),
        device_key: Arc::new(device),
        origin,
        keys: vec![founded.key.clone()],
        members,
    }
}

fn open(folder: &std::path::Path, protected_as: fencepost::ledger::Protected) -> fencepost::ledger::Ledger {
    use fencepost::ledger::{Ledger, LedgerOptions};
    use fencepost::relay::{FsRelay, Relay};
    let device = protected_as.device_key.device().to_string();
    let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(folder).unwrap());
    let clock = ManualClock::new(1_764_400_000_000);
    Ledger::open_with(
        &device,
        clock.wall_clock(),
        relay,
        LedgerOptions::default().protected(protected_as),
    )
    .unwrap()
}

/// The founder's (`laptop`'s) ledger of `founded` in `folder`, given the first generation and
/// no other member.
fn as_founder(folder: &std::path::Path, founded: &Founded) -> fencepost::ledger::Ledger {
    open(folder, protected(founded, device_key("laptop", 1), vec![]))
}

/// S2: a reader handed a long protected log at once (every record under its own head, as
/// `fencepost run` writes them) opens the records on every core and folds each of them: every
/// commit counts, in order, and the reader's frontier is the log's end.
#[test]
fn s2_a_long_log_read_at_once_folds_every_record() {
    use fencepost::lease::{Intent, IntentStatus};

    let folder = tempfile::tempdir().unwrap();
    let laptop = device_key("laptop", 1);
    let founded = founded(&laptop);
    let mut writer = as_founder(folder.path(), &founded);
    let occurrences = 400;
    for occurrence in 0..occurrences {
        for status in [IntentStatus::Pending, IntentStatus::Committed] {
            let run = format!("run-{occurrence}");
            writer
                .record(&Intent::new("milo", &run, occurrence + 1, status))
                .unwrap();
        }
    }
    let reader = as_founder(folder.path(), &founded);
    assert!(reader.damage().is_empty(), "{:?}", reader.damage());
    let agent = reader.state().agent("milo").unwrap();
    assert_eq!(
        agent.committed_runs().len(),
        occurrences as usize,
        "S2: every commit counts"
    );
    for occurrence in 0..occurrences {
        let run = agent.committed_run(&format!("run-{occurrence}")).unwrap();
        assert_eq!(run.epoch, occurrence + 1, "S2: run-{occurrence} at its own epoch");
    }
    assert_eq!(
        reader.view().frontier().next_seq("laptop"),
        2 * occurrences + 2,
        "S2: record 0, the agent's naming (S5) and every intent settled"
    );
}

/// S1, S2: a protected ledger in a folder: what a member writes is sealed (no agent or run id
/// in its file) and read back by it and by another member; a log under a device id that is no
/// member, well formed and signed by its own key, counts for nothing and stops nothing; a line
/// in the clear written into a member's file is damage, never a commit.
#[test]
fn s2_a_protected_ledger_folds_only_what_its_members_sealed_and_signed() {
    use fencepost::lease::{Intent, IntentStatus};

    let folder = tempfile::tempdir().unwrap();
    let laptop = device_key("laptop", 1);
    let phone = device_key("phone", 11);
    let founded = founded(&laptop);
    let phone_admitted = MembershipChange::by_recovery(
        Position {
            device: DeviceId::new("laptop").unwrap(),
            seq: 1,
        },
        KeyId([0; 32]),
        Change::Admit {
            device: DeviceId::new("phone").unwrap(),
            key: fencepost::ledger::identity_key(phone.device(), &phone.public()),
        },
    );
    let mut writer = open(
        folder.path(),
        protected(&founded, device_key("laptop", 1), vec![phone_admitted.clone()]),
    );
    for status in [IntentStatus::Pending, IntentStatus::Committed] {
        writer
            .record(&Intent::new("milo-the-agent", "run-secret-occurrence", 5, status))
            .unwrap();
    }
    let file = std::fs::read_to_string(folder.path().join("devices").join("laptop.jsonl")).unwrap();
    assert_eq!(
        file.lines().count(),
        4,
        "S1: record 0, the agent's naming (S5) and two sealed intents: {file}"
    );
    assert!(
        file.lines().all(|line| line.starts_with("4 \"laptop\" ")),
        "S1: {file}"
    );
    for secret in ["milo", "secret", "occurrence", "pending", "committed"] {
        assert!(!file.contains(secret), "S1: {secret:?} is in the folder: {file}");
    }

    let mut on_phone = open(
        folder.path(),
        protected(&founded, phone, vec![phone_admitted.clone()]),
    );
    assert!(on_phone.damage().is_empty(), "{:?}", on_phone.damage());
    assert!(
        on_phone
            .committed_run("milo-the-agent", "run-secret-occurrence")
            .is_some(),
        "S2: a member's commit counts"
    );
    on_phone
        .record(&Intent::new(
            "milo-the-agent",
            "run-second",
            6,
            IntentStatus::Committed,
        ))
        .unwrap();

    // A writer of the folder: a log under a new id, signed by its own key.
    let thief = device_key("host-7", 60);
    let forged = log_of(&thief, &Origin::Identity(thief.public()), &founded.key, &[1]);
    let mut lines = Vec::new();
    for op in &forged {
        op.write_json_line(&mut lines);
    }
    std::fs::write(folder.path().join("devices").join("host-7.jsonl"), &lines).unwrap();
    // And a line in the clear appended to the phone's file.
    let clock = ManualClock::new(1_764_500_000_000);
    let phone_file = folder.path().join("devices").join("phone.jsonl");
    let phone_log: Vec<OpRecord> = std::fs::read_to_string(&phone_file)
        .unwrap()
        .lines()
        .map(|line| OpRecord::from_json(line.as_bytes()).unwrap())
        .collect();
    let mut forger = DeviceLog::resume("phone", clock.wall_clock(), Default::default(), &phone_log).unwrap();
    let forged_commit = forger.append(
        Surface::Intent,
        json!({"agent_id": "milo-the-agent", "epoch": 7, "id": "run-third", "status": "committed"}),
    );
    let mut appended = std::fs::read(&phone_file).unwrap();
    forged_commit.write_json_line(&mut appended);
    std::fs::write(&phone_file, appended).unwrap();

    let mut reader = open(
        folder.path(),
        protected(&founded, device_key("laptop", 1), vec![phone_admitted]),
    );
    assert!(reader
        .committed_run("milo-the-agent", "run-secret-occurrence")
        .is_some());
    assert!(
        reader.committed_run("milo-the-agent", "run-second").is_some(),
        "S2: the phone's commit counts"
    );
    assert!(
        reader.committed_run("milo", "run-0-0").is_none(),
        "S2: a non-member's log counts for nothing"
    );
    assert!(
        reader.committed_run("milo-the-agent", "run-third").is_none(),
        "S2: a line in the clear is no commit"
    );
    let damage = reader.damage();
    assert!(
        damage
            .iter()
            .all(|problem| problem.device_id.as_deref() == Some("phone"))
            && damage
                .iter()
                .any(|problem| problem.detail.contains("in the clear")),
        "S2: the clear line is the phone's damage, the non-member's log none: {damage:?}"
    );
}

fn member(
    folder: &std::path::Path,
    device: Arc<DeviceKey>,
    origin: Origin,
    ledger: LedgerId,
) -> fencepost::ledger::Ledger {
    let protected = fencepost::ledger::Protected {
        ledger,
        device_key: device,
        origin,
        keys: Vec::new(),
        members: Vec::new(),
    };
    open(folder, protected)
}

/// S2, M1: a ledger founded by one device (the genesis, then the first generation of its key
/// wrapped to the founder and to the recovery key), another admitted by it: each reads the
/// other's sealed records with keys it unwraps from the ledger itself, nothing given; a device
/// not admitted holds no key and writes nothing; founding a ledger with records is refused.
#[test]
fn s2_m1_a_founded_ledger_gives_its_key_to_the_devices_it_admits_only() {
    use fencepost::lease::{Intent, IntentStatus};
    use fencepost::ledger::{Ledger, LedgerError, LedgerOptions};
    use fencepost::relay::{FsRelay, Relay};

    let folder = tempfile::tempdir().unwrap();
    let laptop = Arc::new(device_key("laptop", 1));
    let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(folder.path()).unwrap());
    let clock = ManualClock::new(1_764_400_000_000);
    let (mut founder, founded) = Ledger::found(
        Arc::clone(&laptop),
        clock.wall_clock(),
        relay,
        LedgerOptions::default(),
    )
    .unwrap();
    let ledger_id = founded.genesis.ledger_id();
    assert_eq!(founder.fingerprint(), Some(founded.genesis.fingerprint()));
    founder
        .record(&Intent::new("milo", "run-1", 3, IntentStatus::Committed))
        .unwrap();

    let again = Ledger::found(
        Arc::clone(&laptop),
        clock.wall_clock(),
        Arc::new(FsRelay::open(folder.path()).unwrap()),
        LedgerOptions::default(),
    );
    assert!(matches!(again, Err(LedgerError::NotEmpty)), "S2: {again:?}");

    // Reopened with no key given: the founder unwraps its own from the ledger.
    let origin = Origin::Genesis(founded.genesis.clone());
    let mut reopened = member(folder.path(), Arc::clone(&laptop), origin.clone(), ledger_id);
    assert!(
        reopened.committed_run("milo", "run-1").is_some(),
        "S2: {:?}",
        reopened.damage()
    );

    // A device not admitted: no key, nothing folded, nothing written.
    let phone = Arc::new(device_key("phone", 11));
    let phone_origin = Origin::Identity(phone.public());
    let mut outsider = member(folder.path(), Arc::clone(&phone), phone_origin.clone(), ledger_id);
    assert!(
        outsider.committed_run("milo", "run-1").is_none(),
        "S2: no key, no commit"
    );
    assert!(outsider
        .record(&Intent::new("milo", "run-2", 4, IntentStatus::Pending))
        .is_err());

    reopened.admit(phone.device(), &phone.public()).unwrap();
    let mut on_phone = member(folder.path(), Arc::clone(&phone), phone_origin, ledger_id);
    assert!(
        on_phone.committed_run("milo", "run-1").is_some(),
        "M1: the admitted device reads: {:?}",
        on_phone.damage()
    );
    assert_eq!(on_phone.fingerprint(), Some(founded.genesis.fingerprint()));
    on_phone
        .record(&Intent::new("milo", "run-2", 4, IntentStatus::Committed))
        .unwrap();
    let mut back = member(folder.path(), Arc::clone(&laptop), origin, ledger_id);
    assert!(
        back.committed_run("milo", "run-2").is_some(),
        "M1: the admitted device writes: {:?}",
        back.damage()
    );
    assert!(back.damage().is_empty(), "{:?}", back.damage());
}

proptest! {
    /// M1: a membership record reads back as it was written, whatever it holds; any bytes read
    /// as one or say why not, never a panic.
    #[test]
    fn m1_membership_records_round_trip_and_any_bytes_are_an_error_or_a_record(
        generation in any::<u32>(),
        cut in any::<u64>(),
        wraps in 0usize..4,
        signed in any::<bool>(),
        noise in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        use fencepost::membership::{Membership, MembershipRecord};
        use fencepost::wrap::{Wrapped, WRAPPED_BYTES};
        let phone = device_key("phone", 11);
        let device = phone.device().clone();
        let wrapped = |n: usize| Wrapped([n as u8; WRAPPED_BYTES]);
        for change in [
            Membership::Rotate { generation, commitment: [generation as u8; 32], wraps: (0..wraps).map(|n| (device.clone(), wrapped(n))).collect() },
            Membership::Admit {
                device: device.clone(),
                key: KeyId([3; 32]),
                identity: phone.public(),
                wraps: (0..wraps).map(|n| (n as u32, wrapped(n))).collect(),
            },
            Membership::Revoke { device: device.clone(), cut },
            Membership::Open { device: device.clone(), wraps: (0..wraps).map(|n| (generation ^ n as u32, wrapped(n))).collect() },
        ] {
            let by_recovery = signed.then(|| phone.sign(fencepost::identity::SignatureContext::Membership, &LEDGER, &change.to_bytes()));
            let record = MembershipRecord { change, by_recovery };
            prop_assert_eq!(MembershipRecord::from_bytes(&record.to_bytes()), Ok(record.clone()));
            prop_assert_eq!(record.signed_by_recovery(&phone.public(), &LEDGER), signed);
        }
        let _ = MembershipRecord::from_bytes(&noise);
    }
}

/// S2 (found by an adversarial test): two `ledger init`s on one folder (a race, or each side of
/// a sync) leave two geneses; each founder's reading names the other's log as damage (another
/// protected ledger's genesis), so nothing runs on a ledger split in two.
#[test]
fn s2_two_geneses_in_one_ledger_are_damage() {
    use fencepost::ledger::{Ledger, LedgerOptions};
    use fencepost::relay::{FsRelay, Relay};
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_764_400_000_000);
    let found = |folder: &std::path::Path, device: DeviceKey| {
        let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(folder).unwrap());
        Ledger::found(
            Arc::new(device),
            clock.wall_clock(),
            relay,
            LedgerOptions::default(),
        )
        .unwrap()
    };
    let (_, a) = found(first.path(), device_key("host-a", 1));
    let (_, _) = found(second.path(), device_key("host-b", 3));
    let name = fencepost::relay::device_file_name("host-b");
    std::fs::copy(
        second.path().join("devices").join(&name),
        first.path().join("devices").join(&name),
    )
    .unwrap();
    let origin = Origin::Genesis(a.genesis.clone());
    let reading = member(
        first.path(),
        Arc::new(device_key("host-a", 1)),
        origin,
        a.genesis.ledger_id(),
    );
    let damage = reading.damage();
    assert!(
        damage
            .iter()
            .any(|problem| problem.device_id.as_deref() == Some("host-b")
                && problem.detail.contains("another protected ledger")),
        "S2: {damage:?}"
    );
}

/// S1 (found by an adversarial test): a host that reads a protected ledger as no member (its
/// membership file lost) writes nothing into it, not even the record of accepting its damage:
/// no record in the clear lands beside sealed ones.
#[test]
fn s1_a_host_that_is_no_member_writes_nothing_into_a_protected_ledger() {
    use fencepost::lease::{Intent, IntentStatus};
    use fencepost::ledger::{Ledger, LedgerError, LedgerOptions};
    use fencepost::relay::{FsRelay, Relay};
    let folder = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_764_400_000_000);
    let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(folder.path()).unwrap());
    let (mut founder, _) = Ledger::found(
        Arc::new(device_key("laptop", 1)),
        clock.wall_clock(),
        relay,
        LedgerOptions::default(),
    )
    .unwrap();
    founder
        .record(&Intent::new("milo", "run-1", 3, IntentStatus::Committed))
        .unwrap();
    for device in ["laptop", "phone"] {
        let relay: Arc<dyn Relay> = Arc::new(FsRelay::open(folder.path()).unwrap());
        let mut plain = Ledger::open(device, clock.wall_clock(), relay).unwrap();
        let accepted = plain.accept_damage("laptop");
        assert!(
            matches!(accepted, Err(LedgerError::ProtectedNotMember)),
            "S1: {device}: {accepted:?}"
        );
        let written = plain.record(&Intent::new("milo", "run-1", 4, IntentStatus::Pending));
        assert!(
            matches!(written, Err(LedgerError::ProtectedNotMember)),
            "S1: {device}: {written:?}"
        );
    }
    let files: Vec<_> = std::fs::read_dir(folder.path().join("devices"))
        .unwrap()
        .collect();
    assert_eq!(files.len(), 1, "S1: no other device file was written");
    let laptop = std::fs::read_to_string(folder.path().join("devices").join("laptop.jsonl")).unwrap();
    assert!(
        laptop.lines().all(|line| line.starts_with("4 \"laptop\" ")),
        "{laptop}"
    );
}

/// S2, found by an adversary: a member's last record under a head that does not verify (a
/// forged one) is missing and says so, where a record under no head yet says that instead;
/// neither counts.
#[test]
fn s2_a_forged_head_is_reported_as_such_and_an_absent_one_as_not_yet_written() {
    use fencepost::lease::{Intent, IntentStatus};

    let folder = tempfile::tempdir().unwrap();
    let laptop = device_key("laptop", 1);
    let founded = founded(&laptop);
    let mut writer = as_founder(folder.path(), &founded);
    for status in [IntentStatus::Pending, IntentStatus::Committed] {
        writer.record(&Intent::new("milo", "run-1", 5, status)).unwrap();
    }
    let file = folder.path().join("devices").join("laptop.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    let records: Vec<OpRecord> = text
        .lines()
        .map(|line| OpRecord::from_json(line.as_bytes()).unwrap())
        .collect();
    let last = records.last().unwrap().clone();
    let ledger = founded.genesis.ledger_id();
    let forged = last
        .clone()
        .signed(&device_key("laptop", 9), &ledger, &records[0].op_id);
    let unsigned = OpRecord::sealed(
        Arc::clone(&last.device_id),
        last.seq,
        last.prev,
        last.sealed_record().unwrap().content.clone(),
    );
    for (replacement, expected) in [(forged, Missing::HeadNotValid), (unsigned, Missing::NotCovered)] {
        let mut lines = Vec::new();
        for op in &records[..records.len() - 1] {
            op.write_json_line(&mut lines);
        }
        replacement.write_json_line(&mut lines);
        std::fs::write(&file, &lines).unwrap();
        let mut reader = as_founder(folder.path(), &founded);
        assert_eq!(
            reader.not_counted(),
            vec![("laptop".to_owned(), last.seq, expected.clone())],
            "S2: {expected}"
        );
        assert!(
            reader.committed_run("milo", "run-1").is_none(),
            "S2: it does not count"
        );
    }
}
