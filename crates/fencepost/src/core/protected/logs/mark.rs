//! What a protected reading keeps in this host's snapshot ([`ProtectedMark`]), and a reading
//! restored from it: every log's record 0, the membership records read and how far each log
//! was folded. No key: the generations are unwrapped again from the membership records.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{founding, ProtectedLogs, ReadChange};
use crate::core::identity::DeviceKey;
use crate::core::membership::MembershipRecord;
use crate::core::protected::{LogReader, Origin, Protection};
use crate::core::roster::{KeyId, MembershipChange, Position};
use crate::oplog::OpId;
use std::sync::Arc;

/// A protected reading in a snapshot: saved only when every record read is settled, so that
/// the reading resumes at the snapshot's heads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtectedMark {
    /// Per device: the id of its log's record 0 and what it says (base64).
    origins: Vec<(String, OpId, String)>,
    /// The membership records read: author, sequence number, the id of the author's record 0,
    /// the record (base64).
    memberships: Vec<(String, u64, OpId, String)>,
    /// The ids of the records that hold them, in the same order (rule M4: a holder publishes
    /// them).
    #[serde(default)]
    membership_ids: Vec<OpId>,
    /// Per device and the id of its record 0: the highest sequence number folded.
    folded: Vec<(String, OpId, u64)>,
    /// Per device and the id of its record 0: the lowest sequence number held void.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    voided: Vec<(String, OpId, u64)>,
    /// The agents each device's log named (intents of one size name them by digest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    names: Vec<(String, String)>,
}

impl ProtectedMark {
    /// The membership records this mark read that `held` (the id a relay holds now at a device
    /// and sequence number) no longer holds there: their author and bytes, in the order read. What a site
    /// writes back into a database that went back (found by an adversary: a revocation the
    /// database lost was lost for good, and the revoked device ran again).
    pub(crate) fn memberships_lost(
        &self,
        held: impl Fn(&str, u64) -> Option<OpId>,
    ) -> Vec<(String, Vec<u8>)> {
        self.memberships
            .iter()
            .zip(&self.membership_ids)
            .filter(|((device, seq, _, _), id)| held(device, *seq) != Some(**id))
            .filter_map(|((device, _, _, bytes), _)| Some((device.clone(), decode(bytes).ok()?)))
            .collect()
    }
}

impl ProtectedLogs {
    /// This reading as a snapshot keeps it; `None` while a record read is not settled (held
    /// for a head, missing, or settled past one that is not): the snapshot is not saved then.
    pub(crate) fn mark(&self) -> Option<ProtectedMark> {
        let settled = self.unresolved.values().all(Vec::is_empty)
            && self.ahead.values().all(std::collections::BTreeMap::is_empty)
            && self.readers.values().all(|reader| reader.held().is_empty());
        if !settled {
            return None;
        }
        let mut origins = Vec::with_capacity(self.readers.len());
        for (device, reader) in &self.readers {
            let (id, said) = reader.origin()?.as_ref().ok()?;
            origins.push((device.clone(), *id, URL_SAFE_NO_PAD.encode(said.to_bytes())));
        }
        let memberships = self
            .memberships
            .iter()
            .map(|read| {
                (
                    read.position.device.to_string(),
                    read.position.seq,
                    OpId(read.log_key.0),
                    URL_SAFE_NO_PAD.encode(read.record.to_bytes()),
                )
            })
            .collect();
        let membership_ids = self.memberships.iter().map(|read| read.op_id).collect();
        let folded = self
            .folded
            .iter()
            .map(|((device, key), seq)| (device.clone(), OpId(key.0), *seq))
            .collect();
        let voided = self
            .voided
            .iter()
            .map(|((device, key), seq)| (device.clone(), OpId(key.0), *seq))
            .collect();
        Some(ProtectedMark {
            origins,
            memberships,
            membership_ids,
            folded,
            voided,
            names: self.names.listed(),
        })
    }

    /// The reading `mark` keeps, resumed at `settled` (per device, how many records and the
    /// last one's id: the snapshot's heads), with the caller's `protection`, `changes` and
    /// `recipient` as [`new`](Self::new) takes them.
    ///
    /// # Errors
    /// A line saying what in `mark` does not read, or does not match the heads.
    pub(crate) fn restore(
        protection: Protection,
        changes: Vec<MembershipChange>,
        recipient: Option<Arc<DeviceKey>>,
        mark: &ProtectedMark,
        settled: impl IntoIterator<Item = (String, u64, OpId)>,
    ) -> Result<Self, String> {
        let mut logs = Self::new(protection, changes, recipient);
        let ledger = *logs.protection.ledger();
        for (device, next, last) in settled {
            logs.settled.insert(device, (next, last));
        }
        for (device, id, bytes) in &mark.origins {
            let said = Origin::from_bytes(&decode(bytes)?)?;
            let Some((next, _)) = logs.settled.get(device) else {
                return Err(format!("the origin of {device:?} has no head"));
            };
            if logs.founded.is_none() {
                logs.founded = founding(&said, device, id, &ledger);
            }
            let reader = LogReader::restored(Arc::from(device.as_str()), (*id, said), *next);
            logs.readers.insert(device.clone(), reader);
        }
        if logs.readers.len() != logs.settled.len() {
            return Err("a head has no origin".to_owned());
        }
        if mark.membership_ids.len() != mark.memberships.len() {
            return Err("it names the membership records read without their ids".to_owned());
        }
        for ((device, seq, log_key, bytes), op_id) in mark.memberships.iter().zip(&mark.membership_ids) {
            let record = MembershipRecord::from_bytes(&decode(bytes)?)?;
            let device = crate::id::DeviceId::new(device).map_err(|error| error.to_string())?;
            logs.memberships.push(ReadChange {
                position: Position { device, seq: *seq },
                op_id: *op_id,
                log_key: KeyId(log_key.0),
                record,
                by_recovery: false,
                taken: false,
                keys: Vec::new(),
            });
        }
        for (device, key, seq) in &mark.folded {
            logs.folded.insert((device.clone(), KeyId(key.0)), *seq);
        }
        for (device, key, seq) in &mark.voided {
            logs.voided.insert((device.clone(), KeyId(key.0)), *seq);
        }
        for (device, agent) in &mark.names {
            logs.names.insert(device, agent);
        }
        logs.refresh();
        Ok(logs)
    }
}

fn decode(text: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|error| format!("stored bytes are not base64: {error}"))
}
