//! Importing an unprotected ledger into a protected one (`Ledger::import`, issue 39, rule S4):
//! every record copied, sealed, into this device's log, a record that ends the import, and
//! each agent's hand-off frontier published anew on the coordinator.
//!
//! A protected ledger's logs are its members' own (each signs its log), so the records of the
//! old ledger's devices cannot be carried as theirs: they become records of the importing
//! device, in the old ledger's order (by stamp). The fold is a merge (rule F3): the oracle
//! (every commit), the fencing epochs (every `pending`'s epoch) and the runs in doubt are the
//! same. What the old holders published (rule H1) named the old logs; those names mean nothing
//! in the new ledger, so the import wants a coordinator on which the agents have published
//! nothing, and publishes for each agent the importing device's log through the import: a new
//! holder waits until its ledger has every imported record (rule H3).
//!
//! Found by an adversary, and so: the old ledger's records are checked against what its
//! coordinator published (a copy of the old folder that lags lost another host's commits); the
//! import holds every agent's lease while it copies (two imports at once wrote the ledger twice)
//! and publishes the frontier the import will reach before it copies (an import killed between
//! the copy and the publication let hosts run the imported occurrences again).

use sha2::{Digest, Sha256};

use super::*;
use crate::lease::LeaseCoordinator;

/// The registry whose record ends an import: its key is the import's digest (the SHA-256 of
/// the ids of the records copied, in their order).
pub const IMPORT_REGISTRY: &str = "fencepost.import";

/// The registry whose record begins an import, before anything else of it is written (its key
/// the import's digest; `device` and `reach`, the count of the importer's log the import
/// reaches): until that log reaches it, or the import's end is read, every hand-off waits
/// ([`Ledger::behind`]).
pub const IMPORT_BEGIN_REGISTRY: &str = "fencepost.import-begin";

/// How many records one append carries: each append signs a head.
const RECORDS_PER_APPEND: usize = 10_000;

/// The unprotected ledger [`Ledger::import`] copies, read whole with no writer.
#[derive(Debug, Clone, Default)]
pub struct ImportSource {
    /// Every record of its relay.
    pub records: Vec<OpRecord>,
    /// What its coordinator published, per agent (rule H1): the records must reach it.
    pub published: Vec<(String, Frontier)>,
}

/// What [`Ledger::import`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// How many records it copied (0 when the import was made before).
    pub records: u64,
    /// The agents whose frontier it published.
    pub agents: Vec<String>,
    /// Whether this ledger held the import already (its records were not copied again; the
    /// frontiers were published again).
    pub already: bool,
    /// The import's digest (hex), its registry key.
    pub digest: String,
}

/// Why [`Ledger::import`] refused: nothing was copied, nothing was published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The records to import include sealed ones: that ledger is protected already.
    #[error(
        "the ledger to import is protected (it holds sealed records): only an unprotected ledger is imported"
    )]
    SourceProtected,
    /// An agent of the records that the old ledger's coordinator does not know: it is not the
    /// old ledger's coordinator (a new file made by a misspelt path, another deployment's).
    #[error("the coordinator given as the old ledger's does not know agent {agent:?}, which the ledger to import has records of: it is not that ledger's coordinator")]
    SourceAgentUnknown {
        /// The agent.
        agent: String,
    },
    /// The import did not reach the count it published (a part of it written before): this
    /// ledger cannot take it.
    #[error("the import reached record {reached} of this device's log, not the {expected} it published: a stopped import wrote a part of its records here; start over with a new protected ledger")]
    Reach {
        /// The count reached.
        reached: u64,
        /// The count published.
        expected: u64,
    },
    /// The records do not reach what the old ledger's coordinator published: the copy read
    /// lacks records a holder had written (a sync that lags).
    #[error("the ledger to import has {has} record(s) of device {device:?}, and its coordinator published {published} for agent {agent:?}: this copy of it lacks records (a sync that lags?); import once every host's records are in it")]
    SourceBehind {
        /// The agent.
        agent: String,
        /// The device.
        device: String,
        /// How many records of it the source has.
        has: u64,
        /// How many the coordinator published.
        published: u64,
    },
    /// This ledger holds runs, logs or registries that no import with these records wrote.
    #[error("this ledger holds records already that are not this import's ({detail}): import into a ledger just made with `ledger init` (an import that was stopped leaves a part of its records: start over with a new ledger)")]
    NotEmpty {
        /// What it holds.
        detail: String,
    },
    /// The coordinator holds a hand-off frontier for an agent that names another log: it is the
    /// old ledger's coordinator, or hosts ran on the new ledger already.
    #[error("the coordinator has a published frontier for agent {agent:?} that names device {device:?}: it is another ledger's coordinator (the old one's?), whose frontiers name logs this ledger does not have, or hosts ran on this ledger since it was imported. Give the protected ledger a coordinator of its own (a new SQLite file or database) before its first run")]
    FrontierPublished {
        /// The agent.
        agent: String,
        /// The device its frontier names.
        device: String,
    },
    /// An agent's lease is held: a host runs on this coordinator.
    #[error("agent {agent:?} is held by {holder:?} (epoch {epoch}): stop every host before the import (an import holds every agent while it copies, and one that was stopped holds them until their leases end)")]
    Held {
        /// The agent.
        agent: String,
        /// Its holder.
        holder: String,
        /// The holder's epoch.
        epoch: u64,
    },
    /// The coordinator failed or refused.
    #[error("agent {agent:?}: {detail}")]
    Coordinator {
        /// The agent.
        agent: String,
        /// What happened.
        detail: String,
    },
}

impl Ledger {
    /// Imports `source`, an unprotected ledger read whole with no writer, into this protected
    /// ledger as records of this device, in the order of their stamps, then a record that ends
    /// the import. Refused unless the records reach what the source's coordinator published.
    /// It holds every agent's lease on `coordinator` while it copies (raising each epoch floor
    /// to the agent's fencing epoch first), publishes first the frontier the import will reach
    /// (this device's log through it: hosts wait for it, never run meanwhile), then that log
    /// with its last record's id as it gives the leases back. Run again, an import found whole
    /// copies nothing and publishes again.
    ///
    /// # Errors
    /// [`LedgerError::NotProtected`] on a ledger that is not protected; [`LedgerError::Import`]
    /// when the records are sealed or behind their coordinator, this ledger holds other
    /// records, or the coordinator holds another ledger's frontiers or a live lease of one of
    /// the agents (nothing copied); the relay's errors while copying (a part may be copied:
    /// hosts wait for the frontier published, and a new ledger is needed).
    pub fn import(
        &mut self,
        source: ImportSource,
        coordinator: &dyn LeaseCoordinator,
        ttl_ms: u64,
    ) -> Result<Imported, LedgerError> {
        if self.protected.is_none() {
            return Err(LedgerError::NotProtected);
        }
        let ImportSource {
            mut records,
            published,
        } = source;
        if records.iter().any(|op| op.surface == Surface::Sealed) {
            return Err(ImportError::SourceProtected.into());
        }
        check_reach(&records, &published)?;
        if let Some(agent) = records
            .iter()
            .filter_map(|op| op.payload.intent().map(|intent| intent.agent_id))
            .find(|agent| !published.iter().any(|(known, _)| known == agent))
        {
            return Err(ImportError::SourceAgentUnknown { agent }.into());
        }
        // A record no log holds is refused before anything is written or published.
        for op in &records {
            self.log
                .clone()
                .try_append(op.surface.clone(), op.payload.value().into_owned())?;
        }
        records.sort_by(|a, b| (&a.hlc, &a.device_id, a.seq).cmp(&(&b.hlc, &b.device_id, b.seq)));
        let digest = import_digest(&records);
        let already = self.state().registry(IMPORT_REGISTRY, &digest).is_some();
        if !already {
            if let Some(detail) = self.state().content_summary() {
                return Err(ImportError::NotEmpty { detail }.into());
            }
        }
        let agents: BTreeSet<String> = records
            .iter()
            .filter_map(|op| op.payload.intent().map(|intent| intent.agent_id))
            .chain(published.into_iter().map(|(agent, _)| agent))
            .collect();
        let device = self.device_id().to_owned();
        let own = self.view.frontier.next_seq(&device);
        let to_write = self.records_to_write(&records);
        let begun = self.begun(&digest);
        let reach = match (already, begun) {
            (true, _) => own,
            (false, Some(reach)) => reach,
            // Record 0 when this log is empty, the import's beginning, then its records.
            (false, None) => own + u64::from(own == 0) + 1 + to_write,
        };
        self.check_coordinator(&agents, coordinator, reach)?;
        if !already {
            self.begin_import(&digest, reach, to_write, begun.is_some())?;
        }
        // The fencing epochs the import carries: the old ledger's fold's (this one has not
        // folded the copies yet).
        let carried = crate::fold::fold(&records);
        let held = self.hold_all(&agents, &carried, coordinator, ttl_ms)?;
        let mut barrier = Frontier::new();
        barrier.raise(&device, reach);
        let copied = self.copy_holding(&records, &digest, already, coordinator, (&held, &barrier, ttl_ms));
        let copied = match copied {
            Ok(copied) => copied,
            Err(error) => {
                // The frontier published stays: hosts wait for the import, never run.
                release_all(&held, &device, coordinator);
                return Err(error);
            }
        };
        self.publish_imported(&held, coordinator, reach)?;
        Ok(Imported {
            records: copied,
            agents: agents.into_iter().collect(),
            already,
            digest,
        })
    }

    /// Writes the import's beginning (unless it `began` before): the count `reach` this
    /// device's log reaches once its `to_write` records follow, which it checks.
    fn begin_import(
        &mut self,
        digest: &str,
        reach: u64,
        to_write: u64,
        began: bool,
    ) -> Result<(), LedgerError> {
        if !began {
            let device = self.device_id();
            let beginning = serde_json::json!({ "key": digest, "device": device, "reach": reach });
            self.unsent
                .push((Surface::registry(IMPORT_BEGIN_REGISTRY), beginning));
            self.write_queued()?;
        }
        let reached = self.view.frontier.next_seq(self.device_id()) + to_write;
        if reached != reach {
            return Err(ImportError::Reach {
                reached,
                expected: reach,
            }
            .into());
        }
        Ok(())
    }

    /// The count an import with `digest` that began here reaches, when it began.
    fn begun(&self, digest: &str) -> Option<u64> {
        let entry = self.state().registry(IMPORT_BEGIN_REGISTRY, digest)?;
        entry
            .payload
            .value()
            .get("reach")
            .and_then(serde_json::Value::as_u64)
    }

    /// The imports that began in this ledger and whose device's log has not reached their end
    /// yet (their end not read): what every hand-off waits for, the records missing.
    pub(super) fn unfinished_imports(&self) -> Vec<MissingRecords> {
        self.state()
            .registry_entries(IMPORT_BEGIN_REGISTRY)
            .filter(|(key, _)| self.state().registry(IMPORT_REGISTRY, key).is_none())
            .filter_map(|(_, entry)| {
                let value = entry.payload.value();
                let device = value.get("device")?.as_str()?.to_owned();
                let needs = value.get("reach")?.as_u64()?;
                let has = self.view.frontier.next_seq(&device);
                (has < needs).then_some(MissingRecords {
                    device_id: device,
                    has,
                    needs,
                    differs: false,
                })
            })
            .collect()
    }

    /// How many records copying `records` appends: each, a naming of each agent this
    /// device's log does not name yet (rule S5), and the import's end.
    fn records_to_write(&self, records: &[OpRecord]) -> u64 {
        let device = self.device_id();
        let mut named = BTreeSet::new();
        let logs = self.view.protected.as_ref();
        for op in records {
            if let Some(intent) = op.payload.intent() {
                if !logs.is_some_and(|logs| logs.names_agent(device, &intent.agent_id)) {
                    named.insert(intent.agent_id);
                }
            }
        }
        (records.len() + named.len() + 1) as u64
    }

    /// Refuses an import onto a coordinator where an agent's lease is live or its published
    /// frontier names anything but this device's log at `reach`, the count the import reaches
    /// (published before it copies, or by it: run again). (Found trying it: the old ledger's
    /// coordinator names this device too, at a count of the old log.)
    fn check_coordinator(
        &self,
        agents: &BTreeSet<String>,
        coordinator: &dyn LeaseCoordinator,
        reach: u64,
    ) -> Result<(), LedgerError> {
        let device = self.device_id();
        let now_ms = (self.wall_clock)();
        for agent in agents {
            let frontier = coordinator
                .published_frontier(agent)
                .map_err(|error| coordinator_failed(agent, &error))?;
            let own_head = self.view.frontier.head(device);
            let foreign = frontier.iter().find(|&(named, next)| {
                let head = frontier.head(named);
                !(named == device && next == reach && (head.is_none() || head == own_head))
            });
            if let Some((device, _)) = foreign {
                return Err(ImportError::FrontierPublished {
                    agent: agent.clone(),
                    device: device.to_owned(),
                }
                .into());
            }
            let lease = coordinator
                .current(agent)
                .map_err(|error| coordinator_failed(agent, &error))?;
            if let Some(lease) = lease.filter(|lease| lease.expires_at_ms > now_ms) {
                return Err(ImportError::Held {
                    agent: agent.clone(),
                    holder: lease.holder,
                    epoch: lease.epoch,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Every agent's lease, its epoch floor raised to its fencing epoch in `carried` first:
    /// (agent, epoch). None is kept when one cannot be taken (another import, a host).
    fn hold_all(
        &self,
        agents: &BTreeSet<String>,
        carried: &SyncState,
        coordinator: &dyn LeaseCoordinator,
        ttl_ms: u64,
    ) -> Result<Vec<(String, u64)>, LedgerError> {
        let device = self.device_id();
        let mut held = Vec::with_capacity(agents.len());
        for agent in agents {
            let taken = coordinator
                .raise_epoch_floor(agent, carried.fencing_epoch(agent))
                .and_then(|()| coordinator.acquire(agent, device, ttl_ms));
            match taken {
                Ok(lease) => held.push((agent.clone(), lease.epoch)),
                Err(error) => {
                    release_all(&held, device, coordinator);
                    return Err(coordinator_failed(agent, &error).into());
                }
            }
        }
        Ok(held)
    }

    /// With the leases `held` (and their TTL): `barrier` published for each, then the records
    /// copied (unless `already`), the leases renewed between appends; how many were copied.
    fn copy_holding(
        &mut self,
        records: &[OpRecord],
        digest: &str,
        already: bool,
        coordinator: &dyn LeaseCoordinator,
        (held, barrier, ttl_ms): (&[(String, u64)], &Frontier, u64),
    ) -> Result<u64, LedgerError> {
        let device = self.device_id().to_owned();
        let renew = |publish: bool| -> Result<(), LedgerError> {
            for (agent, epoch) in held {
                coordinator
                    .renew(agent, &device, *epoch, ttl_ms)
                    .map_err(|error| coordinator_failed(agent, &error))?;
                if publish {
                    coordinator
                        .publish_frontier(agent, &device, *epoch, barrier)
                        .map_err(|error| coordinator_failed(agent, &error))?;
                }
            }
            Ok(())
        };
        renew(true)?;
        if already {
            return Ok(0);
        }
        let copied = self.copy_records(records, digest, || renew(false))?;
        let reached = self.view.frontier.next_seq(&device);
        if reached != barrier.next_seq(&device) {
            return Err(ImportError::Reach {
                reached,
                expected: barrier.next_seq(&device),
            }
            .into());
        }
        Ok(copied)
    }

    /// Appends `records` as this device's, a few thousand at a time (`between` after each
    /// append), the last append ending with the import's record; returns how many were copied.
    fn copy_records(
        &mut self,
        records: &[OpRecord],
        digest: &str,
        mut between: impl FnMut() -> Result<(), LedgerError>,
    ) -> Result<u64, LedgerError> {
        let end = (
            Surface::registry(IMPORT_REGISTRY),
            serde_json::json!({ "key": digest, "records": records.len() }),
        );
        let mut copied = 0u64;
        let mut chunks = records.chunks(RECORDS_PER_APPEND).peekable();
        if chunks.peek().is_none() {
            self.unsent.push(end.clone());
            self.write_queued()?;
        }
        while let Some(chunk) = chunks.next() {
            for op in chunk {
                self.unsent
                    .push((op.surface.clone(), op.payload.value().into_owned()));
            }
            if chunks.peek().is_none() {
                self.unsent.push(end.clone());
            }
            self.write_queued()?;
            copied += chunk.len() as u64;
            between()?;
        }
        tracing::info!(records = copied, "imported the records of an unprotected ledger");
        Ok(copied)
    }

    /// For each lease `held`: this device's log through its last record (`reach` records, and
    /// the last one's id) published as the agent's frontier, and the lease given back.
    fn publish_imported(
        &self,
        held: &[(String, u64)],
        coordinator: &dyn LeaseCoordinator,
        reach: u64,
    ) -> Result<(), LedgerError> {
        let device = self.device_id();
        let mut frontier = Frontier::new();
        frontier.raise_to(device, reach, self.view.frontier.head(device));
        for (agent, epoch) in held {
            coordinator
                .release_publishing(agent, device, *epoch, &frontier)
                .map_err(|error| coordinator_failed(agent, &error))?;
            // A publication that failed is no error of the release: read back.
            let published = coordinator
                .published_frontier(agent)
                .map_err(|error| coordinator_failed(agent, &error))?;
            if published.next_seq(device) != reach {
                return Err(ImportError::Coordinator {
                    agent: agent.clone(),
                    detail: "the frontier was not published".to_owned(),
                }
                .into());
            }
        }
        Ok(())
    }
}

/// Refuses `records` that do not reach a frontier of `published`: per device, as many records
/// as published.
fn check_reach(records: &[OpRecord], published: &[(String, Frontier)]) -> Result<(), ImportError> {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for op in records {
        let count = counts.entry(&op.device_id).or_default();
        *count = (*count).max(op.seq + 1);
    }
    for (agent, frontier) in published {
        for (device, next) in frontier.iter() {
            let has = counts.get(device).copied().unwrap_or(0);
            if has < next {
                return Err(ImportError::SourceBehind {
                    agent: agent.clone(),
                    device: device.to_owned(),
                    has,
                    published: next,
                });
            }
        }
    }
    Ok(())
}

/// Gives back the leases `held`, as far as the coordinator answers.
fn release_all(held: &[(String, u64)], device: &str, coordinator: &dyn LeaseCoordinator) {
    for (agent, epoch) in held {
        if let Err(error) = coordinator.release(agent, device, *epoch) {
            tracing::warn!(agent = agent.as_str(), %error, "cannot give back a lease the import took");
        }
    }
}

fn coordinator_failed(agent: &str, error: &crate::lease::LeaseError) -> ImportError {
    ImportError::Coordinator {
        agent: agent.to_owned(),
        detail: error.to_string(),
    }
}

/// The SHA-256 of the ids of `records`, in their order, in hex.
fn import_digest(records: &[OpRecord]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"fencepost/import/v1\0");
    for op in records {
        hasher.update(op.op_id.0);
    }
    let mut hex = String::with_capacity(64);
    crate::core::hex::push_lower_hex(&mut hex, &hasher.finalize());
    hex
}
