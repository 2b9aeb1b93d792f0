//! A pull folded in two stages (issue 39's cold open): for a protected ledger, the thread the
//! relay hands records over on opens them (with a helper) while another thread gives their
//! verdicts and folds those handed over before. A profile of a cold open showed the folding
//! thread busy all the time, opening two thirds of what it folded, while the others waited.
//!
//! The opening thread uses the keys the reading held when it was last told
//! ([`OpeningKeys`]); a record it could not open yet is opened where its verdict is given, as
//! one not opened ahead. What is folded, and in what order, is the same as on one thread.

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use super::Ledger;
use crate::oplog::OpRecord;
use crate::protected::OpeningKeys;
use crate::relay::{Frontier, Relay, RelayError, RelayProblem};

/// A batch of fewer records than this is folded where it is handed over.
const OPEN_AHEAD_RECORDS: usize = 256;
/// How many records a thread opens at a time.
const OPEN_PIECE_RECORDS: usize = 256;
/// Batches opened and not folded yet, at most.
const PIPELINE_BATCHES: usize = 2;

/// Records opened ahead, in pieces, in the order they were handed over: each with the
/// generation that opened it.
type OpenedPieces = Vec<Vec<(u32, OpRecord)>>;
/// A batch handed over, and what of it was opened ahead.
type Opened = (Vec<OpRecord>, OpenedPieces);

/// The keys the opening thread uses, and how many keys the reading held when they were taken.
type SharedKeys = Mutex<(usize, Arc<OpeningKeys>)>;

impl Ledger {
    /// Pulls from `since` on `relay` and folds what it hands over; returns the problems the
    /// relay found and how many records it handed over. A protected ledger's batches of
    /// [`OPEN_AHEAD_RECORDS`] or more are opened on this thread and folded on another.
    pub(super) fn pull_and_absorb(
        &mut self,
        relay: &dyn Relay,
        since: &Frontier,
    ) -> Result<(Vec<RelayProblem>, usize), RelayError> {
        let mut pulled = 0;
        let keys = match self.view.protected.as_ref() {
            Some(logs) if crate::edge::pieces::cores() > 1 => {
                let protection = logs.protection();
                Mutex::new((protection.key_count(), Arc::new(protection.opening_keys())))
            }
            _ => {
                let problems = relay.pull_in_batches(since, &mut |ops| {
                    pulled += ops.len();
                    self.absorb(&ops);
                })?;
                return Ok((problems, pulled));
            }
        };
        let keys = &keys;
        let problems = std::thread::scope(|scope| {
            let mut here = Some(&mut *self);
            let mut stage = None;
            let problems = relay.pull_in_batches(since, &mut |ops| {
                pulled += ops.len();
                if stage.is_none() {
                    let Some(ledger) = here.take() else {
                        return;
                    };
                    if ops.len() < OPEN_AHEAD_RECORDS {
                        ledger.absorb(&ops);
                        here = Some(ledger);
                        return;
                    }
                    let (sender, receiver) = sync_channel::<Opened>(PIPELINE_BATCHES);
                    let folding = scope.spawn(move || {
                        for (ops, opened) in receiver {
                            ledger.absorb_opened(&ops, opened, keys);
                        }
                    });
                    stage = Some((sender, folding));
                }
                let Some((sender, _)) = &stage else {
                    return;
                };
                let opening = keys.lock().map(|held| Arc::clone(&held.1));
                let opened = opening
                    .map(|opening| open_ahead(&opening, &ops))
                    .unwrap_or_default();
                // A send fails only when the folding thread panicked: its join below says so.
                let _ = sender.send((ops, opened));
            });
            if let Some((sender, folding)) = stage {
                drop(sender);
                if let Err(panic) = folding.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            problems
        })?;
        Ok((problems, pulled))
    }

    /// Folds `ops` with `opened`, those of them opened ahead, then tells the opening thread
    /// the keys this reading holds now if it holds more (a membership record gave some).
    fn absorb_opened(&mut self, ops: &[OpRecord], opened: OpenedPieces, keys: &SharedKeys) {
        if let Some(logs) = self.view.protected.as_mut() {
            logs.give_opened(opened.into_iter().flatten());
        }
        self.absorb(ops);
        let Some(logs) = self.view.protected.as_mut() else {
            return;
        };
        logs.drop_opened();
        let count = logs.protection().key_count();
        if let Ok(mut held) = keys.lock() {
            if held.0 != count {
                *held = (count, Arc::new(logs.protection().opening_keys()));
            }
        }
    }
}

/// The records of `ops` that `keys` open, opened on this thread and a helper.
fn open_ahead(keys: &OpeningKeys, ops: &[OpRecord]) -> OpenedPieces {
    if keys.is_empty() {
        return Vec::new();
    }
    let open = |range: std::ops::Range<usize>| -> Vec<(u32, OpRecord)> {
        ops[range].iter().filter_map(|op| keys.open(op)).collect()
    };
    crate::edge::pieces::in_pieces(ops.len(), OPEN_PIECE_RECORDS, 1, open)
}
