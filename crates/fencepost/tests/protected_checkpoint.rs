//! Rule S6: a protected ledger's checkpoints are sealed and signed in the shared place; each host
//! opens them into a folder of its own, and uses one only when it opens (its writer a member,
//! never revoked, where it ends that device's log; sealed with a generation the host holds; its
//! roster's changes each signed by their author; not altered). One that does not open is never
//! used, stops nothing, and `verify_checkpoints` names it.

mod members;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use fencepost::identity::{DeviceKey, SignatureContext};
use fencepost::ledger::{CompactOptions, LedgerOptions};
use sha2::{Digest, Sha256};

use members::{device_key, run, Members};

/// This device's folder of opened checkpoints and its snapshot, under `home`.
fn options(home: &Path, key: &Arc<DeviceKey>) -> LedgerOptions {
    let device = key.device().as_str();
    LedgerOptions::default()
        .checkpoint_copies(home.join(format!("{device}-checkpoints")))
        .snapshot(home.join(format!("{device}.snapshot")))
}

/// [`options`] without a snapshot: a reading of every record (what compaction and
/// verification need).
fn reading(home: &Path, key: &Arc<DeviceKey>) -> LedgerOptions {
    LedgerOptions::default().checkpoint_copies(home.join(format!("{}-checkpoints", key.device().as_str())))
}

/// `key`'s device's reading of every record (no snapshot), its copies under `home`.
fn read_all(members: &Members, home: &Path, key: &Arc<DeviceKey>) -> fencepost::ledger::Ledger {
    members.open_with(key, reading(home, key)).unwrap()
}

/// The sealed checkpoints in the ledger folder.
fn sealed(members: &Members) -> Vec<PathBuf> {
    let dir = members.folder.path().join("checkpoints");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
        .unwrap_or_default();
    found.retain(|path| !path.file_name().unwrap().to_string_lossy().starts_with('.'));
    found.sort();
    found
}

/// A founder that ran three runs and admitted `phone`, and the home of the hosts' own files.
fn ledger_with_runs(phone: &Arc<DeviceKey>) -> (Members, tempfile::TempDir) {
    let (members, mut founder) = Members::found(&[phone]);
    for name in ["run-1", "run-2", "run-3"] {
        run(&mut founder, name, 2);
    }
    (members, tempfile::tempdir().unwrap())
}

/// [`ledger_with_runs`], and `desk` admitted by the founder.
fn with_desk(phone: &Arc<DeviceKey>, desk: &Arc<DeviceKey>) -> (Members, tempfile::TempDir) {
    let (members, home) = ledger_with_runs(phone);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.admit(desk.device(), &desk.public()).unwrap();
    (members, home)
}

/// `writer` runs an occurrence and compacts; `desk` then opens the ledger from its checkpoint.
fn compacted_and_opened_by(members: &Members, home: &Path, writer: &Arc<DeviceKey>, desk: &Arc<DeviceKey>) {
    let mut on_writer = read_all(members, home, writer);
    run(&mut on_writer, "run-4", 3);
    on_writer.compact().unwrap();
    drop(on_writer);
    let on_desk = members.open_with(desk, options(home, desk)).unwrap();
    assert!(
        on_desk.started_from_checkpoint().is_some(),
        "the writer's checkpoint, before any revocation"
    );
}

/// `key`'s device reads every record (and so every membership change), then opens again with
/// its copies and without the snapshot it had.
fn read_again_without_snapshot(
    members: &Members,
    home: &Path,
    key: &Arc<DeviceKey>,
) -> fencepost::ledger::Ledger {
    drop(read_all(members, home, key));
    let device = key.device().as_str();
    std::fs::remove_file(home.join(format!("{device}.snapshot"))).unwrap();
    members.open_with(key, options(home, key)).unwrap()
}

/// [`ledger_with_runs`], compacted by the founder (no prune).
fn compacted(phone: &Arc<DeviceKey>) -> (Members, tempfile::TempDir) {
    let (members, home) = ledger_with_runs(phone);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.compact().unwrap();
    (members, home)
}

/// S6, K1, K5: a compaction of a protected ledger leaves only a sealed checkpoint in the shared
/// place (no agent or run id in it as text, hex or base64); after a prune, a device admitted
/// later starts from it and finds every commit; the checkpoint verifies.
#[test]
fn s6_a_sealed_checkpoint_is_written_and_a_member_admitted_after_the_prune_starts_from_it() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, home) = ledger_with_runs(&phone);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    let info = laptop.compact_with(&CompactOptions::default().prune()).unwrap();
    assert!(info.pruned > 0, "K5: the founder's own records went: {info:?}");
    let shared = sealed(&members);
    assert_eq!(shared.len(), 1, "S6: one checkpoint, sealed: {shared:?}");
    assert!(shared[0].to_string_lossy().ends_with(".sealed"));
    let bytes = std::fs::read(&shared[0]).unwrap();
    for secret in ["milo", "run-1", "run-2"] {
        let forms = [
            secret.to_owned(),
            secret.bytes().map(|byte| format!("{byte:02x}")).collect(),
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(secret),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret),
        ];
        for form in forms {
            assert!(
                !bytes.windows(form.len()).any(|window| window == form.as_bytes()),
                "S6: {form:?} ({secret}) lies in the sealed checkpoint"
            );
        }
    }
    laptop.admit(tablet.device(), &tablet.public()).unwrap();
    drop(laptop);

    let mut on_tablet = members.open_with(&tablet, options(home.path(), &tablet)).unwrap();
    assert!(on_tablet.damage().is_empty(), "{:?}", on_tablet.damage());
    assert!(
        on_tablet.started_from_checkpoint().is_some(),
        "S6: the new member starts from the sealed checkpoint"
    );
    for name in ["run-1", "run-2", "run-3"] {
        assert!(
            on_tablet.committed_run("milo", name).is_some(),
            "K1: {name} is committed"
        );
    }
    drop(on_tablet);
    let verifier = read_all(&members, home.path(), &phone);
    assert!(verifier.damage().is_empty(), "{:?}", verifier.damage());
    assert_eq!(verifier.verify_checkpoints().unwrap(), vec![], "K3: it verifies");
}

/// Writes `bytes` as a sealed checkpoint of `records` records into the ledger folder, named by
/// its digest as a writer names it.
fn place(members: &Members, records: u64, bytes: &[u8]) -> PathBuf {
    let digest: String = Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let path = members
        .folder
        .path()
        .join("checkpoints")
        .join(format!("checkpoint-{records}-{digest}.sealed"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The records a sealed checkpoint's name says it covers.
fn records_of(path: &Path) -> u64 {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    name.split('-').nth(1).unwrap().parse().unwrap()
}

/// S6, K3: a sealed checkpoint changed in the shared place (a byte of its ciphertext or of
/// its signature, cut short, or named again after its new bytes) is never used: a new host
/// reads every record instead and runs nothing twice, and `verify_checkpoints` names it.
#[test]
fn s6_an_altered_sealed_checkpoint_is_never_used_and_verify_names_it() {
    let phone = device_key("phone", 11);
    let (members, _home) = compacted(&phone);
    let original = sealed(&members).remove(0);
    let bytes = std::fs::read(&original).unwrap();
    std::fs::remove_file(&original).unwrap();
    let body = bytes.iter().position(|byte| *byte == b'\n').unwrap() + 1;
    let mut altered = Vec::new();
    let mut flipped = bytes.clone();
    flipped[body + 40] ^= 1;
    altered.push(("a ciphertext byte", flipped));
    let mut signed = bytes.clone();
    let last = signed.len() - 1;
    signed[last] ^= 1;
    altered.push(("a signature byte", signed));
    altered.push(("cut short", bytes[..bytes.len() - 100].to_vec()));
    altered.push(("named by another digest", bytes.clone()));
    for (what, changed) in altered {
        let mut path = place(&members, records_of(&original), &changed);
        if what == "named by another digest" {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let prefix = format!("checkpoint-{}-", records_of(&original));
            let digest = &name[prefix.len()..];
            let first = if digest.starts_with('0') { '1' } else { '0' };
            let renamed = path.with_file_name(format!("{prefix}{first}{}", &digest[1..]));
            std::fs::rename(&path, &renamed).unwrap();
            path = renamed;
        }
        let home_of_one = tempfile::tempdir().unwrap();
        let mut on_phone = members
            .open_with(&phone, options(home_of_one.path(), &phone))
            .unwrap();
        assert!(
            on_phone.damage().is_empty(),
            "S6: {what}: it stops nothing: {:?}",
            on_phone.damage()
        );
        assert_eq!(on_phone.started_from_checkpoint(), None, "S6: {what}: not used");
        assert!(on_phone.committed_run("milo", "run-3").is_some());
        drop(on_phone);
        let verifier = read_all(&members, home_of_one.path(), &phone);
        let found = verifier.verify_checkpoints().unwrap();
        assert_eq!(found.len(), 1, "K3: {what}: {found:?}");
        assert!(found[0].detail.contains("does not open"), "{what}: {}", found[0]);
        std::fs::remove_file(path).unwrap();
    }
}

/// S6: a checkpoint whose header names a writer that is no member (re-signed by a stranger's
/// key over the same ciphertext), that a member's key did not sign, or whose membership
/// changes come without the proof that their authors signed them, is never used.
#[test]
fn s6_a_checkpoint_a_non_member_signed_is_never_used() {
    let phone = device_key("phone", 11);
    let stranger = device_key("stranger", 31);
    let (members, _home) = compacted(&phone);
    let original = sealed(&members).remove(0);
    let bytes = std::fs::read(&original).unwrap();
    std::fs::remove_file(&original).unwrap();
    let body = bytes.iter().position(|byte| *byte == b'\n').unwrap() + 1;
    let (line, rest) = bytes.split_at(body);
    let ciphertext = &rest[..rest.len() - 64];
    let resign = |line: &[u8], key: &DeviceKey| {
        let mut signed = Sha256::new();
        signed.update(line);
        signed.update(ciphertext);
        let digest: [u8; 32] = signed.finalize().into();
        let signature = key.sign(SignatureContext::Checkpoint, &members.ledger, &digest);
        [line, ciphertext, &signature.0].concat()
    };
    let mut header: serde_json::Value = serde_json::from_slice(line).unwrap();
    header["writer"] = "stranger".into();
    let stranger_line = [serde_json::to_vec(&header).unwrap(), b"\n".to_vec()].concat();
    // The founder's own header, its changes' proofs left out: the roster would be its word.
    let mut unproved = serde_json::from_slice::<serde_json::Value>(line).unwrap();
    unproved["roster"]["proofs"] = serde_json::json!([]);
    let unproved_line = [serde_json::to_vec(&unproved).unwrap(), b"\n".to_vec()].concat();
    // The founder's own header, a device's head named twice (each check might take another).
    let mut twice = serde_json::from_slice::<serde_json::Value>(line).unwrap();
    let first_head = twice["heads"][0].clone();
    twice["heads"].as_array_mut().unwrap().push(first_head);
    let twice_line = [serde_json::to_vec(&twice).unwrap(), b"\n".to_vec()].concat();
    let cases = [
        (
            "a head named twice",
            resign(&twice_line, &members.laptop),
            "twice",
        ),
        (
            "a stranger's header and signature",
            resign(&stranger_line, &stranger),
            "no member",
        ),
        (
            "the founder's header, a stranger's signature",
            resign(line, &stranger),
            "signature",
        ),
        (
            "changes without their proofs",
            resign(&unproved_line, &members.laptop),
            "proof",
        ),
    ];
    for (what, forged, why) in cases {
        let path = place(&members, records_of(&original), &forged);
        let home_of_one = tempfile::tempdir().unwrap();
        let on_phone = members
            .open_with(&phone, options(home_of_one.path(), &phone))
            .unwrap();
        assert_eq!(on_phone.started_from_checkpoint(), None, "S6: {what}: not used");
        assert!(
            on_phone.damage().is_empty(),
            "S6: {what}: {:?}",
            on_phone.damage()
        );
        let unopened = on_phone.unopened_checkpoints();
        assert_eq!(unopened.len(), 1, "{what}: {unopened:?}");
        assert!(unopened[0].1.contains(why), "S6: {what}: {}", unopened[0].1);
        drop(on_phone);
        std::fs::remove_file(path).unwrap();
    }
}

/// S6, M2: a member that revokes the writer of the checkpoint a pruned ledger starts from
/// writes a checkpoint of its own in the same call, so that a host that reads the revocation
/// first has one to start from (found through the binary by an adversary: new hosts stopped
/// until a member compacted; the library's `revoke` now writes it, not the command).
#[test]
fn s6_m2_a_revocation_on_a_pruned_ledger_writes_a_members_checkpoint() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, home) = ledger_with_runs(&phone);
    let mut on_phone = read_all(&members, home.path(), &phone);
    run(&mut on_phone, "run-4", 3);
    let info = on_phone.compact_with(&CompactOptions::default().prune()).unwrap();
    assert!(info.pruned > 0, "{info:?}");
    drop(on_phone);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    assert!(
        laptop.pruned_start().is_some(),
        "the laptop starts from the phone's checkpoint"
    );
    let revoked = laptop.revoke(phone.device(), None).unwrap();
    let written = revoked
        .checkpoint
        .expect("S6: a pruned ledger gets a member's checkpoint");
    let written = written.expect("S6: the checkpoint was written");
    laptop.admit(tablet.device(), &tablet.public()).unwrap();
    drop(laptop);
    assert_eq!(
        sealed(&members).len(),
        1,
        "S6: the laptop's; the revoked phone's went, which it contains"
    );
    let mut on_tablet = members.open_with(&tablet, options(home.path(), &tablet)).unwrap();
    let started = on_tablet
        .started_from_checkpoint()
        .expect("S6: a member's checkpoint")
        .to_owned();
    assert_eq!(started, written.id, "S6: the laptop's, not the revoked phone's");
    assert!(on_tablet.damage().is_empty(), "{:?}", on_tablet.damage());
    for run_id in ["run-1", "run-2", "run-3", "run-4"] {
        assert!(on_tablet.committed_run("milo", run_id).is_some(), "K1: {run_id}");
    }
}

/// S6, M2: a checkpoint whose writer was revoked since is never used, even one it wrote while
/// it was a member (nothing tells it from one a thief writes after the revocation), nor by a
/// host that opened it before it read the revocation: a host whose logs were pruned after it
/// waits for a checkpoint a member writes.
#[test]
fn s6_m2_a_revoked_devices_checkpoint_is_never_used() {
    let (phone, tablet, desk) = (
        device_key("phone", 11),
        device_key("tablet", 21),
        device_key("desk", 41),
    );
    let (members, home) = with_desk(&phone, &desk);
    compacted_and_opened_by(&members, home.path(), &phone, &desk);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    let revoked = laptop.revoke(phone.device(), None).unwrap();
    assert_eq!(
        revoked.checkpoint, None,
        "S6: no log was pruned, no checkpoint written"
    );
    laptop.admit(tablet.device(), &tablet.public()).unwrap();
    drop(laptop);
    let mut on_tablet = members.open_with(&tablet, options(home.path(), &tablet)).unwrap();
    assert_eq!(on_tablet.started_from_checkpoint(), None, "S6: not used");
    let unopened = on_tablet.unopened_checkpoints();
    assert!(
        unopened.iter().any(|(_, why)| why.contains("revoked")),
        "S6: {unopened:?}"
    );
    assert!(on_tablet.committed_run("milo", "run-2").is_some());
    // A host that opened it before it read the revocation does not use it once it has (found
    // by a cryptography review: the copy opened before was used).
    let on_desk = read_again_without_snapshot(&members, home.path(), &desk);
    assert_eq!(on_desk.started_from_checkpoint(), None, "S6: no longer used");
}

/// S6 (found by an adversarial test): a sealed checkpoint seen while a sync tool still copies
/// it (cut short, its name already whole) is not used then, and is used once it is whole: a
/// refusal is kept only while the file stays as it was.
#[test]
fn s6_a_checkpoint_seen_while_it_is_copied_is_used_once_whole() {
    let phone = device_key("phone", 11);
    let (members, home) = compacted(&phone);
    let path = sealed(&members).remove(0);
    let whole = std::fs::read(&path).unwrap();
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    let on_phone = members.open_with(&phone, options(home.path(), &phone)).unwrap();
    assert_eq!(
        on_phone.started_from_checkpoint(),
        None,
        "S6: half of it is not used"
    );
    let unopened = on_phone.unopened_checkpoints();
    assert!(unopened[0].1.contains("cut short"), "{unopened:?}");
    drop(on_phone);
    std::fs::remove_file(home.path().join("phone.snapshot")).unwrap();
    std::fs::write(&path, &whole).unwrap();
    let on_phone = members.open_with(&phone, options(home.path(), &phone)).unwrap();
    assert!(
        on_phone.started_from_checkpoint().is_some(),
        "S6: whole, it is used"
    );
    assert!(on_phone.unopened_checkpoints().is_empty());
}

/// S6 (found by an adversary through the binary): a member that had written nothing (admitted,
/// never holding a lease) compacted a pruned ledger. Its checkpoint ended its log before record
/// 0, so every other host refused it, yet it covered more records than the founder's and
/// replaced it: no host could start from a checkpoint, compact or admit any more. Now such a
/// member writes its record 0 first, and its checkpoint is one every member opens.
#[test]
fn s6_a_member_that_wrote_nothing_compacts_a_checkpoint_every_member_opens() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, home) = ledger_with_runs(&phone);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.compact_with(&CompactOptions::default().prune()).unwrap();
    run(&mut laptop, "run-4", 3);
    drop(laptop);
    // The phone has written nothing: it compacts.
    let mut on_phone = read_all(&members, home.path(), &phone);
    assert!(on_phone.damage().is_empty(), "{:?}", on_phone.damage());
    on_phone.compact().unwrap();
    drop(on_phone);

    // Every member opens what is left; the founder compacts again and admits a device, which
    // starts from a checkpoint and finds every commit.
    let verifier = read_all(&members, home.path(), &members.laptop);
    assert_eq!(
        verifier.verify_checkpoints().unwrap(),
        vec![],
        "S6: every checkpoint left opens"
    );
    drop(verifier);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.compact().unwrap();
    laptop.admit(tablet.device(), &tablet.public()).unwrap();
    drop(laptop);
    let mut on_tablet = members.open_with(&tablet, options(home.path(), &tablet)).unwrap();
    assert!(on_tablet.damage().is_empty(), "{:?}", on_tablet.damage());
    assert!(on_tablet.started_from_checkpoint().is_some());
    for name in ["run-1", "run-2", "run-3", "run-4"] {
        assert!(
            on_tablet.committed_run("milo", name).is_some(),
            "K1: {name} is committed"
        );
    }
    assert!(
        !members.file("phone").is_empty(),
        "S6: the phone wrote its record 0 before its checkpoint"
    );
}

/// S6, K4 (found by an adversary through the binary): compacting records already compacted
/// makes the same checkpoint, and the sealed one shared for it stays; before, each compaction
/// sealed it again under a new nonce, and a daily compaction of a quiet ledger added a file a
/// day that none removed.
#[test]
fn s6_compacting_the_same_records_again_shares_no_second_sealed_checkpoint() {
    let phone = device_key("phone", 11);
    let (members, home) = ledger_with_runs(&phone);
    for _ in 0..3 {
        let mut laptop = read_all(&members, home.path(), &members.laptop);
        laptop.compact().unwrap();
    }
    let shared = sealed(&members);
    assert_eq!(
        shared.len(),
        1,
        "S6: one sealed checkpoint of the same records: {shared:?}"
    );
    let verifier = read_all(&members, home.path(), &phone);
    assert_eq!(verifier.verify_checkpoints().unwrap(), vec![]);
}

/// S6 (found by a test of this session): opening a shared checkpoint reads the ledger again to
/// judge it, which left the relay's reading elsewhere than the ledger's; a member whose copies
/// held none of the shared checkpoints could not compact ("try again").
#[test]
fn s6_a_member_that_opened_no_shared_checkpoint_yet_compacts() {
    let phone = device_key("phone", 11);
    let (members, home) = compacted(&phone);
    let mut on_phone = read_all(&members, home.path(), &phone);
    on_phone.compact().unwrap();
    drop(on_phone);
    let verifier = read_all(&members, home.path(), &members.laptop);
    assert_eq!(verifier.verify_checkpoints().unwrap(), vec![]);
}

/// S6, M2 (found by an adversary through the binary): a device revoked after its last record
/// (`device revoke` without `--from`) is a member where its log ends, and compacted: its
/// checkpoint, which every host refuses (its writer was revoked), replaced the founder's, and
/// its prune left its records in that checkpoint alone; no host could run, admit or compact any
/// more. A revoked device now writes no checkpoint, and the founder's stays.
#[test]
fn s6_m2_a_revoked_device_writes_no_checkpoint_and_replaces_none() {
    use fencepost::ledger::{CheckpointError, LedgerError};

    let phone = device_key("phone", 11);
    let (members, home) = ledger_with_runs(&phone);
    let mut on_phone = read_all(&members, home.path(), &phone);
    run(&mut on_phone, "run-4", 3);
    drop(on_phone);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.compact().unwrap();
    laptop.revoke(phone.device(), None).unwrap();
    drop(laptop);
    let before = sealed(&members);

    let mut on_phone = read_all(&members, home.path(), &phone);
    for options in [CompactOptions::default(), CompactOptions::default().prune()] {
        let refused = on_phone.compact_with(&options).unwrap_err();
        assert!(
            matches!(&refused, LedgerError::Checkpoint(error) if matches!(**error, CheckpointError::WriterNotMember { .. })),
            "S6: a revoked device compacts nothing: {refused}"
        );
    }
    drop(on_phone);
    assert_eq!(sealed(&members), before, "S6: the founder's checkpoint stays");
    assert!(
        !members.file("phone").is_empty(),
        "the phone's records were not pruned"
    );
    let verifier = read_all(&members, home.path(), &members.laptop);
    assert_eq!(verifier.verify_checkpoints().unwrap(), vec![]);
}

/// S6, M2 (found by an adversary through the binary): a device revoked while it compacted left
/// a checkpoint that every host refuses (its writer was revoked) and that no compaction removed,
/// since none ever opened it: `ledger verify` reported it for ever. A member's compaction whose
/// checkpoint contains its records now removes it.
#[test]
fn s6_m2_a_compaction_removes_a_revoked_devices_checkpoint_it_contains() {
    let phone = device_key("phone", 11);
    let (members, home) = ledger_with_runs(&phone);
    let mut on_phone = read_all(&members, home.path(), &phone);
    run(&mut on_phone, "run-4", 3);
    on_phone.compact().unwrap();
    drop(on_phone);
    // The phone's checkpoint lands after the revocation was written (the race, made certain).
    let phones = sealed(&members);
    assert_eq!(phones.len(), 1, "{phones:?}");
    let aside = home.path().join("aside.sealed");
    std::fs::rename(&phones[0], &aside).unwrap();
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.revoke(phone.device(), None).unwrap();
    drop(laptop);
    std::fs::rename(&aside, &phones[0]).unwrap();
    let verifier = read_all(&members, home.path(), &members.laptop);
    let reported = verifier.verify_checkpoints().unwrap();
    assert_eq!(
        reported.len(),
        1,
        "the revoked device's checkpoint is refused: {reported:?}"
    );
    drop(verifier);

    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.compact().unwrap();
    drop(laptop);
    assert!(!phones[0].exists(), "S6: the revoked device's checkpoint went");
    assert_eq!(sealed(&members).len(), 1, "the laptop's own stays");
    let verifier = read_all(&members, home.path(), &members.laptop);
    assert_eq!(verifier.verify_checkpoints().unwrap(), vec![]);
}

/// S6, M2 (found by a cryptography review): a device that a thief admitted after the thief's
/// cut is no member (its admission is void), so its checkpoint is never used, nor by a host
/// that opened it before it read the revocation; before, such a host went on using its copy,
/// since only devices with a cut of their own were judged again.
#[test]
fn s6_m2_a_checkpoint_of_a_device_admitted_after_its_admitters_cut_is_never_used() {
    let (phone, tablet, desk) = (
        device_key("phone", 11),
        device_key("tablet", 21),
        device_key("desk", 41),
    );
    let (members, home) = with_desk(&phone, &desk);
    let mut on_phone = read_all(&members, home.path(), &phone);
    let cut = on_phone.view().frontier().next_seq("phone");
    on_phone.admit(tablet.device(), &tablet.public()).unwrap();
    drop(on_phone);
    compacted_and_opened_by(&members, home.path(), &tablet, &desk);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.revoke(phone.device(), Some(cut)).unwrap();
    drop(laptop);
    let on_desk = read_again_without_snapshot(&members, home.path(), &desk);
    assert_eq!(on_desk.started_from_checkpoint(), None, "S6: no longer used");
    let unopened = on_desk.unopened_checkpoints();
    assert!(
        unopened.iter().any(|(_, why)| why.contains("tablet")),
        "S6: {unopened:?}"
    );
}

/// `revoker` revokes the phone, whose checkpoint the desk opened; the desk, reading again,
/// refuses it. Returns where the revoker's log stood before the revocation.
fn revoked_and_refused(
    members: &Members,
    home: &Path,
    revoker: &Arc<DeviceKey>,
    phone: &Arc<DeviceKey>,
    desk: &Arc<DeviceKey>,
) -> u64 {
    let mut on_revoker = read_all(members, home, revoker);
    let before = on_revoker.view().frontier().next_seq(revoker.device().as_str());
    on_revoker.revoke(phone.device(), None).unwrap();
    drop(on_revoker);
    let on_desk = read_again_without_snapshot(members, home, desk);
    assert_eq!(
        on_desk.started_from_checkpoint(),
        None,
        "S6: its writer is revoked"
    );
    before
}

/// S6, M3 (found by a cryptography review): a checkpoint refused because its writer was
/// revoked is looked at again once the roster changes: when the recovery key cuts the revoker
/// from before that revocation, the writer is a member again and its checkpoint is used again.
/// Before, the refusal was noted for good and the host never used it again.
#[test]
fn s6_m3_a_checkpoint_refused_for_a_revocation_that_stops_counting_is_used_again() {
    let (phone, desk) = (device_key("phone", 11), device_key("desk", 41));
    let (members, home) = with_desk(&phone, &desk);
    compacted_and_opened_by(&members, home.path(), &phone, &desk);
    let cut = revoked_and_refused(&members, home.path(), &members.laptop, &phone, &desk);

    let mut on_desk = read_all(&members, home.path(), &desk);
    let recovered = on_desk
        .revoke_by_recovery(members.laptop.device(), Some(cut), &members.recovery)
        .unwrap();
    assert!(
        recovered.members.contains(phone.device()),
        "M3: the phone is a member again: {:?}",
        recovered.members
    );
    drop(on_desk);
    let mut on_desk = read_again_without_snapshot(&members, home.path(), &desk);
    assert!(
        on_desk.started_from_checkpoint().is_some(),
        "S6: its writer counts again: {:?}",
        on_desk.unopened_checkpoints()
    );
    assert!(on_desk.committed_run("milo", "run-4").is_some());
}

/// S6 (found reading the change again): a host that refused a checkpoint because its writer
/// was revoked keeps refusing it when its copy of the ledger lacks the revocation (the
/// revoker's file gone): a refusal is forgotten only when the reading holds the revocation and
/// finds that it counts no more, never because the reading does not hold it.
#[test]
fn s6_a_refusal_for_a_revocation_stays_while_the_copy_lacks_the_revocation() {
    let (phone, tablet, desk) = (
        device_key("phone", 11),
        device_key("tablet", 21),
        device_key("desk", 41),
    );
    let (members, home) = with_desk(&phone, &desk);
    let mut laptop = read_all(&members, home.path(), &members.laptop);
    laptop.admit(tablet.device(), &tablet.public()).unwrap();
    drop(laptop);
    compacted_and_opened_by(&members, home.path(), &phone, &desk);
    revoked_and_refused(&members, home.path(), &tablet, &phone, &desk);

    let devices = members.folder.path().join("devices");
    let tablet_file = devices.join(fencepost::relay::device_file_name("tablet"));
    std::fs::rename(&tablet_file, home.path().join("tablet-aside")).unwrap();
    drop(read_again_without_snapshot(&members, home.path(), &desk));
    let on_desk = read_again_without_snapshot(&members, home.path(), &desk);
    assert_eq!(
        on_desk.started_from_checkpoint(),
        None,
        "S6: still refused while the copy lacks the revocation"
    );
}
