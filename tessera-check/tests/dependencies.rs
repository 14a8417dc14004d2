//! Hand-made histories of tasks that wait for other tasks: the check of
//! dependencies fails on a child granted before its parent's submission
//! was asked for, naming the child's enqueue and grant, and passes the
//! same history done right.

mod script;

use tessera_check::{
    AnomalyKind, AttemptState, FinalAttempt, FinalState, FinalTask, OperationId, Receipt, Report,
    check,
};

use script::{Enqueued, Script, enqueue_with, fail, refused, submit, unknown};

const PARENT: &str = "brief-1";
const OTHER: &str = "brief-2";
const CHILD: &str = "compare-1";

/// Tasks of one attempt each: id, last token, state and receipts.
fn ends(tasks: &[(&str, i64, AttemptState, Vec<Receipt>)]) -> FinalState {
    let mut end = FinalState::default();
    for (task, last_token, state, receipts) in tasks {
        let mut attempt = FinalAttempt::new(1, *state);
        attempt.receipts.clone_from(receipts);
        end.tasks.insert(
            (*task).to_owned(),
            FinalTask {
                last_token: (*last_token > 0).then_some(*last_token),
                attempts: vec![attempt],
            },
        );
    }
    end
}

fn only(report: &Report, kind: AnomalyKind, task: &str, operations: &[OperationId]) {
    assert_eq!(report.anomalies.len(), 1, "{:#?}", report.anomalies);
    let anomaly = &report.anomalies[0];
    assert_eq!(anomaly.kind, kind, "{anomaly}");
    assert_eq!(anomaly.task, task, "{anomaly}");
    let mut expected = operations.to_vec();
    expected.sort_unstable();
    assert_eq!(anomaly.operations, expected, "{anomaly}");
}

fn valid(report: &Report) {
    assert!(report.is_valid(), "{:#?}", report.anomalies);
}

/// Enqueues the parents, then the child after them.
fn enqueue_family(s: &mut Script, parents: &[&'static str], any_outcome: bool) -> OperationId {
    for parent in parents {
        s.ok(
            0,
            0,
            enqueue_with(parent, Enqueued::default()),
            tessera_check::Outcome::Enqueued,
        );
    }
    s.ok(
        0,
        0,
        enqueue_with(
            CHILD,
            Enqueued {
                after: parents.to_vec(),
                any_outcome,
                ..Enqueued::default()
            },
        ),
        tessera_check::Outcome::Enqueued,
    )
}

#[test]
fn a_child_granted_after_its_parent_was_submitted_is_valid() {
    let mut s = Script::default();
    enqueue_family(&mut s, &[PARENT], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    let (_, receipt) = s.accept(1, 2, PARENT, 1, "k1", "d1");
    s.grant(2, 3, CHILD, 1, 1, 60);
    let end = ends(&[
        (PARENT, 1, AttemptState::Done, vec![receipt]),
        (CHILD, 1, AttemptState::Leased, Vec::new()),
    ]);
    valid(&check(&s.history(), &end));
}

#[test]
fn a_child_granted_before_its_parent_was_submitted() {
    let mut s = Script::default();
    let child = enqueue_family(&mut s, &[PARENT], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    let grant = s.grant(2, 2, CHILD, 1, 1, 60);
    let (_, receipt) = s.accept(1, 3, PARENT, 1, "k1", "d1");
    let end = ends(&[
        (PARENT, 1, AttemptState::Done, vec![receipt]),
        (CHILD, 1, AttemptState::Leased, Vec::new()),
    ]);
    only(
        &check(&s.history(), &end),
        AnomalyKind::RanBeforeParent,
        CHILD,
        &[child, grant],
    );
}

#[test]
fn a_submission_under_way_or_unanswered_may_have_ended_the_parent() {
    // The parent's submission was asked for before the child's claim
    // completed, and answered after it: the store may have accepted it
    // first.
    let mut s = Script::default();
    enqueue_family(&mut s, &[PARENT], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    let submitting = s.begin(1, 2, submit(PARENT, 1, 1, "k1", "d1"));
    s.grant(2, 3, CHILD, 1, 1, 60);
    s.end(submitting, 4, unknown());
    let receipt = script::receipt(1, 1, "k1", "d1", 2);
    let end = ends(&[
        (PARENT, 1, AttemptState::Done, vec![receipt]),
        (CHILD, 1, AttemptState::Leased, Vec::new()),
    ]);
    valid(&check(&s.history(), &end));
}

#[test]
fn a_refused_submission_does_not_end_the_parent() {
    let mut s = Script::default();
    let child = enqueue_family(&mut s, &[PARENT], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    s.run(
        1,
        2,
        submit(PARENT, 1, 1, "k1", "d1"),
        refused("lease_lost"),
    );
    let grant = s.grant(2, 3, CHILD, 1, 1, 60);
    let end = ends(&[
        (PARENT, 1, AttemptState::Leased, Vec::new()),
        (CHILD, 1, AttemptState::Leased, Vec::new()),
    ]);
    only(
        &check(&s.history(), &end),
        AnomalyKind::RanBeforeParent,
        CHILD,
        &[child, grant],
    );
}

#[test]
fn every_parent_must_have_been_submitted() {
    let mut s = Script::default();
    let child = enqueue_family(&mut s, &[PARENT, OTHER], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    let (_, receipt) = s.accept(1, 2, PARENT, 1, "k1", "d1");
    let grant = s.grant(2, 3, CHILD, 1, 1, 60);
    let end = ends(&[
        (PARENT, 1, AttemptState::Done, vec![receipt]),
        (OTHER, 0, AttemptState::Ready, Vec::new()),
        (CHILD, 1, AttemptState::Leased, Vec::new()),
    ]);
    let report = check(&s.history(), &end);
    only(
        &report,
        AnomalyKind::RanBeforeParent,
        CHILD,
        &[child, grant],
    );
    assert!(
        report.anomalies[0].detail.contains(OTHER),
        "{}",
        report.anomalies[0]
    );
}

#[test]
fn a_child_on_any_outcome_runs_after_a_parent_that_failed() {
    let mut s = Script::default();
    enqueue_family(&mut s, &[PARENT], true);
    s.grant(1, 1, PARENT, 1, 1, 60);
    s.ok(
        1,
        2,
        fail(PARENT, 1, 1, false),
        tessera_check::Outcome::Failed,
    );
    s.grant(2, 3, CHILD, 1, 1, 60);
    let end = ends(&[
        (PARENT, 1, AttemptState::Failed, Vec::new()),
        (CHILD, 1, AttemptState::Leased, Vec::new()),
    ]);
    valid(&check(&s.history(), &end));
}

#[test]
fn parents_round_trip_through_a_history_line() {
    let operation = enqueue_with(
        CHILD,
        Enqueued {
            after: vec![PARENT, OTHER],
            ..Enqueued::default()
        },
    );
    let line = serde_json::to_string(&operation).unwrap();
    assert!(line.contains(r#""after":["brief-1","brief-2"]"#), "{line}");
    assert!(!line.contains("any_outcome"), "{line}");
    let back: tessera_check::Operation = serde_json::from_str(&line).unwrap();
    assert_eq!(back, operation);
    let plain = serde_json::to_string(&tessera_check::Operation::enqueue(PARENT)).unwrap();
    assert!(!plain.contains("after"), "{plain}");
}

#[test]
fn a_child_cancelled_by_a_parent_that_failed_is_explained_and_by_none_is_not() {
    let mut s = Script::default();
    enqueue_family(&mut s, &[PARENT], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    s.ok(
        1,
        2,
        fail(PARENT, 1, 1, false),
        tessera_check::Outcome::Failed,
    );
    let failed = ends(&[
        (PARENT, 1, AttemptState::Failed, Vec::new()),
        (CHILD, 0, AttemptState::Cancelled, Vec::new()),
    ]);
    valid(&check(&s.history(), &failed));

    // The same child cancelled while its parent was done: nobody did it.
    let mut s = Script::default();
    let child_enqueue = enqueue_family(&mut s, &[PARENT], false);
    s.grant(1, 1, PARENT, 1, 1, 60);
    let (_, receipt) = s.accept(1, 2, PARENT, 1, "k1", "d1");
    let done = ends(&[
        (PARENT, 1, AttemptState::Done, vec![receipt]),
        (CHILD, 0, AttemptState::Cancelled, Vec::new()),
    ]);
    only(
        &check(&s.history(), &done),
        AnomalyKind::LostEnqueue,
        CHILD,
        &[child_enqueue],
    );
}

#[test]
fn a_child_cancelled_by_its_parent_may_be_purged_and_one_with_no_cause_may_not() {
    let retention = |read_at: i64| tessera_check::FinalRetention {
        done_ms: Some(30_000),
        discarded_ms: Some(60_000),
        cancelled_ms: Some(60_000),
        read_at: script::at(read_at),
        purged: [(String::new(), 1)].into_iter().collect(),
    };
    // The parent cancelled at 2 s, so the child too: both kept a minute,
    // then purged; read at 100 s, both missing.
    let mut s = Script::default();
    enqueue_family(&mut s, &[PARENT], false);
    s.ok(
        0,
        2,
        script::cancel(PARENT),
        tessera_check::Outcome::Cancelled,
    );
    let mut end = FinalState::default();
    let mut gone = retention(100);
    gone.purged = [(String::new(), 2)].into_iter().collect();
    end.retention = Some(gone);
    let report = check(&s.history(), &end);
    valid(&report);
    assert_eq!(report.purged, [PARENT, CHILD]);

    // No cancel anywhere: the child has no end, so it cannot have been
    // purged, though its parent is kept.
    let mut s = Script::default();
    let child = enqueue_family(&mut s, &[PARENT], false);
    let mut end = ends(&[(PARENT, 0, AttemptState::Ready, Vec::new())]);
    end.retention = Some(retention(100));
    only(
        &check(&s.history(), &end),
        AnomalyKind::LostEnqueue,
        CHILD,
        &[child],
    );
}
