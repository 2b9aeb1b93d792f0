//! [`ProtectedLogs`]: every device's protected log as one reader read it, and the membership
//! records among them, which make the roster and give this device the ledger key's
//! generations wrapped to it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{LogReader, Missing, Origin, Protection, Verdict};
use crate::core::identity::{DeviceKey, LedgerId};
use crate::core::membership::{Membership, MembershipRecord};
use crate::core::roster::{Change, KeyId, MembershipChange, Position, Roster};
use crate::core::seal::LedgerKey;
use crate::oplog::{OpId, OpRecord, SealedContent};

/// What [`ProtectedLogs::offer`] released.
#[derive(Debug, Default)]
pub struct Released {
    /// Records to fold (opened).
    pub fold: Vec<OpRecord>,
    /// Covered records in the clear (identities, membership changes), for the roster.
    pub clear: Vec<OpRecord>,
    /// Records of a device cut before them: held, not folded.
    pub void: Vec<OpRecord>,
    /// Why the log offered is damage: it begins with another ledger's genesis (two `ledger
    /// init`s on one ledger), or with a copy of this one's under another device id.
    pub damage: Option<String>,
}

/// Every device's protected log as one reader read it: a [`LogReader`] per device, the covered
/// records not foldable yet (retried when keys or the roster change), and per device how far
/// from its start every record is settled (folded, in the clear or void): the reader's frontier,
/// which a published frontier is compared with.
#[derive(Debug)]
pub struct ProtectedLogs {
    protection: Protection,
    readers: BTreeMap<String, LogReader>,
    unresolved: BTreeMap<String, Vec<(OpRecord, Missing)>>,
    settled: BTreeMap<String, (u64, OpId)>,
    /// Per device, records settled past the first one that is not.
    ahead: BTreeMap<String, BTreeMap<u64, OpId>>,
    /// The membership changes given by the caller.
    given: Vec<MembershipChange>,
    /// The founding admission and the genesis, once the founder's record 0 is read.
    founded: Option<(MembershipChange, crate::core::genesis::Genesis)>,
    /// The membership records read, where they sit and under which log key.
    memberships: Vec<(Position, KeyId, MembershipRecord)>,
    /// This device's keys: unwraps what is wrapped to it.
    recipient: Option<Arc<DeviceKey>>,
}

impl ProtectedLogs {
    /// No log read yet, of the ledger `protection` describes; its roster is computed from
    /// `changes` and what the logs hold (a genesis founds its founder).
    ///
    /// `recipient`, this device's keys, opens the generations of the ledger key that
    /// membership records wrap to it.
    pub fn new(
        protection: Protection,
        changes: Vec<MembershipChange>,
        recipient: Option<Arc<DeviceKey>>,
    ) -> Self {
        let mut protection = protection;
        protection.set_roster(Roster::compute(&changes));
        Self {
            protection,
            readers: BTreeMap::new(),
            unresolved: BTreeMap::new(),
            settled: BTreeMap::new(),
            ahead: BTreeMap::new(),
            given: changes,
            founded: None,
            memberships: Vec::new(),
            recipient,
        }
    }

    /// The roster's changes: those given, the founding admission, and the membership records
    /// read (a member's, or the recovery key's when it signed).
    fn changes(&self) -> Vec<MembershipChange> {
        let mut changes = self.given.clone();
        let recovery = self.founded.as_ref().map(|(founding, genesis)| {
            changes.push(founding.clone());
            genesis.recovery_key
        });
        for (position, log_key, record) in &self.memberships {
            let change = match &record.change {
                Membership::Admit { device, key, .. } => Change::Admit {
                    device: device.clone(),
                    key: *key,
                },
                Membership::Revoke { device, cut } => Change::Revoke {
                    device: device.clone(),
                    cut: *cut,
                },
                Membership::Rotate { .. } => continue,
            };
            let by_recovery = recovery
                .as_ref()
                .is_some_and(|recovery| record.signed_by_recovery(recovery, &self.protection.ledger));
            changes.push(if by_recovery {
                MembershipChange::by_recovery(position.clone(), *log_key, change)
            } else {
                MembershipChange::by_member(position.clone(), *log_key, change)
            });
        }
        changes
    }

    /// What record 0 of `device`'s log says, once read.
    pub fn origin_of(&self, device: &str) -> Option<&Result<(OpId, Origin), String>> {
        self.readers.get(device).and_then(LogReader::origin)
    }

    /// The ledger as this reader sees it.
    pub fn protection(&self) -> &Protection {
        &self.protection
    }

    /// The next record of its device's log (the caller checked its chain).
    pub fn offer(&mut self, op: OpRecord) -> Released {
        let device = op.device_id.to_string();
        let ledger = self.protection.ledger;
        let reader = self
            .readers
            .entry(device.clone())
            .or_insert_with(|| LogReader::new(Arc::clone(&op.device_id)));
        let was_read = reader.origin().is_some();
        let covered = reader.offer(op, &ledger);
        let Some(Ok((origin, said))) = reader.origin() else {
            return Released::default();
        };
        let origin = *origin;
        let mut released = Released::default();
        let mut damage = None;
        if !was_read {
            if let Origin::Genesis(genesis) = said {
                if genesis.ledger_id() != ledger {
                    damage = Some(format!(
                        "its log begins with the genesis of another protected ledger (fingerprint {}): two `ledger init`s made two ledgers in one; keep one, and remove the other's files",
                        genesis.fingerprint()
                    ));
                } else if genesis.founder.as_str() != device {
                    damage = Some(format!(
                        "its log begins with this ledger's genesis, which founds device {}: a copy under another id",
                        genesis.founder
                    ));
                }
            }
        }
        if !was_read && self.founded.is_none() {
            if let Some(founded) = founding(said, &device, &origin, &ledger) {
                self.founded = Some(founded);
                released = self.set_roster(Roster::compute(&self.changes()));
            }
        }
        for op in covered {
            let verdict = self.protection.classify(op, &origin);
            self.settle(&device, verdict, &mut released);
        }
        let mut released = self.read_membership(released);
        released.damage = damage;
        released
    }

    /// Reads the membership records among `released.clear` (and those that they, in turn,
    /// let count), holding the keys wrapped to this device and recomputing the roster; returns
    /// everything released.
    fn read_membership(&mut self, mut released: Released) -> Released {
        let mut all = Released::default();
        loop {
            let clear = std::mem::take(&mut released.clear);
            all.fold.append(&mut released.fold);
            all.void.append(&mut released.void);
            let mut changed = false;
            for op in &clear {
                changed |= self.read_clear(op);
            }
            all.clear.extend(clear);
            if !changed {
                return all;
            }
            released = self.set_roster(Roster::compute(&self.changes()));
        }
    }

    /// Reads one covered record in the clear: a membership record (a log's record 0 is its
    /// origin, read already). Whether the roster or the keys held changed.
    fn read_clear(&mut self, op: &OpRecord) -> bool {
        if op.seq == 0 {
            return false;
        }
        let Some(SealedContent::Clear(bytes)) = op.sealed_record().map(|record| &record.content) else {
            return false;
        };
        let Ok(record) = MembershipRecord::from_bytes(bytes) else {
            tracing::warn!(device = %op.device_id, seq = op.seq, "a record in the clear that is no membership record: ignored");
            return false;
        };
        let Some(Some(Ok((log_key, _)))) = self.readers.get(&*op.device_id).map(LogReader::origin) else {
            return false;
        };
        let log_key = KeyId(log_key.0);
        let Ok(device) = crate::id::DeviceId::new(&*op.device_id) else {
            return false;
        };
        let mut changed = self.take_wraps(&record.change);
        changed |= !matches!(record.change, Membership::Rotate { .. });
        self.memberships
            .push((Position { device, seq: op.seq }, log_key, record));
        changed
    }

    /// Holds the generations `change` wraps to this device; whether it held a new one.
    fn take_wraps(&mut self, change: &Membership) -> bool {
        let Some(recipient) = self.recipient.clone() else {
            return false;
        };
        let me = recipient.device();
        let wraps: Vec<(u32, &crate::core::wrap::Wrapped)> = match change {
            Membership::Rotate { generation, wraps } => wraps
                .iter()
                .filter(|(device, _)| device == me)
                .map(|(_, wrapped)| (*generation, wrapped))
                .collect(),
            Membership::Admit { device, wraps, .. } if device == me => wraps
                .iter()
                .map(|(generation, wrapped)| (*generation, wrapped))
                .collect(),
            _ => Vec::new(),
        };
        let mut held = false;
        for (generation, wrapped) in wraps {
            let Some(number) = std::num::NonZeroU32::new(generation) else {
                continue;
            };
            if self.protection.holds(generation) {
                continue;
            }
            if let Ok(key) =
                crate::core::wrap::unwrap(wrapped, &self.protection.ledger, generation, &recipient)
            {
                self.protection.hold(LedgerKey::new(number, *key));
                held = true;
            }
        }
        held
    }

    /// Holds another generation of the ledger key, and releases what it opens.
    pub fn hold(&mut self, key: LedgerKey) -> Released {
        self.protection.hold(key);
        let released = self.retry();
        self.read_membership(released)
    }

    /// Adds membership changes to those the roster is computed from, and releases what the
    /// new roster lets count. (A roster that voids records folded before needs a reading from
    /// the start: this does not unfold them.)
    pub fn admit(&mut self, changes: impl IntoIterator<Item = MembershipChange>) -> Released {
        self.given.extend(changes);
        let released = self.set_roster(Roster::compute(&self.changes()));
        self.read_membership(released)
    }

    /// The genesis, once the founder's record 0 is read.
    pub fn genesis(&self) -> Option<&crate::core::genesis::Genesis> {
        self.founded.as_ref().map(|(_, genesis)| genesis)
    }

    /// Replaces the roster, and releases what it lets count.
    fn set_roster(&mut self, roster: Roster) -> Released {
        self.protection.set_roster(roster);
        self.retry()
    }

    fn retry(&mut self) -> Released {
        let mut released = Released::default();
        for (device, waiting) in std::mem::take(&mut self.unresolved) {
            let Some(Some(Ok((origin, _)))) = self.readers.get(&device).map(LogReader::origin) else {
                continue;
            };
            let origin = *origin;
            for (op, _) in waiting {
                let verdict = self.protection.classify(op, &origin);
                self.settle(&device, verdict, &mut released);
            }
        }
        released
    }

    fn settle(&mut self, device: &str, verdict: Verdict, released: &mut Released) {
        let (op, into) = match verdict {
            Verdict::Folded(op) => (op, &mut released.fold),
            Verdict::Clear(op) => (op, &mut released.clear),
            Verdict::Void(op) => (op, &mut released.void),
            Verdict::Missing(op, why) => {
                self.unresolved
                    .entry(device.to_owned())
                    .or_default()
                    .push((op, why));
                return;
            }
        };
        let ahead = self.ahead.entry(device.to_owned()).or_default();
        ahead.insert(op.seq, op.op_id);
        let mut settled = self.settled.get(device).copied();
        let mut next = settled.map_or(0, |(next, _)| next);
        while let Some(id) = ahead.remove(&next) {
            settled = Some((next + 1, id));
            next += 1;
        }
        if let Some(settled) = settled {
            self.settled.insert(device.to_owned(), settled);
        }
        into.push(op);
    }

    /// Per device, how many records from its log's start are settled, and the last one's id.
    pub fn settled(&self) -> impl Iterator<Item = (&str, u64, OpId)> {
        self.settled
            .iter()
            .map(|(device, (next, last))| (device.as_str(), *next, *last))
    }

    /// Per device, the first record not settled and why: not covered by a head yet, no origin,
    /// or covered and not foldable.
    pub fn missing(&self) -> Vec<(String, u64, Missing)> {
        let mut missing = Vec::new();
        for (device, reader) in &self.readers {
            if let Some((op, why)) = self.unresolved.get(device).and_then(|waiting| waiting.first()) {
                missing.push((device.clone(), op.seq, why.clone()));
            } else if let Some(Err(why)) = reader.origin() {
                missing.push((device.clone(), 0, Missing::NoOrigin(why.clone())));
            } else if let Some(first) = reader.held().first() {
                missing.push((device.clone(), first.seq, Missing::NotCovered));
            }
        }
        missing
    }
}

/// The admission a genesis makes: its founder, under the key of the log it begins, when it is
/// this ledger's genesis and begins its founder's log.
fn founding(
    said: &Origin,
    device: &str,
    origin: &OpId,
    ledger: &LedgerId,
) -> Option<(MembershipChange, crate::core::genesis::Genesis)> {
    let Origin::Genesis(genesis) = said else {
        return None;
    };
    if genesis.ledger_id() != *ledger || genesis.founder.as_str() != device {
        return None;
    }
    let key = KeyId(origin.0);
    let founding = MembershipChange::by_recovery(
        Position {
            device: genesis.founder.clone(),
            seq: 0,
        },
        key,
        Change::Admit {
            device: genesis.founder.clone(),
            key,
        },
    );
    Some((founding, genesis.clone()))
}
