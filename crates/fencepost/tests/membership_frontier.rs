//! Rule M4: the membership frontier in the hand-off. A holder publishes, with its own log's
//! head, every author's log through the last membership change it read; a new holder waits
//! for them before it runs, or before it takes a commit for one (a relay cannot hide a
//! revocation that a holder of the agent read).

mod members;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use fencepost::protected::Origin;
use members::{device_key, in_doubt, open, run, Members};

/// M4: a holder publishes, with its own log's head, the membership frontier: per author, its
/// log through the last membership change read that counts. A revocation the tablet wrote,
/// which the laptop read after it ran, is waited for by the next holder: a relay that hides
/// the tablet's log from it cannot make it take the revoked phone's commit for a truth.
#[test]
fn m4_a_new_holder_waits_for_every_revocation_its_predecessor_read() {
    let phone = device_key("phone", 11);
    let tablet = device_key("tablet", 21);
    let desk = device_key("desk", 31);
    let (members, mut founder) = Members::found(&[&phone, &tablet, &desk]);
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, "before", 2);
    let mut on_tablet = members.open(&tablet);
    on_tablet.revoke(phone.device(), None).unwrap();
    // The stolen phone, which has not read its revocation, claims a run done.
    run(&mut on_phone, "never-ran", 3);

    // The laptop runs, then reads the revocation, and publishes again as it lets go.
    run(&mut founder, "ran", 4);
    founder.sync().unwrap();
    let published = founder.pushed();
    let tablet_log = members.file("tablet").lines().count() as u64;
    assert_eq!(
        published.next_seq("tablet"),
        tablet_log,
        "M4: the laptop publishes the tablet's log through the revocation it read"
    );
    assert!(published.head("tablet").is_some(), "M4: with the revocation's id");
    assert_eq!(
        published.next_seq("phone"),
        0,
        "M4: the phone wrote no membership change"
    );

    // A relay that withholds the tablet's log from the desk.
    let hidden = tempfile::tempdir().unwrap();
    copy_folder(members.folder.path(), hidden.path());
    let name = fencepost::relay::device_file_name("tablet");
    std::fs::remove_file(hidden.path().join("devices").join(name)).unwrap();
    let origin = Origin::Identity(desk.public());
    let mut on_desk = open(hidden.path(), &desk, origin, members.ledger);
    assert!(
        on_desk.committed_run("milo", "never-ran").is_some(),
        "without the revocation the phone's commit reads as one"
    );
    let behind = on_desk.behind(&published);
    assert_eq!(
        behind
            .iter()
            .map(|missing| (missing.device_id.as_str(), missing.needs))
            .collect::<Vec<_>>(),
        vec![("tablet", tablet_log)],
        "M4: the desk waits for the revocation its predecessor read"
    );

    let mut on_desk = members.open(&desk);
    assert!(
        on_desk.behind(&published).is_empty(),
        "M4: the whole ledger has it"
    );
    assert!(on_desk.committed_run("milo", "never-ran").is_none());
    assert_eq!(in_doubt(&on_desk, 5), vec!["never-ran".to_owned()]);
}

/// M4, found by an adversary through the binary: the phone (stolen) claims an occurrence
/// committed; the laptop revokes it from before that commit and runs the agent, publishing the
/// revocation with its head. A desk whose copy of the ledger lacks the revocation once took the
/// phone's commit at once ("already committed") and never ran the occurrence: a commit is taken
/// before the lease only when the ledger has what earlier holders published. Here the desk
/// waits instead (exit 7 in the CLI), and with the revocation read it finds the run in doubt.
#[test]
fn m4_a_withheld_revocation_never_lets_a_revoked_commit_stop_the_run() {
    use fencepost::clock::system_clock;
    use fencepost::lease::{InMemoryLeaseCoordinator, LeaseCoordinator};
    use fencepost::run::{run_once, Occurrence, Outcome, RunOptions};
    let phone = device_key("phone", 11);
    let desk = device_key("desk", 31);
    let (members, mut founder) = Members::found(&[&phone, &desk]);
    let occurrence = Occurrence::new("milo", "send", "monday").unwrap();
    let mut on_phone = members.open(&phone);
    run(&mut on_phone, occurrence.run_id().as_str(), 3);
    // What the desk's relay serves: the ledger before the revocation.
    let withheld = tempfile::tempdir().unwrap();
    copy_folder(members.folder.path(), withheld.path());

    founder.sync().unwrap();
    founder.revoke(phone.device(), Some(1)).unwrap();
    let coordinator: Arc<dyn LeaseCoordinator> = Arc::new(InMemoryLeaseCoordinator::new(system_clock()));
    let other = Occurrence::new("milo", "send", "tuesday").unwrap();
    let ran = run_once(
        coordinator.clone(),
        &mut founder,
        &other,
        &RunOptions::new(5_000),
        |_| Ok::<_, String>(()),
    )
    .unwrap();
    assert!(matches!(ran, Outcome::Committed { .. }), "{ran:?}");

    let mut on_desk = open(
        withheld.path(),
        &desk,
        Origin::Identity(desk.public()),
        members.ledger,
    );
    assert!(on_desk
        .committed_run("milo", occurrence.run_id().as_str())
        .is_some());
    let effects = AtomicUsize::new(0);
    let waited = run_once(
        coordinator.clone(),
        &mut on_desk,
        &occurrence,
        &RunOptions::new(5_000),
        |_| {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        },
    )
    .unwrap();
    let Outcome::LedgerBehind { missing } = &waited else {
        panic!("M4: the desk waits for the revocation: {waited:?}");
    };
    assert_eq!(missing[0].device_id, "laptop");

    let mut on_desk = members.open(&desk);
    let read = run_once(
        coordinator,
        &mut on_desk,
        &occurrence,
        &RunOptions::new(5_000),
        |_| {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        },
    )
    .unwrap();
    assert!(
        matches!(read, Outcome::InDoubt { .. }),
        "M4: in doubt once read: {read:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0, "M4: never run by itself");
}

fn copy_folder(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
