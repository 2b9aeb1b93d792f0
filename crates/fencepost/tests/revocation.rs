//! Rule M2: revoking a member of a protected ledger. Its records from the cut on are void (held,
//! never a truth: a commit there is no commit, its run is in doubt), a reading that had folded
//! them reads the ledger again, the devices it admitted after the cut are void too, the ledger
//! key rotates to the members that remain, and a revoked device writes nothing.

mod members;

use std::sync::Arc;

use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{Ledger, LedgerError};
use fencepost::protected::{Missing, Origin};
use members::{device_key, in_doubt, open, run, Members};

/// M2: a revocation without a cut voids what the revoked device writes from then on: the
/// revoker rotates the ledger key to the members that remain (not to the revoked one, which
/// cannot open what they write next), the revoked device writes nothing once it has read its
/// revocation, and what it wrote without having read it (a relay that withheld it) is void at
/// every member: never a commit, its run in doubt; what it wrote before stays.
#[test]
fn m2_a_revoked_device_writes_nothing_that_counts_and_reads_nothing_new() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "before", 3);
    founder.sync().unwrap();

    let revoked = founder.revoke(phone.device(), None).unwrap();
    assert_eq!(
        revoked.cut, 4,
        "M2: the phone's length as read: record 0, the agent's naming (S5) and two"
    );
    assert_eq!(revoked.generation, 2);
    assert_eq!(
        revoked.members,
        vec![members.laptop.device().clone(), tablet.device().clone()],
        "M2: the new generation goes to the members that remain"
    );
    run(&mut founder, "after", 4);
    let last = members.file("laptop");
    let last = last.lines().last().unwrap();
    let fields: Vec<&str> = last.split(' ').collect();
    assert_eq!(fields[..2], ["4", "\"laptop\""], "{last}");
    assert_eq!(fields[3], "2", "M2: sealed with the new generation: {last}");

    // The phone wrote on before it read the revocation (its ledger opened before it).
    run(&mut on_phone, "written-after-the-cut", 5);

    let mut on_tablet = members.open(&tablet);
    assert!(
        on_tablet.committed_run("milo", "before").is_some(),
        "M2: before the cut stays"
    );
    assert!(
        on_tablet.committed_run("milo", "after").is_some(),
        "M2: the tablet holds generation 2"
    );
    assert!(
        on_tablet.committed_run("milo", "written-after-the-cut").is_none(),
        "M2: a commit past the cut is no commit"
    );
    assert_eq!(
        in_doubt(&on_tablet, 6),
        vec!["written-after-the-cut".to_owned()],
        "M2: its run is in doubt, never run again by itself"
    );
    assert!(on_tablet.damage().is_empty(), "{:?}", on_tablet.damage());

    let mut reopened = members.open(&phone);
    let refused = reopened.record(&Intent::new("milo", "again", 7, IntentStatus::Pending));
    assert!(
        matches!(refused, Err(LedgerError::Revoked { cut: 4, .. })),
        "M2: a revoked device writes nothing: {refused:?}"
    );
    assert!(
        reopened.committed_run("milo", "after").is_none(),
        "M2: the revoked device cannot open what is sealed after its revocation"
    );
    assert!(
        reopened
            .not_counted()
            .iter()
            .any(|(device, _, why)| device == "laptop" && *why == Missing::KeyNotHeld { generation: 2 }),
        "{:?}",
        reopened.not_counted()
    );
    let revoke_again = founder.revoke(phone.device(), None);
    assert!(
        matches!(revoke_again, Err(LedgerError::Membership { .. })),
        "{revoke_again:?}"
    );
    let myself = founder.revoke(members.laptop.device(), None);
    assert!(
        matches!(myself, Err(LedgerError::Membership { .. })),
        "{myself:?}"
    );
}

/// M2: a cut in the past (a stolen device, revoked from the theft on) voids records a member
/// had folded already: its reading starts over, and the commits past the cut become runs in
/// doubt, as they are for a member that reads the ledger afresh; a device the revoked one
/// admitted after the cut is void too, its commits with it. The frontier still counts the void
/// records (held), so a hand-off that names them does not wait.
#[test]
fn m2_a_cut_in_the_past_turns_folded_commits_into_runs_in_doubt() {
    let phone = device_key("phone", 11);
    let watch = device_key("watch", 31);
    let (members, mut founder) = Members::found(&[&phone]);
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "kept", 3); // records 2, 3 (1 names the agent: S5)
    run(&mut on_phone, "stolen", 4); // records 4, 5
    on_phone.sync().unwrap();
    on_phone.admit(watch.device(), &watch.public()).unwrap(); // record 6
    let mut on_watch = members.open(&watch);
    run(&mut on_watch, "by-the-watch", 5);

    founder.sync().unwrap();
    assert!(founder.committed_run("milo", "stolen").is_some());
    assert!(founder.committed_run("milo", "by-the-watch").is_some());

    founder.revoke(phone.device(), Some(4)).unwrap();
    for (who, reading) in [
        ("the revoker", &mut founder),
        ("a new reading", &mut members.open(&members.laptop)),
    ] {
        assert!(reading.committed_run("milo", "kept").is_some(), "M2: {who}");
        assert!(
            reading.committed_run("milo", "stolen").is_none(),
            "M2: {who}: a commit past the cut is no commit"
        );
        assert!(
            reading.committed_run("milo", "by-the-watch").is_none(),
            "M2: {who}: admitted after the cut, the watch counts for nothing"
        );
        assert_eq!(
            in_doubt(reading, 6),
            vec!["by-the-watch".to_owned(), "stolen".to_owned()],
            "M2: {who}"
        );
        let frontier = reading.view().frontier();
        assert_eq!(frontier.next_seq("phone"), 7, "M2: {who}: void records are held");
        assert_eq!(frontier.next_seq("watch"), 4, "M2: {who}");
    }
}

/// M3: the recovery key changes the members from any host that reads the ledger. The only
/// member's key is lost: a new device, no member and holding no key, admits itself with the
/// recovery key (which unwraps every generation wrapped to it), then reads every commit and
/// writes; it revokes the lost device with the recovery key too, and the new generation goes to
/// it alone. A key that is not the ledger's recovery key changes nothing.
#[test]
fn m3_the_recovery_key_admits_a_new_device_when_the_only_members_key_is_lost() {
    let (members, mut founder) = Members::found(&[]);
    run(&mut founder, "before", 3);
    drop(founder); // its key is lost

    let spare = device_key("spare", 41);
    let mut on_spare = members.open(&spare);
    assert!(on_spare.committed_run("milo", "before").is_none(), "no key yet");
    let forged = DeviceKey::from_secrets(DeviceId::new("recovery").unwrap(), [5; 32], [6; 32]);
    let refused = on_spare.admit_by_recovery(spare.device(), &spare.public(), &forged);
    assert!(
        matches!(refused, Err(LedgerError::Membership { .. })),
        "M3: {refused:?}"
    );
    let refused = on_spare.admit(spare.device(), &spare.public());
    assert!(
        matches!(refused, Err(LedgerError::Membership { .. })),
        "M3: {refused:?}"
    );

    on_spare
        .admit_by_recovery(spare.device(), &spare.public(), &members.recovery)
        .unwrap();
    let mut on_spare = members.open(&spare);
    assert!(
        on_spare.committed_run("milo", "before").is_some(),
        "M3: the recovered device holds generation 1: {:?}",
        on_spare.not_counted()
    );
    run(&mut on_spare, "recovered", 4);

    let revoked = on_spare
        .revoke_by_recovery(members.laptop.device(), None, &members.recovery)
        .unwrap();
    assert_eq!(revoked.members, vec![spare.device().clone()]);
    assert_eq!(revoked.generation, 2);
    run(&mut on_spare, "after", 5);
    let mut again = members.open(&spare);
    for run in ["before", "recovered", "after"] {
        assert!(again.committed_run("milo", run).is_some(), "M3: {run}");
    }
    let members_now = again.members();
    assert!(
        members_now.contains(&(members.laptop.device().clone(), Some(5)))
            && members_now.contains(&(spare.device().clone(), None)),
        "M3: {members_now:?}"
    );
}

/// M2 (found by an adversarial test): a member whose log is empty revokes: the new generation
/// goes to the members that remain, never to the device revoked (it had counted its own revoke
/// as a stranger's); a device revoked from record 0 before it wrote anything writes nothing
/// (its revocation was checked against no log, and its command ran); a cut past the end of the
/// log as read is refused (it left the device its powers), and so is admitting a revoked id
/// again (every generation was wrapped to it, and it stayed revoked).
#[test]
fn m2_an_empty_log_revokes_and_is_revoked_and_cuts_stay_within_what_was_read() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let watch = device_key("watch", 31);
    let (members, mut founder) = Members::found(&[&phone, &tablet, &watch]);
    let mut on_tablet = members.open(&tablet);
    let revoked = on_tablet.revoke(phone.device(), None).unwrap();
    assert_eq!(
        revoked.members,
        vec![
            members.laptop.device().clone(),
            tablet.device().clone(),
            watch.device().clone()
        ],
        "M2: the new generation goes to the members that remain"
    );
    founder.sync().unwrap();
    run(&mut founder, "after", 4);
    let mut on_phone = members.open(&phone);
    assert!(
        on_phone.committed_run("milo", "after").is_none(),
        "M2: sealed with generation 2"
    );

    let mut on_phone = members.open(&phone);
    let refused = on_phone.record(&Intent::new("milo", "never", 5, IntentStatus::Pending));
    assert!(
        matches!(refused, Err(LedgerError::Revoked { cut: 0, .. })),
        "M2: {refused:?}"
    );
    assert!(
        !members.folder.path().join("devices").join("phone.jsonl").exists(),
        "M2: not even its record 0"
    );

    let mut on_watch = members.open(&watch);
    run(&mut on_watch, "by-the-watch", 6);
    founder.sync().unwrap();
    let past = founder.revoke(watch.device(), Some(5));
    assert!(
        matches!(past, Err(LedgerError::Membership { .. })),
        "M2: {past:?}"
    );
    let again = founder.admit(phone.device(), &phone.public());
    assert!(
        matches!(again, Err(LedgerError::Membership { .. })),
        "M2: {again:?}"
    );
    let again = founder.admit_by_recovery(phone.device(), &phone.public(), &members.recovery);
    assert!(
        matches!(again, Err(LedgerError::Membership { .. })),
        "M2: {again:?}"
    );
}

/// M2 (found by an adversarial test): a cut before a rotation the revoked device made leaves
/// what the members sealed with that generation readable (they count, only the revoked device's
/// records are void): nothing is lost, no reading is damaged. Nothing is sealed with a
/// generation that only a revoked device's change gave.
#[test]
fn m2_a_cut_before_a_rotation_keeps_what_members_sealed_with_it() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let watch = device_key("watch", 31);
    let (members, mut founder) = Members::found(&[&phone, &tablet, &watch]);
    let mut on_phone = members.open(&phone);
    assert_eq!(on_phone.revoke(watch.device(), None).unwrap().generation, 2);
    let mut on_tablet = members.open(&tablet);
    run(&mut on_tablet, "sealed-with-2", 3);

    founder.sync().unwrap();
    let revoked = founder.revoke(phone.device(), Some(0)).unwrap();
    assert_eq!(revoked.generation, 3);
    for (who, reading) in [
        ("the revoker", &mut founder),
        ("a new reading", &mut members.open(&members.laptop)),
        ("the tablet", &mut members.open(&tablet)),
    ] {
        assert!(
            reading.committed_run("milo", "sealed-with-2").is_some(),
            "M2: {who}"
        );
        assert!(reading.damage().is_empty(), "M2: {who}: {:?}", reading.damage());
        assert!(
            reading.not_counted().is_empty(),
            "M2: {who}: {:?}",
            reading.not_counted()
        );
    }
    let mut on_tablet = members.open(&tablet);
    run(&mut on_tablet, "sealed-with-3", 4);
    assert_eq!(
        members.last_generation("tablet"),
        3,
        "M2: sealed with the revoker's generation"
    );
}

/// A copy of the ledger folder that holds only the laptop's log as it is now, and `key`'s
/// device reading it: a host whose synced folder lags.
fn lagging_copy(members: &Members, key: &Arc<DeviceKey>) -> (tempfile::TempDir, Ledger) {
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("devices")).unwrap();
    copy_file(members.folder.path(), copy.path(), "laptop");
    let reading = open(copy.path(), key, Origin::Identity(key.public()), members.ledger);
    (copy, reading)
}

/// Copies `device`'s file from the ledger folder `from` into `to`.
fn copy_file(from: &std::path::Path, to: &std::path::Path, device: &str) {
    let name = fencepost::relay::device_file_name(device);
    std::fs::copy(from.join("devices").join(&name), to.join("devices").join(&name)).unwrap();
}

/// M2 (found by an adversarial test): two members revoke one device at once (each side of a
/// lagging sync): two rotations make two keys of generation 2. Every member holds both, and what
/// each sealed counts everywhere once the sync brings the files together.
#[test]
fn m2_two_rotations_to_one_generation_both_open() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let (copy, mut on_tablet) = lagging_copy(&members, &tablet);
    assert_eq!(on_tablet.revoke(phone.device(), None).unwrap().generation, 2);
    run(&mut on_tablet, "by-the-tablet", 3);
    assert_eq!(founder.revoke(phone.device(), None).unwrap().generation, 2);
    run(&mut founder, "by-the-laptop", 4);
    copy_file(copy.path(), members.folder.path(), "tablet");
    copy_file(members.folder.path(), copy.path(), "laptop");
    for folder in [members.folder.path(), copy.path()] {
        for key in [&members.laptop, &tablet] {
            let origin = if key.device() == members.laptop.device() {
                members.genesis.clone()
            } else {
                Origin::Identity(key.public())
            };
            let mut reading = open(folder, key, origin, members.ledger);
            for run in ["by-the-tablet", "by-the-laptop"] {
                assert!(
                    reading.committed_run("milo", run).is_some(),
                    "M2: {} reads {run}: {:?}",
                    key.device(),
                    reading.not_counted()
                );
            }
        }
    }
}

/// M2, M3 (found by an adversarial test): the recovery key revokes a member from before its
/// revocation of another: that revocation counts no more, the other is a member again, and
/// what it writes counts on every member (its run ran once: the next host finds it committed);
/// the revoker gives it the generation made while it was revoked, so it reads what the others
/// sealed with it (it waited for good).
#[test]
fn m3_a_recovery_cut_before_a_members_revocation_makes_the_revoked_one_a_member_again() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let revoked = founder.revoke(phone.device(), None).unwrap();
    assert_eq!(revoked.cut, 0);
    let mut on_tablet = members.open(&tablet);
    run(&mut on_tablet, "sealed-with-2", 2); // generation 2, never given to the phone
    let recovered = on_tablet
        .revoke_by_recovery(members.laptop.device(), Some(4), &members.recovery)
        .unwrap();
    assert_eq!(
        recovered.members,
        vec![phone.device().clone(), tablet.device().clone()],
        "M3: the phone is a member again"
    );
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "once", 3);
    for (who, key) in [("the phone", &phone), ("the tablet", &tablet)] {
        let mut reading = members.open(key);
        assert!(
            reading.committed_run("milo", "sealed-with-2").is_some(),
            "M3: {who}: the revoker gave the phone the generation it lacked: {:?}",
            reading.not_counted()
        );
        assert!(
            reading.committed_run("milo", "once").is_some(),
            "M3: {who}: {:?} {:?}",
            reading.not_counted(),
            reading.members()
        );
    }
}

/// The membership records in `device`'s file of `members`' ledger, in order.
fn membership_records(members: &Members, device: &str) -> Vec<fencepost::membership::MembershipRecord> {
    members
        .file(device)
        .lines()
        .filter_map(|line| {
            let op = fencepost::oplog::OpRecord::from_json(line.as_bytes()).ok()?;
            let Some(fencepost::oplog::SealedContent::Clear(bytes)) =
                op.sealed_record().map(|record| record.content.clone())
            else {
                return None;
            };
            fencepost::membership::MembershipRecord::from_bytes(&bytes).ok()
        })
        .collect()
}

/// The keys of `generation` wrapped to `to` (a device id) in `records`, opened with `key`.
fn unwrapped(
    records: &[fencepost::membership::MembershipRecord],
    ledger: &LedgerId,
    generation: u32,
    to: &str,
    key: &DeviceKey,
) -> Vec<[u8; 32]> {
    use fencepost::membership::Membership;
    records
        .iter()
        .flat_map(|record| match &record.change {
            Membership::Rotate {
                generation: made,
                wraps,
                ..
            } if *made == generation => wraps
                .iter()
                .filter(|(device, _)| device.as_str() == to)
                .map(|(_, wrapped)| wrapped.clone())
                .collect(),
            Membership::Admit { device, wraps, .. } if device.as_str() == to => wraps
                .iter()
                .filter(|(made, _)| *made == generation)
                .map(|(_, wrapped)| wrapped.clone())
                .collect(),
            _ => Vec::new(),
        })
        .filter_map(|wrapped| fencepost::wrap::unwrap(&wrapped, ledger, generation, key).ok())
        .map(|opened| *opened)
        .collect()
}

/// M1, M2, found by a cryptography review: an admit in a log that no admission names (a
/// writer of the relay's), naming a member's key with the writer's own identity, takes
/// nothing: the next generation is wrapped to the member's identity, which the admitted key
/// is the hash of, never to the writer's.
#[test]
fn m2_a_strangers_admit_of_a_members_key_is_given_no_generation() {
    use fencepost::membership::{Membership, MembershipRecord};
    use fencepost::oplog::{OpRecord, SealedContent};

    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    // The writer of the relay: a log of its own under a new id, and a key for the id "phone".
    let stranger = device_key("zzz", 61);
    let thief = device_key("phone", 71);
    let first = OpRecord::sealed(
        Arc::from("zzz"),
        0,
        None,
        SealedContent::Clear(Origin::Identity(stranger.public()).to_bytes().into()),
    );
    let admit = MembershipRecord {
        change: Membership::Admit {
            device: phone.device().clone(),
            key: fencepost::ledger::identity_key(phone.device(), &phone.public()),
            identity: thief.public(),
            wraps: Vec::new(),
        },
        by_recovery: None,
    };
    let second = OpRecord::sealed(
        Arc::from("zzz"),
        1,
        Some(first.op_id),
        SealedContent::Clear(admit.to_bytes().into()),
    )
    .signed(&stranger, &members.ledger, &first.op_id);
    let mut lines = Vec::new();
    first.write_json_line(&mut lines);
    second.write_json_line(&mut lines);
    std::fs::write(members.folder.path().join("devices").join("zzz.jsonl"), lines).unwrap();

    founder.sync().unwrap();
    let revoked = founder.revoke(tablet.device(), None).unwrap();
    assert_eq!(revoked.generation, 2);
    let records = membership_records(&members, "laptop");
    assert!(
        unwrapped(&records, &members.ledger, 2, "phone", &thief).is_empty(),
        "M1: the stranger's identity opens no wrap of the new generation"
    );
    assert_eq!(
        unwrapped(&records, &members.ledger, 2, "phone", &phone).len(),
        1,
        "M2: the phone's own identity opens its wrap"
    );
}

/// The phone runs, the laptop revokes it, and the phone, which has not read its revocation,
/// revokes the tablet: a rotation to its own generation 2, void at every member. The members,
/// the laptop's ledger and the phone's.
fn revoked_phone_rotates() -> (Members, Ledger, Ledger) {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "before", 3);
    founder.sync().unwrap();
    founder.revoke(phone.device(), None).unwrap();
    on_phone.revoke(tablet.device(), None).unwrap();
    (members, founder, on_phone)
}

/// M2, found by a cryptography review: a generation that only a void change gave (a revoked
/// device's rotation, written before it read its revocation) opens what it sealed, and is
/// never given to a device admitted later: that device seals with the members' generation,
/// which the revoked device cannot open.
#[test]
fn m2_a_revoked_devices_rotation_is_never_given_to_a_new_member() {
    let (members, mut founder, _on_phone) = revoked_phone_rotates();
    let phones = unwrapped(
        &membership_records(&members, "phone"),
        &members.ledger,
        2,
        "laptop",
        &members.laptop,
    );
    assert_eq!(
        phones.len(),
        1,
        "the phone wrapped its generation 2 to the laptop"
    );

    founder.sync().unwrap();
    let newcomer = device_key("desk", 31);
    founder.admit(newcomer.device(), &newcomer.public()).unwrap();
    let given = unwrapped(
        &membership_records(&members, "laptop"),
        &members.ledger,
        2,
        "desk",
        &newcomer,
    );
    assert_eq!(given.len(), 1, "M2: the desk is given generation 2, once");
    assert!(
        !given.contains(&phones[0]),
        "M2: never the revoked phone's generation 2"
    );
}

/// M1, found by a cryptography review: `recovery` names the recovery key in membership
/// records, so no device is admitted under it (its wraps would mix with the key's), and an
/// admit of it that a member wrote anyway admits nothing.
#[test]
fn m1_no_device_is_admitted_as_recovery() {
    let (members, mut founder) = Members::found(&[]);
    let impostor = device_key("recovery", 81);
    let refused = founder.admit(impostor.device(), &impostor.public()).unwrap_err();
    assert!(matches!(refused, LedgerError::Membership { .. }), "{refused}");
    assert!(
        !members.file("laptop").contains("recovery"),
        "M1: nothing was written"
    );
    assert!(founder
        .members()
        .iter()
        .all(|(device, _)| device.as_str() != "recovery"));
}

/// M2, found by an adversary through the binary: a revoked device that has not read its
/// revocation rotates to a generation of its own and runs an occurrence under it. A member
/// admitted before any member read that rotation is not given that generation, so it cannot
/// read that commit: the record is missing to it, never settled unread, and a hand-off whose
/// frontier names it waits (exit 7), where the new member once ran the occurrence a second
/// time. One admitted after the laptop read it is given it to open only (`Membership::Open`):
/// it reads the commit as void, its run in doubt, as the members that read it hold it.
#[test]
fn m2_a_void_record_a_member_cannot_open_is_missing_never_settled_unread() {
    let (members, mut founder, mut on_phone) = revoked_phone_rotates();
    // Then it runs an occurrence, sealed with its own generation.
    run(&mut on_phone, "stolen", 4);
    let published = on_phone.pushed();
    let early = device_key("desk", 31);
    founder.admit(early.device(), &early.public()).unwrap();

    founder.sync().unwrap();
    assert_eq!(
        in_doubt(&founder, 5),
        vec!["stolen"],
        "M2: a member that reads it: in doubt"
    );
    let mut on_desk = members.open(&early);
    assert!(on_desk.committed_run("milo", "stolen").is_none());
    let missing = on_desk.not_counted();
    assert!(
        missing
            .iter()
            .any(|(device, _, why)| device == "phone" && matches!(why, Missing::NotOpened(_))),
        "M2: the phone's void records under its own generation 2 (the desk holds the laptop's)
         are missing, and why: {missing:?}"
    );
    let behind = on_desk.behind(&published);
    assert_eq!(
        behind
            .iter()
            .map(|missing| missing.device_id.as_str())
            .collect::<Vec<_>>(),
        vec!["phone"],
        "M2: a hand-off after the phone's run waits for what the desk cannot read"
    );

    let late = device_key("shelf", 41);
    founder.admit(late.device(), &late.public()).unwrap();
    let mut on_shelf = members.open(&late);
    assert!(on_shelf.committed_run("milo", "stolen").is_none());
    assert_eq!(in_doubt(&on_shelf, 5), vec!["stolen"], "M2: read, and void");
    assert!(on_shelf.behind(&published).is_empty());
}

/// M2, found by an adversary through the binary: the phone revokes the tablet, then the laptop
/// revokes the phone from before that revocation. A member's revocation counts whatever its
/// author's cut (rule M1), so the tablet stays revoked: the laptop's new generation is not
/// wrapped to it, and it cannot open what the laptop seals next.
#[test]
fn m2_a_device_revoked_by_a_revoked_member_is_given_no_new_generation() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let mut on_phone = members.open(&phone);
    on_phone.revoke(tablet.device(), None).unwrap();
    founder.sync().unwrap();
    run(&mut founder, "before", 3);
    let revoked = founder.revoke(phone.device(), Some(1)).unwrap();
    assert_eq!(
        revoked.members,
        vec![members.laptop.device().clone()],
        "M2: the tablet stays revoked"
    );
    run(&mut founder, "after", 4);
    let mut on_tablet = members.open(&tablet);
    assert!(on_tablet.committed_run("milo", "after").is_none());
}

/// M2, found by an adversary through the binary: the phone (stolen) revokes the tablet, making
/// generation 2, which the laptop seals a run with; then the laptop revokes the phone from
/// before that rotation, which no longer counts. A desk admitted afterwards is given generation
/// 2 to open only (a `Membership::Open` record beside its admission): it reads the run sealed
/// with it, where its hand-offs once waited for good (and `--accept-damaged` ran it twice),
/// and it never seals with it (nor with anything the phone knows).
#[test]
fn m2_a_member_admitted_after_a_voided_rotation_reads_what_was_sealed_with_it() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let mut on_phone = members.open(&phone);
    on_phone.revoke(tablet.device(), None).unwrap();
    founder.sync().unwrap();
    run(&mut founder, "sealed-with-2", 3);
    founder.revoke(phone.device(), Some(1)).unwrap();
    let desk = device_key("desk", 31);
    founder.admit(desk.device(), &desk.public()).unwrap();
    run(&mut founder, "sealed-with-3", 4);

    let mut on_desk = members.open(&desk);
    for run_id in ["sealed-with-2", "sealed-with-3"] {
        assert!(
            on_desk.committed_run("milo", run_id).is_some(),
            "M2: the desk reads {run_id}: {:?}",
            on_desk.not_counted()
        );
    }
    assert!(on_desk.behind(&founder.pushed()).is_empty());
    run(&mut on_desk, "by-the-desk", 5);
    assert_eq!(
        members.last_generation("desk"),
        3,
        "M2: the desk seals with generation 3, never with 2"
    );
}

/// M2, found by an adversary through the binary (a database restored from a copy): a device
/// revoked from the end of its log as read, whose log then lost its last records, once wrote
/// on below its cut, and those records counted. A device revoked at all writes nothing.
#[test]
fn m2_a_revoked_device_whose_log_lost_records_writes_nothing() {
    let phone = device_key("phone", 11);
    let (members, mut founder) = Members::found(&[&phone]);
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "one", 3);
    drop(on_phone);
    founder.sync().unwrap();
    let revoked = founder.revoke(phone.device(), None).unwrap();
    assert_eq!(revoked.cut, 4);
    // The phone's file loses its last two records (a restore, a relay's writer).
    let name = fencepost::relay::device_file_name("phone");
    let path = members.folder.path().join("devices").join(name);
    let kept: String = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .take(2)
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&path, kept).unwrap();

    let mut on_phone = members.open(&phone);
    let refused = on_phone.record(&Intent::new("milo", "below-the-cut", 5, IntentStatus::Pending));
    assert!(
        matches!(refused, Err(LedgerError::Revoked { cut: 4, .. })),
        "M2: {refused:?}"
    );
}

/// M2 (found by a cryptography review, and confirmed by an adversary through the binary): the
/// laptop revokes the phone while the tablet, whose copy of the folder lags, revokes the watch.
/// Each wrapped its new generation to the device the other revoked; once a member has read
/// both, it writes a new generation, wrapped to the members that remain, before it seals
/// anything more: neither revoked device opens what it writes next, the members do.
#[test]
fn m2_two_revocations_at_once_leave_no_revoked_device_a_key_sealed_with() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let watch = device_key("watch", 31);
    let (members, mut founder) = Members::found(&[&phone, &tablet, &watch]);
    let (copy, mut on_tablet) = lagging_copy(&members, &tablet);
    assert_eq!(on_tablet.revoke(watch.device(), None).unwrap().generation, 2);
    let revoked = founder.revoke(phone.device(), None).unwrap();
    assert_eq!(revoked.generation, 2);
    assert!(
        revoked.members.contains(watch.device()),
        "the laptop has not read the watch's revocation"
    );
    copy_file(copy.path(), members.folder.path(), "tablet");
    drop(on_tablet);

    founder.sync().unwrap();
    run(&mut founder, "after-both", 5);
    assert_eq!(
        members.last_generation("laptop"),
        3,
        "M2: a new generation before sealing: {}",
        members.file("laptop")
    );
    for revoked in [&phone, &watch] {
        let mut reading = members.open(revoked);
        assert!(
            reading.committed_run("milo", "after-both").is_none(),
            "M2: {} opened what was sealed after its revocation",
            revoked.device()
        );
    }
    let mut on_tablet = members.open(&tablet);
    assert!(
        on_tablet.committed_run("milo", "after-both").is_some(),
        "M2: {:?}",
        on_tablet.not_counted()
    );
    run(&mut on_tablet, "by-the-tablet", 6);
    assert_eq!(
        members.last_generation("tablet"),
        3,
        "M2: one new generation is enough"
    );
    assert!(founder.sync().is_ok());
    assert!(founder.committed_run("milo", "by-the-tablet").is_some());
}
