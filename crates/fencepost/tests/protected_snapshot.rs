//! Rule S3: a protected ledger's host keeps a snapshot, as an unprotected one does, so that a
//! run reads only what follows it. It holds what the host folded (in the clear, on the host)
//! and never a key of the ledger; a revocation read after it, voiding what it holds, starts it
//! over.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use fencepost::clock::ManualClock;
use fencepost::genesis::Genesis;
use fencepost::id::DeviceId;
use fencepost::identity::DeviceKey;
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{identity_key, Ledger, LedgerOptions, Protected};
use fencepost::protected::Origin;
use fencepost::relay::FsRelay;
use fencepost::roster::{Change, KeyId, MembershipChange, Position};
use fencepost::seal::LedgerKey;

const KEY: [u8; 32] = [0xa7; 32];

fn device_key(device: &str, secret: u8) -> Arc<DeviceKey> {
    Arc::new(DeviceKey::from_secrets(
        DeviceId::new(device).unwrap(),
        [secret; 32],
        [secret + 1; 32],
    ))
}

/// A ledger founded by `laptop`, its key and the admission of `others` given by the caller.
struct Given {
    folder: tempfile::TempDir,
    genesis: Genesis,
    others: Vec<Arc<DeviceKey>>,
}

impl Given {
    fn new(laptop: &DeviceKey, others: &[&Arc<DeviceKey>]) -> Self {
        Self {
            folder: tempfile::tempdir().unwrap(),
            genesis: Genesis {
                nonce: [9; 16],
                founder: laptop.device().clone(),
                founder_key: laptop.public(),
                recovery_key: device_key("recovery", 40).public(),
            },
            others: others.iter().map(|key| Arc::clone(key)).collect(),
        }
    }

    fn protected(&self, key: &Arc<DeviceKey>) -> Protected {
        let origin = if key.device() == &self.genesis.founder {
            Origin::Genesis(self.genesis.clone())
        } else {
            Origin::Identity(key.public())
        };
        let members = self
            .others
            .iter()
            .map(|other| {
                MembershipChange::by_recovery(
                    Position {
                        device: self.genesis.founder.clone(),
                        seq: 0,
                    },
                    KeyId([0; 32]),
                    Change::Admit {
                        device: other.device().clone(),
                        key: identity_key(other.device(), &other.public()),
                    },
                )
            })
            .collect();
        Protected {
            ledger: self.genesis.ledger_id(),
            device_key: Arc::clone(key),
            origin,
            keys: vec![LedgerKey::new(NonZeroU32::MIN, KEY)],
            members,
        }
    }

    /// `key`'s device's ledger, with the snapshot `snapshot` when given.
    fn open(&self, key: &Arc<DeviceKey>, snapshot: Option<&Path>) -> Ledger {
        let mut options = LedgerOptions::default().protected(self.protected(key));
        if let Some(path) = snapshot {
            options = options.snapshot(path);
        }
        let relay = Arc::new(FsRelay::open(self.folder.path()).unwrap());
        let clock = ManualClock::new(1_764_400_000_000);
        Ledger::open_with(key.device().as_str(), clock.wall_clock(), relay, options).unwrap()
    }
}

fn commit(ledger: &mut Ledger, run: &str) {
    for status in [IntentStatus::Pending, IntentStatus::Committed] {
        ledger.record(&Intent::new("milo", run, 3, status)).unwrap();
    }
}

/// Every byte of the files whose names begin with `path`'s (the database and its journal).
fn snapshot_bytes(path: &Path) -> Vec<u8> {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(path.parent().unwrap()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with(&name) {
            bytes.extend(std::fs::read(entry.path()).unwrap());
        }
    }
    bytes
}

/// S3: a member resumes from its snapshot and reads only what follows it (another member's
/// commit among it); the snapshot holds no key of the ledger, as bytes, hex or base64.
#[test]
fn s3_a_protected_ledger_resumes_from_its_snapshot_which_holds_no_key() {
    let laptop = device_key("laptop", 1);
    let phone = device_key("phone", 11);
    let given = Given::new(&laptop, &[&phone]);
    let snapshots = tempfile::tempdir().unwrap();
    let snapshot = snapshots.path().join("laptop.snapshot");
    let mut on_laptop = given.open(&laptop, Some(&snapshot));
    for run in ["run-1", "run-2"] {
        commit(&mut on_laptop, run);
    }
    drop(on_laptop);
    let mut on_laptop = given.open(&laptop, Some(&snapshot));
    assert!(on_laptop.resumed_from_snapshot(), "S3: resumed");
    assert!(
        on_laptop.committed_run("milo", "run-2").is_some(),
        "S3: a stored run"
    );
    drop(on_laptop);

    let mut on_phone = given.open(&phone, None);
    commit(&mut on_phone, "run-3");
    let mut on_laptop = given.open(&laptop, Some(&snapshot));
    assert!(on_laptop.resumed_from_snapshot(), "S3: resumed");
    assert!(
        on_laptop.committed_run("milo", "run-3").is_some(),
        "S3: read after it"
    );
    assert!(on_laptop.committed_run("milo", "run-1").is_some());
    assert!(on_laptop.damage().is_empty(), "{:?}", on_laptop.damage());
    drop(on_laptop);

    let bytes = snapshot_bytes(&snapshot);
    assert!(bytes.len() > 1000, "S3: a snapshot was saved");
    let hex: String = KEY.iter().map(|byte| format!("{byte:02x}")).collect();
    let encodings = [
        KEY.to_vec(),
        hex.as_bytes().to_vec(),
        base64::engine::general_purpose::STANDARD.encode(KEY).into_bytes(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(KEY)
            .into_bytes(),
    ];
    for needle in encodings {
        assert!(
            !bytes
                .windows(needle.len())
                .any(|window| window == needle.as_slice()),
            "S3: the ledger key is in the snapshot"
        );
    }
}

/// S3, M2: a host resumed from a snapshot that holds a commit reads a revocation voiding it
/// (a cut in the past): its reading starts over, the snapshot with it, and the commit is no
/// commit, its run in doubt; so it stays for the next process resumed from the new snapshot,
/// and each would publish the revocation with its head (M4: the snapshot keeps its id).
#[test]
fn s3_m2_m4_a_revocation_read_after_a_snapshot_voids_what_it_holds() {
    let laptop = device_key("laptop", 1);
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let given = Given::new(&laptop, &[&phone, &tablet]);
    let snapshots = tempfile::tempdir().unwrap();
    let snapshot = snapshots.path().join("tablet.snapshot");
    let mut on_laptop = given.open(&laptop, None);
    commit(&mut on_laptop, "founding"); // its log begins with the genesis
    let mut on_phone = given.open(&phone, None);
    commit(&mut on_phone, "stolen");
    let mut on_tablet = given.open(&tablet, Some(&snapshot));
    assert!(on_tablet.committed_run("milo", "stolen").is_some());
    drop(on_tablet);

    on_laptop.sync().unwrap();
    on_laptop.revoke(phone.device(), Some(1)).unwrap();
    for attempt in ["the reading that read the revocation", "the next one"] {
        let mut on_tablet = given.open(&tablet, Some(&snapshot));
        assert!(
            on_tablet.committed_run("milo", "stolen").is_none(),
            "S3, M2: {attempt}: a void commit is no commit"
        );
        let in_doubt: Vec<String> = on_tablet
            .in_doubt("milo", 4)
            .into_iter()
            .map(|run| run.run_id)
            .collect();
        assert_eq!(in_doubt, vec!["stolen".to_owned()], "S3, M2: {attempt}");
        let (published, revoker) = (on_tablet.pushed(), on_laptop.pushed());
        assert_eq!(
            (published.next_seq("laptop"), published.head("laptop")),
            (revoker.next_seq("laptop"), revoker.head("laptop")),
            "M4: {attempt}: the tablet would publish the laptop's log through the revocation"
        );
    }
}
