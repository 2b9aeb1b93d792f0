//! Rules F1–F8: intents, the fenced fold and the idempotency oracle.

use std::collections::{BTreeMap, BTreeSet};

use fencepost::clock::ManualClock;
use fencepost::fold::{fold, SyncState};
use fencepost::lease::{
    intent_agent, intent_epoch, intent_is_committed, intent_status_rank, Intent, IntentStatus,
    INTENT_FIELD_AGENT, INTENT_FIELD_EPOCH, INTENT_FIELD_ID, INTENT_FIELD_STATUS,
};
use fencepost::oplog::{DeviceLog, OpRecord, Surface};
use proptest::prelude::*;
use serde_json::{json, Value};

use IntentStatus::{Committed, Failed, Pending};

struct Sites {
    clock: ManualClock,
    logs: BTreeMap<&'static str, DeviceLog>,
}

impl Sites {
    fn new() -> Self {
        let clock = ManualClock::new(1_000);
        let logs = ["laptop", "phone", "server"]
            .into_iter()
            .map(|device| (device, DeviceLog::new(device, clock.wall_clock()).unwrap()))
            .collect();
        Self { clock, logs }
    }

    fn intent(
        &mut self,
        device: &'static str,
        agent: &str,
        run: &str,
        epoch: u64,
        status: IntentStatus,
    ) -> OpRecord {
        self.raw(device, Intent::new(agent, run, epoch, status).payload())
    }

    fn raw(&mut self, device: &'static str, payload: Value) -> OpRecord {
        self.clock.advance(1);
        self.logs
            .get_mut(device)
            .unwrap()
            .append(Surface::Intent, payload)
    }
}

#[test]
fn f1_intent_payload_round_trips_with_the_frozen_keys() {
    assert_eq!(
        [
            INTENT_FIELD_ID,
            INTENT_FIELD_AGENT,
            INTENT_FIELD_EPOCH,
            INTENT_FIELD_STATUS
        ],
        ["id", "agent_id", "epoch", "status"]
    );
    for status in [Pending, Committed, Failed] {
        let intent = Intent::new("milo", "run-abc", 7, status);
        let payload = intent.payload();
        assert_eq!(
            payload,
            json!({"id": "run-abc", "agent_id": "milo", "epoch": 7, "status": status.as_str()})
        );
        assert_eq!(Intent::from_payload(&payload), Some(intent));
    }
}

#[test]
fn f1_from_payload_is_none_on_anything_missing_or_malformed() {
    let good = Intent::new("milo", "run-1", 2, Committed).payload();
    for key in [
        INTENT_FIELD_ID,
        INTENT_FIELD_AGENT,
        INTENT_FIELD_EPOCH,
        INTENT_FIELD_STATUS,
    ] {
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove(key);
        assert_eq!(Intent::from_payload(&missing), None, "without {key}");
    }
    let malformed = [
        json!(null),
        json!([1, 2]),
        json!("run-1"),
        json!({"id": 5, "agent_id": "milo", "epoch": 2, "status": "committed"}),
        json!({"id": "run-1", "agent_id": "", "epoch": 2, "status": "committed"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": -2, "status": "committed"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": 2.5, "status": "committed"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": "2", "status": "committed"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": 2, "status": "done"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": 2, "status": "Committed"}),
    ];
    for payload in malformed {
        assert_eq!(Intent::from_payload(&payload), None, "{payload}");
    }
    // Extra keys are ignored.
    let mut extra = good.clone();
    extra["note"] = json!("hi");
    assert!(Intent::from_payload(&extra).is_some());
}

#[test]
fn f2_readers_are_total() {
    let cases: Vec<(Value, &str, u64, u8, bool)> = vec![
        (
            json!({"agent_id": "milo", "epoch": 3, "status": "committed"}),
            "milo",
            3,
            1,
            true,
        ),
        (
            json!({"agent_id": "milo", "epoch": 3, "status": "failed"}),
            "milo",
            3,
            1,
            false,
        ),
        (
            json!({"agent_id": "milo", "epoch": 3, "status": "pending"}),
            "milo",
            3,
            0,
            false,
        ),
        (json!({"status": "unknown"}), "", 0, 0, false),
        (json!({"status": 1, "epoch": "3", "agent_id": 4}), "", 0, 0, false),
        (json!({"epoch": -1}), "", 0, 0, false),
        (json!({"epoch": 1.5}), "", 0, 0, false),
        (json!({"epoch": u64::MAX}), "", 0, 0, false),
        (json!({"epoch": i64::MAX as u64 + 1}), "", 0, 0, false),
        (json!({"epoch": i64::MAX}), "", i64::MAX as u64, 0, false),
        (json!(null), "", 0, 0, false),
        (json!([]), "", 0, 0, false),
        (json!("committed"), "", 0, 0, false),
        (json!({}), "", 0, 0, false),
    ];
    for (payload, agent, epoch, rank, committed) in cases {
        assert_eq!(intent_agent(&payload), agent, "{payload}");
        assert_eq!(intent_epoch(&payload), epoch, "{payload}");
        assert_eq!(intent_status_rank(&payload), rank, "{payload}");
        assert_eq!(intent_is_committed(&payload), committed, "{payload}");
    }
    assert_eq!([Pending.rank(), Committed.rank(), Failed.rank()], [0, 1, 1]);
}

#[test]
fn f4_fencing_is_per_agent_not_per_run() {
    let mut sites = Sites::new();
    let ops = vec![
        sites.intent("laptop", "milo", "run-b", 1, Pending),
        sites.intent("phone", "milo", "run-a", 2, Pending),
        sites.intent("laptop", "other", "run-b", 1, Pending),
    ];
    let state = fold(&ops);
    assert_eq!(state.fencing_epoch("milo"), 2);
    assert_eq!(state.fencing_epoch("other"), 1);
    assert_eq!(state.fencing_epoch("nobody"), 0);
    assert!(
        state.intent("milo", "run-b").is_none(),
        "run-b's pending is fenced by run-a's epoch"
    );
    assert!(
        state.intent("other", "run-b").is_some(),
        "another agent is not fenced"
    );
}

#[test]
fn f5_a_steal_fences_the_zombies_pending_while_its_commit_stays_in_the_oracle() {
    let mut sites = Sites::new();
    let ops = vec![
        sites.intent("laptop", "milo", "run-1", 1, Pending),
        sites.intent("laptop", "milo", "run-1", 1, Committed),
        sites.intent("laptop", "milo", "run-2", 1, Pending),
        // The phone steals the lease at epoch 2; the laptop (a zombie) keeps writing at epoch 1.
        sites.intent("phone", "milo", "run-3", 2, Pending),
        sites.intent("laptop", "milo", "run-4", 1, Pending),
    ];
    let state = fold(&ops);
    assert!(state.intent("milo", "run-2").is_none());
    assert!(state.intent("milo", "run-4").is_none());
    assert_eq!(
        state.intent("milo", "run-3").map(|r| (r.epoch, r.status)),
        Some((2, Pending))
    );
    // Terminal immunity: the epoch-1 commit is still "who holds" run-1, and still in the oracle.
    assert_eq!(
        state.intent("milo", "run-1").map(|r| (r.epoch, r.status)),
        Some((1, Committed))
    );
    assert_eq!(
        state.committed_run("milo", "run-1").map(|r| r.op_id),
        Some(ops[1].op_id)
    );
    let agent = state.agent("milo").unwrap();
    assert_eq!(
        agent.runs().into_iter().map(|(run, _)| run).collect::<Vec<_>>(),
        ["run-1", "run-3"]
    );
    assert_eq!(agent.committed_runs().len(), 1);
}

#[test]
fn f5_failed_is_terminal_but_not_committed() {
    let mut sites = Sites::new();
    let ops = vec![
        sites.intent("laptop", "milo", "run-1", 1, Pending),
        sites.intent("laptop", "milo", "run-1", 1, Failed),
        sites.intent("phone", "milo", "run-2", 3, Pending),
    ];
    let state = fold(&ops);
    assert_eq!(
        state.intent("milo", "run-1").map(|r| r.status),
        Some(Failed),
        "failed survives fencing"
    );
    assert!(state.committed_run("milo", "run-1").is_none());
}

#[test]
fn f5_the_greatest_record_wins_by_rank_then_epoch_then_hlc_then_op_id() {
    let mut sites = Sites::new();
    // A later pending never beats a terminal record.
    let commit = sites.intent("laptop", "milo", "run-1", 1, Committed);
    let pending = sites.intent("phone", "milo", "run-1", 1, Pending);
    assert_eq!(
        fold(&[commit.clone(), pending.clone()])
            .intent("milo", "run-1")
            .unwrap()
            .op_id,
        commit.op_id
    );
    // A higher epoch beats a later HLC.
    let mut sites = Sites::new();
    let high = sites.intent("laptop", "milo", "run-1", 2, Failed);
    let later = sites.intent("phone", "milo", "run-1", 1, Committed);
    let state = fold(&[later.clone(), high.clone()]);
    assert_eq!(state.intent("milo", "run-1").unwrap().op_id, high.op_id);
    assert_eq!(
        state.committed_run("milo", "run-1").unwrap().op_id,
        later.op_id,
        "F6: the commit stays"
    );
    // Same rank and epoch: the later HLC wins; the device id breaks a same-time tie.
    let mut sites = Sites::new();
    let first = sites.intent("laptop", "milo", "run-1", 1, Pending);
    let second = sites.intent("laptop", "milo", "run-1", 1, Pending);
    assert_eq!(
        fold(&[second.clone(), first.clone()])
            .intent("milo", "run-1")
            .unwrap()
            .op_id,
        second.op_id
    );
    let clock = ManualClock::new(5);
    let mut a = DeviceLog::new("a", clock.wall_clock()).unwrap();
    let mut b = DeviceLog::new("b", clock.wall_clock()).unwrap();
    let from_a = a.append(
        Surface::Intent,
        Intent::new("milo", "run-1", 1, Committed).payload(),
    );
    let from_b = b.append(
        Surface::Intent,
        Intent::new("milo", "run-1", 1, Committed).payload(),
    );
    assert_eq!(from_a.hlc.wall_ms, from_b.hlc.wall_ms);
    assert_eq!(
        fold(&[from_b.clone(), from_a.clone()])
            .intent("milo", "run-1")
            .unwrap()
            .op_id,
        from_b.op_id
    );
}

#[test]
fn f6_the_oracle_keeps_every_commit_whatever_its_epoch() {
    let mut sites = Sites::new();
    let old_commit = sites.intent("laptop", "milo", "run-1", 1, Committed);
    let ops = vec![
        old_commit.clone(),
        sites.intent("phone", "milo", "run-1", 5, Failed),
        sites.intent("server", "milo", "run-1", 4, Failed),
        sites.intent("phone", "milo", "run-9", 9, Pending),
    ];
    let state = fold(&ops);
    assert_eq!(state.fencing_epoch("milo"), 9);
    assert_eq!(state.intent("milo", "run-1").unwrap().status, Failed);
    assert_eq!(
        state.committed_run("milo", "run-1").unwrap().op_id,
        old_commit.op_id
    );
    // A later commit at a higher epoch becomes the oracle's record.
    let mut more = ops.clone();
    let newer = sites.intent("server", "milo", "run-1", 9, Committed);
    more.push(newer.clone());
    assert_eq!(
        fold(&more).committed_run("milo", "run-1").unwrap().op_id,
        newer.op_id
    );
}

#[test]
fn f7_malformed_intents_never_panic_are_fenced_and_never_promoted() {
    let mut sites = Sites::new();
    let malformed = [
        json!(null),
        json!("text"),
        json!([{"id": "run-1"}]),
        json!({"id": "run-1", "agent_id": "milo", "epoch": 50}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": "50", "status": "pending"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": 50, "status": "done"}),
        json!({"id": "", "agent_id": "milo", "epoch": 50, "status": "committed"}),
        json!({"agent_id": "milo", "epoch": 50, "status": "committed"}),
        json!({"id": "run-1", "epoch": 50, "status": "committed"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": 1e300, "status": "committed"}),
        // Above every backend's epoch range (issue: a forged epoch >= 2^63 bricked the agent).
        json!({"id": "run-1", "agent_id": "milo", "epoch": i64::MAX as u64 + 1, "status": "pending"}),
        json!({"id": "run-1", "agent_id": "milo", "epoch": u64::MAX, "status": "committed"}),
    ];
    let good = sites.intent("laptop", "milo", "run-2", 1, Pending);
    let mut ops = vec![good.clone()];
    ops.extend(malformed.into_iter().map(|payload| sites.raw("phone", payload)));
    let state = fold(&ops);
    assert_eq!(
        state.fencing_epoch("milo"),
        1,
        "no malformed op raised the fencing epoch"
    );
    assert!(state.intent("milo", "run-1").is_none());
    assert!(state.committed_run("milo", "run-1").is_none());
    assert_eq!(state.intent("milo", "run-2").unwrap().op_id, good.op_id);
    assert_eq!(state.agents().len(), 1);
    // Pending at epoch 0 is well-formed but never eligible.
    let zero = sites.intent("laptop", "zero", "run-1", 0, Pending);
    assert!(fold(&[zero]).intent("zero", "run-1").is_none());
}

#[test]
fn f7_an_intent_with_extra_fields_folds_like_the_plain_one() {
    let mut sites = Sites::new();
    let mut payload = Intent::new("milo", "run-1", 2, Committed).payload();
    payload["note"] = json!("extra");
    let op = sites.raw("laptop", payload);
    let state = fold(std::slice::from_ref(&op));
    assert_eq!(state.committed_run("milo", "run-1").unwrap().op_id, op.op_id);
    assert_eq!(state.fencing_epoch("milo"), 2);
}

#[test]
fn other_surfaces_fold_as_grow_only_log_and_last_writer_wins_registry() {
    let clock = ManualClock::new(1);
    let mut laptop = DeviceLog::new("laptop", clock.wall_clock()).unwrap();
    let mut phone = DeviceLog::new("phone", clock.wall_clock()).unwrap();
    let note_a = laptop.append(Surface::log("note"), json!({"text": "a"}));
    clock.advance(1);
    let note_b = phone.append(Surface::log("note"), json!({"text": "b"}));
    let set_1 = laptop.append(Surface::registry("setting"), json!({"key": "tz", "value": "UTC"}));
    clock.advance(1);
    let set_2 = phone.append(Surface::registry("setting"), json!({"key": "tz", "value": "CET"}));
    let keyless = phone.append(Surface::registry("setting"), json!({"value": "ignored"}));
    let ops = [
        note_b.clone(),
        set_2.clone(),
        note_a.clone(),
        set_1,
        keyless,
        note_a.clone(),
    ];
    let state = fold(&ops);
    let notes: Vec<_> = state.log("note").map(|(_, op_id, _)| *op_id).collect();
    assert_eq!(notes, [note_a.op_id, note_b.op_id]);
    let entry = state.registry("setting", "tz").unwrap();
    assert_eq!(entry.op_id, set_2.op_id);
    assert_eq!(entry.payload.value()["value"], json!("CET"));
    assert!(state.log("missing").next().is_none());
}

// ---------------------------------------------------------------------------------------------
// Properties and the differential check.

/// One generated record: which device writes it, and what.
#[derive(Debug, Clone)]
struct Step {
    device: usize,
    agent: usize,
    run: usize,
    epoch: u64,
    kind: u8,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step =
        (0..4usize, 0..3usize, 0..6usize, 0..5u64, 0..10u8).prop_map(|(device, agent, run, epoch, kind)| {
            Step {
                device,
                agent,
                run,
                epoch,
                kind,
            }
        });
    prop::collection::vec(step, 0..80)
}

/// Builds valid device logs from the steps: intents of every status, some malformed, some with
/// extra fields, deterministic run ids and plain ones, plus a few registry and log records.
fn build(steps: &[Step]) -> Vec<OpRecord> {
    let clock = ManualClock::new(1_000);
    let mut logs: Vec<DeviceLog> = (0..4)
        .map(|device| DeviceLog::new(&format!("device-{device}"), clock.wall_clock()).unwrap())
        .collect();
    steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            if index % 3 == 0 {
                clock.advance(1); // several records share a millisecond
            }
            let agent = format!("agent-{}", step.agent);
            let run = if step.run % 2 == 0 {
                fencepost::run_id::deterministic_run_id(&agent, "job", &step.run.to_string()).unwrap()
            } else {
                format!("custom-{}", step.run)
            };
            let status = ["pending", "committed", "failed"][usize::from(step.kind % 3)];
            let (surface, payload) = match step.kind {
                0..=5 => (Surface::Intent, json!({"id": run, "agent_id": agent, "epoch": step.epoch, "status": status})),
                6 => (
                    Surface::Intent,
                    json!({"id": run, "agent_id": agent, "epoch": step.epoch, "status": status, "extra": index}),
                ),
                7 => (Surface::Intent, json!({"id": run, "agent_id": agent, "epoch": step.epoch + 10})),
                8 => (Surface::registry("setting"), json!({"key": format!("k{}", step.run % 2), "value": index})),
                _ => (Surface::log("note"), json!({"n": index})),
            };
            logs[step.device].append(surface, payload)
        })
        .collect()
}

/// The reference fold, written straight from F4–F6 with no attempt at speed.
#[derive(Debug, PartialEq)]
struct Reference {
    fencing: BTreeMap<String, u64>,
    runs: BTreeMap<(String, String), String>,
    committed: BTreeMap<(String, String), String>,
}

fn reference_fold(ops: &[OpRecord]) -> Reference {
    let intents: Vec<(Intent, &OpRecord)> = ops
        .iter()
        .filter(|op| op.surface == Surface::Intent)
        .filter_map(|op| op.payload.intent().map(|intent| (intent, op)))
        .collect();
    let mut fencing: BTreeMap<String, u64> = BTreeMap::new();
    for (intent, _) in &intents {
        let epoch = fencing.entry(intent.agent_id.clone()).or_insert(0);
        *epoch = (*epoch).max(intent.epoch);
    }
    let key = |intent: &Intent, op: &OpRecord| (intent.status.rank(), intent.epoch, op.hlc.clone(), op.op_id);
    let mut runs: BTreeMap<(String, String), (_, String)> = BTreeMap::new();
    let mut committed: BTreeMap<(String, String), (_, String)> = BTreeMap::new();
    for (intent, op) in &intents {
        let eligible =
            intent.status.is_terminal() || (intent.epoch == fencing[&intent.agent_id] && intent.epoch >= 1);
        let slot = (intent.agent_id.clone(), intent.run_id.clone());
        let candidate = (key(intent, op), op.op_id.to_string());
        if eligible && runs.get(&slot).is_none_or(|best| candidate.0 > best.0) {
            runs.insert(slot.clone(), candidate.clone());
        }
        if intent.status == Committed && committed.get(&slot).is_none_or(|best| candidate.0 > best.0) {
            committed.insert(slot, candidate);
        }
    }
    Reference {
        fencing,
        runs: runs.into_iter().map(|(slot, (_, id))| (slot, id)).collect(),
        committed: committed.into_iter().map(|(slot, (_, id))| (slot, id)).collect(),
    }
}

fn as_reference(state: &SyncState) -> Reference {
    let mut reference = Reference {
        fencing: BTreeMap::new(),
        runs: BTreeMap::new(),
        committed: BTreeMap::new(),
    };
    for (agent_id, agent) in state.agents() {
        reference
            .fencing
            .insert(agent_id.to_owned(), agent.fencing_epoch());
        for (run, record) in agent.runs() {
            reference
                .runs
                .insert((agent_id.to_owned(), run), record.op_id.to_string());
        }
        for (run, record) in agent.committed_runs() {
            reference
                .committed
                .insert((agent_id.to_owned(), run), record.op_id.to_string());
        }
    }
    reference
}

/// A seeded Fisher–Yates shuffle (splitmix64), so that a failing case replays.
fn shuffle(mut ops: Vec<OpRecord>, mut seed: u64) -> Vec<OpRecord> {
    let mut next = || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for index in (1..ops.len()).rev() {
        let swap = (next() % (index as u64 + 1)) as usize;
        ops.swap(index, swap);
    }
    ops
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// F3, F8: any permutation, with duplicates, folds to the same state and state hash.
    #[test]
    fn f3_f8_any_permutation_and_duplication_folds_to_the_same_state(
        steps in steps(),
        shuffle_seed in any::<u64>(),
        duplicate_every in 1usize..5,
    ) {
        let ops = build(&steps);
        let base = fold(&ops);
        let mut shuffled = shuffle(ops.clone(), shuffle_seed);
        let duplicates: Vec<OpRecord> = shuffled.iter().step_by(duplicate_every).cloned().collect();
        shuffled.extend(duplicates);
        let shuffled = shuffle(shuffled, shuffle_seed ^ 0x5eed);
        let other = fold(&shuffled);
        prop_assert!(other == base);
        prop_assert_eq!(other.state_hash(), base.state_hash());
    }

    /// F3: folding a prefix and applying the tail (in any split) equals folding everything.
    #[test]
    fn f3_apply_of_a_tail_onto_a_folded_prefix_equals_fold_of_the_whole(
        steps in steps(),
        split in any::<prop::sample::Index>(),
    ) {
        let ops = build(&steps);
        let at = if ops.is_empty() { 0 } else { split.index(ops.len() + 1) };
        let mut state = fold(&ops[..at]);
        for op in &ops[at..] {
            state.apply(op);
        }
        let whole = fold(&ops);
        prop_assert_eq!(state.state_hash(), whole.state_hash());
        prop_assert!(state == whole);
        // Merging two halves folded separately (a site that pulled the other's log).
        let mut merged = fold(&ops[at..]);
        merged.apply_all(&ops[..at]);
        prop_assert!(merged == whole);
    }

    /// F3, F5, F6 (what a snapshot or checkpoint relies on): merging the run summaries and
    /// fencing epochs of one folded set into the fold of another equals folding their union,
    /// for any split, with records in both.
    #[test]
    fn f3_merging_run_summaries_equals_folding_the_union(
        steps in steps(),
        mask in any::<u64>(),
        overlap in any::<u64>(),
    ) {
        let ops = build(&steps);
        let mut left = Vec::new();
        let mut right = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            let bit = 1u64 << (index % 64);
            if mask & bit != 0 || overlap & bit != 0 {
                left.push(op.clone());
            }
            if mask & bit == 0 || overlap & bit != 0 {
                right.push(op.clone());
            }
        }
        let summarized = fold(&right);
        let mut merged = fold(&left);
        for (agent, run, summary) in summarized.run_summaries() {
            prop_assert_eq!(summarized.run_summary(agent, &run), Some(summary.clone()));
            merged.merge_summary(agent, &run, &summary);
        }
        for (agent, folded) in summarized.agents() {
            merged.raise_fencing_epoch(agent, folded.fencing_epoch());
        }
        merged.apply_all(right.iter().filter(|op| op.surface != Surface::Intent));
        let whole = fold(&ops);
        prop_assert!(merged == whole);
        prop_assert_eq!(merged.state_hash(), whole.state_hash());
        prop_assert_eq!(as_reference(&merged), reference_fold(&ops));
    }

    /// F4–F6: the fold agrees with the naive reference on random op sets.
    #[test]
    fn f4_f5_f6_fold_agrees_with_the_reference(steps in steps()) {
        let ops = build(&steps);
        prop_assert_eq!(as_reference(&fold(&ops)), reference_fold(&ops));
    }

    /// F8: different op sets that fold to different states have different hashes.
    #[test]
    fn f8_different_states_have_different_hashes(steps in steps()) {
        let ops = build(&steps);
        let mut seen: BTreeMap<String, SyncState> = BTreeMap::new();
        for end in 0..=ops.len() {
            let state = fold(&ops[..end]);
            let hash = state.state_hash().to_string();
            if let Some(earlier) = seen.get(&hash) {
                prop_assert!(*earlier == state, "equal hashes for unequal states");
            } else {
                seen.insert(hash, state);
            }
        }
    }
}

#[test]
fn f8_the_hash_changes_with_each_kind_of_change() {
    let mut sites = Sites::new();
    let base = vec![sites.intent("laptop", "milo", "run-1", 1, Pending)];
    let variants = vec![
        vec![sites.intent("laptop", "milo", "run-1", 1, Committed)],
        vec![sites.intent("laptop", "milo", "run-2", 1, Pending)],
        vec![sites.intent("laptop", "eve", "run-1", 1, Pending)],
        vec![sites.intent("laptop", "milo", "run-1", 2, Pending)],
        vec![sites.raw("phone", json!({"not": "an intent"}))],
    ];
    let mut hashes = BTreeSet::new();
    hashes.insert(fold(&base).state_hash());
    for variant in variants {
        let mut ops = base.clone();
        ops.extend(variant);
        let state = fold(&ops);
        let fresh = hashes.insert(state.state_hash());
        // A malformed intent changes nothing, so its state equals the base.
        assert_eq!(fresh, state != fold(&base), "{ops:?}");
    }
    assert_eq!(hashes.len(), 5);
}
