//! What can go wrong with a [`Ledger`](super::Ledger): [`LedgerError`], and the checkpoints'
//! own [`CheckpointError`].

use std::path::PathBuf;

use crate::id::IdError;
use crate::oplog::LogError;
use crate::relay::{RelayError, RelayProblem};
use crate::snapshot::SnapshotError;

/// A [`Ledger`](super::Ledger) error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// An id was invalid.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// An intent's epoch is outside `1..=`[`MAX_EPOCH`](crate::lease::MAX_EPOCH): no coordinator
    /// mints it, and the fold would ignore the record as malformed (F7). Nothing was written.
    #[error("epoch {epoch} is outside 1..={max}: no coordinator mints it", max = crate::lease::MAX_EPOCH)]
    InvalidEpoch {
        /// The epoch.
        epoch: u64,
    },
    /// The relay failed: the records are kept and pushed by the next
    /// [`Ledger::sync`](super::Ledger::sync) or [`Ledger::flush`](super::Ledger::flush).
    // Transparent: the relay's errors say what they were doing ("append to the ledger …"), and a
    // message that also showed its source would repeat it in every report of the chain.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// The relay holds a log of this device that cannot be continued.
    #[error("this device's log in the relay cannot be continued: {0}")]
    Log(#[from] LogError),
    /// [`Ledger::resolve`](super::Ledger::resolve) was asked to settle a run that is not in doubt.
    #[error("{run_id} of {agent_id} is not in doubt")]
    NotInDoubt {
        /// The agent.
        agent_id: String,
        /// The run.
        run_id: String,
    },
    /// The ledger is incomplete: the relay reported damage
    /// ([`Ledger::damage`](super::Ledger::damage)), so a run that the damaged device committed
    /// would look new. Nothing was written, nothing ran. Repair the file from a copy, or accept
    /// the damage explicitly ([`Ledger::accept_damage`](super::Ledger::accept_damage)).
    #[error("the ledger is damaged, not dispatching on it: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Damaged {
        /// What is damaged.
        problems: Vec<RelayProblem>,
    },
    /// A checkpoint could not be written or the checkpoints could not be checked.
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
    /// A protected ledger is founded only on a relay that holds no record.
    #[error("cannot make this ledger protected: it holds records already (a protected ledger starts empty)")]
    NotEmpty,
    /// The ledger is protected (it holds sealed records) and this host reads it as a
    /// non-member: it writes nothing into it, whatever damage it accepted.
    #[error("the ledger is protected (it holds sealed records) and this host is not one of its members: it writes nothing into it. Join it with `fencepost device join FINGERPRINT`, and have a member admit this device")]
    ProtectedNotMember,
    /// A member revoked this device from record `cut` of its log on: what it would write
    /// counts for nothing, so it writes nothing (nothing ran). A member admits it again,
    /// under a new device id.
    #[error("this device ({device}) was revoked from record {cut} of its log on: it writes nothing into the protected ledger, and nothing ran. To use this host again, have a member admit it under a new device id")]
    Revoked {
        /// This device.
        device: String,
        /// The first record voided.
        cut: u64,
    },
    /// A membership change that cannot be made (revoking oneself, a device that is no member,
    /// a change asked of a device that is no member yet). Nothing was written.
    #[error("{detail}")]
    Membership {
        /// What is wrong.
        detail: String,
    },
    /// An import into a protected ledger was refused ([`Ledger::import`](super::Ledger::import)).
    #[error(transparent)]
    Import(#[from] super::ImportError),
    /// A membership change asked of a ledger that is not protected.
    #[error("this ledger is not protected: it has no members")]
    NotProtected,
    /// The seen file ([`LedgerOptions::seen_file`](super::LedgerOptions::seen_file)) could not be
    /// read or written.
    #[error("cannot use the seen file {path}")]
    Seen {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The outbox ([`LedgerOptions::outbox`](super::LedgerOptions::outbox)) could not be read,
    /// locked or written, or a line of it is damaged. Nothing in it was removed.
    #[error("the outbox {path} (records queued on this site): {detail}")]
    Outbox {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Records queued in the outbox could not be stored (they stay in it): nothing is decided
    /// before they are, so that a run whose outcome waits there is not taken for one in doubt.
    #[error("{count} record(s) queued on this site in {path} could not be stored yet: {source}")]
    Queued {
        /// The outbox.
        path: PathBuf,
        /// How many it holds for this device.
        count: usize,
        /// Why they could not be stored.
        #[source]
        source: Box<LedgerError>,
    },
}

impl From<CheckpointError> for LedgerError {
    fn from(error: CheckpointError) -> Self {
        LedgerError::Checkpoint(Box::new(error))
    }
}

impl LedgerError {
    /// Whether trying again later may succeed: the relay failed in a way that may pass by itself
    /// ([`RelayError::is_transient`]).
    pub fn is_transient(&self) -> bool {
        match self {
            LedgerError::Relay(error) => error.is_transient(),
            LedgerError::Queued { source, .. } => source.is_transient(),
            _ => false,
        }
    }
}

/// Why a checkpoint could not be written ([`Ledger::compact`](super::Ledger::compact); nothing
/// was changed in the ledger) or the checkpoints could not be checked
/// ([`Ledger::verify_checkpoints`](super::Ledger::verify_checkpoints)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The relay keeps no checkpoints.
    #[error("cannot write a checkpoint: this ledger keeps no checkpoints (a ledger in PostgreSQL keeps them with a folder for this site's copies: PostgresRelay::with_checkpoint_mirror)")]
    NotKept,
    /// The ledger resumed from a snapshot: records it read before are not read again, so damage
    /// among them would not be seen. Open it without a snapshot to compact.
    #[error("cannot write a checkpoint: compaction needs a ledger that read every record (opened without a snapshot), so that every record is checked")]
    CompactAfterSnapshot,
    /// The ledger resumed from a snapshot; open it without one to check the checkpoints.
    #[error("cannot check the checkpoints: checking checkpoints needs a ledger that read every record")]
    VerifyAfterSnapshot,
    /// The ledger has no records to write a checkpoint of.
    #[error("cannot write a checkpoint: the ledger has no records yet")]
    NoRecords,
    /// A protected ledger's checkpoint is judged by where it ends its writer's log, and this
    /// device is no member there (not admitted yet), or was revoked: every other host would
    /// refuse it.
    #[error("cannot write a checkpoint: this device ({device}) is no member of the protected ledger where its log ends, or was revoked (every host refuses its checkpoints); compact on a member")]
    WriterNotMember {
        /// This device.
        device: String,
    },
    /// The ledger is protected, and was given no folder for the checkpoints it opens
    /// ([`LedgerOptions::checkpoint_copies`](super::LedgerOptions::checkpoint_copies)): the
    /// relay holds them sealed, this site the opened copies.
    #[error("cannot write a checkpoint: the ledger is protected, and no folder of this site's was given for its opened checkpoints")]
    Protected,
    /// The ledger is protected and a record read is not settled yet (held for a head, missing):
    /// a checkpoint must cover what it read whole.
    #[error("cannot write a checkpoint: the ledger is protected, and records read are not settled yet (`fencepost status` names what is missing)")]
    Unsettled,
    /// The checkpoints' folder could not be created.
    #[error("cannot write a checkpoint: cannot create {}: {source}", path.display())]
    CreateFolder {
        /// The folder.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoints' folder could not be listed.
    #[error("cannot check the checkpoints: cannot list {}: {source}", path.display())]
    ListFolder {
        /// The folder.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The relay cannot say where its reading stands (a device file with an incomplete last
    /// line?): try again.
    #[error("cannot write a checkpoint: the relay cannot say where its reading stands (a device file with an incomplete last line?); try again")]
    NoCursor,
    /// The fold could not be exported into the checkpoint's file.
    #[error("cannot write a checkpoint: {0}")]
    Export(#[source] SnapshotError),
    /// The written file could not be moved into the checkpoints' folder.
    #[error("cannot write a checkpoint: cannot move the checkpoint into {}: {source}", dir.display())]
    Move {
        /// The folder.
        dir: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint could not be stored in the ledger's database.
    #[error("cannot write a checkpoint: cannot store it in the ledger: {0}")]
    Store(#[source] RelayError),
    /// The checkpoint was written, but this device's log could not be pruned.
    #[error("cannot write a checkpoint: wrote {}, but cannot prune this device's log: {source}", path.display())]
    Prune {
        /// The checkpoint written.
        path: PathBuf,
        /// The error.
        #[source]
        source: RelayError,
    },
}
