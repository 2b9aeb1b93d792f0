//! The agents that a protected ledger's intents of one size name by digest (issue 39): what the
//! records of [`AGENT_NAMES`] said, so that an opened intent gets its agent id back, and which
//! log named which agent (a writer names an agent in its own log before its first intent).

use std::collections::{BTreeMap, BTreeSet};

use compact_str::CompactString;
use serde_json::Value;

use crate::id::{validate_id, IdKind};
use crate::oplog::{agent_digest, OpRecord, Surface, AGENT_DIGEST_BYTES, AGENT_NAMES};

type Digest = [u8; AGENT_DIGEST_BYTES];

/// The names read. A name counts only when its digest is the one its record gives: a record
/// cannot give a digest another agent's name.
#[derive(Debug, Clone, Default)]
pub(super) struct AgentNames {
    names: BTreeMap<Digest, CompactString>,
    /// The same names by the stand-in an opened intent holds (found in a profile: decoding
    /// each intent's stand-in to its digest was a twentieth of a cold open).
    by_stand_in: std::collections::HashMap<CompactString, CompactString>,
    /// Which device's log named which agent.
    named: BTreeSet<(String, Digest)>,
}

/// What [`AgentNames::resolve`] made of an opened record.
pub(super) enum Resolved {
    /// The record, its agent named (or not an intent by digest).
    Record(OpRecord),
    /// A record naming an agent: read, nothing to fold.
    Naming,
    /// An intent by a digest no record read names yet.
    Unnamed(OpRecord),
}

impl AgentNames {
    /// Reads `op`, an opened record of its device's log in order: a naming record is learned,
    /// an intent by digest gets its agent id.
    pub(super) fn resolve(&mut self, mut op: OpRecord) -> Resolved {
        if let Surface::Registry { kind } = &op.surface {
            if &**kind == AGENT_NAMES {
                self.learn(&op);
                return Resolved::Naming;
            }
            return Resolved::Record(op);
        }
        if let Some(name) = op.opened_agent().and_then(|agent| self.by_stand_in.get(agent)) {
            let name = name.clone();
            op.put_agent(&name);
            return Resolved::Record(op);
        }
        let Some(digest) = op.agent_stand_in() else {
            return Resolved::Record(op);
        };
        match self.names.get(&digest) {
            Some(name) => {
                op.put_agent(name);
                Resolved::Record(op)
            }
            None => Resolved::Unnamed(op),
        }
    }

    fn learn(&mut self, op: &OpRecord) {
        let value = op.payload.value();
        let key = value.get("key").and_then(Value::as_str);
        let agent = value.get("agent").and_then(Value::as_str);
        let named = match (key, agent) {
            (Some(key), Some(agent)) if validate_id(IdKind::Agent, agent).is_ok() => {
                let digest = agent_digest(agent);
                (crate::core::hex::decode_lower_hex::<AGENT_DIGEST_BYTES>(key) == Some(digest))
                    .then_some(agent)
            }
            _ => None,
        };
        match named {
            Some(agent) => self.insert(&op.device_id, agent),
            None => {
                tracing::warn!(device = %op.device_id, seq = op.seq, "a record naming an agent whose digest is not its name's: ignored");
            }
        }
    }

    /// Notes that `device`'s log names `agent`.
    pub(super) fn insert(&mut self, device: &str, agent: &str) {
        let digest = agent_digest(agent);
        self.names
            .entry(digest)
            .or_insert_with(|| CompactString::from(agent));
        self.by_stand_in
            .entry(crate::core::oplog::stand_in(&digest))
            .or_insert_with(|| CompactString::from(agent));
        self.named.insert((device.to_owned(), digest));
    }

    /// How many agents are named: it grows when a record names one no record named before.
    pub(super) fn count(&self) -> usize {
        self.names.len()
    }

    /// Whether `device`'s log names `agent` (as read).
    pub(super) fn named(&self, device: &str, agent: &str) -> bool {
        self.named.contains(&(device.to_owned(), agent_digest(agent)))
    }

    /// Every (device, agent) named, for a snapshot.
    pub(super) fn listed(&self) -> Vec<(String, String)> {
        self.named
            .iter()
            .filter_map(|(device, digest)| Some((device.clone(), self.names.get(digest)?.to_string())))
            .collect()
    }
}
