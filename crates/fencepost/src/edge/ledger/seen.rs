//! The seen file ([`LedgerOptions::seen_file`](super::LedgerOptions::seen_file)): what this
//! site read of each device's log, so that a log that shrank or was replaced is found.

use super::*;

/// How long an update of the seen file waits for another process's lock on it.
pub(super) const SEEN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a site remembers of one device's log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Seen {
    pub(super) next_seq: u64,
    pub(super) last_op_id: OpId,
    /// On a protected ledger, when that record carries its head: the head, and the id of the
    /// log's record 0 (so another record there that the same key signed is kept as evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) head: Option<SeenHead>,
}

/// The head a device signed over the last record a site read of its protected log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct SeenHead {
    pub(super) origin: OpId,
    pub(super) signature: String,
}

impl Seen {
    /// What `head` (the newest head verified in a log whose record 0 is `origin`) says of the
    /// mark at `next_seq` and `last_op_id`: the head, if it is that record's.
    pub(super) fn head_of(&self, origin: OpId, head: &crate::protected::SignedHead) -> Option<SeenHead> {
        (head.seq + 1 == self.next_seq && head.op_id == self.last_op_id).then(|| SeenHead {
            origin,
            signature: head.signature.clone(),
        })
    }

    /// The signed head this site saw, as evidence takes it.
    pub(super) fn signed_head(&self) -> Option<(OpId, crate::protected::SignedHead)> {
        let head = self.head.as_ref()?;
        Some((
            head.origin,
            crate::protected::SignedHead {
                seq: self.next_seq.checked_sub(1)?,
                op_id: self.last_op_id,
                signature: head.signature.clone(),
            },
        ))
    }
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
            match devices.get_mut(&device) {
                Some(slot) if mark.next_seq <= slot.next_seq => {}
                Some(slot) => *slot = mark,
                None => drop(devices.insert(device, mark)),
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

impl Ledger {
    /// Proves the suspects the last pull found (a record replaced where this site saw one its
    /// device's key signed): for each that [`keep_equivocation`](Self::keep_equivocation)
    /// proves, its problem says so and names the evidence.
    pub(super) fn prove_equivocations(&mut self) {
        for (device, mark) in std::mem::take(&mut self.suspects) {
            let Some(evidence) = self.keep_equivocation(&mark, &device) else {
                continue;
            };
            let seen_there = format!("but this site saw {} there", mark.last_op_id);
            let proved = format!(
                "{seen_there}, and the device's key signed both: it wrote two logs (a cloned data \
                 directory, or a host that wrote on after its log went back); neither is folded, \
                 and the evidence is in {}",
                evidence.display()
            );
            for problem in self.replaced.iter_mut().chain(self.problems.iter_mut()) {
                if problem.device_id.as_deref() == Some(device.as_str())
                    && problem.detail.contains(&seen_there)
                {
                    let cut = problem.detail.find(&seen_there).unwrap_or(0);
                    problem.detail.replace_range(cut.., &proved);
                }
            }
        }
    }

    /// Keeps the evidence when the record at `mark`'s position of `device`'s log, found other
    /// than the one this site saw there, is covered by a head of the same key (equivocation,
    /// rule I1): the two heads and the other chain's records from there to its head, read from
    /// the relay again and checked before they are written. The file, next to the seen file,
    /// once written.
    pub(super) fn keep_equivocation(&self, mark: &Seen, device: &str) -> Option<std::path::PathBuf> {
        let logs = self.view.protected.as_ref()?;
        let (origin, seen) = mark.signed_head()?;
        let (found_origin, found) = logs.last_head(device)?;
        let from = seen.seq;
        if found_origin != origin || found.seq < from {
            return None;
        }
        let mut since = crate::relay::Frontier::new();
        for (other, next_seq) in self.view.frontier.iter().filter(|(other, _)| *other != device) {
            since.raise(other, next_seq);
        }
        since.raise(device, from);
        let pulled = self.relay.pull(&since).ok()?;
        let chain: Vec<OpRecord> = pulled
            .ops
            .into_iter()
            .filter(|stored| &*stored.device_id == device && (from..=found.seq).contains(&stored.seq))
            .collect();
        if chain.len() as u64 != found.seq - from + 1 {
            return None;
        }
        let ledger = *logs.protection().ledger();
        let evidence = crate::protected::Equivocation::new(&ledger, origin, seen, &chain)?;
        let Some(Ok((_, said))) = logs.origin_of(device) else {
            return None;
        };
        if let Err(error) = evidence.verify(&ledger, said.signer()) {
            tracing::warn!(error, "evidence of equivocation that does not verify: not kept");
            return None;
        }
        // Beside the seen file, named by the ledger, the device and the position (never by the
        // seen file's name, which may be long already: found by an adversary).
        let folder = self.seen.as_ref()?.path.parent()?.to_path_buf();
        let name = crate::relay::device_file_name(device);
        let name = name.strip_suffix(".jsonl").unwrap_or(&name);
        let mut ledger_hex = String::new();
        crate::core::hex::push_lower_hex(&mut ledger_hex, &ledger.0[..8]);
        let path = folder.join(format!("equivocation-{ledger_hex}-{name}-{from}.json"));
        let bytes = serde_json::to_vec_pretty(&evidence).ok()?;
        // Whole or not at all (a process killed mid-write leaves no truncated proof behind);
        // a proof already there of the same position is replaced by another as good.
        let mut temporary = path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", std::process::id()));
        let written = std::fs::write(&temporary, &bytes).and_then(|()| std::fs::rename(&temporary, &path));
        match written {
            Ok(()) => Some(path),
            Err(error) => {
                let _ = std::fs::remove_file(&temporary);
                tracing::warn!(%error, file = %path.display(), "could not keep the evidence of equivocation");
                None
            }
        }
    }
}
