//! A deterministic chaos simulation of the whole protocol, to show what each layer prevents.
//!
//! One thread, simulated time, one seed: `sites` sites fire the scheduled occurrences of `agents`
//! agents (deterministic run ids, so every site names each occurrence the same way), through one
//! coordinator and a relay whose links delay, lose and partition. Faults, all drawn from the seed
//! before the run so that every [`GuardMode`] faces the same schedule:
//!
//! * **pauses** longer than the TTL, at any point, including between the fence and the effect and
//!   between the effect and its `committed` record;
//! * **clock skew**: each site's clock is off by a constant up to `max_skew_ms`;
//! * **crashes**: a site loses its memory (lease, ledger object) and restarts from what the relay
//!   holds of its log; an effect on its way reaches the resource or not, and no outcome is
//!   recorded, so its run is in doubt;
//! * **coordinator state loss**: the coordinator forgets every lease; sites raise its epoch floor from
//!   their ledgers before acquiring (rule L5), and from a resource's highest epoch when it refuses
//!   a token;
//! * **partitions** that split the sites in two and heal.
//!
//! After `run_ms` every fault has ended; the simulation runs `settle_ms` more, syncs every site with
//! every other, and checks that all folded ledgers have the same `state_hash`.
//!
//! The sites run the shipped code, not a model of it: in modes `fence` and `token` each
//! occurrence is a [`RunSession`](crate::session::RunSession), the machine `fencepost run` and
//! [`run_once`](crate::run::run_once) drive (one session at a time per site, `run_wait_ms` its
//! wait); a site's lease is the keeper's [`Acquisition`](crate::keeper::Acquisition) and
//! [`Renewal`](crate::keeper::Renewal) machines (timing from [`SimConfig::keeper_config`]),
//! driven in simulated time; its ledger is a [`Ledger`](crate::ledger::Ledger) over a simulated
//! relay (a replica of its own that the network fills); it dispatches through
//! [`Ledger::begin`](crate::ledger::Ledger::begin) and
//! [`Permit::finish`](crate::dispatch::Permit::finish). The simulator holds only the world: time, faults, the network, the coordinator's storage and the
//! resource, and the bookkeeping that attributes duplicates.
//!
//! Guard modes, compared on the same seed ([`compare`]): `none` (every site fires every
//! occurrence), `lease` (the holder of the agent's lease fires its backlog, nothing else),
//! `fence` (lease, then the dispatch steps; a run in doubt is settled by an operator who checks the
//! resource once the attempt's lease has ended, [`Ledger::resolve`](crate::ledger::Ledger::resolve)) and `token` (fence, and a
//! resource that refuses a stale fencing token and an already-applied run id, as an API with
//! idempotency keys does; runs in doubt are retried). Every duplicate effect is attributed to a
//! [`Cause`].

use std::collections::BTreeMap;

use serde::Serialize;

mod attribution;
mod counted;
mod faults;
mod network;
mod render;
mod session;
mod world;

pub use faults::{Fault, Schedule};
pub use render::{cause_name, render_svg, render_table};
pub use world::run;

use crate::keeper::KeeperConfig;

/// What guards a site's effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardMode {
    /// Every site fires every occurrence.
    None,
    /// The lease holder fires; no ledger check, no fence.
    Lease,
    /// Lease, `pending` intent, dispatch fence.
    Fence,
    /// Fence, and a resource that checks fencing tokens and run ids.
    Token,
}

impl GuardMode {
    /// Every mode, weakest first.
    pub const ALL: [GuardMode; 4] = [
        GuardMode::None,
        GuardMode::Lease,
        GuardMode::Fence,
        GuardMode::Token,
    ];

    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            GuardMode::None => "none",
            GuardMode::Lease => "lease",
            GuardMode::Fence => "fence",
            GuardMode::Token => "token",
        }
    }
}

/// Why an effect was a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Nothing guarded the effect (mode `none`).
    NoGuard,
    /// A lease holder acted on its own backlog, with no ledger check or fence (mode `lease`).
    NoFence,
    /// A site passed the fence, paused, and its effect landed after its lease had gone (one of the
    /// two effects of the duplicate was such a zombie).
    PauseAfterFence,
    /// A site passed the fence and the coordinator lost its state while the effect was in flight,
    /// so another site was granted the agent before the effect landed: the same window as a pause,
    /// opened by a coordinator fail-over instead.
    LeaseLostInFlight,
    /// The site held the lease and passed the fence, but an earlier attempt's `committed` (or its
    /// `pending`, when that attempt's site died mid-effect) had not reached its ledger through the
    /// relay yet. Rule H3 makes the new holder wait for what its predecessors published, so this
    /// stays at 0 unless the protocol has a hole.
    LedgerLag,
    /// As `LedgerLag`, but the earlier attempt was published to a coordinator state that was lost
    /// since (a fail-over to a replica without it, a wiped store): the new holder had nothing to
    /// wait for. A durable coordinator keeps the published frontier (rule H4).
    FrontierLost,
    /// None of the above: a bug in the protocol or the simulator.
    Unexplained,
}

/// The simulation's parameters. [`SimConfig::new`] gives the defaults for a seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimConfig {
    /// The seed every random choice comes from.
    pub seed: u64,
    /// How many sites.
    pub sites: usize,
    /// How many agents (each with its own lease and occurrences).
    pub agents: usize,
    /// How long occurrences are scheduled and faults happen.
    pub run_ms: u64,
    /// How long the simulation runs after every fault has ended.
    pub settle_ms: u64,
    /// The period of each agent's occurrences.
    pub occurrence_every_ms: u64,
    /// The lease TTL; every other timing of a site's lease comes from
    /// [`KeeperConfig::new`] of it (renew every third, give up at two thirds, retry every
    /// twelfth, try to acquire every quarter), as for a [`LeaseKeeper`](crate::keeper::LeaseKeeper).
    pub ttl_ms: u64,
    /// The simulation step.
    pub step_ms: u64,
    /// How often each site syncs its ledger with the relay.
    pub sync_every_ms: u64,
    /// The largest delay of a record on its way to another site.
    pub max_link_delay_ms: u64,
    /// The chance, in percent, that one sync attempt on a link is lost.
    pub loss_percent: u64,
    /// How many pauses (each longer than the TTL).
    pub pauses: usize,
    /// How many crashes.
    pub crashes: usize,
    /// How many partitions.
    pub partitions: usize,
    /// The largest clock offset of a site.
    pub max_skew_ms: u64,
    /// How long an effect takes from the fence to landing at the resource.
    pub effect_ms: u64,
    /// How long a site's run session waits, all told, for the lease and then for its ledger
    /// (`fencepost run --wait`); one that runs out is followed by another.
    pub run_wait_ms: u64,
    /// Whether the coordinator loses its state once during the run.
    pub coordinator_loss: bool,
    /// Run the coordinator as SQLite databases in this folder (one per coordinator state; feature
    /// `sqlite`) instead of in memory. Not part of the report: effects, duplicates, losses and doubts
    /// are the same; refusals may differ (a new SQLite database mints epochs from the clock, a new
    /// in-memory coordinator from the floor the ledgers raise).
    #[serde(skip)]
    pub sqlite_folder: Option<std::path::PathBuf>,
}

impl SimConfig {
    /// The timing of every site's lease: the keeper's, from [`ttl_ms`](Self::ttl_ms).
    pub fn keeper_config(&self) -> KeeperConfig {
        KeeperConfig::new(self.ttl_ms)
    }

    /// 3 sites, 2 agents, 20 s of faults (4 pauses, 2 crashes, 2 partitions, one coordinator state
    /// loss, skew up to 150 ms, 15 % loss, delays up to 400 ms), occurrences every second, TTL 600
    /// ms, 15 s to settle.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            sites: 3,
            agents: 2,
            run_ms: 20_000,
            settle_ms: 15_000,
            occurrence_every_ms: 1_000,
            ttl_ms: 600,
            step_ms: 10,
            sync_every_ms: 50,
            max_link_delay_ms: 400,
            loss_percent: 15,
            pauses: 4,
            crashes: 2,
            partitions: 2,
            max_skew_ms: 150,
            effect_ms: 40,
            run_wait_ms: 2_000,
            coordinator_loss: true,
            sqlite_folder: None,
        }
    }
}

/// One effect that landed at the resource, for the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Effect {
    /// The site.
    pub site: usize,
    /// The agent.
    pub agent: usize,
    /// The occurrence.
    pub occurrence: u64,
    /// The epoch it ran under (0 in mode `none`).
    pub epoch: u64,
    /// When it landed.
    pub at_ms: u64,
    /// Why it was a duplicate, if it was.
    pub duplicate: Option<Cause>,
}

/// An effect the resource refused (`token` mode), for the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedEffect {
    /// The site whose effect it was.
    pub site: usize,
    /// The agent.
    pub agent: usize,
    /// The occurrence.
    pub occurrence: u64,
    /// The epoch of its token.
    pub epoch: u64,
    /// When it reached the resource.
    pub at_ms: u64,
    /// Why: `stale_epoch` (a newer token was seen), `already_applied` (the run id was applied
    /// before: a duplicate stopped) or `unknown_epoch` (an epoch no coordinator minted).
    pub reason: &'static str,
}

/// A span of time a site held an agent's lease (by its own view), for the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenure {
    /// The site.
    pub site: usize,
    /// The agent.
    pub agent: usize,
    /// The epoch.
    pub epoch: u64,
    /// From.
    pub from_ms: u64,
    /// Until.
    pub until_ms: u64,
}

/// What one mode did on one seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModeReport {
    /// The mode.
    pub mode: GuardMode,
    /// Occurrences scheduled.
    pub occurrences: u64,
    /// Effects that landed.
    pub effects: u64,
    /// Effects beyond the first of their occurrence.
    pub duplicates: u64,
    /// Duplicates by cause.
    pub duplicates_by_cause: BTreeMap<Cause, u64>,
    /// Occurrences that never ran, after healing and settling.
    pub never_executed: u64,
    /// Runs still in doubt at the end (a `pending` without outcome).
    pub in_doubt: u64,
    /// Runs in doubt that a site dispatched again on purpose (`token` mode: the resource makes a
    /// second attempt harmless).
    pub in_doubt_retried: u64,
    /// Runs in doubt that an operator settled after checking the resource (`fence` mode).
    pub in_doubt_resolved: u64,
    /// Dispatches the fence refused (the site no longer held the lease at its epoch).
    pub refused_at_fence: u64,
    /// Effects the resource refused (a stale token, or a run it had applied).
    pub refused_at_resource: u64,
    /// Whether every site's folded ledger has the same `state_hash` at the end.
    pub converged: bool,
    /// How long each wait of a new holder for its ledger lasted (rule H3: the dispatches it
    /// refused with `LedgerBehind`, what `fencepost run` exits 7 for when `--wait` runs out), in
    /// ms: until the ledger had caught up, or until the tenure ended.
    pub ledger_wait_ms: Vec<u64>,
    /// The coordinator calls the sites made, by method.
    pub coordinator_calls: BTreeMap<String, u64>,
    /// Every effect, in order.
    #[serde(skip)]
    pub effect_log: Vec<Effect>,
    /// Every lease tenure, in order.
    #[serde(skip)]
    pub tenures: Vec<Tenure>,
    /// Every effect the resource refused, in order (`token` mode).
    #[serde(skip)]
    pub refusal_log: Vec<RefusedEffect>,
}

/// Every mode on one seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimReport {
    /// The parameters.
    pub config: SimConfig,
    /// The faults.
    pub schedule: Schedule,
    /// One report per mode, weakest first.
    pub modes: Vec<ModeReport>,
}

/// Runs every [`GuardMode`] on `config`'s seed and schedule.
pub fn compare(config: &SimConfig) -> SimReport {
    let schedule = Schedule::new(config);
    SimReport {
        config: config.clone(),
        modes: GuardMode::ALL
            .iter()
            .map(|mode| run(config, &schedule, *mode))
            .collect(),
        schedule,
    }
}
