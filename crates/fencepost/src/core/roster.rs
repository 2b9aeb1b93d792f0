//! Who may write a protected ledger (issue 39, under way: the ledger does not read membership
//! records yet): the roster as a function of the set of membership changes, so that hosts
//! that read the same changes in any order agree (the rules are in
//! `docs/proposals/protected-ledger.md`, "Members").
//!
//! A change sits at a [`Position`] (its author's log and sequence number) and is signed by a
//! member or by the ledger's recovery key. The roster is rooted in the recovery key's changes
//! (the genesis founds the ledger):
//! 1. recovery changes always count; a recovery revoke may cut anywhere;
//! 2. a member revoke counts when its author was ever admitted (member revokes aside, so no
//!    cycle of revokes needs a tie-break) and the recovery key has not cut its author at or
//!    before the revoke's position; a device's cut is the lowest that counts;
//! 3. a member admit counts when its author is a member at that position (admitted, and the
//!    position below its cut), so a revocation also revokes the devices the revoked one
//!    admitted after the cut: their logs are void, held and counted for nothing, as the
//!    records of a cut device are (the runs they name are in doubt, never run again by
//!    themselves);
//! 4. a device's log counts under the key of its record 0 ([`KeyId`]) only: an admit of its id
//!    under another key (by a thief, say) admits a log that does not exist, and takes nothing
//!    from the real one (two logs under one id are the log reader's equivocation, not the
//!    roster's).
//!
//! ```
//! use fencepost::id::DeviceId;
//! use fencepost::roster::{Change, KeyId, MembershipChange, Position, Roster, Standing};
//!
//! let device = |name: &str| DeviceId::new(name).unwrap();
//! let at = |name: &str, seq| Position { device: device(name), seq };
//! let changes = vec![
//!     MembershipChange::by_recovery(at("laptop", 0), KeyId([1; 32]), Change::Admit { device: device("laptop"), key: KeyId([1; 32]) }),
//!     MembershipChange::by_member(at("laptop", 3), KeyId([1; 32]), Change::Admit { device: device("phone"), key: KeyId([2; 32]) }),
//!     MembershipChange::by_member(at("laptop", 9), KeyId([1; 32]), Change::Revoke { device: device("phone"), cut: 5 }),
//! ];
//! let roster = Roster::compute(&changes);
//! assert_eq!(roster.standing("phone", KeyId([2; 32]), 4), Standing::Member);
//! assert_eq!(roster.standing("phone", KeyId([2; 32]), 5), Standing::Void);
//! assert_eq!(roster.standing("phone", KeyId([3; 32]), 0), Standing::NotMember);
//! assert_eq!(roster.standing("tablet", KeyId([4; 32]), 0), Standing::NotMember);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::id::DeviceId;

/// Which key a device was admitted with: the id of its log's record 0, which holds its public
/// identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 32]);

/// Where a membership change sits: its author's log, and its sequence number there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// The log.
    pub device: DeviceId,
    /// The sequence number.
    pub seq: u64,
}

/// What a membership change does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Change {
    /// `device`, with the key `key`, is a member.
    Admit {
        /// The device admitted.
        device: DeviceId,
        /// Its key.
        key: KeyId,
    },
    /// `device`'s records from sequence number `cut` on count no more (nor its changes there).
    Revoke {
        /// The device revoked.
        device: DeviceId,
        /// Its first sequence number voided.
        cut: u64,
    },
}

/// One membership change as read: where it sits, who signed it (the recovery key, or the
/// author of the log it sits in, under that log's key) and what it does. The signature is
/// checked before a change gets here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MembershipChange {
    /// Where it sits.
    pub position: Position,
    /// The key of the log it sits in (the id of that log's record 0): a member's change
    /// counts only from the log of a key admitted under its author's id.
    pub log_key: KeyId,
    /// Whether the recovery key signed it (else the author of its log did).
    pub by_recovery: bool,
    /// What it does.
    pub change: Change,
}

impl MembershipChange {
    /// A change signed by the recovery key, carried at `position` in the log of `log_key`.
    pub fn by_recovery(position: Position, log_key: KeyId, change: Change) -> Self {
        Self {
            position,
            log_key,
            by_recovery: true,
            change,
        }
    }

    /// A change signed by the author of the log (of `log_key`) that holds it at `position`.
    pub fn by_member(position: Position, log_key: KeyId, change: Change) -> Self {
        Self {
            position,
            log_key,
            by_recovery: false,
            change,
        }
    }

    /// Whether its author (its log's device, under its log's key) is among `keys`.
    fn author_in(&self, keys: &BTreeMap<DeviceId, BTreeSet<KeyId>>) -> bool {
        keys.get(&self.position.device)
            .is_some_and(|admitted| admitted.contains(&self.log_key))
    }
}

/// Where a record of a device's log, at a sequence number, stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It counts: the log's key is admitted, and the record is below the device's cut.
    Member,
    /// Its device was cut at or before it, or admitted only by an admit made after its
    /// author's cut: it is held but counts for nothing, and the runs it names are in doubt.
    Void,
    /// No admission of the log's key counts (not read yet, or none).
    NotMember,
}

/// The members of a protected ledger and their cuts: [`Roster::compute`] of the membership
/// changes read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roster {
    /// Per member, the keys admitted under its id (only its log's record 0 counts).
    keys: BTreeMap<DeviceId, BTreeSet<KeyId>>,
    /// Per device, the lowest cut that counts.
    cuts: BTreeMap<DeviceId, u64>,
    /// Per device, the keys that an admit made whatever the cuts, and no admit that counts:
    /// their logs are void (admitted after their admitter's cut).
    voided: BTreeMap<DeviceId, BTreeSet<KeyId>>,
}

impl Roster {
    /// The roster the changes make (rules 1–3 of the module docs); the same whatever their
    /// order or repetitions.
    pub fn compute(changes: &[MembershipChange]) -> Self {
        let changes: BTreeSet<&MembershipChange> = changes.iter().collect();
        let recovery_cuts = lowest_cuts(changes.iter().filter(|change| change.by_recovery));
        let below = |cuts: &BTreeMap<DeviceId, u64>, position: &Position| {
            cuts.get(&position.device).is_none_or(|cut| position.seq < *cut)
        };
        // Rule 2: who was ever admitted, member revokes aside.
        let ever = admitted(&changes, |change| below(&recovery_cuts, &change.position));
        let member_revokes = changes.iter().filter(|change| {
            !change.by_recovery && change.author_in(&ever) && below(&recovery_cuts, &change.position)
        });
        let mut cuts = recovery_cuts.clone();
        for (device, cut) in lowest_cuts(member_revokes) {
            let lowest = cuts.entry(device).or_insert(cut);
            *lowest = (*lowest).min(cut);
        }
        // Rule 3: members, with every cut.
        let keys = admitted(&changes, |change| below(&cuts, &change.position));
        let mut voided = admitted(&changes, |_| true);
        for (device, admitted) in &mut voided {
            if let Some(counted) = keys.get(device) {
                admitted.retain(|key| !counted.contains(key));
            }
        }
        voided.retain(|_, keys| !keys.is_empty());
        Self { keys, cuts, voided }
    }

    /// Why a checkpoint is not the word of `device` (rule S6), which wrote it with `count`
    /// records of its log whose record 0 is `key`: no member where it ends that log, or ever
    /// revoked (one written before the revocation cannot be told from one a thief wrote
    /// after it); `None` when it is. Readers judge a checkpoint so, and a writer its own.
    pub fn refuses_checkpoint_of(&self, device: &str, key: KeyId, count: u64) -> Option<String> {
        let standing = count
            .checked_sub(1)
            .map_or(Standing::NotMember, |last| self.standing(device, key, last));
        if standing != Standing::Member {
            return Some(format!(
                "its writer {device:?} was no member where it ends that device's log (record {count})"
            ));
        }
        self.cut(device)
            .map(|_| format!("its writer {device:?} was revoked"))
    }

    /// Where the record at `seq` of the log of `device` whose record 0 is `key` stands.
    pub fn standing(&self, device: &str, key: KeyId, seq: u64) -> Standing {
        if !self.keys.get(device).is_some_and(|keys| keys.contains(&key)) {
            if self.voided.get(device).is_some_and(|keys| keys.contains(&key)) {
                return Standing::Void;
            }
            return Standing::NotMember;
        }
        if self.cuts.get(device).is_some_and(|cut| seq >= *cut) {
            return Standing::Void;
        }
        Standing::Member
    }

    /// The cut of `device` that counts, if any: its first record voided.
    pub fn cut(&self, device: &str) -> Option<u64> {
        self.cuts.get(device).copied()
    }

    /// The devices admitted only by admits that count for nothing (made after their author's
    /// cut): their logs are void, and so are their checkpoints (rule S6).
    pub fn voided(&self) -> impl Iterator<Item = &DeviceId> {
        self.voided
            .keys()
            .filter(|device| !self.keys.contains_key(*device))
    }

    /// The devices whose checkpoints never count (rule S6): those revoked (a cut), and those
    /// only admits that count for nothing admitted ([`voided`](Self::voided)).
    pub fn revoked(&self) -> impl Iterator<Item = &DeviceId> {
        let cut = self.members().filter(|(_, _, cut)| cut.is_some());
        cut.map(|(device, _, _)| device).chain(self.voided())
    }

    /// The members, each with the keys admitted under its id and its cut, if any.
    pub fn members(&self) -> impl Iterator<Item = (&DeviceId, &BTreeSet<KeyId>, Option<u64>)> {
        self.keys
            .iter()
            .map(|(device, keys)| (device, keys, self.cuts.get(device).copied()))
    }
}

/// Per device, the lowest cut of the revokes among `changes`.
fn lowest_cuts<'a>(changes: impl Iterator<Item = &'a &'a MembershipChange>) -> BTreeMap<DeviceId, u64> {
    let mut cuts: BTreeMap<DeviceId, u64> = BTreeMap::new();
    for change in changes {
        if let Change::Revoke { device, cut } = &change.change {
            let lowest = cuts.entry(device.clone()).or_insert(*cut);
            *lowest = (*lowest).min(*cut);
        }
    }
    cuts
}

/// The devices admitted, with their keys: the least fixed point rooted in the recovery key's
/// admits, where a member's admit counts when `counts` says its position does and its author is
/// admitted.
fn admitted(
    changes: &BTreeSet<&MembershipChange>,
    counts: impl Fn(&MembershipChange) -> bool,
) -> BTreeMap<DeviceId, BTreeSet<KeyId>> {
    let admits: Vec<(&MembershipChange, &DeviceId, &KeyId)> = changes
        .iter()
        .filter_map(|change| match &change.change {
            Change::Admit { device, key } => Some((*change, device, key)),
            Change::Revoke { .. } => None,
        })
        .collect();
    let mut keys: BTreeMap<DeviceId, BTreeSet<KeyId>> = BTreeMap::new();
    loop {
        let mut grew = false;
        for (change, device, key) in &admits {
            let authorized = change.by_recovery || (change.author_in(&keys) && counts(change));
            if authorized && keys.entry((*device).clone()).or_default().insert(**key) {
                grew = true;
            }
        }
        if !grew {
            return keys;
        }
    }
}

#[cfg(test)]
mod tests;
