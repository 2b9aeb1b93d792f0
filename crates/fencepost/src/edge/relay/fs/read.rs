//! Reading device files: a file found again after a change (`refresh`), read in chunks whose
//! lines are decoded in parallel and checked in order against each device's chain.

use super::*;

/// The result of reading what was appended to a device file.
pub(super) struct Refresh {
    /// The new records, in seq order.
    pub(super) fresh: Vec<OpRecord>,
    /// Whether bytes of an incomplete last line follow the verified records.
    pub(super) torn_tail: bool,
}

impl FsRelay {
    /// Reads what was appended to `entry`'s file since the last call, verifying each record. The
    /// records are kept in [`Refresh::fresh`], or with `hand`, handed over a chunk at a time.
    pub(super) fn refresh(
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
    pub(super) fn accept_chunk(
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
    pub(super) fn accept_decoded(
        name: &str,
        head: &mut Option<LogHead>,
        decoded: Decoded,
    ) -> Result<OpRecord, String> {
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

    /// Reads the stored records `from..to` of `entry` (already verified once), checking them again;
    /// `prev`: the id of record `from - 1` when the caller read it, which the first must name.
    pub(super) fn read_range(
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
}

/// Why `path` cannot be a device log, if it exists and is something else than a regular file (a
/// folder, a FIFO, which would block every reader, a device, a dangling symbolic link).
///
/// The path itself is looked at first, then what a link leads to: another writer of the device
/// may create the file at any moment, and a file that was not there at one look and is at the
/// next is a new log, not a link to nothing (taking it for one refused a first append of two
/// writers at once as damage).
pub(super) fn not_a_log_file(path: &Path) -> Option<String> {
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

pub(super) fn open_at(path: &Path, offset: u64) -> std::io::Result<BufReader<File>> {
    let mut reader = BufReader::new(File::open(path)?);
    reader.seek(SeekFrom::Start(offset))?;
    Ok(reader)
}

impl FsRelay {
    /// The stored records of `entry` from seq `from` on, given `fresh`, the records just read by
    /// `refresh` (the last ones of the file).
    pub(super) fn records_from(
        &self,
        entry: &DeviceFile,
        from: u64,
        fresh: Vec<OpRecord>,
    ) -> Result<Vec<OpRecord>, String> {
        let Some(head) = &entry.head else {
            return Ok(Vec::new());
        };
        // Nothing before where the file begins (pruned) is handed over.
        let from = from.max(entry.begins.map_or(0, |(begins, _)| begins));
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
}

impl FsRelay {
    /// Reads one line into `line` (cleared first), at most `max_line_bytes + 1` bytes, so that a
    /// file without newlines is never read whole. Returns the bytes read; a complete line ends
    /// with `\n`.
    pub(super) fn read_line(
        &self,
        reader: &mut BufReader<File>,
        line: &mut Vec<u8>,
    ) -> std::io::Result<usize> {
        line.clear();
        reader
            .take(self.config.max_line_bytes as u64 + 1)
            .read_until(b'\n', line)
    }
}

/// Where [`FsRelay::refresh`] hands records over instead of keeping them: `each` gets those the
/// caller lacks (from its frontier of the device on).
pub(super) struct Hand<'a> {
    pub(super) since: &'a Frontier,
    pub(super) each: &'a mut dyn FnMut(Vec<OpRecord>),
    /// Set at the first records: whether they begin after the caller's next seq (a file that
    /// begins after a checkpoint the caller has not started from), and then nothing is handed.
    pub(super) gap: Option<bool>,
}

/// Keeps `accepted` (one chunk's verified records, in seq order) in `fresh`, or hands those the
/// caller lacks over.
pub(super) fn hand_over(mut accepted: Vec<OpRecord>, fresh: &mut Vec<OpRecord>, hand: &mut Option<Hand<'_>>) {
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
pub(super) const CHUNK_BYTES: usize = 1 << 18;

/// The most records read again from a device file that [`FsRelay`]'s `pull_in_batches` hands
/// over at once.
pub(super) const STORED_BATCH: u64 = 65_536;

/// How many chunks of records the reading thread of a long read may be ahead of the fold.
pub(super) const PIPELINE_CHUNKS: usize = 2;

/// Below this many lines, a chunk is decoded on the calling thread alone.
pub(super) const PARALLEL_LINES: usize = 512;

/// How many threads help the reading thread decode a chunk's pieces.
pub(super) const DECODE_HELPERS: usize = 1;

/// The lines of a piece that one thread decodes (see [`decode_lines`]).
pub(super) const PIECE_LINES: usize = 256;

/// A decoded line: the record, and whether its `op_id` is what its content hashes to (within the
/// limits); or why it does not decode.
pub(super) type Decoded = Result<(OpRecord, bool), String>;

/// Records of a device file, read, decoded and checked against its chain ([`read_checked`]).
pub(super) struct CheckedChunk {
    /// The records that are valid next records, in order.
    pub(super) ops: Vec<OpRecord>,
    /// Each one's line length, its newline included.
    pub(super) lengths: Vec<usize>,
    /// The head of the log after them.
    pub(super) head: Option<LogHead>,
    /// Why the line after them is not a valid next record, if it is not.
    pub(super) damage: Option<String>,
    /// What follows the lines when reading stopped after them; `None` when more follow.
    pub(super) end: Option<ChunkEnd>,
}

/// Why reading a device file stopped after a chunk.
pub(super) enum ChunkEnd {
    /// The file ends after the last line.
    Complete,
    /// Bytes of a line without its newline follow (a write or a sync in progress).
    Incomplete,
    /// The next line is longer than the longest line allowed.
    TooLong,
}

/// Lines of a device file, read and decoded ([`read_decoded`]), not yet checked.
pub(super) struct DecodedChunk {
    /// Each line's length, its newline included.
    pub(super) lengths: Vec<usize>,
    /// What each line decodes to, in order, in pieces ([`decode_lines`]).
    pub(super) pieces: Vec<Vec<Decoded>>,
    /// What follows the lines when reading stopped after them; `None` when more follow.
    pub(super) end: Option<ChunkEnd>,
}

/// Reads the lines of `file` (at `path`, the file `name` of the devices folder) from where it
/// stands, a chunk at a time: decodes them ([`decode_lines`]) and checks them in order as the
/// next records of the log that ends at `head`. `deliver` gets each chunk, and returns false to
/// stop reading; reading stops after a line that is not a valid next record. `pipelined`: the
/// lines are read and decoded on another thread while this one checks those before.
pub(super) fn read_checked(
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
pub(super) fn check_chunk(name: &str, head: &mut Option<LogHead>, decoded: DecodedChunk) -> CheckedChunk {
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
pub(super) fn read_decoded(
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
pub(super) fn decode_lines(chunk: &[u8], ends: &[usize], device: Option<&Arc<str>>) -> Vec<Vec<Decoded>> {
    let decode = |lines: std::ops::Range<usize>| -> Vec<Decoded> {
        let mut start = lines.start.checked_sub(1).map_or(0, |before| ends[before]);
        ends[lines]
            .iter()
            .map(|&end| {
                let line = without_newline(&chunk[start..end]);
                start = end;
                OpRecord::from_json_sharing(line, device)
                    .map(|op| {
                        // A sealed record's line carries no id: it was computed from the line
                        // as it was read, and its shape holds by construction (not hashed twice).
                        let id_matches = op.surface == crate::oplog::Surface::Sealed || op.check_id().is_ok();
                        (op, id_matches)
                    })
                    .map_err(|error| error.to_string())
            })
            .collect()
    };
    if ends.len() < PARALLEL_LINES || crate::edge::pieces::cores() < 2 {
        return vec![decode(0..ends.len())];
    }
    crate::edge::pieces::in_pieces(ends.len(), PIECE_LINES, DECODE_HELPERS, decode)
}

/// A line without its trailing newline.
pub(super) fn without_newline(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}
