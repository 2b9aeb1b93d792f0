//! Rule S2: a device signs only what it wrote. Its next append signs a head that covers its
//! whole log, so records that a writer of the relay put into its log (a forged membership
//! change, altered bytes) must never be covered by it: the append is refused, the forged
//! records count for nothing, and the device's own records stay its own.

mod members;

use std::io::Write as _;
use std::sync::Arc;

use fencepost::lease::{Intent, IntentStatus};
use fencepost::membership::{Membership, MembershipRecord};
use fencepost::oplog::{OpRecord, SealedContent};
use fencepost::protected::Origin;
use fencepost::roster::KeyId;
use members::{device_key, run, Members};

/// The last record of `device`'s file in `members`' folder.
fn last_record(members: &Members, device: &str) -> OpRecord {
    let file = members.file(device);
    OpRecord::from_json(file.lines().last().unwrap().as_bytes()).unwrap()
}

/// Appends `op` to `device`'s file, as a writer of the folder would.
fn append_line(members: &Members, device: &str, op: &OpRecord) {
    let name = fencepost::relay::device_file_name(device);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(members.folder.path().join("devices").join(name))
        .unwrap();
    let mut line = Vec::new();
    op.write_json_line(&mut line);
    file.write_all(&line).unwrap();
}

/// S2, found by an adversary through the binary: a writer of the folder appends to the phone's
/// log a well-formed membership record (an admit of its own key) with no head. The phone's next
/// append would have signed a head over it, and the stranger would have been a member; it is
/// refused instead, naming the record, and the stranger is no member anywhere.
#[test]
fn s2_a_device_never_signs_a_record_it_did_not_write_into_its_log() {
    let phone = device_key("phone", 11);
    let (members, mut founder) = Members::found(&[&phone]);
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "before", 3);
    drop(on_phone);

    let stranger = device_key("stranger", 41);
    let origin = Origin::Identity(stranger.public());
    let key = OpRecord::sealed(
        Arc::from("stranger"),
        0,
        None,
        SealedContent::Clear(origin.to_bytes().into()),
    )
    .op_id;
    let admit = MembershipRecord {
        change: Membership::Admit {
            device: stranger.device().clone(),
            key: KeyId(key.0),
            identity: stranger.public(),
            wraps: Vec::new(),
        },
        by_recovery: None,
    };
    let last = last_record(&members, "phone");
    let forged = OpRecord::sealed(
        Arc::from("phone"),
        last.seq + 1,
        Some(last.op_id),
        SealedContent::Clear(admit.to_bytes().into()),
    );
    append_line(&members, "phone", &forged);

    let mut on_phone = members.open(&phone);
    let refused = on_phone.record(&Intent::new("milo", "after", 4, IntentStatus::Pending));
    let error = refused.expect_err("S2: the append is refused");
    assert!(
        error.to_string().contains(&format!(
            "record {} of this device's log carries no head",
            forged.seq
        )),
        "S2: the refusal names the record: {error}"
    );
    assert_eq!(
        last_record(&members, "phone"),
        forged,
        "S2: nothing was appended after it"
    );
    assert!(
        on_phone.pushed().next_seq("phone") <= forged.seq,
        "S2: what a holder would publish names no record the phone did not sign (found by an
         adversary: the refused record was published, and the next holder waited on it)"
    );
    founder.sync().unwrap();
    assert!(
        founder
            .members()
            .iter()
            .all(|(device, _)| device.as_str() != "stranger"),
        "S2: the stranger is no member: {:?}",
        founder.members()
    );
}
