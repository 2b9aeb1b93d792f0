//! The execution intents of the ledger: the vocabulary the op log, the fold and the dispatch
//! share (rules F1, F2). Re-exported from [`crate::lease`], where the seed's paths put it.
//!
//! An intent is the payload of a [`Surface::Intent`](crate::oplog::Surface::Intent) record (rule F1):
//! `{"id": run_id, "agent_id": …, "epoch": …, "status": "pending" | "committed" | "failed"}`.
//! The keys are frozen ([`INTENT_FIELD_ID`], …). The readers [`intent_agent`], [`intent_epoch`],
//! [`intent_status_rank`] and [`intent_is_committed`] are total (rule F2): they never fail and never
//! panic, whatever the payload.

use serde_json::{json, Value};

/// The payload key of the run id (frozen).
pub const INTENT_FIELD_ID: &str = "id";
/// The payload key of the agent id (frozen).
pub const INTENT_FIELD_AGENT: &str = "agent_id";
/// The payload key of the epoch (frozen).
pub const INTENT_FIELD_EPOCH: &str = "epoch";
/// The payload key of the status (frozen).
pub const INTENT_FIELD_STATUS: &str = "status";

/// The highest epoch any coordinator mints: epochs fit a signed 64-bit column in every backend. An
/// intent claiming a higher epoch is malformed (rules F2, F7): it never raises a fencing epoch. A
/// coordinator asked to mint past it refuses with [`LeaseError::EpochsExhausted`](crate::lease::LeaseError::EpochsExhausted).
pub const MAX_EPOCH: u64 = i64::MAX as u64;

/// The state of an execution intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IntentStatus {
    /// Written before the effect: this site is about to act at its epoch.
    Pending,
    /// The effect happened. Kept forever: the idempotency oracle.
    Committed,
    /// The effect was attempted and failed. Terminal, but not a commit.
    Failed,
}

impl IntentStatus {
    /// The wire form: `"pending"`, `"committed"` or `"failed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            IntentStatus::Pending => "pending",
            IntentStatus::Committed => "committed",
            IntentStatus::Failed => "failed",
        }
    }

    /// Parses the wire form; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(IntentStatus::Pending),
            "committed" => Some(IntentStatus::Committed),
            "failed" => Some(IntentStatus::Failed),
            _ => None,
        }
    }

    /// The rank used by the fold (rule F2): 0 for pending, 1 for the terminal states.
    pub fn rank(self) -> u8 {
        match self {
            IntentStatus::Pending => 0,
            IntentStatus::Committed | IntentStatus::Failed => 1,
        }
    }

    /// Whether this is a terminal state (committed or failed).
    pub fn is_terminal(self) -> bool {
        self.rank() == 1
    }
}

impl std::fmt::Display for IntentStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// An execution intent: the ledger's record that `agent_id` at `epoch` is about to perform, has
/// performed, or failed to perform run `run_id` (rule F1).
///
/// ```
/// use fencepost::lease::{Intent, IntentStatus};
/// let intent = Intent::new("milo", "run-1", 3, IntentStatus::Pending);
/// assert_eq!(Intent::from_payload(&intent.payload()), Some(intent));
/// assert_eq!(Intent::from_payload(&serde_json::json!({"id": "run-1"})), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Intent {
    /// The run (see [`crate::run_id::deterministic_run_id`]).
    pub run_id: String,
    /// The agent whose lease fences it.
    pub agent_id: String,
    /// The epoch of the lease it was written under.
    pub epoch: u64,
    /// Its state.
    pub status: IntentStatus,
}

impl Intent {
    /// An intent of `agent_id` for `run_id` (the argument order of the seed's `lease` module:
    /// agent first).
    pub fn new(
        agent_id: impl Into<String>,
        run_id: impl Into<String>,
        epoch: u64,
        status: IntentStatus,
    ) -> Self {
        Self {
            run_id: run_id.into(),
            agent_id: agent_id.into(),
            epoch,
            status,
        }
    }

    /// The record payload: `{"id", "agent_id", "epoch", "status"}`.
    pub fn payload(&self) -> Value {
        json!({
            INTENT_FIELD_ID: self.run_id,
            INTENT_FIELD_AGENT: self.agent_id,
            INTENT_FIELD_EPOCH: self.epoch,
            INTENT_FIELD_STATUS: self.status.as_str(),
        })
    }

    /// Reads a payload; `None` if any of the four fields is missing, empty, of the wrong type, or
    /// the status is unknown. Other keys are ignored.
    pub fn from_payload(payload: &Value) -> Option<Self> {
        let fields = IntentFields::read(payload)?;
        Some(Self::new(
            fields.agent_id,
            fields.run_id,
            fields.epoch,
            fields.status,
        ))
    }
}

/// The four fields of a well-formed intent payload, borrowed from it: the one definition of
/// "well-formed" (rule F1) shared by [`Intent::from_payload`] and the op log's compact form.
pub(crate) struct IntentFields<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) agent_id: &'a str,
    pub(crate) epoch: u64,
    pub(crate) status: IntentStatus,
}

impl<'a> IntentFields<'a> {
    pub(crate) fn read(payload: &'a Value) -> Option<Self> {
        let non_empty_text = |key: &str| payload.get(key)?.as_str().filter(|text| !text.is_empty());
        Some(Self {
            run_id: non_empty_text(INTENT_FIELD_ID)?,
            agent_id: non_empty_text(INTENT_FIELD_AGENT)?,
            epoch: payload
                .get(INTENT_FIELD_EPOCH)?
                .as_u64()
                .filter(|epoch| *epoch <= MAX_EPOCH)?,
            status: IntentStatus::parse(payload.get(INTENT_FIELD_STATUS)?.as_str()?)?,
        })
    }
}

/// The payload's agent id; `""` when missing or not a string (rule F2).
pub fn intent_agent(payload: &Value) -> &str {
    payload
        .get(INTENT_FIELD_AGENT)
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The payload's epoch; 0 when missing, not a non-negative integer, or above [`MAX_EPOCH`]
/// (rule F2).
pub fn intent_epoch(payload: &Value) -> u64 {
    payload
        .get(INTENT_FIELD_EPOCH)
        .and_then(Value::as_u64)
        .filter(|epoch| *epoch <= MAX_EPOCH)
        .unwrap_or(0)
}

/// The payload's status rank: 1 for `"committed"` and `"failed"`, 0 for anything else, including a
/// missing or unknown status (rule F2).
pub fn intent_status_rank(payload: &Value) -> u8 {
    payload
        .get(INTENT_FIELD_STATUS)
        .and_then(Value::as_str)
        .and_then(IntentStatus::parse)
        .map_or(0, IntentStatus::rank)
}

/// Whether the payload's status is exactly `"committed"` (rule F2).
pub fn intent_is_committed(payload: &Value) -> bool {
    payload.get(INTENT_FIELD_STATUS).and_then(Value::as_str) == Some("committed")
}
