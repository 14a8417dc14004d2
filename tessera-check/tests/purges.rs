//! Hand-made histories for purges: a task missing at the end is excused
//! only where the store's retention may have purged it (every attempt
//! ended, its keep time passed before the end was read, no more than the
//! audit counts), and each way of breaking that is found.

mod script;

use chrono::TimeDelta;
use tessera_check::{
    AnomalyKind, AttemptState, CheckOptions, Completion, FinalFire, FinalRetention, FinalSchedule,
    FinalState, FinalTask, Operation, OperationId, Outcome, Report, check, check_with,
};

use script::{
    Enqueued, Script, at, cancel, claim, enqueue, enqueue_with, fail, fire_task, fired, heartbeat,
    refused, submit, unknown,
};

const T: &str = "render-7";
const U: &str = "render-8";
const QUEUE: &str = "frames";
const SCHEDULE: &str = "nightly";

/// Done kept 30 s, failed and discarded 60 s, cancelled 90 s; the end
/// read at `read_at`, the audit counting `purged` by queue.
fn retention(read_at: i64, purged: &[(&str, u64)]) -> FinalRetention {
    FinalRetention {
        done_ms: Some(30_000),
        discarded_ms: Some(60_000),
        cancelled_ms: Some(90_000),
        read_at: at(read_at),
        purged: purged
            .iter()
            .map(|(queue, count)| ((*queue).to_owned(), *count))
            .collect(),
    }
}

/// An end where every task is gone, read at `read_at`.
fn purged_end(read_at: i64, purged: &[(&str, u64)]) -> FinalState {
    FinalState {
        retention: Some(retention(read_at, purged)),
        ..FinalState::default()
    }
}

/// An enqueue of `task` into the queue, with its attempts and tries.
fn enqueue_in(task: &str, alternatives: u16, max_tries: u32) -> Operation {
    enqueue_with(
        task,
        Enqueued {
            queue: Some(QUEUE),
            alternatives: Some(alternatives),
            max_tries: Some(max_tries),
            ..Enqueued::default()
        },
    )
}

fn valid(report: &Report) {
    assert!(report.is_valid(), "{:#?}", report.anomalies);
}

/// The kinds of the anomalies found, each once, in order.
fn kinds(report: &Report) -> Vec<AnomalyKind> {
    let mut kinds: Vec<AnomalyKind> = report.anomalies.iter().map(|a| a.kind).collect();
    kinds.dedup();
    kinds
}

/// Finds `task` lost: a lost enqueue naming `operations`, whose detail
/// says `why`.
fn lost(report: &Report, task: &str, operations: &[OperationId], why: &str) {
    let mut expected = operations.to_vec();
    expected.sort_unstable();
    let found = report.anomalies.iter().any(|a| {
        a.kind == AnomalyKind::LostEnqueue
            && a.task == task
            && a.operations == expected
            && a.detail.contains(why)
    });
    assert!(found, "{expected:?}, {why:?}: {:#?}", report.anomalies);
}

/// A task enqueued, granted at 0 and done at 10 under token 1.
fn done_at_ten(s: &mut Script, task: &str) -> (OperationId, OperationId, OperationId) {
    let enqueued = s.ok(0, 0, enqueue_in(task, 1, 3), Outcome::Enqueued);
    let granted = s.grant(1, 0, task, 1, 1, 60);
    let (accepted, _) = s.accept(1, 10, task, 1, "k1", "d1");
    (enqueued, granted, accepted)
}

#[test]
fn a_done_task_purged_after_its_keep_time_is_excused() {
    let mut s = Script::default();
    done_at_ten(&mut s, T);
    // Calls under its token once it is gone are refusals: 410
    // task_purged changed nothing.
    s.run(1, 50, submit(T, 1, 1, "k1", "d1"), refused("task_purged"));
    s.run(2, 51, heartbeat(T, 1, 1), refused("task_purged"));
    // Done at 10, kept 30 s: purgeable from 40.
    let report = check(&s.history(), &purged_end(40, &[(QUEUE, 1)]));
    valid(&report);
    assert_eq!(report.purged, [T]);

    // Without retention's evidence the same end is lost work.
    let report = check(&s.history(), &FinalState::default());
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::GrantLost,
            AnomalyKind::LostSubmit,
            AnomalyKind::LostEnqueue
        ]
    );
    assert!(report.purged.is_empty());
}

#[test]
fn a_task_missing_before_its_keep_time_passed_is_lost() {
    let mut s = Script::default();
    let (enqueued, granted, accepted) = done_at_ten(&mut s, T);
    let report = check(&s.history(), &purged_end(39, &[(QUEUE, 1)]));
    lost(
        &report,
        T,
        &[enqueued, granted, accepted],
        "purged from 2026-10-29 12:00:40 UTC at the earliest",
    );
    // Its receipt and token counter are lost with it.
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::GrantLost,
            AnomalyKind::LostSubmit,
            AnomalyKind::LostEnqueue
        ]
    );

    // The clocks may differ by the skew allowed, twice over: the end may
    // have been timed by another clock than the purge, and the purge by
    // another than the evidence.
    let skewed = |seconds| CheckOptions {
        clock_skew: TimeDelta::seconds(seconds),
    };
    let end = purged_end(34, &[(QUEUE, 1)]);
    valid(&check_with(&s.history(), &end, &skewed(3)));
    assert!(!check_with(&s.history(), &end, &skewed(2)).is_valid());

    // A later sign of the task unfinished (an enqueue answered as its
    // duplicate: it held its unique slot) moves its end later. Here the
    // only end is a submission whose answer was lost.
    let unique = |task: &str| {
        enqueue_with(
            task,
            Enqueued {
                queue: Some(QUEUE),
                unique_key: Some("report-7"),
                ..Enqueued::default()
            },
        )
    };
    let mut s = Script::default();
    let enqueued = s.ok(0, 0, unique(T), Outcome::Enqueued);
    let granted = s.grant(1, 0, T, 1, 1, 60);
    s.run(1, 5, submit(T, 1, 1, "k1", "d1"), unknown());
    let end = purged_end(60, &[(QUEUE, 1)]);
    valid(&check(&s.history(), &end));
    let duplicate = s.ok(0, 40, unique(U), Outcome::Duplicate { of: T.to_owned() });
    let report = check(&s.history(), &end);
    // Still there at 40, done no earlier: purgeable from 70.
    lost(
        &report,
        T,
        &[enqueued, granted],
        "purged from 2026-10-29 12:01:10 UTC at the earliest",
    );
    let holder = report
        .anomalies
        .iter()
        .find(|a| a.operations == [duplicate])
        .expect("the duplicate's holder is missing");
    assert_eq!(holder.kind, AnomalyKind::LostEnqueue);
}

#[test]
fn a_task_missing_while_unfinished_is_lost() {
    // Granted, and its submission refused: it never ended.
    let mut s = Script::default();
    let enqueued = s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    let granted = s.grant(1, 0, T, 1, 1, 60);
    s.run(1, 5, submit(T, 1, 1, "k1", "d1"), refused("stale_token"));
    let report = check(&s.history(), &purged_end(1_000, &[(QUEUE, 1)]));
    lost(&report, T, &[enqueued, granted], "attempt 1 shows no end");
    assert_eq!(
        kinds(&report),
        [AnomalyKind::GrantLost, AnomalyKind::LostEnqueue]
    );

    // A submission whose answer was lost under a token a later grant
    // superseded never made it done.
    let mut s = Script::default();
    let enqueued = s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    let first = s.grant(1, 0, T, 1, 1, 60);
    s.run(1, 5, submit(T, 1, 1, "k1", "d1"), unknown());
    let second = s.grant(2, 70, T, 1, 2, 60);
    let end = purged_end(1_000, &[(QUEUE, 1)]);
    lost(
        &check(&s.history(), &end),
        T,
        &[enqueued, first, second],
        "attempt 1 shows no end",
    );
    // The newer holder's submission, answer lost too, may have.
    s.run(2, 75, submit(T, 1, 2, "k2", "d2"), unknown());
    valid(&check(&s.history(), &end));

    // A failure report asking for a retry ends nothing while tries are
    // left: the attempt is claimable again.
    let mut s = Script::default();
    let enqueued = s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    let granted = s.grant(1, 0, T, 1, 1, 60);
    let failed = s.ok(1, 5, fail(T, 1, 1, true), Outcome::Failed);
    lost(
        &check(&s.history(), &end),
        T,
        &[enqueued, granted, failed],
        "attempt 1 shows no end",
    );
}

#[test]
fn every_attempt_must_have_ended() {
    // Two attempts: the first done, the second never granted.
    let mut s = Script::default();
    let enqueued = s.ok(0, 0, enqueue_in(T, 2, 3), Outcome::Enqueued);
    let granted = s.grant(1, 0, T, 1, 1, 60);
    let (accepted, _) = s.accept(1, 10, T, 1, "k1", "d1");
    let end = purged_end(1_000, &[(QUEUE, 1)]);
    lost(
        &check(&s.history(), &end),
        T,
        &[enqueued, granted, accepted],
        "attempt 2 shows no end",
    );
    // The second done at 50: the task is kept until 80.
    s.grant(2, 40, T, 2, 2, 60);
    s.ok(
        2,
        50,
        submit(T, 2, 2, "k2", "d2"),
        Outcome::Accepted {
            receipt: script::receipt(2, 2, "k2", "d2", 50),
        },
    );
    assert!(!check(&s.history(), &purged_end(79, &[(QUEUE, 1)])).is_valid());
    valid(&check(&s.history(), &purged_end(80, &[(QUEUE, 1)])));
}

#[test]
fn cancels_failures_and_discards_end_an_attempt_for_their_own_keep_time() {
    // Cancelled at 10, kept 90 s.
    let mut s = Script::default();
    s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    s.ok(0, 10, cancel(T), Outcome::Cancelled);
    assert!(!check(&s.history(), &purged_end(99, &[(QUEUE, 1)])).is_valid());
    valid(&check(&s.history(), &purged_end(100, &[(QUEUE, 1)])));
    // Kept for good, it is never purged.
    let mut end = purged_end(100_000, &[(QUEUE, 1)]);
    end.retention.as_mut().unwrap().cancelled_ms = None;
    let report = check(&s.history(), &end);
    assert!(
        report
            .anomalies
            .iter()
            .any(|a| a.detail.contains("kept for good")),
        "{report:#?}"
    );

    // A bulk cancel of its queue, whose answer was lost, may have met it.
    let mut s = Script::default();
    s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    let bulk = Operation::CancelTasks {
        queue: QUEUE.to_owned(),
        state: "ready".to_owned(),
    };
    s.run(0, 10, bulk, unknown());
    valid(&check(&s.history(), &purged_end(100, &[(QUEUE, 1)])));
    // One of another queue cannot have.
    let mut s = Script::default();
    s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    let elsewhere = Operation::CancelTasks {
        queue: "other".to_owned(),
        state: "ready".to_owned(),
    };
    s.ok(0, 10, elsewhere, Outcome::Changed { count: 1 });
    assert!(!check(&s.history(), &purged_end(100, &[(QUEUE, 1)])).is_valid());

    // Failed for good at 10, kept 60 s.
    let mut s = Script::default();
    s.ok(0, 0, enqueue_in(T, 1, 3), Outcome::Enqueued);
    s.grant(1, 0, T, 1, 1, 60);
    s.ok(1, 10, fail(T, 1, 1, false), Outcome::Failed);
    assert!(!check(&s.history(), &purged_end(69, &[(QUEUE, 1)])).is_valid());
    valid(&check(&s.history(), &purged_end(70, &[(QUEUE, 1)])));

    // Discarded: two tries, both granted and lapsed; the second granted
    // at 70, so kept until at least 130.
    let discarded = |max_tries: Option<u32>| {
        let mut s = Script::default();
        let enqueue = enqueue_with(
            T,
            Enqueued {
                queue: Some(QUEUE),
                max_tries,
                ..Enqueued::default()
            },
        );
        s.ok(0, 0, enqueue, Outcome::Enqueued);
        s.grant(1, 0, T, 1, 1, 60);
        s.grant(2, 70, T, 1, 2, 60);
        s
    };
    let s = discarded(Some(2));
    assert!(!check(&s.history(), &purged_end(129, &[(QUEUE, 1)])).is_valid());
    valid(&check(&s.history(), &purged_end(130, &[(QUEUE, 1)])));
    // With a third try left, or no max_tries recorded, no discard shows.
    for max_tries in [Some(3), None] {
        let report = check(
            &discarded(max_tries).history(),
            &purged_end(1_000, &[(QUEUE, 1)]),
        );
        assert!(
            report
                .anomalies
                .iter()
                .any(|a| a.detail.contains("shows no end")),
            "{report:#?}"
        );
    }
    // A claim whose answer was lost may have been its third grant.
    let mut s = discarded(Some(3));
    s.run(3, 140, claim(), unknown());
    valid(&check(&s.history(), &purged_end(1_000, &[(QUEUE, 1)])));
}

#[test]
fn no_more_tasks_are_excused_than_the_audit_counts_purged() {
    let mut s = Script::default();
    done_at_ten(&mut s, T);
    done_at_ten(&mut s, U);
    valid(&check(&s.history(), &purged_end(100, &[(QUEUE, 2)])));
    // One purge audited: one of the two vanished without one.
    for purged in [&[(QUEUE, 1)][..], &[(QUEUE, 1), ("other", 5)][..]] {
        let report = check(&s.history(), &purged_end(100, purged));
        assert_eq!(report.anomalies.len(), 1, "{:#?}", report.anomalies);
        let anomaly = &report.anomalies[0];
        assert_eq!(anomaly.kind, AnomalyKind::LostEnqueue);
        assert_eq!(anomaly.task, "queue frames");
        assert!(anomaly.detail.contains("at least 1 vanished"), "{anomaly}");
        assert!(anomaly.detail.contains(&format!("{T}, {U}")), "{anomaly}");
        assert!(!report.is_valid() && report.lost() == 1);
    }

    // A task whose queue the history does not show counts in all.
    let mut s = Script::default();
    s.ok(0, 0, enqueue(T), Outcome::Enqueued);
    s.ok(0, 10, cancel(T), Outcome::Cancelled);
    valid(&check(&s.history(), &purged_end(100, &[("other", 1)])));
    let report = check(&s.history(), &purged_end(100, &[]));
    assert_eq!(report.anomalies.len(), 1, "{:#?}", report.anomalies);
    assert_eq!(report.anomalies[0].task, "*");
}

#[test]
fn a_fired_task_may_be_purged_and_its_run_at_still_counts_fired() {
    let (first, second) = (at(0), at(10));
    let (early, late) = (fire_task(SCHEDULE, first), fire_task(SCHEDULE, second));
    let mut s = Script::default();
    // The pass that fired the first run-at lost its answer; the second
    // was acknowledged.
    s.run(1, 1, Operation::FireSchedules, unknown());
    let pass = s.ok(
        1,
        11,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, second)]),
    );
    // The first run-at's task was claimed and done at 3.
    s.grant(2, 2, &early, 1, 1, 60);
    s.accept(2, 3, &early, 1, "k1", "d1");
    // Retention kept the latest fire row alone, and purged the early
    // task, done at 3, by 40.
    let mut end = purged_end(40, &[(QUEUE, 1)]);
    end.tasks.insert(
        late.clone(),
        FinalTask {
            last_token: None,
            attempts: vec![tessera_check::FinalAttempt::new(1, AttemptState::Ready)],
        },
    );
    end.schedules.insert(
        SCHEDULE.to_owned(),
        FinalSchedule {
            fires: vec![FinalFire {
                run_at: second,
                task: late.clone(),
            }],
            due: vec![first, second],
        },
    );
    let report = check(&s.history(), &end);
    valid(&report);
    assert_eq!(report.purged, [early.as_str()]);

    // Read before its keep time passed, the task is lost, and so is the
    // fire of its run-at.
    end.retention.as_mut().unwrap().read_at = at(32);
    let report = check(&s.history(), &end);
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::GrantLost,
            AnomalyKind::LostSubmit,
            AnomalyKind::LostEnqueue,
            AnomalyKind::LostFire
        ]
    );

    // The acknowledged fire's task missing unfinished is lost.
    end.retention.as_mut().unwrap().read_at = at(40);
    end.tasks.clear();
    let report = check(&s.history(), &end);
    let missing = report
        .anomalies
        .iter()
        .find(|a| a.task == late)
        .expect("the fired task is missing");
    assert_eq!(missing.kind, AnomalyKind::LostEnqueue);
    assert_eq!(missing.operations, [pass]);
}

#[test]
fn retention_settings_read_back_from_json() {
    let end = purged_end(40, &[(QUEUE, 3)]);
    let json = serde_json::to_string(&end).unwrap();
    assert!(json.contains(r#""done_ms":30000"#), "{json}");
    assert!(json.contains(r#""purged":{"frames":3}"#), "{json}");
    assert_eq!(serde_json::from_str::<FinalState>(&json).unwrap(), end);
    // An end without it reads as retention off.
    let old: FinalState = serde_json::from_str(r#"{"tasks":{}}"#).unwrap();
    assert_eq!(old.retention, None);
    let keep = retention(0, &[]);
    assert_eq!(
        keep.keep(AttemptState::Discarded),
        Some(TimeDelta::seconds(60))
    );
    assert_eq!(
        keep.keep(AttemptState::Failed),
        keep.keep(AttemptState::Discarded)
    );
    assert_eq!(keep.keep(AttemptState::Leased), None);
    let _: Completion = unknown();
}
