//! [`LedgerState`]: the folded view of a ledger's records, without I/O (what a checkpoint or a
//! snapshot saves, and what the [`Ledger`](super::Ledger) keeps up to date).

use std::borrow::Cow;

use super::*;

/// What a ledger knows, as a value with no I/O: the folded state of the records it was given,
/// each device's verified head (every record is checked against it, rule O1, before it reaches
/// the fold), the index of attempts per run (rule D2) and the devices at each agent's highest
/// `pending` epoch. [`Ledger`] keeps one and feeds it what its relay hands over; anything else
/// that holds records (a test, a simulator, a relay of its own) can feed one directly.
#[derive(Debug, Default)]
pub struct LedgerState {
    pub(super) state: SyncState,
    pub(super) frontier: Frontier,
    /// Per device, the head of the records folded.
    pub(super) heads: BTreeMap<String, LogHead>,
    /// Per device, the seq of the first id kept and the id of each record folded from it on, by
    /// seq: what a published head (rule H3) is compared with. From seq 0, or from the first id a
    /// snapshot kept.
    pub(super) ids: BTreeMap<String, (u64, Vec<OpId>)>,
    /// The verified records of the other surfaces (logs, registries), for a snapshot.
    pub(super) other_records: Vec<OpRecord>,
    /// Per device, the record handed over that did not verify (a forged or damaged one): damage
    /// until a valid record takes its place.
    pub(super) rejected: BTreeMap<String, RelayProblem>,
    /// Per agent and run, the attempts, for runs with no commit.
    pub(super) attempts: BTreeMap<String, BTreeMap<RunKey, Attempts>>,
    /// Per agent, the highest epoch of its `pending` intents and the devices that wrote one at it:
    /// only the holder of an epoch writes `pending`s at it, so two devices there mean the epoch
    /// was granted twice (a coordinator that lost or rolled back its state).
    pub(super) pending_epochs: BTreeMap<String, (u64, BTreeSet<String>)>,
    /// The committed runs that the checkpoint this view started from left out (the oracle's
    /// retention, [`Forgetting`](crate::fold::Forgetting)); kept with the snapshot.
    pub(super) forgotten: Option<crate::fold::Forgetting>,
    /// Records known by their place and id from the checkpoint this view started from after
    /// records were pruned (its heads and its line's): what [`holds`](Self::holds) accepts
    /// where the records themselves are no longer in the relay.
    pub(super) attested: BTreeSet<(String, u64, OpId)>,
    /// A protected ledger's logs as this reading opened them (issue 39): `None` for a ledger
    /// that is not protected, where a sealed record is damage.
    pub(super) protected: Option<crate::protected::ProtectedLogs>,
    /// Whether a reading that is not protected was handed a sealed record: the ledger is
    /// protected, and this host, no member, must never write into it.
    pub(super) sealed_seen: bool,
    /// Per device, why its protected log is damage for good (another ledger's genesis): unlike
    /// [`rejected`](Self::rejected), no later record of the device clears it.
    pub(super) protected_damage: BTreeMap<String, RelayProblem>,
}

/// Why a record in the clear of format 2 handed to a protected reading is damage.
const CLEAR_IN_PROTECTED: &str = "it is a record in the clear (format 2) in a protected ledger, where every record is sealed: written by a fencepost that is no member, or put there by hand";

/// Why a sealed record handed to an unprotected reading is damage.
const SEALED_UNREAD: &str = "it is a protected ledger's record (sealed, format 4 or 3), which this host cannot read: the ledger is protected and this host is not one of its members";

impl LedgerState {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// The folded state of the records given.
    pub fn state(&self) -> &SyncState {
        &self.state
    }

    /// Per device, how many records were folded.
    pub fn frontier(&self) -> &Frontier {
        &self.frontier
    }

    /// The damage found while verifying: per device, the record that did not verify.
    pub fn rejected(&self) -> impl Iterator<Item = &RelayProblem> {
        self.rejected.values().chain(self.protected_damage.values())
    }

    /// Verifies `ops` against each device's head, folds those that verify and indexes their
    /// attempts; returns them. Records already folded are skipped, and a record that does not
    /// verify is damage of its device ([`rejected`](Self::rejected)) until a valid one takes its
    /// place.
    ///
    /// Whatever the relay hands over is verified first (rule O1: `op_id` over the content, seq,
    /// chain, limits), so a forged record never reaches the fold, whose laws assume records whose
    /// ids match their content. A record that does not verify is damage of its device; the
    /// frontier stays before it.
    ///
    /// A sealed record (a protected ledger's, format 4 or 3) is damage of its device here: this
    /// state folds records as they are, and a sealed one is read only by a member of its ledger.
    pub fn absorb<'ops>(&mut self, ops: &'ops [OpRecord]) -> Vec<Cow<'ops, OpRecord>> {
        self.absorb_from(ops, false)
    }

    /// [`absorb`](Self::absorb); `identified` when a relay that [checks its
    /// records](crate::relay::Relay::checks_records) handed `ops` over, so their ids are not
    /// hashed again (seq, chain and HLC order still are checked).
    pub(crate) fn absorb_from<'ops>(
        &mut self,
        ops: &'ops [OpRecord],
        identified: bool,
    ) -> Vec<Cow<'ops, OpRecord>> {
        let verified = self.accept_from(ops, identified);
        self.fold_accepted(&verified);
        verified
    }

    /// The first half of [`absorb_from`](Self::absorb_from): verifies `ops` against each
    /// device's head and returns the records to fold (a protected ledger's opened), folding
    /// none yet ([`fold_accepted`](Self::fold_accepted) does), so that a caller can load what
    /// they continue first.
    pub(crate) fn accept_from<'ops>(
        &mut self,
        ops: &'ops [OpRecord],
        identified: bool,
    ) -> Vec<Cow<'ops, OpRecord>> {
        let mut verified: Vec<Cow<'ops, OpRecord>> = Vec::with_capacity(ops.len());
        // A protected ledger's records, offered a device's run at a time (one head verified).
        let mut batch: Vec<OpRecord> = Vec::new();
        for op in ops {
            let device = &*op.device_id;
            let head = match self.heads.get_mut(device) {
                Some(head) => head,
                None => self
                    .heads
                    .entry(device.to_owned())
                    .or_insert_with(|| LogHead::new(Arc::clone(&op.device_id))),
            };
            if op.seq < head.next_seq() {
                continue; // folded before
            }
            if self.rejected.contains_key(device) && op.seq > head.next_seq() {
                continue; // after a record that did not verify
            }
            let protected = self.protected.is_some();
            let accepted = if protected && op.surface != Surface::Sealed {
                Err(CLEAR_IN_PROTECTED.to_owned())
            } else if !protected && op.surface == Surface::Sealed {
                // A protected ledger's record reaches this state only opened: sealed, it would
                // fold to nothing, and a commit in it would be read as absent.
                self.sealed_seen = true;
                Err(SEALED_UNREAD.to_owned())
            } else if identified {
                head.accept_identified(op).map_err(|error| error.to_string())
            } else {
                head.accept(op).map_err(|error| error.to_string())
            };
            match accepted {
                Ok(()) => {
                    if !self.rejected.is_empty() {
                        self.rejected.remove(device);
                    }
                    match self.ids.get_mut(device) {
                        Some((_, ids)) => ids.push(op.op_id),
                        None => drop(self.ids.insert(device.to_owned(), (op.seq, vec![op.op_id]))),
                    }
                    match self.protected.as_mut() {
                        None => {
                            if op.surface != Surface::Intent {
                                self.other_records.push(op.clone());
                            }
                            verified.push(Cow::Borrowed(op));
                        }
                        Some(_) => {
                            if batch.last().is_some_and(|last| last.device_id != op.device_id) {
                                self.release(std::mem::take(&mut batch), &mut verified);
                            }
                            batch.push(op.clone());
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(error, "the relay handed over a record that does not verify");
                    self.rejected.insert(
                        device.to_owned(),
                        RelayProblem {
                            kind: crate::relay::ProblemKind::Damage,
                            device_id: Some(device.to_owned()),
                            file: None,
                            line_number: Some(op.seq.saturating_add(1)),
                            detail: format!("the relay handed over a record that does not verify: {error}"),
                        },
                    );
                }
            }
        }
        self.release(batch, &mut verified);
        verified
    }

    /// Offers `batch`, accepted records of one device's protected log, and adds what they
    /// release to `verified`: the records opened, and void intents (read as `pending`s).
    fn release(&mut self, batch: Vec<OpRecord>, verified: &mut Vec<Cow<'_, OpRecord>>) {
        let Some(logs) = self.protected.as_mut() else {
            return;
        };
        let Some(device) = batch.first().map(|op| Arc::clone(&op.device_id)) else {
            return;
        };
        let released = logs.offer_all(batch);
        if let Some(detail) = released.damage {
            self.protected_damage.insert(
                device.to_string(),
                RelayProblem {
                    kind: crate::relay::ProblemKind::Damage,
                    device_id: Some(device.to_string()),
                    file: None,
                    line_number: Some(1),
                    detail,
                },
            );
        }
        for opened in released.fold {
            if opened.surface != Surface::Intent {
                self.other_records.push(opened.clone());
            }
            verified.push(Cow::Owned(opened));
        }
        // A void intent reads as a `pending`: its epoch fences and its run is in doubt.
        // Nothing else of a void record is folded.
        let void = released.void.into_iter();
        verified.extend(void.filter(|op| op.surface == Surface::Intent).map(Cow::Owned));
    }

    /// The second half of [`absorb_from`](Self::absorb_from): folds the records
    /// [`accept_from`](Self::accept_from) returned and indexes their attempts.
    pub(crate) fn fold_accepted(&mut self, verified: &[Cow<'_, OpRecord>]) {
        match &self.protected {
            None => self.frontier.observe_all(verified.iter().map(|op| &**op)),
            Some(logs) => {
                for (device, next, last) in logs.settled() {
                    self.frontier.raise_to(device, next, Some(last));
                }
            }
        }
        self.state.apply_all(verified.iter().map(|op| &**op));
        for op in verified {
            // Only intent records are attempts: a record of another surface with the same fields
            // (an audit mirror, say) settles nothing, exactly as the fold ignores it.
            if op.surface != Surface::Intent {
                continue;
            }
            // Read in place: no allocation unless the run is in doubt.
            let Some(intent) = op.payload.compact_intent() else {
                continue;
            };
            let agent = intent.agent.as_str();
            if intent.status == IntentStatus::Pending {
                // No allocation for the common case: a known agent, a known device.
                if !self.pending_epochs.contains_key(agent) {
                    self.pending_epochs.insert(agent.to_owned(), Default::default());
                }
                if let Some((top, devices)) = self.pending_epochs.get_mut(agent) {
                    if intent.epoch > *top {
                        *top = intent.epoch;
                        devices.clear();
                    }
                    if intent.epoch == *top && !devices.contains(&*op.device_id) {
                        devices.insert(op.device_id.to_string());
                    }
                }
            }
            // A commit was just folded; anything else asks the fold (one lookup).
            let committed = intent.status == IntentStatus::Committed
                || self.state.committed_run_key(agent, &intent.run).is_some();
            if committed {
                if let Some(runs) = self.attempts.get_mut(agent) {
                    runs.remove(&intent.run);
                }
                continue;
            }
            let runs = match self.attempts.get_mut(agent) {
                Some(runs) => runs,
                None => self.attempts.entry(agent.to_owned()).or_default(),
            };
            let attempts = runs.entry(intent.run.clone()).or_default();
            if intent.status == IntentStatus::Pending {
                if !attempts.settled.contains(&intent.epoch) {
                    let candidate = InDoubtRun {
                        run_id: intent.run.to_string(),
                        epoch: intent.epoch,
                        device_id: op.device_id.to_string(),
                        op_id: op.op_id,
                    };
                    let slot = attempts
                        .unsettled
                        .entry(intent.epoch)
                        .or_insert_with(|| candidate.clone());
                    if candidate.op_id > slot.op_id {
                        *slot = candidate;
                    }
                }
            } else {
                attempts.settled.insert(intent.epoch);
                attempts.unsettled.remove(&intent.epoch);
            }
        }
    }

    /// The runs of `agent_id` in doubt for a holder at `held_epoch` (rule D2): no `committed`
    /// record, and a `pending` of an epoch below `held_epoch` with no `committed` or `failed` of
    /// that epoch. Each run is reported once, at its greatest such epoch. Call it right after
    /// acquiring, before dispatching; see the [dispatch docs](crate::dispatch) for what to do with them.
    /// `held_epoch = u64::MAX` lists every run in doubt.
    pub fn in_doubt(&self, agent_id: &str, held_epoch: u64) -> Vec<InDoubtRun> {
        self.attempts
            .get(agent_id)
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|attempts| attempts.unsettled.range(..held_epoch).next_back())
            .map(|(_, run)| run.clone())
            .collect()
    }

    /// Another device than the claim's that wrote a `pending` of its agent at its epoch, when
    /// that epoch is the highest of the agent's `pending`s: only the holder of an epoch writes
    /// them, so the coordinator granted the epoch to the claim's device after it had granted it
    /// to that device (it lost or rolled back its state). `None` when no other device did, as far
    /// as this ledger knows.
    pub fn epoch_used_by_another(&self, claim: &Claim) -> Option<String> {
        self.other_pending_device(&claim.agent, claim.epoch.get(), &claim.device)
    }

    /// [`epoch_used_by_another`](Self::epoch_used_by_another), of ids already checked.
    pub(crate) fn other_pending_device(&self, agent_id: &str, epoch: u64, device_id: &str) -> Option<String> {
        let (top, devices) = self.pending_epochs.get(agent_id)?;
        if *top != epoch {
            return None;
        }
        devices.iter().find(|device| *device != device_id).cloned()
    }

    /// Whether `run_id` of `agent_id` is in doubt for a holder at `held_epoch`: like
    /// [`in_doubt`](Self::in_doubt), but a `pending` *at* `held_epoch` with no outcome counts too
    /// (an earlier attempt of this tenure whose outcome was never stored).
    pub fn in_doubt_run(&self, agent_id: &str, run_id: &str, held_epoch: u64) -> Option<InDoubtRun> {
        let attempts = self.attempts.get(agent_id)?.get(&RunKey::new(run_id))?;
        attempts
            .unsettled
            .range(..=held_epoch)
            .next_back()
            .map(|(_, run)| run.clone())
    }
}

impl LedgerState {
    /// Whether `rule` forgets run `run_id` of `agent_id`, whose entry is `summary`: the rule
    /// applies to the agent, the run has a commit, its greatest record and its greatest commit
    /// are both among the records the anchor covered (`covered`, from
    /// [`covered_ids`](Self::covered_ids)), and it has no attempt in doubt (rule D2).
    pub(crate) fn forgets(
        &self,
        rule: &crate::fold::Forgetting,
        covered: &Covered,
        agent_id: &str,
        run_id: &str,
        summary: &crate::fold::RunSummary,
    ) -> bool {
        let in_doubt = self
            .attempts
            .get(agent_id)
            .and_then(|runs| runs.get(&RunKey::new(run_id)))
            .is_some_and(|attempts| !attempts.unsettled.is_empty());
        !in_doubt
            && rule.applies_to(agent_id)
            && covered.holds(&summary.best.op_id)
            && summary
                .committed()
                .is_some_and(|committed| covered.holds(&committed.op_id))
    }

    /// The id of record `seq` of device `device_id`, when the view keeps it.
    pub(crate) fn id_at(&self, device_id: &str, seq: u64) -> Option<OpId> {
        let (first, ids) = self.ids.get(device_id)?;
        ids.get(usize::try_from(seq.checked_sub(*first)?).ok()?).copied()
    }

    /// The id this view knows (without reading it again) of the last of the first `records`
    /// records of `device_id` ([`known_id`](Self::known_id)): what a mark of them (the seen
    /// file's, a snapshot's, a checkpoint's) is compared with.
    pub(super) fn last_id_known(&self, device_id: &str, records: u64) -> Option<OpId> {
        self.known_id(device_id, records.checked_sub(1)?)
    }

    /// [`id_at`](Self::id_at), or where the records were removed from the relay, the id the
    /// checkpoint this view started from gives for record `seq` (a head of it or of its line).
    pub(crate) fn known_id(&self, device_id: &str, seq: u64) -> Option<OpId> {
        self.id_at(device_id, seq).or_else(|| {
            let next = seq.checked_add(1)?;
            self.attested
                .iter()
                .find(|(device, next_seq, _)| device == device_id && *next_seq == next)
                .map(|(_, _, id)| *id)
        })
    }

    /// Its heads as a compaction of a line names them: per device, the count and the id of the
    /// last record.
    pub(crate) fn compaction_heads(&self) -> Vec<(String, u64, OpId)> {
        self.heads
            .values()
            .filter_map(|head| Some((head.device_id().to_string(), head.next_seq(), head.last_op_id()?)))
            .collect()
    }

    /// Whether every head of `heads` (per device, a count and the id of the last record) is a
    /// record this view has, at its place.
    pub(crate) fn holds(&self, heads: &[(String, u64, OpId)]) -> bool {
        heads.iter().all(|(device, next_seq, last)| {
            next_seq.checked_sub(1).and_then(|seq| self.id_at(device, seq)) == Some(*last)
                || self.attested.contains(&(device.clone(), *next_seq, *last))
        })
    }

    /// The records that `rule`'s anchor covered, as this view knows them: the ids it keeps of
    /// each device up to the anchor's head there; and when the anchor covers every record
    /// before the first id it keeps of every device (a view that started from a checkpoint
    /// after records were pruned, or from a snapshot), every record it knows only from there.
    pub(crate) fn covered_ids(&self, rule: &crate::fold::Forgetting) -> Covered {
        let anchor = |device: &str| {
            rule.anchor_heads
                .iter()
                .find(|(covered, _)| covered == device)
                .map_or(0, |(_, next_seq)| *next_seq)
        };
        let mut covered = Covered::default();
        for (device, (first, ids)) in &self.ids {
            let end = usize::try_from(anchor(device).saturating_sub(*first))
                .unwrap_or(usize::MAX)
                .min(ids.len());
            covered.ids.extend(ids[..end].iter().copied());
        }
        // Where each device's kept ids begin (a device without any: after all its records).
        let begins =
            |device: &str, head: &LogHead| self.ids.get(device).map_or(head.next_seq(), |(first, _)| *first);
        let unknown_before = self.heads.iter().any(|(device, head)| begins(device, head) > 0);
        let anchor_covers_them = self
            .heads
            .iter()
            .all(|(device, head)| anchor(device) >= begins(device, head));
        if unknown_before && anchor_covers_them {
            covered.known = Some(
                self.ids
                    .values()
                    .flat_map(|(_, ids)| ids.iter().copied())
                    .collect(),
            );
        }
        covered
    }

    /// Removes the runs that `rule` forgets ([`forgets`](Self::forgets)).
    pub(crate) fn forget_runs(&mut self, rule: &crate::fold::Forgetting) {
        let covered = self.covered_ids(rule);
        let mut forgotten = Vec::new();
        let listed: Result<(), std::convert::Infallible> =
            self.state.for_each_run_summary(|agent, run, summary| {
                if self.forgets(rule, &covered, agent, run, &summary) {
                    forgotten.push((agent.to_owned(), run.to_owned()));
                }
                Ok(())
            });
        let Ok(()) = listed;
        for (agent, run) in &forgotten {
            self.state.forget_run(agent, run);
        }
    }

    /// The view a snapshot's loaded part stands for (its runs stay in the store); `Err` when the
    /// part is not one a view makes.
    pub(crate) fn restored(base: &SnapshotBase) -> Result<Self, String> {
        let mut view = Self::default();
        for mark in &base.heads {
            let head = LogHead::from_mark(mark)
                .ok_or_else(|| format!("the head of {:?} is damaged", mark.device_id))?;
            view.frontier
                .raise_to(&mark.device_id, head.next_seq(), head.last_op_id());
            if view.heads.insert(mark.device_id.clone(), head).is_some() {
                return Err(format!("two heads of {:?}", mark.device_id));
            }
        }
        for (device, first, ids) in &base.recent_ids {
            let next = first.checked_add(ids.len() as u64);
            if next != Some(view.frontier.next_seq(device)) || ids.is_empty() {
                return Err(format!("the ids of {device:?} do not end at its head"));
            }
            view.ids.insert(device.clone(), (*first, ids.clone()));
        }
        for (agent, epoch) in &base.fencing {
            view.state.raise_fencing_epoch(agent, *epoch);
        }
        for (agent, top, devices) in &base.pending_epochs {
            view.pending_epochs
                .insert(agent.clone(), (*top, devices.iter().cloned().collect()));
        }
        for mark in &base.attempts {
            let attempts = Attempts {
                unsettled: mark
                    .unsettled
                    .iter()
                    .map(|run| (run.epoch, run.clone()))
                    .collect(),
                settled: mark.settled.iter().copied().collect(),
            };
            view.attempts
                .entry(mark.agent.clone())
                .or_default()
                .insert(RunKey::new(&mark.run), attempts);
        }
        view.forgotten = base.forgotten.clone();
        for line in &base.records {
            let op = OpRecord::from_json(line.as_bytes())
                .map_err(|error| format!("a stored record is damaged: {error}"))?;
            let folded = view
                .heads
                .get(&*op.device_id)
                .is_some_and(|head| op.seq < head.next_seq());
            // A protected ledger's records are kept opened: their ids are the sealed records'.
            let identified = base.protected.is_some() || op.has_valid_id();
            if op.surface == Surface::Intent || !folded || !identified {
                return Err("a stored record is not one of the other surfaces' verified records".to_owned());
            }
            view.state.apply(&op);
            view.other_records.push(op);
        }
        Ok(view)
    }

    /// The loaded part of a snapshot of this view, with the relay's `cursor`.
    pub(crate) fn base_mark(&self, cursor: Value) -> SnapshotBase {
        SnapshotBase {
            heads: self.heads.values().map(LogHead::mark).collect(),
            recent_ids: self
                .ids
                .iter()
                .map(|(device, (first, ids))| {
                    let skip = ids.len().saturating_sub(RECENT_IDS);
                    (device.clone(), first + skip as u64, ids[skip..].to_vec())
                })
                .collect(),
            fencing: self
                .state
                .agents()
                .into_iter()
                .map(|(agent, folded)| (agent.to_owned(), folded.fencing_epoch()))
                .collect(),
            pending_epochs: self
                .pending_epochs
                .iter()
                .map(|(agent, (top, devices))| (agent.clone(), *top, devices.iter().cloned().collect()))
                .collect(),
            attempts: self
                .attempts
                .iter()
                .flat_map(|(agent, runs)| {
                    runs.iter().map(move |(run, attempts)| AttemptsMark {
                        agent: agent.clone(),
                        run: run.to_string(),
                        unsettled: attempts.unsettled.values().cloned().collect(),
                        settled: attempts.settled.iter().copied().collect(),
                    })
                })
                .collect(),
            records: self
                .other_records
                .iter()
                .map(|op| {
                    let mut line = Vec::new();
                    op.write_json_line(&mut line);
                    String::from_utf8_lossy(&line).trim_end().to_owned()
                })
                .collect(),
            cursor,
            forgotten: self.forgotten.clone(),
            compactions: Vec::new(),
            protected: self
                .protected
                .as_ref()
                .and_then(crate::protected::ProtectedLogs::mark),
        }
    }
}

/// Whether a state with `heads` contains the one saved with `stored`: every stored device at
/// least as far, and the same last record where as far.
pub(super) fn contains(heads: &[HeadMark], stored: &[HeadMark]) -> bool {
    stored.iter().all(|old| {
        heads.iter().any(|new| {
            new.device_id == old.device_id
                && (new.next_seq > old.next_seq || (new.next_seq == old.next_seq && new.last == old.last))
        })
    })
}

/// The records an anchor of the oracle's retention covered ([`LedgerState::covered_ids`]).
#[derive(Debug, Default)]
pub(crate) struct Covered {
    /// The ids of those the view keeps.
    ids: rustc_hash::FxHashSet<OpId>,
    /// When the anchor covers every record the view knows only from the checkpoint or
    /// snapshot it started from: the ids it keeps (any other id is one of those).
    known: Option<rustc_hash::FxHashSet<OpId>>,
}

impl Covered {
    /// Whether the record `id` is covered.
    pub(super) fn holds(&self, id: &OpId) -> bool {
        self.ids.contains(id) || self.known.as_ref().is_some_and(|known| !known.contains(id))
    }
}
