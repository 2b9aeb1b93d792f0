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
use fencepost::membership::{Membership, MembershipRecord, RECOVERY};
use fencepost::oplog::SealedContent;
use fencepost::seal::LedgerKey;
use fencepost::wrap::{wrap_with_seed, Wrapped};

use members::{device_key, run, Members};

fn key(generation: u32, byte: u8) -> LedgerKey {
    LedgerKey::new(NonZeroU32::new(generation).unwrap(), [byte; 32])
}

/// `key` wrapped to `to` in `members`' ledger.
fn wrapped(members: &Members, key: &LedgerKey, to: &Arc<DeviceKey>) -> Wrapped {
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

/// The founder writes `change` into its log, as a member turned hostile (or a thief of its key)
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
        members.last_generation("phone"),
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
    let recovery = Arc::new(DeviceKey::from_secrets(
        fencepost::id::DeviceId::new(RECOVERY).unwrap(),
        [0; 32],
        [0; 32],
    ));
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
                    recovery.device().clone(),
                    wrapped(&members, &committed, &recovery),
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
