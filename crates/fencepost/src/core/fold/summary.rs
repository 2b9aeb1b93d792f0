//! What the fold keeps of one run as a value to store and give back ([`RunSummary`], [`SummaryRecord`]), and the oracle's retention ([`Forgetting`]).

#[cfg(doc)]
use super::{RunRecord, SyncState};
use crate::core::clock::Hlc;
use crate::intent::IntentStatus;
use crate::oplog::OpId;

/// One intent record of a [`RunSummary`]: a [`RunRecord`] with its full HLC stamp (the device
/// by name), as a store outside the fold keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRecord {
    /// The record's op id.
    pub op_id: OpId,
    /// The epoch it was written under.
    pub epoch: u64,
    /// Its status.
    pub status: IntentStatus,
    /// Its HLC stamp.
    pub hlc: Hlc,
}

/// What the fold keeps of one run, as a value that a snapshot or a checkpoint stores and gives
/// back ([`SyncState::run_summaries`], [`SyncState::merge_summary`]): the greatest record that
/// was eligible when it arrived and, when that one is a `failed`, the greatest `committed`
/// record below it.
///
/// Merging the summaries of a folded set of records into the fold of another set gives the fold
/// of their union (with the agents' fencing epochs raised, [`SyncState::raise_fencing_epoch`]):
/// a summary stands for the records it was folded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// The greatest record.
    pub best: SummaryRecord,
    /// The greatest `committed` record, when `best` is a `failed` above it.
    pub committed_below_failed: Option<SummaryRecord>,
}

impl RunSummary {
    /// The greatest committed record of the run (rule F6), if any.
    pub fn committed(&self) -> Option<&SummaryRecord> {
        match self.best.status {
            IntentStatus::Committed => Some(&self.best),
            _ => self.committed_below_failed.as_ref(),
        }
    }
}

/// The oracle's retention, off unless an operator asks for it: which committed runs a
/// [checkpoint](crate::checkpoint) leaves out ([`Ledger::compact_with`](crate::ledger::Ledger::compact_with)).
///
/// Forgetting a committed run is an exception to rule F6 that an operator makes for run ids
/// that can never be asked for again: ids whose salt names a time that has passed (a date, a
/// schedule slot). Once forgotten by every site, the same run id asked for again would look
/// new and run again.
///
/// A run's age is not read from its records' stamps (a writer's clock may be days off, or at
/// 1970 before it synchronises), but from the ledger's own order: an earlier compaction, the
/// *anchor*, covered the first records of each device; a run whose greatest record and
/// greatest commit are among them was committed when the anchor was written, at
/// `anchor_written_at_ms` by the clock of the host that compacted. A run with no commit (in
/// doubt, rule D2) is never forgotten; the agents' fencing epochs (F4) are always kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forgetting {
    /// When the anchor was written, by the compacting host's clock (ms since the Unix epoch).
    pub anchor_written_at_ms: u64,
    /// The records the anchor covered: per device, how many (seq 0 up to this one, excluded).
    pub anchor_heads: Vec<(String, u64)>,
    /// The agents whose runs it applies to; empty: every agent.
    pub agents: Vec<String>,
}

impl Forgetting {
    /// Whether the rule applies to the runs of `agent_id`.
    pub fn applies_to(&self, agent_id: &str) -> bool {
        self.agents.is_empty() || self.agents.iter().any(|agent| agent == agent_id)
    }

    /// Whether the anchor covered record `seq` of device `device_id`.
    pub fn covers(&self, device_id: &str, seq: u64) -> bool {
        self.anchor_heads
            .iter()
            .any(|(device, next_seq)| device == device_id && seq < *next_seq)
    }
}
