//! Revoking a member of a protected ledger (issue 39): [`Ledger::revoke`] writes the cut and a
//! new generation of the ledger key wrapped to the members that remain; a reading whose roster
//! now voids what it folded reads the ledger again from the start
//! ([`read_again_if_stale`](Ledger::read_again_if_stale)), and a revoked device writes nothing
//! ([`LedgerError::Revoked`]).

use std::num::NonZeroU32;
use std::sync::Arc;

use super::{Ledger, LedgerError, LedgerState};
use crate::id::DeviceId;
use crate::identity::DeviceKey;
use crate::membership::{Membership, RECOVERY};
use crate::roster::{Change, KeyId, MembershipChange, Position, Standing};
use crate::seal::LedgerKey;

/// What [`Ledger::revoke`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    /// The device revoked.
    pub device: DeviceId,
    /// Its first record voided.
    pub cut: u64,
    /// The new generation of the ledger key.
    pub generation: u32,
    /// The members it was wrapped to (the recovery key aside).
    pub members: Vec<DeviceId>,
    /// On a ledger whose logs were pruned (this host started from a checkpoint): the
    /// checkpoint this member wrote after the revocation, or why it could not (then run
    /// [`compact`](Ledger::compact) on a member). A host that reads the revocation before it
    /// opens the revoked device's checkpoints never uses them (rule S6), so it needs one of a
    /// member's to start from. `None` on a ledger that was not pruned.
    pub checkpoint: Option<Result<crate::checkpoint::CheckpointInfo, String>>,
}

/// How many times a reading starts over in one call before it goes on stale (each start over
/// reads the changes the one before read, so a second is rare and a third needs a writer that
/// keeps revoking while this host reads).
const MAX_READINGS: usize = 8;

fn refused(detail: impl Into<String>) -> LedgerError {
    LedgerError::Membership {
        detail: detail.into(),
    }
}

impl Ledger {
    /// Revokes `device`: its records from `cut` on count for nothing (the runs they name are in
    /// doubt, never run again by themselves), and the devices it admitted from there on are no
    /// members; then a new generation of the ledger key, wrapped to every member that remains
    /// and to the recovery key, seals what the members write next. Without `cut`, the cut is
    /// the length of its log as this ledger read it.
    ///
    /// # Errors
    /// [`LedgerError::NotProtected`]; [`LedgerError::Membership`] when this device is no member
    /// (it holds no generation of the ledger key), revokes itself, or `device` is no member or
    /// is cut there already; as [`append_membership`](Self::append_membership) otherwise.
    ///
    /// A member revoked while it revokes others (two members revoking each other at once):
    /// both cuts count (rule M1), each from where its author read the other.
    pub fn revoke(&mut self, device: &DeviceId, cut: Option<u64>) -> Result<Revoked, LedgerError> {
        self.revoke_as(device, cut, None)
    }

    /// [`revoke`](Self::revoke) with the recovery key's authority, from any host that reads the
    /// ledger: the cut counts wherever it is (a member's revoke cannot take a recovery-revoked
    /// device's power to revoke others, this can), and the new generation is signed by it too.
    ///
    /// # Errors
    /// As [`revoke`](Self::revoke), and [`LedgerError::Membership`] when `recovery` is not this
    /// ledger's recovery key.
    pub fn revoke_by_recovery(
        &mut self,
        device: &DeviceId,
        cut: Option<u64>,
        recovery: &DeviceKey,
    ) -> Result<Revoked, LedgerError> {
        self.revoke_as(device, cut, Some(recovery))
    }

    fn revoke_as(
        &mut self,
        device: &DeviceId,
        cut: Option<u64>,
        recovery: Option<&DeviceKey>,
    ) -> Result<Revoked, LedgerError> {
        let held = self.generations(recovery)?;
        let newest = held.iter().map(LedgerKey::generation).max();
        if device == self.device() {
            return Err(refused(
                "a device does not revoke itself: run `device revoke` on another member",
            ));
        }
        let logs = self.view.protected.as_ref().ok_or(LedgerError::NotProtected)?;
        let roster = logs.protection().roster();
        if !roster.members().any(|(member, _, _)| member == device) {
            return Err(refused(format!("{device} is not a member of this ledger")));
        }
        let read = logs
            .settled()
            .find(|(settled, _, _)| *settled == device.as_str())
            .map_or(0, |(_, next, _)| next);
        let cut = cut.unwrap_or(read);
        if cut > read {
            // Found by an adversarial test: a cut past the end left the device its powers.
            return Err(refused(format!(
                "record {cut} is past the end of {device}'s log as this host read it ({read} records): a cut voids records read, from the one given (--from {read} voids what it writes from now on)"
            )));
        }
        // Records removed after a checkpoint covered them cannot be voided: the checkpoint
        // holds what they did, and a reading cannot be made again without them (found by
        // trying: every host of the ledger then stopped, waiting for the records).
        let starts = self.relay.log_starts()?;
        if let Some((first, _)) = starts.get(device.as_str()).filter(|(first, _)| cut < *first) {
            return Err(refused(format!(
                "records of {device} before {first} were removed from its log after a checkpoint covered them (ledger compact --prune): what they did stays in the checkpoints; revoke from record {first} or later (--from {first})"
            )));
        }
        if let Some(already) = roster.cut(device.as_str()).filter(|already| *already <= cut) {
            return Err(refused(format!(
                "{device} is revoked from record {already} on already"
            )));
        }
        // Where the revocation lands: after record 0 when this device's log is empty.
        let position = Position {
            device: self.device().clone(),
            seq: self.log.head().next_seq().max(1),
        };
        let log_key = KeyId(self.own_key_id().map_or([0; 32], |id| id.0));
        let change = Change::Revoke {
            device: device.clone(),
            cut,
        };
        // Whom the new generation goes to: the members once this revocation counts, as it will,
        // with its author's authority (found by an adversarial test: a revoker whose log was
        // empty counted it as a stranger's, and wrapped the new generation to the device it
        // revoked; a second one: a member's revocation counted as the recovery key's took the
        // revoked device's own revocations away, and the device one of them revoked was given
        // the new generation).
        let extra = match recovery {
            Some(_) => MembershipChange::by_recovery(position, log_key, change),
            None => MembershipChange::by_member(position, log_key, change),
        };
        let members = logs.current_members(Some(extra));
        let revoke = self.membership_record(
            Membership::Revoke {
                device: device.clone(),
                cut,
            },
            recovery,
        )?;
        let (key, rotate) = self.rotation(newest, &members, recovery)?;
        let mut records = vec![revoke.to_bytes(), rotate.to_bytes()];
        for given in self.lacking_wraps(&members, &held, recovery)? {
            records.push(given.to_bytes());
        }
        self.write_queued_and(&records)?;
        // Found by an adversarial test: hosts that read the revocation first stopped until a
        // member compacted.
        let checkpoint = self
            .pruned_start()
            .is_some()
            .then(|| self.compact().map_err(|error| error.to_string()));
        Ok(Revoked {
            device: device.clone(),
            cut,
            generation: key.generation(),
            members: members.into_iter().map(|(member, _, _)| member).collect(),
            checkpoint,
        })
    }

    /// A new generation of the ledger key, numbered after `newest`, and the rotation that
    /// wraps it to `members` and to the recovery key (signed by `recovery` when given).
    pub(super) fn rotation(
        &self,
        newest: Option<u32>,
        members: &[(DeviceId, KeyId, crate::identity::PublicIdentity)],
        recovery: Option<&DeviceKey>,
    ) -> Result<(LedgerKey, crate::membership::MembershipRecord), LedgerError> {
        let logs = self.view.protected.as_ref().ok_or(LedgerError::NotProtected)?;
        let Some(generation) = newest
            .and_then(|newest| newest.checked_add(1))
            .and_then(NonZeroU32::new)
        else {
            return Err(refused("the ledger key has no generation left"));
        };
        let genesis = logs.genesis().ok_or(LedgerError::NotProtected)?;
        let key = LedgerKey::new(generation, random_key()?);
        let ledger_id = *logs.protection().ledger();
        let recovery_id = DeviceId::new(RECOVERY)?;
        let mut wraps = Vec::with_capacity(members.len() + 1);
        let recovery_entry = (recovery_id, KeyId([0; 32]), genesis.recovery_key);
        for (member, _, identity) in members.iter().chain([recovery_entry].iter()) {
            let wrapped = crate::wrap::wrap(key.bytes(), &ledger_id, generation.get(), member, identity)
                .map_err(|error| refused(error.to_string()))?;
            wraps.push((member.clone(), wrapped));
        }
        let rotate = self.membership_record(
            Membership::Rotate {
                generation: generation.get(),
                commitment: key.commitment(&ledger_id),
                wraps,
            },
            recovery,
        )?;
        Ok((key, rotate))
    }

    /// The rotation to write before sealing `self.unsent`, when the newest generation went to
    /// a device revoked since ([`ProtectedLogs::rotation_due`](crate::protected::ProtectedLogs::rotation_due)):
    /// the new generation, and the rotation's bytes.
    pub(super) fn rotation_due(&self) -> Result<Option<(LedgerKey, Vec<u8>)>, LedgerError> {
        let Some(logs) = self.view.protected.as_ref() else {
            return Ok(None);
        };
        if self.unsent.is_empty() || !logs.rotation_due() {
            return Ok(None);
        }
        let newest = logs.counting_keys().iter().map(LedgerKey::generation).max();
        let (key, rotate) = self.rotation(newest, &logs.current_members(None), None)?;
        tracing::info!(
            generation = key.generation(),
            "the newest generation of the ledger key went to a device revoked since: sealing with a new one"
        );
        Ok(Some((key, rotate.to_bytes())))
    }

    /// For each of `members` that lacks a generation of `held` (never wrapped to it: it was
    /// revoked when another member rotated, and is a member again since), an admit of it
    /// under its key again, with those generations wrapped to it (found by an adversarial
    /// test: such a member waited for good on what others sealed with them).
    fn lacking_wraps(
        &self,
        members: &[(DeviceId, KeyId, crate::identity::PublicIdentity)],
        held: &[LedgerKey],
        recovery: Option<&DeviceKey>,
    ) -> Result<Vec<crate::membership::MembershipRecord>, LedgerError> {
        let logs = self.view.protected.as_ref().ok_or(LedgerError::NotProtected)?;
        let ledger_id = *logs.protection().ledger();
        let mut records = Vec::new();
        for (member, key, identity) in members {
            let given = logs.generations_given_to(member);
            let mut wraps = Vec::new();
            for lacking in held.iter().filter(|key| !given.contains(&key.generation())) {
                let wrapped = crate::wrap::wrap(
                    lacking.bytes(),
                    &ledger_id,
                    lacking.generation(),
                    member,
                    identity,
                )
                .map_err(|error| refused(error.to_string()))?;
                wraps.push((lacking.generation(), wrapped));
            }
            if !wraps.is_empty() {
                let change = Membership::Admit {
                    device: member.clone(),
                    key: *key,
                    identity: *identity,
                    wraps,
                };
                records.push(self.membership_record(change, recovery)?);
            }
        }
        Ok(records)
    }

    /// How many runs, of every agent, are in doubt (rule D2): after a revocation, those its
    /// void records name.
    pub fn runs_in_doubt(&self) -> usize {
        self.view
            .attempts
            .values()
            .flat_map(|runs| runs.values())
            .filter(|attempts| !attempts.unsettled.is_empty())
            .count()
    }

    /// The id of this device's log's record 0: as the reading read it, or, for a log not
    /// begun yet, the one it will begin with.
    fn own_key_id(&self) -> Option<crate::oplog::OpId> {
        let logs = self.view.protected.as_ref()?;
        match logs.origin_of(self.device().as_str()) {
            Some(Ok((id, _))) => Some(*id),
            Some(Err(_)) => None,
            // Found by an adversarial test: a device revoked from record 0 before it wrote
            // anything ran its command (its revocation was checked against no log).
            None => self.protected.as_deref().map(super::Protected::origin_id),
        }
    }

    /// Whether this device may still write into its protected ledger: [`LedgerError::Revoked`]
    /// when the roster this ledger read voids its next record (a member revoked it). Every
    /// append checks it; a caller checks it before taking a lease it could not use.
    ///
    /// # Errors
    /// [`LedgerError::Revoked`].
    pub fn refuse_if_revoked(&self) -> Result<(), LedgerError> {
        let (Some(logs), Some(key)) = (self.view.protected.as_ref(), self.own_key_id()) else {
            return Ok(());
        };
        let roster = logs.protection().roster();
        let device = self.device().as_str();
        let next = self.log.head().next_seq();
        // Revoked at all, whatever its next record's place: found by an adversary, a device
        // whose log a restore cut below its cut wrote on, and those records counted.
        if roster.cut(device).is_some() || roster.standing(device, KeyId(key.0), next) == Standing::Void {
            return Err(LedgerError::Revoked {
                device: device.to_owned(),
                cut: roster.cut(device).unwrap_or(0),
            });
        }
        Ok(())
    }

    /// Reads the ledger again from the start when its protected reading went stale (a
    /// revocation read since voids records it folded): the new reading starts from every
    /// membership change the old one read, so the records past a cut are void at first sight.
    ///
    /// # Errors
    /// As a pull of the relay; the stale reading is kept then (it takes no void commit for
    /// absent), and the next pull tries again.
    pub(super) fn read_again_if_stale(&mut self) -> Result<(), LedgerError> {
        for _ in 0..MAX_READINGS {
            let Some(logs) = self.view.protected.as_ref().filter(|logs| logs.stale()) else {
                return Ok(());
            };
            let Some(protected) = self.protected.as_deref() else {
                return Ok(());
            };
            tracing::info!(
                "a revocation voids records this host had read: reading the ledger again from the start"
            );
            // Records removed after a checkpoint covered them are read again from the checkpoint.
            let pruned = !self.relay.log_starts()?.is_empty();
            let changes = logs.changes();
            let mut fresh = protected.logs();
            let released = fresh.admit(changes);
            debug_assert!(released.fold.is_empty());
            // The snapshot holds the void records' runs as they were folded (a save merges, it
            // never unfolds): it starts over, and no stored run is merged into the new reading.
            if let Some(path) = self
                .snapshot
                .as_ref()
                .map(|snapshot| snapshot.store.path().to_path_buf())
            {
                self.start_snapshot_over(path, "a revocation voids records it holds");
            }
            let fresh = LedgerState {
                protected: Some(fresh),
                ..LedgerState::default()
            };
            let stale = std::mem::replace(&mut self.view, fresh);
            let relay = Arc::clone(&self.relay);
            // A relay resumed from the snapshot's cursor would hand over only what follows it.
            relay.read_from_start();
            let mut settled = false;
            if pruned {
                self.start_after_pruning()?;
                if let Some(logs) = self.view.protected.as_mut() {
                    logs.admit(stale_changes(&stale));
                    // A cut among the records the checkpoint covers (a host's revoke made
                    // before its copy of the ledger was pruned): they cannot be read again,
                    // and what the checkpoint holds of them stands.
                    if logs.stale() {
                        tracing::warn!("a revocation voids records that the checkpoint this reading starts from covers: what they did stands as the checkpoint holds it (docs/security.md, checkpoints)");
                        settled = true;
                    }
                }
            }
            let since = self.view.frontier.clone();
            let pulled = self
                .pull_and_absorb(&*relay, &since)
                .map(|(problems, _)| problems);
            if settled {
                if let Some(logs) = self.view.protected.as_mut() {
                    logs.accept_stale();
                }
            }
            match pulled {
                Ok(problems) => self.take_problems(problems)?,
                Err(error) => {
                    // Never a half reading: the stale one holds every commit it read.
                    self.view = stale;
                    return Err(error.into());
                }
            }
        }
        tracing::warn!(
            "a reading of the protected ledger went stale {MAX_READINGS} times: going on with the last one"
        );
        Ok(())
    }
}

/// The membership changes a reading read.
fn stale_changes(view: &LedgerState) -> Vec<crate::roster::MembershipChange> {
    view.protected
        .as_ref()
        .map(crate::protected::ProtectedLogs::changes)
        .unwrap_or_default()
}

fn random_key() -> Result<[u8; 32], LedgerError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| refused(format!("cannot draw random bytes: {error}")))?;
    Ok(bytes)
}
