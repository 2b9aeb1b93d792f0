//! The fold: every site turns the union of all op logs into the same [`SyncState`].
//!
//! The fold is a CRDT merge: commutative, associative and idempotent. The same set of records gives
//! the same state and the same [`SyncState::state_hash`] on every machine, in any arrival order,
//! with duplicates (rules F3, F8). [`fold`] and the incremental [`SyncState::apply`] are the same
//! function: applying a tail to a folded prefix equals folding everything.
//!
//! # Intents (rules F4–F7)
//!
//! Per **agent** (not per run), the *fencing epoch* is the highest epoch of any of its intent
//! records (F4). Per run:
//!
//! * **who holds now** ([`SyncState::intent`], F5): the greatest *eligible* record under
//!   `(status rank, epoch, hlc, op_id)`, where eligible means terminal (committed or failed, at any
//!   epoch: terminal records are immune to fencing) or pending at exactly the fencing epoch (≥ 1).
//!   A pending record of an older epoch is *fenced*: it was written by a holder that has since lost
//!   the lease.
//! * **the idempotency oracle** ([`SyncState::committed_run`], F6): the greatest committed record,
//!   whatever its epoch. Nothing removes it.
//!
//! A malformed intent record (a payload that [`Intent::from_payload`](crate::intent::Intent::from_payload)
//! refuses) changes nothing (F7): it is fenced as if its epoch were 0 and never promoted.
//!
//! # Other surfaces
//!
//! * [`Surface::Log`] records are kept as a grow-only set, by `op_id`, in HLC order.
//! * [`Surface::Registry`] records with a string `"key"` field: per key, the record with the
//!   greatest `(hlc, op_id)` wins (last writer wins). Records without a key are ignored.
//!
//! # Verified records only
//!
//! The fold trusts `op_id`s: it keeps one record per id and breaks ties by id. Its laws hold for
//! records whose `op_id` matches their content (rule O1); two records with one id and different
//! content ("forged twins") would fold to an order-dependent state with an equal
//! [`SyncState::state_hash`]. So the fold's callers pass verified records only, and every public
//! path in verifies: relays check every record they store and read
//! ([`LogHead`](crate::oplog::LogHead)), and [`Ledger`](crate::ledger::Ledger) checks again what
//! its relay hands over before folding it. A caller that folds records from elsewhere checks them
//! first ([`verify_log`](crate::oplog::verify_log), or [`OpRecord::has_valid_id`] at least).
//! Hashing every record here would cost more than the fold itself.
//!
//! **Architecture invariant:** the fold knows nothing about files, clocks or coordinators, and no
//! hash-map iteration order reaches its results.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use compact_str::CompactString;
use rustc_hash::FxHashMap;
use sha2::{Digest, Sha256};

use crate::core::clock::Hlc;
use crate::intent::IntentStatus;
use crate::oplog::{CompactIntent, OpId, OpRecord, Payload, Surface};
use crate::run_id::RunKey;

mod summary;

pub use summary::{Forgetting, RunSummary, SummaryRecord};

/// The payload field that names a registry entry's key.
pub const REGISTRY_FIELD_KEY: &str = "key";

/// One intent record as the fold keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRecord {
    /// The record's op id.
    pub op_id: OpId,
    /// The epoch it was written under.
    pub epoch: u64,
    /// Its status.
    pub status: IntentStatus,
    /// The wall part of its HLC stamp.
    pub hlc_wall_ms: u64,
    /// The counter part of its HLC stamp.
    pub hlc_counter: u32,
    /// The device, as an index into the state's device table ([`SyncState::hlc_of`]).
    device: u32,
}

/// What the fold keeps per run: the greatest eligible record and, when that one is a `failed`, the
/// greatest `committed` record if there is one.
#[derive(Debug, Clone)]
struct RunEntry {
    best: RunRecord,
    committed_below_failed: Option<Box<RunRecord>>,
}

impl RunEntry {
    fn committed(&self) -> Option<&RunRecord> {
        match self.best.status {
            IntentStatus::Committed => Some(&self.best),
            _ => self.committed_below_failed.as_deref(),
        }
    }
}

/// The folded intents of one agent.
///
/// Fencing is applied lazily: when the fencing epoch rises, the pending entries below it stay in
/// the map but are no longer *visible*; every read skips them, and any eligible record replaces
/// them (an eligible pending has a higher epoch, a terminal record a higher rank). This keeps
/// `apply` O(1) whatever the epochs do.
#[derive(Debug, Clone, Default)]
pub struct IntentAgent {
    fencing_epoch: u64,
    runs: FxHashMap<RunKey, RunEntry>,
}

impl IntentAgent {
    /// The highest epoch of any of the agent's intent records (rule F4).
    pub fn fencing_epoch(&self) -> u64 {
        self.fencing_epoch
    }

    /// Who holds run `run_id` now (rule F5).
    pub fn run(&self, run_id: &str) -> Option<&RunRecord> {
        self.visible_entry(&RunKey::new(run_id)).map(|entry| &entry.best)
    }

    /// The greatest committed record of `run_id` (rule F6).
    pub fn committed_run(&self, run_id: &str) -> Option<&RunRecord> {
        self.committed_run_key(&RunKey::new(run_id))
    }

    /// [`committed_run`](Self::committed_run) by key.
    pub(crate) fn committed_run_key(&self, run: &RunKey) -> Option<&RunRecord> {
        self.runs.get(run).and_then(RunEntry::committed)
    }

    /// Every run with an eligible record, in run-id order (rule F5's view).
    pub fn runs(&self) -> Vec<(String, &RunRecord)> {
        self.sorted_entries()
            .into_iter()
            .map(|(run, entry)| (run.to_string(), &entry.best))
            .collect()
    }

    /// Every committed run, in run-id order (rule F6's view).
    pub fn committed_runs(&self) -> Vec<(String, &RunRecord)> {
        self.sorted_entries()
            .into_iter()
            .filter_map(|(run, entry)| entry.committed().map(|record| (run.to_string(), record)))
            .collect()
    }

    /// Whether an entry is part of the state: not a pending fenced by a later epoch.
    fn is_visible(&self, entry: &RunEntry) -> bool {
        entry.best.status != IntentStatus::Pending || entry.best.epoch == self.fencing_epoch
    }

    fn visible_entry(&self, run: &RunKey) -> Option<&RunEntry> {
        self.runs.get(run).filter(|entry| self.is_visible(entry))
    }

    fn visible_entries(&self) -> impl Iterator<Item = (&RunKey, &RunEntry)> {
        self.runs.iter().filter(|(_, entry)| self.is_visible(entry))
    }

    /// The visible entries in run-id order. (A fenced entry holds no commit: a run with a commit
    /// has a terminal best.)
    fn sorted_entries(&self) -> Vec<(&RunKey, &RunEntry)> {
        let mut entries: Vec<_> = self.visible_entries().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        entries
    }

    fn apply(&mut self, run: &RunKey, record: RunRecord, devices: &[Arc<str>]) {
        self.fencing_epoch = self.fencing_epoch.max(record.epoch);
        if record.status == IntentStatus::Pending && (record.epoch != self.fencing_epoch || record.epoch == 0)
        {
            return; // fenced for good: the fencing epoch never goes down
        }
        let entry = match self.runs.entry(run.clone()) {
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(RunEntry {
                    best: record,
                    committed_below_failed: None,
                });
                return;
            }
            std::collections::hash_map::Entry::Occupied(occupied) => occupied.into_mut(),
        };
        let new_committed_max = record.status == IntentStatus::Committed
            && entry
                .committed()
                .is_none_or(|old| compare_records(&record, old, devices) == Ordering::Greater);
        if compare_records(&record, &entry.best, devices) == Ordering::Greater {
            // Greater than an eligible best, or than a fenced pending (which no commit sits under).
            let previous = std::mem::replace(&mut entry.best, record);
            if record.status != IntentStatus::Failed {
                // A new best commit (or pending) is above every commit of the run.
                entry.committed_below_failed = None;
            } else if previous.status == IntentStatus::Committed {
                entry.committed_below_failed = Some(Box::new(previous));
            }
        } else if new_committed_max {
            // Only a `failed` best can be above a new greatest commit.
            debug_assert_eq!(entry.best.status, IntentStatus::Failed);
            entry.committed_below_failed = Some(Box::new(record));
        }
    }
}

/// The order of rule F5: `(status rank, epoch, hlc, op_id)`.
fn compare_records(a: &RunRecord, b: &RunRecord, devices: &[Arc<str>]) -> Ordering {
    a.status
        .rank()
        .cmp(&b.status.rank())
        .then(a.epoch.cmp(&b.epoch))
        .then(a.hlc_wall_ms.cmp(&b.hlc_wall_ms))
        .then(a.hlc_counter.cmp(&b.hlc_counter))
        .then_with(|| devices[a.device as usize].cmp(&devices[b.device as usize]))
        .then(a.op_id.cmp(&b.op_id))
}

/// A registry entry: the winning record of one key.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistryEntry {
    /// The winner's HLC stamp.
    pub hlc: Hlc,
    /// The winner's op id.
    pub op_id: OpId,
    /// The winner's payload.
    pub payload: Payload,
}

/// The devices seen, each with a small index used in [`RunRecord`]s.
#[derive(Debug, Clone, Default)]
struct DeviceTable {
    names: Vec<Arc<str>>,
    index: FxHashMap<Arc<str>, u32>,
    /// The last device looked up: records of one device share one allocation of its id.
    last: Option<(Arc<str>, u32)>,
}

impl DeviceTable {
    fn intern(&mut self, device_id: &Arc<str>) -> u32 {
        if let Some((last, index)) = &self.last {
            if Arc::ptr_eq(last, device_id) {
                return *index;
            }
        }
        let index = match self.index.get(device_id) {
            Some(index) => *index,
            None => {
                let index = u32::try_from(self.names.len()).expect("more than 2^32 devices");
                self.names.push(Arc::clone(device_id));
                self.index.insert(Arc::clone(device_id), index);
                index
            }
        };
        self.last = Some((Arc::clone(device_id), index));
        index
    }
}

/// A grow-only log: records by `(hlc, op_id)`.
type GrowOnlyLog = BTreeMap<(Hlc, OpId), Payload>;

/// The folded state of a set of op records.
#[derive(Debug, Clone, Default)]
pub struct SyncState {
    agents: FxHashMap<CompactString, IntentAgent>,
    devices: DeviceTable,
    logs: BTreeMap<Arc<str>, GrowOnlyLog>,
    registries: BTreeMap<Arc<str>, BTreeMap<String, RegistryEntry>>,
}

/// Folds `ops` (any order, duplicates allowed) into a state.
///
/// ```
/// use fencepost::clock::ManualClock;
/// use fencepost::fold::fold;
/// use fencepost::lease::{Intent, IntentStatus};
/// use fencepost::oplog::{DeviceLog, Surface};
///
/// let clock = ManualClock::new(1_000);
/// let mut laptop = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
/// let mut phone = DeviceLog::new("phone", clock.wall_clock()).unwrap();
/// let ops = vec![
///     laptop.append(Surface::Intent, Intent::new("milo", "run-1", 1, IntentStatus::Pending).payload()),
///     laptop.append(Surface::Intent, Intent::new("milo", "run-1", 1, IntentStatus::Committed).payload()),
///     // The laptop paused past its TTL; the phone took the lease at epoch 2.
///     phone.append(Surface::Intent, Intent::new("milo", "run-2", 2, IntentStatus::Pending).payload()),
///     laptop.append(Surface::Intent, Intent::new("milo", "run-3", 1, IntentStatus::Pending).payload()),
/// ];
/// let state = fold(&ops);
/// assert_eq!(state.fencing_epoch("milo"), 2);
/// assert!(state.committed_run("milo", "run-1").is_some()); // the oracle keeps the commit
/// assert!(state.intent("milo", "run-3").is_none()); // the zombie's pending is fenced
/// assert_eq!(state.intent("milo", "run-2").map(|r| r.epoch), Some(2));
/// ```
///
/// `ops` must be verified records (see [Verified records only](self#verified-records-only)).
pub fn fold(ops: &[OpRecord]) -> SyncState {
    let mut state = SyncState::new();
    state.apply_batch(ops);
    state
}

/// The fold's copy of an intent record.
fn run_record(op: &OpRecord, intent: &CompactIntent, devices: &mut DeviceTable) -> RunRecord {
    RunRecord {
        op_id: op.op_id,
        epoch: intent.epoch,
        status: intent.status,
        hlc_wall_ms: op.hlc.wall_ms,
        hlc_counter: op.hlc.counter,
        device: devices.intern(&op.hlc.device_id),
    }
}

/// How many records ahead [`SyncState::apply_batch`] asks the processor to fetch.
const PREFETCH_DISTANCE: usize = 32;

/// Hints the processor to bring `op` into cache (a hint only: no effect on results).
#[inline]
fn prefetch_record(op: &OpRecord) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = (op as *const OpRecord).cast::<i8>();
        for offset in (0..std::mem::size_of::<OpRecord>()).step_by(64) {
            // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint: it never
            // faults and reads nothing the program can observe. The address stays within `op`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = op;
}

/// Marks a record that folds outside the per-agent intent maps.
const NO_AGENT: u32 = u32::MAX;

impl SyncState {
    /// The state of no records.
    pub fn new() -> Self {
        Self::default()
    }

    /// What this state holds, in a few words (`3 runs of 2 agents, 1 log`), or `None` when it
    /// holds no run, log or registry entry (fencepost's own registries, `fencepost.…`, aside).
    pub fn content_summary(&self) -> Option<String> {
        let runs: usize = self.agents.values().map(|agent| agent.runs().len()).sum();
        let registries: usize = self
            .registries
            .iter()
            .filter(|(kind, _)| !kind.starts_with("fencepost."))
            .map(|(_, entries)| entries.len())
            .sum();
        if self.agents.is_empty() && self.logs.is_empty() && registries == 0 {
            return None;
        }
        Some(format!(
            "{runs} run(s) of {} agent(s), {} log(s), {registries} registry entr(y/ies)",
            self.agents.len(),
            self.logs.len()
        ))
    }

    /// Folds one more record in (rule F3: same result as folding everything at once). `op` must be
    /// a verified record (see [Verified records only](self#verified-records-only)).
    pub fn apply(&mut self, op: &OpRecord) {
        match &op.surface {
            Surface::Intent => {
                let Some(intent) = op.payload.compact_intent() else {
                    return; // rule F7: a malformed intent changes nothing
                };
                let record = run_record(op, &intent, &mut self.devices);
                let agent = match self.agents.get_mut(intent.agent.as_str()) {
                    Some(agent) => agent,
                    None => self.agents.entry(intent.agent.clone()).or_default(),
                };
                agent.apply(&intent.run, record, &self.devices.names);
            }
            Surface::Log { kind } => {
                let log = self.logs.entry(Arc::clone(kind)).or_default();
                log.entry((op.hlc.clone(), op.op_id))
                    .or_insert_with(|| op.payload.clone());
            }
            Surface::Registry { kind } => self.apply_registry(kind, op),
            // A sealed record is folded as the record it opens to, never as it is.
            Surface::Sealed => {}
        }
    }

    /// [`apply`](Self::apply) for each record.
    pub fn apply_all<'a>(&mut self, ops: impl IntoIterator<Item = &'a OpRecord>) {
        for op in ops {
            self.apply(op);
        }
    }

    /// Folds a large batch: the same result as [`apply_all`](Self::apply_all) (the fold does not
    /// depend on order), but intent records are first grouped by agent so that each agent's runs
    /// are folded while they are in the processor's cache.
    pub fn apply_batch(&mut self, ops: &[OpRecord]) {
        if u32::try_from(ops.len()).is_err() {
            // Record indexes are kept as u32 below; a batch this large folds one record at a time.
            self.apply_all(ops);
            return;
        }
        let mut slots: FxHashMap<CompactString, u32> = FxHashMap::default();
        let mut names: Vec<CompactString> = Vec::new();
        let mut counts: Vec<u32> = Vec::new();
        let mut agent_of: Vec<u32> = Vec::with_capacity(ops.len());
        for op in ops {
            let intent = match op.surface {
                Surface::Intent => op.payload.compact_intent(),
                _ => None,
            };
            let Some(intent) = intent else {
                self.apply(op);
                agent_of.push(NO_AGENT);
                continue;
            };
            let slot = match slots.get(intent.agent.as_str()) {
                Some(slot) => *slot,
                None => {
                    let slot = u32::try_from(names.len()).expect("fewer than 2^32 agents");
                    slots.insert(intent.agent.clone(), slot);
                    names.push(intent.agent.clone());
                    counts.push(0);
                    slot
                }
            };
            counts[slot as usize] += 1;
            agent_of.push(slot);
        }
        // A counting sort of the records by agent, keeping their order within an agent.
        let mut starts: Vec<usize> = Vec::with_capacity(counts.len() + 1);
        let mut total = 0usize;
        for count in &counts {
            starts.push(total);
            total += *count as usize;
        }
        starts.push(total);
        let mut next = starts.clone();
        let mut order = vec![0u32; total];
        for (index, slot) in agent_of.iter().enumerate() {
            if *slot != NO_AGENT {
                order[next[*slot as usize]] = index as u32;
                next[*slot as usize] += 1;
            }
        }
        drop(agent_of);
        for (slot, name) in names.into_iter().enumerate() {
            let agent = self.agents.entry(name).or_default();
            // A run has one to a few records: reserve for half of them, so that most maps never
            // grow (and rehash) during the batch.
            agent.runs.reserve((starts[slot + 1] - starts[slot]) / 2);
            let group = &order[starts[slot]..starts[slot + 1]];
            for (position, index) in group.iter().enumerate() {
                // An agent's records are spread over the batch: fetch the ones coming up early.
                if let Some(ahead) = group.get(position + PREFETCH_DISTANCE) {
                    prefetch_record(&ops[*ahead as usize]);
                }
                let op = &ops[*index as usize];
                let intent = op.payload.compact_intent().expect("grouped records are intents");
                let record = run_record(op, &intent, &mut self.devices);
                agent.apply(&intent.run, record, &self.devices.names);
            }
        }
    }

    fn apply_registry(&mut self, kind: &Arc<str>, op: &OpRecord) {
        let value = op.payload.value();
        let Some(key) = value.get(REGISTRY_FIELD_KEY).and_then(serde_json::Value::as_str) else {
            return; // no key: nothing to register
        };
        let registry = self.registries.entry(Arc::clone(kind)).or_default();
        let candidate = (&op.hlc, &op.op_id);
        match registry.get_mut(key) {
            Some(entry) if (&entry.hlc, &entry.op_id) >= candidate => {}
            Some(entry) => {
                *entry = RegistryEntry {
                    hlc: op.hlc.clone(),
                    op_id: op.op_id,
                    payload: op.payload.clone(),
                }
            }
            None => {
                registry.insert(
                    key.to_owned(),
                    RegistryEntry {
                        hlc: op.hlc.clone(),
                        op_id: op.op_id,
                        payload: op.payload.clone(),
                    },
                );
            }
        }
    }

    /// How many run entries the state holds (every agent's, fenced ones too).
    pub fn run_count(&self) -> usize {
        self.agents.values().map(|agent| agent.runs.len()).sum()
    }

    /// Every run entry of every agent as a [`RunSummary`], in (agent id, run id) order. An entry
    /// whose `pending` was fenced since it arrived is listed too (merging it changes nothing).
    pub fn run_summaries(&self) -> Vec<(&str, String, RunSummary)> {
        let mut summaries = Vec::new();
        let listed: Result<(), std::convert::Infallible> =
            self.for_each_run_summary(|agent_id, run_id, summary| {
                let agent_id = self
                    .agents
                    .get_key_value(agent_id)
                    .map_or("", |(id, _)| id.as_str());
                summaries.push((agent_id, run_id.to_owned(), summary));
                Ok(())
            });
        let Ok(()) = listed;
        summaries
    }

    /// Calls `each` with every run entry as a [`RunSummary`], in (agent id, run id) order, one at
    /// a time (what [`run_summaries`](Self::run_summaries) lists, without holding the summaries
    /// all at once); stops at the first error.
    pub fn for_each_run_summary<E>(
        &self,
        mut each: impl FnMut(&str, &str, RunSummary) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut run_id = String::new();
        for (agent_id, agent) in self.agents() {
            let mut entries: Vec<_> = agent.runs.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (run, entry) in entries {
                run_id.clear();
                std::fmt::Write::write_fmt(&mut run_id, format_args!("{run}")).ok();
                each(agent_id, &run_id, self.summary_of(entry))?;
            }
        }
        Ok(())
    }

    /// Removes the entry of run `run_id` of `agent_id` (the oracle's retention,
    /// [`Forgetting`]: an exception to rule F6 that only a caller applying such a rule makes);
    /// the agent and its fencing epoch stay. Whether there was one.
    pub fn forget_run(&mut self, agent_id: &str, run_id: &str) -> bool {
        self.agents
            .get_mut(agent_id)
            .is_some_and(|agent| agent.runs.remove(&RunKey::new(run_id)).is_some())
    }

    /// The entry of run `run_id` of `agent_id` as a [`RunSummary`] (a fenced one too).
    pub fn run_summary(&self, agent_id: &str, run_id: &str) -> Option<RunSummary> {
        let entry = self.agent(agent_id)?.runs.get(&RunKey::new(run_id))?;
        Some(self.summary_of(entry))
    }

    fn summary_of(&self, entry: &RunEntry) -> RunSummary {
        let record = |record: &RunRecord| SummaryRecord {
            op_id: record.op_id,
            epoch: record.epoch,
            status: record.status,
            hlc: self.hlc_of(record),
        };
        RunSummary {
            best: record(&entry.best),
            committed_below_failed: entry.committed_below_failed.as_deref().map(record),
        }
    }

    /// Folds in a run summary taken from another state (rules F3, F5, F6: the same as folding
    /// the records it stands for). The summary's records must have been verified when they were
    /// folded.
    pub fn merge_summary(&mut self, agent_id: &str, run_id: &str, summary: &RunSummary) {
        let run = RunKey::new(run_id);
        let agent = match self.agents.get_mut(agent_id) {
            Some(agent) => agent,
            None => self.agents.entry(CompactString::from(agent_id)).or_default(),
        };
        for record in std::iter::once(&summary.best).chain(summary.committed_below_failed.as_ref()) {
            let record = RunRecord {
                op_id: record.op_id,
                epoch: record.epoch,
                status: record.status,
                hlc_wall_ms: record.hlc.wall_ms,
                hlc_counter: record.hlc.counter,
                device: self.devices.intern(&record.hlc.device_id),
            };
            agent.apply(&run, record, &self.devices.names);
        }
    }

    /// Raises `agent_id`'s fencing epoch to at least `epoch` (rule F4), as the records of another
    /// state would: a state merged with another's summaries takes its fencing epochs too.
    pub fn raise_fencing_epoch(&mut self, agent_id: &str, epoch: u64) {
        let agent = match self.agents.get_mut(agent_id) {
            Some(agent) => agent,
            None => self.agents.entry(CompactString::from(agent_id)).or_default(),
        };
        agent.fencing_epoch = agent.fencing_epoch.max(epoch);
    }

    /// The folded intents of `agent_id`.
    pub fn agent(&self, agent_id: &str) -> Option<&IntentAgent> {
        self.agents.get(agent_id)
    }

    /// Every agent with intents, in agent-id order.
    pub fn agents(&self) -> Vec<(&str, &IntentAgent)> {
        let mut agents: Vec<_> = self
            .agents
            .iter()
            .map(|(id, agent)| (id.as_str(), agent))
            .collect();
        agents.sort_unstable_by(|a, b| a.0.cmp(b.0));
        agents
    }

    /// Who holds run `run_id` of `agent_id` now (rule F5).
    pub fn intent(&self, agent_id: &str, run_id: &str) -> Option<&RunRecord> {
        self.agent(agent_id)?.run(run_id)
    }

    /// The greatest committed record of the run, whatever its epoch (rule F6): the idempotency oracle.
    pub fn committed_run(&self, agent_id: &str, run_id: &str) -> Option<&RunRecord> {
        self.agent(agent_id)?.committed_run(run_id)
    }

    /// [`committed_run`](Self::committed_run) by key.
    pub(crate) fn committed_run_key(&self, agent_id: &str, run: &RunKey) -> Option<&RunRecord> {
        self.agent(agent_id)?.committed_run_key(run)
    }

    /// The agent's fencing epoch (rule F4); 0 for an agent without intents.
    pub fn fencing_epoch(&self, agent_id: &str) -> u64 {
        self.agent(agent_id).map_or(0, IntentAgent::fencing_epoch)
    }

    /// The full HLC stamp of a record of this state.
    pub fn hlc_of(&self, record: &RunRecord) -> Hlc {
        Hlc {
            wall_ms: record.hlc_wall_ms,
            counter: record.hlc_counter,
            device_id: Arc::clone(&self.devices.names[record.device as usize]),
        }
    }

    /// The records of grow-only log `kind`, in `(hlc, op_id)` order.
    pub fn log(&self, kind: &str) -> impl Iterator<Item = (&Hlc, &OpId, &Payload)> {
        self.logs
            .get(kind)
            .into_iter()
            .flat_map(|log| log.iter().map(|((hlc, op_id), payload)| (hlc, op_id, payload)))
    }

    /// The winning record of `key` in registry `kind`.
    pub fn registry(&self, kind: &str, key: &str) -> Option<&RegistryEntry> {
        self.registries.get(kind)?.get(key)
    }

    /// Every entry of the registry `kind`, by key.
    pub fn registry_entries(&self, kind: &str) -> impl Iterator<Item = (&str, &RegistryEntry)> {
        self.registries
            .get(kind)
            .into_iter()
            .flat_map(|entries| entries.iter().map(|(key, entry)| (key.as_str(), entry)))
    }

    /// A digest of the whole state (rule F8): equal for equal states, whatever the arrival order.
    pub fn state_hash(&self) -> StateHash {
        let mut hasher = Sha256::new();
        hasher.update(b"fencepost/state/v1\0");
        let agents = self.agents();
        hash_len(&mut hasher, agents.len());
        for (agent_id, agent) in agents {
            hash_bytes(&mut hasher, agent_id.as_bytes());
            hasher.update(agent.fencing_epoch.to_be_bytes());
            let entries = agent.sorted_entries();
            hash_len(&mut hasher, entries.len());
            for (run, entry) in entries {
                hash_bytes(&mut hasher, run.to_string().as_bytes());
                self.hash_record(&mut hasher, &entry.best);
                match entry.committed_below_failed.as_deref() {
                    None => hasher.update([0]),
                    Some(record) => {
                        hasher.update([1]);
                        self.hash_record(&mut hasher, record);
                    }
                }
            }
        }
        hash_len(&mut hasher, self.logs.len());
        for (kind, log) in &self.logs {
            hash_bytes(&mut hasher, kind.as_bytes());
            hash_len(&mut hasher, log.len());
            for (_, op_id) in log.keys() {
                hasher.update(op_id.0);
            }
        }
        hash_len(&mut hasher, self.registries.len());
        for (kind, registry) in &self.registries {
            hash_bytes(&mut hasher, kind.as_bytes());
            hash_len(&mut hasher, registry.len());
            for (key, entry) in registry {
                hash_bytes(&mut hasher, key.as_bytes());
                hasher.update(entry.op_id.0);
            }
        }
        StateHash(hasher.finalize().into())
    }

    fn hash_record(&self, hasher: &mut Sha256, record: &RunRecord) {
        // The op id covers the record's content; the fields are hashed too so that the digest does
        // not depend on that.
        hasher.update(record.op_id.0);
        hasher.update(record.epoch.to_be_bytes());
        hasher.update([record.status as u8]);
        hasher.update(record.hlc_wall_ms.to_be_bytes());
        hasher.update(record.hlc_counter.to_be_bytes());
        hash_bytes(hasher, self.devices.names[record.device as usize].as_bytes());
    }

    /// Whether the records of the two states are equal field by field (device ids compared by name).
    fn same_record(&self, a: &RunRecord, other: &SyncState, b: &RunRecord) -> bool {
        a.op_id == b.op_id
            && a.epoch == b.epoch
            && a.status == b.status
            && a.hlc_wall_ms == b.hlc_wall_ms
            && a.hlc_counter == b.hlc_counter
            && self.devices.names[a.device as usize] == other.devices.names[b.device as usize]
    }
}

impl PartialEq for SyncState {
    /// Equal folded states: same agents, fencing epochs, runs, commits, logs and registries. Device
    /// table order and bookkeeping do not count.
    fn eq(&self, other: &Self) -> bool {
        if self.agents.len() != other.agents.len()
            || self.logs != other.logs
            || self.registries != other.registries
        {
            return false;
        }
        self.agents.iter().all(|(agent_id, agent)| {
            let Some(theirs) = other.agents.get(agent_id) else {
                return false;
            };
            agent.fencing_epoch == theirs.fencing_epoch
                && agent.visible_entries().count() == theirs.visible_entries().count()
                && agent.visible_entries().all(|(run, entry)| {
                    theirs.visible_entry(run).is_some_and(|their_entry| {
                        self.same_record(&entry.best, other, &their_entry.best)
                            && match (&entry.committed_below_failed, &their_entry.committed_below_failed) {
                                (None, None) => true,
                                (Some(a), Some(b)) => self.same_record(a, other, b),
                                _ => false,
                            }
                    })
                })
        })
    }
}

fn hash_len(hasher: &mut Sha256, length: usize) {
    hasher.update((length as u64).to_be_bytes());
}

fn hash_bytes(hasher: &mut Sha256, bytes: &[u8]) {
    hash_len(hasher, bytes.len());
    hasher.update(bytes);
}

/// A digest of a folded state ([`SyncState::state_hash`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateHash(pub [u8; 32]);

impl std::fmt::Display for StateHash {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = String::with_capacity(64);
        crate::hex::push_lower_hex(&mut text, &self.0);
        formatter.write_str(&text)
    }
}

impl std::fmt::Debug for StateHash {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "StateHash({self})")
    }
}
