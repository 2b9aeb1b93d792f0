//! The network between the sites' relay replicas, and a site's relay over it.

use std::sync::{Arc, Mutex};

use super::Schedule;
use crate::relay::{InMemoryRelay, Relay, RelayError};
use crate::rng::mix;

/// The network between the sites' relay replicas: what each site pushed and when, and how much
/// of it each other site has received. Links delay each record, lose whole sync attempts and
/// are cut by partitions, all drawn from the seed.
pub(super) struct Network {
    pub(super) seed: u64,
    pub(super) max_link_delay_ms: u64,
    pub(super) loss_percent: u64,
    pub(super) schedule: Schedule,
    pub(super) now_ms: u64,
    /// Every link works (the end of the run).
    pub(super) healed: bool,
    /// Per site, every record it appended, with when.
    pub(super) pushed: Vec<Vec<(crate::oplog::OpRecord, u64)>>,
    /// `received[to][from]`: how many of `from`'s records `to`'s replica has.
    pub(super) received: Vec<Vec<usize>>,
}

/// A site's relay: its own replica (which survives its crashes), filled from the other sites'
/// through the [`Network`] whenever the site's ledger pulls. The ledger is the library's
/// [`Ledger`], unchanged; only the relay under it is simulated.
pub(super) struct SiteRelay {
    pub(super) site: usize,
    pub(super) replica: InMemoryRelay,
    pub(super) network: Arc<Mutex<Network>>,
}

impl SiteRelay {
    fn network(&self) -> std::sync::MutexGuard<'_, Network> {
        self.network
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves into the replica what the links to this site let through now.
    fn deliver(&self) {
        let mut network = self.network();
        let now = network.now_ms;
        for origin in 0..network.pushed.len() {
            if origin == self.site {
                continue;
            }
            let link = mix(network.seed ^ mix(now) ^ ((origin as u64) << 32 | self.site as u64));
            if !network.healed
                && (network.schedule.partitioned(origin, self.site, now) || link % 100 < network.loss_percent)
            {
                continue;
            }
            let from = network.received[self.site][origin];
            let ready: Vec<_> = network.pushed[origin][from..]
                .iter()
                .take_while(|(op, pushed_ms)| {
                    let delay =
                        mix(network.seed ^ op.seq ^ ((origin as u64) << 40) ^ ((self.site as u64) << 48))
                            % network.max_link_delay_ms.max(1);
                    network.healed || pushed_ms + delay <= now
                })
                .map(|(op, _)| op.clone())
                .collect();
            if ready.is_empty() {
                continue;
            }
            network.received[self.site][origin] += ready.len();
            if let Err(error) = self.replica.push(&ready) {
                unreachable!("a site's records continue their chain: {error}");
            }
        }
    }
}

impl Relay for SiteRelay {
    fn push(&self, ops: &[crate::oplog::OpRecord]) -> Result<crate::relay::PushReport, RelayError> {
        self.replica.push(ops)
    }

    fn pull(&self, since: &crate::relay::Frontier) -> Result<crate::relay::PullBatch, RelayError> {
        self.deliver();
        self.replica.pull(since)
    }

    fn append(
        &self,
        device_id: &str,
        since_seq: u64,
        make: &mut crate::relay::MakeRecords<'_>,
    ) -> Result<crate::relay::Appended, RelayError> {
        let appended = self.replica.append(device_id, since_seq, make)?;
        let mut network = self.network();
        let now = network.now_ms;
        let site = self.site;
        network.pushed[site].extend(appended.appended.iter().map(|op| (op.clone(), now)));
        network.received[site][site] = network.pushed[site].len();
        Ok(appended)
    }
}
