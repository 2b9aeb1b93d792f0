//! The seen file ([`LedgerOptions::seen_file`](super::LedgerOptions::seen_file)): what this
//! site read of each device's log, so that a log that shrank or was replaced is found.

use super::*;

/// How long an update of the seen file waits for another process's lock on it.
pub(super) const SEEN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a site remembers of one device's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Seen {
    pub(super) next_seq: u64,
    pub(super) last_op_id: OpId,
}

/// The seen file of [`LedgerOptions::seen_file`].
#[derive(Debug)]
pub(super) struct SeenFile {
    pub(super) path: std::path::PathBuf,
    pub(super) devices: BTreeMap<String, Seen>,
}

impl SeenFile {
    pub(super) fn load(path: std::path::PathBuf) -> Result<Self, LedgerError> {
        let devices = Self::read(&path)?;
        Ok(Self { path, devices })
    }

    pub(super) fn read(path: &std::path::Path) -> Result<BTreeMap<String, Seen>, LedgerError> {
        match std::fs::read(path) {
            // A damaged memory is no memory: say so, rather than forget silently what was seen.
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| LedgerError::Seen {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("it is damaged ({error}); remove it to start it over, knowing that a ledger file that shrank before now then goes unnoticed"),
                ),
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(error) => Err(LedgerError::Seen {
                path: path.to_path_buf(),
                source: error,
            }),
        }
    }

    /// Merges `marks` into the file (the greater seq wins), under the file's lock.
    pub(super) fn store(&mut self, marks: BTreeMap<String, Seen>) -> Result<(), LedgerError> {
        let changed = marks.iter().any(|(device, mark)| {
            self.devices
                .get(device)
                .is_none_or(|known| mark.next_seq > known.next_seq)
        });
        if !changed {
            return Ok(());
        }
        let Some(_lock) = self.lock()? else {
            return Ok(());
        };
        let mut devices = Self::read(&self.path)?;
        for (device, mark) in marks {
            let slot = devices.entry(device).or_insert(mark);
            if mark.next_seq > slot.next_seq {
                *slot = mark;
            }
        }
        self.write(devices)
    }

    /// Puts `marks` in place of what the file remembers of those devices (none: forgets the
    /// device), under the file's lock: after a database that went back was repaired
    /// ([`Ledger::repair_went_back`]), what it holds now is what this site has seen.
    pub(super) fn reset(&mut self, marks: BTreeMap<String, Option<Seen>>) -> Result<(), LedgerError> {
        let Some(_lock) = self.lock()? else {
            return Err(LedgerError::Seen {
                path: self.path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::WouldBlock, "another process holds its lock"),
            });
        };
        let mut devices = Self::read(&self.path)?;
        for (device, mark) in marks {
            match mark {
                Some(mark) => drop(devices.insert(device, mark)),
                None => drop(devices.remove(&device)),
            }
        }
        self.write(devices)
    }

    /// The file's lock, held only to merge and rename; `None` when a holder does not let go
    /// within `SEEN_LOCK_WAIT`.
    pub(super) fn lock(&self) -> Result<Option<std::fs::File>, LedgerError> {
        let failed = |source| LedgerError::Seen {
            path: self.path.clone(),
            source,
        };
        let mut lock_path = self.path.clone().into_os_string();
        lock_path.push(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(failed)?;
        // Held only to merge and rename; a holder that does not let go for this long is stopped
        // (SIGSTOP) or stuck: skip this update rather than wait for it (the marks only ever grow,
        // so a skipped update weakens the check a little and breaks nothing).
        let limit = crate::clock::RealTimeLimit::starting_now(SEEN_LOCK_WAIT);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if !limit.passed() => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    tracing::warn!(file = %self.path.display(), "another process holds the seen file's lock; not updating it this time");
                    return Ok(None);
                }
                Err(std::fs::TryLockError::Error(error)) => return Err(failed(error)),
            }
        }
        Ok(Some(lock))
    }

    /// Replaces the file with `devices` (by a rename), under the lock.
    pub(super) fn write(&mut self, devices: BTreeMap<String, Seen>) -> Result<(), LedgerError> {
        let failed = |source| LedgerError::Seen {
            path: self.path.clone(),
            source,
        };
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", std::process::id()));
        let bytes = serde_json::to_vec(&devices).map_err(|error| failed(error.into()))?;
        std::fs::write(&temporary, bytes).map_err(failed)?;
        std::fs::rename(&temporary, &self.path).map_err(failed)?;
        self.devices = devices;
        Ok(())
    }
}
