//! The faults of a seed, drawn before the run so that every guard mode faces the same schedule.

use serde::Serialize;

use super::SimConfig;
use crate::rng::Rng;

/// A fault, for the report and the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// A site stops for `duration_ms`.
    Pause {
        /// The site.
        site: usize,
        /// When (true time).
        at_ms: u64,
        /// For how long.
        duration_ms: u64,
    },
    /// A site crashes and restarts after `down_ms`.
    Crash {
        /// The site.
        site: usize,
        /// When.
        at_ms: u64,
        /// Down for how long.
        down_ms: u64,
    },
    /// The sites in `side` cannot exchange records with the others.
    Partition {
        /// When it starts.
        at_ms: u64,
        /// When it heals.
        until_ms: u64,
        /// The sites on one side.
        side: Vec<usize>,
    },
    /// The coordinator forgets every lease.
    CoordinatorLoss {
        /// When.
        at_ms: u64,
    },
}

impl Fault {
    /// When the fault begins.
    pub fn at_ms(&self) -> u64 {
        match self {
            Fault::Pause { at_ms, .. }
            | Fault::Crash { at_ms, .. }
            | Fault::Partition { at_ms, .. }
            | Fault::CoordinatorLoss { at_ms } => *at_ms,
        }
    }
}

/// The faults of one seed, the same for every mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Schedule {
    /// Each site's clock offset.
    pub skew_ms: Vec<i64>,
    /// The faults, by time.
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// Draws the faults of `config.seed`.
    pub fn new(config: &SimConfig) -> Self {
        let mut rng = Rng::new(config.seed);
        let sites = config.sites.max(1);
        let skew_ms = (0..sites)
            .map(|_| rng.below(2 * config.max_skew_ms + 1) as i64 - config.max_skew_ms as i64)
            .collect();
        let mut faults = Vec::new();
        let run = config.run_ms.max(1);
        for _ in 0..config.pauses {
            let duration_ms = rng.between(config.ttl_ms + 1, config.ttl_ms * 4);
            faults.push(Fault::Pause {
                site: rng.below(sites as u64) as usize,
                at_ms: rng.below(run),
                duration_ms,
            });
        }
        for _ in 0..config.crashes {
            faults.push(Fault::Crash {
                site: rng.below(sites as u64) as usize,
                at_ms: rng.below(run),
                down_ms: rng.between(config.ttl_ms, config.ttl_ms * 3),
            });
        }
        for _ in 0..config.partitions {
            let at_ms = rng.below(run);
            let until_ms = (at_ms + rng.between(500, 4_000)).min(run);
            let mut side: Vec<usize> = (0..sites).filter(|_| rng.below(2) == 0).collect();
            if side.is_empty() || side.len() == sites {
                side = vec![rng.below(sites as u64) as usize];
            }
            faults.push(Fault::Partition {
                at_ms,
                until_ms,
                side,
            });
        }
        if config.coordinator_loss {
            faults.push(Fault::CoordinatorLoss {
                at_ms: rng.between(run / 4, run * 3 / 4 + 1),
            });
        }
        faults.sort_by_key(Fault::at_ms);
        Self { skew_ms, faults }
    }

    pub(super) fn partitioned(&self, a: usize, b: usize, at_ms: u64) -> bool {
        self.faults.iter().any(|fault| match fault {
            Fault::Partition {
                at_ms: from,
                until_ms,
                side,
            } if (*from..*until_ms).contains(&at_ms) => side.contains(&a) != side.contains(&b),
            _ => false,
        })
    }
}
