//! The hand-off (rules H2, H3, M4): what a holder publishes of its ledger, and what a new
//! holder's ledger lacks of what earlier holders published.

use super::Ledger;
use super::MissingRecords;
use crate::relay::Frontier;

impl Ledger {
    /// What this device has stored in the relay: its own log's next seq, as a frontier of one
    /// device; on a protected ledger also the membership frontier, per author of a membership
    /// change read that counts, its log through the last such change (rule M4). What a holder
    /// publishes (rule H2; [`LeaseKeeper::pushed`](crate::keeper::LeaseKeeper::pushed)), so
    /// that its successor waits for the records it stored and for every revocation it read.
    pub fn pushed(&self) -> Frontier {
        let mut frontier = self
            .view
            .protected
            .as_ref()
            .map(crate::protected::ProtectedLogs::membership_frontier)
            .unwrap_or_default();
        let head = self.log.head();
        let own = match &self.view.protected {
            // Only its records a head of its key covers (found by an adversary: a record a
            // writer of the ledger put into its log was published as its own).
            Some(logs) => logs
                .settled()
                .find(|(device, _, _)| *device == self.device_id())
                .map(|(_, next, last)| (next, Some(last))),
            None => Some((head.next_seq(), head.last_op_id())),
        };
        if let Some((next_seq, last)) = own.filter(|(next_seq, _)| *next_seq > 0) {
            frontier.raise_to(self.device_id(), next_seq, last);
        }
        frontier
    }

    /// What this ledger lacks of `published` (rule H3): per device, the records that the agent's
    /// earlier holders pushed and published and that have not reached this site yet, in device
    /// order. Empty when the ledger has everything. Records accepted as lost
    /// ([`accept_missing`](Self::accept_missing)) are not waited for; accepting a device's
    /// *damage* does not waive its published records. [`Ledger::begin`] refuses to
    /// dispatch while anything is missing ([`Refusal::LedgerBehind`](crate::dispatch::Refusal::LedgerBehind)):
    /// [`sync`](Self::sync) and ask again.
    pub fn behind(&self, published: &Frontier) -> Vec<MissingRecords> {
        // An import that began and has not ended is waited for, whatever was published (rule
        // S4: found by an adversary, an import stopped midway let hosts run what it imports).
        let importing = self.unfinished_imports();
        published
            .iter()
            .filter_map(|(device, needs)| {
                let has = self.view.frontier.next_seq(device);
                // The record the previous holder published last: this ledger's record at that
                // seq must be the same one, or this ledger counts other records (a device id
                // that two hosts use with ledgers of their own, a log replaced by another).
                let differs = match (published.head(device), needs.checked_sub(1)) {
                    (Some(head), Some(last)) if has >= needs => self
                        .view
                        .ids
                        .get(device)
                        .and_then(|(first, ids)| ids.get(usize::try_from(last.checked_sub(*first)?).ok()?))
                        .is_some_and(|here| *here != head),
                    _ => false,
                };
                (has < needs || differs).then(|| MissingRecords {
                    device_id: device.to_owned(),
                    has,
                    needs,
                    differs,
                })
            })
            .chain(importing)
            .filter(|missing| {
                self.waived
                    .get(&missing.device_id)
                    .is_none_or(|waived| missing.needs > *waived)
            })
            .collect()
    }
}
