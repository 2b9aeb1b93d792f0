//! Rule M1: the roster's rules one by one, and as properties (any order and repetition of the
//! changes makes one roster; a member's revoke never makes a record count that did not).

use proptest::prelude::*;

use super::*;

fn device(name: &str) -> DeviceId {
    DeviceId::new(name).unwrap()
}

fn key(n: u8) -> KeyId {
    KeyId([n; 32])
}

fn at(name: &str, seq: u64) -> Position {
    Position {
        device: device(name),
        seq,
    }
}

fn admit(name: &str, with: u8) -> Change {
    Change::Admit {
        device: device(name),
        key: key(with),
    }
}

fn revoke(name: &str, cut: u64) -> Change {
    Change::Revoke {
        device: device(name),
        cut,
    }
}

/// The founder `laptop` (key 1), admitted by the recovery key.
fn founded() -> Vec<MembershipChange> {
    vec![MembershipChange::by_recovery(
        at("laptop", 0),
        key(1),
        admit("laptop", 1),
    )]
}

#[test]
fn m1_members_are_rooted_in_the_recovery_key_and_admit_in_a_chain() {
    let mut changes = founded();
    changes.push(MembershipChange::by_member(
        at("laptop", 2),
        key(1),
        admit("phone", 2),
    ));
    changes.push(MembershipChange::by_member(
        at("phone", 1),
        key(2),
        admit("tablet", 3),
    ));
    // Two keys whose logs admit each other, with no path from the recovery key.
    changes.push(MembershipChange::by_member(at("x", 1), key(8), admit("y", 9)));
    changes.push(MembershipChange::by_member(at("y", 1), key(9), admit("x", 8)));
    let roster = Roster::compute(&changes);
    assert_eq!(roster.standing("tablet", key(3), 100), Standing::Member);
    assert_eq!(roster.standing("x", key(8), 0), Standing::NotMember);
    assert_eq!(roster.standing("y", key(9), 0), Standing::NotMember);
}

#[test]
fn m1_a_revocation_voids_the_records_from_its_cut_and_the_admissions_made_after_it() {
    let mut changes = founded();
    changes.push(MembershipChange::by_member(
        at("laptop", 1),
        key(1),
        admit("phone", 2),
    ));
    changes.push(MembershipChange::by_member(
        at("phone", 3),
        key(2),
        admit("early", 3),
    ));
    changes.push(MembershipChange::by_member(
        at("phone", 7),
        key(2),
        admit("late", 4),
    ));
    changes.push(MembershipChange::by_member(
        at("laptop", 9),
        key(1),
        revoke("phone", 5),
    ));
    let roster = Roster::compute(&changes);
    assert_eq!(roster.standing("phone", key(2), 4), Standing::Member);
    assert_eq!(roster.standing("phone", key(2), 5), Standing::Void);
    assert_eq!(roster.standing("early", key(3), 0), Standing::Member);
    // Admitted after its admitter's cut: its log is void, held, never a member's.
    assert_eq!(roster.standing("late", key(4), 0), Standing::Void);
    assert_eq!(roster.standing("late", key(5), 0), Standing::NotMember);
}

#[test]
fn m1_a_thief_that_admits_an_existing_id_under_its_key_takes_nothing_from_the_real_log() {
    let mut changes = founded();
    changes.push(MembershipChange::by_member(
        at("laptop", 1),
        key(1),
        admit("phone", 2),
    ));
    changes.push(MembershipChange::by_member(
        at("phone", 2),
        key(2),
        admit("laptop", 66),
    ));
    // A forged log of `laptop` under the thief's key: its changes count as the thief's key's,
    // admitted under the id; the real log keeps its standing.
    changes.push(MembershipChange::by_member(
        at("laptop", 5),
        key(66),
        revoke("phone", 0),
    ));
    let roster = Roster::compute(&changes);
    assert_eq!(roster.standing("laptop", key(1), 10), Standing::Member);
    // A log under a key nobody admitted under the id counts for nothing.
    let mut forged = founded();
    forged.push(MembershipChange::by_member(
        at("laptop", 1),
        key(77),
        admit("evil", 5),
    ));
    assert_eq!(
        Roster::compute(&forged).standing("evil", key(5), 0),
        Standing::NotMember
    );
}

#[test]
fn m1_only_the_recovery_key_takes_a_member_revoked_thief_its_power_to_revoke() {
    let mut changes = founded();
    changes.push(MembershipChange::by_member(
        at("laptop", 1),
        key(1),
        admit("thief", 2),
    ));
    changes.push(MembershipChange::by_member(
        at("laptop", 4),
        key(1),
        revoke("thief", 3),
    ));
    // After its cut, the thief cuts the founder forward: that still counts (the weakness of
    // rule 2, written down in the proposal)…
    changes.push(MembershipChange::by_member(
        at("thief", 6),
        key(2),
        revoke("laptop", 8),
    ));
    let roster = Roster::compute(&changes);
    assert_eq!(roster.standing("laptop", key(1), 8), Standing::Void);
    assert_eq!(roster.standing("thief", key(2), 3), Standing::Void);
    // …until the recovery key cuts the thief before it.
    changes.push(MembershipChange::by_recovery(
        at("laptop", 9),
        key(1),
        revoke("thief", 3),
    ));
    let roster = Roster::compute(&changes);
    assert_eq!(roster.standing("laptop", key(1), 8), Standing::Member);
    assert_eq!(roster.standing("thief", key(2), 3), Standing::Void);
}

#[test]
fn m1_revokes_that_cut_each_other_both_count() {
    let mut changes = founded();
    changes.push(MembershipChange::by_member(
        at("laptop", 1),
        key(1),
        admit("phone", 2),
    ));
    changes.push(MembershipChange::by_member(
        at("laptop", 5),
        key(1),
        revoke("phone", 3),
    ));
    changes.push(MembershipChange::by_member(
        at("phone", 4),
        key(2),
        revoke("laptop", 2),
    ));
    let roster = Roster::compute(&changes);
    assert_eq!(roster.standing("laptop", key(1), 2), Standing::Void);
    assert_eq!(roster.standing("phone", key(2), 3), Standing::Void);
    assert_eq!(roster.standing("laptop", key(1), 1), Standing::Member);
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn a_change() -> impl Strategy<Value = MembershipChange> {
    (0..4usize, 0..8u64, 0..3u8, 0..10u8, 0..4usize, 0..3u8, 0..8u64).prop_map(
        |(author, seq, log_key, kind, target, target_key, cut)| {
            let position = at(NAMES[author], seq);
            let change = if kind < 5 {
                admit(NAMES[target], target_key)
            } else {
                revoke(NAMES[target], cut)
            };
            if kind == 0 || kind == 9 {
                MembershipChange::by_recovery(position, key(log_key), change)
            } else {
                MembershipChange::by_member(position, key(log_key), change)
            }
        },
    )
}

/// Every standing of every (device, key, sequence number) of the small universe.
fn standings(roster: &Roster) -> Vec<Standing> {
    let mut all = Vec::new();
    for name in NAMES {
        for with in 0..3 {
            for seq in 0..9 {
                all.push(roster.standing(name, key(with), seq));
            }
        }
    }
    all
}

proptest! {
    /// M1: the roster is a function of the set of changes: any order, any repetition.
    #[test]
    fn m1_any_order_and_repetition_of_the_changes_makes_one_roster(
        changes in proptest::collection::vec(a_change(), 0..24),
        order in any::<u64>(),
    ) {
        let mut shuffled = changes.clone();
        shuffled.extend(changes.iter().take(3).cloned());
        let mut state = order | 1;
        for index in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(index, (state % (index as u64 + 1)) as usize);
        }
        prop_assert_eq!(Roster::compute(&changes), Roster::compute(&shuffled));
    }

    /// M1: a member's revoke never makes a record count that did not: voiding is all it does.
    #[test]
    fn m1_a_member_revoke_never_makes_a_record_count(
        changes in proptest::collection::vec(a_change(), 0..24),
        author in 0..4usize, seq in 0..8u64, log_key in 0..3u8, target in 0..4usize, cut in 0..8u64,
    ) {
        let before = standings(&Roster::compute(&changes));
        let mut more = changes.clone();
        more.push(MembershipChange::by_member(at(NAMES[author], seq), key(log_key), revoke(NAMES[target], cut)));
        let after = standings(&Roster::compute(&more));
        for (was, is) in before.iter().zip(&after) {
            prop_assert!(*is != Standing::Member || *was == Standing::Member, "{was:?} became {is:?}");
        }
    }
}
