//! Rule S5: a ledger seals every intent in one size, whatever its agent id: the agent is named
//! by digest, after a record of the same log that names it, and a reader puts the name back;
//! a name whose digest is not its own names nothing.

use std::num::NonZeroU32;
use std::sync::Arc;

use fencepost::clock::ManualClock;
use fencepost::id::DeviceId;
use fencepost::identity::{DeviceKey, LedgerId};
use fencepost::lease::{Intent, IntentStatus};
use fencepost::ledger::{Ledger, LedgerOptions};
use fencepost::oplog::{agent_digest, DeviceLog, OpRecord, SealedContent, Surface, AGENT_NAMES};
use fencepost::protected::{Missing, Origin, ProtectedLogs, Protection};
use fencepost::relay::{FsRelay, Relay};
use fencepost::roster::{Change, KeyId, MembershipChange, Position, Roster};
use fencepost::run_id::deterministic_run_id;
use fencepost::seal::LedgerKey;
use serde_json::json;

const NOW_MS: u64 = 1_764_400_000_000;

fn device_key(device: &str, secret: u8) -> Arc<DeviceKey> {
    Arc::new(DeviceKey::from_secrets(
        DeviceId::new(device).unwrap(),
        [secret; 32],
        [secret + 1; 32],
    ))
}

fn relay(folder: &std::path::Path) -> Arc<dyn Relay> {
    Arc::new(FsRelay::open(folder).unwrap())
}

/// The length of each record's ciphertext in `device`'s log in `folder`, by sequence number
/// (0 for content in the clear).
fn sealed_lengths(folder: &std::path::Path, device: &str) -> Vec<usize> {
    let batch = relay(folder).pull(&fencepost::relay::Frontier::new()).unwrap();
    batch
        .ops
        .iter()
        .filter(|op| &*op.device_id == device)
        .map(|op| match op.sealed_record().map(|record| &record.content) {
            Some(SealedContent::Sealed(sealed)) => sealed.ciphertext.len(),
            _ => 0,
        })
        .collect()
}

/// S5: a member's intents for a one-letter agent and a 200-byte one, with run ids of the
/// deterministic form, are lines of one length, and with run ids of another form lines of a
/// second length; the first intent for each agent follows a record naming it, and the next
/// ones do not; another member, and the writer read again, fold each intent under its agent.
#[test]
fn s5_intents_are_sealed_in_one_size_whatever_their_agent_and_fold_under_it() {
    let folder = tempfile::tempdir().unwrap();
    let laptop = device_key("laptop", 1);
    let phone = device_key("phone", 11);
    let clock = ManualClock::new(NOW_MS);
    let (mut ledger, founded) = Ledger::found(
        Arc::clone(&laptop),
        clock.wall_clock(),
        relay(folder.path()),
        LedgerOptions::default(),
    )
    .unwrap();
    ledger.admit(phone.device(), &phone.public()).unwrap();
    let long_agent = "a".repeat(200);
    let mut seqs = Vec::new();
    for agent in ["m", long_agent.as_str()] {
        for salt in ["monday", "tuesday"] {
            let run = deterministic_run_id(agent, "send", salt).unwrap();
            for status in [IntentStatus::Pending, IntentStatus::Committed] {
                let written = ledger.record(&Intent::new(agent, &run, 3, status)).unwrap();
                seqs.push(written.seq);
            }
        }
    }
    for run in ["job-7", &"j".repeat(250)] {
        let written = ledger
            .record(&Intent::new("m", run, 3, IntentStatus::Committed))
            .unwrap();
        seqs.push(written.seq);
    }
    let lengths = sealed_lengths(folder.path(), "laptop");
    let of = |seq: u64| lengths[usize::try_from(seq).unwrap()];
    let (hashed, text) = seqs.split_at(8);
    assert!(
        hashed.iter().all(|seq| of(*seq) == of(hashed[0])),
        "S5: one size for every intent with a deterministic run id: {:?}",
        hashed.iter().map(|seq| of(*seq)).collect::<Vec<_>>()
    );
    assert_eq!(
        of(text[0]),
        of(text[1]),
        "S5: one size for run ids of another form"
    );
    // The first intent of each agent follows its naming; the others follow an intent.
    let gaps: Vec<u64> = seqs.windows(2).map(|pair| pair[1] - pair[0]).collect();
    assert_eq!(
        gaps,
        vec![1, 1, 1, 2, 1, 1, 1, 1, 1],
        "S5: an agent is named once per log"
    );

    let origin = Origin::Identity(phone.public());
    let protected = |key: &Arc<DeviceKey>, origin: Origin| fencepost::ledger::Protected {
        ledger: founded.genesis.ledger_id(),
        device_key: Arc::clone(key),
        origin,
        keys: Vec::new(),
        members: Vec::new(),
    };
    let open = |key: &Arc<DeviceKey>, origin: Origin| {
        Ledger::open_with(
            key.device().as_str(),
            clock.wall_clock(),
            relay(folder.path()),
            LedgerOptions::default().protected(protected(key, origin)),
        )
        .unwrap()
    };
    let mut reread = open(&laptop, Origin::Genesis(founded.genesis.clone()));
    let on_phone = open(&phone, origin);
    for reader in [&on_phone, &reread] {
        let state = reader.state();
        let mut agents: Vec<&str> = state.agents().into_iter().map(|(agent, _)| agent).collect();
        agents.sort_unstable();
        assert_eq!(
            agents,
            vec![long_agent.as_str(), "m"],
            "S5: the agents are named back"
        );
        for agent in ["m", long_agent.as_str()] {
            let run = deterministic_run_id(agent, "send", "tuesday").unwrap();
            assert!(state.committed_run(agent, &run).is_some(), "S5: {agent}'s commit");
        }
        assert!(state.committed_run("m", "job-7").is_some());
    }
    // Read again, the writer knows its log names both agents: no second naming.
    let before = reread.view().frontier().next_seq("laptop");
    let written = reread
        .record(&Intent::new(
            long_agent.as_str(),
            "job-8",
            4,
            IntentStatus::Pending,
        ))
        .unwrap();
    assert_eq!(
        written.seq, before,
        "S5: no naming again for an agent its log named"
    );
}

const LEDGER: LedgerId = LedgerId([7; 32]);

/// S5: an intent whose agent no record names is missing (never folded under a stand-in), and
/// a naming whose digest is another agent's names nothing; the log's naming of the right digest
/// later releases it.
#[test]
fn s5_an_intent_no_record_names_is_missing_and_a_false_naming_names_nothing() {
    let laptop = device_key("laptop", 1);
    let key = LedgerKey::new(NonZeroU32::MIN, [5; 32]);
    let origin = Origin::Identity(laptop.public());
    let device: Arc<str> = Arc::from("laptop");
    let first = OpRecord::sealed(
        Arc::clone(&device),
        0,
        None,
        SealedContent::Clear(origin.to_bytes().into()),
    );
    let origin_id = first.op_id;
    let mut plain_log = DeviceLog::new("laptop", ManualClock::new(NOW_MS).wall_clock()).unwrap();
    plain_log.append(Surface::log("origin"), json!(0)); // seq 0 is the origin
    let mut log = vec![first.clone()];
    let mut push = |surface: Surface, payload: serde_json::Value, named: bool, log: &mut Vec<OpRecord>| {
        let mut plain = plain_log.append(surface, payload);
        plain.prev = log.last().map(|last| last.op_id);
        let sealed = if named {
            plain.seal_named(&key, LEDGER).unwrap()
        } else {
            plain.seal(&key, LEDGER).unwrap()
        };
        log.push(sealed.signed(&laptop, &LEDGER, &origin_id));
    };
    let hex = |digest: [u8; 16]| {
        digest
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    };
    // A naming of "mallory" under milo's digest, then milo's commit by digest.
    push(
        Surface::registry(AGENT_NAMES),
        json!({"key": hex(agent_digest("milo")), "agent": "mallory"}),
        false,
        &mut log,
    );
    let commit = json!({"agent_id": "milo", "epoch": 3, "id": "run-1", "status": "committed"});
    push(Surface::Intent, commit, true, &mut log);

    let admitted = MembershipChange::by_recovery(
        Position {
            device: DeviceId::new("laptop").unwrap(),
            seq: 0,
        },
        KeyId(origin_id.0),
        Change::Admit {
            device: DeviceId::new("laptop").unwrap(),
            key: KeyId(origin_id.0),
        },
    );
    let mut protection = Protection::new(LEDGER, Roster::default());
    protection.hold(key.clone());
    let mut logs = ProtectedLogs::new(protection, vec![admitted], None);
    let released = logs.offer_all(log.clone());
    assert!(
        released.fold.is_empty(),
        "S5: nothing folded: {:?}",
        released.fold
    );
    assert_eq!(
        logs.missing(),
        vec![("laptop".to_owned(), 2, Missing::AgentNotNamed { void: false })],
        "S5: the commit is missing, its agent named by no record"
    );
    // The right naming, later in the log, releases it.
    push(
        Surface::registry(AGENT_NAMES),
        json!({"key": hex(agent_digest("milo")), "agent": "milo"}),
        false,
        &mut log,
    );
    let released = logs.offer_all(log[3..].to_vec());
    let folded: Vec<String> = released
        .fold
        .iter()
        .filter_map(|op| op.payload.intent().map(|intent| intent.agent_id))
        .collect();
    assert_eq!(folded, vec!["milo"], "S5: released under its agent");
    assert!(logs.missing().is_empty());
}
