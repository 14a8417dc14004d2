//! Periodic schedules: each run-at fires once, however many schedulers
//! run; missed run-ats after downtime fire once; pause, resume, replace
//! and delete; bad input is a typed error.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_store::lease::fire_task_id;
use tessera_store::{
    Brief, Caller, ClaimOutcome, Error, Fired, Grant, ManualClock, ScheduleName, ScheduleSpec,
    Scope, StoreConfig, TaskQuery, TaskSpec,
};

use crate::harness::{BackendKind, Fixture, TestDb, namespace, noon, queue};

fn name(text: &str) -> ScheduleName {
    ScheduleName::parse(text).unwrap()
}

fn every_five() -> ScheduleSpec {
    ScheduleSpec::new(
        queue("reports"),
        "*/5 * * * *",
        "UTC",
        Brief::Json(serde_json::json!({ "report": "sales" })),
    )
}

fn minutes(n: i64) -> TimeDelta {
    TimeDelta::minutes(n)
}

/// The ids of the tasks a claim of `ns/reports` hands out, until empty.
fn drain(f: &Fixture<'_>, caller: &Caller) -> Vec<String> {
    let mut ids = Vec::new();
    while let ClaimOutcome::Granted(claimed) = f
        .store
        .claim(caller, &namespace("ops"), &queue("reports"))
        .unwrap()
    {
        ids.push(claimed.task.id.as_str().to_owned());
    }
    ids
}

fn run_ats(fired: &[Fired]) -> Vec<DateTime<Utc>> {
    fired.iter().map(|fire| fire.run_at).collect()
}

fn a_schedule_fires_each_run_at_once_and_catches_up_once(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let (view, created) = f
        .store
        .put_schedule(&worker, &ns, &name("sales"), &every_five())
        .unwrap();
    assert!(created);
    assert_eq!(view.next_run_at, Some(noon() + minutes(5)));
    assert_eq!(view.last_run_at, None);
    // Noon itself is when it was put: nothing fires for it.
    assert!(f.store.fire_due_schedules().unwrap().is_empty());

    f.clock.set_utc(noon() + minutes(5));
    let fired = f.store.fire_due_schedules().unwrap();
    assert_eq!(run_ats(&fired), [noon() + minutes(5)]);
    let fire = &fired[0];
    assert!(fire.created);
    assert_eq!(
        fire.task.id,
        fire_task_id(&name("sales"), noon() + minutes(5))
    );
    // A second pass at the same time finds it fired.
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
    let task = f.store.read_task(&worker, &fire.task).unwrap();
    assert_eq!(task.queue, queue("reports"));
    assert_eq!(task.brief, every_five().brief);

    // Down for an hour: twelve run-ats passed, the latest fires once.
    f.clock.set_utc(noon() + minutes(67));
    let fired = f.store.fire_due_schedules().unwrap();
    assert_eq!(run_ats(&fired), [noon() + minutes(65)]);
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
    let view = f.store.read_schedule(&worker, &ns, &name("sales")).unwrap();
    assert_eq!(view.last_run_at, Some(noon() + minutes(65)));
    assert_eq!(view.next_run_at, Some(noon() + minutes(70)));
    assert_eq!(
        f.store.next_schedule_fire().unwrap(),
        Some(noon() + minutes(70))
    );

    let claimed = drain(&f, &worker);
    assert_eq!(
        claimed,
        [
            fire_task_id(&name("sales"), noon() + minutes(5)).to_string(),
            fire_task_id(&name("sales"), noon() + minutes(65)).to_string(),
        ]
    );
    // Two fire rows, or the latest alone once retention has run (it keeps
    // each schedule's latest fire row only).
    assert!((1..=2).contains(&db.count_rows("schedule_fires")));
}

fn a_paused_schedule_fires_nothing_and_resumes_from_now(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.store
        .put_schedule(&worker, &ns, &name("sales"), &every_five())
        .unwrap();
    let view = f
        .store
        .pause_schedule(&worker, &ns, &name("sales"))
        .unwrap();
    assert!(view.paused);
    assert_eq!(view.next_run_at, None);
    f.clock.set_utc(noon() + minutes(30));
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
    assert_eq!(f.store.next_schedule_fire().unwrap(), None);

    // Resumed at 12:32: 12:30 passed while paused and never fires.
    f.clock.set_utc(noon() + minutes(32));
    let view = f
        .store
        .resume_schedule(&worker, &ns, &name("sales"))
        .unwrap();
    assert!(!view.paused);
    assert_eq!(view.active_since, noon() + minutes(32));
    assert_eq!(view.next_run_at, Some(noon() + minutes(35)));
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
    f.clock.set_utc(noon() + minutes(35));
    assert_eq!(
        run_ats(&f.store.fire_due_schedules().unwrap()),
        [noon() + minutes(35)]
    );
    // A pause survives reopening the store.
    f.store
        .pause_schedule(&worker, &ns, &name("sales"))
        .unwrap();
    let store = db.open(f.config());
    f.clock.set_utc(noon() + minutes(50));
    assert!(store.fire_due_schedules().unwrap().is_empty());
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
    assert_eq!(drain(&f, &worker).len(), 1);
}

fn an_invalid_cron_zone_or_spec_is_a_typed_error(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let bad = |spec: ScheduleSpec| {
        let error = f
            .store
            .put_schedule(&worker, &ns, &name("bad"), &spec)
            .unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
        assert_eq!(error.status(), 400);
        assert_eq!(error.code(), "invalid_input");
        error
    };
    let error = bad(ScheduleSpec::new(
        queue("q"),
        "61 * * * *",
        "UTC",
        Brief::Bytes(vec![1]),
    ));
    assert!(error.to_string().contains("cron"), "{error}");
    let error = bad(ScheduleSpec::new(
        queue("q"),
        "* * * * *",
        "Mars/Olympus",
        Brief::Bytes(vec![1]),
    ));
    assert!(error.to_string().contains("zone"), "{error}");
    // The thirtieth of February never comes.
    let error = bad(ScheduleSpec::new(
        queue("q"),
        "0 0 0 30 2 *",
        "UTC",
        Brief::Bytes(vec![1]),
    ));
    assert!(error.to_string().contains("never fires"), "{error}");
    bad(ScheduleSpec::new(
        queue("q"),
        "",
        "UTC",
        Brief::Bytes(vec![1]),
    ));
    bad(every_five().with_spec(TaskSpec {
        not_before: Some(noon()),
        ..TaskSpec::default()
    }));
    bad(every_five().with_spec(TaskSpec {
        alternatives: 0,
        ..TaskSpec::default()
    }));
    // Nothing was written.
    let error = f
        .store
        .read_schedule(&worker, &ns, &name("bad"))
        .unwrap_err();
    assert_eq!(error.status(), 404);
    assert!(
        f.store
            .list_schedules(&worker, &ns, None, 10)
            .unwrap()
            .schedules
            .is_empty()
    );
    // A key without the enqueue scope, or without the grant, is refused.
    let reader = f.login(&f.key(&[Scope::Read], Grant::Namespace(ns.clone())));
    let error = f
        .store
        .put_schedule(&reader, &ns, &name("sales"), &every_five())
        .unwrap_err();
    assert_eq!(error.status(), 403);
    let error = f
        .store
        .put_schedule(
            &worker,
            &namespace("elsewhere"),
            &name("sales"),
            &every_five(),
        )
        .unwrap_err();
    assert_eq!(error.status(), 403);
}

fn a_replaced_schedule_keeps_its_creation_and_fires_the_new_template(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.store
        .put_schedule(&worker, &ns, &name("sales"), &every_five())
        .unwrap();
    f.clock.set_utc(noon() + minutes(7));
    let hourly = ScheduleSpec::new(
        queue("reports"),
        "0 * * * *",
        "Europe/Stockholm",
        Brief::Json(serde_json::json!({ "report": "hourly" })),
    )
    .with_spec(TaskSpec {
        priority: 2,
        max_tries: 3,
        ..TaskSpec::default()
    });
    let (view, created) = f
        .store
        .put_schedule(&worker, &ns, &name("sales"), &hourly)
        .unwrap();
    assert!(!created);
    assert_eq!(view.created_at, noon());
    assert_eq!(view.updated_at, noon() + minutes(7));
    assert_eq!(view.schedule, hourly.schedule);
    assert_eq!(view.spec, hourly.spec);
    // 12:05 of the old expression passed before the replace: never fired.
    f.clock.set_utc(noon() + minutes(59));
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
    f.clock.set_utc(noon() + minutes(61));
    let fired = f.store.fire_due_schedules().unwrap();
    assert_eq!(run_ats(&fired), [noon() + minutes(60)]);
    let task = f.store.read_task(&worker, &fired[0].task).unwrap();
    assert_eq!(task.brief, hourly.brief);
    assert_eq!(task.record.priority, 2);
    assert_eq!(task.record.max_tries, 3);

    // Listed in name order, a page at a time.
    for other in ["a-first", "z-last"] {
        f.store
            .put_schedule(&worker, &ns, &name(other), &every_five())
            .unwrap();
    }
    let page = f.store.list_schedules(&worker, &ns, None, 2).unwrap();
    let names: Vec<_> = page.schedules.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["a-first", "sales"]);
    assert_eq!(page.next, Some(name("sales")));
    let page = f
        .store
        .list_schedules(&worker, &ns, page.next.as_ref(), 2)
        .unwrap();
    assert_eq!(page.schedules.len(), 1);
    assert_eq!(page.next, None);

    // Deleted, with its fires: the name can be put again from scratch.
    f.store
        .delete_schedule(&worker, &ns, &name("sales"))
        .unwrap();
    assert_eq!(
        f.store
            .delete_schedule(&worker, &ns, &name("sales"))
            .unwrap_err()
            .status(),
        404
    );
    assert_eq!(
        f.store
            .read_schedule(&worker, &ns, &name("sales"))
            .unwrap_err()
            .status(),
        404
    );
    // Its task stays.
    assert_eq!(
        f.store.read_task(&worker, &fired[0].task).unwrap().brief,
        hourly.brief
    );
}

fn two_stores_fire_each_run_at_once(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let every_minute =
        ScheduleSpec::new(queue("reports"), "* * * * *", "UTC", Brief::Bytes(vec![]));
    f.store
        .put_schedule(&worker, &ns, &name("tick"), &every_minute)
        .unwrap();
    let other = db.open(f.config());
    let mut fired = Vec::new();
    for minute in 1..=20 {
        f.clock.set_utc(noon() + minutes(minute));
        let (first, second) = std::thread::scope(|scope| {
            let a = scope.spawn(|| f.store.fire_due_schedules().unwrap());
            let b = scope.spawn(|| other.fire_due_schedules().unwrap());
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(first.len() + second.len(), 1, "minute {minute}");
        fired.extend(first.into_iter().chain(second));
    }
    assert_eq!(
        run_ats(&fired),
        (1..=20).map(|m| noon() + minutes(m)).collect::<Vec<_>>()
    );
    assert_eq!(drain(&f, &worker).len(), 20);
}

fn the_scheduler_thread_fires_by_the_store_clock(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.store
        .put_schedule(&worker, &ns, &name("sales"), &every_five())
        .unwrap();
    let store = Arc::new(db.open(f.config()));
    let scheduler = store.run_scheduler(Duration::from_millis(20));
    f.clock.set_utc(noon() + minutes(5));
    let task = fire_task_id(&name("sales"), noon() + minutes(5));
    // Waits for the thread's pass, however long it takes.
    let mut seen = false;
    for _ in 0..6000 {
        let page = f
            .store
            .list_tasks(
                &worker,
                &ns,
                &TaskQuery::new(tessera_store::lease::StateName::Ready),
            )
            .unwrap();
        if page.tasks.iter().any(|listing| listing.task.id == task) {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    scheduler.stop();
    assert!(seen, "the scheduler fired 12:05");
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
}

const ENV_DB: &str = "TESSERA_SCHEDULER_DB";
const ENV_BACKEND: &str = "TESSERA_SCHEDULER_BACKEND";
const ENV_STEPS: &str = "TESSERA_SCHEDULER_STEPS";
const MARK: &str = "@tessera-fired ";

/// Run-ats the multi-process test walks through, one a minute.
const RUN_ATS: i64 = 200;

/// The body of a scheduler child: its own store and clock, stepped a
/// minute at a time through every run-at, a pass at each. Does nothing
/// unless run as one.
pub(crate) fn scheduler_child() {
    let Ok(locator) = std::env::var(ENV_DB) else {
        return;
    };
    let kind = BackendKind::from_name(&std::env::var(ENV_BACKEND).unwrap());
    let steps: i64 = std::env::var(ENV_STEPS).unwrap().parse().unwrap();
    let db = TestDb::attach(kind, &locator);
    let clock = ManualClock::new(noon());
    let store = db.open_shared(StoreConfig::default().with_clock(Arc::new(clock.clone())));
    for minute in 1..=steps {
        clock.set_utc(noon() + minutes(minute));
        for fire in store.fire_due_schedules().unwrap() {
            println!("{MARK}{} {}", fire.run_at.timestamp_millis(), fire.task.id);
        }
    }
}

fn four_processes_fire_every_run_at_exactly_once(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let every_minute =
        ScheduleSpec::new(queue("reports"), "* * * * *", "UTC", Brief::Bytes(vec![]));
    f.store
        .put_schedule(&worker, &ns, &name("tick"), &every_minute)
        .unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_process_entry",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ENV_BACKEND, db.kind().name())
                .env(ENV_DB, db.locator())
                .env(ENV_STEPS, RUN_ATS.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    // run-at -> (process, task) of every fire any process reported.
    let mut fires: BTreeMap<i64, Vec<(usize, String)>> = BTreeMap::new();
    for (process, mut child) in children.into_iter().enumerate() {
        let stdout = BufReader::new(child.stdout.take().unwrap());
        for line in stdout.lines() {
            let line = line.unwrap();
            if let Some(start) = line.find(MARK) {
                let (run_at, task) = line[start + MARK.len()..].split_once(' ').unwrap();
                fires
                    .entry(run_at.parse().unwrap())
                    .or_default()
                    .push((process, task.to_owned()));
            }
        }
        assert!(
            child.wait().unwrap().success(),
            "a scheduler process failed"
        );
    }
    let expected: Vec<i64> = (1..=RUN_ATS)
        .map(|m| (noon() + minutes(m)).timestamp_millis())
        .collect();
    assert_eq!(fires.keys().copied().collect::<Vec<_>>(), expected);
    for (run_at, fired) in &fires {
        assert_eq!(fired.len(), 1, "run-at {run_at} fired by {fired:?}");
    }
    // Each fire enqueued its task, once.
    let claimed = drain(&f, &worker);
    assert_eq!(claimed.len(), expected.len());
    let mut expected_ids: Vec<String> = expected
        .iter()
        .map(|ms| {
            fire_task_id(&name("tick"), DateTime::from_timestamp_millis(*ms).unwrap()).to_string()
        })
        .collect();
    let mut claimed_sorted = claimed.clone();
    claimed_sorted.sort();
    expected_ids.sort();
    assert_eq!(claimed_sorted, expected_ids);
    let view = f.store.read_schedule(&worker, &ns, &name("tick")).unwrap();
    assert_eq!(view.last_run_at, Some(noon() + minutes(RUN_ATS)));
    // A row per fire, less those retention trimmed (it keeps each
    // schedule's latest fire row only).
    assert!((1..=RUN_ATS as u64).contains(&db.count_rows("schedule_fires")));
}

/// A seconds field: `*/10 * * * * *` with a pass every 3 ms for 10 s
/// fires once, and `* * * * * *` once a second; never a run-at twice, nor
/// one a pass's own instant.
fn a_seconds_field_fires_once_per_run_at(db: &TestDb) {
    let f = Fixture::new(db);
    let ns = namespace("cr");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    f.clock.advance(Duration::from_millis(250));
    for (name_text, cron) in [("ten", "*/10 * * * * *"), ("each", "* * * * * *")] {
        let spec = ScheduleSpec::new(queue(name_text), cron, "UTC", Brief::Bytes(vec![1]));
        f.store
            .put_schedule(&worker, &ns, &name(name_text), &spec)
            .unwrap();
    }
    let mut fired: Vec<Fired> = Vec::new();
    for _ in 0..3_334 {
        f.clock.advance(Duration::from_millis(3));
        fired.extend(f.store.fire_due_schedules().unwrap());
    }
    let of = |schedule: &str| -> Vec<DateTime<Utc>> {
        fired
            .iter()
            .filter(|fire| fire.schedule.as_str() == schedule)
            .map(|fire| fire.run_at)
            .collect()
    };
    assert_eq!(of("ten"), vec![noon() + TimeDelta::seconds(10)]);
    let each = of("each");
    assert_eq!(each.len(), 10, "{each:?}");
    assert!(
        each.iter()
            .all(|run_at| run_at.timestamp_subsec_nanos() == 0)
    );
    assert!(
        each.windows(2)
            .all(|pair| pair[1] - pair[0] == TimeDelta::seconds(1))
    );
}

/// Retention keeps a schedule's latest fire row alone, and purges its
/// finished tasks: each run-at still fires once.
fn retention_keeps_the_latest_fire_and_each_run_at_fires_once(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config.with_retention(tessera_store::Retention {
            done: Some(Duration::from_secs(60)),
            ..tessera_store::Retention::default()
        })
    });
    let ns = namespace("ops");
    let worker = f.login(&f.full_worker(Grant::Namespace(ns.clone())));
    let every_minute = ScheduleSpec::new(queue("ticks"), "* * * * *", "UTC", Brief::Bytes(vec![]));
    f.store
        .put_schedule(&worker, &ns, &name("tick"), &every_minute)
        .unwrap();
    let mut fired = Vec::new();
    for _ in 0..12 {
        f.clock.advance(Duration::from_secs(60));
        for fire in f.store.fire_due_schedules().unwrap() {
            fired.push(fire.run_at);
            // Each fired task is claimed and done.
            let ClaimOutcome::Granted(claimed) =
                f.store.claim(&worker, &ns, &queue("ticks")).unwrap()
            else {
                panic!("the fired task");
            };
            let _ = f
                .store
                .submit(
                    &worker,
                    &claimed.task,
                    claimed.lease.token(),
                    &tessera_store::IdempotencyKey::parse("done").unwrap(),
                    &tessera_store::Output::bytes("ok"),
                )
                .unwrap();
        }
        // Again at the same time: nothing more.
        assert!(f.store.fire_due_schedules().unwrap().is_empty());
        f.store.maintain().unwrap();
    }
    assert_eq!(fired.len(), 12);
    assert!(
        fired
            .windows(2)
            .all(|pair| pair[1] - pair[0] == TimeDelta::minutes(1))
    );
    // Retention ran along the way, every five minutes: at its next run
    // one fire row is left, and the done tasks are gone.
    f.clock.advance(Duration::from_secs(5 * 60));
    assert!(f.store.maintain().unwrap().retention_ran);
    assert_eq!(db.count_rows("schedule_fires"), 1);
    assert_eq!(db.count_rows("tasks"), 0);
    // The next pass fires the latest run-at once, never an older one.
    let again = f.store.fire_due_schedules().unwrap();
    assert_eq!(again.len(), 1);
    assert!(again[0].run_at > *fired.last().unwrap());
    assert!(f.store.fire_due_schedules().unwrap().is_empty());
}

conformance! {
    a_seconds_field_fires_once_per_run_at,
    retention_keeps_the_latest_fire_and_each_run_at_fires_once,
    a_schedule_fires_each_run_at_once_and_catches_up_once,
    a_paused_schedule_fires_nothing_and_resumes_from_now,
    an_invalid_cron_zone_or_spec_is_a_typed_error,
    a_replaced_schedule_keeps_its_creation_and_fires_the_new_template,
    two_stores_fire_each_run_at_once,
    the_scheduler_thread_fires_by_the_store_clock,
    four_processes_fire_every_run_at_exactly_once,
}
