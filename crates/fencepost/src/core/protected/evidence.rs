//! Equivocation as evidence (issue 39, rule I1): a device's key signed two different records
//! at one sequence number of its log.
//!
//! A reader that remembers the head it verified at the last record it read of a device (the
//! seen file keeps it) and later finds another record there, covered by a head the same key
//! signed, holds proof: the two heads, and the records of the second chain from that sequence
//! number to its head (their ids and links computed again by whoever checks it). Neither chain
//! is folded as a second truth: the device's log is damage. The cause is a device that wrote
//! two logs: a cloned data directory, or a host that wrote on after its log went back.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::core::identity::{LedgerId, PublicIdentity, Signature};
use crate::oplog::{OpId, OpRecord};

/// A head a device's key signed: what it covers (the record at `seq`, whose id is `op_id`)
/// and the signature, in unpadded base64url.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedHead {
    /// The sequence number of the record that carries the head.
    pub seq: u64,
    /// That record's id.
    pub op_id: OpId,
    /// The signature (64 bytes, unpadded base64url).
    pub signature: String,
}

impl SignedHead {
    /// The head `op` carries, if it carries one.
    pub fn of(op: &OpRecord) -> Option<Self> {
        let head = op.sealed_record()?.head?;
        Some(Self {
            seq: op.seq,
            op_id: op.op_id,
            signature: URL_SAFE_NO_PAD.encode(head.0),
        })
    }

    fn signature(&self) -> Result<Signature, String> {
        let bytes = URL_SAFE_NO_PAD
            .decode(&self.signature)
            .map_err(|error| format!("the head at {} is not base64url: {error}", self.seq))?;
        let bytes: [u8; 64] = bytes
            .try_into()
            .map_err(|_| format!("the head at {} is not a 64-byte signature", self.seq))?;
        Ok(Signature(bytes))
    }
}

/// Proof that a device's key signed two chains: the head this site had verified at `seen.seq`
/// and a head of another chain that reaches it, with that chain's records from `seen.seq` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Equivocation {
    /// The ledger (its id in hex).
    pub ledger: String,
    /// The device whose log it is.
    pub device_id: String,
    /// The id of its log's record 0, which names the key that signed both heads.
    pub origin: OpId,
    /// The head this site verified before.
    pub seen: SignedHead,
    /// The head of the other chain, at or after `seen.seq`.
    pub found: SignedHead,
    /// The other chain's records from `seen.seq` to `found.seq`, as the relay carries them
    /// (lines of format 4 or 3).
    pub lines: Vec<String>,
}

impl Equivocation {
    /// The evidence when `found`, the other chain's records from `seen.seq` on (in sequence
    /// order), ends with a head and differs from `seen` at its sequence number; `None` else.
    pub fn new(ledger: &LedgerId, origin: OpId, seen: SignedHead, found: &[OpRecord]) -> Option<Self> {
        let first = found.first()?;
        let head = found.iter().rev().find_map(SignedHead::of)?;
        let reaching: Vec<&OpRecord> = found.iter().take_while(|op| op.seq <= head.seq).collect();
        if first.seq != seen.seq || first.op_id == seen.op_id {
            return None;
        }
        let lines = reaching.iter().map(|op| line_of(op)).collect();
        Some(Self {
            ledger: hex_of(ledger),
            device_id: first.device_id.to_string(),
            origin,
            seen,
            found: head,
            lines,
        })
    }

    /// Checks the proof against `public`, the key record 0 of the log names: both heads are
    /// its signatures for `ledger`, the lines are a chain from `seen.seq` to `found.seq` that
    /// ends at `found`'s record, and its first record is not the one `seen` signed.
    ///
    /// # Errors
    /// What does not hold.
    pub fn verify(&self, ledger: &LedgerId, public: &PublicIdentity) -> Result<(), String> {
        if self.ledger != hex_of(ledger) {
            return Err("the evidence is of another ledger".to_owned());
        }
        let records = chain_of_lines(&self.device_id, self.seen.seq, &self.lines)?;
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Err("the evidence holds no record of the other chain".to_owned());
        };
        if first.op_id == self.seen.op_id {
            return Err("the other chain has the seen record at its sequence number".to_owned());
        }
        if last.seq != self.found.seq || last.op_id != self.found.op_id {
            return Err("the lines do not end at the found head's record".to_owned());
        }
        for head in [&self.seen, &self.found] {
            if !head_is_signed(head, &self.device_id, ledger, &self.origin, public)? {
                return Err(format!("the head at {} is not the device's signature", head.seq));
            }
        }
        Ok(())
    }
}

/// `op` as the relay carries it (its line of format 4), without the line's end.
pub(crate) fn line_of(op: &OpRecord) -> String {
    let mut line = Vec::new();
    op.write_json_line(&mut line);
    String::from_utf8_lossy(line.trim_ascii_end()).into_owned()
}

/// `lines` read as records `first_seq`, `first_seq + 1`, … of `device`'s log, each a protected
/// ledger's record (format 4 or 3) whose id is computed again from its bytes, linked to the one
/// before it.
///
/// # Errors
/// A line that does not read, is no protected ledger's record (a format-2 line names its own
/// id, which is never computed again: found by a cryptography review, a line of that form
/// bridged a forged membership record to a real signed head), or is not the next record of the
/// chain.
pub(crate) fn chain_of_lines(
    device: &str,
    first_seq: u64,
    lines: &[String],
) -> Result<Vec<OpRecord>, String> {
    let device: Arc<str> = Arc::from(device);
    let mut records: Vec<OpRecord> = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        let op = OpRecord::from_json(line.as_bytes()).map_err(|error| format!("line {index}: {error}"))?;
        if op.sealed_record().is_none() || !op.has_valid_id() {
            return Err(format!(
                "line {index} is no protected ledger's record (format 4 or 3)"
            ));
        }
        let seq = first_seq.checked_add(index as u64);
        if op.device_id != device || Some(op.seq) != seq {
            return Err(format!(
                "line {index} is not record {} of {device:?}",
                first_seq.saturating_add(index as u64)
            ));
        }
        if let Some(before) = records.last().map(|op| op.op_id) {
            if op.prev != Some(before) {
                return Err(format!("line {index} does not follow the line before it"));
            }
        }
        records.push(op);
    }
    Ok(records)
}

fn hex_of(ledger: &LedgerId) -> String {
    let mut text = String::new();
    crate::core::hex::push_lower_hex(&mut text, &ledger.0);
    text
}

fn head_is_signed(
    head: &SignedHead,
    device: &str,
    ledger: &LedgerId,
    origin: &OpId,
    public: &PublicIdentity,
) -> Result<bool, String> {
    let place = (device, head.seq, &head.op_id);
    Ok(crate::oplog::is_valid_head(
        &head.signature()?,
        public,
        ledger,
        place,
        origin,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::ManualClock;
    use crate::core::oplog::{DeviceLog, SealedContent, Surface};

    /// S6, I1 (found by a cryptography review): a chain of lines takes only protected records
    /// (format 4 or 3, their ids computed from their bytes): a format-2 line names its own id, so one
    /// could bridge a forged record to a real signed head.
    #[test]
    fn s6_i1_a_chain_of_lines_takes_no_record_that_names_its_own_id() {
        let clock = ManualClock::new(1_000);
        let mut log = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
        let plain = log.append(Surface::log("note"), serde_json::json!({ "n": 1 }));
        let refused = chain_of_lines("laptop", 0, &[line_of(&plain)]).unwrap_err();
        assert!(refused.contains("no protected ledger's record"), "{refused}");
        let sealed = OpRecord::sealed(
            Arc::from("laptop"),
            0,
            None,
            SealedContent::Clear(vec![1, 2].into()),
        );
        let chain = chain_of_lines("laptop", 0, &[line_of(&sealed)]).unwrap();
        assert_eq!(chain[0].op_id, sealed.op_id);
    }
}
