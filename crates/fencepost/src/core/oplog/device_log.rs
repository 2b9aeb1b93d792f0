//! [`DeviceLog`]: the writer of one device's log.

use std::sync::Arc;

use serde_json::Value;

use super::{verify_log, LogError, LogHead, OpId, OpRecord, Payload, Surface};
use crate::core::clock::{ClockError, Hlc, HlcClock, HlcConfig, WallClock};
use crate::id::{validate_id, IdError, IdKind};

/// The writer of one device's log: stamps, numbers and chains each new record.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::oplog::{DeviceLog, Surface};
/// use serde_json::json;
///
/// let mut log = DeviceLog::new("laptop", ManualClock::new(1_000).wall_clock()).unwrap();
/// let first = log.append(Surface::log("note"), json!({"text": "hello"}));
/// let second = log.append(Surface::registry("setting"), json!({"key": "tz", "value": "UTC"}));
/// assert_eq!((first.seq, second.seq), (0, 1));
/// assert_eq!(second.prev, Some(first.op_id));
/// assert!(second.hlc > first.hlc);
/// ```
#[derive(Debug, Clone)]
pub struct DeviceLog {
    clock: HlcClock,
    head: LogHead,
}

impl DeviceLog {
    /// A new, empty log for `device_id`, stamping with `wall_clock` and the default
    /// [`HlcConfig`]. Fails if the id breaks rule L8.
    pub fn new(device_id: &str, wall_clock: WallClock) -> Result<Self, IdError> {
        Self::with_config(device_id, wall_clock, HlcConfig::default())
    }

    /// A new, empty log with an explicit clock configuration.
    pub fn with_config(device_id: &str, wall_clock: WallClock, config: HlcConfig) -> Result<Self, IdError> {
        validate_id(IdKind::Device, device_id)?;
        let device_id: Arc<str> = Arc::from(device_id);
        Ok(Self {
            clock: HlcClock::new(Arc::clone(&device_id), wall_clock, config),
            head: LogHead::new(device_id),
        })
    }

    /// Continues the log `ops` of `device_id` (for example after a restart), after checking it
    /// with [`verify_log`]. The next record follows the last one in seq, chain and HLC.
    pub fn resume(
        device_id: &str,
        wall_clock: WallClock,
        config: HlcConfig,
        ops: &[OpRecord],
    ) -> Result<Self, LogError> {
        validate_id(IdKind::Device, device_id)?;
        let device_id: Arc<str> = Arc::from(device_id);
        let mut head = LogHead::new(Arc::clone(&device_id));
        if let Some(first) = ops.first() {
            head.check_identity(first)?;
        }
        verify_log(ops)?;
        let clock = match ops.last() {
            Some(last) => {
                head.advance_unchecked(last);
                HlcClock::resume(device_id, wall_clock, config, &last.hlc)
            }
            None => HlcClock::new(device_id, wall_clock, config),
        };
        Ok(Self { clock, head })
    }

    /// Continues after `head`, the end of a log a relay has checked (its records are not at
    /// hand): the next record follows it in seq, chain and HLC.
    pub(crate) fn continue_after(wall_clock: WallClock, config: HlcConfig, head: LogHead) -> Self {
        let device_id = Arc::clone(head.device_id());
        let clock = match head.last_hlc() {
            Some(last) => HlcClock::resume(device_id, wall_clock, config, last),
            None => HlcClock::new(device_id, wall_clock, config),
        };
        Self { clock, head }
    }

    /// Appends a record and returns it; the caller stores and relays it.
    ///
    /// # Panics
    /// If the payload breaks a record limit ([`MAX_PAYLOAD_DEPTH`](super::MAX_PAYLOAD_DEPTH), [`MAX_PAYLOAD_BYTES`](super::MAX_PAYLOAD_BYTES),
    /// [`MAX_SURFACE_KIND_BYTES`](super::MAX_SURFACE_KIND_BYTES)), or the HLC is exhausted. [`try_append`](Self::try_append)
    /// returns an error instead: use it for payloads you did not make, and on a log resumed from
    /// records you did not make.
    pub fn append(&mut self, surface: Surface, payload: Value) -> OpRecord {
        self.try_append(surface, payload)
            .expect("a record over a limit, or an exhausted HLC")
    }

    /// Appends a record and returns it; the caller stores and relays it.
    ///
    /// # Errors
    /// [`LogError::OverLimit`] when the record would break a record limit, so that no reader could
    /// read it back; [`LogError::HlcExhausted`] when the last record carries the largest HLC stamp
    /// there is. Nothing is appended.
    pub fn try_append(&mut self, surface: Surface, payload: Value) -> Result<OpRecord, LogError> {
        let op = self.draft(surface, payload)?;
        self.head.advance_unchecked(&op);
        Ok(op)
    }

    /// The record [`try_append`](Self::try_append) would append, without appending it: a
    /// protected ledger seals it, then appends the sealed record ([`append_made`](Self::append_made)).
    /// The stamp is taken from the clock either way.
    ///
    /// # Errors
    /// As [`try_append`](Self::try_append).
    pub fn draft(&mut self, surface: Surface, payload: Value) -> Result<OpRecord, LogError> {
        let Some(hlc) = self.clock.try_tick() else {
            return Err(LogError::HlcExhausted {
                device_id: self.head.device_id().to_string(),
                seq: self.head.next_seq().saturating_sub(1),
                op_id: self.head.last_op_id().unwrap_or(OpId([0; 32])),
                hlc: self.head.last_hlc().cloned().unwrap_or(Hlc {
                    wall_ms: u64::MAX,
                    counter: u32::MAX,
                    device_id: Arc::clone(self.head.device_id()),
                }),
            });
        };
        let mut op = OpRecord {
            op_id: OpId([0; 32]),
            hlc,
            device_id: Arc::clone(self.head.device_id()),
            seq: self.head.next_seq(),
            prev: self.head.last_op_id(),
            surface,
            payload: Payload::new(payload),
        };
        op.op_id = op.checked_content_id()?;
        debug_assert_eq!(self.head.check_next(&op), Ok(()));
        Ok(op)
    }

    /// Appends `op`, a record made elsewhere (a [`draft`](Self::draft) sealed, a log's record 0),
    /// which must continue the log ([`LogHead::accept`]).
    ///
    /// # Errors
    /// [`LogError`] when it does not continue the log: nothing is appended.
    pub fn append_made(&mut self, op: &OpRecord) -> Result<(), LogError> {
        self.head.accept(op)
    }

    /// Continues past `ops`, records of this device that another writer (another process with the
    /// same device id) appended after this log's head: each must be the valid next record, and the
    /// clock moves past their stamps, so the next record follows them in seq, chain and HLC.
    ///
    /// # Errors
    /// The first record that does not continue the log; the log is unchanged up to it.
    pub fn catch_up(&mut self, ops: &[OpRecord]) -> Result<(), LogError> {
        for op in ops {
            self.head.accept(op)?;
            self.clock.observe_own(&op.hlc);
        }
        Ok(())
    }

    /// Merges a peer's HLC stamp so that this log's next records are stamped after it (see
    /// [`HlcClock::observe`]).
    pub fn observe(&mut self, remote: &Hlc) -> Result<(), ClockError> {
        self.clock.observe(remote)
    }

    /// The device.
    pub fn device_id(&self) -> &str {
        self.head.device_id()
    }

    /// The end of the log so far.
    pub fn head(&self) -> &LogHead {
        &self.head
    }
}
