//! Importing an unprotected ledger into a protected one (`Ledger::import`, issue 39): every
//! record copied, sealed, into this device's log, a record that ends the import, and each
//! agent's hand-off frontier published anew on the coordinator.
//!
//! A protected ledger's logs are its members' own (each signs its log), so the records of the
//! old ledger's devices cannot be carried as theirs: they become records of the importing
//! device, in the old ledger's order (by stamp). The fold is a merge (rule F3): the oracle
//! (every commit), the fencing epochs (every `pending`'s epoch) and the runs in doubt are the
//! same. What the old holders published (rule H1) named the old logs; those names mean nothing
//! in the new ledger, so the import wants a coordinator on which the agents have published
//! nothing, and publishes for each agent the importing device's log through the import: a new
//! holder waits until its ledger has every imported record (rule H3).

use sha2::{Digest, Sha256};

use super::*;
use crate::lease::LeaseCoordinator;

/// The registry whose record ends an import: its key is the import's digest (the SHA-256 of
/// the ids of the records copied, in their order).
pub const IMPORT_REGISTRY: &str = "fencepost.import";

/// How many records one append carries: each append signs a head.
const RECORDS_PER_APPEND: usize = 10_000;

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
    /// This ledger holds runs, logs or registries that no import with these records wrote.
    #[error("this ledger holds records already that are not this import's ({detail}): import into a ledger just made with `ledger init`")]
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
    #[error("agent {agent:?} is held by {holder:?} (epoch {epoch}): stop every host before the import")]
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
    /// Imports `records`, every record of an unprotected ledger (read whole, verified, with no
    /// writer), into this protected ledger as records of this device, in the order of their
    /// stamps, then a record that ends the import; then, for each agent, raises the
    /// coordinator's epoch floor to the agent's fencing epoch and publishes this device's log
    /// through the import as the agent's hand-off frontier (under a lease taken and given back
    /// at once). Run again, an import found whole publishes the frontiers again and copies
    /// nothing.
    ///
    /// # Errors
    /// [`LedgerError::NotProtected`] on a ledger that is not protected; [`LedgerError::Import`]
    /// when the records are sealed, this ledger holds other records, or the coordinator holds
    /// another ledger's frontiers or a live lease of one of the agents (nothing copied); the
    /// relay's errors while copying (a part may be copied: the import is then refused on this
    /// ledger, start over with a new one).
    pub fn import(
        &mut self,
        mut records: Vec<OpRecord>,
        coordinator: &dyn LeaseCoordinator,
        ttl_ms: u64,
    ) -> Result<Imported, LedgerError> {
        if self.protected.is_none() {
            return Err(LedgerError::NotProtected);
        }
        if records.iter().any(|op| op.surface == Surface::Sealed) {
            return Err(ImportError::SourceProtected.into());
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
            .collect();
        self.check_coordinator(&agents, coordinator, already)?;
        let copied = if already {
            0
        } else {
            self.copy_records(&records, &digest)?
        };
        self.publish_imported(&agents, coordinator, ttl_ms)?;
        Ok(Imported {
            records: copied,
            agents: agents.into_iter().collect(),
            already,
            digest,
        })
    }

    /// Refuses an import onto a coordinator where an agent's lease is live or its published
    /// frontier names anything but what this import publishes (`already`: it was made before),
    /// this device's log through its last record, named by its id. (Found trying it: the old
    /// ledger's coordinator names this device too, at a count of the old log.)
    fn check_coordinator(
        &self,
        agents: &BTreeSet<String>,
        coordinator: &dyn LeaseCoordinator,
        already: bool,
    ) -> Result<(), LedgerError> {
        let own = self.imported_frontier();
        let device = self.device_id();
        let failed = |agent: &str, error: crate::lease::LeaseError| ImportError::Coordinator {
            agent: agent.to_owned(),
            detail: error.to_string(),
        };
        let now_ms = (self.wall_clock)();
        for agent in agents {
            let frontier = coordinator
                .published_frontier(agent)
                .map_err(|error| failed(agent, error))?;
            let foreign = frontier.iter().find(|&(named, next)| {
                !(already
                    && named == device
                    && next == own.next_seq(device)
                    && frontier.head(device) == own.head(device))
            });
            if let Some((device, _)) = foreign {
                return Err(ImportError::FrontierPublished {
                    agent: agent.clone(),
                    device: device.to_owned(),
                }
                .into());
            }
            let lease = coordinator.current(agent).map_err(|error| failed(agent, error))?;
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

    /// Appends `records` as this device's, a few thousand at a time, the last append ending
    /// with the import's record; returns how many were copied.
    fn copy_records(&mut self, records: &[OpRecord], digest: &str) -> Result<u64, LedgerError> {
        let end = (
            Surface::registry(IMPORT_REGISTRY),
            serde_json::json!({ "key": digest, "records": records.len() }),
        );
        let mut copied = 0u64;
        let mut chunks = records.chunks(RECORDS_PER_APPEND).peekable();
        if chunks.peek().is_none() {
            self.unsent.push(end.clone());
        }
        while let Some(chunk) = chunks.next() {
            for op in chunk {
                let payload = op.payload.value().into_owned();
                // A record no log holds is refused before anything is written for it.
                self.log.clone().try_append(op.surface.clone(), payload.clone())?;
                self.unsent.push((op.surface.clone(), payload));
            }
            if chunks.peek().is_none() {
                self.unsent.push(end.clone());
            }
            self.write_queued()?;
            copied += chunk.len() as u64;
        }
        if records.is_empty() {
            self.write_queued()?;
        }
        tracing::info!(records = copied, "imported the records of an unprotected ledger");
        Ok(copied)
    }

    /// For each agent: the epoch floor raised to its fencing epoch, then a lease taken, this
    /// device's log published as its frontier, and the lease given back.
    fn publish_imported(
        &self,
        agents: &BTreeSet<String>,
        coordinator: &dyn LeaseCoordinator,
        ttl_ms: u64,
    ) -> Result<(), LedgerError> {
        let device = self.device_id();
        let frontier = self.imported_frontier();
        for agent in agents {
            let failed = |error: crate::lease::LeaseError| ImportError::Coordinator {
                agent: agent.clone(),
                detail: error.to_string(),
            };
            coordinator
                .raise_epoch_floor(agent, self.state().fencing_epoch(agent))
                .map_err(failed)?;
            let lease = coordinator.acquire(agent, device, ttl_ms).map_err(failed)?;
            coordinator
                .release_publishing(agent, device, lease.epoch, &frontier)
                .map_err(failed)?;
            // A publication that failed is no error of the release: read back.
            let published = coordinator.published_frontier(agent).map_err(failed)?;
            if published.next_seq(device) != frontier.next_seq(device)
                || published.head(device) != frontier.head(device)
            {
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

impl Ledger {
    /// The frontier an import publishes: this device's log, through its last record (its id).
    fn imported_frontier(&self) -> Frontier {
        let device = self.device_id();
        let mut frontier = Frontier::new();
        frontier.raise_to(
            device,
            self.view.frontier.next_seq(device),
            self.view.frontier.head(device),
        );
        frontier
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
