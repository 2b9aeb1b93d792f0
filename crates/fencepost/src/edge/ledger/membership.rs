//! A protected ledger's membership, as a member changes it (issue 39): founding the ledger
//! ([`Ledger::found`]), admitting a device ([`Ledger::admit`]), and the records in the clear
//! that carry them ([`Ledger::append_membership`]).

use std::num::NonZeroU32;
use std::sync::Arc;

use super::{Ledger, LedgerError, LedgerOptions, Protected};
use crate::clock::WallClock;
use crate::genesis::{Fingerprint, Genesis};
use crate::id::DeviceId;
use crate::identity::{DeviceKey, PublicIdentity, SignatureContext};
use crate::membership::{Membership, MembershipRecord, RECOVERY};
use crate::oplog::{LogError, OpRecord};
use crate::protected::Origin;
use crate::relay::Relay;
use crate::roster::KeyId;
use crate::seal::LedgerKey;

/// What founding a protected ledger made ([`Ledger::found`]).
#[derive(Debug)]
pub struct Founded {
    /// The genesis: its fingerprint is what joining devices are given.
    pub genesis: Genesis,
    /// The recovery key: admits and revokes with the highest authority and unwraps every
    /// generation of the ledger key. Keep it offline.
    pub recovery: DeviceKey,
}

fn random<const N: usize>() -> Result<[u8; N], LedgerError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|error| {
        LedgerError::Log(LogError::Unsealable {
            device_id: String::new(),
            seq: 0,
            detail: format!("cannot draw random bytes: {error}"),
        })
    })?;
    Ok(bytes)
}

pub(super) fn membership(detail: &str) -> LedgerError {
    LedgerError::Membership {
        detail: detail.to_owned(),
    }
}

fn unsealable(device: &DeviceId, detail: String) -> LedgerError {
    LedgerError::Log(LogError::Unsealable {
        device_id: device.to_string(),
        seq: 0,
        detail,
    })
}

/// The id of record 0 of a member's log: its identity in the clear, known before it is written.
pub fn identity_key(device: &DeviceId, identity: &PublicIdentity) -> KeyId {
    crate::protected::identity_key(device, identity)
}

impl Ledger {
    /// Founds a protected ledger on `relay`, which must hold no record: this device (`key`'s)
    /// is its first member, its log begins with the genesis, then the first generation of the
    /// ledger key wrapped to it and to a new recovery key. Returns the ledger, opened as this
    /// device's, and what was made.
    ///
    /// # Errors
    /// [`LedgerError::NotEmpty`] when the relay holds records; as [`Ledger::open_with`] and
    /// [`append_membership`](Self::append_membership) otherwise.
    pub fn found(
        key: Arc<DeviceKey>,
        wall_clock: WallClock,
        relay: Arc<dyn Relay>,
        options: LedgerOptions,
    ) -> Result<(Ledger, Founded), LedgerError> {
        let device = key.device().clone();
        let recovery = DeviceKey::from_secrets(DeviceId::new(RECOVERY)?, random()?, random()?);
        let genesis = Genesis {
            nonce: random()?,
            founder: device.clone(),
            founder_key: key.public(),
            recovery_key: recovery.public(),
        };
        let ledger_id = genesis.ledger_id();
        let protected = Protected {
            ledger: ledger_id,
            device_key: Arc::clone(&key),
            origin: Origin::Genesis(genesis.clone()),
            keys: Vec::new(),
            members: Vec::new(),
        };
        let mut ledger = Ledger::open_with(device.as_str(), wall_clock, relay, options.protected(protected))?;
        let damaged = !ledger.relay_problems.is_empty() || !ledger.view.rejected.is_empty();
        if ledger.view.frontier.iter().next().is_some() || !ledger.view.heads.is_empty() || damaged {
            return Err(LedgerError::NotEmpty);
        }
        let first = LedgerKey::new(NonZeroU32::MIN, random()?);
        let mut wraps = Vec::with_capacity(2);
        for (recipient, public) in [(&device, key.public()), (recovery.device(), recovery.public())] {
            let wrapped = crate::wrap::wrap(first.bytes(), &ledger_id, 1, recipient, &public)
                .map_err(|error| unsealable(&device, error.to_string()))?;
            wraps.push((recipient.clone(), wrapped));
        }
        ledger.append_membership(&MembershipRecord {
            change: Membership::Rotate {
                generation: 1,
                commitment: first.commitment(&ledger_id),
                wraps,
            },
            by_recovery: None,
        })?;
        Ok((ledger, Founded { genesis, recovery }))
    }

    /// Admits `device`, whose public identity is `identity`, to this protected ledger: a
    /// membership record in this device's log, with every generation of the ledger key this
    /// device holds wrapped to it. The device's records count once its log begins with that
    /// identity.
    ///
    /// # Errors
    /// [`LedgerError::NotProtected`]; [`LedgerError::Membership`] when this device is no
    /// member (it holds no generation of the ledger key); as
    /// [`append_membership`](Self::append_membership) otherwise.
    pub fn admit(&mut self, device: &DeviceId, identity: &PublicIdentity) -> Result<OpRecord, LedgerError> {
        self.admit_as(device, identity, None)
    }

    /// [`admit`](Self::admit) with the recovery key's authority, from any host that reads the
    /// ledger (a member or not, the device admitted itself when the only member's key was
    /// lost): the change is signed by `recovery`, which also unwraps every generation of the
    /// ledger key wrapped to it, so the admitted device gets them all.
    ///
    /// # Errors
    /// As [`admit`](Self::admit), and [`LedgerError::Membership`] when `recovery` is not this
    /// ledger's recovery key.
    pub fn admit_by_recovery(
        &mut self,
        device: &DeviceId,
        identity: &PublicIdentity,
        recovery: &DeviceKey,
    ) -> Result<OpRecord, LedgerError> {
        self.admit_as(device, identity, Some(recovery))
    }

    fn admit_as(
        &mut self,
        device: &DeviceId,
        identity: &PublicIdentity,
        recovery: Option<&DeviceKey>,
    ) -> Result<OpRecord, LedgerError> {
        if device.as_str() == crate::membership::RECOVERY {
            // Found by a cryptography review: its wraps would mix with the recovery key's.
            return Err(membership(&format!(
                "`{}` names the recovery key in membership records: admit the host under another device id",
                crate::membership::RECOVERY
            )));
        }
        let generations = self.generations(recovery)?;
        let ledger = self.view.protected.as_ref().ok_or(LedgerError::NotProtected)?;
        if let Some(cut) = ledger.protection().roster().cut(device.as_str()) {
            // Found by an adversarial test: the admit was written, every generation wrapped to
            // the revoked device, which stayed revoked (a cut is of the device id).
            return Err(membership(&format!(
                "device {device} was revoked (from record {cut} of its log on): admit the host under a new device id"
            )));
        }
        let ledger = *ledger.protection().ledger();
        let wraps = wrap_each(&generations, &ledger, device, identity)?;
        let change = Membership::Admit {
            device: device.clone(),
            key: identity_key(device, identity),
            identity: *identity,
            wraps,
        };
        let mut records = vec![self.membership_record(change, recovery)?.to_bytes()];
        // The generations this device holds to open only (a revoked device's rotation, which
        // members sealed with before the revocation): the new member reads those records too.
        let open_only = self.open_only(&generations);
        if !open_only.is_empty() {
            let change = Membership::Open {
                device: device.clone(),
                wraps: wrap_each(&open_only, &ledger, device, identity)?,
            };
            records.push(self.membership_record(change, recovery)?.to_bytes());
        }
        let stored = self.write_queued_and(&records)?;
        stored
            .into_iter()
            .find(|op| {
                op.sealed_record()
                    .is_some_and(|sealed| matches!(&sealed.content, crate::oplog::SealedContent::Clear(bytes) if **bytes == *records[0]))
            })
            .ok_or(LedgerError::NotProtected)
    }

    /// The keys this device holds to open records only: every one held that is not among
    /// `giving` (the generations it gives, which count).
    fn open_only(&self, giving: &[LedgerKey]) -> Vec<LedgerKey> {
        let Some(logs) = self.view.protected.as_ref() else {
            return Vec::new();
        };
        logs.protection()
            .keys()
            .filter(|key| !giving.iter().any(|given| given.bytes() == key.bytes()))
            .cloned()
            .collect()
    }

    /// A membership record of `change`, signed by `recovery` when given.
    pub(super) fn membership_record(
        &self,
        change: Membership,
        recovery: Option<&DeviceKey>,
    ) -> Result<MembershipRecord, LedgerError> {
        let logs = self.view.protected.as_ref().ok_or(LedgerError::NotProtected)?;
        let by_recovery = recovery.map(|recovery| {
            recovery.sign(
                SignatureContext::Membership,
                logs.protection().ledger(),
                &change.to_bytes(),
            )
        });
        Ok(MembershipRecord { change, by_recovery })
    }

    /// The generations of the ledger key this device can give: those it holds, and with
    /// `recovery`, every one wrapped to the recovery key. Never empty.
    ///
    /// # Errors
    /// [`LedgerError::Membership`] when there is none (this device is no member and no
    /// recovery key is given), or `recovery` is not this ledger's recovery key.
    pub(super) fn generations(&self, recovery: Option<&DeviceKey>) -> Result<Vec<LedgerKey>, LedgerError> {
        let logs = self.view.protected.as_ref().ok_or(LedgerError::NotProtected)?;
        let protection = logs.protection();
        let mut generations: std::collections::BTreeMap<u32, LedgerKey> = logs
            .counting_keys()
            .into_iter()
            .map(|key| (key.generation(), key))
            .collect();
        if let Some(recovery) = recovery {
            let genesis = logs.genesis().ok_or_else(|| {
                membership("the ledger's genesis was not read: is the founder's log here yet?")
            })?;
            if recovery.public() != genesis.recovery_key {
                return Err(membership("this is not the recovery key of this ledger"));
            }
            for (generation, wrapped, committed_to) in logs.wrapped_to(recovery.device()) {
                let (Some(number), false) =
                    (NonZeroU32::new(generation), generations.contains_key(&generation))
                else {
                    continue;
                };
                if let Ok(key) = crate::wrap::unwrap(&wrapped, protection.ledger(), generation, recovery) {
                    let key = LedgerKey::new(number, *key);
                    if logs.commits_to(&key, committed_to.as_ref()) {
                        generations.insert(generation, key);
                    }
                }
            }
        }
        if generations.is_empty() {
            return Err(membership(
                "this device is not a member yet (no generation of the ledger key was wrapped to it): only a member, or the recovery key, changes the members",
            ));
        }
        Ok(generations.into_values().collect())
    }

    /// Appends `record`, a membership record in the clear, to this device's log (with the
    /// records queued before it).
    ///
    /// # Errors
    /// [`LedgerError::NotProtected`]; as [`flush`](Self::flush) (the record is then not kept
    /// queued: the caller tries again).
    pub fn append_membership(&mut self, record: &MembershipRecord) -> Result<OpRecord, LedgerError> {
        if self.protected.is_none() {
            return Err(LedgerError::NotProtected);
        }
        let mut stored = self.write_queued_and(&[record.to_bytes()])?;
        stored.pop().ok_or(LedgerError::NotProtected)
    }

    /// The genesis of this protected ledger, once read; `None` for a ledger that is not
    /// protected or whose founder's log this ledger has not read.
    pub fn genesis(&self) -> Option<&Genesis> {
        self.view.protected.as_ref().and_then(|logs| logs.genesis())
    }

    /// What of a protected ledger this reading does not count, per device: the first record
    /// not counted and why (not covered by a head yet, a log under a non-member key, a key
    /// generation not given to this device, …). Empty for a ledger that is not protected.
    pub fn not_counted(&self) -> Vec<(String, u64, crate::protected::Missing)> {
        self.view
            .protected
            .as_ref()
            .map_or_else(Vec::new, |logs| logs.missing())
    }

    /// The devices admitted to this protected ledger as this reading read it, each with its cut
    /// (the first record voided) when it was revoked; empty for a ledger that is not protected.
    pub fn members(&self) -> Vec<(DeviceId, Option<u64>)> {
        self.view.protected.as_ref().map_or_else(Vec::new, |logs| {
            logs.protection()
                .roster()
                .members()
                .map(|(device, _, cut)| (device.clone(), cut))
                .collect()
        })
    }

    /// Whether this ledger is read as protected.
    pub fn is_protected(&self) -> bool {
        self.protected.is_some()
    }

    /// Whether this ledger, read as not protected, holds a protected ledger's sealed records:
    /// this host is no member of it (they are damage to it, never records of an empty ledger).
    pub fn is_protected_elsewhere(&self) -> bool {
        self.protected.is_none() && self.view.sealed_seen
    }

    /// The fingerprint of this protected ledger (see [`genesis`](Self::genesis)).
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.genesis().map(Genesis::fingerprint)
    }
}

/// Each of `keys` wrapped to `device` (`identity`) for `ledger`, with its generation.
fn wrap_each(
    keys: &[LedgerKey],
    ledger: &crate::identity::LedgerId,
    device: &DeviceId,
    identity: &PublicIdentity,
) -> Result<Vec<(u32, crate::wrap::Wrapped)>, LedgerError> {
    keys.iter()
        .map(|key| {
            crate::wrap::wrap(key.bytes(), ledger, key.generation(), device, identity)
                .map(|wrapped| (key.generation(), wrapped))
                .map_err(|error| unsealable(device, error.to_string()))
        })
        .collect()
}
