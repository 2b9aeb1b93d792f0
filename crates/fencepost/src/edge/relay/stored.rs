//! What the relays share to store and check records: a push checked against a device's stored
//! log ([`plan_device_push`]), records decoded and verified as they are read back
//! ([`verify_pulled`]), prunes planned, and the cursor of a relay that reads by frontier.

use super::*;

/// The result of checking one device's pushed records against its stored log.
pub(crate) struct DevicePlan<'a> {
    /// The records to append, in seq order.
    pub fresh: Vec<&'a OpRecord>,
    /// Records that were already stored.
    pub already_present: usize,
    /// The head after appending `fresh`.
    pub head: LogHead,
}

/// The cursor of a relay that reads by the caller's frontier (a database): the frontier itself,
/// every device with its next seq and last record's id ([`Relay::cursor`]).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn frontier_cursor(frontier: &Frontier) -> Option<serde_json::Value> {
    let mut marks: Vec<(String, u64, OpId)> = Vec::new();
    for (device_id, next_seq) in frontier.iter() {
        marks.push((device_id.to_owned(), next_seq, frontier.head(device_id)?));
    }
    serde_json::to_value(marks).ok()
}

/// [`Relay::resume`] for a relay that reads by the caller's frontier: checks that every device of
/// the cursor still holds its last record, the same one (a device whose records were deleted, or
/// replaced, does not match), with one pull of those records and what follows them.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn resume_by_pull(relay: &dyn Relay, cursor: &serde_json::Value) -> Result<(), ResumeError> {
    let marks = Vec::<(String, u64, OpId)>::deserialize(cursor)
        .map_err(|error| format!("the cursor is damaged: {error}"))?;
    let mut since = Frontier::new();
    for (device_id, next_seq, _) in &marks {
        let last = next_seq
            .checked_sub(1)
            .ok_or_else(|| format!("the cursor of {device_id:?} names no record"))?;
        since.raise(device_id, last);
    }
    let batch = relay.pull(&since)?;
    // A device the cursor does not name was read from record 0: one that begins after a
    // checkpoint is the next pull's to report (or to read from there), not the cursor's.
    let named = |problem: &RelayProblem| {
        problem.kind != ProblemKind::Pruned
            || problem
                .device_id
                .as_ref()
                .is_none_or(|device| marks.iter().any(|(named, _, _)| named == device))
    };
    if let Some(problem) = batch
        .problems
        .iter()
        .find(|problem| problem.is_damage() && named(problem))
    {
        return Err(problem.to_string().into());
    }
    for (device_id, next_seq, last_op_id) in &marks {
        let found = batch
            .ops
            .iter()
            .find(|op| &*op.device_id == device_id && op.seq + 1 == *next_seq);
        if found.is_none_or(|op| op.op_id != *last_op_id) {
            return Err(format!(
                "record {} of {device_id:?} is not the one read before",
                next_seq - 1
            )
            .into());
        }
    }
    Ok(())
}

/// Checks `ops` (one device's pushed records, any order) against the stored log ending at `stored`.
/// `stored_id_at(seq)` returns the `op_id` of a stored record, to tell a duplicate from a fork.
pub(crate) fn plan_device_push<'a>(
    stored: &LogHead,
    mut stored_id_at: impl FnMut(u64) -> Result<OpId, RelayError>,
    mut ops: Vec<&'a OpRecord>,
) -> Result<DevicePlan<'a>, RelayError> {
    ops.sort_by_key(|op| op.seq);
    let mut head = stored.clone();
    let mut fresh: Vec<&OpRecord> = Vec::new();
    let mut already_present = 0;
    for op in ops {
        head.check_identity(op)?;
        if op.seq < head.next_seq() {
            let existing = match op.seq.checked_sub(stored.next_seq()) {
                Some(index) => fresh[index as usize].op_id,
                None => stored_id_at(op.seq)?,
            };
            if existing != op.op_id {
                return Err(LogError::Fork {
                    device_id: head.device_id().to_string(),
                    seq: op.seq,
                    existing,
                    conflicting: op.op_id,
                }
                .into());
            }
            already_present += 1;
        } else {
            head.accept(op)?;
            fresh.push(op);
        }
    }
    Ok(DevicePlan {
        fresh,
        already_present,
        head,
    })
}

/// Groups `ops` by device id (in device order), keeping their order within a device.
pub(crate) fn group_by_device(ops: &[OpRecord]) -> Result<BTreeMap<&str, Vec<&OpRecord>>, IdError> {
    let mut groups: BTreeMap<&str, Vec<&OpRecord>> = BTreeMap::new();
    for op in ops {
        if !groups.contains_key(&*op.device_id) {
            crate::id::validate_id(crate::id::IdKind::Device, &op.device_id)?;
        }
        groups.entry(&op.device_id).or_default().push(op);
    }
    Ok(groups)
}

/// Builds the [`RelayProblem`] of a damaged stored record: `(seq, what is wrong)`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) type DamageOf<'a> = dyn Fn(u64, String) -> RelayProblem + 'a;

/// Decodes the stored record `seq` of `device_id`, checking that it says it is that record (its id
/// over its content is checked by the caller, against the chain or alone).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn decode_stored(
    device_id: &str,
    seq: u64,
    bytes: &[u8],
    damage: &DamageOf<'_>,
) -> Result<OpRecord, RelayProblem> {
    let op = OpRecord::from_json(bytes).map_err(|error| damage(seq, format!("does not decode: {error}")))?;
    if &*op.device_id != device_id || op.seq != seq {
        return Err(damage(
            seq,
            format!("holds record {} of device {:?}", op.seq, op.device_id),
        ));
    }
    Ok(op)
}

/// Decodes a stored record and checks its id over its content: a record that can head a log.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn stored_record(
    device_id: &str,
    seq: u64,
    bytes: Option<&[u8]>,
    damage: &DamageOf<'_>,
) -> Result<OpRecord, RelayProblem> {
    let bytes = bytes.ok_or_else(|| damage(seq, "not a record (a value of another type)".to_owned()))?;
    let op = decode_stored(device_id, seq, bytes, damage)?;
    LogHead::new(device_id)
        .check_identity(&op)
        .map_err(|error| damage(seq, error.to_string()))?;
    Ok(op)
}

/// Where a database relay's prune of `device_id` through record `through_seq` (of id
/// `through_id`: the head of the device in a checkpoint) cuts its log, whose last record is `last`
/// and whose first stored one is `begins`: `None` when it begins there already (pruned before),
/// else the first seq kept. The last record is kept whatever. Checks (`read` returns a stored
/// record, its id checked over its content) that the record there is the checkpoint's and that
/// the first kept record names the one before it, which then anchors the log.
///
/// # Errors
/// [`RelayError::DeviceDamaged`] when a check fails (nothing is to be removed), or what `read`
/// returns.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn plan_prune(
    device_id: &str,
    through_seq: u64,
    through_id: OpId,
    last: u64,
    begins: u64,
    mut read: impl FnMut(u64) -> Result<OpRecord, RelayError>,
    damage: &DamageOf<'_>,
) -> Result<Option<u64>, RelayError> {
    let keep_from = through_seq.saturating_add(1).min(last);
    if keep_from <= begins {
        return Ok(None);
    }
    let damaged = |seq, detail: &str| RelayError::DeviceDamaged {
        device_id: device_id.to_owned(),
        problem: damage(seq, format!("{detail}; nothing was removed")),
    };
    if through_seq > last || read(through_seq)?.op_id != through_id {
        return Err(damaged(through_seq, "not the record the checkpoint covers"));
    }
    let before = read(keep_from - 1)?;
    if read(keep_from)?.prev != Some(before.op_id) {
        return Err(damaged(keep_from, "does not name the record before it"));
    }
    Ok(Some(keep_from))
}

/// Where a database relay's logs begin, for those that begin after record 0 ([`Relay::log_starts`]):
/// from each such device's first stored row (its seq and bytes), the seq and the id of the record
/// before it that it names. A first row that cannot be read is left out: a pull reports it.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn stored_starts<'b>(
    first_rows: impl IntoIterator<Item = (&'b str, u64, Option<&'b [u8]>)>,
) -> BTreeMap<String, (u64, OpId)> {
    let mut starts = BTreeMap::new();
    for (device_id, seq, bytes) in first_rows {
        let damage = |seq: u64, detail: String| RelayProblem {
            kind: ProblemKind::Damage,
            device_id: None,
            file: None,
            line_number: None,
            detail: format!("record {seq}: {detail}"),
        };
        if let Ok(op) = stored_record(device_id, seq, bytes, &damage) {
            if let (1.., Some(prev)) = (op.seq, op.prev) {
                starts.insert(device_id.to_owned(), (op.seq, prev));
            }
        }
    }
    starts
}

/// The head of a device's stored log in a database relay, from its stored length (`next_seq`),
/// the largest seq of its rows (`top`) and its last record (`last`, the row `next_seq - 1`, `None`
/// when missing): the length and the rows must agree (a row or a length edited by hand is damage).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn stored_head(
    device_id: &str,
    next_seq: u64,
    top: Option<u64>,
    last: Option<Option<&[u8]>>,
    damage: &DamageOf<'_>,
) -> Result<LogHead, RelayError> {
    let damaged = |problem| RelayError::DeviceDamaged {
        device_id: device_id.to_owned(),
        problem,
    };
    let rows_next = top.map_or(0, |top| top.saturating_add(1));
    if rows_next != next_seq {
        return Err(damaged(damage(
            next_seq.min(rows_next),
            format!("the device's length says {next_seq} records, but its records run to {rows_next}"),
        )));
    }
    let mut head = LogHead::new(device_id);
    if next_seq == 0 {
        return Ok(head);
    }
    let Some(last) = last else {
        return Err(damaged(damage(next_seq - 1, "missing".to_owned())));
    };
    let last = stored_record(device_id, next_seq - 1, last, damage).map_err(damaged)?;
    head.advance_unchecked(&last);
    Ok(head)
}

/// Verifies what a database relay read of one device for a pull: `rows` (seq and bytes, either
/// unreadable after a hand edit) in seq order from `from - 1` on when `from > 0` (the record before
/// the first new one, which anchors its chain), else from 0; `stored` is the device's length and
/// `first` the smallest seq of its rows. A log that begins after record 0 (its first records
/// removed after a checkpoint covered them, [`Relay::prune`]) is read from where it begins by a
/// caller whose frontier is there (from a checkpoint), its first record anchored by the id it
/// names before it (the caller's own checks compare it with the checkpoint's head); a caller
/// whose frontier is before it gets a [`ProblemKind::Pruned`] problem and none of its records.
/// Returns the new records that continue the chain, and the damage that stopped the reading.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn verify_pulled<'b>(
    device_id: &str,
    from: u64,
    stored: u64,
    first: Option<u64>,
    rows: impl IntoIterator<Item = (Option<u64>, Option<&'b [u8]>)>,
    damage: &DamageOf<'_>,
) -> (Vec<OpRecord>, Option<RelayProblem>) {
    let mut rows = rows.into_iter().peekable();
    let mut head = LogHead::new(device_id);
    let mut ops = Vec::new();
    if let Some(begins) = first.filter(|first| *first > from) {
        let mut problem = damage(
            from,
            format!(
                "the log begins at record {begins}: records {from}..{} were removed after a checkpoint covered them (ledger compact --prune), and this reading does not start from one that does",
                begins - 1
            ),
        );
        problem.kind = ProblemKind::Pruned;
        return (ops, Some(problem));
    }
    if from > 0 && first == Some(from) {
        // The log begins here: its first record names the one before it.
        let anchor = match rows.peek() {
            Some((Some(seq), bytes)) if *seq == from => stored_record(device_id, from, *bytes, damage)
                .and_then(|op| {
                    op.prev.ok_or_else(|| {
                        damage(
                            from,
                            "the log's first record names no record before it".to_owned(),
                        )
                    })
                }),
            _ => Err(damage(from, "missing".to_owned())),
        };
        match anchor {
            Ok(prev) => head = LogHead::after(device_id, from, prev),
            Err(problem) => return (ops, Some(problem)),
        }
    } else if from > 0 {
        let before = match rows.next_if(|(seq, _)| *seq == Some(from - 1)) {
            Some((_, bytes)) => stored_record(device_id, from - 1, bytes, damage),
            None => Err(damage(from - 1, "missing".to_owned())),
        };
        match before {
            Ok(before) => head.advance_unchecked(&before),
            Err(problem) => return (ops, Some(problem)),
        }
    }
    let mut expected = from;
    for (seq, bytes) in rows {
        if seq != Some(expected) {
            break; // a gap, or a seq that is no number: reported below
        }
        if expected >= stored {
            let detail =
                format!("beyond the device's length ({stored} records): a row or the length was edited");
            return (ops, Some(damage(expected, detail)));
        }
        let Some(bytes) = bytes else {
            return (
                ops,
                Some(damage(
                    expected,
                    "not a record (a value of another type)".to_owned(),
                )),
            );
        };
        // Checked against the head: the device, the id over the content, seq, chain, HLC.
        let checked = decode_stored(device_id, expected, bytes, damage).and_then(|op| {
            head.accept(&op)
                .map(|()| op)
                .map_err(|error| damage(expected, error.to_string()))
        });
        match checked {
            Ok(op) => ops.push(op),
            Err(problem) => return (ops, Some(problem)),
        }
        expected += 1;
    }
    let problem = (expected < stored).then(|| damage(expected, "missing".to_owned()));
    (ops, problem)
}
