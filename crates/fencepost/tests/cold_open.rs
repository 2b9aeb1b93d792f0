//! Rule S2 for a cold open: a protected ledger read from its start by a host with no snapshot,
//! in batches long enough that the records are opened on one thread and folded on another
//! (`edge/ledger/open_ahead.rs`), folds what the writer folded.

mod members;

use members::{device_key, run, Members};

/// S2, M2: a member that holds no key yet reads a long protected log cold, as a cold open
/// reads it (opened on the thread the relay hands records over on, folded on another): the
/// keys come from the log as it is read, and a revocation midway makes a generation the
/// opening thread does not hold yet. Every commit counts, at its own epoch, as the writer
/// folded it.
#[test]
fn s2_m2_a_long_log_read_cold_by_a_member_folds_every_record_across_a_rotation() {
    let (phone, tablet) = (device_key("phone", 11), device_key("tablet", 21));
    let (members, mut founder) = Members::found(&[&phone, &tablet]);
    let (before, after) = (1_500u64, 500u64);
    for n in 0..before {
        run(&mut founder, &format!("before-{n}"), n + 1);
    }
    founder.revoke(tablet.device(), None).unwrap();
    for n in 0..after {
        run(&mut founder, &format!("after-{n}"), before + n + 1);
    }
    assert!(
        members.file("laptop").len() > 1 << 20,
        "long enough to be read in several batches"
    );
    let reading = members.open(&phone);
    assert!(reading.damage().is_empty(), "{:?}", reading.damage());
    assert_eq!(reading.not_counted(), vec![]);
    let agent = reading.state().agent("milo").unwrap();
    assert_eq!(
        agent.committed_runs().len() as u64,
        before + after,
        "S2: every commit counts"
    );
    for (name, epoch) in (0..before)
        .map(|n| (format!("before-{n}"), n + 1))
        .chain((0..after).map(|n| (format!("after-{n}"), before + n + 1)))
    {
        assert_eq!(
            agent.committed_run(&name).map(|run| run.epoch),
            Some(epoch),
            "S2: {name} at its own epoch"
        );
    }
    assert_eq!(
        reading.view().frontier().next_seq("laptop"),
        founder.view().frontier().next_seq("laptop"),
        "S2: every record settled"
    );
}
