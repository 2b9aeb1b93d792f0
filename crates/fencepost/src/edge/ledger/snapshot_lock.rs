//! The lock that keeps a site's snapshot file in place while a process uses it.
//!
//! A SQLite file that is removed or replaced while another connection has it open is not safe
//! for that connection: it goes on reading the old file, or pages of the new one's write-ahead
//! log (found through the path), and reports the state "gone" or tables missing. So every
//! process that uses a snapshot holds a shared lock on `<snapshot>.lock` (an advisory `flock`)
//! for as long as it has it open, and a process replaces or removes the file (to make it from a
//! checkpoint, or to start a damaged one over) only while it holds that lock exclusively: when no
//! other process has the file open. One that cannot have it at once does without (it reads the
//! whole ledger this time) rather than pull the file from under the others.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clock::RealTimeLimit;

/// How long a process waits for the lock before it reads the whole ledger without the snapshot:
/// another process's copy of a checkpoint, or a downgrade, normally takes milliseconds.
const WAIT: Duration = Duration::from_secs(30);
/// The pause between two tries.
const RETRY: Duration = Duration::from_millis(10);

/// A shared or exclusive lock on `<snapshot>.lock`, held until dropped.
#[derive(Debug)]
pub(super) struct SnapshotLock {
    file: File,
    exclusive: bool,
}

impl SnapshotLock {
    /// The shared lock (the snapshot is in use), waiting for a process that holds it exclusively
    /// (one making the snapshot from a checkpoint); `None` when it cannot be had within
    /// [`WAIT`].
    pub(super) fn shared(snapshot: &Path) -> Option<Self> {
        let mut lock = Self {
            file: open(snapshot)?,
            exclusive: false,
        };
        lock.wait_for_shared(snapshot).then_some(lock)
    }

    /// The lock of a snapshot that does not exist yet: exclusive (this process makes it), or,
    /// once another process has made the file meanwhile, whichever comes first (that process
    /// may hold it shared while its command runs: waiting for it to end would be waiting for
    /// nothing). `None` when neither can be had within [`WAIT`].
    pub(super) fn for_new(snapshot: &Path) -> Option<Self> {
        let mut lock = Self {
            file: open(snapshot)?,
            exclusive: false,
        };
        let limit = RealTimeLimit::starting_now(WAIT);
        let mut said = Said::default();
        loop {
            match lock.file.try_lock() {
                Ok(()) => {
                    lock.exclusive = true;
                    return Some(lock);
                }
                Err(TryLockError::WouldBlock) if !limit.passed() => {
                    if snapshot.exists() && lock.file.try_lock_shared().is_ok() {
                        return Some(lock);
                    }
                    said.waiting(snapshot);
                    std::thread::sleep(RETRY);
                }
                Err(error) => {
                    tracing::warn!(snapshot = %snapshot.display(), %error, "another process has held this snapshot for too long; reading the whole ledger");
                    return None;
                }
            }
        }
    }

    /// Whether the lock is exclusive.
    pub(super) fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    /// Makes the lock exclusive if no other process holds it now; `Err` with the lock shared
    /// again when another one does (or `None` when even that cannot be had again: a conversion
    /// gives the lock up before it takes the new one).
    pub(super) fn upgrade(mut self, snapshot: &Path) -> Result<Self, Option<Self>> {
        if self.exclusive {
            return Ok(self);
        }
        match self.file.try_lock() {
            Ok(()) => {
                self.exclusive = true;
                Ok(self)
            }
            Err(_) => Err(self.wait_for_shared(snapshot).then_some(self)),
        }
    }

    /// Makes the lock shared again, letting the processes that wait for it use the snapshot;
    /// `None` when the shared lock cannot be had within [`WAIT`] (a conversion gives the lock up
    /// before it takes the new one, and another process may take it exclusively meanwhile). The
    /// snapshot must be opened again after this: it may have been replaced in between.
    pub(super) fn downgrade(mut self, snapshot: &Path) -> Option<Self> {
        if !self.exclusive {
            return Some(self);
        }
        self.wait_for_shared(snapshot).then_some(self)
    }

    /// Takes the lock shared within [`WAIT`]; whether it has it.
    fn wait_for_shared(&mut self, snapshot: &Path) -> bool {
        let limit = RealTimeLimit::starting_now(WAIT);
        let mut said = Said::default();
        loop {
            match self.file.try_lock_shared() {
                Ok(()) => {
                    self.exclusive = false;
                    return true;
                }
                Err(TryLockError::WouldBlock) if !limit.passed() => {
                    said.waiting(snapshot);
                    std::thread::sleep(RETRY);
                }
                Err(error) => {
                    tracing::warn!(snapshot = %snapshot.display(), %error, "another process has held this snapshot for too long; reading the whole ledger");
                    return false;
                }
            }
        }
    }
}

/// Says once, after a second of waiting, what the wait is for (found by an adversarial test:
/// a run whose snapshot another process of the host held stalled for 30 s without a word).
#[derive(Default)]
struct Said {
    tries: u32,
}

impl Said {
    /// Counts one more try, and warns at the one that makes a second.
    fn waiting(&mut self, snapshot: &Path) {
        self.tries += 1;
        if u128::from(self.tries) * RETRY.as_millis() == 1000 {
            tracing::warn!(snapshot = %snapshot.display(), "another fencepost process of this host holds the snapshot (making it from a checkpoint, or stopped while doing so); waiting for it, up to {} s, then reading the whole ledger", WAIT.as_secs());
        }
    }
}

/// Opens (creating it) the lock file of the snapshot at `snapshot`.
fn open(snapshot: &Path) -> Option<File> {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Ok(file) => Some(file),
        Err(error) => {
            tracing::warn!(lock = %path.display(), %error, "cannot open the snapshot's lock; reading the whole ledger");
            None
        }
    }
}
