//! The ledger key's generations as [`ProtectedLogs`] reads them: the wraps to this device, each
//! held only when a rotation read commits to its key, and which of them count (what this
//! device seals with, gives on and numbers after).

use super::{ProtectedLogs, Standing};
use crate::core::membership::Membership;
use crate::core::seal::LedgerKey;

impl ProtectedLogs {
    /// The generations of the ledger key that the membership records read wrapped to `device`
    /// (any an admitted key or the recovery key signed): what a member that holds more can
    /// give it.
    pub fn generations_given_to(&self, device: &crate::id::DeviceId) -> std::collections::BTreeSet<u32> {
        self.memberships
            .iter()
            .filter(|read| self.gives_keys(read))
            .flat_map(|read| wraps_to(&read.record.change, device))
            .map(|(generation, _, _)| generation)
            .collect()
    }

    /// The generations of the ledger key wrapped to `recipient` (a device id, or
    /// [`RECOVERY`](crate::membership::RECOVERY)) by the membership records that count (a
    /// member's at its position, or the recovery key's): what the recovery key unwraps when no
    /// member is left to.
    pub fn wrapped_to(&self, recipient: &crate::id::DeviceId) -> Vec<WrapTo> {
        self.memberships
            .iter()
            .filter(|read| self.counts(read))
            .flat_map(|read| wraps_to(&read.record.change, recipient))
            .collect()
    }

    /// Whether the newest generation this device seals with was wrapped, by a change that
    /// counts, to a device revoked since (rule M2): two members that revoke two devices at once
    /// each wrap their new generation to the device the other revokes (found by a
    /// cryptography review, and confirmed by an adversary through the binary). A writer then
    /// writes a new generation, wrapped to the members, before it seals anything more.
    pub fn rotation_due(&self) -> bool {
        let Some(newest) = self.protection.newest_key().map(LedgerKey::generation) else {
            return false;
        };
        let roster = self.protection.roster();
        let revoked = |device: &crate::id::DeviceId| roster.cut(device.as_str()).is_some();
        self.memberships
            .iter()
            .filter(|read| self.counts(read))
            .any(|read| match &read.record.change {
                Membership::Rotate {
                    generation, wraps, ..
                } => *generation == newest && wraps.iter().any(|(device, _)| revoked(device)),
                Membership::Admit { device, wraps, .. } | Membership::Open { device, wraps } => {
                    revoked(device) && wraps.iter().any(|(generation, _)| *generation == newest)
                }
                Membership::Revoke { .. } => false,
            })
    }

    /// The generations of the ledger key given by the caller or by a membership change that
    /// counts now: what this device seals with, gives to the devices it admits, and numbers a
    /// new generation after. Never one that only a void change gave (a revoked device's
    /// rotation: its author knows it; found by a cryptography review, such a key was given to
    /// a new member, which sealed with it), nor one an admission gave that only such a rotation
    /// commits to (found by the review of key commitment: a member that admitted a device
    /// before it read the revocation gave it the thief's generation, and the device sealed with
    /// it).
    pub fn counting_keys(&self) -> Vec<LedgerKey> {
        let mut keys: Vec<LedgerKey> = Vec::new();
        // A generation given to open only (found by an adversary: a member admitted after a
        // revocation that voided a rotation could not read what members had sealed with it,
        // and its hand-offs waited for good) never counts.
        let counting = self
            .memberships
            .iter()
            .filter(|read| self.counts(read) && !matches!(read.record.change, Membership::Open { .. }))
            .flat_map(|read| {
                let made = matches!(read.record.change, Membership::Rotate { .. });
                read.keys
                    .iter()
                    .filter(move |key| made || self.rotation_commits_to(key, |read| self.counts(read)))
            });
        for key in self.given_keys.iter().chain(counting) {
            if !keys.iter().any(|held| held.bytes() == key.bytes()) {
                keys.push(key.clone());
            }
        }
        keys
    }

    /// Unwraps the generations wrapped to this device by the membership records not looked at
    /// yet that an admitted key signed (a member's, or a cut device's: what members sealed with
    /// them still opens) or the recovery key did; a log no admission names gives nothing. A
    /// key is held only once a rotation read commits to it ([`commits_to`](Self::commits_to));
    /// an admission's wrap that no rotation read commits to yet is looked at again once more
    /// rotations could (its rotation may be in a log not read yet, or its author not admitted
    /// yet), not at every change read (found by the review of key commitment: a member could
    /// write thousands of such wraps, each unwrapped again at every change).
    pub(super) fn take_wraps(&mut self) {
        let Some(recipient) = self.recipient.clone() else {
            return;
        };
        let rotations = self
            .memberships
            .iter()
            .filter(|read| matches!(read.record.change, Membership::Rotate { .. }) && self.gives_keys(read))
            .count();
        for index in 0..self.memberships.len() {
            let read = &self.memberships[index];
            if read.taken || read.looked == Some(rotations) || !self.gives_keys(read) {
                continue;
            }
            let first_look = read.looked.is_none();
            let mut keys = Vec::new();
            let mut later = false;
            for (generation, wrapped, committed_to) in wraps_to(&read.record.change, recipient.device()) {
                let Some(number) = std::num::NonZeroU32::new(generation) else {
                    continue;
                };
                let Ok(bytes) =
                    crate::core::wrap::unwrap(&wrapped, &self.protection.ledger, generation, &recipient)
                else {
                    continue;
                };
                let key = LedgerKey::new(number, *bytes);
                if !self.commits_to(&key, committed_to.as_ref()) {
                    if first_look {
                        tracing::warn!(
                            generation,
                            author = %self.memberships[index].position.device,
                            "a key wrapped to this device that no rotation read commits to: not held"
                        );
                    }
                    later |= committed_to.is_none();
                    continue;
                }
                self.protection.hold_to_open(key.clone());
                keys.push(key);
            }
            let read = &mut self.memberships[index];
            read.taken = !later;
            read.looked = Some(rotations);
            read.keys = keys;
        }
    }

    /// Whether `read`'s author was admitted (a member's change, or a cut device's) or the
    /// recovery key signed it: the changes whose wraps are read and whose rotations commit.
    fn gives_keys(&self, read: &super::ReadChange) -> bool {
        read.by_recovery || self.standing_of(read) != Standing::NotMember
    }

    /// Whether `key` is one a rotation committed to: `committed_to`, the commitment of the
    /// rotation that wrapped it, or, for a generation an admission gave, any rotation read of
    /// that generation that an admitted key or the recovery key signed (key commitment: every
    /// device that holds a generation of one rotation holds the same key).
    pub fn commits_to(&self, key: &LedgerKey, committed_to: Option<&[u8; 32]>) -> bool {
        match committed_to {
            Some(committed_to) => *committed_to == key.commitment(&self.protection.ledger),
            None => self.rotation_commits_to(key, |read| self.gives_keys(read)),
        }
    }

    /// Whether a rotation read that `which` keeps commits to `key`.
    fn rotation_commits_to(&self, key: &LedgerKey, which: impl Fn(&super::ReadChange) -> bool) -> bool {
        let commitment = key.commitment(&self.protection.ledger);
        self.memberships.iter().filter(|read| which(read)).any(|read| {
            matches!(&read.record.change, Membership::Rotate { generation, commitment: made, .. }
                if *generation == key.generation() && *made == commitment)
        })
    }
}

/// A generation wrapped to a device, and the commitment to its key when the change that wraps
/// it is the rotation that made it (an admission gives generations that rotations committed to).
pub type WrapTo = (u32, crate::core::wrap::Wrapped, Option<[u8; 32]>);

/// The generations `change` wraps to `me`.
fn wraps_to(change: &Membership, me: &crate::id::DeviceId) -> Vec<WrapTo> {
    match change {
        Membership::Rotate {
            generation,
            commitment,
            wraps,
        } => wraps
            .iter()
            .filter(|(device, _)| device == me)
            .map(|(_, wrapped)| (*generation, wrapped.clone(), Some(*commitment)))
            .collect(),
        Membership::Admit { device, wraps, .. } | Membership::Open { device, wraps } if device == me => wraps
            .iter()
            .map(|(generation, wrapped)| (*generation, wrapped.clone(), None))
            .collect(),
        _ => Vec::new(),
    }
}
