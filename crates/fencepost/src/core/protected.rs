//! Reading a protected ledger's logs (issue 39, rule S2; the ledger does not read through it
//! yet): which of a device's sealed records count.
//!
//! A reader hands each device's records to a [`LogReader`] in sequence order, once their chain
//! is checked ([`LogHead`](crate::oplog::LogHead): ids over what the relay carries, `seq`,
//! `prev`). The reader holds them until a head that the device's key signed covers them (one
//! signature per append, not per record): the key is the one record 0 of the log names
//! ([`Origin`]), so a log is self-certifying and a relay that writes a log under another id has
//! to sign with a key of its own, which the roster does not know. Then [`Protection::classify`]
//! says where each covered record stands:
//!
//! * [`Verdict::Folded`]: its device was a member at its sequence number and it opened (the
//!   record to fold: its id and links the sealed record's, its stamp, surface and payload the
//!   content's);
//! * [`Verdict::Clear`]: the same, for content in the clear (an identity, a membership change);
//! * [`Verdict::Void`]: its device was cut before it: held, never folded as a truth;
//! * [`Verdict::Missing`]: not foldable (yet): no key for its generation, not authentic, no
//!   member's. Never absent: a frontier that names it makes a hand-off wait.
//!
//! Records not covered yet stay with the [`LogReader`]; they are missing too, until a head comes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::core::genesis::{Genesis, GenesisError};
use crate::core::identity::{LedgerId, PublicIdentity};
use crate::core::roster::{Change, KeyId, MembershipChange, Position, Roster, Standing};
use crate::core::seal::LedgerKey;
use crate::oplog::{OpId, OpRecord, OpenError, SealedContent, CLEAR_GENERATION};

/// What content in the clear starts with: a device's identity (record 0 of its log).
const TAG_IDENTITY: u8 = 0;
/// Content in the clear: a ledger's genesis (record 0 of its founder's log).
const TAG_GENESIS: u8 = 1;

/// What record 0 of a protected log says: who writes the log. Content in the clear.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per device log: its size does not matter"
)]
pub enum Origin {
    /// A member's log: its public identity.
    Identity(PublicIdentity),
    /// The founder's log: the ledger's genesis, whose founder key signs the log.
    Genesis(Genesis),
}

impl Origin {
    /// The key that signs the log's heads.
    pub fn signer(&self) -> &PublicIdentity {
        match self {
            Origin::Identity(public) => public,
            Origin::Genesis(genesis) => &genesis.founder_key,
        }
    }

    /// Its bytes, the content in the clear of a log's record 0.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(160);
        match self {
            Origin::Identity(public) => {
                bytes.push(TAG_IDENTITY);
                bytes.extend_from_slice(&public.signing_bytes());
                bytes.extend_from_slice(&public.agreement_bytes());
            }
            Origin::Genesis(genesis) => {
                bytes.push(TAG_GENESIS);
                bytes.extend_from_slice(&genesis.to_bytes());
            }
        }
        bytes
    }

    /// The origin in `bytes`.
    ///
    /// # Errors
    /// A line saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        match bytes.split_first() {
            Some((&TAG_IDENTITY, keys)) if keys.len() == 64 => {
                let mut signing = [0u8; 32];
                let mut agreement = [0u8; 32];
                signing.copy_from_slice(&keys[..32]);
                agreement.copy_from_slice(&keys[32..]);
                PublicIdentity::from_bytes(signing, agreement)
                    .map(Origin::Identity)
                    .map_err(|error| format!("its identity is not a key pair: {error}"))
            }
            Some((&TAG_IDENTITY, _)) => Err("an identity is 64 bytes of keys".to_owned()),
            Some((&TAG_GENESIS, genesis)) => Genesis::from_bytes(genesis)
                .map(Origin::Genesis)
                .map_err(|error: GenesisError| format!("its genesis does not read: {error}")),
            _ => Err("it is no identity and no genesis".to_owned()),
        }
    }
}

/// Why a record of a protected log is not folded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// No head its device signed covers it yet.
    NotCovered,
    /// Record 0 of its log names no key (a log no device made).
    NoOrigin(String),
    /// Its device is not a member under the key of its record 0.
    NotAMember,
    /// This reader holds no key of its generation (not wrapped to it yet).
    KeyNotHeld {
        /// The generation.
        generation: u32,
    },
    /// It does not open: altered, or sealed as no member seals.
    NotOpened(OpenError),
}

impl fmt::Display for Missing {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missing::NotCovered => formatter.write_str("no head its device signed covers it yet"),
            Missing::NoOrigin(why) => write!(formatter, "record 0 of its log names no key: {why}"),
            Missing::NotAMember => {
                formatter.write_str("its device is not a member under the key its log names")
            }
            Missing::KeyNotHeld { generation } => write!(
                formatter,
                "generation {generation} of the ledger key has not been given to this device"
            ),
            Missing::NotOpened(error) => write!(formatter, "it does not open: {error}"),
        }
    }
}

/// Where a covered record stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Fold it: the record its sealed content opened to.
    Folded(OpRecord),
    /// Its content is in the clear (an identity, a membership change): the sealed record.
    Clear(OpRecord),
    /// Its device was cut before it: held, never folded as a truth.
    Void(OpRecord),
    /// Not foldable: why.
    Missing(OpRecord, Missing),
}

/// A protected ledger as one reader sees it: its id, the generations of its key this reader
/// holds, and its roster.
pub struct Protection {
    ledger: LedgerId,
    keys: BTreeMap<u32, LedgerKey>,
    roster: Roster,
}

impl fmt::Debug for Protection {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Protection")
            .field("ledger", &self.ledger)
            .field("generations", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Protection {
    /// The ledger `ledger` with `roster`, holding no key yet.
    pub fn new(ledger: LedgerId, roster: Roster) -> Self {
        Self {
            ledger,
            keys: BTreeMap::new(),
            roster,
        }
    }

    /// The ledger's id.
    pub fn ledger(&self) -> &LedgerId {
        &self.ledger
    }

    /// Holds `key` (a generation unwrapped for this reader).
    pub fn hold(&mut self, key: LedgerKey) {
        self.keys.insert(key.generation(), key);
    }

    /// The newest generation held.
    pub fn newest_key(&self) -> Option<&LedgerKey> {
        self.keys.values().next_back()
    }

    /// Replaces the roster (after membership changes were read).
    pub fn set_roster(&mut self, roster: Roster) {
        self.roster = roster;
    }

    /// Where `op`, a covered record of the log whose record 0 is `origin`, stands.
    pub fn classify(&self, op: OpRecord, origin: &OpId) -> Verdict {
        match self.roster.standing(&op.device_id, KeyId(origin.0), op.seq) {
            Standing::Member => {}
            Standing::Void => return Verdict::Void(op),
            Standing::NotMember => return Verdict::Missing(op, Missing::NotAMember),
        }
        let generation = match op.sealed_record().map(|record| &record.content) {
            Some(SealedContent::Sealed(sealed)) => sealed.generation,
            _ => return Verdict::Clear(op),
        };
        let Some(key) = self.keys.get(&generation) else {
            return Verdict::Missing(op, Missing::KeyNotHeld { generation });
        };
        match op.open(key, self.ledger) {
            Ok(opened) => Verdict::Folded(opened),
            Err(error) => Verdict::Missing(op, Missing::NotOpened(error)),
        }
    }
}

/// One device's protected log as a reader receives it: records are held until a head the
/// log's key signed covers them.
#[derive(Debug, Clone)]
pub struct LogReader {
    device: Arc<str>,
    origin: Option<Result<(OpId, Origin), String>>,
    held: Vec<OpRecord>,
    covered: u64,
}

impl LogReader {
    /// A reader of `device`'s log, from its record 0.
    pub fn new(device: Arc<str>) -> Self {
        Self {
            device,
            origin: None,
            held: Vec::new(),
            covered: 0,
        }
    }

    /// Record 0's id and what it says, once read; an error when it names no key.
    pub fn origin(&self) -> Option<&Result<(OpId, Origin), String>> {
        self.origin.as_ref()
    }

    /// How many records from the log's start a head covers.
    pub fn covered(&self) -> u64 {
        self.covered
    }

    /// The records held, not covered yet.
    pub fn held(&self) -> &[OpRecord] {
        &self.held
    }

    /// Takes the next record of the log (`op.seq` is the next one: the caller checked the
    /// chain) and returns the records a head now covers, in sequence order (none while the log's
    /// record 0 names no key).
    pub fn offer(&mut self, op: OpRecord, ledger: &LedgerId) -> Vec<OpRecord> {
        debug_assert_eq!(op.device_id, self.device);
        if op.seq == 0 {
            self.origin = Some(read_origin(&op));
        }
        let head = match &self.origin {
            Some(Ok((origin, said))) => op.has_valid_head(said.signer(), ledger, origin),
            _ => false,
        };
        self.held.push(op);
        if !head {
            return Vec::new();
        }
        let covered = std::mem::take(&mut self.held);
        self.covered = covered.last().map_or(self.covered, |last| last.seq + 1);
        covered
    }
}

impl Origin {
    /// What `op`, record 0 of a log, says, and its id.
    ///
    /// # Errors
    /// A line saying why it names no key (sealed, not a protected ledger's record, malformed).
    pub fn of_record(op: &OpRecord) -> Result<(OpId, Origin), String> {
        read_origin(op)
    }
}

/// What record 0 of a log says: a device's identity or a genesis, in the clear.
fn read_origin(op: &OpRecord) -> Result<(OpId, Origin), String> {
    match op.sealed_record().map(|record| &record.content) {
        Some(SealedContent::Clear(bytes)) => Origin::from_bytes(bytes).map(|origin| (op.op_id, origin)),
        Some(SealedContent::Sealed(sealed)) => Err(format!(
            "it is sealed (generation {}), not in the clear (generation {CLEAR_GENERATION})",
            sealed.generation
        )),
        None => Err("it is not a protected ledger's record".to_owned()),
    }
}

/// What [`ProtectedLogs::offer`] released.
#[derive(Debug, Default)]
pub struct Released {
    /// Records to fold (opened).
    pub fold: Vec<OpRecord>,
    /// Covered records in the clear (identities, membership changes), for the roster.
    pub clear: Vec<OpRecord>,
    /// Records of a device cut before them: held, not folded.
    pub void: Vec<OpRecord>,
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
    /// The membership changes read (the genesis's founding admission) or given.
    changes: Vec<MembershipChange>,
}

impl ProtectedLogs {
    /// No log read yet, of the ledger `protection` describes; its roster is computed from
    /// `changes` and what the logs hold (a genesis founds its founder).
    pub fn new(protection: Protection, changes: Vec<MembershipChange>) -> Self {
        let mut protection = protection;
        protection.set_roster(Roster::compute(&changes));
        Self {
            protection,
            readers: BTreeMap::new(),
            unresolved: BTreeMap::new(),
            settled: BTreeMap::new(),
            ahead: BTreeMap::new(),
            changes,
        }
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
        if !was_read {
            if let Some(founding) = founding(said, &device, &origin, &ledger) {
                self.changes.push(founding);
                released = self.set_roster(Roster::compute(&self.changes));
            }
        }
        for op in covered {
            let verdict = self.protection.classify(op, &origin);
            self.settle(&device, verdict, &mut released);
        }
        released
    }

    /// Holds another generation of the ledger key, and releases what it opens.
    pub fn hold(&mut self, key: LedgerKey) -> Released {
        self.protection.hold(key);
        self.retry()
    }

    /// Adds membership changes to those the roster is computed from, and releases what the
    /// new roster lets count. (A roster that voids records folded before needs a reading from
    /// the start: this does not unfold them.)
    pub fn admit(&mut self, changes: impl IntoIterator<Item = MembershipChange>) -> Released {
        self.changes.extend(changes);
        self.set_roster(Roster::compute(&self.changes))
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
fn founding(said: &Origin, device: &str, origin: &OpId, ledger: &LedgerId) -> Option<MembershipChange> {
    let Origin::Genesis(genesis) = said else {
        return None;
    };
    if genesis.ledger_id() != *ledger || genesis.founder.as_str() != device {
        return None;
    }
    let key = KeyId(origin.0);
    Some(MembershipChange::by_recovery(
        Position {
            device: genesis.founder.clone(),
            seq: 0,
        },
        key,
        Change::Admit {
            device: genesis.founder.clone(),
            key,
        },
    ))
}
