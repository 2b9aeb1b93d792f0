//! Rule I1 on a protected ledger: a device whose key signed two logs (a cloned data directory,
//! a host that wrote on after its log went back) is damage of that device, neither log is
//! folded as a second truth, and a site that saw the first keeps the proof.

mod members;

use std::path::Path;
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::identity::DeviceKey;
use fencepost::ledger::{Ledger, LedgerOptions, Protected};
use fencepost::protected::{Equivocation, Origin};

use members::{device_key, run, Members};

/// `key`'s device's reading of the ledger, remembering what it saw in `seen` (no snapshot: it
/// reads the ledger from the start each time).
fn open_seeing(members: &Members, key: &Arc<DeviceKey>, seen: &Path) -> Ledger {
    let protected = Protected {
        ledger: members.ledger,
        device_key: Arc::clone(key),
        origin: Origin::Identity(key.public()),
        keys: Vec::new(),
        members: Vec::new(),
    };
    let clock = ManualClock::new(1_764_400_000_000);
    let options = LedgerOptions::default().protected(protected).seen_file(seen);
    Ledger::open_with(
        key.device().as_str(),
        clock.wall_clock(),
        members::relay(members.folder.path()),
        options,
    )
    .unwrap()
}

fn laptop_file(members: &Members) -> std::path::PathBuf {
    members
        .folder
        .path()
        .join("devices")
        .join(fencepost::relay::device_file_name("laptop"))
}

fn committed(ledger: &mut Ledger, run: &str) -> bool {
    ledger.committed_run("milo", run).is_some()
}

/// I1: the laptop's folder copy lags on a second host that runs with a copy of the laptop's
/// data directory; it writes another record where the laptop wrote one, and the sync brings its
/// file over the laptop's. The phone, which had read the laptop's, reports the laptop's log as
/// damage, keeps both signed heads and the other chain as evidence that checks, and the
/// evidence altered no longer checks.
#[test]
fn i1_two_logs_signed_by_one_key_are_damage_and_kept_as_evidence() {
    let phone = device_key("phone", 3);
    let (members, mut laptop) = Members::found(&[&phone]);
    let seen_dir = tempfile::tempdir().unwrap();
    let seen = seen_dir.path().join("phone.seen");
    run(&mut laptop, "run-a", 1);
    let before = std::fs::read(laptop_file(&members)).unwrap();
    run(&mut laptop, "run-b", 1);
    drop(laptop);
    {
        let mut reader = open_seeing(&members, &phone, &seen);
        reader.sync().unwrap();
        assert!(reader.damage().is_empty(), "{:?}", reader.damage());
        assert!(committed(&mut reader, "run-b"));
    }

    // The clone's copy of the folder lags: it never had run-b's records.
    std::fs::write(laptop_file(&members), &before).unwrap();
    let mut clone = members.open(&members.laptop);
    run(&mut clone, "run-c", 1);
    drop(clone);

    let mut reader = open_seeing(&members, &phone, &seen);
    let damage = reader.damage();
    let laptop_damage: Vec<_> = damage
        .iter()
        .filter(|problem| problem.device_id.as_deref() == Some("laptop"))
        .collect();
    assert_eq!(laptop_damage.len(), 1, "I1: {damage:?}");
    let detail = laptop_damage[0].detail.clone();
    assert!(detail.contains("signed both"), "I1: {detail}");
    assert!(
        !(committed(&mut reader, "run-b") && committed(&mut reader, "run-c")),
        "I1: two logs of one device folded as two truths"
    );

    let files: Vec<_> = std::fs::read_dir(seen_dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("equivocation-") && name.contains("-laptop-")
        })
        .collect();
    assert_eq!(files.len(), 1, "I1: the evidence is kept");
    assert!(detail.contains(&files[0].display().to_string()), "{detail}");
    let evidence: Equivocation = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    let public = members.laptop.public();
    evidence.verify(&members.ledger, &public).unwrap();
    assert_ne!(evidence.seen.op_id, evidence.found.op_id);

    // Altered, it proves nothing.
    let mut other_head = evidence.clone();
    other_head.found.signature = other_head.seen.signature.clone();
    assert!(other_head.verify(&members.ledger, &public).is_err());
    let mut same_record = evidence.clone();
    same_record.seen.op_id = same_record.found.op_id;
    assert!(same_record.verify(&members.ledger, &public).is_err());
    let mut cut = evidence.clone();
    cut.lines.pop();
    assert!(cut.verify(&members.ledger, &public).is_err());
    assert!(evidence.verify(&members.ledger, &phone.public()).is_err());
}
