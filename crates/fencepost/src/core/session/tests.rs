//! The run session's steps, rule by rule, without I/O.
use super::*;

/// The epoch `n`.
fn e(n: u64) -> Epoch {
    Epoch::new(n).unwrap()
}

fn plan(wait_ms: u64) -> SessionPlan {
    SessionPlan {
        started_ms: 100,
        wait_ms,
        poll_ms: 50,
        retry_in_doubt: false,
    }
}

/// Drives a session to its grant of `epoch`.
fn granted(wait_ms: u64, epoch: u64) -> RunSession {
    let mut session = RunSession::new(plan(wait_ms));
    assert_eq!(session.step(100), SessionStep::AskOracle);
    session.oracle_answered(false);
    assert_eq!(session.step(100), SessionStep::Acquire { max_wait_ms: wait_ms });
    session.acquired(100, Acquired::Granted { epoch: e(epoch) });
    session
}

#[test]
fn d1_the_oracle_ends_a_committed_run_before_any_lease() {
    let mut session = RunSession::new(plan(0));
    assert_eq!(session.step(100), SessionStep::AskOracle);
    assert_eq!(session.step(100), SessionStep::Waiting);
    session.oracle_answered(true);
    assert_eq!(session.step(100), SessionStep::Done(SessionEnd::AlreadyCommitted));
    assert_eq!(session.epoch(), None);
}

#[test]
fn l5_a_stale_grant_is_given_back_and_acquired_again_then_given_up_after_four() {
    let mut session = granted(0, 3);
    for attempt in 1..FRESH_GRANT_ATTEMPTS {
        assert_eq!(session.step(100), SessionStep::SyncAndCheckGrant { epoch: e(3) });
        session.grant_checked(100, true);
        assert_eq!(
            session.step(100),
            SessionStep::GiveBack { epoch: e(3) },
            "attempt {attempt}"
        );
        session.given_back();
        assert!(matches!(session.step(100), SessionStep::Acquire { .. }));
        session.acquired(100, Acquired::Granted { epoch: e(3) });
    }
    assert_eq!(session.step(100), SessionStep::SyncAndCheckGrant { epoch: e(3) });
    session.grant_checked(100, true);
    assert_eq!(session.step(100), SessionStep::Release { epoch: e(3) });
    session.released();
    assert_eq!(
        session.step(100),
        SessionStep::Done(SessionEnd::StaleGrants { epoch: e(3) })
    );
}

#[test]
fn l5_a_fresh_grant_after_a_stale_one_goes_on() {
    let mut session = granted(0, 3);
    let _ = session.step(100);
    session.grant_checked(100, true);
    let _ = session.step(100);
    session.given_back();
    let _ = session.step(100);
    session.acquired(100, Acquired::Granted { epoch: e(9) });
    assert_eq!(session.step(100), SessionStep::SyncAndCheckGrant { epoch: e(9) });
    session.grant_checked(100, false);
    assert_eq!(session.step(100), SessionStep::Compare);
    assert_eq!(session.epoch(), Some(e(9)));
}

#[test]
fn h3_waits_for_the_ledger_within_the_wait_then_ends_behind_and_releases() {
    let mut session = granted(120, 4);
    let _ = session.step(100);
    session.grant_checked(100, false);
    assert_eq!(session.step(100), SessionStep::Compare);
    session.compared(100, Comparison::Missing { differs: false });
    assert_eq!(
        session.step(100),
        SessionStep::SyncAt {
            at_ms: 150,
            first: true
        }
    );
    session.synced(150);
    assert_eq!(session.step(150), SessionStep::Compare);
    session.compared(150, Comparison::Unread);
    assert_eq!(
        session.step(150),
        SessionStep::SyncAt {
            at_ms: 200,
            first: false
        }
    );
    session.synced(200);
    let _ = session.step(200);
    session.compared(200, Comparison::Missing { differs: false });
    // The poll is cut at the deadline (220).
    assert_eq!(
        session.step(200),
        SessionStep::SyncAt {
            at_ms: 220,
            first: false
        }
    );
    session.synced(220);
    let _ = session.step(220);
    session.compared(220, Comparison::Missing { differs: false });
    assert_eq!(session.step(220), SessionStep::Release { epoch: e(4) });
    session.released();
    assert_eq!(session.step(220), SessionStep::Done(SessionEnd::LedgerBehind));
}

#[test]
fn h3_another_log_under_a_published_id_is_not_waited_for() {
    let mut session = granted(10_000, 4);
    let _ = session.step(100);
    session.grant_checked(100, false);
    let _ = session.step(100);
    session.compared(100, Comparison::Missing { differs: true });
    assert_eq!(session.step(100), SessionStep::Release { epoch: e(4) });
}

#[test]
fn d2_an_unknown_outcome_records_nothing_and_ends_interrupted() {
    let mut session = granted(0, 2);
    let _ = session.step(100);
    session.grant_checked(100, false);
    let _ = session.step(100);
    session.compared(100, Comparison::Complete);
    assert_eq!(
        session.step(100),
        SessionStep::Begin {
            epoch: e(2),
            retry_in_doubt: false
        }
    );
    session.begun(Begun::Permitted);
    assert_eq!(session.step(100), SessionStep::RunEffect { epoch: e(2) });
    session.stop(); // ignored: the effect runs
    session.effect_ended(EffectEnd::Unknown);
    assert_eq!(session.step(100), SessionStep::Release { epoch: e(2) });
    session.released();
    assert_eq!(
        session.step(100),
        SessionStep::Done(SessionEnd::Interrupted { epoch: e(2) })
    );
}

#[test]
fn d1_a_refusal_at_the_fence_releases() {
    let mut session = granted(0, 2);
    let _ = session.step(100);
    session.grant_checked(100, false);
    let _ = session.step(100);
    session.compared(100, Comparison::LeaseLost);
    let _ = session.step(100);
    session.begun(Begun::Refused);
    assert_eq!(session.step(100), SessionStep::Release { epoch: e(2) });
    session.released();
    assert_eq!(session.step(100), SessionStep::Done(SessionEnd::Refused));
}

#[test]
fn a_stop_gives_the_lease_back_and_names_the_stage() {
    let mut waiting = RunSession::new(plan(0));
    let _ = waiting.step(100);
    waiting.oracle_answered(false);
    let _ = waiting.step(100);
    waiting.acquired(100, Acquired::Stopped);
    assert_eq!(
        waiting.step(100),
        SessionStep::Done(SessionEnd::Stopped(Stage::Acquiring))
    );

    let mut granted_one = granted(0, 5);
    granted_one.stop();
    assert_eq!(granted_one.step(100), SessionStep::Release { epoch: e(5) });
    granted_one.released();
    assert_eq!(
        granted_one.step(100),
        SessionStep::Done(SessionEnd::Stopped(Stage::Granted))
    );

    let mut behind = granted(1_000, 5);
    let _ = behind.step(100);
    behind.grant_checked(100, false);
    let _ = behind.step(100);
    behind.compared(100, Comparison::Missing { differs: false });
    let _ = behind.step(100);
    behind.stop();
    assert_eq!(behind.step(100), SessionStep::Release { epoch: e(5) });
    behind.released();
    assert_eq!(
        behind.step(100),
        SessionStep::Done(SessionEnd::Stopped(Stage::WaitingForLedger))
    );
}

#[test]
fn a_failure_releases_a_held_lease_and_an_unasked_answer_changes_nothing() {
    let mut session = granted(0, 6);
    session.begun(Begun::Permitted); // not asked: ignored
    session.effect_ended(EffectEnd::Succeeded);
    assert_eq!(session.step(100), SessionStep::SyncAndCheckGrant { epoch: e(6) });
    session.fail();
    assert_eq!(session.step(100), SessionStep::Release { epoch: e(6) });
    session.fail(); // ignored while releasing
    session.released();
    assert_eq!(session.step(100), SessionStep::Done(SessionEnd::Aborted));

    let mut refused = RunSession::new(plan(0));
    let _ = refused.step(100);
    refused.oracle_answered(false);
    let _ = refused.step(100);
    refused.acquired(100, Acquired::Refused);
    assert_eq!(refused.step(100), SessionStep::Done(SessionEnd::NotAcquired));
}
