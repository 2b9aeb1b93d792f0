//! Device files that begin after a checkpoint: removing the records a checkpoint covers from the
//! device's own file ([`Relay::prune`](crate::relay::Relay::prune)), finding where a reading
//! stands in a file that was replaced (pruned, or copied anew by a sync tool), and telling where
//! each file begins.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use super::{
    device_file_name, io_error, is_device_file_name, not_a_log_file, open_at, sync_dir, without_newline,
    DeviceFile, FsRelay,
};
use crate::oplog::{LogHead, OpId, OpRecord};
use crate::relay::{ProblemKind, RelayError, RelayProblem};

/// Which file `metadata` is (device and inode), where the platform says.
/// The end of what [`FsRelay::locate`] says when the file begins after the records it looks
/// for (removed since): a problem of kind [`ProblemKind::Pruned`].
pub(super) const PRUNED_MARK: &str = " (pruned)";

pub(super) fn file_identity(metadata: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((metadata.dev(), metadata.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = metadata;
        None
    }
}

/// Where a reading stands in a device file: what [`FsRelay::locate`] found.
pub(super) struct Located {
    /// The seq of the first indexed record.
    pub(super) first_seq: u64,
    /// Where each indexed record starts.
    pub(super) offsets: Vec<u64>,
    /// The end of the indexed records.
    pub(super) verified_to: u64,
    /// Where the file begins, when after record 0.
    pub(super) begins: Option<(u64, OpId)>,
    /// Which file it is.
    pub(super) identity: Option<(u64, u64)>,
}

impl FsRelay {
    /// The first record of the file at `path` (`None`: empty or no such file), and the file.
    fn first_record(&self, path: &Path) -> Result<Option<(OpRecord, u64, BufReader<File>)>, String> {
        let mut reader = match open_at(path, 0) {
            Ok(reader) => reader,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(format!("{}: {error}", path.display())),
        };
        let mut line = Vec::new();
        self.read_line(&mut reader, &mut line)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        if line.is_empty() {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            return Err(format!("{}: its first line is incomplete", path.display()));
        }
        let op = OpRecord::from_json(without_newline(&line))
            .map_err(|error| format!("{}: line 1: {error}", path.display()))?;
        Ok(Some((op, line.len() as u64, reader)))
    }

    /// Finds, in the file at `path`, where the reading that ended at `head` stands: the line of
    /// `head`'s last record (first at `hint`, where it was: the usual case of a sync tool's
    /// new copy), else by counting lines from where the file begins (a file pruned since); or,
    /// when the file begins right after that record, its start. `Err` says why it cannot be:
    /// the file lost records not read yet, or holds others.
    pub(super) fn locate(
        &self,
        path: &Path,
        head: &LogHead,
        hint: Option<(u64, u64)>,
    ) -> Result<Located, String> {
        let (Some(last_op_id), Some(last_seq)) = (head.last_op_id(), head.next_seq().checked_sub(1)) else {
            return Err("nothing was read from it".to_owned());
        };
        if let Some(detail) = not_a_log_file(path) {
            return Err(format!("{}: {detail}", path.display()));
        }
        let metadata = std::fs::metadata(path).map_err(|error| format!("{}: {error}", path.display()))?;
        let identity = file_identity(&metadata);
        let same = |op: &OpRecord| {
            op.op_id == last_op_id
                && op.seq == last_seq
                && head.last_hlc().is_none_or(|hlc| *hlc == op.hlc)
                && op.device_id == *head.device_id()
                && op.check_id().is_ok()
        };
        let mut line = Vec::new();
        if let Some((start, end)) = hint {
            let mut reader = open_at(path, start).map_err(|error| format!("{}: {error}", path.display()))?;
            self.read_line(&mut reader, &mut line)
                .map_err(|error| format!("{}: {error}", path.display()))?;
            let found = metadata.len() >= end
                && line.len() as u64 == end - start
                && line.last() == Some(&b'\n')
                && OpRecord::from_json(without_newline(&line)).is_ok_and(|op| same(&op));
            if found {
                return Ok(Located {
                    first_seq: last_seq,
                    offsets: vec![start],
                    verified_to: end,
                    begins: None,
                    identity,
                });
            }
        }
        let Some((first, first_length, mut reader)) = self.first_record(path)? else {
            return Err(format!(
                "{} is empty, after {} records were read from it",
                path.display(),
                head.next_seq()
            ));
        };
        let begins = first.prev.filter(|_| first.seq > 0).map(|prev| (first.seq, prev));
        if first.seq == head.next_seq() && first.prev == Some(last_op_id) {
            // It begins right after what was read.
            return Ok(Located {
                first_seq: first.seq,
                offsets: Vec::new(),
                verified_to: 0,
                begins,
                identity,
            });
        }
        if first.seq > last_seq {
            return Err(format!(
                "{} begins at record {}: records {}..{} were removed before they were read here{PRUNED_MARK}",
                path.display(),
                first.seq,
                head.next_seq(),
                first.seq - 1
            ));
        }
        // Counts lines from the first record's to the last one read.
        let mut start = 0;
        let mut length = first_length;
        let lines_before = last_seq - first.seq;
        let mut op = Some(first);
        for _ in 0..lines_before {
            start += length;
            self.read_line(&mut reader, &mut line)
                .map_err(|error| format!("{}: {error}", path.display()))?;
            length = line.len() as u64;
            op = None;
            if line.last() != Some(&b'\n') {
                break;
            }
        }
        let op = match op {
            Some(op) => Some(op),
            None => OpRecord::from_json(without_newline(&line)).ok(),
        };
        if !op.is_some_and(|op| same(&op)) {
            return Err(format!(
                "record {last_seq} of {} is not the one read before",
                path.display()
            ));
        }
        Ok(Located {
            first_seq: last_seq,
            offsets: vec![start],
            verified_to: start + length,
            begins,
            identity,
        })
    }

    /// Whether `file` (open, `length` bytes long) holds the last record `entry` read where it
    /// read it (one line read at that place): what tells a file from another one that the file
    /// system gave the same identity (the number of a file removed, reused). A file shorter
    /// than what was read is the caller's to report.
    pub(super) fn holds_last_read(file: &File, entry: &DeviceFile, length: u64) -> bool {
        use std::io::{Seek, SeekFrom};
        let (Some(head), Some(start)) = (entry.head.as_ref(), entry.offsets.last()) else {
            return true;
        };
        let (Some(last_op_id), Some(last_seq)) = (head.last_op_id(), head.next_seq().checked_sub(1)) else {
            return true;
        };
        if length < entry.verified_to {
            return true;
        }
        let Some(size) = entry
            .verified_to
            .checked_sub(*start)
            .and_then(|size| usize::try_from(size).ok())
            .filter(|size| (1..=1 << 24).contains(size))
        else {
            return true;
        };
        let mut line = vec![0; size];
        let mut reader = file;
        if reader.seek(SeekFrom::Start(*start)).is_err() || reader.read_exact(&mut line).is_err() {
            return false;
        }
        line.last() == Some(&b'\n')
            && OpRecord::from_json(without_newline(&line))
                .is_ok_and(|op| op.op_id == last_op_id && op.seq == last_seq)
    }

    /// Points `entry` at the file now at its path, which must hold what `entry` read (see
    /// [`locate`](Self::locate)); an entry that read nothing starts over.
    pub(super) fn relocate(&self, entry: &mut DeviceFile) -> Result<(), RelayProblem> {
        let Some(head) = entry.head.clone() else {
            entry.first_seq = 0;
            entry.offsets.clear();
            entry.verified_to = 0;
            entry.begins = None;
            return Ok(());
        };
        let hint = entry.offsets.last().map(|start| (*start, entry.verified_to));
        let located = self.locate(&entry.path, &head, hint).map_err(|detail| {
            let pruned = detail.ends_with(PRUNED_MARK);
            let detail = detail.trim_end_matches(PRUNED_MARK);
            let mut problem = self.problem(entry, None, format!("the file was replaced, and {detail}"));
            if pruned {
                problem.kind = ProblemKind::Pruned;
            }
            problem
        })?;
        tracing::debug!(file = %entry.path.display(), "another file under the device file's name; reading on where it holds what was read");
        entry.first_seq = located.first_seq;
        entry.offsets = located.offsets;
        entry.verified_to = located.verified_to;
        entry.begins = located.begins.or(entry.begins);
        entry.identity = located.identity;
        Ok(())
    }

    /// The problem of a pull from `since` when `entry`'s file begins after the caller's next
    /// record of its device: the records between were removed after a checkpoint covered them.
    pub(super) fn pruned_gap(
        &self,
        entry: &DeviceFile,
        since: &crate::relay::Frontier,
    ) -> Option<RelayProblem> {
        let (first, _) = entry.begins?;
        let head = entry.head.as_ref()?;
        let has = since.next_seq(head.device_id());
        (has < first).then(|| {
            let mut problem = self.problem(
                entry,
                None,
                format!(
                    "the file begins at record {first}: records {has}..{} were removed after a checkpoint covered them (ledger compact --prune), and this reading does not start from one that does",
                    first - 1
                ),
            );
            problem.kind = ProblemKind::Pruned;
            problem
        })
    }

    /// The problem of a pull from `since` when `entry`'s file holds fewer records than the
    /// caller read of its device (from a checkpoint, or a snapshot): it lost records, or a
    /// synced folder has not brought them yet.
    pub(super) fn behind_reader(
        &self,
        entry: &DeviceFile,
        since: &crate::relay::Frontier,
    ) -> Option<RelayProblem> {
        let head = entry.head.as_ref()?;
        let has = since.next_seq(head.device_id());
        (has > head.next_seq() && entry.damage.is_none()).then(|| {
            let mut problem = self.problem(
                entry,
                None,
                format!(
                    "the file holds {} records, and this reading starts after {has} of them (a checkpoint or this site's snapshot read them): not synced here yet (run again once it is), or it lost records (restore it from a copy)",
                    head.next_seq()
                ),
            );
            problem.kind = ProblemKind::Behind;
            problem
        })
    }

    /// Where each device file begins, for those that begin after record 0: its device, the seq
    /// of its first record and the id of the record before it. Reads each file's first line.
    pub(super) fn file_starts(&self) -> Result<BTreeMap<String, (u64, OpId)>, RelayError> {
        let mut starts = BTreeMap::new();
        let listing = std::fs::read_dir(&self.devices_dir).map_err(io_error("list", &self.devices_dir))?;
        for item in listing {
            let item = item.map_err(io_error("list", &self.devices_dir))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !is_device_file_name(&name) || not_a_log_file(&item.path()).is_some()
            {
                continue;
            }
            // A first line that cannot be read is the pull's to report.
            if let Ok(Some((op, _, _))) = self.first_record(&item.path()) {
                if let (1.., Some(prev), true) = (op.seq, op.prev, device_file_name(&op.device_id) == name) {
                    starts.insert(op.device_id.to_string(), (op.seq, prev));
                }
            }
        }
        Ok(starts)
    }

    /// Removes from `device_id`'s file the records before seq `keep_from`, which follow record
    /// `keep_from - 1` of id `prev` (checked), under the file's exclusive lock: the rest is
    /// written to a new file that replaces it. Keeps the last record whatever `keep_from` says
    /// (the file must show where the log stands). Returns how many records were removed.
    pub(super) fn prune_file(
        &self,
        device_id: &str,
        through_seq: u64,
        through_id: OpId,
    ) -> Result<u64, RelayError> {
        crate::id::validate_id(crate::id::IdKind::Device, device_id)?;
        let name = device_file_name(device_id);
        let mut files = self.lock_files();
        let entry = Self::entry(&mut files, &self.devices_dir, &name);
        let damaged = |entry: &DeviceFile, detail: String| RelayError::DeviceDamaged {
            device_id: device_id.to_owned(),
            problem: RelayProblem {
                kind: ProblemKind::Damage,
                device_id: Some(device_id.to_owned()),
                file: Some(entry.path.clone()),
                line_number: None,
                detail,
            },
        };
        let (file, _) = self.open_for_append(&name, device_id, entry)?;
        if entry.identity.is_none() {
            return Err(RelayError::Unsupported(
                "pruning a device file needs a platform that tells files apart (Unix)".to_owned(),
            ));
        }
        let Some(head) = entry.head.clone() else {
            return Ok(0);
        };
        let begins = entry.begins.map_or(0, |(first, _)| first);
        let last = head.next_seq() - 1;
        let keep_from = through_seq.saturating_add(1).min(last);
        if keep_from <= begins {
            return Ok(0); // pruned already
        }
        if keep_from - 1 < entry.first_seq || through_seq.min(last) < entry.first_seq {
            return Err(RelayError::Unsupported(format!(
                "{} was not read from its start by this process: prune from one that did",
                entry.path.display()
            )));
        }
        let mut reader = None;
        let stored = self
            .stored_op_id(entry, through_seq.min(last), &mut reader)
            .map_err(|detail| damaged(entry, detail))?;
        if through_seq > last || stored != through_id {
            return Err(damaged(
                entry,
                format!("record {through_seq} of the file is not the one the checkpoint covers; nothing was removed"),
            ));
        }
        let prev = self
            .stored_op_id(entry, keep_from - 1, &mut None)
            .map_err(|detail| damaged(entry, detail))?;
        let start = entry
            .offset_of(keep_from)
            .map_err(|detail| damaged(entry, detail))?;
        let path = entry.path.clone();
        // Leftovers of a prune killed before its rename (the lock is held: none is in progress).
        let leftover = format!(".pruning-{name}-");
        if let Ok(listing) = std::fs::read_dir(&self.devices_dir) {
            for item in listing.flatten() {
                if item.file_name().to_string_lossy().starts_with(&leftover) {
                    let _ = std::fs::remove_file(item.path());
                }
            }
        }
        let temp = self.devices_dir.join(format!("{leftover}{}", std::process::id()));
        let copied = (|| -> std::io::Result<Option<(u64, u64)>> {
            let mut source = open_at(&path, start)?;
            let mut copy = File::create(&temp)?;
            let length = std::io::copy(&mut (&mut source).take(entry.verified_to - start), &mut copy)?;
            if length != entry.verified_to - start {
                return Err(std::io::Error::other("the file is shorter than what was read"));
            }
            copy.sync_all()?;
            let identity = file_identity(&copy.metadata()?);
            drop(copy);
            std::fs::rename(&temp, &path)?;
            Ok(identity)
        })();
        let identity = match copied {
            Ok(identity) => identity,
            Err(error) => {
                let _ = std::fs::remove_file(&temp);
                return Err(io_error("replace", &path)(error));
            }
        };
        sync_dir(&self.devices_dir)?;
        let index = usize::try_from(keep_from - entry.first_seq).unwrap_or(usize::MAX);
        entry.offsets.drain(..index.min(entry.offsets.len()));
        for offset in &mut entry.offsets {
            *offset -= start;
        }
        entry.first_seq = keep_from;
        entry.verified_to -= start;
        entry.begins = Some((keep_from, prev));
        entry.identity = identity;
        drop(file);
        tracing::info!(file = %path.display(), removed = keep_from - begins, "removed the records a checkpoint covers from the device file");
        Ok(keep_from - begins)
    }
}
