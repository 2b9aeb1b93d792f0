//! A ledger's local snapshot: what one site folded of a ledger, kept between processes so that
//! the next one reads only the records added since (see [`LedgerOptions::snapshot`]).
//!
//! # What it holds, and why SQLite
//!
//! A command asks a few questions of the fold (is this run committed? the agent's fencing epoch,
//! its runs in doubt, this device's log head), so the snapshot is *queried*, not loaded: the runs
//! (the fold's [`RunSummary`](crate::fold::RunSummary) per run) stay on disk in buckets, by a
//! hash of agent and run, and a command that checks one run of a ledger of a million reads that
//! run's bucket (a few dozen runs). The rest is small and is loaded whole: every device's verified head, the last ids of
//! each device (what a published head is compared with, rule H3), the agents' fencing epochs, the
//! in-doubt index, the records of the other surfaces, and the relay's
//! [cursor](crate::relay::Relay::cursor). SQLite gives the index, atomic writes (a process killed
//! while saving leaves the previous snapshot), and locking between the processes of one site; it
//! is already the embedded coordinator's store.
//!
//! # Never trusted blindly
//!
//! * The saved state holds the digest of every page of the buckets' checksums, and is itself
//!   checked with a SHA-256 digest; a lookup checks the page and the bucket it reads. A run lost
//!   from the snapshot (a row deleted, a damaged page of the file, the file restored from another
//!   time) makes its bucket differ: damage, never "not committed". The ledger then removes the
//!   snapshot and refuses to dispatch in this process; the next process rebuilds it from the
//!   relay.
//! * A snapshot of another format or device, or under another file name (the CLI names each after
//!   its ledger), or one SQLite cannot read, is removed and rebuilt;
//!   one that another program holds is left alone (this process reads the whole ledger).
//! * The relay checks its cursor against what it holds ([`Relay::resume`](crate::relay::Relay::resume)).
//!   A ledger that does not match (a file that shrank or was replaced) is read from the start,
//!   and what the snapshot had read is checked like the seen file's memory: damage until the
//!   ledger has it again. Such a snapshot is kept, unused, until then.
//! * A process saves only a state that contains the saved one (every device at least as far):
//!   two processes of one site never step back each other's snapshot; a save merges each run
//!   with what is stored, by the fold's own rule.
//! * Limits: a published head older than the last 1 024 records of its device is not compared
//!   (rule H3's check of *which* records this site has; their number still is), and the
//!   in-doubt index and the other surfaces' records are loaded whole.
//!
//! [`LedgerOptions::snapshot`]: crate::ledger::LedgerOptions::snapshot

use serde::{Deserialize, Serialize};

use crate::ledger::InDoubtRun;
use crate::oplog::{HeadMark, OpId};

#[cfg(feature = "sqlite")]
mod store;
#[cfg(not(feature = "sqlite"))]
mod store_off;
#[cfg(not(feature = "sqlite"))]
use store_off as store;

pub(crate) use store::{CheckpointFile, Snapshot};

/// Why a snapshot cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// SQLite failed (an I/O error, a file that is not a database, a lock held too long).
    #[cfg(feature = "sqlite")]
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The snapshot was written by another format or for another device.
    #[error("{0}")]
    Other(String),
    /// Its content does not match its checksums.
    #[error("{0}")]
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Damaged(String),
}

impl SnapshotError {
    /// Whether another process holds the file (it is not damaged: use no snapshot this time,
    /// and leave it).
    pub(crate) fn is_busy(&self) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(error) => matches!(
                error.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }
}

/// The part of a snapshot loaded whole when a ledger opens.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotBase {
    /// Every device's verified head.
    pub(crate) heads: Vec<HeadMark>,
    /// Per device: the seq of the first id kept, and the last ids.
    pub(crate) recent_ids: Vec<(String, u64, Vec<OpId>)>,
    /// Per agent: the fencing epoch.
    pub(crate) fencing: Vec<(String, u64)>,
    /// Per agent: the highest `pending` epoch and the devices that wrote one at it.
    pub(crate) pending_epochs: Vec<(String, u64, Vec<String>)>,
    /// Per run with no commit: the unsettled `pending`s and the settled epochs.
    pub(crate) attempts: Vec<AttemptsMark>,
    /// The records of the other surfaces (logs, registries), as lines.
    pub(crate) records: Vec<String>,
    /// The relay's cursor.
    pub(crate) cursor: serde_json::Value,
    /// The committed runs left out, when a checkpoint was written with a retention of the
    /// oracle (and a snapshot copied from one): absent otherwise, so that a state without it
    /// keeps the digest it always had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) forgotten: Option<crate::fold::Forgetting>,
    /// In a checkpoint: the compactions of its line (its own last), the anchors a later
    /// retention measures age by; absent in a site's own snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) compactions: Vec<CompactionMark>,
    /// A protected ledger's reading (issue 39): its logs' record 0s and membership records,
    /// no key; absent for a ledger that is not protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) protected: Option<crate::protected::ProtectedMark>,
}

impl SnapshotBase {
    /// How many records its heads cover (every device's, from seq 0).
    pub(crate) fn records(&self) -> u64 {
        self.heads.iter().map(|head| head.next_seq).sum()
    }

    /// The time of the anchor of the runs it left out, if it forgets any (what a checkpoint's
    /// name says, [`CheckpointName`](crate::checkpoint::CheckpointName)).
    pub(crate) fn forgets_before_ms(&self) -> Option<u64> {
        self.forgotten.as_ref().map(|rule| rule.anchor_written_at_ms)
    }

    /// Its heads as a compaction of a line names them ([`CompactionMark::heads`]): per device,
    /// the count and the id of the last record.
    pub(crate) fn compaction_heads(&self) -> Vec<(String, u64, OpId)> {
        self.heads
            .iter()
            .filter_map(|head| Some((head.device_id.clone(), head.next_seq, head.last?.0)))
            .collect()
    }
}

/// One compaction of a checkpoint's line: when it was written (the compacting host's clock)
/// and, per device, how many records it covered and the id of the last one (so that a device
/// whose records were replaced since is not taken for the one it covered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompactionMark {
    pub(crate) written_at_ms: u64,
    pub(crate) heads: Vec<(String, u64, OpId)>,
}

/// The attempts of one run, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttemptsMark {
    pub(crate) agent: String,
    pub(crate) run: String,
    pub(crate) unsettled: Vec<InDoubtRun>,
    pub(crate) settled: Vec<u64>,
}
