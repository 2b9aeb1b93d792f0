//! Rule M1, key commitment (found by a cryptography review: "no key commitment"): a rotation
//! names the commitment of the key it makes, and a member holds a key it unwraps only when a
//! rotation read commits to it. A member that wraps one key to some members and another to
//! others (so that they cannot read each other's records, or read one ciphertext two ways)
//! gives the others nothing: they keep sealing with the generation before, which every member
//! reads.

mod members;

use std::num::NonZeroU32;
use std::sync::Arc;

use fencepost::identity::DeviceKey;
use fencepost::ledger::Ledger;
use fencepost::membership::{Membership, MembershipRecord};
use fencepost::oplog::SealedContent;
use fencepost::seal::LedgerKey;
use fencepost::wrap::{wrap_with_seed, Wrapped};

use members::{device_key, run, Members};

fn key(generation: u32, byte: u8) -> LedgerKey {
    LedgerKey::new(NonZeroU32::new(generation).unwrap(), [byte; 32])
}

/// `key` wrapped to `to` in `members`' ledger.
fn wrapped(members: &Members, key: &LedgerKey, to: &DeviceKey) -> Wrapped {
    wrap_with_seed(
        key.bytes(),
        &members.ledger,
        key.generation(),
        to.device(),
        &to.public(),
        [9; 32],
    )
    .unwrap()
}

/// A rotation to `key`, committed to, wrapped to each of `to` and to the recovery key, as an
/// honest member writes it.
fn rotation(members: &Members, key: &LedgerKey, to: &[&Arc<DeviceKey>]) -> Membership {
    let mut wraps: Vec<_> = to
        .iter()
        .map(|device| (device.device().clone(), wrapped(members, key, device)))
        .collect();
    wraps.push((
        members.recovery.device().clone(),
        wrapped(members, key, &members.recovery),
    ));
    Membership::Rotate {
        generation: key.generation(),
        commitment: key.commitment(&members.ledger),
        wraps,
    }
}

/// A member writes `change` into its log, as a member turned hostile (or a thief of its key)
/// can.
fn write(founder: &mut Ledger, change: Membership) {
    founder
        .append_membership(&MembershipRecord {
            change,
            by_recovery: None,
        })
        .unwrap();
}

/// The phone runs an occurrence; the founder, reading again, must find it committed.
fn phone_run_is_read_by_the_founder(members: &Members, phone: &Arc<DeviceKey>, sealed_with: u64) {
    let mut on_phone = members.open(phone);
    run(&mut on_phone, "run-1", 1);
    drop(on_phone);
    assert_eq!(
        members.last_generation(phone.device().as_str()),
        serde_json::json!(sealed_with),
        "M1: the phone seals with a generation a rotation committed to"
    );
    let mut founder = members.open(&members.laptop);
    assert!(
        founder.committed_run("milo", "run-1").is_some(),
        "M1: the founder reads what the phone sealed; damage: {:?}",
        founder.damage()
    );
}

#[test]
fn m1_a_rotation_that_wraps_another_key_than_it_commits_to_gives_nothing() {
    let phone = device_key("phone", 11);
    let (members, mut founder) = Members::found(&[&phone]);
    let committed = key(2, 0x21);
    let other = key(2, 0x22);
    write(
        &mut founder,
        Membership::Rotate {
            generation: 2,
            commitment: committed.commitment(&members.ledger),
            wraps: vec![
                (
                    members.laptop.device().clone(),
                    wrapped(&members, &committed, &members.laptop),
                ),
                (phone.device().clone(), wrapped(&members, &other, &phone)),
                (
                    members.recovery.device().clone(),
                    wrapped(&members, &committed, &members.recovery),
                ),
            ],
        },
    );
    drop(founder);
    phone_run_is_read_by_the_founder(&members, &phone, 1);
}

#[test]
fn m1_an_admission_gives_only_keys_a_rotation_committed_to() {
    let phone = device_key("phone", 11);
    let (members, mut founder) = Members::found(&[]);
    // An admission of the phone that also gives it a generation no rotation made.
    founder.admit(phone.device(), &phone.public()).unwrap();
    let admission = members
        .file("laptop")
        .lines()
        .filter_map(|line| {
            let op = fencepost::oplog::OpRecord::from_json(line.as_bytes()).ok()?;
            let Some(SealedContent::Clear(bytes)) = op.sealed_record().map(|record| record.content.clone())
            else {
                return None;
            };
            MembershipRecord::from_bytes(&bytes).ok()
        })
        .find_map(|record| match record.change {
            change @ Membership::Admit { .. } => Some(change),
            _ => None,
        });
    let Some(Membership::Admit {
        device,
        key: log_key,
        identity,
        mut wraps,
    }) = admission
    else {
        panic!("the founder's admission of the phone");
    };
    wraps.push((9, wrapped(&members, &key(9, 0x99), &phone)));
    write(
        &mut founder,
        Membership::Admit {
            device,
            key: log_key,
            identity,
            wraps,
        },
    );
    drop(founder);
    phone_run_is_read_by_the_founder(&members, &phone, 1);
}

/// M1: an admission read before the rotation that commits to the generation it gives (the
/// rotation's author's log read after the admitter's) gives it once the rotation is read.
#[test]
fn m1_an_admission_read_before_its_rotation_gives_its_key_once_the_rotation_is_read() {
    let tablet = device_key("tablet", 21);
    let zeta = device_key("zeta", 41);
    let desk = device_key("desk", 31);
    let (members, founder) = Members::found(&[&tablet, &zeta]);
    drop(founder);
    // Zeta rotates (one key to every member) and seals a run with it.
    let second = key(2, 0x02);
    let mut on_zeta = members.open(&zeta);
    write(
        &mut on_zeta,
        rotation(&members, &second, &[&members.laptop, &tablet, &zeta]),
    );
    run(&mut on_zeta, "run-1", 1);
    drop(on_zeta);
    assert_eq!(members.last_generation("zeta"), serde_json::json!(2));
    let mut on_tablet = members.open(&tablet);
    on_tablet.admit(desk.device(), &desk.public()).unwrap();
    drop(on_tablet);
    let mut on_desk = members.open(&desk);
    assert!(
        on_desk.committed_run("milo", "run-1").is_some(),
        "M1: the desk opens what zeta sealed with generation 2; damage: {:?}",
        on_desk.damage()
    );
    run(&mut on_desk, "run-2", 2);
    drop(on_desk);
    assert_eq!(members.last_generation("desk"), serde_json::json!(2));
}

/// M1, M2 (found by the review of key commitment): a member that admitted a device before it
/// read the revocation of a thief gave it the thief's generation, which only the thief's void
/// rotation commits to; the device opens what was sealed with it, and never seals with it.
#[test]
fn m1_m2_a_generation_only_a_void_rotation_commits_to_is_never_sealed_with() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let desk = device_key("desk", 31);
    let (members, founder) = Members::found(&[&phone, &tablet]);
    drop(founder);
    // The phone, stolen, rotates to a generation of its own, wrapped to every member.
    let stolen = key(100, 0x64);
    let mut on_phone = members.open(&phone);
    write(
        &mut on_phone,
        rotation(&members, &stolen, &[&members.laptop, &phone, &tablet]),
    );
    drop(on_phone);
    // The tablet reads it and admits the desk, giving it every generation it holds.
    let mut on_tablet = members.open(&tablet);
    on_tablet.admit(desk.device(), &desk.public()).unwrap();
    drop(on_tablet);
    // The laptop, whose copy of the folder lacks the phone's log, revokes the phone whole.
    let devices = members.folder.path().join("devices");
    let phone_file = devices.join(fencepost::relay::device_file_name("phone"));
    let aside = members.folder.path().join("phone.aside");
    std::fs::rename(&phone_file, &aside).unwrap();
    let mut laptop = members.open(&members.laptop);
    let revoked = laptop.revoke(phone.device(), Some(0)).unwrap();
    assert_eq!(revoked.generation, 2, "numbered after what the laptop read");
    drop(laptop);
    std::fs::rename(&aside, &phone_file).unwrap();
    // The desk reads everything: the phone's rotation is void.
    let mut on_desk = members.open(&desk);
    run(&mut on_desk, "run-1", 1);
    drop(on_desk);
    assert_eq!(
        members.last_generation("desk"),
        serde_json::json!(2),
        "M2: the desk seals with the laptop's generation, never the thief's"
    );
    let mut laptop = members.open(&members.laptop);
    assert!(
        laptop.committed_run("milo", "run-1").is_some(),
        "{:?}",
        laptop.damage()
    );
}

#[test]
fn m1_a_rotation_without_a_commitment_is_not_read() {
    // Tag 2: the rotation fenceposts before the commitment wrote.
    let mut bytes = vec![2];
    bytes.extend_from_slice(&1u32.to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes.push(0);
    let refused = MembershipRecord::from_bytes(&bytes).unwrap_err();
    assert!(refused.contains("without a commitment"), "{refused}");
}

/// A record in the clear after record 0 is a membership change, and one that this version
/// does not read (the uncommitted rotation of an earlier fencepost, a change of a later one)
/// is missing, naming the record and why: what it changed is never taken as no change, and the
/// runs that need it wait. Before, it was skipped with a warning in the log and counted as
/// read. Its log's other records still count, and the ledger is not stopped.
#[test]
fn m1_a_membership_record_this_version_does_not_read_is_missing_never_no_change() {
    use fencepost::oplog::OpRecord;
    use fencepost::protected::Missing;
    use fencepost::relay::Frontier;

    let (members, mut founder) = Members::found(&[]);
    run(&mut founder, "run-1", 1);
    drop(founder);
    let relay = members::relay(members.folder.path());
    let laptop = members.laptop.device().as_str();
    let log: Vec<OpRecord> = relay
        .pull(&Frontier::default())
        .unwrap()
        .ops
        .into_iter()
        .filter(|op| &*op.device_id == laptop)
        .collect();
    let last = log.last().unwrap();
    // Tag 2, a rotation as fenceposts before the commitment wrote it, signed by the founder.
    let mut bytes = vec![2];
    bytes.extend_from_slice(&2u32.to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    let old = OpRecord::sealed(
        Arc::clone(&last.device_id),
        last.seq + 1,
        Some(last.op_id),
        SealedContent::Clear(bytes.into()),
    )
    .signed(&members.laptop, &members.ledger, &log[0].op_id);
    relay.push(&[old]).unwrap();

    let mut founder = members.open(&members.laptop);
    let not_counted = founder.not_counted();
    assert!(
        not_counted.iter().any(|(device, seq, why)| device == laptop
            && *seq == last.seq + 1
            && matches!(why, Missing::NotAChange(why) if why.contains("without a commitment"))),
        "M1: a change this version does not read is missing; not counted: {not_counted:?}"
    );
    assert!(founder.damage().is_empty(), "{:?}", founder.damage());
    assert!(
        founder.committed_run("milo", "run-1").is_some(),
        "the records before it count"
    );
}
