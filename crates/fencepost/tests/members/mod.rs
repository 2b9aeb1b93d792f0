//! Members of a protected ledger in a folder, for the tests of rules M1–M4 and S2: a founder
//! that admits others, each opening the ledger as itself.
#![allow(dead_code)]

use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{Ledger, LedgerOptions};
use fencepost::protected::Origin;
use fencepost::relay::{FsRelay, Relay};

pub fn device_key(device: &str, secret: u8) -> Arc<DeviceKey> {
    Arc::new(DeviceKey::from_secrets(
        DeviceId::new(device).unwrap(),
        [secret; 32],
        [secret + 1; 32],
    ))
}

pub fn relay(folder: &std::path::Path) -> Arc<dyn Relay> {
    Arc::new(FsRelay::open(folder).unwrap())
}

/// A ledger of the protected ledger `ledger` in `folder`, as `key`'s device (`origin` its
/// record 0), with no key or member given: all of it is read from the ledger.
pub fn open(folder: &std::path::Path, key: &Arc<DeviceKey>, origin: Origin, ledger: LedgerId) -> Ledger {
    open_with(folder, key, origin, ledger, LedgerOptions::default()).unwrap()
}

/// [`open`] with `options` (their protection set here).
pub fn open_with(
    folder: &std::path::Path,
    key: &Arc<DeviceKey>,
    origin: Origin,
    ledger: LedgerId,
    options: LedgerOptions,
) -> Result<Ledger, fencepost::ledger::LedgerError> {
    let protected = fencepost::ledger::Protected {
        ledger,
        device_key: Arc::clone(key),
        origin,
        keys: Vec::new(),
        members: Vec::new(),
    };
    let clock = ManualClock::new(1_764_400_000_000);
    Ledger::open_with(
        key.device().as_str(),
        clock.wall_clock(),
        relay(folder),
        options.protected(protected),
    )
}

pub struct Members {
    pub folder: tempfile::TempDir,
    pub ledger: LedgerId,
    pub genesis: Origin,
    pub laptop: Arc<DeviceKey>,
    pub recovery: DeviceKey,
}

impl Members {
    /// `laptop` founds a ledger and admits each of `others`.
    pub fn found(others: &[&Arc<DeviceKey>]) -> (Self, Ledger) {
        let folder = tempfile::tempdir().unwrap();
        let laptop = device_key("laptop", 1);
        let clock = ManualClock::new(1_764_400_000_000);
        let (mut founder, founded) = Ledger::found(
            Arc::clone(&laptop),
            clock.wall_clock(),
            relay(folder.path()),
            LedgerOptions::default(),
        )
        .unwrap();
        for other in others {
            founder.admit(other.device(), &other.public()).unwrap();
        }
        let members = Self {
            folder,
            ledger: founded.genesis.ledger_id(),
            genesis: Origin::Genesis(founded.genesis),
            laptop,
            recovery: founded.recovery,
        };
        (members, founder)
    }

    pub fn open(&self, key: &Arc<DeviceKey>) -> Ledger {
        self.open_with(key, LedgerOptions::default()).unwrap()
    }

    /// What `key`'s device's log begins with: the genesis for the founder.
    pub fn origin_of(&self, key: &Arc<DeviceKey>) -> Origin {
        if key.device() == self.laptop.device() {
            self.genesis.clone()
        } else {
            Origin::Identity(key.public())
        }
    }

    /// [`open`](Self::open) with `options` (their protection set here).
    pub fn open_with(
        &self,
        key: &Arc<DeviceKey>,
        options: LedgerOptions,
    ) -> Result<Ledger, fencepost::ledger::LedgerError> {
        open_with(self.folder.path(), key, self.origin_of(key), self.ledger, options)
    }

    /// The generation `device`'s last record is sealed with (the field after the seq of its
    /// line, format 4: `4 "DEVICE" SEQ GENERATION BODY`).
    pub fn last_generation(&self, device: &str) -> serde_json::Value {
        let file = self.file(device);
        let line = file.lines().last().unwrap();
        let after_device = line.rsplit(' ').nth(1).unwrap();
        serde_json::from_str(after_device).unwrap()
    }

    pub fn file(&self, device: &str) -> String {
        let name = fencepost::relay::device_file_name(device);
        std::fs::read_to_string(self.folder.path().join("devices").join(name)).unwrap()
    }
}

pub fn run(ledger: &mut Ledger, run: &str, epoch: u64) {
    for status in [IntentStatus::Pending, IntentStatus::Committed] {
        ledger.record(&Intent::new("milo", run, epoch, status)).unwrap();
    }
}

pub fn in_doubt(ledger: &Ledger, epoch: u64) -> Vec<String> {
    ledger
        .in_doubt("milo", epoch)
        .into_iter()
        .map(|run| run.run_id)
        .collect()
}
