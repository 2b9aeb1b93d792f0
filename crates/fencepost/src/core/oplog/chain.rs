//! The chain of a device's log: [`LogHead`] checks records one at a time, [`verify_log`] a whole
//! log (rule O1).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{OpId, OpRecord};
use crate::core::clock::Hlc;
use crate::id::{validate_id, IdError, IdKind};

/// A defect found while checking a device's log (rule O1).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LogError {
    /// The record breaks a record limit ([`MAX_PAYLOAD_DEPTH`](super::MAX_PAYLOAD_DEPTH), [`MAX_PAYLOAD_BYTES`](super::MAX_PAYLOAD_BYTES),
    /// [`MAX_SURFACE_KIND_BYTES`](super::MAX_SURFACE_KIND_BYTES)): no log makes it, and a log refuses to append it.
    #[error("device {device_id:?} seq {seq}: the record is over a limit: {detail}")]
    OverLimit {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// Which limit, and by how much.
        detail: String,
    },
    /// The record's `op_id` does not match its content: it was altered, or damaged.
    #[error("device {device_id:?} seq {seq}: op_id {found} does not match the record's content (which hashes to {expected})")]
    BadId {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// The op_id the record carries.
        found: OpId,
        /// The op_id its content hashes to.
        expected: OpId,
    },
    /// The record's seq skips ahead of the next expected one.
    #[error("device {device_id:?}: expected seq {expected}, found seq {found} (a gap)")]
    SeqGap {
        /// The device.
        device_id: String,
        /// The next seq the log expected.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// The record's seq is behind the next expected one (its predecessor is not at hand to tell a
    /// duplicate from a fork).
    #[error("device {device_id:?}: expected seq {expected}, found seq {found} again")]
    SeqRepeated {
        /// The device.
        device_id: String,
        /// The next seq the log expected.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// Two different records claim the same seq of one device.
    #[error("device {device_id:?} seq {seq}: two different records ({existing} and {conflicting}); the log has forked")]
    Fork {
        /// The device.
        device_id: String,
        /// The contested seq.
        seq: u64,
        /// The record already in the log.
        existing: OpId,
        /// The other one.
        conflicting: OpId,
    },
    /// The same record appears twice.
    #[error("device {device_id:?} seq {seq}: the record {op_id} appears twice")]
    Duplicate {
        /// The device.
        device_id: String,
        /// Its seq.
        seq: u64,
        /// Its op_id.
        op_id: OpId,
    },
    /// `prev` does not name the previous record.
    #[error(
        "device {device_id:?} seq {seq}: it links to {}, but the record before it is {}",
        link_text(found),
        link_text(expected)
    )]
    PrevMismatch {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// The previous record's op_id (`None` before seq 0).
        expected: Option<OpId>,
        /// The prev the record carries.
        found: Option<OpId>,
    },
    /// A record of another device, or whose HLC stamp names another device.
    #[error("seq {seq}: expected device {expected:?}, found {found:?}")]
    DeviceMismatch {
        /// The record's seq.
        seq: u64,
        /// The log's device.
        expected: String,
        /// The device found (in `device_id` or in `hlc.device_id`).
        found: String,
    },
    /// The record's HLC stamp is not after the previous record's.
    #[error(
        "device {device_id:?} seq {seq}: HLC stamp {found:?} is not after the previous record's {previous:?}"
    )]
    NonIncreasingHlc {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// The previous record's stamp.
        previous: Hlc,
        /// This record's stamp.
        found: Hlc,
    },
    /// A protected ledger's record could not be made: it does not seal (over the sealing
    /// limit, no random nonce), or the device's log begins with another key than this device's.
    #[error("device {device_id:?} seq {seq}: cannot write a protected record: {detail}")]
    Unsealable {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// Why.
        detail: String,
    },
    /// The device id breaks rule L8.
    #[error(transparent)]
    InvalidDeviceId(#[from] IdError),
    /// The log's last record carries the largest HLC stamp there is, so no record can follow it
    /// (a forged or damaged record; move the device to a new id, or repair the file).
    #[error("device {device_id:?} seq {seq} ({op_id}): its HLC stamp {hlc:?} is the largest there is, so no record can follow it; repair that record or give this host a new --device id")]
    HlcExhausted {
        /// The device.
        device_id: String,
        /// The last record's seq.
        seq: u64,
        /// The last record's op_id.
        op_id: OpId,
        /// Its stamp.
        hlc: Hlc,
    },
}

/// A [`LogHead`] as a stored value: the device, the next seq, and the last record's id and HLC
/// stamp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadMark {
    pub(crate) device_id: String,
    pub(crate) next_seq: u64,
    pub(crate) last: Option<(OpId, u64, u32)>,
}

/// The end of a verified log prefix of one device: what the next record must continue.
///
/// Used to check records one at a time (relays, [`verify_log`], [`DeviceLog`](super::DeviceLog)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHead {
    device_id: Arc<str>,
    next_seq: u64,
    last_op_id: Option<OpId>,
    last_hlc: Option<Hlc>,
}

impl LogHead {
    /// The head of an empty log of `device_id`.
    pub fn new(device_id: impl Into<Arc<str>>) -> Self {
        Self {
            device_id: device_id.into(),
            next_seq: 0,
            last_op_id: None,
            last_hlc: None,
        }
    }

    /// The head of a log whose records before `next_seq` are not at hand (a relay's file that
    /// begins after a checkpoint, see [`Relay::prune`](crate::relay::Relay::prune)), known only by
    /// the last one's id: the next record must have seq `next_seq` and name `last_op_id`; its
    /// stamp is not compared with the unknown one before it.
    pub(crate) fn after(device_id: impl Into<Arc<str>>, next_seq: u64, last_op_id: OpId) -> Self {
        Self {
            device_id: device_id.into(),
            next_seq,
            last_op_id: Some(last_op_id),
            last_hlc: None,
        }
    }

    /// The device.
    pub fn device_id(&self) -> &Arc<str> {
        &self.device_id
    }

    /// The head as a value to store (a snapshot, a relay's cursor): [`from_mark`](Self::from_mark)
    /// gives it back.
    pub(crate) fn mark(&self) -> HeadMark {
        HeadMark {
            device_id: self.device_id.to_string(),
            next_seq: self.next_seq,
            last: self
                .last_op_id
                .zip(self.last_hlc.as_ref())
                .map(|(op_id, hlc)| (op_id, hlc.wall_ms, hlc.counter)),
        }
    }

    /// The head a [`mark`](Self::mark) stands for; `None` when the mark is not one a head makes
    /// (read from a damaged store).
    pub(crate) fn from_mark(mark: &HeadMark) -> Option<Self> {
        crate::id::validate_id(crate::id::IdKind::Device, &mark.device_id).ok()?;
        let device_id: Arc<str> = Arc::from(mark.device_id.as_str());
        match (mark.next_seq, mark.last) {
            (0, None) => Some(Self::new(device_id)),
            (1.., Some((op_id, wall_ms, counter))) => Some(Self {
                last_hlc: Some(Hlc {
                    wall_ms,
                    counter,
                    device_id: Arc::clone(&device_id),
                }),
                device_id,
                next_seq: mark.next_seq,
                last_op_id: Some(op_id),
            }),
            _ => None,
        }
    }

    /// The seq the next record must have (the number of records so far).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The `op_id` of the last record, if any.
    pub fn last_op_id(&self) -> Option<OpId> {
        self.last_op_id
    }

    /// The HLC stamp of the last record, if any.
    pub fn last_hlc(&self) -> Option<&Hlc> {
        self.last_hlc.as_ref()
    }

    /// Checks that `op` belongs to this device, is within the record limits, and that its `op_id`
    /// matches its content, whatever its seq.
    pub fn check_identity(&self, op: &OpRecord) -> Result<(), LogError> {
        self.check_device(op)?;
        op.check_id()
    }

    /// Checks that `op` and its stamp name this log's device.
    pub(crate) fn check_device(&self, op: &OpRecord) -> Result<(), LogError> {
        for found in [&op.device_id, &op.hlc.device_id] {
            if **found != *self.device_id {
                return Err(LogError::DeviceMismatch {
                    seq: op.seq,
                    expected: self.device_id.to_string(),
                    found: found.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Checks that `op` is a valid next record: right device, matching `op_id`, the next seq, a
    /// `prev` naming the last record, and an HLC stamp after the last one.
    pub fn check_next(&self, op: &OpRecord) -> Result<(), LogError> {
        self.check_identity(op)?;
        self.check_order(op)
    }

    /// [`accept`](Self::accept) for a record whose identity (its `op_id` over its content, within
    /// the limits) a relay has checked already: checks the device, the seq, the chain and the HLC
    /// order, and moves past it.
    pub(crate) fn accept_identified(&mut self, op: &OpRecord) -> Result<(), LogError> {
        self.check_device(op)?;
        self.check_order(op)?;
        self.advance_unchecked(op);
        Ok(())
    }

    /// The seq, `prev` and HLC order of `op` as this log's next record.
    fn check_order(&self, op: &OpRecord) -> Result<(), LogError> {
        let device_id = || self.device_id.to_string();
        if op.seq > self.next_seq {
            return Err(LogError::SeqGap {
                device_id: device_id(),
                expected: self.next_seq,
                found: op.seq,
            });
        }
        if op.seq < self.next_seq {
            return Err(LogError::SeqRepeated {
                device_id: device_id(),
                expected: self.next_seq,
                found: op.seq,
            });
        }
        if op.prev != self.last_op_id {
            return Err(LogError::PrevMismatch {
                device_id: device_id(),
                seq: op.seq,
                expected: self.last_op_id,
                found: op.prev,
            });
        }
        if let Some(previous) = &self.last_hlc {
            if op.hlc <= *previous {
                return Err(LogError::NonIncreasingHlc {
                    device_id: device_id(),
                    seq: op.seq,
                    previous: previous.clone(),
                    found: op.hlc.clone(),
                });
            }
        }
        Ok(())
    }

    /// Checks `op` with [`check_next`](Self::check_next) and, if it passes, moves past it.
    pub fn accept(&mut self, op: &OpRecord) -> Result<(), LogError> {
        self.check_next(op)?;
        self.advance_unchecked(op);
        Ok(())
    }

    /// Moves past `op` without checking it; for records this process has just made or checked.
    pub(crate) fn advance_unchecked(&mut self, op: &OpRecord) {
        self.next_seq = op.seq + 1;
        self.last_op_id = Some(op.op_id);
        self.last_hlc = Some(op.hlc.clone());
    }
}

/// Checks a whole device log, from seq 0, in order (rule O1): one device, matching op ids,
/// contiguous seqs, an unbroken `prev` chain and strictly increasing HLC stamps. Returns the first
/// defect found. An empty log is valid.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::oplog::{verify_log, DeviceLog, LogError, Surface};
/// use serde_json::json;
///
/// let mut log = DeviceLog::new("laptop", ManualClock::new(1).wall_clock()).unwrap();
/// let mut ops = vec![
///     log.append(Surface::log("note"), json!({"text": "a"})),
///     log.append(Surface::log("note"), json!({"text": "b"})),
/// ];
/// assert!(verify_log(&ops).is_ok());
/// ops.remove(0);
/// assert!(matches!(verify_log(&ops), Err(LogError::SeqGap { .. })));
/// ```
pub fn verify_log(ops: &[OpRecord]) -> Result<(), LogError> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    validate_id(IdKind::Device, &first.device_id)?;
    let mut head = LogHead::new(Arc::clone(&first.device_id));
    for op in ops {
        head.check_identity(op)?;
        if op.seq < head.next_seq() {
            // Ops before `op` were accepted in order from seq 0, so index == seq.
            let existing = &ops[op.seq as usize];
            return Err(if existing.op_id == op.op_id {
                LogError::Duplicate {
                    device_id: head.device_id().to_string(),
                    seq: op.seq,
                    op_id: op.op_id,
                }
            } else {
                LogError::Fork {
                    device_id: head.device_id().to_string(),
                    seq: op.seq,
                    existing: existing.op_id,
                    conflicting: op.op_id,
                }
            });
        }
        head.accept(op)?;
    }
    Ok(())
}

/// A link as an error names it: the record's id, or "none" (before record 0).
fn link_text(link: &Option<OpId>) -> String {
    link.map_or_else(|| "none".to_owned(), |id| id.to_string())
}
