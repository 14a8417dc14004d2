//! Hand-made histories for the queue features: unique keys, concurrency
//! limits, pauses, deadlines, snoozes and schedules. Each check fails on
//! the history made to break it, naming the operations involved, and
//! passes the same history done right.

mod script;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_check::{
    Anomaly, AnomalyKind, AttemptState, CheckOptions, FinalAttempt, FinalFire, FinalSchedule,
    FinalState, FinalTask, Operation, OperationId, Outcome, Report, check, check_with,
};

use script::{
    Enqueued, Script, at, cancel, claim, enqueue_with, fail, fire_task, fired, heartbeat,
    pause_queue, pause_schedule, refused, resume_queue, resume_schedule, set_limits, snooze,
    unknown,
};

const T: &str = "render-7";
const SCHEDULE: &str = "nightly";

/// Tasks of one attempt each: id, last token, state.
fn ends(tasks: &[(&str, i64, AttemptState)]) -> FinalState {
    let mut end = FinalState::default();
    for (task, last_token, state) in tasks {
        end.tasks.insert(
            (*task).to_owned(),
            FinalTask {
                last_token: (*last_token > 0).then_some(*last_token),
                attempts: vec![FinalAttempt::new(1, *state)],
            },
        );
    }
    end
}

/// The only anomaly found, which must be of `kind` and name `operations`.
fn only(report: &Report, kind: AnomalyKind, operations: &[OperationId]) -> Anomaly {
    assert_eq!(report.anomalies.len(), 1, "{:#?}", report.anomalies);
    let anomaly = report.anomalies[0].clone();
    assert_eq!(anomaly.kind, kind, "{anomaly}");
    let mut expected = operations.to_vec();
    expected.sort_unstable();
    assert_eq!(anomaly.operations, expected, "{anomaly}");
    anomaly
}

fn valid(report: &Report) {
    assert!(report.is_valid(), "{:#?}", report.anomalies);
}

fn unique(task: &str) -> Operation {
    enqueue_with(
        task,
        Enqueued {
            queue: Some("frames"),
            unique_key: Some("report-7"),
            ..Enqueued::default()
        },
    )
}

fn in_partition(task: &str, partition: &'static str) -> Operation {
    enqueue_with(
        task,
        Enqueued {
            queue: Some("frames"),
            partition: Some(partition),
            ..Enqueued::default()
        },
    )
}

#[test]
fn two_tasks_holding_one_unique_key() {
    use AttemptState::{Done, Ready};

    // The second is stored while the first still waits for a worker.
    let mut s = Script::default();
    let first = s.ok(0, 0, unique("a"), Outcome::Enqueued);
    let second = s.ok(0, 1, unique("b"), Outcome::Enqueued);
    let end = ends(&[("a", 0, Ready), ("b", 0, Ready)]);
    let anomaly = only(
        &check(&s.history(), &end),
        AnomalyKind::DuplicateUniqueKey,
        &[first, second],
    );
    assert_eq!(anomaly.task, "b");

    // The first finishes, but its submission is invoked only after the
    // second was stored.
    let mut s = Script::default();
    let first = s.ok(0, 0, unique("a"), Outcome::Enqueued);
    s.grant(1, 1, "a", 1, 1, 60);
    let second = s.ok(0, 2, unique("b"), Outcome::Enqueued);
    let (_, r) = s.accept(1, 3, "a", 1, "k1", "d1");
    let mut end = ends(&[("a", 1, Done), ("b", 0, Ready)]);
    end.tasks.get_mut("a").unwrap().attempts[0].receipts = vec![r];
    only(
        &check(&s.history(), &end),
        AnomalyKind::DuplicateUniqueKey,
        &[first, second],
    );

    // Done first, the key is free again.
    let mut s = Script::default();
    s.ok(0, 0, unique("a"), Outcome::Enqueued);
    s.grant(1, 1, "a", 1, 1, 60);
    let (_, r) = s.accept(1, 2, "a", 1, "k1", "d1");
    s.ok(0, 3, unique("b"), Outcome::Enqueued);
    let mut end = ends(&[("a", 1, Done), ("b", 0, Ready)]);
    end.tasks.get_mut("a").unwrap().attempts[0].receipts = vec![r];
    valid(&check(&s.history(), &end));

    // A submission whose answer was lost may have finished it in time.
    let mut s = Script::default();
    s.ok(0, 0, unique("a"), Outcome::Enqueued);
    s.grant(1, 1, "a", 1, 1, 60);
    s.begin(1, 2, script::submit("a", 1, 1, "k1", "d1"));
    s.ok(0, 3, unique("b"), Outcome::Enqueued);
    let r = script::receipt(1, 1, "k1", "d1", 2);
    let mut end = ends(&[("a", 1, Done), ("b", 0, Ready)]);
    end.tasks.get_mut("a").unwrap().attempts[0].receipts = vec![r];
    valid(&check(&s.history(), &end));

    // Answered as a duplicate: nothing is created, the holder is kept.
    let mut s = Script::default();
    s.ok(0, 0, unique("a"), Outcome::Enqueued);
    s.ok(0, 1, unique("b"), Outcome::Duplicate { of: "a".to_owned() });
    valid(&check(&s.history(), &ends(&[("a", 0, Ready)])));
    // … and a holder missing at the end is lost work.
    let mut s = Script::default();
    let duplicate = s.ok(0, 1, unique("b"), Outcome::Duplicate { of: "a".to_owned() });
    let anomaly = only(
        &check(&s.history(), &FinalState::default()),
        AnomalyKind::LostEnqueue,
        &[duplicate],
    );
    assert_eq!(anomaly.task, "a");
}

#[test]
fn more_leases_than_the_queue_allows() {
    use AttemptState::{Leased, Ready};

    let setup = |limit| {
        let mut s = Script::default();
        let set = s.ok(0, 0, set_limits(Some(limit), None), Outcome::Applied);
        s.ok(0, 0, in_partition("a", "c1"), Outcome::Enqueued);
        s.ok(0, 0, in_partition("b", "c1"), Outcome::Enqueued);
        (s, set)
    };
    let end = ends(&[("a", 1, Leased), ("b", 1, Leased)]);

    let (mut s, set) = setup(1);
    let first = s.grant(1, 1, "a", 1, 1, 60);
    let second = s.grant(2, 10, "b", 1, 1, 60);
    only(
        &check(&s.history(), &end),
        AnomalyKind::OverLimit,
        &[set, first, second],
    );

    // A limit of two holds both.
    let (mut s, _) = setup(2);
    s.grant(1, 1, "a", 1, 1, 60);
    s.grant(2, 10, "b", 1, 1, 60);
    valid(&check(&s.history(), &end));

    // The first lease ended (failed) or lapsed before the second grant.
    let (mut s, _) = setup(1);
    s.grant(1, 1, "a", 1, 1, 60);
    s.ok(1, 5, fail("a", 1, 1, true), Outcome::Failed);
    s.grant(2, 10, "b", 1, 1, 60);
    valid(&check(
        &s.history(),
        &ends(&[("a", 1, Ready), ("b", 1, Leased)]),
    ));
    let (mut s, _) = setup(1);
    s.grant(1, 1, "a", 1, 1, 5);
    s.grant(2, 10, "b", 1, 1, 60);
    valid(&check(&s.history(), &end));

    // A heartbeat acknowledged before the claim kept the first lease; one
    // acknowledged after it (by a clock behind the granting one) did not.
    let extended = |expires_at| Outcome::Extended { expires_at };
    let (mut s, set) = setup(1);
    let first = s.grant(1, 1, "a", 1, 1, 5);
    s.ok(1, 4, heartbeat("a", 1, 1), extended(at(64)));
    let second = s.grant(2, 10, "b", 1, 1, 60);
    only(
        &check(&s.history(), &end),
        AnomalyKind::OverLimit,
        &[set, first, second],
    );
    let (mut s, _) = setup(1);
    s.grant(1, 1, "a", 1, 1, 5);
    s.grant(2, 10, "b", 1, 1, 60);
    s.ok(1, 5, heartbeat("a", 1, 1), extended(at(65)));
    valid(&check(&s.history(), &end));

    // A change of the limits whose answer was lost, invoked before the
    // second grant completed, may have lifted the limit.
    let (mut s, _) = setup(1);
    s.grant(1, 1, "a", 1, 1, 60);
    s.run(0, 5, set_limits(None, None), unknown());
    s.grant(2, 10, "b", 1, 1, 60);
    valid(&check(&s.history(), &end));

    // A limit set while the claim ran is not known to apply to it.
    let mut s = Script::default();
    s.ok(0, 0, in_partition("a", "c1"), Outcome::Enqueued);
    s.ok(0, 0, in_partition("b", "c1"), Outcome::Enqueued);
    s.grant(1, 1, "a", 1, 1, 60);
    let racing = s.begin(2, 10, claim());
    s.ok(0, 10, set_limits(Some(1), None), Outcome::Applied);
    s.end(
        racing,
        10,
        tessera_check::Completion::Ok {
            outcome: Outcome::Granted {
                task: "b".to_owned(),
                attempt: 1,
                token: 1,
                granted_at: at(10),
                expires_at: at(70),
            },
        },
    );
    valid(&check(&s.history(), &end));

    // The claim read its store time when it began and counted the leases
    // later (a stalled network): the first lease, extended past that time,
    // was taken over under a newer token meanwhile, so it was not held
    // when the claim counted. With no take-over, it was.
    let taken_over = |take_over: bool| {
        let (mut s, set) = setup(1);
        let first = s.grant(1, 1, "a", 1, 1, 5);
        s.ok(1, 4, heartbeat("a", 1, 1), extended(at(11)));
        let racing = s.begin(2, 10, claim());
        if take_over {
            s.grant(3, 12, "a", 1, 2, 60);
        }
        s.end(
            racing,
            13,
            tessera_check::Completion::Ok {
                outcome: Outcome::Granted {
                    task: "b".to_owned(),
                    attempt: 1,
                    token: 1,
                    granted_at: at(10),
                    expires_at: at(70),
                },
            },
        );
        let last = if take_over { 2 } else { 1 };
        let end = ends(&[("a", last, Leased), ("b", 1, Leased)]);
        (check(&s.history(), &end), [set, first, racing])
    };
    valid(&taken_over(true).0);
    let (report, operations) = taken_over(false);
    only(&report, AnomalyKind::OverLimit, &operations);
}

#[test]
fn more_leases_than_a_partition_allows() {
    use AttemptState::Leased;

    let run = |second_partition| {
        let mut s = Script::default();
        let set = s.ok(0, 0, set_limits(None, Some(1)), Outcome::Applied);
        s.ok(0, 0, in_partition("a", "c1"), Outcome::Enqueued);
        s.ok(0, 0, in_partition("b", second_partition), Outcome::Enqueued);
        let first = s.grant(1, 1, "a", 1, 1, 60);
        let second = s.grant(2, 10, "b", 1, 1, 60);
        let end = ends(&[("a", 1, Leased), ("b", 1, Leased)]);
        (check(&s.history(), &end), [set, first, second])
    };
    let (report, operations) = run("c1");
    only(&report, AnomalyKind::OverLimit, &operations);
    let (report, _) = run("c2");
    valid(&report);
}

#[test]
fn a_grant_on_a_paused_queue() {
    let end = ends(&[(T, 1, AttemptState::Leased)]);

    let mut s = Script::default();
    s.enqueue(T);
    let paused = s.ok(0, 1, pause_queue(), Outcome::Applied);
    let granted = s.grant(1, 2, T, 1, 1, 60);
    // A resume invoked after the grant changes nothing.
    s.run(0, 3, resume_queue(), unknown());
    only(
        &check(&s.history(), &end),
        AnomalyKind::GrantWhilePaused,
        &[paused, granted],
    );

    // Resumed first, or by a resume whose answer was lost in time.
    for resumed in [
        tessera_check::Completion::Ok {
            outcome: Outcome::Applied,
        },
        unknown(),
    ] {
        let mut s = Script::default();
        s.enqueue(T);
        s.ok(0, 1, pause_queue(), Outcome::Applied);
        s.run(0, 2, resume_queue(), resumed);
        s.grant(1, 3, T, 1, 1, 60);
        valid(&check(&s.history(), &end));
    }

    // A claim invoked before the pause completed may have been first.
    let mut s = Script::default();
    s.enqueue(T);
    let racing = s.begin(1, 1, claim());
    s.ok(0, 1, pause_queue(), Outcome::Applied);
    s.end(
        racing,
        1,
        tessera_check::Completion::Ok {
            outcome: Outcome::Granted {
                task: T.to_owned(),
                attempt: 1,
                token: 1,
                granted_at: at(1),
                expires_at: at(61),
            },
        },
    );
    valid(&check(&s.history(), &end));

    // A refused pause paused nothing.
    let mut s = Script::default();
    s.enqueue(T);
    s.run(0, 1, pause_queue(), refused("forbidden"));
    s.grant(1, 2, T, 1, 1, 60);
    valid(&check(&s.history(), &end));
}

#[test]
fn a_grant_after_the_deadline() {
    let end = ends(&[(T, 1, AttemptState::Leased)]);
    let by_half_past = enqueue_with(
        T,
        Enqueued {
            deadline: Some(at(30)),
            ..Enqueued::default()
        },
    );

    let mut s = Script::default();
    let enqueued = s.ok(0, 0, by_half_past.clone(), Outcome::Enqueued);
    let granted = s.grant(1, 40, T, 1, 1, 60);
    only(
        &check(&s.history(), &end),
        AnomalyKind::GrantAfterDeadline,
        &[enqueued, granted],
    );
    // Within the clock skew allowed, it is not.
    let options = CheckOptions {
        clock_skew: TimeDelta::seconds(10),
    };
    valid(&check_with(&s.history(), &end, &options));

    let mut s = Script::default();
    s.ok(0, 0, by_half_past, Outcome::Enqueued);
    s.grant(1, 20, T, 1, 1, 60);
    valid(&check(&s.history(), &end));
}

#[test]
fn a_snooze_ends_its_lease() {
    let end = ends(&[(T, 2, AttemptState::Leased)]);
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    s.ok(1, 5, snooze(T, 1, 1), Outcome::Snoozed { until: at(8) });
    s.grant(2, 10, T, 1, 2, 60);
    valid(&check(&s.history(), &end));

    // Refused, it ended nothing.
    let mut s = Script::default();
    s.enqueue(T);
    let first = s.grant(1, 0, T, 1, 1, 60);
    s.run(1, 5, snooze(T, 1, 1), refused("lease_ended"));
    let second = s.grant(2, 10, T, 1, 2, 60);
    only(
        &check(&s.history(), &end),
        AnomalyKind::OverlappingLeases,
        &[first, second],
    );

    // Acknowledged after a cancel, it ran after the cancel.
    let mut s = Script::default();
    s.enqueue(T);
    s.grant(1, 0, T, 1, 1, 60);
    let cancelled = s.ok(0, 1, cancel(T), Outcome::Cancelled);
    let snoozed = s.ok(1, 2, snooze(T, 1, 1), Outcome::Snoozed { until: at(8) });
    only(
        &check(&s.history(), &ends(&[(T, 1, AttemptState::Cancelled)])),
        AnomalyKind::RanAfterCancel,
        &[cancelled, snoozed],
    );
}

#[test]
fn a_snooze_spends_no_try() {
    // Granted twice, snoozed once: one try at the end.
    let with_tries = |tries: u32| {
        let mut end = ends(&[(T, 2, AttemptState::Leased)]);
        end.tasks.get_mut(T).unwrap().attempts[0].tries = Some(tries);
        end
    };
    let script = |answer: Option<Outcome>| {
        let mut s = Script::default();
        s.enqueue(T);
        s.grant(1, 0, T, 1, 1, 60);
        let snoozed = match answer {
            Some(outcome) => s.ok(1, 5, snooze(T, 1, 1), outcome),
            None => s.run(1, 5, snooze(T, 1, 1), unknown()),
        };
        s.grant(2, 10, T, 1, 2, 60);
        (s, snoozed)
    };
    let snoozed = Some(Outcome::Snoozed { until: at(5) });
    let (s, _) = script(snoozed.clone());
    valid(&check(&s.history(), &with_tries(1)));
    // The snooze spent its try: two tries after two grants and a snooze.
    let (s, id) = script(snoozed);
    only(
        &check(&s.history(), &with_tries(2)),
        AnomalyKind::TriesMiscounted,
        &[id],
    );
    // A snooze whose answer was lost may or may not have given it back.
    let (s, _) = script(None);
    valid(&check(&s.history(), &with_tries(1)));
    valid(&check(&s.history(), &with_tries(2)));
    let (s, id) = script(None);
    only(
        &check(&s.history(), &with_tries(3)),
        AnomalyKind::TriesMiscounted,
        &[id],
    );
}

/// The end of a run with schedule [`SCHEDULE`]: a fire row and a ready
/// task for each of `rows`, and the run-ats `due`.
fn schedule_end(rows: &[DateTime<Utc>], due: &[DateTime<Utc>]) -> FinalState {
    let tasks: Vec<String> = rows.iter().map(|at| fire_task(SCHEDULE, *at)).collect();
    let listed: Vec<(&str, i64, AttemptState)> = tasks
        .iter()
        .map(|task| (task.as_str(), 0, AttemptState::Ready))
        .collect();
    let mut end = ends(&listed);
    let fires = rows
        .iter()
        .zip(tasks)
        .map(|(run_at, task)| FinalFire {
            run_at: *run_at,
            task,
        })
        .collect();
    end.schedules.insert(
        SCHEDULE.to_owned(),
        FinalSchedule {
            fires,
            due: due.to_vec(),
        },
    );
    end
}

#[test]
fn a_run_at_fired_twice() {
    let run_at = at(60);
    let mut s = Script::default();
    let one = s.ok(
        1,
        61,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, run_at)]),
    );
    let two = s.ok(
        2,
        62,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, run_at)]),
    );
    let end = schedule_end(&[run_at], &[run_at]);
    let anomaly = only(
        &check(&s.history(), &end),
        AnomalyKind::DoubledFire,
        &[one, two],
    );
    assert_eq!(anomaly.task, fire_task(SCHEDULE, run_at));

    // Two fire rows for one run-at.
    let mut s = Script::default();
    let one = s.ok(
        1,
        61,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, run_at)]),
    );
    let mut end = schedule_end(&[run_at], &[run_at]);
    let schedule = end.schedules.get_mut(SCHEDULE).unwrap();
    schedule.fires.push(schedule.fires[0].clone());
    only(&check(&s.history(), &end), AnomalyKind::DoubledFire, &[one]);

    // Once is right, and its task needs no enqueue to explain it.
    let end = schedule_end(&[run_at], &[run_at]);
    valid(&check(&s.history(), &end));
}

#[test]
fn a_fire_whose_row_or_task_is_lost() {
    let run_at = at(60);
    let mut s = Script::default();
    let pass = s.ok(
        1,
        61,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, run_at)]),
    );

    let mut end = schedule_end(&[run_at], &[]);
    end.tasks.clear();
    let anomaly = only(
        &check(&s.history(), &end),
        AnomalyKind::LostEnqueue,
        &[pass],
    );
    assert_eq!(anomaly.task, fire_task(SCHEDULE, run_at));

    let mut end = schedule_end(&[run_at], &[]);
    end.schedules.get_mut(SCHEDULE).unwrap().fires.clear();
    only(&check(&s.history(), &end), AnomalyKind::LostFire, &[pass]);

    // Retention keeps the latest fire row alone: an earlier run-at's row
    // may be gone, its task there, whether its fire was acknowledged or
    // its answer lost; a due run-at so fired was fired.
    let later = at(120);
    let mut s = Script::default();
    s.ok(
        1,
        61,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, run_at)]),
    );
    s.ok(
        1,
        121,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, later)]),
    );
    let mut end = schedule_end(&[run_at, later], &[run_at, later]);
    end.schedules
        .get_mut(SCHEDULE)
        .unwrap()
        .fires
        .retain(|row| row.run_at == later);
    valid(&check(&s.history(), &end));
    let mut s = Script::default();
    s.run(1, 61, Operation::FireSchedules, unknown());
    s.ok(
        1,
        121,
        Operation::FireSchedules,
        fired(&[(SCHEDULE, later)]),
    );
    valid(&check(&s.history(), &end));
}

#[test]
fn a_due_run_at_never_fired() {
    let (missed, next) = (at(60), at(120));
    let end = schedule_end(&[next], &[missed, next]);

    // No pause anywhere near it.
    let mut s = Script::default();
    s.ok(0, 10, pause_schedule(SCHEDULE), Outcome::Applied);
    s.ok(0, 20, resume_schedule(SCHEDULE), Outcome::Applied);
    // A pause whose answer was lost, invoked after the next run-at, may
    // hold from then on only.
    s.run(0, 130, pause_schedule(SCHEDULE), unknown());
    let anomaly = only(&check(&s.history(), &end), AnomalyKind::LostFire, &[]);
    assert!(anomaly.task.contains(SCHEDULE), "{anomaly}");

    // Paused across it.
    let mut s = Script::default();
    s.ok(0, 50, pause_schedule(SCHEDULE), Outcome::Applied);
    s.ok(0, 65, resume_schedule(SCHEDULE), Outcome::Applied);
    valid(&check(&s.history(), &end));

    // A pause whose answer was lost, invoked before the next run-at.
    let mut s = Script::default();
    s.run(0, 100, pause_schedule(SCHEDULE), unknown());
    valid(&check(&s.history(), &end));

    // Resumed just before it, but only by the resuming clock: within the
    // skew the resume may have landed after it.
    let mut s = Script::default();
    s.ok(0, 50, pause_schedule(SCHEDULE), Outcome::Applied);
    s.ok(0, 58, resume_schedule(SCHEDULE), Outcome::Applied);
    only(&check(&s.history(), &end), AnomalyKind::LostFire, &[]);
    let options = CheckOptions {
        clock_skew: TimeDelta::seconds(5),
    };
    valid(&check_with(&s.history(), &end, &options));
}
