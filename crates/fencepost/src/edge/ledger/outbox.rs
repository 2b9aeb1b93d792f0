//! The outbox ([`LedgerOptions::outbox`](super::LedgerOptions::outbox)): records this site asked
//! for that the relay could not store (a database restarting, a lost connection), kept in a file
//! of the site until one of its ledgers stores them. An outcome of a command that ran is never
//! dropped because the database was away for a while.
//!
//! The file holds one JSON object per line: the device, the record's surface and payload. It is
//! appended to and synced before [`Ledger::queue_unsent`] returns; a ledger opened with it stores
//! what it holds before anything else ([`Ledger::open_with`]), then removes it, both under the
//! lock of `<file>.lock`, so two processes never store one queue twice or drop what the other
//! queued meanwhile. A last line cut short (a crash while it was written, before anyone was told
//! it was queued) is left out; any other line that does not read is an error that names it, and
//! the file stays as it is.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Ledger;
use crate::clock::RealTimeLimit;
use crate::lease::Intent;
use crate::ledger::LedgerError;
use crate::oplog::Surface;

/// How long a process waits for another one's lock on the outbox: it is held to read, append or
/// store it, which takes one relay call at most (bounded: 11 s by default for PostgreSQL).
const LOCK_WAIT: Duration = Duration::from_secs(15);

/// One queued record, as a line of the outbox.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    device_id: String,
    surface: Surface,
    payload: Value,
}

/// A record waiting in an outbox ([`read_outbox`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueuedRecord {
    /// The device whose log it goes to.
    pub device_id: String,
    /// What it is about.
    pub surface: Surface,
    /// Its content.
    pub payload: Value,
}

impl QueuedRecord {
    /// The intent it records, when it is one.
    pub fn intent(&self) -> Option<Intent> {
        (self.surface == Surface::Intent)
            .then(|| Intent::from_payload(&self.payload))
            .flatten()
    }
}

/// The records waiting in the outbox `path` (none when the file does not exist), without taking
/// its lock or changing it: for a status report.
///
/// # Errors
/// [`LedgerError::Outbox`] when the file cannot be read or a line of it is damaged.
pub fn read_outbox(path: &Path) -> Result<Vec<QueuedRecord>, LedgerError> {
    Ok(read(path)?
        .into_iter()
        .map(|line| QueuedRecord {
            device_id: line.device_id,
            surface: line.surface,
            payload: line.payload,
        })
        .collect())
}

fn outbox_error(path: &Path, detail: impl Into<String>) -> LedgerError {
    LedgerError::Outbox {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// The lines of the outbox, checked: each reads, and an intent names valid ids and an epoch a
/// coordinator mints.
fn read(path: &Path) -> Result<Vec<Line>, LedgerError> {
    let mut file = match open_regular(path, OpenOptions::new().read(true)) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(outbox_error(path, format!("cannot read it: {error}"))),
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)
        .map_err(|error| outbox_error(path, format!("cannot read it: {error}")))?;
    let ends_complete = bytes.last().is_none_or(|byte| *byte == b'\n');
    let pieces: Vec<&[u8]> = bytes.split(|byte| *byte == b'\n').collect();
    let mut lines = Vec::new();
    for (index, piece) in pieces.iter().enumerate() {
        if piece.is_empty() {
            continue;
        }
        let last = index + 1 == pieces.len();
        let line = serde_json::from_slice::<Line>(piece)
            .map_err(|error| error.to_string())
            .and_then(|line| check(&line).map(|()| line));
        match line {
            Ok(line) => lines.push(line),
            Err(_) if last && !ends_complete => {
                tracing::warn!(outbox = %path.display(), "the outbox's last line was cut short (a crash while it was written); leaving it out");
            }
            Err(error) => {
                return Err(outbox_error(
                    path,
                    format!("line {} is damaged ({error}); nothing of it was stored or removed: repair the line or record the run with `fencepost ledger resolve`, then remove the file", index + 1),
                ))
            }
        }
    }
    Ok(lines)
}

/// Whether a line is one this code could have queued.
fn check(line: &Line) -> Result<(), String> {
    crate::id::validate_id(crate::id::IdKind::Device, &line.device_id).map_err(|error| error.to_string())?;
    if line.surface != Surface::Intent {
        return Ok(());
    }
    let intent = Intent::from_payload(&line.payload).ok_or("not an intent record")?;
    crate::id::validate_id(crate::id::IdKind::Agent, &intent.agent_id).map_err(|error| error.to_string())?;
    crate::id::validate_id(crate::id::IdKind::Run, &intent.run_id).map_err(|error| error.to_string())?;
    if !(1..=crate::lease::MAX_EPOCH).contains(&intent.epoch) {
        return Err(format!("epoch {} is not one a coordinator mints", intent.epoch));
    }
    Ok(())
}

/// Opens `path` with `options` only when it is a regular file, or none (found by an adversarial
/// test: a FIFO in its place made every command hang on the open).
fn open_regular(path: &Path, options: &OpenOptions) -> std::io::Result<File> {
    let not_regular = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it is not a regular file (a FIFO, a socket, a device or a folder?): move it away",
        )
    };
    match std::fs::metadata(path) {
        Ok(metadata) if !metadata.is_file() => return Err(not_regular()),
        _ => {}
    }
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(file)
}

/// The outbox's lock, held until dropped.
struct Locked {
    _file: File,
}

fn lock(path: &Path) -> Result<Locked, LedgerError> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let file = open_regular(
        Path::new(&lock_path),
        OpenOptions::new().create(true).truncate(false).write(true),
    )
    .map_err(|error| {
        outbox_error(
            path,
            format!(
                "cannot open its lock {}: {error}",
                PathBuf::from(&lock_path).display()
            ),
        )
    })?;
    let limit = RealTimeLimit::starting_now(LOCK_WAIT);
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Locked { _file: file }),
            Err(TryLockError::WouldBlock) if !limit.passed() => {
                if !told && limit.elapsed() > Duration::from_secs(1) {
                    told = true;
                    tracing::warn!(outbox = %path.display(), "waiting for another process's lock on the outbox (it writes the records queued on this site)");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(outbox_error(
                    path,
                    format!(
                        "another process held its lock for {} s (`fuser {}` names it)",
                        LOCK_WAIT.as_secs(),
                        PathBuf::from(&lock_path).display()
                    ),
                ))
            }
            Err(TryLockError::Error(error)) => {
                return Err(outbox_error(path, format!("cannot lock it: {error}")))
            }
        }
    }
}

/// Appends `lines` to the outbox and syncs it (and its folder, when it was made).
fn append(path: &Path, lines: &[Line]) -> Result<(), LedgerError> {
    let failed = |error: std::io::Error| outbox_error(path, format!("cannot write it: {error}"));
    let mut text = Vec::new();
    for line in lines {
        serde_json::to_writer(&mut text, line).map_err(|error| failed(error.into()))?;
        text.push(b'\n');
    }
    let existed = path.exists();
    let mut file = open_regular(
        path,
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true),
    )
    .map_err(failed)?;
    // A last line cut short by an earlier crash is left out by every reader: it goes, so that it
    // does not become a damaged line in the middle (found by an adversarial test: the next
    // queued outcome made it one, and every command of the host stopped).
    let end = complete_length(&mut file).map_err(failed)?;
    file.set_len(end).map_err(failed)?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(end)).map_err(failed)?;
    file.write_all(&text).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    if !existed {
        if let Some(folder) = path.parent().filter(|folder| !folder.as_os_str().is_empty()) {
            File::open(folder)
                .and_then(|folder| folder.sync_all())
                .map_err(failed)?;
        }
    }
    Ok(())
}

/// The length of the file up to the end of its last complete line.
fn complete_length(file: &mut File) -> std::io::Result<u64> {
    let mut bytes = Vec::new();
    std::io::Seek::seek(file, std::io::SeekFrom::Start(0))?;
    std::io::Read::read_to_end(file, &mut bytes)?;
    Ok(bytes
        .iter()
        .rposition(|byte| *byte == b'\n')
        .map_or(0, |last| last as u64 + 1))
}

impl Ledger {
    /// Stores what the outbox holds for this device, first in this ledger's queue, then removes
    /// it (all under its lock); how many records it held. Other devices' lines (a file shared
    /// by mistake) are left for their own ledgers.
    pub(super) fn store_outbox(&mut self) -> Result<usize, LedgerError> {
        let Some(path) = self.outbox.clone() else {
            return Ok(0);
        };
        let _locked = lock(&path)?;
        let lines = read(&path)?;
        if lines.is_empty() {
            return Ok(0);
        }
        let (own, others): (Vec<Line>, Vec<Line>) = lines
            .into_iter()
            .partition(|line| line.device_id == self.device_id());
        if own.is_empty() {
            return Ok(0);
        }
        let count = own.len();
        // Called by the open, before anything else is queued.
        debug_assert!(self.unsent.is_empty());
        self.unsent = own.into_iter().map(|line| (line.surface, line.payload)).collect();
        if let Err(error) = self.write_queued() {
            // The file still holds them: they are stored by the next ledger opened with it.
            self.unsent.clear();
            return Err(LedgerError::Queued {
                path,
                count,
                source: Box::new(error),
            });
        }
        let remove = || -> std::io::Result<()> {
            let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
            if others.is_empty() {
                return std::fs::remove_file(&path);
            }
            let mut text = Vec::new();
            for line in &others {
                serde_json::to_writer(&mut text, line)?;
                text.push(b'\n');
            }
            std::fs::write(&temporary, text)?;
            File::open(&temporary)?.sync_all()?;
            std::fs::rename(&temporary, &path)
        };
        remove().map_err(|error| {
            outbox_error(
                &path,
                format!("its records were stored, but it could not be emptied ({error}): remove it by hand (storing them again would only repeat their outcomes)"),
            )
        })?;
        tracing::info!(outbox = %path.display(), stored = count, "stored the records queued on this site");
        Ok(count)
    }

    /// Moves the records that could not be stored yet ([`unsent`](Self::unsent)) into the
    /// outbox ([`LedgerOptions::outbox`](super::LedgerOptions::outbox)), synced to disk, so that
    /// the next ledger of this site opened with it stores them; returns how many. 0, moving
    /// nothing, without an outbox.
    ///
    /// # Errors
    /// [`LedgerError::Outbox`] when the file cannot be locked or written; the records stay
    /// queued here.
    pub fn queue_unsent(&mut self) -> Result<usize, LedgerError> {
        let Some(path) = self.outbox.clone() else {
            return Ok(0);
        };
        if self.unsent.is_empty() {
            return Ok(0);
        }
        let lines: Vec<Line> = self
            .unsent
            .iter()
            .map(|(surface, payload)| Line {
                device_id: self.device_id().to_owned(),
                surface: surface.clone(),
                payload: payload.clone(),
            })
            .collect();
        let _locked = lock(&path)?;
        append(&path, &lines)?;
        let count = self.unsent.len();
        self.unsent.clear();
        tracing::warn!(outbox = %path.display(), queued = count, "queued records the ledger could not store yet on this site");
        Ok(count)
    }

    /// Stores the queued records ([`flush`](Self::flush)), trying again while the relay's
    /// failure may pass by itself ([`LedgerError::is_transient`]: a database restarting, a
    /// lost connection) and `limit` has not passed: pauses from 100 ms, doubled up to 2 s.
    /// Returns how many were stored.
    ///
    /// # Errors
    /// The last error, when `limit` passed or the failure will not pass by itself; the records
    /// stay queued ([`queue_unsent`](Self::queue_unsent) keeps them on the site).
    pub fn flush_within(&mut self, limit: Duration) -> Result<usize, LedgerError> {
        self.flush_while(limit, || true)
    }

    /// [`flush_within`](Self::flush_within), giving up the tries as soon as `go_on` says no (it
    /// is asked before each pause): a caller that stops for a signal queues the records at once.
    ///
    /// # Errors
    /// As [`flush_within`](Self::flush_within).
    pub fn flush_while(&mut self, limit: Duration, go_on: impl Fn() -> bool) -> Result<usize, LedgerError> {
        let limit = RealTimeLimit::starting_now(limit);
        let mut pause = Duration::from_millis(100);
        loop {
            match self.flush() {
                Err(error) if error.is_transient() && limit.remaining() > pause && go_on() => {
                    tracing::warn!(%error, "could not store the queued records; trying again");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                ended => return ended,
            }
        }
    }
}
