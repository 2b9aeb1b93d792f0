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
//! * [`Verdict::Void`]: its device was cut before it: held, never folded as a truth (an intent
//!   reads as a `pending`: its epoch fences and its run is in doubt);
//! * [`Verdict::Missing`]: not foldable (yet): no key for its generation, not authentic, no
//!   member's. Never absent: a frontier that names it makes a hand-off wait.
//!
//! Records not covered yet stay with the [`LogReader`]; they are missing too, until a head comes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::core::genesis::{Genesis, GenesisError};
use crate::core::identity::{LedgerId, PublicIdentity};
use crate::core::membership::MembershipRecord;
use crate::core::roster::{KeyId, Roster, Standing};
use crate::core::seal::LedgerKey;
use crate::oplog::{OpId, OpRecord, OpenError, SealedContent, CLEAR_GENERATION};

pub mod checkpoint;
pub(crate) mod evidence;
mod logs;

pub use evidence::{Equivocation, SignedHead};
pub use logs::{OpenMany, ProtectedLogs, ProtectedMark, Released, WrapTo};

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
    /// The records from it on carry a head that does not verify (forged, damaged, or another
    /// ledger's or key's), and no valid head covers them.
    HeadNotValid,
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
    /// It is in the clear after record 0, as only a membership change is, but is none this
    /// version reads (the rotation of an earlier fencepost, a change of a later one): why. Never
    /// taken as no change.
    NotAChange(String),
    /// An intent that names its agent by a digest no record read names yet (its log names the
    /// agent before it).
    AgentNotNamed {
        /// Whether the record is void (read as a `pending` once named).
        void: bool,
    },
}

impl fmt::Display for Missing {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missing::NotCovered => formatter.write_str("no head its device signed covers it yet"),
            Missing::HeadNotValid => formatter.write_str(
                "the head after it does not verify (forged, damaged, or another ledger's or key's), and no valid head covers it",
            ),
            Missing::NoOrigin(why) => write!(formatter, "record 0 of its log names no key: {why}"),
            Missing::NotAMember => {
                formatter.write_str("its device is not a member under the key its log names")
            }
            Missing::KeyNotHeld { generation } => write!(
                formatter,
                "generation {generation} of the ledger key has not been given to this device"
            ),
            Missing::NotOpened(error) => write!(formatter, "it does not open: {error}"),
            Missing::NotAChange(why) => write!(
                formatter,
                "it is in the clear, as only a membership change is, but none this version reads ({why})"
            ),
            Missing::AgentNotNamed { .. } => formatter
                .write_str("it names its agent by a digest that no record read names (its log names it before it)"),
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

/// A protected ledger as one reader sees it: its id, the keys of the ledger key's generations
/// this reader holds (to open; more than one per generation when two members rotated at once),
/// the key it seals with, and its roster.
pub struct Protection {
    ledger: LedgerId,
    keys: BTreeMap<u32, Vec<LedgerKey>>,
    sealing: Option<LedgerKey>,
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

/// Keys of a reader's generations (those it holds one key of), given to another thread to
/// open records with ahead of their verdicts ([`Protection::opening_keys`]).
#[derive(Clone)]
pub(crate) struct OpeningKeys {
    ledger: LedgerId,
    keys: Vec<(u32, LedgerKey)>,
}

impl fmt::Debug for OpeningKeys {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let generations: Vec<u32> = self.keys.iter().map(|(generation, _)| *generation).collect();
        formatter
            .debug_struct("OpeningKeys")
            .field("generations", &generations)
            .finish_non_exhaustive()
    }
}

impl OpeningKeys {
    /// `op` opened, with its generation, when it is sealed with one of these keys and opens.
    pub(crate) fn open(&self, op: &OpRecord) -> Option<(u32, OpRecord)> {
        let Some(SealedContent::Sealed(sealed)) = op.sealed_record().map(|record| &record.content) else {
            return None;
        };
        let (_, key) = self
            .keys
            .iter()
            .find(|(generation, _)| *generation == sealed.generation)?;
        let opened = op.open(key, self.ledger).ok()?;
        Some((sealed.generation, opened))
    }

    /// Whether these are no keys at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl Protection {
    /// The ledger `ledger` with `roster`, holding no key yet.
    pub fn new(ledger: LedgerId, roster: Roster) -> Self {
        Self {
            ledger,
            keys: BTreeMap::new(),
            sealing: None,
            roster,
        }
    }

    /// The ledger's id.
    pub fn ledger(&self) -> &LedgerId {
        &self.ledger
    }

    /// Holds `key` (a generation given to this reader by its caller, or by a membership record
    /// that counts): it opens records, and the newest such key seals.
    pub fn hold(&mut self, key: LedgerKey) {
        if self
            .sealing
            .as_ref()
            .is_none_or(|sealing| key.generation() >= sealing.generation())
        {
            self.sealing = Some(key.clone());
        }
        self.hold_to_open(key);
    }

    /// Holds `key` to open records only (a generation that a record which no longer counts
    /// gave, a revoked device's rotation say: what members sealed with it still opens, nothing
    /// is sealed with it).
    pub fn hold_to_open(&mut self, key: LedgerKey) {
        let held = self.keys.entry(key.generation()).or_default();
        if !held.iter().any(|other| other.bytes() == key.bytes()) {
            held.push(key);
        }
    }

    /// Seals with `key` from now on (`None`: with none), which must be held.
    pub fn seal_with(&mut self, key: Option<LedgerKey>) {
        self.sealing = key;
    }

    /// Every key this reader holds, by generation, oldest first.
    pub fn keys(&self) -> impl Iterator<Item = &LedgerKey> {
        self.keys.values().flatten()
    }

    /// The key this reader seals with: the newest generation given by its caller or by a
    /// membership record that counts.
    pub fn newest_key(&self) -> Option<&LedgerKey> {
        self.sealing.as_ref()
    }

    /// Replaces the roster (after membership changes were read).
    pub fn set_roster(&mut self, roster: Roster) {
        self.roster = roster;
    }

    /// The roster.
    pub fn roster(&self) -> &Roster {
        &self.roster
    }

    /// `op` opened with a key of its generation; `None` when no key of it is held.
    fn open(&self, op: &OpRecord, generation: u32) -> Option<Result<OpRecord, OpenError>> {
        let keys = self.keys.get(&generation)?;
        let mut last = None;
        for key in keys {
            match op.open(key, self.ledger) {
                Ok(opened) => return Some(Ok(opened)),
                Err(error) => last = Some(Err(error)),
            }
        }
        last
    }

    /// The keys of the generations this reader holds one key of, to open records with on
    /// another thread ahead of their verdicts ([`ProtectedLogs::give_opened`]).
    pub(crate) fn opening_keys(&self) -> OpeningKeys {
        OpeningKeys {
            ledger: self.ledger,
            keys: self
                .keys
                .iter()
                .filter_map(|(generation, keys)| match keys.as_slice() {
                    [key] => Some((*generation, key.clone())),
                    _ => None,
                })
                .collect(),
        }
    }

    /// How many keys this reader holds.
    pub(crate) fn key_count(&self) -> usize {
        self.keys.values().map(Vec::len).sum()
    }

    /// Whether this reader holds exactly one key of `generation`: then a record of it opened
    /// ahead with [`OpeningKeys`] of this reader was opened with that key (a reader's keys are
    /// only ever added to).
    fn sole_key(&self, generation: u32) -> bool {
        self.keys.get(&generation).is_some_and(|keys| keys.len() == 1)
    }

    /// `op` opened with a key held for its generation, when one opens it: work a caller may do
    /// ahead of the verdict, on other threads ([`OpenMany`](logs::OpenMany)). The verdict is the
    /// same: a key opens a record or does not, whenever it is tried.
    pub fn open_ahead(&self, op: &OpRecord) -> Option<OpRecord> {
        let Some(SealedContent::Sealed(sealed)) = op.sealed_record().map(|record| &record.content) else {
            return None;
        };
        self.open(op, sealed.generation)?.ok()
    }

    /// Where `op`, a covered record of the log whose record 0 is `origin`, stands.
    pub fn classify(&self, op: OpRecord, origin: &OpId) -> Verdict {
        self.classify_opened(op, origin, None)
    }

    /// [`classify`](Self::classify), with `op` already opened when `ahead` is given (by
    /// [`open_ahead`](Self::open_ahead)).
    fn classify_opened(&self, op: OpRecord, origin: &OpId, ahead: Option<OpRecord>) -> Verdict {
        match self.roster.standing(&op.device_id, KeyId(origin.0), op.seq) {
            Standing::Member => {}
            Standing::Void => return self.void(op),
            Standing::NotMember => return Verdict::Missing(op, Missing::NotAMember),
        }
        let generation = match op.sealed_record().map(|record| &record.content) {
            Some(SealedContent::Sealed(sealed)) => sealed.generation,
            Some(SealedContent::Clear(bytes)) if op.seq > 0 => {
                // Fails closed: a change this version does not read is not taken as none.
                return match MembershipRecord::from_bytes(bytes) {
                    Ok(_) => Verdict::Clear(op),
                    Err(why) => Verdict::Missing(op, Missing::NotAChange(why)),
                };
            }
            _ => return Verdict::Clear(op),
        };
        let opened = match ahead {
            Some(opened) => Some(Ok(opened)),
            None => self.open(&op, generation),
        };
        match opened {
            None => Verdict::Missing(op, Missing::KeyNotHeld { generation }),
            Some(Ok(opened)) => Verdict::Folded(opened),
            Some(Err(error)) => Verdict::Missing(op, Missing::NotOpened(error)),
        }
    }
}

impl Protection {
    /// The verdict on `op`, a void record: held in the clear as it is, or opened, an intent reading as
    /// a `pending` whatever status it says (its epoch fences, and its run is in doubt: never
    /// run again by itself, never taken as committed). Missing, and why, when this reader
    /// cannot open it: a void intent it cannot read may be a commit of any run, so it is never
    /// settled unread (found by an adversary: a member admitted after a revoked device's
    /// rotation, which it is not given, settled that device's commit unread and ran its run a
    /// second time).
    fn void(&self, op: OpRecord) -> Verdict {
        let generation = match op.sealed_record().map(|record| &record.content) {
            Some(SealedContent::Sealed(sealed)) => sealed.generation,
            _ => return Verdict::Void(op),
        };
        let mut opened = match self.open(&op, generation) {
            None => return Verdict::Missing(op, Missing::KeyNotHeld { generation }),
            Some(Err(error)) => return Verdict::Missing(op, Missing::NotOpened(error)),
            Some(Ok(opened)) => opened,
        };
        opened.read_as_pending();
        Verdict::Void(opened)
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
    /// How many heads' signatures were checked.
    heads_verified: u64,
    /// The newest head verified: the record that carries it.
    last_head: Option<SignedHead>,
}

impl LogReader {
    /// A reader of `device`'s log, from its record 0.
    pub fn new(device: Arc<str>) -> Self {
        Self {
            device,
            origin: None,
            held: Vec::new(),
            covered: 0,
            heads_verified: 0,
            last_head: None,
        }
    }

    /// A reader of `device`'s log whose record 0 is `origin`, resumed after its first
    /// `covered` records (a snapshot's).
    pub(crate) fn restored(device: Arc<str>, origin: (OpId, Origin), covered: u64) -> Self {
        Self {
            device,
            origin: Some(Ok(origin)),
            held: Vec::new(),
            covered,
            heads_verified: 0,
            last_head: None,
        }
    }

    /// How many heads' signatures this reader checked: one per [`offer_all`](Self::offer_all)
    /// whose last head is valid, however many heads the records carry.
    pub fn heads_verified(&self) -> u64 {
        self.heads_verified
    }

    /// The newest head this reader verified (the last record it covers carries it).
    pub fn last_head(&self) -> Option<&SignedHead> {
        self.last_head.as_ref()
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
        self.offer_all(vec![op], ledger)
    }

    /// Takes the next records of the log, in sequence order (the caller checked the chain), and
    /// returns the records a head now covers. A valid head covers everything before it, so the
    /// heads are tried from the last one back and the first valid one ends the search: one
    /// signature verified per call when the last head is valid.
    pub fn offer_all(&mut self, ops: Vec<OpRecord>, ledger: &LedgerId) -> Vec<OpRecord> {
        let Some(first) = ops.first() else {
            return Vec::new();
        };
        debug_assert!(ops.iter().all(|op| op.device_id == self.device));
        if first.seq == 0 {
            self.origin = Some(read_origin(first));
        }
        let verified = &mut self.heads_verified;
        let covered_to = match &self.origin {
            Some(Ok((origin, said))) => ops.iter().rposition(|op| {
                let signed = op.sealed_record().is_some_and(|record| record.head.is_some());
                *verified += u64::from(signed);
                signed && op.has_valid_head(said.signer(), ledger, origin)
            }),
            _ => None,
        };
        let mut ops = ops;
        let Some(last) = covered_to else {
            self.held.append(&mut ops);
            return Vec::new();
        };
        self.last_head = SignedHead::of(&ops[last]);
        let rest = ops.split_off(last + 1);
        let covered = if self.held.is_empty() {
            // The usual case: no record moved (each is a few hundred bytes).
            self.held = rest;
            ops
        } else {
            let mut covered = std::mem::replace(&mut self.held, rest);
            covered.append(&mut ops);
            covered
        };
        self.covered = covered.last().map_or(self.covered, |last| last.seq + 1);
        covered
    }
}

/// The key of a log whose record 0 is `identity`'s (every member's log but the founder's,
/// whose record 0 is the genesis): the id of that record, known before it is written. An
/// admission names a device by it, and the identity it carries must hash to it.
pub fn identity_key(device: &crate::id::DeviceId, identity: &PublicIdentity) -> KeyId {
    let record = OpRecord::sealed(
        Arc::from(device.as_str()),
        0,
        None,
        SealedContent::Clear(Origin::Identity(*identity).to_bytes().into()),
    );
    KeyId(record.op_id.0)
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
