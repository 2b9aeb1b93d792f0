//! Checkpoints compose (rule K6): the fold is a CRDT, so the union of two checkpoints' states is
//! the state of the union of the records they cover. A ledger whose device files begin after
//! records that several checkpoints cover, none alone (two hosts that pruned before a synced
//! folder carried the other's records), starts from the merge of those checkpoints.

use std::collections::{BTreeMap, BTreeSet};

use super::{Attempts, LedgerState};
use crate::oplog::OpId;

impl LedgerState {
    /// Merges `other`, the view of another checkpoint of this ledger, into this one: per device
    /// the further head (and its recent ids), per run the merged entry (rules F3, F5, F6), per
    /// agent the higher fencing epoch (F4), the union of the attempts (D2) and of the other
    /// surfaces' records, and the records both attest by place and id.
    ///
    /// # Errors
    /// A description when the two are not views of one ledger: a device whose heads name
    /// different records at one place, or other rules of the oracle's retention (a checkpoint
    /// that forgets runs merges only with one that forgets the same).
    pub(crate) fn merge_checkpoint(&mut self, other: LedgerState) -> Result<(), String> {
        if self.forgotten != other.forgotten {
            return Err("the two checkpoints forget different committed runs (retention)".to_owned());
        }
        self.check_same_records(&other)?;
        let LedgerState {
            state,
            frontier: _,
            heads,
            mut ids,
            other_records,
            rejected: _,
            attempts,
            pending_epochs,
            forgotten: _,
            attested,
            protected: _,
            sealed_seen: _,
            protected_damage: _,
        } = other;
        for (device, head) in heads {
            let ahead = self
                .heads
                .get(&device)
                .is_none_or(|ours| head.next_seq() > ours.next_seq());
            if !ahead {
                continue;
            }
            self.frontier
                .raise_to(&device, head.next_seq(), head.last_op_id());
            match ids.remove(&device) {
                Some(theirs) => drop(self.ids.insert(device.clone(), theirs)),
                None => drop(self.ids.remove(&device)),
            }
            self.heads.insert(device, head);
        }
        let merged: Result<(), std::convert::Infallible> =
            state.for_each_run_summary(|agent, run, summary| {
                self.state.merge_summary(agent, run, &summary);
                Ok(())
            });
        let Ok(()) = merged;
        for (agent, folded) in state.agents() {
            self.state.raise_fencing_epoch(agent, folded.fencing_epoch());
        }
        let known: BTreeSet<OpId> = self.other_records.iter().map(|op| op.op_id).collect();
        for op in other_records {
            if !known.contains(&op.op_id) {
                self.state.apply(&op);
                self.other_records.push(op);
            }
        }
        self.merge_pending_epochs(pending_epochs);
        self.merge_attempts(attempts);
        self.attested.extend(attested);
        Ok(())
    }

    /// Whether `other` names the same record wherever both know one device's record at one
    /// place (their heads, their recent ids, what they attest).
    fn check_same_records(&self, other: &LedgerState) -> Result<(), String> {
        let places = |view: &LedgerState| -> Vec<(String, u64, OpId)> {
            view.heads
                .values()
                .filter_map(|head| {
                    Some((
                        head.device_id().to_string(),
                        head.next_seq().checked_sub(1)?,
                        head.last_op_id()?,
                    ))
                })
                .chain(view.attested.iter().filter_map(|(device, next_seq, id)| {
                    Some((device.clone(), next_seq.checked_sub(1)?, *id))
                }))
                .collect()
        };
        for (first, second) in [(self, other), (other, self)] {
            for (device, seq, id) in places(first) {
                if second.known_id(&device, seq).is_some_and(|theirs| theirs != id) {
                    return Err(format!(
                        "they name different records at seq {seq} of device {device:?} (a device whose log was replaced between them)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Per agent, the higher top `pending` epoch, and at equal tops the devices of both.
    fn merge_pending_epochs(&mut self, theirs: BTreeMap<String, (u64, BTreeSet<String>)>) {
        for (agent, (top, devices)) in theirs {
            let ours = self.pending_epochs.entry(agent).or_default();
            if top > ours.0 {
                *ours = (top, devices);
            } else if top == ours.0 {
                ours.1.extend(devices);
            }
        }
    }

    /// The union of the attempts (rule D2): an epoch settled in either is settled, of two
    /// unsettled `pending`s of one epoch the greater record stays, and a run committed in the
    /// merged state has none.
    fn merge_attempts(&mut self, theirs: BTreeMap<String, BTreeMap<crate::run_id::RunKey, Attempts>>) {
        for (agent, runs) in theirs {
            let ours = self.attempts.entry(agent).or_default();
            for (run, attempts) in runs {
                let entry = ours.entry(run).or_default();
                entry.settled.extend(attempts.settled);
                for (epoch, pending) in attempts.unsettled {
                    let slot = entry.unsettled.entry(epoch).or_insert_with(|| pending.clone());
                    if pending.op_id > slot.op_id {
                        *slot = pending;
                    }
                }
            }
        }
        for (agent, runs) in &mut self.attempts {
            runs.retain(|run, attempts| {
                let settled = &attempts.settled;
                attempts.unsettled.retain(|epoch, _| !settled.contains(epoch));
                self.state.committed_run_key(agent, run).is_none()
            });
        }
        self.attempts.retain(|_, runs| !runs.is_empty());
    }
}
