//! Rules R1 and M2 on a protected ledger in a database that went back (restored from an older
//! copy): a site whose snapshot read more writes back what the database lost, the membership
//! changes among it (a revocation lost for good let the revoked device run again).

use std::path::Path;
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{Ledger, LedgerError, LedgerOptions, Protected};
use fencepost::protected::Origin;
use fencepost::relay::{ProblemKind, Relay, SqliteRelay};

fn device_key(device: &str, secret: u8) -> Arc<DeviceKey> {
    Arc::new(DeviceKey::from_secrets(
        DeviceId::new(device).unwrap(),
        [secret; 32],
        [secret + 1; 32],
    ))
}

fn relay(database: &Path) -> Arc<dyn Relay> {
    Arc::new(SqliteRelay::open(database).unwrap())
}

/// `key`'s device's reading of the protected ledger `ledger` in `database`, with a snapshot and
/// a seen file of its own in `dir`.
fn member(
    dir: &Path,
    database: &Path,
    key: &Arc<DeviceKey>,
    ledger: LedgerId,
    clock: &ManualClock,
) -> Ledger {
    let protected = Protected {
        ledger,
        device_key: Arc::clone(key),
        origin: Origin::Identity(key.public()),
        keys: Vec::new(),
        members: Vec::new(),
    };
    let name = key.device().as_str();
    let options = LedgerOptions::default()
        .protected(protected)
        .snapshot(dir.join(format!("{name}.snapshot")))
        .seen_file(dir.join(format!("{name}.seen")));
    Ledger::open_with(name, clock.wall_clock(), relay(database), options).unwrap()
}

/// Copies the SQLite file `from` (with its write-ahead log: a writer has it open) to `to`.
fn copy_database(from: &Path, to: &Path) {
    for suffix in ["", "-wal"] {
        let (source, target) = (
            format!("{}{suffix}", from.display()),
            format!("{}{suffix}", to.display()),
        );
        let _ = std::fs::remove_file(&target);
        if Path::new(&source).exists() {
            std::fs::copy(&source, &target).unwrap();
        }
    }
    let _ = std::fs::remove_file(format!("{}-shm", to.display()));
}

/// R1, M2, found by adversaries through the binary (PostgreSQL restored from a dump, a SQLite
/// file put back): the laptop revokes the phone, the tablet reads the revocation, then the
/// database goes back to a copy made before it. The tablet's repair does not write the
/// laptop's revocation back as its own (a change counts by its author: a thief's revocation
/// written back by a repairer once revoked an honest member); the laptop's repair writes its
/// own back: every reader finds the phone revoked again, where it once ran on as a member, and
/// the phone refuses to run once it has read it.
#[test]
fn r1_m2_a_revocation_a_database_lost_is_written_back_by_its_author() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("ledger.db");
    let clock = ManualClock::new(1_764_400_000_000);
    let (laptop, phone, tablet) = (
        device_key("laptop", 1),
        device_key("phone", 11),
        device_key("tablet", 21),
    );
    let laptop_options = || {
        LedgerOptions::default()
            .snapshot(dir.path().join("laptop.snapshot"))
            .seen_file(dir.path().join("laptop.seen"))
    };
    let (mut founder, founded) = Ledger::found(
        Arc::clone(&laptop),
        clock.wall_clock(),
        relay(&database),
        laptop_options(),
    )
    .unwrap();
    founder.admit(phone.device(), &phone.public()).unwrap();
    founder.admit(tablet.device(), &tablet.public()).unwrap();
    let ledger = founded.genesis.ledger_id();
    drop(member(dir.path(), &database, &tablet, ledger, &clock));
    let copy = dir.path().join("ledger.copy");
    copy_database(&database, &copy);

    founder.revoke(phone.device(), None).unwrap();
    drop(founder);
    let on_tablet = member(dir.path(), &database, &tablet, ledger, &clock);
    assert!(revoked(&on_tablet, &phone));
    drop(on_tablet);
    copy_database(&copy, &database);

    let mut on_tablet = member(dir.path(), &database, &tablet, ledger, &clock);
    assert!(
        on_tablet
            .damage()
            .iter()
            .all(|problem| problem.kind == ProblemKind::WentBack)
            && !on_tablet.damage().is_empty(),
        "{:?}",
        on_tablet.damage()
    );
    on_tablet.repair_went_back().unwrap().expect("repaired");
    assert!(on_tablet.damage().is_empty(), "{:?}", on_tablet.damage());
    drop(on_tablet);
    let fresh = tempfile::tempdir().unwrap();
    assert!(
        !revoked(&member(fresh.path(), &database, &phone, ledger, &clock), &phone),
        "M2: the tablet wrote no change of the laptop's as its own"
    );

    let protected = Protected {
        ledger,
        device_key: Arc::clone(&laptop),
        origin: Origin::Genesis(founded.genesis.clone()),
        keys: Vec::new(),
        members: Vec::new(),
    };
    let options = laptop_options().protected(protected);
    let mut founder = Ledger::open_with("laptop", clock.wall_clock(), relay(&database), options).unwrap();
    founder.repair_went_back().unwrap().expect("repaired");
    drop(founder);
    let fresh = tempfile::tempdir().unwrap();
    let mut on_phone = member(fresh.path(), &database, &phone, ledger, &clock);
    assert!(
        revoked(&on_phone, &phone),
        "M2: the phone is revoked again: {:?}",
        on_phone.members()
    );
    let refused = on_phone.record(&Intent::new("milo", "after", 5, IntentStatus::Pending));
    assert!(
        matches!(refused, Err(LedgerError::Revoked { .. })),
        "M2: {refused:?}"
    );
}

/// Whether `reader` reads `device` as revoked.
fn revoked(reader: &Ledger, device: &DeviceKey) -> bool {
    reader
        .members()
        .iter()
        .any(|(member, cut)| member == device.device() && cut.is_some())
}
