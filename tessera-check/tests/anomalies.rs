//! Hand-made histories, one per anomaly: each check fails on the history
//! made to break it, naming the operations involved, and passes the same
//! history done right.

mod script;

use tessera_check::{
    AnomalyKind, AttemptState, FinalAttempt, FinalReceipt, FinalState, FinalTask, OperationId,
    Outcome, Receipt, Report, check,
};

use script::{
    Script, at, cancel, claim, enqueue, fail, heartbeat, receipt, refused, submit, unknown,
};

const T: &str = "render-7";

fn end_with(last_token: i64, state: AttemptState, receipts: Vec<Receipt>) -> FinalState {
    let mut end = FinalState::default();
    end.tasks.insert(
        T.to_owned(),
        FinalTask {
            last_token: (last_token > 0).then_some(last_token),
            attempts: vec![FinalAttempt {
                number: 1,
                tries: None,
                state,
                receipts,
            }],
        },
    );
    end
}

/// The only anomaly found, which must be of `kind` and name `operations`.
fn only(report: &Report, kind: AnomalyKind, operations: &[OperationId]) {
    assert_eq!(report.anomalies.len(), 1, "{:#?}", report.anomalies);
    let anomaly = &report.anomalies[0];
    assert_eq!(anomaly.kind, kind, "{anomaly}");
    let mut expected = operations.to_vec();
    expected.sort_unstable();
    assert_eq!(anomaly.operations, expected, "{anomaly}");
    assert_eq!(anomaly.task, T);
}

fn valid(report: &Report) {
    assert!(report.is_valid(), "{:#?}", report.anomalies);
}

#[test]
fn a_clean_run_has_no_anomaly() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.ok(
        1,
        10,
        heartbeat(T, 1, 1),
        Outcome::Extended { expires_at: at(70) },
    );
    // The first holder dies; its lease lapses and another takes over.
    s.grant(2, 70, T, 1, 2, 60);
    s.run(1, 80, submit(T, 1, 1, "k1", "d1"), refused("stale_token"));
    let (_, r) = s.accept(2, 80, T, 2, "k2", "d2");
    s.ok(
        2,
        81,
        submit(T, 1, 2, "k2", "d2"),
        Outcome::Replayed { receipt: r.clone() },
    );
    let report = check(&s.history(), &end_with(2, AttemptState::Done, vec![r]));
    valid(&report);
    assert_eq!(
        (report.enqueued, report.granted, report.submitted),
        (1, 2, 2)
    );
    assert_eq!((report.lost(), report.doubled()), (0, 0));
}

#[test]
fn overlapping_leases_through_an_acknowledged_heartbeat() {
    let mut s = Script::default();
    s.enqueue(T);
    let first = s.grant(1, 0, T, 1, 1, 60);
    let beat = s.ok(
        1,
        50,
        heartbeat(T, 1, 1),
        Outcome::Extended {
            expires_at: at(110),
        },
    );
    // Granted after the first grant's expiry but before its heartbeat's.
    let second = s.grant(2, 70, T, 1, 2, 60);
    let report = check(&s.history(), &end_with(2, AttemptState::Leased, vec![]));
    only(
        &report,
        AnomalyKind::OverlappingLeases,
        &[first, beat, second],
    );

    // Granted after the extended expiry: no overlap.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.ok(
        1,
        50,
        heartbeat(T, 1, 1),
        Outcome::Extended {
            expires_at: at(110),
        },
    );
    s.grant(2, 110, T, 1, 2, 60);
    valid(&check(
        &s.history(),
        &end_with(2, AttemptState::Leased, vec![]),
    ));
}

#[test]
fn a_lease_ended_by_its_holder_may_be_followed_at_once() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.ok(1, 5, fail(T, 1, 1, true), Outcome::Failed);
    s.grant(2, 6, T, 1, 2, 60);
    valid(&check(
        &s.history(),
        &end_with(2, AttemptState::Leased, vec![]),
    ));

    // Seen in a chaos run on SQLite: a claim reads the store's clock
    // before it waits for the writer, so its grant can be timed before
    // the grant and failure report that committed while it waited.
    let mut s = Script::default();
    s.enqueue(T);
    let waiting = s.begin(4, 9, claim());
    s.grant(2, 10, T, 1, 1, 60);
    s.ok(2, 11, fail(T, 1, 1, true), Outcome::Failed);
    s.end(
        waiting,
        12,
        tessera_check::Completion::Ok {
            outcome: Outcome::Granted {
                task: T.to_owned(),
                attempt: 1,
                token: 2,
                granted_at: at(9),
                expires_at: at(69),
            },
        },
    );
    valid(&check(
        &s.history(),
        &end_with(2, AttemptState::Leased, vec![]),
    ));

    // A failure report refused with a known error ended nothing.
    let mut s = Script::default();
    s.enqueue(T);
    let first = s.grant(1, 0, T, 1, 1, 60);
    s.run(1, 5, fail(T, 1, 1, true), refused("stale_token"));
    let second = s.grant(2, 6, T, 1, 2, 60);
    let report = check(&s.history(), &end_with(2, AttemptState::Leased, vec![]));
    only(&report, AnomalyKind::OverlappingLeases, &[first, second]);
}

#[test]
fn tokens_that_do_not_rise_in_acknowledged_order() {
    let mut s = Script::default();
    s.enqueue(T);
    let first = s.grant(1, 0, T, 1, 2, 60);
    let second = s.grant(2, 60, T, 1, 1, 60);
    let report = check(&s.history(), &end_with(2, AttemptState::Leased, vec![]));
    only(&report, AnomalyKind::TokenNotRising, &[first, second]);

    // Two concurrent claims: no order between them, but never one token.
    let mut s = Script::default();
    s.enqueue(T);
    let a = s.begin(1, 0, claim());
    let b = s.begin(2, 60, claim());
    let granted = |token, wall| tessera_check::Completion::Ok {
        outcome: Outcome::Granted {
            task: T.to_owned(),
            attempt: 1,
            token,
            granted_at: at(wall),
            expires_at: at(wall + 60),
        },
    };
    s.end(b, 60, granted(1, 60));
    s.end(a, 0, granted(1, 0));
    let report = check(&s.history(), &end_with(1, AttemptState::Leased, vec![]));
    only(&report, AnomalyKind::TokenNotRising, &[a, b]);
}

#[test]
fn a_token_counter_behind_an_acknowledged_grant() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let second = s.grant(2, 60, T, 1, 2, 60);
    let report = check(&s.history(), &end_with(1, AttemptState::Leased, vec![]));
    only(&report, AnomalyKind::GrantLost, &[second]);
}

#[test]
fn an_acknowledged_submission_missing_at_the_end() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let (submitted, _) = s.accept(1, 5, T, 1, "k1", "d1");
    let report = check(&s.history(), &end_with(1, AttemptState::Ready, vec![]));
    only(&report, AnomalyKind::LostSubmit, &[submitted]);

    // Stored with another payload is lost too.
    let report = check(
        &s.history(),
        &end_with(1, AttemptState::Done, vec![receipt(1, 1, "k1", "other", 5)]),
    );
    let kinds: Vec<_> = report.anomalies.iter().map(|a| a.kind).collect();
    assert!(kinds.contains(&AnomalyKind::LostSubmit), "{kinds:?}");
}

#[test]
fn a_submission_applied_twice() {
    // Two receipts stored for one attempt.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let (first, r1) = s.accept(1, 5, T, 1, "k1", "d1");
    let retry = s.run(1, 6, submit(T, 1, 1, "k1b", "d1"), unknown());
    let r2 = receipt(1, 1, "k1b", "d1", 6);
    let report = check(
        &s.history(),
        &end_with(1, AttemptState::Done, vec![r1.clone(), r2]),
    );
    only(&report, AnomalyKind::DoubledSubmit, &[first, retry]);

    // The same key accepted twice, as two receipts.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let (first, r1) = s.accept(1, 5, T, 1, "k1", "d1");
    let (again, _) = s.accept(1, 9, T, 1, "k1", "d1");
    let report = check(&s.history(), &end_with(1, AttemptState::Done, vec![r1]));
    let doubled = report
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::DoubledSubmit)
        .unwrap_or_else(|| panic!("{:#?}", report.anomalies));
    assert_eq!(doubled.operations, [first, again]);
}

#[test]
fn a_receipt_row_stored_twice_read_raw() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let (submitted, r) = s.accept(1, 5, T, 1, "k1", "d1");
    let row = FinalReceipt {
        task: T.to_owned(),
        receipt: r.clone(),
    };
    let mut end = end_with(1, AttemptState::Done, vec![]);
    end.receipts = vec![row.clone(), row.clone()];
    let report = check(&s.history(), &end);
    only(&report, AnomalyKind::DoubledSubmit, &[submitted]);
    assert_eq!(report.doubled(), 1);

    // One row, listed raw or under its attempt, is right.
    end.receipts = vec![row];
    valid(&check(&s.history(), &end));
    valid(&check(
        &s.history(),
        &end_with(1, AttemptState::Done, vec![r.clone()]),
    ));

    // A row for an attempt the task does not have.
    let mut end = end_with(1, AttemptState::Done, vec![r]);
    end.receipts = vec![FinalReceipt {
        task: T.to_owned(),
        receipt: receipt(2, 1, "k1", "d1", 5),
    }];
    only(&check(&s.history(), &end), AnomalyKind::Unexplained, &[]);
}

#[test]
fn more_attempts_finished_than_the_task_allows_alternatives() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.grant(2, 0, T, 2, 2, 60);
    let (first, r1) = s.accept(1, 5, T, 1, "k1", "d1");
    let r2 = receipt(2, 2, "k2", "d2", 6);
    let second = s.ok(
        2,
        6,
        submit(T, 2, 2, "k2", "d2"),
        Outcome::Accepted {
            receipt: r2.clone(),
        },
    );
    let mut end = FinalState::default();
    end.tasks.insert(
        T.to_owned(),
        FinalTask {
            last_token: Some(2),
            attempts: vec![
                FinalAttempt {
                    number: 1,
                    tries: None,
                    state: AttemptState::Done,
                    receipts: vec![r1],
                },
                FinalAttempt {
                    number: 2,
                    tries: None,
                    state: AttemptState::Done,
                    receipts: vec![r2],
                },
            ],
        },
    );
    end.alternatives.insert(T.to_owned(), 1);
    only(
        &check(&s.history(), &end),
        AnomalyKind::DoubledSubmit,
        &[first, second],
    );
    end.alternatives.insert(T.to_owned(), 2);
    valid(&check(&s.history(), &end));
}

#[test]
fn a_replay_that_returns_another_receipt() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let (first, r1) = s.accept(1, 5, T, 1, "k1", "d1");
    let replay = s.ok(
        1,
        7,
        submit(T, 1, 1, "k1", "d1"),
        Outcome::Replayed {
            receipt: receipt(1, 1, "k1", "d1", 7),
        },
    );
    let report = check(&s.history(), &end_with(1, AttemptState::Done, vec![r1]));
    let kinds: Vec<_> = report.anomalies.iter().map(|a| a.kind).collect();
    assert!(kinds.contains(&AnomalyKind::ReplayMismatch), "{kinds:?}");
    let mismatch = report
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::ReplayMismatch)
        .unwrap();
    assert_eq!(mismatch.operations, [first, replay]);
}

#[test]
fn a_stale_token_accepted() {
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let takeover = s.grant(2, 60, T, 1, 2, 60);
    let (late, r) = s.accept(1, 65, T, 1, "k1", "d1");
    let report = check(&s.history(), &end_with(2, AttemptState::Done, vec![r]));
    only(&report, AnomalyKind::StaleSubmitAccepted, &[takeover, late]);

    // Refused, it is no anomaly.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.grant(2, 60, T, 1, 2, 60);
    s.run(1, 65, submit(T, 1, 1, "k1", "d1"), refused("stale_token"));
    valid(&check(
        &s.history(),
        &end_with(2, AttemptState::Leased, vec![]),
    ));
}

#[test]
fn an_acknowledged_enqueue_missing_or_ended_unexplained() {
    let mut s = Script::default();
    let enqueued = s.enqueue(T);
    let report = check(&s.history(), &FinalState::default());
    only(&report, AnomalyKind::LostEnqueue, &[enqueued]);

    // Cancelled by nobody.
    let report = check(&s.history(), &end_with(0, AttemptState::Cancelled, vec![]));
    only(&report, AnomalyKind::LostEnqueue, &[enqueued]);
    // Done without a receipt.
    let report = check(&s.history(), &end_with(0, AttemptState::Done, vec![]));
    only(&report, AnomalyKind::LostEnqueue, &[enqueued]);
    // Failed for good by nobody.
    let report = check(&s.history(), &end_with(0, AttemptState::Failed, vec![]));
    only(&report, AnomalyKind::LostEnqueue, &[enqueued]);
    // Still claimable, or discarded: kept.
    valid(&check(
        &s.history(),
        &end_with(0, AttemptState::Ready, vec![]),
    ));
    valid(&check(
        &s.history(),
        &end_with(0, AttemptState::Discarded, vec![]),
    ));

    // An unknown enqueue may be missing, unless something acknowledged
    // the task.
    let mut s = Script::default();
    s.run(0, 0, enqueue(T), unknown());
    valid(&check(&s.history(), &FinalState::default()));
    let granted = s.grant(1, 0, T, 1, 1, 60);
    let report = check(&s.history(), &FinalState::default());
    let lost = report
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::LostEnqueue)
        .unwrap();
    assert_eq!(lost.operations, [granted]);
}

#[test]
fn work_after_an_acknowledged_cancel() {
    let mut s = Script::default();
    s.enqueue(T);
    let cancelled = s.ok(0, 1, cancel(T), Outcome::Cancelled);
    let granted = s.grant(1, 2, T, 1, 1, 60);
    let report = check(&s.history(), &end_with(1, AttemptState::Cancelled, vec![]));
    only(&report, AnomalyKind::RanAfterCancel, &[cancelled, granted]);

    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let cancelled = s.ok(0, 1, cancel(T), Outcome::Cancelled);
    let beat = s.ok(
        1,
        2,
        heartbeat(T, 1, 1),
        Outcome::Extended { expires_at: at(62) },
    );
    let report = check(&s.history(), &end_with(1, AttemptState::Cancelled, vec![]));
    only(&report, AnomalyKind::RanAfterCancel, &[cancelled, beat]);
}

#[test]
fn an_unknown_cancel_excuses_only_overlaps_it_could_have_ended() {
    let granted = |token, wall| tessera_check::Completion::Ok {
        outcome: Outcome::Granted {
            task: T.to_owned(),
            attempt: 1,
            token,
            granted_at: at(wall),
            expires_at: at(wall + 60),
        },
    };

    // Invoked after the overlap: it excuses nothing.
    let mut s = Script::default();
    s.enqueue(T);
    let first = s.grant(1, 0, T, 1, 1, 60);
    let second = s.grant(2, 10, T, 1, 2, 60);
    s.run(0, 11, cancel(T), unknown());
    let end = end_with(2, AttemptState::Leased, vec![]);
    only(
        &check(&s.history(), &end),
        AnomalyKind::OverlappingLeases,
        &[first, second],
    );

    // Invoked before the second grant was acknowledged: it may have
    // ended the first lease in between.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let claiming = s.begin(2, 10, claim());
    s.run(0, 10, cancel(T), unknown());
    s.end(claiming, 10, granted(2, 10));
    valid(&check(&s.history(), &end));

    // Acknowledged before the first grant was invoked: it cannot have
    // ended a lease granted after it.
    let mut s = Script::default();
    s.enqueue(T);
    s.ok(0, 0, cancel(T), Outcome::Cancelled);
    let first = s.grant(1, 0, T, 1, 1, 60);
    let second = s.grant(2, 10, T, 1, 2, 60);
    let report = check(&s.history(), &end_with(2, AttemptState::Cancelled, vec![]));
    let overlap = report
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::OverlappingLeases)
        .unwrap_or_else(|| panic!("{:#?}", report.anomalies));
    assert_eq!(overlap.operations, [first, second]);

    // One cancel takes effect once: it may end the first overlap's lease
    // or the second's, not both.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let claiming = s.begin(2, 10, claim());
    let lost = s.run(0, 10, cancel(T), unknown());
    s.end(claiming, 10, granted(2, 10));
    let third = s.grant(3, 100, T, 1, 3, 60);
    let fourth = s.grant(4, 110, T, 1, 4, 60);
    only(
        &check(&s.history(), &end_with(4, AttemptState::Leased, vec![])),
        AnomalyKind::OverlappingLeases,
        &[third, fourth, lost],
    );
}

#[test]
fn an_acknowledged_cancel_that_left_work_unfinished() {
    let mut s = Script::default();
    s.enqueue(T);
    let cancelled = s.ok(0, 1, cancel(T), Outcome::Cancelled);
    let report = check(&s.history(), &end_with(0, AttemptState::Ready, vec![]));
    only(&report, AnomalyKind::LostCancel, &[cancelled]);
}

#[test]
fn unknown_outcomes_either_way_but_effects_need_a_cause() {
    // An unknown submission may have landed or not.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.run(1, 5, submit(T, 1, 1, "k1", "d1"), unknown());
    let landed = receipt(1, 1, "k1", "d1", 5);
    valid(&check(
        &s.history(),
        &end_with(1, AttemptState::Done, vec![landed]),
    ));
    valid(&check(
        &s.history(),
        &end_with(1, AttemptState::Leased, vec![]),
    ));

    // A receipt nobody submitted.
    let report = check(
        &s.history(),
        &end_with(1, AttemptState::Done, vec![receipt(1, 1, "k9", "d9", 5)]),
    );
    only(&report, AnomalyKind::Unexplained, &[]);

    // A token counter ahead of every grant: explained by an unknown claim,
    // not without one.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    valid(&check(
        &s.history(),
        &end_with(1, AttemptState::Leased, vec![]),
    ));
    let report = check(&s.history(), &end_with(2, AttemptState::Leased, vec![]));
    assert_eq!(report.anomalies.len(), 1, "{:#?}", report.anomalies);
    assert_eq!(report.anomalies[0].kind, AnomalyKind::Unexplained);
    let lost_answer = s.begin(2, 60, claim());
    let report = check(&s.history(), &end_with(2, AttemptState::Leased, vec![]));
    valid(&report);
    assert_eq!(report.unknown, 1);
    let _ = lost_answer;

    // A task nobody enqueued.
    let s = Script::default();
    let report = check(&s.history(), &end_with(0, AttemptState::Ready, vec![]));
    only(&report, AnomalyKind::Unexplained, &[]);
}

#[test]
fn leases_timed_by_skewed_clocks_may_seem_to_overlap_by_the_skew_alone() {
    // Seen in a chaos run on PostgreSQL with clocks up to 0.4 s apart:
    // process 2 holds token 1 until 38.938 by its own clock and dies;
    // process 3, its clock ahead, finds the lease lapsed and is granted
    // token 2, which it fails; process 2, started again with its clock
    // behind, is granted token 3 at 38.909 by its clock.
    let millis = |ms: i64| at(0) + chrono::TimeDelta::milliseconds(ms);
    let granted = |token, from: i64| tessera_check::Completion::Ok {
        outcome: Outcome::Granted {
            task: T.to_owned(),
            attempt: 1,
            token,
            granted_at: millis(from),
            expires_at: millis(from + 2_000),
        },
    };
    let mut s = Script::default();
    s.enqueue(T);
    let first = s.begin(2, 36, claim());
    s.end(first, 36, granted(1, 36_169));
    let beat = s.ok(
        2,
        37,
        heartbeat(T, 1, 1),
        Outcome::Extended {
            expires_at: millis(38_938),
        },
    );
    let second = s.begin(3, 39, claim());
    s.end(second, 39, granted(2, 39_023));
    s.ok(3, 39, fail(T, 1, 2, true), Outcome::Failed);
    let third = s.begin(2, 38, claim());
    s.end(third, 38, granted(3, 38_909));
    let end = end_with(3, AttemptState::Leased, vec![]);

    // With no skew allowed, 29 ms of overlap is an anomaly …
    let report = check(&s.history(), &end);
    only(
        &report,
        AnomalyKind::OverlappingLeases,
        &[first, beat, third],
    );
    // … within the 0.8 s two clocks 0.4 s off either way may differ, it
    // is not.
    let options = tessera_check::CheckOptions {
        clock_skew: chrono::TimeDelta::milliseconds(800),
    };
    valid(&tessera_check::check_with(&s.history(), &end, &options));
    // A longer overlap still is.
    let options = tessera_check::CheckOptions {
        clock_skew: chrono::TimeDelta::milliseconds(20),
    };
    let report = tessera_check::check_with(&s.history(), &end, &options);
    only(
        &report,
        AnomalyKind::OverlappingLeases,
        &[first, beat, third],
    );
}
