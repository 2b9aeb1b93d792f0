//! The relay conformance suite: rule R1, one function per clause, that every [`Relay`] must pass.
//!
//! A relay's test file implements [`RelayHarness`] (how to make a fresh, empty store, and how to
//! open more handles on it) and calls [`run_all`], or each function from a test of its own; each
//! panics, with a message naming the rule, when the relay breaks it.
//!
//! * [`r1_push_is_idempotent`], [`r1_push_verifies_chains_and_a_refused_push_stores_nothing`],
//!   [`r1_pull_returns_exactly_what_the_frontier_lacks`]: the store's contract, one handle at a
//!   time (and a fresh handle sees what another stored).
//! * [`r1_concurrent_writers_of_distinct_devices_lose_nothing`] and
//!   [`r1_writers_sharing_a_device_id_interleave_and_never_fork`]: several handles at once, each
//!   on a thread of its own. Give every call of [`RelayStore::open`] its own connection or file
//!   handles, as a process of its own would have, so that the store's own exclusion is what is
//!   tested (advisory file locks, row locks), not a mutex of one handle.
//! * [`r1_damage_of_one_device_is_isolated_and_reported`]: for relays whose storage can be damaged
//!   (files, database rows), through [`RelayStore::damage`]. [`run_all`] does not call it: an
//!   in-memory relay has no medium to damage.
//!
//! * [`k5_a_pruned_log_is_read_from_where_it_begins`]: for relays that prune
//!   ([`Relay::prune`]). [`run_all`] does not call it either: an in-memory relay keeps every
//!   record.
//!
//! ```
//! use fencepost::conformance::relay::{self, RelayHarness, RelayStore};
//! use fencepost::relay::{InMemoryRelay, Relay};
//!
//! struct Memory;
//! impl RelayHarness for Memory {
//!     fn fresh_store(&self) -> RelayStore {
//!         let relay = InMemoryRelay::new();
//!         RelayStore::new(move || Box::new(relay.clone()) as Box<dyn Relay>)
//!     }
//! }
//! relay::run_all(&Memory);
//! ```

use std::collections::BTreeSet;
use std::num::NonZeroU32;

use serde_json::json;

use crate::clock::{HlcConfig, ManualClock};
use crate::id::DeviceId;
use crate::identity::{DeviceKey, LedgerId};
use crate::oplog::{verify_log, DeviceLog, LogError, OpRecord, SealedContent, Surface};
use crate::relay::{Frontier, ProblemKind, Relay, RelayError};
use crate::seal::LedgerKey;

/// Opens a handle on one relay store.
pub type RelayOpener = Box<dyn Fn() -> Box<dyn Relay> + Send + Sync>;

/// Damages the stored log of the named device, in place.
pub type Damager = Box<dyn Fn(&str) + Send + Sync>;

/// One store of a relay under test.
pub struct RelayStore {
    /// Opens another handle on the store (for a folder, another relay on it; for a database,
    /// another connection).
    pub open: RelayOpener,
    /// Damages a device's stored log as its medium can be damaged: one record, neither the first
    /// nor the last of three or more, made unreadable (a corrupt line, a corrupt row), so that
    /// the device's log can no longer be read in full. `None` when the store has no such medium.
    pub damage: Option<Damager>,
}

impl RelayStore {
    /// A store with no damage hook.
    pub fn new(open: impl Fn() -> Box<dyn Relay> + Send + Sync + 'static) -> Self {
        Self {
            open: Box::new(open),
            damage: None,
        }
    }

    /// The store, with a damage hook.
    pub fn with_damage(mut self, damage: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.damage = Some(Box::new(damage));
        self
    }
}

impl std::fmt::Debug for RelayStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RelayStore")
            .field("damage", &self.damage.is_some())
            .finish_non_exhaustive()
    }
}

/// What the suite needs from a relay.
pub trait RelayHarness: Sync {
    /// A new, empty store.
    fn fresh_store(&self) -> RelayStore;

    /// Whether the records the suite pushes are a protected ledger's (sealed, with signed
    /// heads, [`OpRecord::sealed`]) instead of plain ones: a relay carries both alike, and hands
    /// sealed records back byte for byte. Concurrent writers append plain records either way
    /// (they test the claim, not the content).
    ///
    /// The default: `false`.
    fn sealed(&self) -> bool {
        false
    }
}

/// Runs every rule function that applies to any relay (all but the damage rule).
pub fn run_all(harness: &dyn RelayHarness) {
    r1_push_is_idempotent(harness);
    r1_push_verifies_chains_and_a_refused_push_stores_nothing(harness);
    r1_pull_returns_exactly_what_the_frontier_lacks(harness);
    r1_concurrent_writers_of_distinct_devices_lose_nothing(harness);
    r1_writers_sharing_a_device_id_interleave_and_never_fork(harness);
}

/// `count` records of `device`'s log, from its start: plain, or sealed and signed when the
/// harness says so ([`RelayHarness::sealed`]).
fn records(harness: &dyn RelayHarness, device: &str, count: usize) -> Vec<OpRecord> {
    let clock = ManualClock::new(10_000);
    let mut log = DeviceLog::new(device, clock.wall_clock()).expect("a valid device id");
    let plain = (0..count).map(|n| log.append(Surface::log("note"), json!({"n": n, "device": device})));
    if !harness.sealed() {
        return plain.collect();
    }
    let ledger = LedgerId([7; 32]);
    let key = LedgerKey::new(NonZeroU32::MIN, [3; 32]);
    let device_id = DeviceId::new(device).expect("a valid device id");
    let signer = DeviceKey::from_secrets(device_id, [5; 32], [6; 32]);
    let mut sealed: Vec<OpRecord> = Vec::with_capacity(count);
    for (n, mut op) in plain.enumerate() {
        op.prev = sealed.last().map(|last| last.op_id);
        // A nonce is never used twice with one key: the record's number and its device.
        let mut nonce = [0u8; 24];
        nonce[..8].copy_from_slice(&(n as u64).to_be_bytes());
        for (at, byte) in device.bytes().take(16).enumerate() {
            nonce[8 + at] = byte;
        }
        let record = op
            .seal_with_nonce(&key, ledger, nonce)
            .expect("a small record seals");
        let origin = sealed.first().map_or(record.op_id, |first| first.op_id);
        sealed.push(record.signed(&signer, &ledger, &origin));
    }
    sealed
}

/// `op` with its content changed and its `op_id` kept.
fn tampered(op: &OpRecord) -> OpRecord {
    let mut tampered = op.clone();
    match op.sealed_record() {
        Some(record) => {
            let mut content = record.content.clone();
            if let SealedContent::Sealed(sealed) = &mut content {
                sealed.ciphertext[0] ^= 1;
            }
            let mut changed = OpRecord::sealed(op.device_id.clone(), op.seq, op.prev, content);
            changed.op_id = op.op_id;
            tampered = changed;
        }
        None => tampered.payload = json!({"n": "changed"}).into(),
    }
    tampered
}

fn ids(ops: &[OpRecord]) -> Vec<String> {
    ops.iter().map(|op| op.op_id.to_string()).collect()
}

/// The records of `device` in `ops`, in their order.
fn of_device(ops: &[OpRecord], device: &str) -> Vec<OpRecord> {
    ops.iter()
        .filter(|op| &*op.device_id == device)
        .cloned()
        .collect()
}

/// R1: pushing records again stores nothing twice; an overlapping batch stores only its new part.
pub fn r1_push_is_idempotent(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    let relay = (store.open)();
    let laptop = records(harness, "laptop", 30);
    let first = relay.push(&laptop[..20]).expect("R1: a valid push is stored");
    assert_eq!(
        (first.appended, first.already_present),
        (20, 0),
        "R1: a first push stores every record"
    );
    let again = relay
        .push(&laptop[..20])
        .expect("R1: pushing stored records again is not an error");
    assert_eq!(
        (again.appended, again.already_present),
        (0, 20),
        "R1: pushing stored records again stores nothing"
    );
    let overlapping = relay
        .push(&laptop[10..])
        .expect("R1: an overlapping push is stored");
    assert_eq!(
        (overlapping.appended, overlapping.already_present),
        (10, 10),
        "R1: an overlapping push stores only its new records"
    );
    // Through another handle, as another site would push.
    let other = (store.open)();
    let from_other = other.push(&laptop).expect("R1: a push through another handle");
    assert_eq!(
        (from_other.appended, from_other.already_present),
        (0, 30),
        "R1: another handle sees the stored records as stored"
    );
    let all = other.pull(&Frontier::new()).expect("R1: pull");
    assert_eq!(
        ids(&all.ops),
        ids(&laptop),
        "R1: every record is stored once, in order"
    );
    assert!(
        all.problems.is_empty(),
        "R1: no problem on a sound store: {:?}",
        all.problems
    );
    if harness.sealed() {
        assert_eq!(
            all.ops, laptop,
            "R1: sealed records come back as they were pushed, heads and all"
        );
    }
}

/// R1: a push whose records do not continue their device's chain (a gap, a tampered record, a
/// fork, an invalid device id) is refused, and nothing of it is stored, not even its valid records
/// of other devices.
pub fn r1_push_verifies_chains_and_a_refused_push_stores_nothing(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    let relay = (store.open)();
    let laptop = records(harness, "laptop", 6);
    relay.push(&laptop[..2]).expect("R1: a valid push is stored");
    let phone = records(harness, "phone", 3);

    let mut gap = phone.clone();
    gap.push(laptop[3].clone());
    assert!(
        matches!(
            relay.push(&gap),
            Err(RelayError::Log(LogError::SeqGap {
                expected: 2,
                found: 3,
                ..
            }))
        ),
        "R1: a gap in a device's chain is refused"
    );
    assert_eq!(
        ids(&relay.pull(&Frontier::new()).expect("R1: pull").ops),
        ids(&laptop[..2]),
        "R1: a refused push stores nothing, not even another device's valid records"
    );

    assert!(
        matches!(
            relay.push(&[tampered(&laptop[2])]),
            Err(RelayError::Log(LogError::BadId { .. }))
        ),
        "R1: a record whose content does not match its id is refused"
    );

    let clock = ManualClock::new(99_999);
    let mut forked = DeviceLog::resume("laptop", clock.wall_clock(), HlcConfig::default(), &laptop[..1])
        .expect("a valid log");
    let fork = forked.append(Surface::log("note"), json!({"fork": true}));
    assert!(
        matches!(
            relay.push(&[fork]),
            Err(RelayError::Log(LogError::Fork { seq: 1, .. }))
        ),
        "R1: another record at a stored seq is refused as a fork"
    );

    let mut invalid = laptop[2].clone();
    invalid.device_id = "".into();
    assert!(
        matches!(relay.push(&[invalid]), Err(RelayError::InvalidDeviceId(_))),
        "R1: an invalid device id is refused"
    );

    assert_eq!(
        ids(&(store.open)().pull(&Frontier::new()).expect("R1: pull").ops),
        ids(&laptop[..2]),
        "R1: refused pushes stored nothing"
    );
    relay
        .push(&laptop)
        .expect("R1: the valid continuation is then stored");
    assert_eq!(
        ids(&relay.pull(&Frontier::new()).expect("R1: pull").ops),
        ids(&laptop)
    );
}

/// R1: a pull returns, for every device, the records from the caller's frontier on, in seq order
/// (several devices pushed in any order); nothing once the caller has everything; and nothing, not
/// an error, for a frontier ahead of the store.
pub fn r1_pull_returns_exactly_what_the_frontier_lacks(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    let relay = (store.open)();
    let laptop = records(harness, "laptop", 10);
    let phone = records(harness, "phone", 5);
    let mut mixed: Vec<OpRecord> = laptop.iter().chain(&phone).cloned().collect();
    mixed.reverse();
    assert_eq!(
        relay
            .push(&mixed)
            .expect("R1: a push of several devices in any order")
            .appended,
        15
    );
    let reader = (store.open)();
    let everything = reader.pull(&Frontier::new()).expect("R1: pull");
    for (device, log) in [("laptop", &laptop), ("phone", &phone)] {
        let pulled = of_device(&everything.ops, device);
        assert_eq!(ids(&pulled), ids(log), "R1: {device}'s records, in seq order");
        assert_eq!(verify_log(&pulled), Ok(()), "R1: {device}'s chain verifies");
    }
    let mut frontier = Frontier::new();
    frontier.observe_all(&laptop[..4]);
    frontier.observe_all(&phone);
    let batch = reader.pull(&frontier).expect("R1: pull");
    assert_eq!(
        ids(&batch.ops),
        ids(&laptop[4..]),
        "R1: exactly what the frontier lacks"
    );
    frontier.observe_all(&batch.ops);
    assert!(
        reader.pull(&frontier).expect("R1: pull").ops.is_empty(),
        "R1: nothing once the caller has everything"
    );
    let mut ahead = Frontier::new();
    ahead.observe(&records(harness, "laptop", 50)[49]);
    assert_eq!(
        ids(&reader
            .pull(&ahead)
            .expect("R1: a frontier ahead of the store is no error")
            .ops),
        ids(&phone),
        "R1: a frontier ahead of the store gets nothing of that device"
    );
}

/// R1: damage to one device's stored log is reported as damage naming the device, the records
/// before it still read, and every other device keeps syncing; nothing is appended to the damaged
/// device until it is repaired. Needs [`RelayStore::damage`].
///
/// # Panics
/// When the store has no damage hook (an in-memory relay has no medium to damage).
pub fn r1_damage_of_one_device_is_isolated_and_reported(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    let damage = store
        .damage
        .as_ref()
        .expect("this rule needs a store with a damage hook (RelayStore::with_damage)");
    let relay = (store.open)();
    let laptop = records(harness, "laptop", 6);
    let phone = records(harness, "phone", 5);
    relay.push(&laptop[..5]).expect("R1: a valid push is stored");
    relay.push(&phone[..4]).expect("R1: a valid push is stored");
    damage("laptop");

    let reader = (store.open)();
    let batch = reader
        .pull(&Frontier::new())
        .expect("R1: a pull reports damage, it does not fail");
    let damaged: Vec<_> = batch
        .problems
        .iter()
        .filter(|problem| problem.is_damage())
        .collect();
    assert!(
        damaged
            .iter()
            .any(|problem| problem.device_id.as_deref() == Some("laptop")),
        "R1: the damage is reported, naming the device: {:?}",
        batch.problems
    );
    assert!(
        damaged
            .iter()
            .all(|problem| problem.device_id.as_deref() == Some("laptop")),
        "R1: only the damaged device is reported: {:?}",
        batch.problems
    );
    let pulled_laptop = of_device(&batch.ops, "laptop");
    assert!(
        pulled_laptop.len() < 5 && ids(&pulled_laptop) == ids(&laptop[..pulled_laptop.len()]),
        "R1: what is read of a damaged device is a prefix of its log, never an altered record"
    );
    assert_eq!(
        ids(&of_device(&batch.ops, "phone")),
        ids(&phone[..4]),
        "R1: the other devices keep syncing"
    );
    assert!(
        matches!(reader.push(&laptop), Err(RelayError::DeviceDamaged { .. })),
        "R1: nothing is appended to a damaged device"
    );
    assert_eq!(
        reader
            .push(&phone)
            .expect("R1: other devices still take pushes")
            .appended,
        1
    );
    let again = (store.open)().pull(&Frontier::new()).expect("R1: pull");
    assert!(
        again
            .problems
            .iter()
            .any(|problem| problem.is_damage() && problem.device_id.as_deref() == Some("laptop")),
        "R1: the damage is still reported on the next pull"
    );
}

/// How many handles write at once, and how many records each appends.
const WRITERS: usize = 4;
const RECORDS_PER_WRITER: usize = 25;

/// Appends `count` records to `log` through `relay`, one [`Relay::append`] each, catching up with
/// what other writers of the device appended; payloads name `writer` and the record's number.
fn append_records(relay: &dyn Relay, log: &mut DeviceLog, writer: usize, count: usize) {
    for n in 0..count {
        let device = log.device_id().to_owned();
        let since = log.head().next_seq();
        relay
            .append(&device, since, &mut |tail: &[OpRecord]| {
                log.catch_up(tail)?;
                Ok(vec![log.try_append(
                    Surface::log("note"),
                    json!({"writer": writer, "n": n}),
                )?])
            })
            .unwrap_or_else(|error| panic!("R1: writer {writer}'s append {n} failed: {error}"));
    }
}

/// Runs [`WRITERS`] threads at once, each with a handle of its own on `store` and a log of the
/// device `device_of(writer)`, each appending [`RECORDS_PER_WRITER`] records.
fn run_writers(store: &RelayStore, device_of: impl Fn(usize) -> String + Sync) {
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let device_of = &device_of;
            scope.spawn(move || {
                let relay = (store.open)();
                // Each writer's clock differs, as two processes' would.
                let clock = ManualClock::new(10_000 + writer as u64);
                let mut log =
                    DeviceLog::new(&device_of(writer), clock.wall_clock()).expect("a valid device id");
                append_records(relay.as_ref(), &mut log, writer, RECORDS_PER_WRITER);
            });
        }
    });
}

/// The (writer, n) of every record of `ops`.
fn writes(ops: &[OpRecord]) -> Vec<(u64, u64)> {
    ops.iter()
        .map(|op| {
            let payload = op.payload.value();
            (
                payload["writer"].as_u64().unwrap_or(u64::MAX),
                payload["n"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

/// R1: handles appending to distinct devices at the same time lose nothing: every record of every
/// device is stored once, each device's chain verifies.
pub fn r1_concurrent_writers_of_distinct_devices_lose_nothing(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    run_writers(&store, |writer| format!("device-{writer}"));
    let all = (store.open)().pull(&Frontier::new()).expect("R1: pull");
    assert!(all.problems.is_empty(), "R1: {:?}", all.problems);
    for writer in 0..WRITERS {
        let log = of_device(&all.ops, &format!("device-{writer}"));
        assert_eq!(verify_log(&log), Ok(()), "R1: device-{writer}'s chain verifies");
        let expected: Vec<(u64, u64)> = (0..RECORDS_PER_WRITER as u64)
            .map(|n| (writer as u64, n))
            .collect();
        assert_eq!(
            writes(&log),
            expected,
            "R1: every record of device-{writer}, once, in order"
        );
    }
}

/// R1: handles that share one device id and append at the same time (two processes of one host
/// with the same device id) interleave: the device's log is one chain holding every record of
/// every writer once, and none is lost or forked.
pub fn r1_writers_sharing_a_device_id_interleave_and_never_fork(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    run_writers(&store, |_| "shared".to_owned());
    let all = (store.open)().pull(&Frontier::new()).expect("R1: pull");
    assert!(all.problems.is_empty(), "R1: {:?}", all.problems);
    let log = of_device(&all.ops, "shared");
    assert_eq!(
        verify_log(&log),
        Ok(()),
        "R1: writers sharing a device id never fork its log"
    );
    let stored = writes(&log);
    let distinct: BTreeSet<(u64, u64)> = stored.iter().copied().collect();
    assert_eq!(
        (stored.len(), distinct.len()),
        (WRITERS * RECORDS_PER_WRITER, WRITERS * RECORDS_PER_WRITER),
        "R1: every writer's every record is stored once"
    );
    for writer in 0..WRITERS as u64 {
        let own: Vec<u64> = stored
            .iter()
            .filter(|(from, _)| *from == writer)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(
            own,
            (0..RECORDS_PER_WRITER as u64).collect::<Vec<_>>(),
            "R1: writer {writer}'s records keep their order"
        );
    }
}

/// K5 (R1 for a pruned log): [`Relay::prune`] removes a device's records up to the checkpoint's
/// head (checked: another id there is damage, and nothing is removed), keeps the last record
/// whatever, and removes nothing twice; [`Relay::log_starts`] says where the log begins; a pull
/// from before there hands none of that device's records over and reports it
/// ([`ProblemKind::Pruned`], damage), the other devices going on; a pull from where it begins,
/// or after, hands over exactly what follows, through any handle; the log goes on growing.
pub fn k5_a_pruned_log_is_read_from_where_it_begins(harness: &dyn RelayHarness) {
    let store = harness.fresh_store();
    let relay = (store.open)();
    let laptop = records(harness, "laptop", 12);
    let phone = records(harness, "phone", 3);
    relay.push(&laptop[..10]).expect("K5: a valid push is stored");
    relay.push(&phone).expect("K5: a valid push is stored");
    // A relay may prune only what its handle read (a folder's file: from its start).
    relay.pull(&Frontier::new()).expect("K5: pull");
    let wrong = relay.prune("laptop", 6, laptop[5].op_id);
    assert!(
        matches!(wrong, Err(RelayError::DeviceDamaged { .. })),
        "K5: a prune through a record that is not the checkpoint's is damage: {wrong:?}"
    );
    assert!(
        relay.log_starts().expect("K5: log starts").is_empty(),
        "K5: a refused prune removes nothing"
    );
    let removed = relay
        .prune("laptop", 6, laptop[6].op_id)
        .expect("K5: a prune through the checkpoint's head");
    assert_eq!(removed, 7, "K5: records 0..=6 are removed");
    assert_eq!(
        relay
            .prune("laptop", 6, laptop[6].op_id)
            .expect("K5: a prune again"),
        0,
        "K5: nothing is removed twice"
    );
    let other = (store.open)();
    let starts = other.log_starts().expect("K5: log starts");
    assert_eq!(
        starts.into_iter().collect::<Vec<_>>(),
        vec![("laptop".to_owned(), (7, laptop[6].op_id))],
        "K5: the log begins after the records removed, naming the one before"
    );
    let from_start = other.pull(&Frontier::new()).expect("K5: pull");
    assert_eq!(
        ids(&from_start.ops),
        ids(&phone),
        "K5: a pull from before where the log begins hands none of its records over"
    );
    assert!(
        from_start
            .problems
            .iter()
            .any(|problem| problem.kind == ProblemKind::Pruned
                && problem.device_id.as_deref() == Some("laptop")
                && problem.is_damage()),
        "K5: and reports it, as damage: {:?}",
        from_start.problems
    );
    for (from, expected) in [(7, &laptop[7..10]), (8, &laptop[8..10])] {
        let mut since = Frontier::new();
        since.raise_to("laptop", from, Some(laptop[from as usize - 1].op_id));
        since.raise("phone", 3);
        let batch = (store.open)().pull(&since).expect("K5: pull");
        assert_eq!(
            ids(&batch.ops),
            ids(expected),
            "K5: a pull from record {from} hands over exactly what follows"
        );
        assert!(batch.problems.is_empty(), "K5: no problem: {:?}", batch.problems);
    }
    // The log goes on, and a prune through its last record keeps that one.
    (store.open)()
        .push(&laptop[10..])
        .expect("K5: the log goes on after a prune");
    let pruner = (store.open)();
    let mut since = Frontier::new();
    since.raise_to("laptop", 7, Some(laptop[6].op_id));
    since.raise("phone", 3);
    pruner.pull(&since).expect("K5: pull");
    assert_eq!(
        pruner
            .prune("laptop", 11, laptop[11].op_id)
            .expect("K5: a prune through the last record"),
        4,
        "K5: records 7..=10 are removed, the last one stays"
    );
    let mut since = Frontier::new();
    since.raise_to("laptop", 11, Some(laptop[10].op_id));
    since.raise("phone", 3);
    let batch = (store.open)().pull(&since).expect("K5: pull");
    assert_eq!(ids(&batch.ops), ids(&laptop[11..]), "K5: the last record stays");
}
