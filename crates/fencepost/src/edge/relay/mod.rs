//! Relays: the eventually consistent transport of op logs between sites (rule R1).
//!
//! A [`Relay`] stores every device's log and hands each site what it lacks. It is *not* a lease:
//! it has no consensus, so two sites could each append "I take it"; leases live in a coordinator.
//!
//! * [`Relay::push`] is idempotent and verifies chains: records already stored are skipped, new
//!   ones must continue their device's chain ([`LogHead::check_next`]), and a record that conflicts
//!   with a stored one is refused as a fork. A push that is refused stores nothing.
//! * [`Relay::pull`] returns, per device, the records from the caller's [`Frontier`] on, in seq
//!   order, plus the [`RelayProblem`]s found (a damaged file is reported, not fatal: the other
//!   devices keep syncing).
//!
//! Implementations: [`InMemoryRelay`] (tests, the simulator, one process), [`FsRelay`] (a folder,
//! possibly a synced one) and, with feature `sqlite`, `SqliteRelay` (a SQLite file, one host).

mod fs;
mod memory;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::id::IdError;
use crate::oplog::{LogError, LogHead, OpId, OpRecord};

pub use crate::oplog::Frontier;
pub use fs::{device_file_name, FsRelay, FsRelayConfig};
pub use memory::InMemoryRelay;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteRelay;

/// An eventually consistent store of device op logs (rule R1).
pub trait Relay: Send + Sync {
    /// Stores `ops`, which may belong to several devices and may repeat stored records.
    ///
    /// * `Ok` — every new record now continues its device's chain in the relay; records that were
    ///   already there were skipped (counted in [`PushReport::already_present`]).
    /// * `Err(RelayError::Log)` — a record is invalid (bad `op_id`, a gap, a fork, …); nothing of
    ///   this push was stored.
    /// * `Err` of another kind — a storage failure; records of some devices may have been stored.
    ///   Pushing the same records again is always safe.
    fn push(&self, ops: &[OpRecord]) -> Result<PushReport, RelayError>;

    /// The records the caller lacks: for every device, those with `seq >= since.next_seq(device)`,
    /// grouped by device and in seq order. Problems with one device's stored log are reported in
    /// [`PullBatch::problems`] and do not stop the others.
    fn pull(&self, since: &Frontier) -> Result<PullBatch, RelayError>;

    /// Appends new records to `device_id`'s log while holding the relay's exclusive claim on that
    /// log, so that any number of writers of one device (threads, processes sharing a device id)
    /// interleave instead of forking it (rule R1).
    ///
    /// Under the claim the relay reads the device's stored records from `since_seq` on (those the
    /// caller's writer has not seen: another writer's), passes them to `make`, which continues
    /// them (typically [`DeviceLog::catch_up`](crate::oplog::DeviceLog::catch_up) then
    /// [`DeviceLog::try_append`](crate::oplog::DeviceLog::try_append)) and returns the new
    /// records; the relay checks that they continue the stored chain, stores them durably, and
    /// only then releases the claim.
    ///
    /// # Errors
    /// * [`RelayError::Log`] — `make` failed, or its records do not continue the stored chain:
    ///   nothing was stored.
    /// * [`RelayError::DeviceDamaged`] — the device's stored log is damaged: nothing was stored.
    /// * another kind — a storage failure; the records may have been stored (a later pull shows
    ///   whether). `make` may have been called.
    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut MakeRecords<'_>,
    ) -> Result<Appended, RelayError>;
}

/// The closure [`Relay::append`] calls with the device's records the caller lacks, returning the
/// records to append after them.
pub type MakeRecords<'a> = dyn FnMut(&[OpRecord]) -> Result<Vec<OpRecord>, LogError> + 'a;

/// What a [`Relay::append`] stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Appended {
    /// The device's records from the caller's `since_seq` up to the append (written by another
    /// writer of the device), in seq order.
    pub tail: Vec<OpRecord>,
    /// The records `make` returned, now stored, in seq order.
    pub appended: Vec<OpRecord>,
}

/// What a push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushReport {
    /// Records newly stored.
    pub appended: usize,
    /// Records that were already stored and were skipped.
    pub already_present: usize,
}

/// What a pull returned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PullBatch {
    /// The records the caller lacked, grouped by device, each device's in seq order.
    pub ops: Vec<OpRecord>,
    /// Devices (or files) that could not be read completely, and why.
    pub problems: Vec<RelayProblem>,
}

/// How serious a [`RelayProblem`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub enum ProblemKind {
    /// Records of a device are missing or unreadable (a bad line, a gap, an unreadable file, a
    /// file that shrank): the ledger is incomplete, and nothing should be dispatched on it.
    #[default]
    Damage,
    /// The last line of a device file is incomplete: a write in progress, a sync still copying,
    /// or a file cut short. Its records are read once the line is complete.
    IncompleteLine,
    /// A file that is no device log (a sync tool's conflict copy, a stray file): ignored.
    Ignored,
}

/// A problem with part of a relay's store, reported by a pull without stopping it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayProblem {
    /// How serious it is.
    pub kind: ProblemKind,
    /// The device concerned, when known.
    pub device_id: Option<String>,
    /// The file concerned, for file-backed relays.
    pub file: Option<PathBuf>,
    /// The 1-based line of the file, when the problem is one line.
    pub line_number: Option<u64>,
    /// What is wrong.
    pub detail: String,
}

impl RelayProblem {
    /// Whether the problem makes the ledger incomplete ([`ProblemKind::Damage`]).
    pub fn is_damage(&self) -> bool {
        self.kind == ProblemKind::Damage
    }
}

impl fmt::Display for RelayProblem {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(formatter, "{}", file.display())?;
            if let Some(line) = self.line_number {
                write!(formatter, ":{line}")?;
            }
            formatter.write_str(": ")?;
        }
        if let Some(device_id) = &self.device_id {
            write!(formatter, "device {device_id:?}: ")?;
        }
        formatter.write_str(&self.detail)
    }
}

/// Why a relay operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RelayError {
    /// A pushed record is invalid or conflicts with the stored log; nothing of the push was stored.
    #[error("refused a pushed op: {0}")]
    Log(#[from] LogError),
    /// A pushed record names an invalid device id (rule L8).
    #[error("refused a pushed op: {0}")]
    InvalidDeviceId(#[from] IdError),
    /// A pushed record is larger than one relay line may be.
    #[error("op seq {seq} of device {device_id:?} encodes to {length_bytes} bytes; a relay line holds at most {max_bytes} (make the payload smaller)")]
    OpTooLarge {
        /// The device.
        device_id: String,
        /// The record's seq.
        seq: u64,
        /// Its encoded size.
        length_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// The device's stored log is damaged, so nothing can be appended to it until it is repaired.
    #[error("cannot append to device {device_id:?}: its stored log is damaged ({problem})")]
    DeviceDamaged {
        /// The device.
        device_id: String,
        /// What is wrong.
        problem: RelayProblem,
    },
    /// Another process held a device file's lock for longer than the configured wait.
    #[error("waited {waited_ms} ms for the lock on {path}; another process holds it (raise lock_timeout_ms, or look for a stuck process)")]
    LockTimeout {
        /// The file.
        path: PathBuf,
        /// How long this call waited.
        waited_ms: u64,
    },
    /// A file-system operation failed.
    #[error("{operation} {path}: {source}")]
    Io {
        /// What was being done (`"open"`, `"append to"`, …).
        operation: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The error from the operating system.
        #[source]
        source: std::io::Error,
    },
}

/// The result of checking one device's pushed records against its stored log.
pub(crate) struct DevicePlan<'a> {
    /// The records to append, in seq order.
    pub fresh: Vec<&'a OpRecord>,
    /// Records that were already stored.
    pub already_present: usize,
    /// The head after appending `fresh`.
    pub head: LogHead,
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
