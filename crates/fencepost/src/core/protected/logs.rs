//! [`ProtectedLogs`]: every device's protected log as one reader read it, and the membership
//! records among them, which make the roster and give this device the ledger key's
//! generations wrapped to it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::{LogReader, Missing, Origin, Protection, Verdict};
use crate::core::identity::{DeviceKey, LedgerId, PublicIdentity};
use crate::core::membership::{Membership, MembershipRecord};
use crate::core::roster::{Change, KeyId, MembershipChange, Position, Roster, Standing};
use crate::core::seal::LedgerKey;
use crate::oplog::{OpId, OpRecord, SealedContent};

mod keys;
mod mark;
mod names;

use names::{AgentNames, Resolved};

pub use keys::WrapTo;
pub use mark::ProtectedMark;

/// What [`ProtectedLogs::offer`] released.
#[derive(Debug, Default)]
pub struct Released {
    /// Records to fold (opened).
    pub fold: Vec<OpRecord>,
    /// Covered records in the clear (identities, membership changes) of members.
    pub clear: Vec<OpRecord>,
    /// Records of a device cut before them (or admitted after its admitter's cut): held, never
    /// folded as a truth. Opened when this reader holds their generation, an intent reading as
    /// a `pending` whatever it says (its epoch fences, its run is in doubt); sealed otherwise.
    pub void: Vec<OpRecord>,
    /// Why the log offered is damage: it begins with another ledger's genesis (two `ledger
    /// init`s on one ledger), or with a copy of this one's under another device id.
    pub damage: Option<String>,
}

/// Opens sealed records ahead of their verdicts ([`Protection::open_ahead`] on each, in
/// order; an entry left out or `None` is opened when its verdict is given): given by a caller
/// that can do it on several threads ([`ProtectedLogs::open_many_with`]).
pub type OpenMany = fn(&Protection, &[OpRecord]) -> Vec<Option<OpRecord>>;

/// A membership record as read: where it sits, under which log key, whether the recovery key
/// signed it, and the generations it wrapped to this device.
#[derive(Debug)]
struct ReadChange {
    position: Position,
    /// The id of the record that holds it: what a holder publishes of it (rule M4).
    op_id: OpId,
    log_key: KeyId,
    record: MembershipRecord,
    by_recovery: bool,
    /// Whether its wraps to this device were looked at for good.
    taken: bool,
    /// How many rotations could commit to its keys when its wraps were last looked at (an
    /// admission's wrap that none commits to is looked at again only when there are more).
    looked: Option<usize>,
    /// The generations of the ledger key it gave this device.
    keys: Vec<LedgerKey>,
    /// Its record and the ones after it through the first that carries a valid head: what
    /// shows whoever reads a checkpoint that the author's key signed it.
    proof: Vec<OpRecord>,
}

/// Every device's protected log as one reader read it: a [`LogReader`] per device, the covered
/// records not foldable yet (retried when keys or the roster change), and per device how far
/// from its start every record is settled (folded, in the clear or void): the reader's frontier,
/// which a published frontier is compared with.
///
/// The roster is computed from every membership record covered in a log with a valid record 0,
/// whatever that log's standing (the roster's rules say which count), so readers that read the
/// same records in any order agree. A roster that voids what this reading folded before (a
/// revocation with a cut in the past) makes the reading [stale](Self::stale): its caller reads
/// the ledger again from the start, giving it [the changes read](Self::changes).
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
    /// The membership records read.
    memberships: Vec<ReadChange>,
    /// This device's keys: unwraps what is wrapped to it.
    recipient: Option<Arc<DeviceKey>>,
    /// Per device and log key, the highest sequence number folded as a member's.
    folded: BTreeMap<(String, KeyId), u64>,
    /// Per device and log key, the lowest sequence number settled as void.
    voided: BTreeMap<(String, KeyId), u64>,
    /// Whether the roster changed the standing of a record settled before.
    stale: bool,
    /// The generations of the ledger key the caller gave (and [`hold`](Self::hold) added):
    /// sealed with, whatever the membership records say.
    given_keys: Vec<LedgerKey>,
    /// How a batch of covered records is opened ahead of their verdicts, if not one by one.
    open_many: Option<OpenMany>,
    /// Records opened ahead on another thread ([`give_opened`](Self::give_opened)), in the
    /// order they were handed over, each with the generation that opened it (an opened record
    /// keeps its sealed record's id).
    opened_ahead: VecDeque<(u32, OpRecord)>,
    /// The agents the intents of one size name by digest.
    names: AgentNames,
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
        let given_keys = protection.keys().cloned().collect();
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
            folded: BTreeMap::new(),
            voided: BTreeMap::new(),
            stale: false,
            given_keys,
            open_many: None,
            opened_ahead: VecDeque::new(),
            names: AgentNames::default(),
        }
    }

    /// The roster's changes: those given, the founding admission, and the membership records
    /// read (each a member's, or the recovery key's when it signed).
    pub fn changes(&self) -> Vec<MembershipChange> {
        let mut changes = self.given.clone();
        if let Some((founding, _)) = &self.founded {
            changes.push(founding.clone());
        }
        for read in &self.memberships {
            let change = match &read.record.change {
                // The recovery key's name: no device's (its wraps would mix with the key's).
                Membership::Admit { device, .. } | Membership::Revoke { device, .. }
                    if device.as_str() == crate::membership::RECOVERY =>
                {
                    continue
                }
                Membership::Admit { device, key, .. } => Change::Admit {
                    device: device.clone(),
                    key: *key,
                },
                Membership::Revoke { device, cut } => Change::Revoke {
                    device: device.clone(),
                    cut: *cut,
                },
                Membership::Rotate { .. } | Membership::Open { .. } => continue,
            };
            changes.push(MembershipChange {
                position: read.position.clone(),
                log_key: read.log_key,
                by_recovery: read.by_recovery,
                change,
            });
        }
        changes
    }

    /// Whether the roster read since changed the standing of a record this reading settled
    /// (voids one it folded, or makes one it held void count): the ledger is to be read again
    /// from the start, with [`changes`](Self::changes) given.
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// Goes on with this reading although it is [stale](Self::stale): what it folded cannot be
    /// read again (records removed after a checkpoint covered them).
    pub fn accept_stale(&mut self) {
        let roster = self.protection.roster();
        // What was folded before a cut stays folded; the reading no longer counts it as folded
        // past the cut, so it is not found stale again.
        self.folded.retain(|(device, key), seq| {
            if roster.standing(device, *key, *seq) == Standing::Member {
                return true;
            }
            match roster.cut(device).and_then(|cut| cut.checked_sub(1)) {
                Some(last) => {
                    *seq = (*seq).min(last);
                    true
                }
                None => false,
            }
        });
        self.stale = false;
    }

    /// The newest head verified in `device`'s log, and the id of its record 0.
    pub fn last_head(&self, device: &str) -> Option<(OpId, &super::SignedHead)> {
        let reader = self.readers.get(device)?;
        let Some(Ok((origin, _))) = reader.origin() else {
            return None;
        };
        Some((*origin, reader.last_head()?))
    }

    /// What record 0 of `device`'s log says, once read.
    pub fn origin_of(&self, device: &str) -> Option<&Result<(OpId, Origin), String>> {
        self.readers.get(device).and_then(LogReader::origin)
    }

    /// The ledger as this reader sees it.
    pub fn protection(&self) -> &Protection {
        &self.protection
    }

    /// The current members (admitted, not cut) with their public identities, as the admits
    /// and the genesis read name them, once `extra` (a change about to be written) counts too:
    /// whom a new generation of the ledger key is wrapped to.
    pub fn current_members(
        &self,
        extra: Option<MembershipChange>,
    ) -> Vec<(crate::id::DeviceId, KeyId, crate::core::identity::PublicIdentity)> {
        let mut identities = BTreeMap::new();
        if let Some((founding, genesis)) = &self.founded {
            identities.insert((genesis.founder.clone(), founding.log_key), genesis.founder_key);
        }
        // Only from admits that count, and whose identity is the key they admit (found by a
        // cryptography review: an admit in a stranger's log naming a member's key with the
        // stranger's identity had the next generation wrapped to the stranger).
        for read in &self.memberships {
            if let Membership::Admit {
                device,
                key,
                identity,
                ..
            } = &read.record.change
            {
                if self.counts(read) && super::identity_key(device, identity) == *key {
                    identities.insert((device.clone(), *key), *identity);
                }
            }
        }
        let mut changes = self.changes();
        changes.extend(extra);
        let roster = Roster::compute(&changes);
        roster
            .members()
            .filter(|(_, _, cut)| cut.is_none())
            .flat_map(|(device, keys, _)| keys.iter().map(move |key| (device, key)))
            .filter_map(|(device, key)| {
                identities
                    .get(&(device.clone(), *key))
                    .map(|identity| (device.clone(), *key, *identity))
            })
            .collect()
    }

    /// The membership frontier (rule M4): per author, how many records of its log hold the
    /// membership changes read that count (through the last of them) and that record's id. A
    /// holder publishes it with its own log's head, so that a new holder dispatches nothing
    /// before it has read every change this one had (a relay cannot hide a revocation from it).
    pub fn membership_frontier(&self) -> crate::core::frontier::Frontier {
        let mut frontier = crate::core::frontier::Frontier::new();
        for read in self.memberships.iter().filter(|read| self.counts(read)) {
            let Some(count) = read.position.seq.checked_add(1) else {
                continue;
            };
            frontier.raise_to(read.position.device.as_str(), count, Some(read.op_id));
        }
        frontier
    }

    /// Whether a membership record read counts: the recovery key's, or a member's at its
    /// position.
    fn counts(&self, read: &ReadChange) -> bool {
        read.by_recovery || self.standing_of(read) == Standing::Member
    }

    /// Where the record that holds a membership change read stands.
    fn standing_of(&self, read: &ReadChange) -> Standing {
        let position = &read.position;
        self.protection
            .roster()
            .standing(position.device.as_str(), read.log_key, position.seq)
    }

    /// Whether `device`'s log names `agent` (as read): its intents of one size for the agent
    /// may follow (see [`AGENT_NAMES`](crate::oplog::AGENT_NAMES)).
    pub fn names_agent(&self, device: &str, agent: &str) -> bool {
        self.names.named(device, agent)
    }

    /// The next record of its device's log (the caller checked its chain).
    pub fn offer(&mut self, op: OpRecord) -> Released {
        self.offer_all(vec![op])
    }

    /// The next records of one device's log, in sequence order (the caller checked their
    /// chain): a valid head among them covers those before it too, so a reader verifies one
    /// signature per call rather than one per head.
    pub fn offer_all(&mut self, ops: Vec<OpRecord>) -> Released {
        let Some(first) = ops.first() else {
            return Released::default();
        };
        let device_id = Arc::clone(&first.device_id);
        let device = &*device_id;
        let ledger = self.protection.ledger;
        let reader = match self.readers.get_mut(device) {
            Some(reader) => reader,
            None => self
                .readers
                .entry(device.to_owned())
                .or_insert_with(|| LogReader::new(Arc::clone(&device_id))),
        };
        let was_read = reader.origin().is_some();
        let covered = reader.offer_all(ops, &ledger);
        let Some(Ok((origin, said))) = reader.origin() else {
            return Released::default();
        };
        let origin = *origin;
        let signer = *said.signer();
        let mut changed = false;
        let mut damage = None;
        if !was_read {
            damage = wrong_genesis(said, device, &ledger);
            if self.founded.is_none() {
                if let Some(founded) = founding(said, device, &origin, &ledger) {
                    self.founded = Some(founded);
                    changed = true;
                }
            }
        }
        for index in 0..covered.len() {
            changed |= self.read_change(&covered[index..], &origin, &signer);
        }
        if changed {
            self.refresh();
        }
        let mut released = Released::default();
        // Opened ahead on another thread (each looked up as its verdict is given), or here on
        // every core.
        let mut opened = match self.open_many {
            Some(open_many) if self.opened_ahead.is_empty() && covered.len() > 1 => {
                Some(open_many(&self.protection, &covered).into_iter())
            }
            _ => None,
        };
        let (protection, ahead) = (&self.protection, &mut self.opened_ahead);
        let verdicts = covered
            .into_iter()
            .map(|op| {
                let opened = match &mut opened {
                    Some(opened) => opened.next().flatten(),
                    None => take_opened(ahead, &op)
                        .and_then(|(generation, opened)| protection.sole_key(generation).then_some(opened)),
                };
                protection.classify_opened(op, &origin, opened)
            })
            .collect();
        let names = self.names.count();
        self.settle(device, &origin, verdicts, &mut released);
        // A name read may be one an intent read before waits for.
        let named = self.names.count() > names
            && self
                .unresolved
                .values()
                .flatten()
                .any(|(_, why)| matches!(why, Missing::AgentNotNamed { .. }));
        if changed || named {
            self.retry(&mut released);
        }
        released.damage = damage;
        released
    }

    /// Reads the first of `covered` (records of the log whose record 0 is `origin` and whose key
    /// is `signer`, the last one carrying a valid head) when it is a membership record; whether
    /// it was one.
    fn read_change(&mut self, covered: &[OpRecord], origin: &OpId, signer: &PublicIdentity) -> bool {
        let Some(op) = covered.first() else {
            return false;
        };
        if op.seq == 0 {
            return false;
        }
        let Some(SealedContent::Clear(bytes)) = op.sealed_record().map(|record| &record.content) else {
            return false;
        };
        let record = match MembershipRecord::from_bytes(bytes) {
            Ok(record) => record,
            Err(why) => {
                tracing::warn!(device = %op.device_id, seq = op.seq, why, "a record in the clear that is no membership record: ignored");
                return false;
            }
        };
        let Ok(device) = crate::id::DeviceId::new(&*op.device_id) else {
            return false;
        };
        let by_recovery = self.founded.as_ref().is_some_and(|(_, genesis)| {
            record.signed_by_recovery(&genesis.recovery_key, &self.protection.ledger)
        });
        self.memberships.push(ReadChange {
            position: Position { device, seq: op.seq },
            op_id: op.op_id,
            log_key: KeyId(origin.0),
            record,
            by_recovery,
            taken: false,
            looked: None,
            keys: Vec::new(),
            proof: proof_of(covered, signer, &self.protection.ledger, origin),
        });
        true
    }

    /// Computes the roster again from the changes read, takes the generations wrapped to this
    /// device by the changes that count, and notes whether the reading went stale.
    fn refresh(&mut self) {
        // A recovery signature is checked once the genesis is read.
        if let Some((_, genesis)) = &self.founded {
            for read in &mut self.memberships {
                read.by_recovery = read.by_recovery
                    || read
                        .record
                        .signed_by_recovery(&genesis.recovery_key, &self.protection.ledger);
            }
        }
        self.protection.set_roster(Roster::compute(&self.changes()));
        let roster = self.protection.roster();
        // A settled record whose standing changed: folded and now void, or void and now a
        // member's again (a recovery cut before the revocation that voided it; found by an
        // adversarial test: that run ran twice) or no member's.
        self.stale |= self
            .folded
            .iter()
            .any(|((device, key), seq)| roster.standing(device, *key, *seq) != Standing::Member)
            || self
                .voided
                .iter()
                .any(|((device, key), seq)| roster.standing(device, *key, *seq) != Standing::Void);
        self.take_wraps();
        // Seal with the newest generation given by the caller or by a change that counts now:
        // never with one that only a revoked device's change gave (its author may know it).
        let sealing = self.counting_keys().into_iter().max_by_key(LedgerKey::generation);
        self.protection.seal_with(sealing);
    }

    /// Holds another generation of the ledger key, and releases what it opens.
    pub fn hold(&mut self, key: LedgerKey) -> Released {
        self.given_keys.push(key.clone());
        self.protection.hold(key);
        let mut released = Released::default();
        self.retry(&mut released);
        released
    }

    /// Adds membership changes to those the roster is computed from, and releases what the
    /// new roster lets count.
    pub fn admit(&mut self, changes: impl IntoIterator<Item = MembershipChange>) -> Released {
        self.given.extend(changes);
        self.refresh();
        let mut released = Released::default();
        self.retry(&mut released);
        released
    }

    /// The genesis, once the founder's record 0 is read.
    pub fn genesis(&self) -> Option<&crate::core::genesis::Genesis> {
        self.founded.as_ref().map(|(_, genesis)| genesis)
    }

    fn retry(&mut self, released: &mut Released) {
        for (device, waiting) in std::mem::take(&mut self.unresolved) {
            let Some(Some(Ok((origin, _)))) = self.readers.get(&device).map(LogReader::origin) else {
                continue;
            };
            let origin = *origin;
            let verdicts = waiting
                .into_iter()
                .map(|(op, why)| match why {
                    // Opened already: only its agent's name was missing.
                    Missing::AgentNotNamed { void: true } => Verdict::Void(op),
                    Missing::AgentNotNamed { void: false } => Verdict::Folded(op),
                    _ => self.protection.classify(op, &origin),
                })
                .collect();
            self.settle(&device, &origin, verdicts, released);
        }
    }

    /// Settles the verdicts on records of `device`'s log whose record 0 is `origin`, in order.
    fn settle(&mut self, device: &str, origin: &OpId, verdicts: Vec<Verdict>, released: &mut Released) {
        let key = KeyId(origin.0);
        let mut highest_folded = None;
        let mut lowest_void: Option<u64> = None;
        let mut settled = Vec::with_capacity(verdicts.len());
        for verdict in verdicts {
            let (op, void) = match verdict {
                Verdict::Folded(op) => (op, false),
                Verdict::Void(op) => (op, true),
                Verdict::Clear(op) => {
                    settled.push((op.seq, op.op_id));
                    released.clear.push(op);
                    continue;
                }
                Verdict::Missing(op, why) => {
                    self.unresolved
                        .entry(device.to_owned())
                        .or_default()
                        .push((op, why));
                    continue;
                }
            };
            let (seq, id) = (op.seq, op.op_id);
            let op = match self.names.resolve(op) {
                Resolved::Record(op) => Some(op),
                Resolved::Naming => None,
                Resolved::Unnamed(op) => {
                    let why = Missing::AgentNotNamed { void };
                    self.unresolved
                        .entry(device.to_owned())
                        .or_default()
                        .push((op, why));
                    continue;
                }
            };
            if void {
                lowest_void = Some(lowest_void.map_or(seq, |lowest| lowest.min(seq)));
                released.void.extend(op);
            } else {
                highest_folded = highest_folded.max(Some(seq));
                released.fold.extend(op);
            }
            settled.push((seq, id));
        }
        if let Some(seq) = highest_folded {
            let highest = self.folded.entry((device.to_owned(), key)).or_default();
            *highest = (*highest).max(seq);
        }
        if let Some(seq) = lowest_void {
            let lowest = self.voided.entry((device.to_owned(), key)).or_insert(seq);
            *lowest = (*lowest).min(seq);
        }
        self.advance(device, settled);
    }

    /// Moves `device`'s settled frontier over `settled` records (sequence number and id): as
    /// far as they and those settled before it reach without a gap.
    fn advance(&mut self, device: &str, settled: Vec<(u64, OpId)>) {
        if settled.is_empty() {
            return;
        }
        let mut frontier = self.settled.get(device).copied();
        let mut next = frontier.map_or(0, |(next, _)| next);
        let mut later = Vec::new();
        for (seq, id) in settled {
            if seq == next {
                frontier = Some((next + 1, id));
                next += 1;
            } else {
                later.push((seq, id));
            }
        }
        let waiting = self.ahead.get(device).is_some_and(|ahead| !ahead.is_empty());
        if !later.is_empty() || waiting {
            let ahead = self.ahead.entry(device.to_owned()).or_default();
            ahead.extend(later);
            while let Some(id) = ahead.remove(&next) {
                frontier = Some((next + 1, id));
                next += 1;
            }
        }
        match (frontier, self.settled.get_mut(device)) {
            (Some(frontier), Some(at)) => *at = frontier,
            (Some(frontier), None) => drop(self.settled.insert(device.to_owned(), frontier)),
            (None, _) => {}
        }
    }

    /// Records of the logs opened ahead on another thread with [`OpeningKeys`] this reading
    /// gave ([`Protection::opening_keys`]), each with the generation that opened it: used when
    /// their verdicts are given, if this reading still holds one key of that generation (the
    /// one that opened it), else opened again. Those not used by then are dropped by
    /// [`drop_opened`](Self::drop_opened).
    ///
    /// [`OpeningKeys`]: super::OpeningKeys
    pub(crate) fn give_opened(&mut self, opened: impl IntoIterator<Item = (u32, OpRecord)>) {
        self.opened_ahead.extend(opened);
    }

    /// Drops the records opened ahead that no verdict used (records not covered by a head yet,
    /// say: opened again once they are).
    pub(crate) fn drop_opened(&mut self) {
        self.opened_ahead.clear();
    }

    /// Opens the records a head covers with `open_many` (the edge's, on every core) rather
    /// than each as its verdict is given.
    pub fn open_many_with(&mut self, open_many: OpenMany) {
        self.open_many = Some(open_many);
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
                // Found by an adversary: a forged last head read as "not covered yet".
                let signed = reader
                    .held()
                    .iter()
                    .any(|op| op.sealed_record().is_some_and(|record| record.head.is_some()));
                let why = if signed {
                    Missing::HeadNotValid
                } else {
                    Missing::NotCovered
                };
                missing.push((device.clone(), first.seq, why));
            }
        }
        missing
    }
}

/// Why a log whose record 0 says `said` is damage of `device`: another ledger's genesis, or
/// this one's under another id.
fn wrong_genesis(said: &Origin, device: &str, ledger: &LedgerId) -> Option<String> {
    let Origin::Genesis(genesis) = said else {
        return None;
    };
    if genesis.ledger_id() != *ledger {
        return Some(format!(
            "its log begins with the genesis of another protected ledger (fingerprint {}): two `ledger init`s made two ledgers in one; keep one, and remove the other's files",
            genesis.fingerprint()
        ));
    }
    (genesis.founder.as_str() != device).then(|| {
        format!(
            "its log begins with this ledger's genesis, which founds device {}: a copy under another id",
            genesis.founder
        )
    })
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

/// The proof of the first of `covered` (see [`read_change`](ProtectedLogs::read_change)): the
/// records from it through the first that carries a head `signer` signed.
fn proof_of(
    covered: &[OpRecord],
    signer: &PublicIdentity,
    ledger: &LedgerId,
    origin: &OpId,
) -> Vec<OpRecord> {
    let end = covered
        .iter()
        .position(|op| op.has_valid_head(signer, ledger, origin))
        .unwrap_or(covered.len() - 1);
    covered[..=end].to_vec()
}

/// The record opened ahead as `op` and the generation that opened it, if it is the next one
/// `ahead` holds: verdicts are given in the order records were handed over, so a record opened
/// ahead is the next one, or was not opened ahead (a record handed over before, covered now, was
/// opened with none: it is opened where its verdict is given). Records of `op`'s log before it
/// that no verdict took (folded before, say) are dropped on the way.
fn take_opened(ahead: &mut VecDeque<(u32, OpRecord)>, op: &OpRecord) -> Option<(u32, OpRecord)> {
    while let Some((_, front)) = ahead.front() {
        if front.op_id == op.op_id {
            return ahead.pop_front();
        }
        if front.device_id != op.device_id || front.seq > op.seq {
            return None;
        }
        ahead.pop_front();
    }
    None
}
