//! Appending to a device file under its lock: the records encoded, written whole and synced, and
//! checked against what the file holds when another writer got there first.

use super::*;

impl FsRelay {
    /// Takes the exclusive advisory lock of an open device file, waiting at most the configured time.
    pub(super) fn lock_exclusive(&self, file: &File, path: &Path) -> Result<(), RelayError> {
        let limit =
            crate::clock::RealTimeLimit::starting_now(Duration::from_millis(self.config.lock_timeout_ms));
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(()),
                Err(TryLockError::WouldBlock) if !limit.passed() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(RelayError::LockTimeout {
                        path: path.to_path_buf(),
                        waited_ms: u64::try_from(limit.elapsed().as_millis()).unwrap_or(u64::MAX),
                    })
                }
                Err(TryLockError::Error(source)) => return Err(io_error("lock", path)(source)),
            }
        }
    }
}

/// A device file locked for appending, with what will be written to it.
pub(super) struct PendingAppend {
    pub(super) name: String,
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) lines: Vec<u8>,
    pub(super) line_lengths: Vec<u64>,
    pub(super) head: LogHead,
    pub(super) created: bool,
}

impl FsRelay {
    /// Opens `entry`'s file for appending, takes its exclusive lock (held until the returned file
    /// is dropped), reads what other writers appended, refuses a damaged device, and cuts off an
    /// incomplete last line (with the lock held, it is a crashed writer's).
    pub(super) fn open_for_append(
        &self,
        name: &str,
        device_id: &str,
        entry: &mut DeviceFile,
    ) -> Result<(File, Refresh), RelayError> {
        let path = entry.path.clone();
        if let Some(detail) = not_a_log_file(&path) {
            return Err(RelayError::DeviceDamaged {
                device_id: device_id.to_owned(),
                problem: self.problem(entry, None, detail),
            });
        }
        let mut tries = 0;
        let file = loop {
            let file = OpenOptions::new()
                .read(true)
                .append(true)
                .create(true)
                .open(&path)
                .map_err(io_error("open", &path))?;
            self.lock_exclusive(&file, &path)?;
            // A prune replaces the file while holding its lock: the lock taken then is the old
            // file's, and records appended to it would be lost. The lock must be the file's
            // that is at the path (found by reading the code for a prune's race with a run).
            let locked = file.metadata().ok().as_ref().and_then(file_identity);
            let current = std::fs::metadata(&path).ok().as_ref().and_then(file_identity);
            if locked == current {
                break file;
            }
            tries += 1;
            if tries >= 100 {
                return Err(io_error("lock", &path)(std::io::Error::other(
                    "the file was replaced 100 times while this process took its lock",
                )));
            }
        };
        let refresh = self.refresh(name, entry, None)?;
        if let Some(problem) = &entry.damage {
            return Err(RelayError::DeviceDamaged {
                device_id: device_id.to_owned(),
                problem: problem.clone(),
            });
        }
        if let Some(head) = &entry.head {
            if **head.device_id() != *device_id {
                return Err(RelayError::DeviceDamaged {
                    device_id: device_id.to_owned(),
                    problem: self.problem(
                        entry,
                        Some(1),
                        format!("the file holds records of device {:?}", head.device_id()),
                    ),
                });
            }
        }
        if refresh.torn_tail {
            tracing::warn!(file = %path.display(), offset = entry.verified_to, "cutting off an incomplete last line left by an interrupted write");
            file.set_len(entry.verified_to)
                .map_err(io_error("truncate", &path))?;
        }
        Ok((file, refresh))
    }

    /// Encodes `fresh` (checked records continuing the file) for [`write`](Self::write).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encode(
        &self,
        name: String,
        file: File,
        path: PathBuf,
        device_id: &str,
        fresh: &[&OpRecord],
        head: LogHead,
        created: bool,
    ) -> Result<PendingAppend, RelayError> {
        let mut lines = Vec::new();
        let mut line_lengths = Vec::with_capacity(fresh.len());
        for op in fresh {
            let start = lines.len();
            op.write_json_line(&mut lines);
            let length_bytes = lines.len() - start;
            if length_bytes > self.config.max_line_bytes {
                return Err(RelayError::OpTooLarge {
                    device_id: device_id.to_owned(),
                    seq: op.seq,
                    length_bytes,
                    max_bytes: self.config.max_line_bytes,
                });
            }
            line_lengths.push(length_bytes as u64);
        }
        Ok(PendingAppend {
            name,
            file,
            path,
            lines,
            line_lengths,
            head,
            created,
        })
    }

    /// Appends and syncs encoded records, then moves the index past them.
    pub(super) fn write(
        &self,
        files: &mut BTreeMap<String, DeviceFile>,
        mut append: PendingAppend,
    ) -> Result<(), RelayError> {
        append
            .file
            .write_all(&append.lines)
            .map_err(io_error("append to", &append.path))?;
        append.file.sync_data().map_err(io_error("sync", &append.path))?;
        if append.created {
            sync_dir(&self.devices_dir)?;
        }
        let entry = Self::entry(files, &self.devices_dir, &append.name);
        for length in append.line_lengths {
            entry.offsets.push(entry.verified_to);
            entry.verified_to += length;
        }
        debug_assert_eq!(entry.records(), append.head.next_seq());
        entry.head = Some(append.head);
        Ok(())
    }

    /// The `op_id` of stored record `seq`, reading sequentially when the requests are consecutive.
    pub(super) fn stored_op_id(
        &self,
        entry: &DeviceFile,
        seq: u64,
        reader: &mut Option<(BufReader<File>, u64)>,
    ) -> Result<OpId, String> {
        let path = &entry.path;
        let offset = entry.offset_of(seq)?;
        let (file, position) = match reader {
            Some((file, position)) if *position == offset => (file, position),
            _ => {
                let file = open_at(path, offset).map_err(|error| error.to_string())?;
                let (file, position) = reader.insert((file, offset));
                (file, position)
            }
        };
        let mut line = Vec::new();
        *position += self
            .read_line(file, &mut line)
            .map_err(|error| error.to_string())? as u64;
        OpRecord::from_json(without_newline(&line))
            .map(|op| op.op_id)
            .map_err(|error| format!("changed after it was verified: {error}"))
    }
}
