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
//! possibly a synced one), with feature `sqlite` `SqliteRelay` (a SQLite file, one host), and with
//! feature `postgres` `PostgresRelay` (tables beside the PostgreSQL coordinator's, many hosts).

mod fs;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod stored;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use serde::Deserialize;
use thiserror::Error;

use crate::id::IdError;
use crate::oplog::{LogError, LogHead, OpId, OpRecord};

pub use crate::core::frontier::Frontier;
pub use fs::{device_file_name, FsRelay, FsRelayConfig};
pub use memory::InMemoryRelay;
#[cfg(feature = "postgres")]
pub use postgres::PostgresRelay;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteRelay;
pub(crate) use stored::*;

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

    /// [`pull`](Self::pull), handing the records over in consecutive batches as they are read
    /// (what `pull` returns, cut into pieces: per device in seq order), so that a caller that
    /// folds them needs not hold them all at once. Returns the problems `pull` would report.
    ///
    /// The default calls `pull` and hands its records over as one batch.
    fn pull_in_batches(
        &self,
        since: &Frontier,
        each: &mut dyn FnMut(Vec<OpRecord>),
    ) -> Result<Vec<RelayProblem>, RelayError> {
        let batch = self.pull(since)?;
        if !batch.ops.is_empty() {
            each(batch.ops);
        }
        Ok(batch.problems)
    }

    /// Whether every record [`pull`](Self::pull) and [`append`](Self::append) hand over has been
    /// checked by the relay as the next record of its device's chain ([`LogHead::accept`]: its
    /// `op_id` over its content, the limits, seq, `prev`, HLC order), from seq 0 or from a
    /// record it checked before. A [`Ledger`](crate::ledger::Ledger) then does not hash them
    /// again; it still checks each device's seq, chain and HLC order.
    ///
    /// The default, `false`, makes the ledger check everything: the right answer for a relay
    /// that merely moves records. Every relay of this crate checks, and says so.
    fn checks_records(&self) -> bool {
        false
    }

    /// Whether this relay is one database that every site reads (a SQLite file, PostgreSQL):
    /// records it lacks that a site read before are gone for every site at once (it went back:
    /// [`ProblemKind::WentBack`]), not late in a copy that a sync has not brought up to date.
    ///
    /// The default: `false`.
    fn is_database(&self) -> bool {
        false
    }

    /// Where this relay's reading stands, as a value to keep beside a snapshot of what it handed
    /// over ([`Ledger`](crate::ledger::Ledger)'s snapshot), so that a later process of the same
    /// site [resumes](Self::resume) there instead of reading everything again: when it stands
    /// exactly at `frontier` (the caller's, who has every record read and only those). `None`
    /// when the relay cannot resume, stands elsewhere, or is not at a clean point (damage).
    ///
    /// The default: `None`.
    fn cursor(&self, frontier: &Frontier) -> Option<serde_json::Value> {
        let _ = frontier;
        None
    }

    /// Continues reading at `cursor` (from [`cursor`](Self::cursor) of an earlier instance of
    /// this relay): the records before it are taken as read and verified, and the next pull
    /// hands over only what follows. Called on a relay that has read nothing yet. The relay first
    /// checks that what it holds still matches the cursor (for a folder: every file at least as
    /// long, and the record where the cursor ends still there, the same one); `Err` says why not,
    /// and leaves the relay as it was, reading from the start.
    ///
    /// The default: `Err` (a relay that cannot resume).
    ///
    /// # Errors
    /// [`ResumeError::Mismatch`] saying why the cursor does not hold, or [`ResumeError::Relay`]
    /// when the relay could not be read to check it (nothing is known then).
    fn resume(&self, cursor: &serde_json::Value) -> Result<(), ResumeError> {
        let _ = cursor;
        Err("this relay does not resume from a cursor".to_owned().into())
    }

    /// Forgets what this relay read, a [resumed](Self::resume) cursor included, so that a
    /// pull from an empty frontier hands over every record again: a protected ledger whose
    /// reading a revocation made stale reads it again from the start.
    ///
    /// The default: nothing (a relay that keeps no reading state: every pull reads what its
    /// frontier asks).
    fn read_from_start(&self) {}

    /// The folder where this relay keeps the ledger's shared [checkpoints](crate::checkpoint),
    /// where every site finds them; or, for a relay with a [`checkpoint_store`](Self::checkpoint_store),
    /// this site's folder of copies of the ones it uses. `None` when it keeps none.
    ///
    /// The default: `None`.
    fn checkpoints_dir(&self) -> Option<PathBuf> {
        None
    }

    /// Where the shared checkpoints are stored when it is not [`checkpoints_dir`](Self::checkpoints_dir)
    /// itself (a database): the ledger then copies the ones it needs into that folder, and
    /// stores the ones it writes here. `None` when that folder is what every site shares.
    ///
    /// The default: `None`.
    fn checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        None
    }

    /// Where the stored logs begin, for the devices whose first records were removed
    /// ([`prune`](Self::prune)): device → the seq of the first record held, and the id of the
    /// record before it. A reader lacking those records starts from a checkpoint that covers
    /// them; a [`pull`](Self::pull) from before reports the device as damaged and hands none of
    /// its records over.
    ///
    /// The default: none (a relay that keeps every record).
    ///
    /// # Errors
    /// A storage failure.
    fn log_starts(&self) -> Result<BTreeMap<String, (u64, OpId)>, RelayError> {
        Ok(BTreeMap::new())
    }

    /// Removes `device_id`'s records up to seq `through_seq`, whose id must be `through_id`
    /// (the head of that device in a checkpoint that covers them), keeping the last record
    /// whatever: the log then begins after them ([`log_starts`](Self::log_starts)). Meant for
    /// the device's own site (one writer per file: a synced folder never sees two hosts rewrite
    /// one). Returns how many records were removed (0: none before that point any more).
    ///
    /// The default: [`RelayError::Unsupported`].
    ///
    /// # Errors
    /// [`RelayError::DeviceDamaged`] when the stored record there is not `through_id` (nothing is
    /// removed), [`RelayError::Unsupported`], or a storage failure (the log is then as it was,
    /// or pruned: never anything else).
    fn prune(&self, device_id: &str, through_seq: u64, through_id: OpId) -> Result<u64, RelayError> {
        let _ = (device_id, through_seq, through_id);
        Err(RelayError::Unsupported(
            "this relay keeps every record (it cannot prune)".to_owned(),
        ))
    }

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

/// A store of the shared [checkpoints](crate::checkpoint)' files other than a folder that every
/// site reads ([`Relay::checkpoint_store`]): a database. Each checkpoint is stored under its file
/// name, whole or not at all, and never changes (its name holds its digest).
pub trait CheckpointStore: Send + Sync {
    /// The names of the checkpoints stored.
    ///
    /// # Errors
    /// A storage failure.
    fn names(&self) -> Result<Vec<String>, RelayError>;

    /// Writes the checkpoint `name` into `to`; `false` when none of that name is stored (or it
    /// was removed while it was read: what was written is then of no use).
    ///
    /// # Errors
    /// A storage failure, or a stored checkpoint that is incomplete (damage).
    fn download(&self, name: &str, to: &mut dyn std::io::Write) -> Result<bool, RelayError>;

    /// Stores the file at `path` as the checkpoint `name`; sites see it once all of it is
    /// stored. One of that name stored already is replaced (the same digest: the same
    /// checkpoint, rule K4, or a damaged copy of it).
    ///
    /// # Errors
    /// A storage failure, or the file cannot be read (nothing is then stored under `name`).
    fn upload(&self, name: &str, path: &std::path::Path) -> Result<(), RelayError>;

    /// Removes the checkpoint `name` (nothing when none of that name is stored).
    ///
    /// # Errors
    /// A storage failure.
    fn remove(&self, name: &str) -> Result<(), RelayError>;
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
    /// A device's log begins after records the reading lacks: they were removed after a
    /// checkpoint covered them ([`Relay::prune`]), and the reading did not start from one that
    /// does (it started before that checkpoint was written, or it is not here yet). Damage like
    /// [`Damage`](Self::Damage); a reading started again, from the newest checkpoint, may not
    /// find it (another site pruned while this one read).
    Pruned,
    /// A database ([`Relay::is_database`]) holds fewer records of a device than this site read
    /// before: it went back in time (restored from a dump or an older copy, or failed over to a
    /// standby that lagged), and forgot records this site saw, commits among them. Damage like
    /// [`Damage`](Self::Damage): nothing is dispatched on what is left.
    WentBack,
    /// A ledger folder's file of a device holds fewer records than the reading already has of
    /// it (from a checkpoint, or this site's snapshot), or is not there: a sync that has not
    /// brought them yet (a checkpoint may arrive before the files it covers), or a file that
    /// lost records. Damage like [`Damage`](Self::Damage) (nothing is dispatched), which a
    /// caller may wait out, as for [`Pruned`](Self::Pruned).
    Behind,
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
    /// Whether the problem makes the ledger incomplete ([`ProblemKind::Damage`],
    /// [`ProblemKind::Pruned`], [`ProblemKind::WentBack`] or [`ProblemKind::Behind`]).
    pub fn is_damage(&self) -> bool {
        matches!(
            self.kind,
            ProblemKind::Damage | ProblemKind::Pruned | ProblemKind::WentBack | ProblemKind::Behind
        )
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
            // A detail that names the device itself (a log error) is not prefixed again.
            let named = format!("device {device_id:?}");
            if !self.detail.starts_with(&named) {
                write!(formatter, "{named}: ")?;
            }
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
    #[error("waited {waited_ms} ms for the lock on {path}; another process holds it: `fuser {path}` names it (a fencepost of this device stopped with SIGSTOP, or stuck on a slow disk): let it go on, or end it, and run again (in the library, FsRelayConfig::lock_timeout_ms sets the wait)")]
    LockTimeout {
        /// The file.
        path: PathBuf,
        /// How long this call waited.
        waited_ms: u64,
    },
    /// The database that stores the relay failed (PostgreSQL): unreachable, refused, or no answer
    /// in time.
    #[error("{operation} the ledger in the database: {message}{}", if *.may_have_applied {
        " (the records may have been stored: a later pull shows whether; pushing them again is safe)"
    } else {
        ""
    })]
    Database {
        /// What was being done (`"push to"`, `"pull from"`, `"append to"`).
        operation: &'static str,
        /// What went wrong, with the database's own words.
        message: String,
        /// Whether records may have been stored although the call failed (its answer was lost).
        may_have_applied: bool,
        /// Whether the failure may pass by itself (see
        /// [`BackendError::transient`](crate::lease::BackendError::transient)).
        transient: bool,
    },
    /// The relay cannot do what was asked ([`Relay::prune`] of a relay that keeps every record).
    #[error("{0}")]
    Unsupported(String),
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

impl RelayError {
    /// Whether trying again later may succeed: a database that restarts, refuses logins for a
    /// while, lost the connection or did not answer in time ([`RelayError::Database`] with
    /// `transient`), or a device file's lock held for longer than the wait
    /// ([`RelayError::LockTimeout`]). Damage, refused records and bad input are not.
    pub fn is_transient(&self) -> bool {
        match self {
            RelayError::Database { transient, .. } => *transient,
            RelayError::LockTimeout { .. } => true,
            _ => false,
        }
    }
}

/// Why [`Relay::resume`] did not resume.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// What the relay holds no longer matches the cursor (a file that shrank, a record
    /// replaced, a cursor damaged): read from the start.
    #[error("{0}")]
    Mismatch(String),
    /// The relay could not be read to check the cursor (a database away): nothing is known.
    #[error(transparent)]
    Relay(#[from] RelayError),
}

impl From<String> for ResumeError {
    fn from(reason: String) -> Self {
        ResumeError::Mismatch(reason)
    }
}
