//! How a [`Ledger`] is opened ([`LedgerOptions`]) and compacts ([`CompactOptions`], [`Retention`]).

#[cfg(doc)]
use super::Ledger;
#[cfg(doc)]
use crate::relay::Relay;

/// Settings of [`Ledger::open_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LedgerOptions {
    /// A file (in the site's own data directory, never in the relay) where the ledger remembers,
    /// per device, how many records it has seen and the last one's id. A later open that finds
    /// fewer records, or another record at that place, reports the device as damaged (a file that
    /// shrank, was replaced or lost records), so nothing is dispatched on what is left. Shared by
    /// every process of the site (updates merge under a file lock).
    pub seen_file: Option<std::path::PathBuf>,
    /// A file (in the site's own data directory) where the ledger keeps what it folded, per
    /// ledger and device, so that the next open reads only the records added since; see
    /// [`crate::snapshot`]. Used with relays that can resume ([`Relay::resume`]): a folder. A
    /// snapshot that cannot be used is rebuilt, never trusted blindly.
    ///
    /// With a snapshot, [`Ledger::state`] holds the runs read or asked about in this process
    /// only: ask [`Ledger::committed_run`], or open without one to list everything.
    pub snapshot: Option<std::path::PathBuf>,
    /// A file (in the site's own data directory) that keeps the records this site could not
    /// store yet ([`Ledger::queue_unsent`]: the outcome of a command that ran while the
    /// database was away), until a ledger opened with it stores them: [`Ledger::open_with`]
    /// does, before it returns, and fails while it cannot, so that nothing is decided on a
    /// ledger that lacks them. Shared by the site's processes (under a file lock).
    pub outbox: Option<std::path::PathBuf>,
    /// The ledger is protected (issue 39): every record this ledger writes is sealed and its
    /// appends signed, and only records a member's head covers are folded (rule S2).
    pub protected: Option<std::sync::Arc<super::Protected>>,
    /// A folder (in the site's own data directory, never in the relay) where a protected
    /// ledger keeps the checkpoints it opened: the relay holds them sealed
    /// (`checkpoint-<records>-<digest>.sealed`, see [`crate::protected::checkpoint`]). Without
    /// it, a protected ledger neither writes nor uses checkpoints. Shared by the site's
    /// processes.
    pub checkpoint_copies: Option<std::path::PathBuf>,
}

impl LedgerOptions {
    /// Keep records that could not be stored in `path` (see [`LedgerOptions::outbox`]).
    pub fn outbox(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.outbox = Some(path.into());
        self
    }

    /// Remember what was seen in `path` (see [`LedgerOptions::seen_file`]).
    pub fn seen_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.seen_file = Some(path.into());
        self
    }

    /// Read and write a protected ledger (see [`LedgerOptions::protected`]).
    pub fn protected(mut self, protected: super::Protected) -> Self {
        self.protected = Some(std::sync::Arc::new(protected));
        self
    }

    /// Keep the checkpoints a protected ledger opened in `dir` (see
    /// [`LedgerOptions::checkpoint_copies`]).
    pub fn checkpoint_copies(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.checkpoint_copies = Some(dir.into());
        self
    }

    /// Keep a snapshot in `path` (see [`LedgerOptions::snapshot`]).
    pub fn snapshot(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.snapshot = Some(path.into());
        self
    }
}

/// How [`Ledger::compact_with`] writes a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactOptions {
    /// The oracle's retention: leave out the committed runs that are at least this old (off by
    /// default; see [`Forgetting`](crate::fold::Forgetting) for when it is safe).
    pub forget: Option<Retention>,
    /// A clock that reads earlier than this (ms since the Unix epoch) is not set yet (a device
    /// without a real-time clock, at 1970 before it synchronises): its compaction adds nothing
    /// to the line of compactions, so it can never be an anchor. 0 (the default): no floor.
    pub clock_floor_ms: u64,
    /// Then remove from this device's own log in the relay the records the checkpoint covers
    /// ([`Relay::prune`](crate::relay::Relay::prune)): the relay stays bounded when every site
    /// compacts with it now and then. Off by default.
    pub prune: bool,
}

impl CompactOptions {
    /// Prune this device's own log after writing the checkpoint (see [`CompactOptions::prune`]).
    pub fn prune(mut self) -> Self {
        self.prune = true;
        self
    }

    /// Forget what `retention` says (see [`CompactOptions::forget`]).
    pub fn forget(mut self, retention: Retention) -> Self {
        self.forget = Some(retention);
        self
    }

    /// Take a clock that reads earlier than `floor_ms` for one not set yet (see
    /// [`CompactOptions::clock_floor_ms`]).
    pub fn clock_floor(mut self, floor_ms: u64) -> Self {
        self.clock_floor_ms = floor_ms;
        self
    }
}

/// The oracle's retention asked of a compaction ([`CompactOptions::forget`]): forget the
/// committed runs of `agents` (empty: every agent's) that an earlier compaction of the
/// checkpoints' line, written at least `older_than_ms` ago by the ledger's clock, already
/// covered (that compaction is the rule's anchor, [`Forgetting`](crate::fold::Forgetting)). With
/// no compaction that old yet, nothing is forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// How old a compaction must be to be the anchor, in ms.
    pub older_than_ms: u64,
    /// The agents whose runs are forgotten; empty: every agent's.
    pub agents: Vec<String>,
}
