//! What a protected reading keeps in this host's snapshot ([`ProtectedMark`]), and a reading
//! restored from it: every log's record 0, the membership records read and how far each log
//! was folded. No key: the generations are unwrapped again from the membership records.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{founding, ProtectedLogs, ReadChange};
use crate::core::identity::{DeviceKey, LedgerId};
use crate::core::membership::MembershipRecord;
use crate::core::protected::{LogReader, Origin, Protection};
use crate::core::roster::{KeyId, MembershipChange, Position};
use crate::oplog::{OpId, OpRecord, SealedContent};
use std::sync::Arc;

/// A protected reading in a snapshot: saved only when every record read is settled, so that
/// the reading resumes at the snapshot's heads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Per membership record, in the same order: its record and the ones after it through
    /// the first that carries a valid head, as the relay carries them (lines of format 4 or 3). What
    /// shows the reader of a checkpoint that the author's key wrote each change
    /// ([`check_proofs`](Self::check_proofs)); absent in a snapshot written before them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    proofs: Vec<Vec<String>>,
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
        let proofs = self
            .memberships
            .iter()
            .map(|read| {
                read.proof
                    .iter()
                    .map(crate::core::protected::evidence::line_of)
                    .collect()
            })
            .collect();
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
            proofs,
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
        let no_proofs = Vec::new();
        for (index, ((device, seq, log_key, bytes), op_id)) in
            mark.memberships.iter().zip(&mark.membership_ids).enumerate()
        {
            let record = MembershipRecord::from_bytes(&decode(bytes)?)?;
            let proof = mark.proofs.get(index).unwrap_or(&no_proofs);
            let proof = proof
                .iter()
                .map(|line| OpRecord::from_json(line.as_bytes()).map_err(|error| error.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            let device = crate::id::DeviceId::new(device).map_err(|error| error.to_string())?;
            logs.memberships.push(ReadChange {
                position: Position { device, seq: *seq },
                op_id: *op_id,
                log_key: KeyId(log_key.0),
                record,
                by_recovery: false,
                taken: false,
                looked: None,
                keys: Vec::new(),
                proof,
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

impl ProtectedMark {
    /// What of this mark a sealed checkpoint carries in the clear: every log's record 0 and
    /// every membership record with its proof, no more (the folded counts and the agents'
    /// names stay inside the ciphertext).
    pub(crate) fn roster_part(&self) -> ProtectedMark {
        ProtectedMark {
            origins: self.origins.clone(),
            memberships: self.memberships.clone(),
            membership_ids: self.membership_ids.clone(),
            folded: Vec::new(),
            voided: Vec::new(),
            names: Vec::new(),
            proofs: self.proofs.clone(),
        }
    }

    /// What the record 0s it holds say (those that read).
    pub(crate) fn origins(&self) -> Vec<Origin> {
        self.origins
            .iter()
            .filter_map(|(_, _, bytes)| Origin::from_bytes(&decode(bytes).ok()?).ok())
            .collect()
    }

    /// Whether `other` holds the same record 0s, membership records and proofs as this one.
    pub(crate) fn same_roster(&self, other: &ProtectedMark) -> bool {
        self.roster_part() == other.roster_part()
    }

    /// Checks what this mark says against the keys it names, for a mark a reader did not write
    /// (a sealed checkpoint's): each record 0's id is that of its bytes, and each membership
    /// record comes with its proof, a chain of its author's log from it to a head the key of
    /// the author's record 0 signed for `ledger`. Which changes count is the roster's to say
    /// (rooted in the genesis), as for records read from the ledger.
    ///
    /// # Errors
    /// What does not hold.
    pub(crate) fn check_proofs(&self, ledger: &LedgerId) -> Result<(), String> {
        let mut signers = std::collections::BTreeMap::new();
        for (device, id, bytes) in &self.origins {
            let bytes = decode(bytes)?;
            let said = Origin::from_bytes(&bytes)?;
            let record = OpRecord::sealed(
                Arc::from(device.as_str()),
                0,
                None,
                SealedContent::Clear(bytes.into()),
            );
            if record.op_id != *id {
                return Err(format!(
                    "the record 0 given for {device:?} is not the one its id names"
                ));
            }
            if signers.insert((device.as_str(), *id), *said.signer()).is_some()
                || self
                    .origins
                    .iter()
                    .filter(|(other, _, _)| other == device)
                    .count()
                    > 1
            {
                return Err(format!("it gives {device:?} more than one record 0"));
            }
        }
        if self.proofs.len() != self.memberships.len() || self.membership_ids.len() != self.memberships.len()
        {
            return Err("its membership records do not each come with their id and proof".to_owned());
        }
        for (((device, seq, log_key, bytes), op_id), proof) in self
            .memberships
            .iter()
            .zip(&self.membership_ids)
            .zip(&self.proofs)
        {
            let at = format!("the membership record at {device:?} {seq}");
            if *seq == 0 {
                return Err(format!("{at} is a log's record 0"));
            }
            let Some(signer) = signers.get(&(device.as_str(), *log_key)) else {
                return Err(format!("{at} is of a log whose record 0 it does not give"));
            };
            let chain = crate::core::protected::evidence::chain_of_lines(device, *seq, proof)
                .map_err(|error| format!("{at}: its proof {error}"))?;
            let (Some(first), Some(last)) = (chain.first(), chain.last()) else {
                return Err(format!("{at} comes with no proof"));
            };
            let clear = match first.sealed_record().map(|record| &record.content) {
                Some(SealedContent::Clear(clear)) => Some(clear),
                _ => None,
            };
            let bytes = decode(bytes)?;
            if first.op_id != *op_id || clear.is_none_or(|clear| **clear != *bytes) {
                return Err(format!("{at} is not the first record of its proof"));
            }
            if !last.has_valid_head(signer, ledger, log_key) {
                return Err(format!("{at}: its proof ends at no head its author's key signed"));
            }
        }
        Ok(())
    }
}

fn decode(text: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|error| format!("stored bytes are not base64: {error}"))
}
