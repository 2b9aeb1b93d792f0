//! [`FsRelay`]: a relay in a folder, which may be a synced folder (rule R1).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{
    group_by_device, plan_device_push, Appended, DevicePlan, Frontier, MakeRecords, ProblemKind, PullBatch,
    PushReport, Relay, RelayError, RelayProblem,
};
use serde::{Deserialize, Serialize};

use crate::oplog::{HeadMark, LogHead, OpId, OpRecord};

mod append;
mod cursor;
mod naming;
mod prune;
mod read;

use append::*;
use cursor::*;
pub use naming::device_file_name;
use naming::*;
use prune::file_identity;
use read::*;

/// The folder, inside the relay folder, that holds one file per device.
const DEVICES_DIR: &str = "devices";
/// The folder, inside the relay folder, that holds the shared checkpoints.
const CHECKPOINTS_DIR: &str = "checkpoints";
/// The extension of a device's log file.
const LOG_EXTENSION: &str = ".jsonl";
/// Settings of an [`FsRelay`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsRelayConfig {
    /// How long a push waits for another process's lock on a device file before giving up.
    pub lock_timeout_ms: u64,
    /// The longest line (one encoded record) written or read; longer lines are refused on push and
    /// reported as damage on pull.
    pub max_line_bytes: usize,
}

impl Default for FsRelayConfig {
    fn default() -> Self {
        Self {
            lock_timeout_ms: 30_000,
            max_line_bytes: 16 * 1024 * 1024,
        }
    }
}

/// A relay kept in a folder: one append-only JSON-lines file per device under `devices/`.
///
/// * **One writer per file.** A device's records go to its own file, so a synced folder (Syncthing,
///   Dropbox, a network share) never sees two hosts writing one file. Several processes on one
///   host may push the same device: an advisory file lock orders them.
/// * **Durable.** Every push is fsynced before it returns (and the folder, when a file is created).
/// * **O(new records) per call.** The relay remembers, per device, where each record starts and how
///   far it has read; a call reads only what was appended since, plus the records the caller lacks.
///   Nothing is ever rewritten.
/// * **Torn lines.** A last line without its newline (a write in progress, a crash, a sync still
///   copying) is ignored until it is complete. When a push finds one left by a crashed writer of
///   the same device, it cuts it off before appending.
/// * **Damage is isolated.** A line that is not a valid next record of its device (garbage, a bad
///   `op_id`, a gap) stops that device at that line and is reported in [`PullBatch::problems`];
///   the other devices keep syncing, and pushes to the damaged device are refused.
/// * **Safe names.** Device ids are mapped to file names by [`device_file_name`]: no path
///   separators, no `..`, distinct ids never share a name (also on case-insensitive file systems).
#[derive(Debug)]
pub struct FsRelay {
    devices_dir: PathBuf,
    config: FsRelayConfig,
    files: Mutex<BTreeMap<String, DeviceFile>>,
}

/// What this process knows of one device file.
#[derive(Debug)]
struct DeviceFile {
    path: PathBuf,
    /// The seq of the first record in `offsets`: 0, or where reading resumed from a cursor
    /// ([`Relay::resume`]); the records before it are not read again.
    first_seq: u64,
    /// The byte offset where each record (seq = `first_seq` + index) starts.
    offsets: Vec<u64>,
    /// The end of the last verified record; reading resumes here.
    verified_to: u64,
    /// The end of the verified log; `None` until a record has been read or written.
    head: Option<LogHead>,
    /// The damage found at `verified_to`, if the line there is not a valid next record.
    damage: Option<RelayProblem>,
    /// Where the file itself begins when that is after record 0 (its first records were removed
    /// after a checkpoint covered them, [`Relay::prune`]): the seq of its first record and the
    /// id of the record before it. `None`: from record 0, or not known (not read from its start).
    begins: Option<(u64, OpId)>,
    /// Which file this is (device and inode), to notice one replaced under the same name (a
    /// prune, a sync tool that writes a new copy): `None` until it is opened, and where the
    /// platform does not say.
    identity: Option<(u64, u64)>,
}

impl DeviceFile {
    /// How many records of the file were verified (the next record's seq).
    fn records(&self) -> u64 {
        self.first_seq + self.offsets.len() as u64
    }

    /// Where record `seq` starts, if this process knows it.
    fn offset_of(&self, seq: u64) -> Result<u64, String> {
        seq.checked_sub(self.first_seq)
            .and_then(|index| usize::try_from(index).ok())
            .and_then(|index| self.offsets.get(index).copied())
            .ok_or_else(|| {
                format!(
                    "record {seq} is not indexed in this process (it reads the file from record {} on, where its snapshot ends)",
                    self.first_seq
                )
            })
    }
}

fn io_error<'a>(operation: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RelayError + 'a {
    move |source| RelayError::Io {
        operation,
        path: path.to_path_buf(),
        source,
    }
}

impl FsRelay {
    /// Opens the relay in folder `root`, creating the folder (and `root/devices`) if needed.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, RelayError> {
        Self::open_with(root, FsRelayConfig::default())
    }

    /// [`open`](Self::open) with explicit settings.
    pub fn open_with(root: impl AsRef<Path>, config: FsRelayConfig) -> Result<Self, RelayError> {
        let devices_dir = root.as_ref().join(DEVICES_DIR);
        std::fs::create_dir_all(&devices_dir).map_err(io_error("create folder", &devices_dir))?;
        Ok(Self {
            devices_dir,
            config,
            files: Mutex::new(BTreeMap::new()),
        })
    }

    /// The folder holding the device files.
    pub fn devices_dir(&self) -> &Path {
        &self.devices_dir
    }

    /// The path of `device_id`'s log file.
    pub fn device_path(&self, device_id: &str) -> PathBuf {
        self.devices_dir.join(device_file_name(device_id))
    }

    fn lock_files(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, DeviceFile>> {
        // The index is updated only after each write succeeded, so a panic cannot corrupt it.
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn problem(&self, entry: &DeviceFile, line_number: Option<u64>, detail: String) -> RelayProblem {
        RelayProblem {
            kind: ProblemKind::Damage,
            device_id: entry.head.as_ref().map(|head| head.device_id().to_string()),
            file: Some(entry.path.clone()),
            line_number,
            detail,
        }
    }

    fn entry<'a>(
        files: &'a mut BTreeMap<String, DeviceFile>,
        devices_dir: &Path,
        name: &str,
    ) -> &'a mut DeviceFile {
        files.entry(name.to_owned()).or_insert_with(|| DeviceFile {
            path: devices_dir.join(name),
            first_seq: 0,
            offsets: Vec::new(),
            verified_to: 0,
            head: None,
            damage: None,
            begins: None,
            identity: None,
        })
    }
}

impl FsRelay {}

impl Relay for FsRelay {
    /// Every record is checked against its chain as it is read.
    fn checks_records(&self) -> bool {
        true
    }

    /// Per device file: where the verified records end, where the last one starts, and the
    /// file's head.
    fn cursor(&self, frontier: &Frontier) -> Option<serde_json::Value> {
        let files = self.lock_files();
        let mut cursor = FsCursor {
            files: Vec::with_capacity(files.len()),
        };
        for (device, next_seq) in frontier.iter() {
            let at = files
                .get(&device_file_name(device))
                .and_then(|entry| entry.head.as_ref())
                .is_some_and(|head| head.next_seq() == next_seq);
            if !at {
                return None;
            }
        }
        for (name, entry) in files.iter() {
            if entry.damage.is_some() {
                return None; // not a clean point: read the file again next time
            }
            let Some(head) = &entry.head else { continue };
            if frontier.next_seq(head.device_id()) != head.next_seq() {
                return None;
            }
            cursor.files.push(FileCursor {
                name: name.clone(),
                verified_to: entry.verified_to,
                last_start: *entry.offsets.last()?,
                head: head.mark(),
            });
        }
        serde_json::to_value(cursor).ok()
    }

    /// Checks every file of the cursor (long enough, and the cursor's last record still where it
    /// was, with a valid id), then continues each after it.
    fn resume(&self, cursor: &serde_json::Value) -> Result<(), super::ResumeError> {
        let cursor =
            FsCursor::deserialize(cursor).map_err(|error| format!("the cursor is damaged: {error}"))?;
        let mut resumed = BTreeMap::new();
        for file in cursor.files {
            let entry = self.resumed_file(&file)?;
            if resumed.insert(file.name.clone(), entry).is_some() {
                return Err(format!("the cursor names {} twice", file.name).into());
            }
        }
        let mut files = self.lock_files();
        if !files.is_empty() {
            return Err("this relay has read records already".to_owned().into());
        }
        *files = resumed;
        Ok(())
    }

    /// Forgets every file's reading state: the next pull reads each from its start.
    fn read_from_start(&self) {
        self.lock_files().clear();
    }

    /// Reads the first line of every device file.
    fn log_starts(&self) -> Result<BTreeMap<String, (u64, OpId)>, RelayError> {
        self.file_starts()
    }

    /// Rewrites the device's file without the records, under its exclusive lock: the rest is
    /// copied to a new file (synced) that replaces it. Other processes holding or waiting for
    /// the old file's lock notice the new file and take its lock; readers of the old one find
    /// where they stand in the new one. Unix only.
    fn prune(&self, device_id: &str, through_seq: u64, through_id: OpId) -> Result<u64, RelayError> {
        self.prune_file(device_id, through_seq, through_id)
    }

    /// `checkpoints/` beside `devices/`.
    fn checkpoints_dir(&self) -> Option<PathBuf> {
        self.devices_dir.parent().map(|root| root.join(CHECKPOINTS_DIR))
    }

    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError> {
        let groups = group_by_device(ops)?;
        // Lock the files in name order, so that concurrent pushes of several devices cannot deadlock.
        let mut by_name: BTreeMap<String, (&str, Vec<&OpRecord>)> = BTreeMap::new();
        for (device_id, device_ops) in groups {
            by_name.insert(device_file_name(device_id), (device_id, device_ops));
        }
        let mut files = self.lock_files();
        let mut report = PushReport::default();
        let mut pending: Vec<PendingAppend> = Vec::new();
        for (name, (device_id, device_ops)) in by_name {
            let entry = Self::entry(&mut files, &self.devices_dir, &name);
            let (file, _) = self.open_for_append(&name, device_id, entry)?;
            let path = entry.path.clone();
            let indexed: &DeviceFile = entry;
            let mut reader: Option<(BufReader<File>, u64)> = None;
            let stored = entry.head.clone().unwrap_or_else(|| LogHead::new(device_id));
            let plan: DevicePlan<'_> = plan_device_push(
                &stored,
                |seq| {
                    self.stored_op_id(indexed, seq, &mut reader)
                        .map_err(|detail| RelayError::DeviceDamaged {
                            device_id: device_id.to_owned(),
                            problem: RelayProblem {
                                kind: ProblemKind::Damage,
                                device_id: Some(device_id.to_owned()),
                                file: Some(path.clone()),
                                line_number: Some(seq + 1),
                                detail,
                            },
                        })
                },
                device_ops,
            )?;
            report.already_present += plan.already_present;
            if plan.fresh.is_empty() {
                continue;
            }
            report.appended += plan.fresh.len();
            let created = entry.verified_to == 0;
            pending.push(self.encode(name, file, path, device_id, &plan.fresh, plan.head, created)?);
        }
        // Every device's records were checked: now write them.
        for append in pending {
            self.write(&mut files, append)?;
        }
        Ok(report)
    }

    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError> {
        let mut ops = Vec::new();
        let problems = self.pull_in_batches(since, &mut |batch| {
            if ops.is_empty() {
                ops = batch;
            } else {
                ops.extend(batch);
            }
        })?;
        Ok(PullBatch { ops, problems })
    }

    /// Hands the records of a device file over a chunk at a time as they are verified, when the
    /// caller lacks none of those this relay verified before (a first pull does); else as `pull`.
    fn pull_in_batches(
        &self,
        since: &Frontier,
        each: &mut dyn FnMut(Vec<OpRecord>),
    ) -> Result<Vec<RelayProblem>, RelayError> {
        let mut batch = PullBatch::default();
        let mut names = Vec::new();
        let listing = std::fs::read_dir(&self.devices_dir).map_err(io_error("list", &self.devices_dir))?;
        for item in listing {
            let item = item.map_err(io_error("list", &self.devices_dir))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue; // a sync tool's temporary file
            }
            if !is_device_file_name(&name) {
                batch.problems.push(RelayProblem {
                    kind: ProblemKind::Ignored,
                    device_id: None,
                    file: Some(item.path()),
                    line_number: None,
                    detail: "not a device log file name; ignored (a sync conflict copy?)".to_owned(),
                });
                continue;
            }
            names.push(name);
        }
        names.sort();
        // A device this reading starts after (a checkpoint or a snapshot read its records) with
        // no file here: not synced yet, or removed.
        for (device, next_seq) in since.iter() {
            if next_seq > 0 && names.binary_search(&device_file_name(device)).is_err() {
                batch.problems.push(RelayProblem {
                    kind: ProblemKind::Behind,
                    device_id: Some(device.to_owned()),
                    file: Some(self.device_path(device)),
                    line_number: None,
                    detail: format!("this reading starts after {next_seq} records of this device (a checkpoint or this site's snapshot read them), and its file is not here: not synced here yet, or removed (restore it from a copy)"),
                });
            }
        }
        let mut files = self.lock_files();
        for name in names {
            let entry = Self::entry(&mut files, &self.devices_dir, &name);
            let streams = entry
                .head
                .as_ref()
                .is_none_or(|head| since.next_seq(head.device_id()) >= head.next_seq());
            let hand = streams.then_some(Hand {
                since,
                each: &mut *each,
                gap: None,
            });
            let refresh = match self.refresh(&name, entry, hand) {
                Ok(refresh) => refresh,
                Err(error) => {
                    batch.problems.push(self.problem(entry, None, error.to_string()));
                    continue;
                }
            };
            if let Some(problem) = &entry.damage {
                batch.problems.push(problem.clone());
            } else if refresh.torn_tail {
                let mut problem = self.problem(
                    entry,
                    Some(entry.records() + 1),
                    "the last line is incomplete (a write or a sync in progress, or a file cut short); its record is read once the line is complete".to_owned(),
                );
                problem.kind = ProblemKind::IncompleteLine;
                batch.problems.push(problem);
            }
            if let Some(problem) = self.behind_reader(entry, since) {
                batch.problems.push(problem);
            }
            if let Some(problem) = self.pruned_gap(entry, since) {
                // Nothing of this device is handed over: it would not continue what the caller has.
                batch.problems.push(problem);
                continue;
            }
            if streams {
                continue; // handed over already
            }
            let Some(head) = &entry.head else { continue };
            let mut from = since.next_seq(head.device_id());
            // The records read before, handed over a batch at a time (never all of a long file
            // at once), then the fresh ones.
            let first_fresh = head.next_seq() - refresh.fresh.len() as u64;
            let mut prev = None;
            while from < first_fresh {
                let to = first_fresh.min(from.saturating_add(STORED_BATCH));
                match self.read_range(entry, from, to, prev) {
                    Ok(ops) => {
                        prev = ops.last().map(|op| op.op_id);
                        each(ops);
                    }
                    Err(detail) => {
                        batch.problems.push(self.problem(entry, None, detail));
                        break;
                    }
                }
                from = to;
            }
            if from >= first_fresh {
                let skip = usize::try_from(from - first_fresh).unwrap_or(usize::MAX);
                let fresh: Vec<OpRecord> = if skip == 0 {
                    refresh.fresh
                } else {
                    refresh.fresh.into_iter().skip(skip).collect()
                };
                if !fresh.is_empty() {
                    each(fresh);
                }
            }
        }
        Ok(batch.problems)
    }

    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError> {
        crate::id::validate_id(crate::id::IdKind::Device, device_id)?;
        let name = device_file_name(device_id);
        let mut files = self.lock_files();
        let entry = Self::entry(&mut files, &self.devices_dir, &name);
        let opened = match self.open_for_append(&name, device_id, entry) {
            // Records of the device that another process appended, and pruned once a checkpoint
            // covered them, before this one read them: the file is read again from where it
            // begins, and the tail handed over from there (found by a flaky test: the append
            // was refused as damage).
            Err(RelayError::DeviceDamaged { problem, .. }) if problem.kind == ProblemKind::Pruned => {
                files.remove(&name);
                let entry = Self::entry(&mut files, &self.devices_dir, &name);
                self.open_for_append(&name, device_id, entry)
            }
            other => other,
        };
        let entry = Self::entry(&mut files, &self.devices_dir, &name);
        let (file, refresh) = opened?;
        let path = entry.path.clone();
        let tail = self
            .records_from(entry, since_seq, refresh.fresh)
            .map_err(|detail| RelayError::DeviceDamaged {
                device_id: device_id.to_owned(),
                problem: self.problem(entry, None, detail),
            })?;
        let made = make(&tail)?;
        let stored = entry.head.clone().unwrap_or_else(|| LogHead::new(device_id));
        let mut head = stored.clone();
        for op in &made {
            head.accept(op)?;
        }
        let fresh: Vec<&OpRecord> = made.iter().collect();
        if !fresh.is_empty() {
            let append = self.encode(name, file, path, device_id, &fresh, head, entry.verified_to == 0)?;
            self.write(&mut files, append)?;
        }
        Ok(Appended { tail, appended: made })
    }
}

impl FsRelay {}

impl FsRelay {}

fn sync_dir(dir: &Path) -> Result<(), RelayError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(io_error("sync folder", dir))
}
