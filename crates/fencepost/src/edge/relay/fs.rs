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

mod prune;
use prune::file_identity;

/// The folder, inside the relay folder, that holds one file per device.
const DEVICES_DIR: &str = "devices";
/// The folder, inside the relay folder, that holds the shared checkpoints.
const CHECKPOINTS_DIR: &str = "checkpoints";
/// The extension of a device's log file.
const LOG_EXTENSION: &str = ".jsonl";
/// Encoded names longer than this are shortened to a prefix and a hash.
const MAX_PLAIN_STEM_BYTES: usize = 160;
/// The length of the readable prefix kept in a shortened name.
const SHORTENED_PREFIX_BYTES: usize = 96;

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

/// The result of reading what was appended to a device file.
struct Refresh {
    /// The new records, in seq order.
    fresh: Vec<OpRecord>,
    /// Whether bytes of an incomplete last line follow the verified records.
    torn_tail: bool,
}

/// The file name (in the relay's `devices/` folder) of `device_id`'s log.
///
/// Bytes `a`–`z`, `0`–`9`, `-` and `_` are kept; every other byte becomes `%` and two uppercase hex
/// digits. The mapping is injective even on a case-insensitive file system, no name contains a
/// path separator or starts with a dot, a Windows device name (`con`, `nul`, …) has its first letter
/// escaped, and a name that would be too long is cut and completed with `~` and a hash of the id.
///
/// ```
/// use fencepost::relay::device_file_name;
/// assert_eq!(device_file_name("laptop-1"), "laptop-1.jsonl");
/// assert_eq!(device_file_name("../../etc"), "%2E%2E%2F%2E%2E%2Fetc.jsonl");
/// assert_ne!(device_file_name("Phone"), device_file_name("phone"));
/// ```
pub fn device_file_name(device_id: &str) -> String {
    let mut stem = String::with_capacity(device_id.len() + 8);
    for byte in device_id.bytes() {
        match byte {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => stem.push(char::from(byte)),
            _ => push_escape(&mut stem, byte),
        }
    }
    if is_windows_device_name(&stem) {
        let first = stem.remove(0);
        let mut escaped = String::with_capacity(stem.len() + 3);
        push_escape(&mut escaped, first as u8);
        escaped.push_str(&stem);
        stem = escaped;
    }
    if stem.len() > MAX_PLAIN_STEM_BYTES {
        let digest = Sha256::digest(device_id.as_bytes());
        stem.truncate(SHORTENED_PREFIX_BYTES);
        stem.push('~');
        crate::hex::push_lower_hex(&mut stem, &digest[..16]);
    }
    stem.push_str(LOG_EXTENSION);
    stem
}

fn push_escape(out: &mut String, byte: u8) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(DIGITS[usize::from(byte >> 4)]));
    out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
}

fn is_windows_device_name(stem: &str) -> bool {
    matches!(stem, "con" | "prn" | "aux" | "nul")
        || (stem.len() == 4
            && (stem.starts_with("com") || stem.starts_with("lpt"))
            && stem.as_bytes()[3].is_ascii_digit())
}

/// Whether `name` could have been made by [`device_file_name`].
fn is_device_file_name(name: &str) -> bool {
    name.strip_suffix(LOG_EXTENSION).is_some_and(|stem| {
        !stem.is_empty()
            && stem
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'%' | b'A'..=b'F' | b'~'))
    })
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

    /// Takes the exclusive advisory lock of an open device file, waiting at most the configured time.
    fn lock_exclusive(&self, file: &File, path: &Path) -> Result<(), RelayError> {
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

    /// Reads what was appended to `entry`'s file since the last call, verifying each record. The
    /// records are kept in [`Refresh::fresh`], or with `hand`, handed over a chunk at a time.
    fn refresh(
        &self,
        name: &str,
        entry: &mut DeviceFile,
        hand: Option<Hand<'_>>,
    ) -> Result<Refresh, RelayError> {
        let mut refresh = Refresh {
            fresh: Vec::new(),
            torn_tail: false,
        };
        if let Some(detail) = not_a_log_file(&entry.path) {
            entry.damage = Some(self.problem(entry, None, detail));
            return Ok(refresh);
        }
        let file = match File::open(&entry.path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(refresh),
            Err(error) => return Err(io_error("open", &entry.path)(error)),
        };
        let metadata = file
            .metadata()
            .map_err(io_error("read metadata of", &entry.path))?;
        let length = metadata.len();
        entry.damage = None;
        let identity = file_identity(&metadata);
        // Another file under the name: a sync tool's new copy, or the device's own file pruned
        // (`Relay::prune`), with another identity, or with the same one (a file system reuses
        // the number of a file removed: found by an adversarial test, a reading went on at the
        // old file's offset in the middle of a line of a file pruned twice). It must still hold
        // what was read, from where it begins.
        if entry.identity.is_some()
            && (identity != entry.identity || !Self::holds_last_read(&file, entry, length))
        {
            if let Err(problem) = self.relocate(entry) {
                entry.damage = Some(problem);
                return Ok(refresh);
            }
            entry.identity = identity;
            return self.refresh(name, entry, hand);
        }
        if length < entry.verified_to && entry.identity.is_some() {
            // Shorter under the same identity: a prune's new file that the file system gave
            // the number of the one it replaced (removed, then reused), or a file cut short.
            // The first holds what was read from where it begins; the second does not.
            match self.relocate(entry) {
                Ok(()) => {
                    entry.identity = identity;
                    return self.refresh(name, entry, hand);
                }
                Err(problem) if problem.kind == ProblemKind::Pruned => {
                    entry.damage = Some(problem);
                    return Ok(refresh);
                }
                Err(_) => {}
            }
        }
        entry.identity = identity;
        if length < entry.verified_to {
            entry.damage = Some(self.problem(entry, None, format!(
                "the file shrank from {} to {length} bytes; relay files are append-only (was it replaced or truncated?)",
                entry.verified_to
            )));
            return Ok(refresh);
        }
        if length == entry.verified_to {
            return Ok(refresh);
        }
        let mut file = file;
        file.seek(SeekFrom::Start(entry.verified_to))
            .map_err(io_error("seek in", &entry.path))?;
        let head = entry.head.clone();
        let path = entry.path.clone();
        let max_line_bytes = self.config.max_line_bytes;
        let mut hand = hand;
        let mut torn_tail = false;
        let long = length - entry.verified_to > CHUNK_BYTES as u64;
        if !long {
            read_checked(file, &path, name, max_line_bytes, head, false, &mut |chunk| {
                let (accepted, more) = self.accept_chunk(entry, chunk, &mut torn_tail);
                hand_over(accepted, &mut refresh.fresh, &mut hand);
                more
            })?;
            refresh.torn_tail = torn_tail;
            return Ok(refresh);
        }
        // A long read: the lines are read and decoded on one thread, and checked against the
        // chain on another, while this one folds those checked before (a pipeline). What is kept
        // or handed over, and where reading stops, is the same as on one thread.
        std::thread::scope(|scope| {
            let (sender, receiver) = std::sync::mpsc::sync_channel::<CheckedChunk>(PIPELINE_CHUNKS);
            let path = &path;
            let reader = scope.spawn(move || {
                read_checked(file, path, name, max_line_bytes, head, true, &mut |chunk| {
                    sender.send(chunk).is_ok()
                })
            });
            for chunk in receiver.iter() {
                let (accepted, more) = self.accept_chunk(entry, chunk, &mut torn_tail);
                hand_over(accepted, &mut refresh.fresh, &mut hand);
                if !more {
                    break;
                }
            }
            // Stops the reader if it is ahead.
            drop(receiver);
            match reader.join() {
                Ok(read) => read?,
                Err(panic) => std::panic::resume_unwind(panic),
            }
            refresh.torn_tail = torn_tail;
            Ok(refresh)
        })
    }

    /// Takes the records of `chunk` (checked by [`read_checked`]) as the next records of
    /// `entry`'s log, and returns them, and whether reading goes on: it stops at the first line
    /// that is not a valid next record (`entry.damage`), and at the end of the file, where
    /// `torn_tail` tells whether bytes of an incomplete last line follow.
    fn accept_chunk(
        &self,
        entry: &mut DeviceFile,
        chunk: CheckedChunk,
        torn_tail: &mut bool,
    ) -> (Vec<OpRecord>, bool) {
        if entry.head.is_none() && entry.verified_to == 0 {
            // The file's first records: where it begins.
            if let Some(first) = chunk.ops.first() {
                entry.first_seq = first.seq;
                entry.begins = first.prev.filter(|_| first.seq > 0).map(|prev| (first.seq, prev));
            }
        }
        entry.offsets.reserve(chunk.lengths.len());
        for length in chunk.lengths {
            entry.offsets.push(entry.verified_to);
            entry.verified_to += length as u64;
        }
        entry.head = chunk.head;
        let more = match chunk.end {
            _ if chunk.damage.is_some() => false,
            None => true,
            Some(ChunkEnd::Complete) => false,
            Some(ChunkEnd::Incomplete) => {
                *torn_tail = true;
                false
            }
            Some(ChunkEnd::TooLong) => {
                entry.damage = Some(self.problem(
                    entry,
                    Some(entry.records() + 1),
                    format!("a line longer than {} bytes", self.config.max_line_bytes),
                ));
                false
            }
        };
        if let Some(detail) = chunk.damage {
            entry.damage = Some(self.problem(entry, Some(entry.records() + 1), detail));
        }
        (chunk.ops, more)
    }

    /// Checks a decoded line of `name` (see [`decode_lines`]) as the next record of the log that
    /// ends at `head` (`None`: an empty log), and moves `head` past it.
    fn accept_decoded(name: &str, head: &mut Option<LogHead>, decoded: Decoded) -> Result<OpRecord, String> {
        let (op, id_matches) = decoded?;
        let head = match head {
            Some(head) => head,
            None => {
                if device_file_name(&op.device_id) != name {
                    return Err(format!(
                        "the file holds records of device {:?}, whose file is {:?}",
                        op.device_id,
                        device_file_name(&op.device_id)
                    ));
                }
                let device = Arc::clone(&op.device_id);
                match (op.seq, op.prev) {
                    (0, _) => head.insert(LogHead::new(device)),
                    // A file that begins after a checkpoint ([`Relay::prune`]): checked from here
                    // on; a ledger takes it only with a checkpoint that covers what it lacks.
                    (seq, Some(prev)) => head.insert(LogHead::after(device, seq, prev)),
                    (seq, None) => {
                        return Err(format!(
                            "the first line is record {seq}, and it names no record before it"
                        ))
                    }
                }
            }
        };
        head.check_device(&op).map_err(|error| error.to_string())?;
        if !id_matches {
            // Hashed again for the error (the rare case).
            op.check_id().map_err(|error| error.to_string())?;
        }
        head.accept_identified(&op).map_err(|error| error.to_string())?;
        Ok(op)
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

    /// Reads the stored records `from..to` of `entry` (already verified once), checking them again;
    /// `prev`: the id of record `from - 1` when the caller read it, which the first must name.
    fn read_range(
        &self,
        entry: &DeviceFile,
        from: u64,
        to: u64,
        prev: Option<OpId>,
    ) -> Result<Vec<OpRecord>, String> {
        let offset = entry.offset_of(from)?;
        let mut reader = open_at(&entry.path, offset).map_err(|error| error.to_string())?;
        let mut ops = Vec::with_capacity((to - from) as usize);
        let mut line = Vec::new();
        let mut expected_prev = prev;
        for seq in from..to {
            self.read_line(&mut reader, &mut line)
                .map_err(|error| error.to_string())?;
            let op = OpRecord::from_json(without_newline(&line))
                .map_err(|error| format!("line {}: {error}", seq + 1))?;
            let chained = (seq == from && prev.is_none()) || op.prev == expected_prev;
            if op.seq != seq || !chained || !op.has_valid_id() {
                return Err(format!(
                    "line {} changed after it was verified; relay files are append-only",
                    seq + 1
                ));
            }
            expected_prev = Some(op.op_id);
            ops.push(op);
        }
        Ok(ops)
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

/// Why `path` cannot be a device log, if it exists and is something else than a regular file (a
/// folder, a FIFO, which would block every reader, a device, a dangling symbolic link).
///
/// The path itself is looked at first, then what a link leads to: another writer of the device
/// may create the file at any moment, and a file that was not there at one look and is at the
/// next is a new log, not a link to nothing (taking it for one refused a first append of two
/// writers at once as damage).
fn not_a_log_file(path: &Path) -> Option<String> {
    let kind = |metadata: &std::fs::Metadata| {
        (!metadata.is_file()).then(|| {
            format!(
                "not a regular file (a {}); a device log is a plain file",
                if metadata.is_dir() {
                    "folder"
                } else {
                    "FIFO, socket or device"
                }
            )
        })
    };
    let missing = |error: &std::io::Error| error.kind() == std::io::ErrorKind::NotFound;
    match std::fs::symlink_metadata(path) {
        Ok(found) if found.file_type().is_symlink() => match std::fs::metadata(path) {
            Ok(target) => kind(&target),
            Err(error) if missing(&error) => {
                Some("a symbolic link to nothing; a device log is a plain file".to_owned())
            }
            Err(error) => Some(format!("cannot read its metadata: {error}")),
        },
        Ok(found) => kind(&found),
        Err(error) if missing(&error) => None,
        Err(error) => Some(format!("cannot read its metadata: {error}")),
    }
}

fn open_at(path: &Path, offset: u64) -> std::io::Result<BufReader<File>> {
    let mut reader = BufReader::new(File::open(path)?);
    reader.seek(SeekFrom::Start(offset))?;
    Ok(reader)
}

/// Where an [`FsRelay`]'s reading stands ([`Relay::cursor`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FsCursor {
    files: Vec<FileCursor>,
}

/// Where the reading of one device file stands.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCursor {
    name: String,
    verified_to: u64,
    last_start: u64,
    head: HeadMark,
}

impl FsRelay {
    /// The index of a file resumed at `file`, once the file is checked against it.
    fn resumed_file(&self, file: &FileCursor) -> Result<DeviceFile, String> {
        let head = LogHead::from_mark(&file.head)
            .ok_or_else(|| format!("the cursor of {} is damaged", file.name))?;
        let (Some(_), Some(last_seq)) = (head.last_op_id(), head.next_seq().checked_sub(1)) else {
            return Err(format!("the cursor of {} names no record", file.name));
        };
        if !is_device_file_name(&file.name) || device_file_name(head.device_id()) != file.name {
            return Err(format!(
                "the cursor names {:?}, not the file of {:?}",
                file.name,
                head.device_id()
            ));
        }
        let line_bytes_ok = file
            .verified_to
            .checked_sub(file.last_start)
            .is_some_and(|length| (1..=self.config.max_line_bytes as u64 + 1).contains(&length));
        if !line_bytes_ok {
            return Err(format!("the cursor of {} is damaged", file.name));
        }
        let path = self.devices_dir.join(&file.name);
        // Where it was, or where the file holds it now (pruned since: the file begins after a
        // checkpoint, and the reading goes on where the records it read are).
        let located = self
            .locate(&path, &head, Some((file.last_start, file.verified_to)))
            .map_err(|detail| {
                format!(
                    "record {last_seq} is not where it was read: {}",
                    detail.trim_end_matches(prune::PRUNED_MARK)
                )
            })?;
        Ok(DeviceFile {
            path,
            first_seq: located.first_seq,
            offsets: located.offsets,
            verified_to: located.verified_to,
            head: Some(head),
            damage: None,
            begins: located.begins,
            identity: located.identity,
        })
    }
}

/// A device file locked for appending, with what will be written to it.
struct PendingAppend {
    name: String,
    file: File,
    path: PathBuf,
    lines: Vec<u8>,
    line_lengths: Vec<u64>,
    head: LogHead,
    created: bool,
}

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
        let (file, refresh) = self.open_for_append(&name, device_id, entry)?;
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

impl FsRelay {
    /// Opens `entry`'s file for appending, takes its exclusive lock (held until the returned file
    /// is dropped), reads what other writers appended, refuses a damaged device, and cuts off an
    /// incomplete last line (with the lock held, it is a crashed writer's).
    fn open_for_append(
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

    /// The stored records of `entry` from seq `from` on, given `fresh`, the records just read by
    /// `refresh` (the last ones of the file).
    fn records_from(
        &self,
        entry: &DeviceFile,
        from: u64,
        fresh: Vec<OpRecord>,
    ) -> Result<Vec<OpRecord>, String> {
        let Some(head) = &entry.head else {
            return Ok(Vec::new());
        };
        let first_fresh = head.next_seq() - fresh.len() as u64;
        let mut ops = Vec::new();
        if from < first_fresh {
            ops = self.read_range(entry, from, first_fresh, None)?;
        }
        let skip = usize::try_from(from.saturating_sub(first_fresh)).unwrap_or(usize::MAX);
        if ops.is_empty() && skip == 0 {
            return Ok(fresh); // the usual case: no copy
        }
        ops.extend(fresh.into_iter().skip(skip));
        Ok(ops)
    }

    /// Encodes `fresh` (checked records continuing the file) for [`write`](Self::write).
    #[allow(clippy::too_many_arguments)]
    fn encode(
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
    fn write(
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
    fn stored_op_id(
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

impl FsRelay {
    /// Reads one line into `line` (cleared first), at most `max_line_bytes + 1` bytes, so that a
    /// file without newlines is never read whole. Returns the bytes read; a complete line ends
    /// with `\n`.
    fn read_line(&self, reader: &mut BufReader<File>, line: &mut Vec<u8>) -> std::io::Result<usize> {
        line.clear();
        reader
            .take(self.config.max_line_bytes as u64 + 1)
            .read_until(b'\n', line)
    }
}

/// Where [`FsRelay::refresh`] hands records over instead of keeping them: `each` gets those the
/// caller lacks (from its frontier of the device on).
struct Hand<'a> {
    since: &'a Frontier,
    each: &'a mut dyn FnMut(Vec<OpRecord>),
    /// Set at the first records: whether they begin after the caller's next seq (a file that
    /// begins after a checkpoint the caller has not started from), and then nothing is handed.
    gap: Option<bool>,
}

/// Keeps `accepted` (one chunk's verified records, in seq order) in `fresh`, or hands those the
/// caller lacks over.
fn hand_over(mut accepted: Vec<OpRecord>, fresh: &mut Vec<OpRecord>, hand: &mut Option<Hand<'_>>) {
    let Some(hand) = hand else {
        fresh.append(&mut accepted);
        return;
    };
    let Some(first) = accepted.first() else {
        return;
    };
    let from = hand.since.next_seq(&first.device_id);
    if *hand.gap.get_or_insert(first.seq > from) {
        return;
    }
    if first.seq < from {
        accepted.retain(|op| op.seq >= from);
    }
    if !accepted.is_empty() {
        (hand.each)(accepted);
    }
}

/// The bytes [`FsRelay::refresh`] reads before it decodes the lines in them (a line may be
/// longer).
const CHUNK_BYTES: usize = 1 << 18;
/// The most records read again from a device file that [`FsRelay`]'s `pull_in_batches` hands
/// over at once.
const STORED_BATCH: u64 = 65_536;
/// How many chunks of records the reading thread of a long read may be ahead of the fold.
const PIPELINE_CHUNKS: usize = 2;
/// Below this many lines, a chunk is decoded on the calling thread alone.
const PARALLEL_LINES: usize = 512;
/// How many threads help the reading thread decode a chunk's pieces.
const DECODE_HELPERS: usize = 1;
/// The lines of a piece that one thread decodes (see [`decode_lines`]).
const PIECE_LINES: usize = 256;

/// A decoded line: the record, and whether its `op_id` is what its content hashes to (within the
/// limits); or why it does not decode.
type Decoded = Result<(OpRecord, bool), String>;

/// Records of a device file, read, decoded and checked against its chain ([`read_checked`]).
struct CheckedChunk {
    /// The records that are valid next records, in order.
    ops: Vec<OpRecord>,
    /// Each one's line length, its newline included.
    lengths: Vec<usize>,
    /// The head of the log after them.
    head: Option<LogHead>,
    /// Why the line after them is not a valid next record, if it is not.
    damage: Option<String>,
    /// What follows the lines when reading stopped after them; `None` when more follow.
    end: Option<ChunkEnd>,
}

/// Why reading a device file stopped after a chunk.
enum ChunkEnd {
    /// The file ends after the last line.
    Complete,
    /// Bytes of a line without its newline follow (a write or a sync in progress).
    Incomplete,
    /// The next line is longer than the longest line allowed.
    TooLong,
}

/// Lines of a device file, read and decoded ([`read_decoded`]), not yet checked.
struct DecodedChunk {
    /// Each line's length, its newline included.
    lengths: Vec<usize>,
    /// What each line decodes to, in order, in pieces ([`decode_lines`]).
    pieces: Vec<Vec<Decoded>>,
    /// What follows the lines when reading stopped after them; `None` when more follow.
    end: Option<ChunkEnd>,
}

/// Reads the lines of `file` (at `path`, the file `name` of the devices folder) from where it
/// stands, a chunk at a time: decodes them ([`decode_lines`]) and checks them in order as the
/// next records of the log that ends at `head`. `deliver` gets each chunk, and returns false to
/// stop reading; reading stops after a line that is not a valid next record. `pipelined`: the
/// lines are read and decoded on another thread while this one checks those before.
fn read_checked(
    file: File,
    path: &Path,
    name: &str,
    max_line_bytes: usize,
    mut head: Option<LogHead>,
    pipelined: bool,
    deliver: &mut dyn FnMut(CheckedChunk) -> bool,
) -> Result<(), RelayError> {
    let device = head.as_ref().map(|head| Arc::clone(head.device_id()));
    let mut check = |decoded: DecodedChunk| {
        let checked = check_chunk(name, &mut head, decoded);
        let last = checked.damage.is_some() || checked.end.is_some();
        deliver(checked) && !last
    };
    if !pipelined {
        return read_decoded(file, path, max_line_bytes, device, &mut check);
    }
    std::thread::scope(|scope| {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<DecodedChunk>(PIPELINE_CHUNKS);
        let reader = scope.spawn(move || {
            read_decoded(file, path, max_line_bytes, device, &mut |chunk| {
                sender.send(chunk).is_ok()
            })
        });
        for decoded in receiver.iter() {
            if !check(decoded) {
                break;
            }
        }
        // Stops the reader if it is ahead.
        drop(receiver);
        match reader.join() {
            Ok(read) => read,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Checks the lines of `decoded` in order as the next records of the log that ends at `head`
/// (of the file `name`), up to the first that is not a valid next record.
fn check_chunk(name: &str, head: &mut Option<LogHead>, decoded: DecodedChunk) -> CheckedChunk {
    let mut checked = CheckedChunk {
        ops: Vec::with_capacity(decoded.lengths.len()),
        lengths: Vec::with_capacity(decoded.lengths.len()),
        head: None,
        damage: None,
        end: decoded.end,
    };
    let mut lengths = decoded.lengths.iter();
    // The chunk's records share one allocation of the device id, one of their own: the thread
    // that folds them reads it and drops them while this one goes on with the next chunk.
    let mut device: Option<Arc<str>> = None;
    'pieces: for piece in decoded.pieces {
        for (line, &length) in piece.into_iter().zip(&mut lengths) {
            match FsRelay::accept_decoded(name, head, line) {
                Ok(mut op) => {
                    let device = device.get_or_insert_with(|| Arc::clone(&op.device_id));
                    if !Arc::ptr_eq(&op.device_id, device) {
                        op.device_id = Arc::clone(device);
                    }
                    if !Arc::ptr_eq(&op.hlc.device_id, device) {
                        op.hlc.device_id = Arc::clone(device);
                    }
                    checked.ops.push(op);
                    checked.lengths.push(length);
                }
                Err(detail) => {
                    checked.damage = Some(detail);
                    break 'pieces;
                }
            }
        }
    }
    if checked.damage.is_none() && checked.lengths.len() < decoded.lengths.len() {
        // Not reached: every line has a result.
        checked.damage = Some("a line was not decoded".to_owned());
    }
    if checked.damage.is_some() {
        checked.end = None;
    }
    checked.head = head.clone();
    checked
}

/// Reads the lines of `file` (at `path`) from where it stands, a chunk at a time, and decodes
/// them ([`decode_lines`]); `deliver` gets each chunk, and returns false to stop reading.
/// Records of `device` share its allocation of the id (of the file's first record when `None`).
fn read_decoded(
    mut file: File,
    path: &Path,
    max_line_bytes: usize,
    mut device: Option<Arc<str>>,
    deliver: &mut dyn FnMut(DecodedChunk) -> bool,
) -> Result<(), RelayError> {
    // The bytes read and not yet taken apart: whole lines, then the start of the next one.
    let mut chunk: Vec<u8> = Vec::with_capacity(CHUNK_BYTES);
    let mut ends: Vec<usize> = Vec::new();
    let mut at_end = false;
    loop {
        // At least a chunk, and on until a line ends (up to the longest line allowed).
        let mut newline = memchr::memchr(b'\n', &chunk).is_some();
        while !at_end && (chunk.len() < CHUNK_BYTES || (!newline && chunk.len() <= max_line_bytes)) {
            let before = chunk.len();
            let read = (&mut file)
                .take(CHUNK_BYTES as u64)
                .read_to_end(&mut chunk)
                .map_err(io_error("read", path))?;
            at_end = read == 0;
            newline = newline || memchr::memchr(b'\n', &chunk[before..]).is_some();
        }
        ends.clear();
        ends.extend(memchr::memchr_iter(b'\n', &chunk).map(|index| index + 1));
        // An allocation of the device id for this chunk's records (see `check_chunk`).
        let shared: Option<Arc<str>> = device.as_deref().map(Arc::from);
        let mut pieces = decode_lines(&chunk, &ends, shared.as_ref());
        if device.is_none() {
            device = pieces
                .iter()
                .flatten()
                .find_map(|line| line.as_ref().ok().map(|(op, _)| Arc::clone(&op.device_id)));
        }
        let mut lengths = Vec::with_capacity(ends.len());
        let mut start = 0;
        for (&end, line) in ends.iter().zip(pieces.iter_mut().flatten()) {
            let length = end - start;
            if length > max_line_bytes + 1 {
                *line = Err(format!("a line longer than {max_line_bytes} bytes"));
            }
            lengths.push(length);
            start = end;
        }
        chunk.drain(..start);
        let end = if chunk.len() > max_line_bytes {
            Some(ChunkEnd::TooLong)
        } else if at_end && chunk.is_empty() {
            Some(ChunkEnd::Complete)
        } else if at_end {
            Some(ChunkEnd::Incomplete)
        } else {
            None
        };
        let last = end.is_some();
        if !deliver(DecodedChunk { lengths, pieces, end }) || last {
            return Ok(());
        }
    }
}

/// Decodes the lines of `chunk` (each ending at the matching offset of `ends`, newline included)
/// and checks each record's id: the results in order, one per line, in pieces. With enough lines and cores, the
/// lines are cut into pieces that this thread and a helper take in turn, so that a thread that
/// gets less time (the fold runs beside them) does fewer pieces. Records of `device` share its
/// allocation of the id.
fn decode_lines(chunk: &[u8], ends: &[usize], device: Option<&Arc<str>>) -> Vec<Vec<Decoded>> {
    let decode = |lines: std::ops::Range<usize>| -> Vec<Decoded> {
        let mut start = lines.start.checked_sub(1).map_or(0, |before| ends[before]);
        ends[lines]
            .iter()
            .map(|&end| {
                let line = without_newline(&chunk[start..end]);
                start = end;
                OpRecord::from_json_sharing(line, device)
                    .map(|op| {
                        let id_matches = op.check_id().is_ok();
                        (op, id_matches)
                    })
                    .map_err(|error| error.to_string())
            })
            .collect()
    };
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    if ends.len() < PARALLEL_LINES || cores < 2 {
        return vec![decode(0..ends.len())];
    }
    let pieces: Vec<std::ops::Range<usize>> = (0..ends.len())
        .step_by(PIECE_LINES)
        .map(|start| start..(start + PIECE_LINES).min(ends.len()))
        .collect();
    let decoded: Vec<std::sync::OnceLock<Vec<Decoded>>> =
        pieces.iter().map(|_| std::sync::OnceLock::new()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        while let Some(lines) = pieces.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
            let index = lines.start / PIECE_LINES;
            let _ = decoded[index].set(decode(lines.clone()));
        }
    };
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (0..DECODE_HELPERS).map(|_| scope.spawn(work)).collect();
        work();
        for helper in helpers {
            if let Err(panic) = helper.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    decoded
        .into_iter()
        .zip(pieces)
        .map(|(piece, lines)| {
            // Every piece was taken and decoded before the helper was joined; a line is never
            // dropped, even if that were not so.
            piece.into_inner().unwrap_or_else(|| {
                lines
                    .map(|_| Err("the line was not decoded".to_owned()))
                    .collect()
            })
        })
        .collect()
}

/// A line without its trailing newline.
fn without_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

fn sync_dir(dir: &Path) -> Result<(), RelayError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(io_error("sync folder", dir))
}
