//! Writing a protected ledger (issue 39, rule S1): what [`Protected`] says about this device,
//! and the records an append makes: the log's record 0 when it is empty, each record sealed
//! with the newest generation of the ledger key this device holds, the last one signed.

use std::sync::Arc;

use serde_json::Value;

use crate::identity::{DeviceKey, LedgerId};
use crate::oplog::{agent_digest, DeviceLog, LogError, OpId, OpRecord, SealedContent, Surface, AGENT_NAMES};
use crate::protected::{Origin, ProtectedLogs, Protection};
use crate::roster::{MembershipChange, Roster};
use crate::seal::LedgerKey;

/// A protected ledger as one device reads and writes it ([`LedgerOptions::protected`](super::LedgerOptions::protected)).
pub struct Protected {
    /// The ledger's id (its genesis's SHA-256).
    pub ledger: LedgerId,
    /// This device's key: signs its appends, and unwraps the ledger key's generations wrapped
    /// to it.
    pub device_key: Arc<DeviceKey>,
    /// What this device's log begins with: its identity, or the genesis for the founder.
    pub origin: Origin,
    /// Generations of the ledger key this device holds already (the ones wrapped to it in the
    /// ledger are unwrapped as they are read).
    pub keys: Vec<LedgerKey>,
    /// The membership changes beyond the genesis (the founder's admission, which the founder's
    /// log holds): given here until membership records are written to the ledger.
    pub members: Vec<MembershipChange>,
}

impl std::fmt::Debug for Protected {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Protected")
            .field("ledger", &self.ledger)
            .field("device", self.device_key.device())
            .finish_non_exhaustive()
    }
}

impl Protected {
    /// What a reading of the ledger starts from: its id, the keys, the members given.
    pub(super) fn logs(&self) -> ProtectedLogs {
        let mut logs = ProtectedLogs::new(
            self.protection(),
            self.members.clone(),
            Some(Arc::clone(&self.device_key)),
        );
        logs.open_many_with(open_in_pieces);
        logs
    }

    /// The ledger with the keys given, before any log is read.
    fn protection(&self) -> Protection {
        let mut protection = Protection::new(self.ledger, Roster::default());
        for key in &self.keys {
            protection.hold(key.clone());
        }
        protection
    }

    /// The id of the record 0 this device's log begins with (its origin in the clear).
    pub fn origin_id(&self) -> OpId {
        OpRecord::sealed(
            Arc::from(self.device_key.device().as_str()),
            0,
            None,
            SealedContent::Clear(self.origin.to_bytes().into()),
        )
        .op_id
    }

    /// A reading resumed from a snapshot's `mark`, at its `heads`.
    ///
    /// # Errors
    /// A line saying what in `mark` does not read.
    pub(super) fn restore_logs(
        &self,
        mark: &crate::protected::ProtectedMark,
        heads: &std::collections::BTreeMap<String, crate::oplog::LogHead>,
    ) -> Result<ProtectedLogs, String> {
        let settled = heads
            .iter()
            .filter_map(|(device, head)| Some((device.clone(), head.next_seq(), head.last_op_id()?)));
        let mut logs = ProtectedLogs::restore(
            self.protection(),
            self.members.clone(),
            Some(Arc::clone(&self.device_key)),
            mark,
            settled,
        )?;
        logs.open_many_with(open_in_pieces);
        Ok(logs)
    }

    /// A reading of what a sealed checkpoint's header says (`mark`, its proofs checked), at its
    /// heads (`settled`: per device, how many records and the last one's id).
    ///
    /// # Errors
    /// A line saying what in `mark` does not read, or does not match the heads.
    pub(super) fn restore_from(
        &self,
        mark: &crate::protected::ProtectedMark,
        settled: impl IntoIterator<Item = (String, u64, OpId)>,
    ) -> Result<ProtectedLogs, String> {
        ProtectedLogs::restore(
            self.protection(),
            self.members.clone(),
            Some(Arc::clone(&self.device_key)),
            mark,
            settled,
        )
    }

    /// The id of this device's record 0, from what the reading read (`logs`) or the records of
    /// this device it has not read yet (`tail`); `None` when its log is empty. An error when
    /// the log begins with another key than this device's: its heads would cover nothing.
    pub(super) fn own_origin(
        &self,
        logs: Option<&ProtectedLogs>,
        tail: &[OpRecord],
    ) -> Result<Option<OpId>, LogError> {
        let device = self.device_key.device().as_str();
        let read = logs.and_then(|logs| logs.origin_of(device)).cloned();
        let read = read.or_else(|| tail.first().filter(|op| op.seq == 0).map(Origin::of_record));
        match read {
            None => Ok(None),
            Some(Ok((id, origin))) if origin.signer() == &self.device_key.public() => Ok(Some(id)),
            Some(Ok(_)) => Err(self.refused("this device's log begins with another key than this device's (another host under this device id?)")),
            Some(Err(why)) => Err(self.refused(&format!("this device's log begins with a record 0 that names no key: {why}"))),
        }
    }

    /// Refuses to sign a head over records of this device's log that it cannot vouch for: the
    /// records before `append_at` (where the next record goes) that `logs` has not settled as
    /// this device's must end, in `tail` (the log's records this reading had not read), with a
    /// head this device's key signed. Found by an adversary: a writer of the ledger appended a
    /// membership record to a member's log, and the member's next append signed over it.
    pub(super) fn vouch_for(
        &self,
        logs: Option<&ProtectedLogs>,
        tail: &[OpRecord],
        append_at: u64,
        origin: &OpId,
    ) -> Result<(), LogError> {
        let device = self.device_key.device().as_str();
        let settled = logs
            .and_then(|logs| logs.settled().find(|(settled, _, _)| *settled == device))
            .map_or(0, |(_, next, _)| next);
        if append_at <= settled {
            return Ok(());
        }
        let public = self.device_key.public();
        let signed = tail
            .iter()
            .rev()
            .find(|op| op.has_valid_head(&public, &self.ledger, origin))
            .map_or(settled, |op| op.seq + 1)
            .max(settled);
        if signed >= append_at {
            return Ok(());
        }
        Err(LogError::Unsealable {
            device_id: device.to_owned(),
            seq: signed,
            detail: format!(
                "record {signed} of this device's log carries no head this device signed: it did not write it (a writer of the ledger?), or one of its processes stopped in the middle of an append; this device signs nothing over it: remove this device's records from {signed} on from the ledger (they count for nothing)"
            ),
        })
    }

    fn refused(&self, detail: &str) -> LogError {
        LogError::Unsealable {
            device_id: self.device_key.device().to_string(),
            seq: 0,
            detail: detail.to_owned(),
        }
    }

    /// The records that store `unsent` after `next` (which holds this device's log up to now):
    /// record 0 first when the log is empty, each record sealed with the newest generation held,
    /// an intent in one size ([`OpRecord::seal_named`]) after a record naming its agent when
    /// this device's log does not name it yet as `logs` read it, the last one signed. `origin`
    /// is the id of the log's record 0 when known.
    pub(super) fn make(
        &self,
        next: &mut DeviceLog,
        origin: Option<OpId>,
        key: Option<&LedgerKey>,
        logs: Option<&ProtectedLogs>,
        unsent: &[(Surface, Value)],
        clear: &[Vec<u8>],
    ) -> Result<Vec<OpRecord>, LogError> {
        let device = Arc::clone(next.head().device_id());
        let refuse = |seq: u64, detail: String| LogError::Unsealable {
            device_id: device.to_string(),
            seq,
            detail,
        };
        let mut made = Vec::with_capacity(unsent.len() + 1);
        let origin = match origin {
            Some(origin) => origin,
            None if next.head().next_seq() == 0 => {
                let first = OpRecord::sealed(
                    Arc::clone(&device),
                    0,
                    None,
                    SealedContent::Clear(self.origin.to_bytes().into()),
                );
                next.append_made(&first)?;
                let origin = first.op_id;
                made.push(first);
                origin
            }
            None => {
                return Err(refuse(
                    next.head().next_seq(),
                    "its log's record 0 was not read".to_owned(),
                ))
            }
        };
        for content in clear {
            let record = OpRecord::sealed(
                Arc::clone(&device),
                next.head().next_seq(),
                next.head().last_op_id(),
                SealedContent::Clear(content.clone().into()),
            );
            next.append_made(&record)?;
            made.push(record);
        }
        let key = match key {
            Some(key) => key,
            None if unsent.is_empty() => return Ok(self.sign_last(made, &origin)),
            None => {
                return Err(refuse(
                    next.head().next_seq(),
                    "this device holds no generation of the ledger key (no member wrapped one to it yet)"
                        .to_owned(),
                ))
            }
        };
        let mut named_now: Vec<String> = Vec::new();
        for (surface, payload) in unsent {
            let intent = (*surface == Surface::Intent)
                .then(|| crate::lease::Intent::from_payload(payload))
                .flatten();
            let Some(intent) = intent else {
                let draft = next.draft(surface.clone(), payload.clone())?;
                let sealed = draft
                    .seal(key, self.ledger)
                    .map_err(|error| refuse(draft.seq, error.to_string()))?;
                next.append_made(&sealed)?;
                made.push(sealed);
                continue;
            };
            let agent = intent.agent_id;
            let named = logs.is_some_and(|logs| logs.names_agent(&device, &agent));
            if !named && !named_now.contains(&agent) {
                let mut digest = String::with_capacity(32);
                crate::core::hex::push_lower_hex(&mut digest, &agent_digest(&agent));
                let naming = serde_json::json!({ "key": digest, "agent": agent });
                let draft = next.draft(Surface::registry(AGENT_NAMES), naming)?;
                let sealed = draft
                    .seal(key, self.ledger)
                    .map_err(|error| refuse(draft.seq, error.to_string()))?;
                next.append_made(&sealed)?;
                made.push(sealed);
                named_now.push(agent);
            }
            let draft = next.draft(surface.clone(), payload.clone())?;
            let sealed = draft
                .seal_named(key, self.ledger)
                .map_err(|error| refuse(draft.seq, error.to_string()))?;
            next.append_made(&sealed)?;
            made.push(sealed);
        }
        Ok(self.sign_last(made, &origin))
    }

    /// `made` with its last record signed: the head that covers the append.
    fn sign_last(&self, mut made: Vec<OpRecord>, origin: &OpId) -> Vec<OpRecord> {
        if let Some(last) = made.pop() {
            made.push(last.signed(&self.device_key, &self.ledger, origin));
        }
        made
    }
}

/// Fewer records than this are opened one by one, each as its verdict is given.
const OPEN_IN_PIECES_RECORDS: usize = 512;
/// How many records a thread opens at a time.
const OPEN_PIECE_RECORDS: usize = 256;

/// Opens many covered records on every core ([`OpenMany`](crate::protected::OpenMany)): a
/// cold open of a protected ledger spends most of its time opening records. Leaves fewer than
/// [`OPEN_IN_PIECES_RECORDS`], or any on one core, to be opened one by one.
fn open_in_pieces(protection: &Protection, ops: &[OpRecord]) -> Vec<Option<OpRecord>> {
    let cores = crate::edge::pieces::cores();
    if ops.len() < OPEN_IN_PIECES_RECORDS || cores < 2 {
        return Vec::new();
    }
    crate::edge::pieces::in_pieces(ops.len(), OPEN_PIECE_RECORDS, cores - 1, |range| {
        ops[range].iter().map(|op| protection.open_ahead(op)).collect()
    })
    .into_iter()
    .flatten()
    .collect()
}
