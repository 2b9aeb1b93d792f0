//! The simulated world: time, the network between the sites' relay replicas, the coordinator's
//! storage, the resource; and the sites, each running the library's own machines, ledger and
//! dispatch steps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::{Cause, Fault, GuardMode, ModeReport, Schedule, SimConfig, Tenure};
use crate::clock::ManualClock;
use crate::dispatch::{Permit, Refusal, RunOutcome};
use crate::fence::FencingToken;
use crate::fence::Holder;
use crate::id::{AgentId, RunId};
use crate::keeper::{AcquirePlan, AcquireStep, Acquisition, KeeperConfig, Renewal, RenewalStep};
use crate::lease::{InMemoryLeaseCoordinator, Intent, IntentStatus, LeaseCoordinator};
use crate::ledger::Ledger;
use crate::relay::{Frontier, InMemoryRelay, Relay};
use crate::session::RunSession;

pub(super) use super::counted::Counted;
pub(super) use super::network::{Network, SiteRelay};
use crate::resource::{FencedResource, ResourceRefusal};
use crate::rng::mix;

/// A site's lease of one agent: the library's machines, driven in simulated time.
#[derive(Debug, Clone)]
pub(super) enum LeaseState {
    /// Not held; the next [`Acquisition`] starts at `next_try_local_ms` (site clock).
    Idle { next_try_local_ms: u64 },
    /// Held, by the [`Renewal`] machine's view; `behind_since_ms`: since when its dispatches
    /// wait for the ledger (rule H3), if they do.
    Holding {
        renewal: Box<Renewal>,
        since_ms: u64,
        behind_since_ms: Option<u64>,
    },
}

/// The holder a site dispatches as: its lease of the agent, by its [`Renewal`] machine.
pub(super) struct SimHolder<'a> {
    pub(super) coordinator: &'a dyn LeaseCoordinator,
    pub(super) agent_id: String,
    pub(super) device_id: &'a str,
    pub(super) epoch: u64,
    pub(super) holds: bool,
    pub(super) handed_over: Option<Frontier>,
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
    fn handed_over(&self) -> Option<Frontier> {
        self.handed_over.clone()
    }
}

/// An effect between the fence and the resource.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) agent: usize,
    pub(super) occurrence: u64,
    pub(super) run_id: RunId,
    pub(super) epoch: u64,
    /// The ledger's permit (modes `fence` and `token`).
    pub(super) permit: Option<Permit>,
    pub(super) land_at_ms: u64,
    /// The run had committed somewhere the site's ledger had not heard of, at the fence.
    pub(super) lagging: bool,
    /// ... and the publication of that earlier attempt was lost with the coordinator's state.
    pub(super) frontier_lost: bool,
    /// The site paused while the effect was in flight.
    pub(super) paused: bool,
}

/// A site's run session of one occurrence.
#[derive(Debug)]
pub(super) struct SimSession {
    pub(super) machine: RunSession,
    pub(super) agent: usize,
    pub(super) occurrence: u64,
    pub(super) run_id: RunId,
    /// A [`SessionStep::SyncAt`] waiting for its time (site clock).
    pub(super) sync_at: Option<u64>,
    /// Why `Ledger::begin` refused, for the end.
    pub(super) refusal: Option<Refusal>,
}

pub(super) struct Site {
    pub(super) name: String,
    pub(super) clock: ManualClock,
    pub(super) skew_ms: i64,
    pub(super) relay: Arc<SiteRelay>,
    pub(super) ledger: Option<Ledger>,
    pub(super) leases: Vec<LeaseState>,
    /// Per agent, the next occurrence to trigger.
    pub(super) next_occurrence: Vec<u64>,
    /// Occurrences triggered here and not settled here.
    pub(super) backlog: BTreeSet<(usize, u64)>,
    pub(super) in_flight: Option<InFlight>,
    pub(super) paused_until_ms: u64,
    pub(super) down_until_ms: u64,
    pub(super) crash_pending: bool,
    pub(super) next_sync_local_ms: u64,
    /// The run session of modes `fence` and `token` (one at a time).
    pub(super) session: Option<SimSession>,
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

pub(super) struct World<'a> {
    pub(super) config: &'a SimConfig,
    pub(super) mode: GuardMode,
    pub(super) keeper: KeeperConfig,
    pub(super) now_ms: u64,
    pub(super) coordinator_clock: ManualClock,
    pub(super) coordinator: Counted,
    /// How many times the coordinator lost its state.
    pub(super) generation: u32,
    /// Per run, the coordinator generation in which its first `pending` was published (rule H2).
    pub(super) begun_generation: BTreeMap<RunId, u32>,
    pub(super) sites: Vec<Site>,
    pub(super) network: Arc<Mutex<Network>>,
    /// Runs committed anywhere, by the time they were.
    pub(super) committed: BTreeSet<RunId>,
    /// Runs some site began (its `pending` stored), by the time they were.
    pub(super) begun: BTreeSet<RunId>,
    /// Per run, the effects that landed (in every mode: what the duplicates are counted from).
    pub(super) applied: BTreeMap<(usize, u64), u64>,
    /// In `token` mode, the resource: the library's [`FencedResource`], which checks the token's
    /// epoch and its run id.
    pub(super) resource: FencedResource<(usize, u64)>,
    /// Per occurrence, how the first of its effects that landed without a lease had lost it.
    pub(super) stale_landings: BTreeMap<(usize, u64), Cause>,
    pub(super) report: ModeReport,
}

pub(super) fn agent_name(agent: usize) -> String {
    format!("agent-{agent}")
}

/// `agent_name` as an id (the simulator's names are ids).
pub(super) fn agent_id(agent: usize) -> AgentId {
    AgentId::new(agent_name(agent)).unwrap_or_else(|_| unreachable!("the simulator's names are ids"))
}

pub(super) fn run_id(agent: usize, occurrence: u64) -> RunId {
    RunId::derive(&agent_name(agent), "scheduled job", &occurrence.to_string())
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
                session: None,
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
        coordinator: Counted::new(new_coordinator(config, &coordinator_clock, mode, 0)),
        generation: 0,
        begun_generation: BTreeMap::new(),
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
            ledger_wait_ms: Vec::new(),
            coordinator_calls: BTreeMap::new(),
            effect_log: Vec::new(),
            tenures: Vec::new(),
            refusal_log: Vec::new(),
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
                self.coordinator.inner =
                    new_coordinator(self.config, &self.coordinator_clock, self.mode, self.generation);
            }
        }
    }

    fn local_ms(&self, site: usize) -> u64 {
        self.now_ms.saturating_add_signed(self.sites[site].skew_ms)
    }

    pub(super) fn end_tenure(&mut self, site: usize, agent: usize) {
        let state = std::mem::replace(
            &mut self.sites[site].leases[agent],
            LeaseState::Idle { next_try_local_ms: 0 },
        );
        if let LeaseState::Holding {
            renewal,
            since_ms,
            behind_since_ms,
        } = state
        {
            if let Some(behind_since_ms) = behind_since_ms {
                self.report.ledger_wait_ms.push(self.now_ms - behind_since_ms);
            }
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
            self.sites[index].session = None;
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
                    RenewalStep::RenewAndPublish {
                        epoch,
                        ttl_ms,
                        frontier,
                    } => {
                        let outcome = self
                            .coordinator
                            .renew_publishing(&name, &device, epoch, ttl_ms, &frontier);
                        renewal.answered_publishing(local, outcome);
                    }
                    RenewalStep::Lost(_) => {
                        self.end_tenure(index, agent);
                        return;
                    }
                    _ => return,
                }
            },
            // Modes `fence` and `token` acquire in their run sessions only.
            LeaseState::Idle { .. } if self.mode != GuardMode::Lease => return,
            LeaseState::Idle { next_try_local_ms } => {
                if local < *next_try_local_ms {
                    return;
                }
                *next_try_local_ms = local + self.keeper.acquire_every_ms;
            }
        }
        if let Some(renewal) = self.acquire_once(index, agent, local) {
            self.hold(index, agent, renewal);
        } // not granted: the next acquisition starts acquire_every_ms later
    }

    /// One attempt at `agent`'s lease for site `index` (the keeper's [`Acquisition`], raising the
    /// floor from the site's ledger first); the coordinator answers at once in simulated time.
    pub(super) fn acquire_once(&mut self, index: usize, agent: usize, local: u64) -> Option<Renewal> {
        let name = agent_name(agent);
        let device = self.sites[index].name.clone();
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
                    let outcome = self.coordinator.acquire_handing_over(&name, &device, ttl_ms);
                    acquisition.acquired_handing_over(local, outcome);
                }
                AcquireStep::Granted(renewal) => return Some(renewal),
                _ => return None,
            }
        }
    }

    /// Site `index` holds `agent`'s lease from now on, by `renewal`.
    pub(super) fn hold(&mut self, index: usize, agent: usize, renewal: Renewal) {
        self.sites[index].leases[agent] = LeaseState::Holding {
            renewal: Box::new(renewal),
            since_ms: self.now_ms,
            behind_since_ms: None,
        };
    }

    /// The epoch the site holds `agent` at, by its renewal machine, at `local`.
    fn held_epoch(&self, index: usize, agent: usize, local: u64) -> Option<u64> {
        match &self.sites[index].leases[agent] {
            LeaseState::Holding { renewal, .. } if renewal.holds(local) => Some(renewal.epoch()),
            _ => None,
        }
    }

    /// Starts the next effect of the backlog, if the mode lets it. Modes `fence` and `token` run
    /// each occurrence through the library's run session (`work_sessions`); a run in doubt is
    /// retried in `token` mode (the resource makes a second attempt harmless) and settled by an
    /// operator in `fence` mode (who checks the resource once the attempt's lease has ended, then
    /// [`Ledger::resolve`]s it).
    fn work(&mut self, index: usize, local: u64) {
        let items: Vec<(usize, u64)> = self.sites[index].backlog.iter().copied().collect();
        for (agent, occurrence) in items {
            let run_id = run_id(agent, occurrence);
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
                    self.work_sessions(index, local);
                    return;
                }
            }
        }
    }

    /// Ends a wait for the ledger (rule H3) of the site's lease of `agent`, if there was one.
    pub(super) fn caught_up(&mut self, index: usize, agent: usize) {
        if let LeaseState::Holding { behind_since_ms, .. } = &mut self.sites[index].leases[agent] {
            if let Some(since) = behind_since_ms.take() {
                self.report.ledger_wait_ms.push(self.now_ms - since);
            }
        }
    }

    /// The operator of `fence` mode settles a run in doubt once the attempt's lease has ended:
    /// `committed` if the resource shows the effect, `failed` if not (then it runs again).
    pub(super) fn operator_resolves(
        &mut self,
        index: usize,
        key: (usize, u64),
        run: &crate::ledger::InDoubtRun,
    ) {
        let name = agent_name(key.0);
        let live = matches!(
            self.coordinator.inner.current(&name),
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
        let run_id = run_id(key.0, key.1);
        if ledger.resolve(&agent_id(key.0), &run_id, outcome).is_ok() {
            self.report.in_doubt_resolved += 1;
            if outcome == RunOutcome::Committed {
                self.committed.insert(run_id);
            }
        }
    }

    pub(super) fn start(
        &mut self,
        index: usize,
        key: (usize, u64),
        run_id: RunId,
        epoch: u64,
        permit: Option<Permit>,
    ) {
        let (agent, occurrence) = key;
        // The site's ledger let the run through although another attempt had begun or
        // committed: what it needed had not reached it through the relay.
        let lagging = permit.is_some() && (self.committed.contains(&run_id) || self.begun.contains(&run_id));
        // When the earlier attempt was published under a coordinator state that was lost since,
        // no new holder could know of it (rule H3 has nothing to wait for).
        let frontier_lost = lagging
            && self
                .begun_generation
                .get(&run_id)
                .is_some_and(|generation| *generation < self.generation);
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
            frontier_lost,
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
                // Published at the release (rule H2), as the keeper does.
                let pushed = ledger.pushed();
                if let LeaseState::Holding { renewal, .. } = &mut self.sites[index].leases[flight.agent] {
                    renewal.pushed(&pushed);
                }
                self.session_effect_landed(index, outcome);
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
            run_id: flight.run_id.to_string(),
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
                self.refused_at_resource(index, flight, "stale_epoch");
                let _ = self.coordinator.raise_epoch_floor(&token.agent_id, highest_epoch);
                self.end_tenure(index, flight.agent);
                self.sites[index].backlog.insert(key);
                RunOutcome::Failed
            }
            Err(ResourceRefusal::AlreadyApplied { .. }) => {
                // Already applied under this run id: idempotent success.
                self.refused_at_resource(index, flight, "already_applied");
                RunOutcome::Committed
            }
            Err(_) => {
                // An epoch no coordinator minted: refused, nothing applied.
                self.refused_at_resource(index, flight, "unknown_epoch");
                self.sites[index].backlog.insert(key);
                RunOutcome::Failed
            }
        }
    }

    /// Counts an effect the resource refused, and logs it for the timeline.
    fn refused_at_resource(&mut self, index: usize, flight: &InFlight, reason: &'static str) {
        self.report.refused_at_resource += 1;
        self.report.refusal_log.push(super::RefusedEffect {
            site: index,
            agent: flight.agent,
            occurrence: flight.occurrence,
            epoch: flight.epoch,
            at_ms: self.now_ms,
            reason,
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
        self.report.coordinator_calls = self.coordinator.calls();
        self.report
    }
}
