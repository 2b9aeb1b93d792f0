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
//! The sites run the shipped code, not a model of it: each site's lease is the keeper's
//! [`Acquisition`] and [`Renewal`] machines (timing from [`SimConfig::keeper_config`]), driven in
//! simulated time; its ledger is a [`Ledger`] over a simulated relay (a replica of its own that
//! the network fills); it dispatches through [`Ledger::begin`] and [`Permit::finish`]. The
//! simulator holds only the world: time, faults, the network, the coordinator's storage and the
//! resource, and the bookkeeping that attributes duplicates.
//!
//! Guard modes, compared on the same seed ([`compare`]): `none` (every site fires every
//! occurrence), `lease` (the holder of the agent's lease fires its backlog, nothing else),
//! `fence` (lease, then the dispatch steps; a run in doubt is settled by an operator who checks the
//! resource once the attempt's lease has ended, [`Ledger::resolve`]) and `token` (fence, and a
//! resource that refuses a stale fencing token and an already-applied run id, as an API with
//! idempotency keys does; runs in doubt are retried). Every duplicate effect is attributed to a
//! [`Cause`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::clock::ManualClock;
use crate::dispatch::{
    DispatchError, DispatchOptions, FencedResource, FencingToken, Ledger, Permit, Refusal, ResourceRefusal,
    RunOutcome,
};
use crate::fence::Holder;
use crate::keeper::{AcquirePlan, AcquireStep, Acquisition, KeeperConfig, Renewal, RenewalStep};
use crate::lease::{InMemoryLeaseCoordinator, Intent, IntentStatus, LeaseCoordinator};
use crate::relay::{InMemoryRelay, Relay, RelayError};
use crate::rng::{mix, Rng};
use crate::run_id::deterministic_run_id;

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
    /// relay yet.
    LedgerLag,
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
    /// Whether the coordinator loses its state once during the run.
    pub coordinator_loss: bool,
    /// Run the coordinator as SQLite databases in this folder (one per coordinator state; feature
    /// `sqlite`) instead of in memory. Not part of the report: the outcome is the same.
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
            coordinator_loss: true,
            sqlite_folder: None,
        }
    }
}

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

    fn partitioned(&self, a: usize, b: usize, at_ms: u64) -> bool {
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
    /// Every effect, in order.
    #[serde(skip)]
    pub effect_log: Vec<Effect>,
    /// Every lease tenure, in order.
    #[serde(skip)]
    pub tenures: Vec<Tenure>,
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

/// A site's lease of one agent: the library's machines, driven in simulated time.
#[derive(Debug, Clone)]
enum LeaseState {
    /// Not held; the next [`Acquisition`] starts at `next_try_local_ms` (site clock).
    Idle { next_try_local_ms: u64 },
    /// Held, by the [`Renewal`] machine's view.
    Holding { renewal: Renewal, since_ms: u64 },
}

/// The holder a site dispatches as: its lease of the agent, by its [`Renewal`] machine.
struct SimHolder<'a> {
    coordinator: &'a dyn LeaseCoordinator,
    agent_id: String,
    device_id: &'a str,
    epoch: u64,
    holds: bool,
}

impl Holder for SimHolder<'_> {
    fn agent_id(&self) -> &str {
        &self.agent_id
    }
    fn device_id(&self) -> &str {
        self.device_id
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn holds(&self) -> bool {
        self.holds
    }
    fn coordinator(&self) -> &dyn LeaseCoordinator {
        self.coordinator
    }
}

/// An effect between the fence and the resource.
#[derive(Debug)]
struct InFlight {
    agent: usize,
    occurrence: u64,
    run_id: String,
    epoch: u64,
    /// The ledger's permit (modes `fence` and `token`).
    permit: Option<Permit>,
    land_at_ms: u64,
    /// The run had committed somewhere the site's ledger had not heard of, at the fence.
    lagging: bool,
    /// The site paused while the effect was in flight.
    paused: bool,
}

/// The network between the sites' relay replicas: what each site pushed and when, and how much
/// of it each other site has received. Links delay each record, lose whole sync attempts and
/// are cut by partitions, all drawn from the seed.
struct Network {
    seed: u64,
    max_link_delay_ms: u64,
    loss_percent: u64,
    schedule: Schedule,
    now_ms: u64,
    /// Every link works (the end of the run).
    healed: bool,
    /// Per site, every record it appended, with when.
    pushed: Vec<Vec<(crate::oplog::OpRecord, u64)>>,
    /// `received[to][from]`: how many of `from`'s records `to`'s replica has.
    received: Vec<Vec<usize>>,
}

/// A site's relay: its own replica (which survives its crashes), filled from the other sites'
/// through the [`Network`] whenever the site's ledger pulls. The ledger is the library's
/// [`Ledger`], unchanged; only the relay under it is simulated.
struct SiteRelay {
    site: usize,
    replica: InMemoryRelay,
    network: Arc<Mutex<Network>>,
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

struct Site {
    name: String,
    clock: ManualClock,
    skew_ms: i64,
    relay: Arc<SiteRelay>,
    ledger: Option<Ledger>,
    leases: Vec<LeaseState>,
    /// Per agent, the next occurrence to trigger.
    next_occurrence: Vec<u64>,
    /// Occurrences triggered here and not settled here.
    backlog: BTreeSet<(usize, u64)>,
    in_flight: Option<InFlight>,
    paused_until_ms: u64,
    down_until_ms: u64,
    crash_pending: bool,
    next_sync_local_ms: u64,
}

impl Site {
    /// Opens the site's ledger from what its relay replica holds (at start, and after a crash).
    fn open_ledger(&mut self) {
        let ledger = Ledger::open(
            &self.name,
            self.clock.wall_clock(),
            self.relay.clone() as Arc<dyn Relay>,
        )
        .unwrap_or_else(|error| unreachable!("a site's own replica verifies: {error}"));
        self.ledger = Some(ledger);
    }
}

struct World<'a> {
    config: &'a SimConfig,
    mode: GuardMode,
    keeper: KeeperConfig,
    now_ms: u64,
    coordinator_clock: ManualClock,
    coordinator: Box<dyn LeaseCoordinator>,
    /// How many times the coordinator lost its state.
    generation: u32,
    sites: Vec<Site>,
    network: Arc<Mutex<Network>>,
    /// Runs committed anywhere, by the time they were.
    committed: BTreeSet<String>,
    /// Runs some site began (its `pending` stored), by the time they were.
    begun: BTreeSet<String>,
    /// Per run, the effects that landed (in every mode: what the duplicates are counted from).
    applied: BTreeMap<(usize, u64), u64>,
    /// In `token` mode, the resource: the library's [`FencedResource`], which checks the token's
    /// epoch and its run id.
    resource: FencedResource<(usize, u64)>,
    /// Per occurrence, how the first of its effects that landed without a lease had lost it.
    stale_landings: BTreeMap<(usize, u64), Cause>,
    report: ModeReport,
}

fn agent_name(agent: usize) -> String {
    format!("agent-{agent}")
}

fn run_id(agent: usize, occurrence: u64) -> String {
    deterministic_run_id(&agent_name(agent), "scheduled job", &occurrence.to_string())
        .unwrap_or_else(|_| unreachable!("the simulator's ids contain no separator"))
}

/// A coordinator with no state: in memory, or a new SQLite database when the config names a folder.
fn new_coordinator(
    config: &SimConfig,
    clock: &ManualClock,
    mode: GuardMode,
    generation: u32,
) -> Box<dyn LeaseCoordinator> {
    #[cfg(feature = "sqlite")]
    if let Some(folder) = &config.sqlite_folder {
        let path = folder.join(format!("seed-{}-{}-{generation}.db", config.seed, mode.name()));
        let _ = std::fs::remove_file(&path);
        match crate::backend::sqlite::SqliteLeaseCoordinator::open(&path, clock.wall_clock()) {
            Ok(coordinator) => return Box::new(coordinator),
            Err(error) => tracing::error!(%error, "cannot open the SQLite coordinator; simulating in memory"),
        }
    }
    let _ = (config, mode, generation);
    Box::new(InMemoryLeaseCoordinator::new(clock.wall_clock()))
}

/// Runs one mode on a schedule.
pub fn run(config: &SimConfig, schedule: &Schedule, mode: GuardMode) -> ModeReport {
    let occurrences_per_agent = config.run_ms.div_ceil(config.occurrence_every_ms.max(1));
    let coordinator_clock = ManualClock::new(0);
    let site_count = config.sites.max(1);
    let network = Arc::new(Mutex::new(Network {
        seed: config.seed,
        max_link_delay_ms: config.max_link_delay_ms,
        loss_percent: config.loss_percent,
        schedule: schedule.clone(),
        now_ms: 0,
        healed: false,
        pushed: vec![Vec::new(); site_count],
        received: vec![vec![0; site_count]; site_count],
    }));
    let sites = (0..site_count)
        .map(|index| {
            let mut site = Site {
                name: format!("site-{index}"),
                clock: ManualClock::new(0),
                skew_ms: schedule.skew_ms.get(index).copied().unwrap_or(0),
                relay: Arc::new(SiteRelay {
                    site: index,
                    replica: InMemoryRelay::new(),
                    network: Arc::clone(&network),
                }),
                ledger: None,
                leases: vec![LeaseState::Idle { next_try_local_ms: 0 }; config.agents],
                next_occurrence: vec![0; config.agents],
                backlog: BTreeSet::new(),
                in_flight: None,
                paused_until_ms: 0,
                down_until_ms: 0,
                crash_pending: false,
                next_sync_local_ms: 0,
            };
            site.open_ledger();
            site
        })
        .collect();
    let mut world = World {
        config,
        mode,
        keeper: config.keeper_config(),
        now_ms: 0,
        coordinator: new_coordinator(config, &coordinator_clock, mode, 0),
        generation: 0,
        coordinator_clock,
        sites,
        network,
        committed: BTreeSet::new(),
        begun: BTreeSet::new(),
        applied: BTreeMap::new(),
        resource: FencedResource::new(),
        stale_landings: BTreeMap::new(),
        report: ModeReport {
            mode,
            occurrences: occurrences_per_agent * config.agents as u64,
            effects: 0,
            duplicates: 0,
            duplicates_by_cause: BTreeMap::new(),
            never_executed: 0,
            in_doubt: 0,
            in_doubt_retried: 0,
            in_doubt_resolved: 0,
            refused_at_fence: 0,
            refused_at_resource: 0,
            converged: false,
            effect_log: Vec::new(),
            tenures: Vec::new(),
        },
    };
    let end_ms = config.run_ms + config.settle_ms;
    let mut next_fault = 0;
    while world.now_ms < end_ms {
        world.coordinator_clock.set(world.now_ms);
        world.network().now_ms = world.now_ms;
        while let Some(fault) = schedule.faults.get(next_fault) {
            if fault.at_ms() > world.now_ms {
                break;
            }
            world.begin_fault(fault);
            next_fault += 1;
        }
        for site in 0..world.sites.len() {
            world.step(site, occurrences_per_agent);
        }
        world.now_ms += config.step_ms.max(1);
    }
    world.finish(occurrences_per_agent)
}

impl World<'_> {
    fn network(&self) -> std::sync::MutexGuard<'_, Network> {
        self.network
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn begin_fault(&mut self, fault: &Fault) {
        match fault {
            Fault::Pause {
                site, duration_ms, ..
            } => {
                let site = &mut self.sites[*site];
                site.paused_until_ms = site.paused_until_ms.max(self.now_ms + duration_ms);
                if let Some(flight) = site.in_flight.as_mut() {
                    flight.paused = true;
                }
            }
            Fault::Crash { site, down_ms, .. } => {
                let site = &mut self.sites[*site];
                site.crash_pending = true;
                site.down_until_ms = site.down_until_ms.max(self.now_ms + down_ms);
            }
            Fault::Partition { .. } => {}
            Fault::CoordinatorLoss { .. } => {
                self.generation += 1;
                self.coordinator =
                    new_coordinator(self.config, &self.coordinator_clock, self.mode, self.generation);
            }
        }
    }

    fn local_ms(&self, site: usize) -> u64 {
        self.now_ms.saturating_add_signed(self.sites[site].skew_ms)
    }

    fn end_tenure(&mut self, site: usize, agent: usize) {
        let state = std::mem::replace(
            &mut self.sites[site].leases[agent],
            LeaseState::Idle { next_try_local_ms: 0 },
        );
        if let LeaseState::Holding { renewal, since_ms } = state {
            self.report.tenures.push(Tenure {
                site,
                agent,
                epoch: renewal.epoch(),
                from_ms: since_ms,
                until_ms: self.now_ms,
            });
        }
    }

    fn step(&mut self, index: usize, occurrences_per_agent: u64) {
        let now = self.now_ms;
        if self.sites[index].crash_pending {
            // The crash: memory is gone; what was pushed to the relay stays. An effect on its way
            // reached the resource or not (drawn from the seed); either way no outcome is
            // recorded: the run is in doubt (rule D2).
            self.sites[index].crash_pending = false;
            if let Some(mut flight) = self.sites[index].in_flight.take() {
                if mix(self.config.seed ^ mix(now) ^ flight.occurrence ^ ((index as u64) << 32))
                    .is_multiple_of(2)
                {
                    self.deliver_effect(index, &flight);
                }
                // The process is gone: its permit ends with it, recording nothing.
                drop(flight.permit.take());
            }
            for agent in 0..self.config.agents {
                self.end_tenure(index, agent);
            }
            self.sites[index].ledger = None;
        }
        let site = &self.sites[index];
        if now < site.paused_until_ms || (site.ledger.is_none() && now < site.down_until_ms) {
            return;
        }
        let local = self.local_ms(index);
        self.sites[index].clock.set(local);
        if self.sites[index].ledger.is_none() {
            self.sites[index].open_ledger();
        }
        self.land(index);
        if local >= self.sites[index].next_sync_local_ms {
            if let Some(ledger) = self.sites[index].ledger.as_mut() {
                let _ = ledger.sync();
            }
            self.sites[index].next_sync_local_ms = local + self.config.sync_every_ms;
        }
        if self.mode != GuardMode::None {
            for agent in 0..self.config.agents {
                self.keep_lease(index, agent, local);
            }
        }
        // Triggers, by the site's own clock.
        for agent in 0..self.config.agents {
            loop {
                let occurrence = self.sites[index].next_occurrence[agent];
                if occurrence >= occurrences_per_agent || occurrence * self.config.occurrence_every_ms > local
                {
                    break;
                }
                self.sites[index].backlog.insert((agent, occurrence));
                self.sites[index].next_occurrence[agent] += 1;
            }
        }
        if self.sites[index].in_flight.is_none() {
            self.work(index, local);
        }
    }

    /// Drives the site's lease of `agent`: the keeper's [`Renewal`] machine while held, a new
    /// [`Acquisition`] (one attempt, raising the floor from the ledger first) every
    /// `acquire_every_ms` while not. Coordinator calls answer at once in simulated time.
    fn keep_lease(&mut self, index: usize, agent: usize, local: u64) {
        let name = agent_name(agent);
        let device = self.sites[index].name.clone();
        match &mut self.sites[index].leases[agent] {
            LeaseState::Holding { renewal, .. } => loop {
                match renewal.step(local) {
                    RenewalStep::Renew { epoch, ttl_ms } => {
                        let outcome = self.coordinator.renew(&name, &device, epoch, ttl_ms);
                        renewal.answered(local, outcome);
                    }
                    RenewalStep::Lost(_) => {
                        self.end_tenure(index, agent);
                        return;
                    }
                    _ => return,
                }
            },
            LeaseState::Idle { next_try_local_ms } => {
                if local < *next_try_local_ms {
                    return;
                }
                *next_try_local_ms = local + self.keeper.acquire_every_ms;
            }
        }
        let ledger_epoch = self.sites[index]
            .ledger
            .as_ref()
            .map_or(0, |ledger| ledger.state().fencing_epoch(&name));
        let mut acquisition = Acquisition::new(
            self.keeper,
            AcquirePlan {
                agent_id: name.clone(),
                ledger_epoch,
                started_ms: local,
                max_wait_ms: 0,
            },
        );
        loop {
            match acquisition.step(local) {
                AcquireStep::RaiseFloor { floor } => {
                    let outcome = self.coordinator.raise_epoch_floor(&name, floor);
                    acquisition.floor_raised(local, outcome);
                }
                AcquireStep::Acquire { ttl_ms } => {
                    let outcome = self.coordinator.acquire(&name, &device, ttl_ms);
                    acquisition.acquired(local, outcome);
                }
                AcquireStep::Granted(renewal) => {
                    self.sites[index].leases[agent] = LeaseState::Holding {
                        renewal,
                        since_ms: self.now_ms,
                    };
                    return;
                }
                _ => return, // not granted: the next acquisition starts acquire_every_ms later
            }
        }
    }

    /// The epoch the site holds `agent` at, by its renewal machine, at `local`.
    fn held_epoch(&self, index: usize, agent: usize, local: u64) -> Option<u64> {
        match &self.sites[index].leases[agent] {
            LeaseState::Holding { renewal, .. } if renewal.holds(local) => Some(renewal.epoch()),
            _ => None,
        }
    }

    /// Starts the next effect of the backlog, if the mode lets it. In modes `fence` and `token`
    /// through the library's dispatch steps ([`Ledger::begin`]); a run in doubt is retried in
    /// `token` mode (the resource makes a second attempt harmless) and settled by an operator in
    /// `fence` mode (who checks the resource once the attempt's lease has ended, then
    /// [`Ledger::resolve`]s it).
    fn work(&mut self, index: usize, local: u64) {
        let items: Vec<(usize, u64)> = self.sites[index].backlog.iter().copied().collect();
        for (agent, occurrence) in items {
            let run_id = run_id(agent, occurrence);
            let name = agent_name(agent);
            let held = self.held_epoch(index, agent, local);
            match self.mode {
                GuardMode::None => {
                    self.start(index, (agent, occurrence), run_id, 0, None);
                    return;
                }
                GuardMode::Lease => {
                    if let Some(epoch) = held {
                        self.start(index, (agent, occurrence), run_id, epoch, None);
                        return;
                    }
                }
                GuardMode::Fence | GuardMode::Token => {
                    let Some(ledger) = self.sites[index].ledger.as_mut() else {
                        return;
                    };
                    if ledger.state().committed_run(&name, &run_id).is_some() {
                        self.sites[index].backlog.remove(&(agent, occurrence));
                        continue;
                    }
                    let Some(epoch) = held else {
                        continue;
                    };
                    let retry = self.mode == GuardMode::Token;
                    let retried = retry && ledger.in_doubt_run(&name, &run_id, epoch).is_some();
                    let site = &mut self.sites[index];
                    let holder = SimHolder {
                        coordinator: &*self.coordinator,
                        agent_id: name.clone(),
                        device_id: &site.name,
                        epoch,
                        holds: true,
                    };
                    let Some(ledger) = site.ledger.as_mut() else {
                        return;
                    };
                    let begun =
                        ledger.begin(&holder, &run_id, DispatchOptions::default().retry_in_doubt(retry));
                    match begun {
                        Ok(permit) => {
                            self.report.in_doubt_retried += u64::from(retried);
                            self.start(index, (agent, occurrence), run_id, epoch, Some(permit));
                            return;
                        }
                        Err(Refusal::AlreadyCommitted { .. }) => {
                            self.sites[index].backlog.remove(&(agent, occurrence));
                        }
                        Err(Refusal::InDoubt { run }) => {
                            self.operator_resolves(index, (agent, occurrence), &run)
                        }
                        Err(Refusal::StaleEpoch { .. } | Refusal::NotHeld { .. }) => {
                            self.report.refused_at_fence += 1;
                            self.end_tenure(index, agent);
                            return;
                        }
                        Err(Refusal::Error(DispatchError::BelowFencingEpoch { .. })) => {
                            // Granted an epoch the ledger has passed (the coordinator lost its
                            // state): give it back; the next acquisition raises the floor.
                            self.report.refused_at_fence += 1;
                            let _ = self.coordinator.release(&name, &self.sites[index].name, epoch);
                            self.end_tenure(index, agent);
                            return;
                        }
                        // Another writer of this device (none here), or a relay failure: later.
                        Err(_) => return,
                    }
                }
            }
        }
    }

    /// The operator of `fence` mode settles a run in doubt once the attempt's lease has ended:
    /// `committed` if the resource shows the effect, `failed` if not (then it runs again).
    fn operator_resolves(&mut self, index: usize, key: (usize, u64), run: &crate::dispatch::InDoubtRun) {
        let name = agent_name(key.0);
        let live = matches!(
            self.coordinator.current(&name),
            Ok(Some(lease)) if lease.holder == run.device_id && lease.epoch == run.epoch
        );
        if live {
            return; // it may still be running: wait
        }
        let outcome = if self.applied.contains_key(&key) {
            RunOutcome::Committed
        } else {
            RunOutcome::Failed
        };
        let Some(ledger) = self.sites[index].ledger.as_mut() else {
            return;
        };
        if ledger.resolve(&name, &run.run_id, outcome).is_ok() {
            self.report.in_doubt_resolved += 1;
            if outcome == RunOutcome::Committed {
                self.committed.insert(run.run_id.clone());
            }
        }
    }

    fn start(&mut self, index: usize, key: (usize, u64), run_id: String, epoch: u64, permit: Option<Permit>) {
        let (agent, occurrence) = key;
        // The site's ledger let the run through although another attempt had begun or
        // committed: what it needed had not reached it through the relay.
        let lagging = permit.is_some() && (self.committed.contains(&run_id) || self.begun.contains(&run_id));
        if permit.is_some() {
            self.begun.insert(run_id.clone());
        }
        self.sites[index].backlog.remove(&key);
        self.sites[index].in_flight = Some(InFlight {
            agent,
            occurrence,
            run_id,
            epoch,
            permit,
            land_at_ms: self.now_ms + self.config.effect_ms,
            lagging,
            paused: false,
        });
    }

    /// Lands the in-flight effect whose time has come (late, after a pause), and records its
    /// outcome: through its permit in modes `fence` and `token`, as a `committed` in mode `lease`.
    fn land(&mut self, index: usize) {
        if self.sites[index]
            .in_flight
            .as_ref()
            .is_none_or(|flight| flight.land_at_ms > self.now_ms)
        {
            return;
        }
        let Some(mut flight) = self.sites[index].in_flight.take() else {
            return;
        };
        let outcome = self.deliver_effect(index, &flight);
        let Some(ledger) = self.sites[index].ledger.as_mut() else {
            return;
        };
        match flight.permit.take() {
            Some(permit) => {
                let _ = permit.finish(ledger, outcome);
            }
            None if self.mode == GuardMode::Lease => {
                let intent = Intent::new(
                    agent_name(flight.agent),
                    flight.run_id.as_str(),
                    flight.epoch,
                    IntentStatus::Committed,
                );
                let _ = ledger.record(&intent);
            }
            None => {}
        }
        if outcome == RunOutcome::Committed {
            self.committed.insert(flight.run_id.clone());
        }
    }

    /// The effect reaches the resource; in `token` mode the resource checks its token.
    fn deliver_effect(&mut self, index: usize, flight: &InFlight) -> RunOutcome {
        let key = (flight.agent, flight.occurrence);
        if self.mode != GuardMode::Token {
            self.apply(index, flight);
            return RunOutcome::Committed;
        }
        let token = FencingToken {
            agent_id: agent_name(flight.agent),
            run_id: flight.run_id.clone(),
            epoch: flight.epoch,
        };
        match self.resource.apply(&token, key) {
            Ok(()) => {
                self.apply(index, flight);
                RunOutcome::Committed
            }
            Err(ResourceRefusal::StaleEpoch { highest_epoch, .. }) => {
                // A stale token: refused. The site learns the highest epoch and gives the
                // lease up.
                self.report.refused_at_resource += 1;
                let _ = self.coordinator.raise_epoch_floor(&token.agent_id, highest_epoch);
                self.end_tenure(index, flight.agent);
                self.sites[index].backlog.insert(key);
                RunOutcome::Failed
            }
            Err(ResourceRefusal::AlreadyApplied { .. }) => {
                // Already applied under this run id: idempotent success.
                self.report.refused_at_resource += 1;
                RunOutcome::Committed
            }
            Err(_) => {
                // An epoch no coordinator minted: refused, nothing applied.
                self.report.refused_at_resource += 1;
                self.sites[index].backlog.insert(key);
                RunOutcome::Failed
            }
        }
    }

    fn apply(&mut self, index: usize, flight: &InFlight) {
        let key = (flight.agent, flight.occurrence);
        let count = self.applied.entry(key).or_insert(0);
        *count += 1;
        let duplicate = *count > 1;
        let stale = match self.mode {
            GuardMode::None | GuardMode::Lease => None,
            GuardMode::Fence | GuardMode::Token => {
                let name = agent_name(flight.agent);
                let still_held = matches!(
                    self.coordinator.current(&name),
                    Ok(Some(lease)) if lease.holder == self.sites[index].name && lease.epoch == flight.epoch
                );
                match (still_held, flight.paused) {
                    (true, _) => None,
                    (false, true) => Some(Cause::PauseAfterFence),
                    (false, false) => Some(Cause::LeaseLostInFlight),
                }
            }
        };
        let earlier_stale = self.stale_landings.get(&key).copied();
        if let Some(cause) = stale {
            self.stale_landings.entry(key).or_insert(cause);
        }
        let duplicate = duplicate.then(|| match self.mode {
            GuardMode::None => Cause::NoGuard,
            GuardMode::Lease => Cause::NoFence,
            // One of the two effects was a zombie, or the second site had not heard of the first.
            GuardMode::Fence | GuardMode::Token => stale.or(earlier_stale).unwrap_or(if flight.lagging {
                Cause::LedgerLag
            } else {
                Cause::Unexplained
            }),
        });
        self.report.effects += 1;
        if let Some(cause) = duplicate {
            self.report.duplicates += 1;
            *self.report.duplicates_by_cause.entry(cause).or_insert(0) += 1;
        }
        self.report.effect_log.push(Effect {
            site: index,
            agent: flight.agent,
            occurrence: flight.occurrence,
            epoch: flight.epoch,
            at_ms: self.now_ms,
            duplicate,
        });
    }

    fn finish(mut self, occurrences_per_agent: u64) -> ModeReport {
        for site in 0..self.sites.len() {
            for agent in 0..self.config.agents {
                self.end_tenure(site, agent);
            }
        }
        // Heal completely: every site receives everything.
        self.network().healed = true;
        for _ in 0..2 {
            for site in &mut self.sites {
                if site.ledger.is_none() {
                    site.open_ledger();
                }
                if let Some(ledger) = site.ledger.as_mut() {
                    let _ = ledger.sync();
                }
            }
        }
        let hashes: BTreeSet<_> = self
            .sites
            .iter()
            .filter_map(|site| site.ledger.as_ref().map(|ledger| ledger.state().state_hash()))
            .collect();
        self.report.converged = hashes.len() == 1;
        for agent in 0..self.config.agents {
            for occurrence in 0..occurrences_per_agent {
                if !self.applied.contains_key(&(agent, occurrence)) {
                    self.report.never_executed += 1;
                }
            }
        }
        if let Some(ledger) = self.sites.first().and_then(|site| site.ledger.as_ref()) {
            self.report.in_doubt = (0..self.config.agents)
                .map(|agent| ledger.in_doubt(&agent_name(agent), u64::MAX).len() as u64)
                .sum();
        }
        self.report
    }
}

/// The comparison table of a report, as plain text.
pub fn render_table(report: &SimReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "seed {}: {} sites, {} agents, {} occurrences, {} faults",
        report.config.seed,
        report.config.sites,
        report.config.agents,
        report.modes.first().map_or(0, |mode| mode.occurrences),
        report.schedule.faults.len()
    );
    let _ = writeln!(
        out,
        "{:<6} {:>8} {:>11} {:>11} {:>9} {:>8} {:>9} {:>6} {:>9} {:>9}  duplicates by cause",
        "mode",
        "effects",
        "duplicates",
        "never ran",
        "in doubt",
        "retried",
        "resolved",
        "fence",
        "resource",
        "converged"
    );
    for mode in &report.modes {
        let causes: Vec<String> = mode
            .duplicates_by_cause
            .iter()
            .map(|(cause, count)| format!("{}={count}", cause_name(*cause)))
            .collect();
        let _ = writeln!(
            out,
            "{:<6} {:>8} {:>11} {:>11} {:>9} {:>8} {:>9} {:>6} {:>9} {:>9}  {}",
            mode.mode.name(),
            mode.effects,
            mode.duplicates,
            mode.never_executed,
            mode.in_doubt,
            mode.in_doubt_retried,
            mode.in_doubt_resolved,
            mode.refused_at_fence,
            mode.refused_at_resource,
            if mode.converged { "yes" } else { "NO" },
            if causes.is_empty() {
                "-".to_owned()
            } else {
                causes.join(" ")
            }
        );
    }
    out
}

/// A cause's name in tables and JSON.
pub fn cause_name(cause: Cause) -> &'static str {
    match cause {
        Cause::NoGuard => "no_guard",
        Cause::NoFence => "no_fence",
        Cause::PauseAfterFence => "pause_after_fence",
        Cause::LeaseLostInFlight => "lease_lost_in_flight",
        Cause::LedgerLag => "ledger_lag",
        Cause::Unexplained => "unexplained",
    }
}

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG timeline of a report: one panel per mode, one lane per site. Lease tenures are bars
/// labelled with their epoch (one colour per agent), pauses grey, crashes black, partitioned sites
/// shaded red, effects as dots, duplicates as red crosses (hover for the cause).
pub fn render_svg(report: &SimReport) -> String {
    const LEFT: f64 = 110.0;
    const WIDTH: f64 = 1000.0;
    const LANE: f64 = 26.0;
    const AGENT_COLOURS: [&str; 4] = ["#4c78a8", "#72b7b2", "#b279a2", "#9d755d"];
    let config = &report.config;
    let total_ms = (config.run_ms + config.settle_ms).max(1) as f64;
    let x = |ms: u64| LEFT + WIDTH * ms as f64 / total_ms;
    let panel_height = 30.0 + LANE * config.sites as f64 + 14.0;
    let height = 60.0 + panel_height * report.modes.len() as f64 + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" font-family="sans-serif" font-size="11">"#,
        w = LEFT + WIDTH + 20.0
    );
    let _ = write!(svg, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = write!(
        svg,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">fencepost simulate --seed {}: {} sites, {} agents, {} faults (faults end at {} ms)</text>"#,
        config.seed,
        config.sites,
        config.agents,
        report.schedule.faults.len(),
        config.run_ms
    );
    for (panel, mode) in report.modes.iter().enumerate() {
        let top = 40.0 + panel_height * panel as f64;
        let _ = write!(
            svg,
            r#"<text x="10" y="{}" font-size="13" font-weight="bold">{}: {} effects, {} duplicates</text>"#,
            top + 16.0,
            mode.mode.name(),
            mode.effects,
            mode.duplicates
        );
        let lane_top = |site: usize| top + 26.0 + LANE * site as f64;
        for site in 0..config.sites {
            let y = lane_top(site);
            let _ = write!(
                svg,
                r##"<rect x="{LEFT}" y="{y}" width="{WIDTH}" height="{h}" fill="#f4f4f4"/><text x="10" y="{ty}">site-{site} ({skew:+} ms)</text>"##,
                h = LANE - 4.0,
                ty = y + 15.0,
                skew = report.schedule.skew_ms.get(site).copied().unwrap_or(0)
            );
        }
        for fault in &report.schedule.faults {
            match fault {
                Fault::Partition {
                    at_ms,
                    until_ms,
                    side,
                } => {
                    for site in side {
                        let _ = write!(
                            svg,
                            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#e45756" fill-opacity="0.18"><title>partitioned {}..{} ms</title></rect>"##,
                            x(*at_ms),
                            lane_top(*site),
                            (x(*until_ms) - x(*at_ms)).max(1.0),
                            LANE - 4.0,
                            at_ms,
                            until_ms
                        );
                    }
                }
                Fault::Pause {
                    site,
                    at_ms,
                    duration_ms,
                } => {
                    let _ = write!(
                        svg,
                        r##"<rect x="{}" y="{}" width="{}" height="6" fill="#888888"><title>paused {} ms at {} ms</title></rect>"##,
                        x(*at_ms),
                        lane_top(*site) + LANE - 10.0,
                        (x(at_ms + duration_ms) - x(*at_ms)).max(1.0),
                        duration_ms,
                        at_ms
                    );
                }
                Fault::Crash { site, at_ms, down_ms } => {
                    let _ = write!(
                        svg,
                        r##"<rect x="{}" y="{}" width="{}" height="6" fill="#222222"><title>crashed at {} ms, down {} ms</title></rect>"##,
                        x(*at_ms),
                        lane_top(*site) + LANE - 10.0,
                        (x(at_ms + down_ms) - x(*at_ms)).max(1.0),
                        at_ms,
                        down_ms
                    );
                }
                Fault::CoordinatorLoss { at_ms } => {
                    let _ = write!(
                        svg,
                        r##"<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#f58518" stroke-width="2" stroke-dasharray="4 2"><title>coordinator state lost at {} ms</title></line>"##,
                        lane_top(0) - 4.0,
                        lane_top(config.sites) - 4.0,
                        at_ms,
                        x = x(*at_ms)
                    );
                }
            }
        }
        for tenure in &mode.tenures {
            let colour = AGENT_COLOURS[tenure.agent % AGENT_COLOURS.len()];
            let y = lane_top(tenure.site) + 2.0 + 6.0 * (tenure.agent % 2) as f64;
            let width = (x(tenure.until_ms) - x(tenure.from_ms)).max(1.0);
            let _ = write!(
                svg,
                r#"<rect x="{}" y="{y}" width="{width}" height="5" fill="{colour}"><title>agent-{} epoch {} held {}..{} ms</title></rect>"#,
                x(tenure.from_ms),
                tenure.agent,
                tenure.epoch,
                tenure.from_ms,
                tenure.until_ms
            );
        }
        for effect in &mode.effect_log {
            let cx = x(effect.at_ms);
            let cy = lane_top(effect.site) + 16.0;
            match effect.duplicate {
                None => {
                    let _ = write!(
                        svg,
                        r##"<circle cx="{cx}" cy="{cy}" r="2.5" fill="#54a24b"><title>agent-{} occurrence {} at epoch {}, {} ms</title></circle>"##,
                        effect.agent, effect.occurrence, effect.epoch, effect.at_ms
                    );
                }
                Some(cause) => {
                    let _ = write!(
                        svg,
                        r##"<g stroke="#d62728" stroke-width="2"><title>DUPLICATE agent-{} occurrence {} at epoch {}, {} ms: {}</title><line x1="{}" y1="{}" x2="{}" y2="{}"/><line x1="{}" y1="{}" x2="{}" y2="{}"/></g>"##,
                        effect.agent,
                        effect.occurrence,
                        effect.epoch,
                        effect.at_ms,
                        escape(cause_name(cause)),
                        cx - 4.0,
                        cy - 4.0,
                        cx + 4.0,
                        cy + 4.0,
                        cx - 4.0,
                        cy + 4.0,
                        cx + 4.0,
                        cy - 4.0
                    );
                }
            }
        }
    }
    let legend_y = height - 20.0;
    let _ = write!(
        svg,
        r##"<g font-size="11"><rect x="10" y="{ly}" width="14" height="5" fill="{a0}"/><text x="28" y="{ty}">lease held (agent-0 / agent-1)</text><rect x="210" y="{ly}" width="14" height="5" fill="{a1}"/><circle cx="400" cy="{cy}" r="3" fill="#54a24b"/><text x="408" y="{ty}">effect</text><g stroke="#d62728" stroke-width="2"><line x1="470" y1="{y1}" x2="478" y2="{y2}"/><line x1="470" y1="{y2}" x2="478" y2="{y1}"/></g><text x="484" y="{ty}">duplicate</text><rect x="560" y="{ly}" width="14" height="6" fill="#888888"/><text x="578" y="{ty}">paused</text><rect x="640" y="{ly}" width="14" height="6" fill="#222222"/><text x="658" y="{ty}">crashed</text><rect x="720" y="{ly2}" width="14" height="12" fill="#e45756" fill-opacity="0.18"/><text x="738" y="{ty}">partitioned</text><line x1="830" x2="830" y1="{ly2}" y2="{ty}" stroke="#f58518" stroke-width="2" stroke-dasharray="4 2"/><text x="836" y="{ty}">coordinator lost its state</text></g>"##,
        ly = legend_y - 4.0,
        ly2 = legend_y - 9.0,
        ty = legend_y + 2.0,
        cy = legend_y - 1.0,
        y1 = legend_y - 5.0,
        y2 = legend_y + 3.0,
        a0 = AGENT_COLOURS[0],
        a1 = AGENT_COLOURS[1]
    );
    svg.push_str("</svg>\n");
    svg
}
