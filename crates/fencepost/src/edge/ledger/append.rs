//! Appending this device's records: queued, then stored through the relay under its claim on
//! the device's log (sealed and signed on a protected ledger), and folded.

use serde_json::Value;

use super::{Ledger, LedgerError};
use crate::clock::HlcConfig;
use crate::id::{validate_id, IdKind};
use crate::lease::Intent;
use crate::oplog::{DeviceLog, OpRecord, Surface};
use crate::relay::RelayError;

impl Ledger {
    /// Appends an intent to this device's log and stores it through the relay at once (under the
    /// relay's claim on the device's log), then folds it. For recording the outcome of a reconciled
    /// in-doubt run; [`dispatch`](crate::dispatch::dispatch) records its own.
    ///
    /// # Errors
    /// [`LedgerError::InvalidId`] for an invalid agent or run id, [`LedgerError::InvalidEpoch`]
    /// for an epoch no coordinator mints (nothing queued);
    /// [`LedgerError::Relay`] or [`LedgerError::Log`] when it could not be stored: it stays
    /// queued ([`unsent`](Self::unsent)) and is stored, in order, by the next
    /// [`flush`](Self::flush), [`sync`](Self::sync) or record of this ledger.
    pub fn record(&mut self, intent: &Intent) -> Result<OpRecord, LedgerError> {
        validate_id(IdKind::Agent, &intent.agent_id)?;
        validate_id(IdKind::Run, &intent.run_id)?;
        if !(1..=crate::lease::MAX_EPOCH).contains(&intent.epoch) {
            return Err(LedgerError::InvalidEpoch { epoch: intent.epoch });
        }
        self.append_now(Surface::Intent, intent.payload())
    }

    /// Queues one record and stores every queued one; returns the last.
    pub(super) fn append_now(&mut self, surface: Surface, payload: Value) -> Result<OpRecord, LedgerError> {
        // A record no log can hold (over a record limit) is refused now, not queued: it would
        // block every record queued after it.
        self.log.clone().try_append(surface.clone(), payload.clone())?;
        self.unsent.push((surface, payload));
        let mut stored = self.write_queued()?;
        stored.pop().ok_or_else(|| {
            LedgerError::Relay(RelayError::Io {
                operation: "append to",
                path: std::path::PathBuf::from(self.device_id()),
                source: std::io::Error::other("the relay stored nothing"),
            })
        })
    }

    /// Queues `intent` behind the records that could not be stored yet, without writing: when
    /// there are some (an attempt's `pending` whose append failed, which `intent` settles).
    pub(crate) fn queue_behind_unsent(&mut self, intent: Intent) {
        if !self.unsent.is_empty() {
            self.unsent.push((Surface::Intent, intent.payload()));
        }
    }

    /// Stores the queued records under the relay's claim on this device's log.
    pub(super) fn write_queued(&mut self) -> Result<Vec<OpRecord>, LedgerError> {
        self.write_queued_and(&[])
    }

    /// [`write_queued`](Self::write_queued), then `clear`: membership records, content in the
    /// clear of a protected ledger.
    pub(super) fn write_queued_and(&mut self, clear: &[Vec<u8>]) -> Result<Vec<OpRecord>, LedgerError> {
        if self.unsent.is_empty() && clear.is_empty() {
            return Ok(Vec::new());
        }
        self.append_queued_and(clear)
    }

    /// [`write_queued_and`](Self::write_queued_and), which writes a protected log's record 0
    /// even when nothing follows it.
    pub(super) fn append_queued_and(&mut self, clear: &[Vec<u8>]) -> Result<Vec<OpRecord>, LedgerError> {
        if self.protected.is_none() && self.view.sealed_seen {
            // Found by an adversarial test: a host that lost its membership file and accepted
            // the damage wrote records in the clear into a protected ledger.
            return Err(LedgerError::ProtectedNotMember);
        }
        self.refuse_if_revoked()?;
        // Records of this device that other writers (processes sharing its id) appended and
        // that this ledger has read since it opened: the log continues after them, so that the
        // relay need not hand them over again (found by a flaky test: a file pruned since no
        // longer held them, and the append was refused as damage).
        // Taken only once the append succeeds: a refused one (records of this device it did
        // not sign, found by an adversary) publishes nothing of them as this device's.
        let continued = self
            .view
            .heads
            .get(self.log.device_id())
            .filter(|head| head.next_seq() > self.log.head().next_seq())
            .map(|head| {
                DeviceLog::continue_after(self.wall_clock.clone(), HlcConfig::default(), head.clone())
            });
        // A membership change brings its own generation, if any; else a rotation first when
        // the newest generation went to a device revoked since (rule M2).
        let rotation = if clear.is_empty() {
            self.rotation_due()?
        } else {
            None
        };
        let rotated: Vec<Vec<u8>> = rotation.iter().map(|(_, bytes)| bytes.clone()).collect();
        let clear = if rotation.is_some() { &rotated[..] } else { clear };
        let rotated_key = rotation.as_ref().map(|(key, _)| key);
        let mut draft: Option<DeviceLog> = None;
        let (log, unsent) = (continued.as_ref().unwrap_or(&self.log), &self.unsent);
        let (protected, logs) = (self.protected.as_deref(), self.view.protected.as_ref());
        let wall_clock = &self.wall_clock;
        let stopwatch = crate::clock::Stopwatch::start();
        let appended = self.relay.append(
            log.device_id(),
            log.head().next_seq(),
            &mut |tail: &[OpRecord]| {
                if protected.is_none() && tail.iter().any(|op| op.surface == Surface::Sealed) {
                    return Err(crate::oplog::LogError::Unsealable {
                        device_id: log.device_id().to_owned(),
                        seq: log.head().next_seq(),
                        detail: "this device's log is a protected ledger's, and this host reads the ledger as no member".to_owned(),
                    });
                }
                let mut next = log.clone();
                // A tail that begins after this log's head: the records between were pruned
                // (covered by a checkpoint) before this process read them; the log goes on
                // after the tail.
                if let Some(first) = tail.first().filter(|first| first.seq > next.head().next_seq()) {
                    if let Some(prev) = first.prev {
                        let after = crate::oplog::LogHead::after(log.device_id(), first.seq, prev);
                        next = DeviceLog::continue_after(wall_clock.clone(), HlcConfig::default(), after);
                    }
                }
                next.catch_up(tail)?;
                let made = match protected {
                    Some(protected) => {
                        let origin = protected.own_origin(logs, tail)?;
                        if let Some(origin) = &origin {
                            protected.vouch_for(logs, tail, next.head().next_seq(), origin)?;
                        }
                        let key = rotated_key.or_else(|| logs.and_then(|logs| logs.protection().newest_key()));
                        protected.make(&mut next, origin, key, logs, unsent, clear)?
                    }
                    None => unsent
                        .iter()
                        .map(|(surface, payload)| next.try_append(surface.clone(), payload.clone()))
                        .collect::<Result<Vec<_>, _>>()?,
                };
                draft = Some(next);
                Ok(made)
            },
        )?;
        crate::metrics::relay_call(
            crate::metrics::RELAY_PUSH_SECONDS,
            crate::metrics::RELAY_PUSHED_RECORDS,
            stopwatch.elapsed(),
            appended.appended.len(),
        );
        self.took_appended(appended, draft.or(continued))
    }

    /// After an append stored `appended` (and handed over the device's records other writers
    /// appended before it): this ledger's log goes on as `log` (when it changed), the queue is
    /// empty, and what was stored is folded and saved.
    fn took_appended(
        &mut self,
        appended: crate::relay::Appended,
        log: Option<DeviceLog>,
    ) -> Result<Vec<OpRecord>, LedgerError> {
        if let Some(next) = log {
            self.log = next;
        }
        self.unsent.clear();
        self.others_appended = appended
            .tail
            .iter()
            .filter(|op| op.surface == Surface::Intent)
            .cloned()
            .collect();
        // What does not continue this reading (a tail after records it never read, pruned
        // since) is read from the checkpoint by the next open, not folded here over a gap.
        let first = appended.tail.first().or(appended.appended.first());
        let continues =
            first.is_none_or(|first| self.view.frontier.next_seq(self.log.device_id()) >= first.seq);
        if continues {
            self.absorb(&appended.tail);
            self.absorb(&appended.appended);
        }
        if let Err(error) = self.read_again_if_stale() {
            // Stored already: the next pull reads again.
            tracing::warn!(%error, "cannot read the protected ledger again after a revocation");
        }
        self.recompute_problems();
        self.save_seen()?;
        self.save_snapshot();
        Ok(appended.appended)
    }

    /// Stores the queued records.
    ///
    /// # Errors
    /// [`LedgerError::Relay`] or [`LedgerError::Log`]; the records stay queued.
    pub fn flush(&mut self) -> Result<usize, LedgerError> {
        Ok(self.write_queued()?.len())
    }

    /// Stores this ledger's queued records through `other`, a ledger of the same device opened
    /// again (the device's file pruned while this one read it, say: this one can no longer
    /// continue the log, a new reading from the newest checkpoint can); they leave this ledger's
    /// queue, and stay in `other`'s if its append fails too. Returns how many were stored
    /// (0, moving nothing, when `other` is of another device).
    ///
    /// # Errors
    /// As [`flush`](Self::flush).
    pub fn flush_through(&mut self, other: &mut Ledger) -> Result<usize, LedgerError> {
        if other.device_id() != self.device_id() {
            return Ok(0);
        }
        other.unsent.append(&mut self.unsent);
        other.flush()
    }
}
