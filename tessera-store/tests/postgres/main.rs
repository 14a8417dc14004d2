//! What only a PostgreSQL store has: signals between processes, opening
//! one database from several at once, the server's own refusals and
//! faults. The behaviour every backend shares is the conformance suite's.
//! Each test gets a schema of its own on the server
//! `TESSERA_TEST_POSTGRES_URL` names; without it each is marked ignored.
#![cfg(all(feature = "postgres", feature = "sqlite"))]

#[path = "../harness/mod.rs"]
mod harness;
mod transactions;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use tessera_store::{
    Brief, ClaimOutcome, Clock, EnqueueOptions, Grant, ManualClock, Scope, Store, StoreConfig,
    WaitOutcome,
};

use harness::{BackendKind, Fixture, TestDb, assert_quota, midnight, namespace, noon, queue};

const ENV_ROLE: &str = "TESSERA_PG_TEST_ROLE";
const ENV_DB: &str = "TESSERA_PG_TEST_DB";
const ENV_KEY: &str = "TESSERA_PG_TEST_KEY";

/// A fresh database on the test server.
fn database() -> TestDb {
    BackendKind::Postgres.database()
}

/// Starts this binary again as a child playing `role` on `db`.
fn spawn(role: &str, db: &TestDb, key: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_ROLE, role)
        .env(ENV_DB, db.locator())
        .env(ENV_KEY, key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// What the child said next: the rest of its next line with a `>` (the
/// test harness may have started the line with the test's name).
fn next_line(child: &mut BufReader<impl std::io::Read>) -> String {
    loop {
        let mut line = String::new();
        assert!(child.read_line(&mut line).unwrap() > 0, "the child ended");
        if let Some((_, said)) = line.trim_end().split_once('>') {
            return said.to_owned();
        }
    }
}

/// The system's clocks, noting when a blocked call first parks: a
/// long-poll parks once its first read found its queue empty.
#[derive(Debug, Default)]
struct ParkWatch {
    parked: AtomicBool,
}

impl Clock for ParkWatch {
    fn now_utc(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn max_park(&self) -> Option<Duration> {
        self.parked.store(true, Ordering::SeqCst);
        None
    }
}

/// The entry point of the child processes the tests spawn; a no-op when
/// run on its own.
#[test]
#[ignore = "entry point of the child processes the other tests spawn"]
fn child() {
    let Ok(role) = std::env::var(ENV_ROLE) else {
        return;
    };
    let db = TestDb::attach(BackendKind::Postgres, &std::env::var(ENV_DB).unwrap());
    let config = StoreConfig::default();
    match role.as_str() {
        // Long-polls its queue once and says how it ended. `wait-notified`
        // polls only every hour, so a wake within the test is the
        // notification's; `wait-polling` listens to nothing and polls.
        "wait-notified" | "wait-polling" => {
            let polling = role == "wait-polling";
            let clock = Arc::new(ParkWatch::default());
            let store = db
                .open_postgres(
                    |options| {
                        options
                            .with_listen(!polling)
                            .with_poll_interval(if polling {
                                Duration::from_millis(100)
                            } else {
                                Duration::from_secs(3600)
                            })
                    },
                    config.with_clock(Arc::clone(&clock) as Arc<dyn Clock>),
                )
                .unwrap();
            assert_eq!(store.long_poll_interval().is_some(), polling);
            let caller = store
                .authenticate(Some(&std::env::var(ENV_KEY).unwrap()))
                .unwrap();
            let outcome = std::thread::scope(|scope| {
                // Says it waits once its long-poll has had its first read
                // (an empty queue) and parks, before the enqueue that is to
                // wake it.
                scope.spawn(|| {
                    while !clock.parked.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    println!(">waiting");
                });
                store.wait_for_work(
                    &caller,
                    &namespace("farm"),
                    &queue("frames"),
                    Duration::from_secs(120),
                )
            });
            println!(">{:?}", outcome.unwrap());
        }
        // Opens the database, creating its schema if no one has.
        "open" => {
            db.open(config);
            println!(">opened");
        }
        other => panic!("no role {other:?}"),
    }
}

fn wakes(role: &str) {
    let db = database();
    let f = Fixture::new(&db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let key = f.key(
        &[Scope::Enqueue, Scope::Claim],
        Grant::Namespace(ns.clone()),
    );
    let mut child = spawn(role, &db, key.secret.expose());
    let mut said = BufReader::new(child.stdout.take().unwrap());
    assert_eq!(next_line(&mut said), "waiting");
    // The child read its queue (empty) before it said so, and waits now.
    let worker = f.login(&key);
    f.store
        .enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(vec![1]),
            &EnqueueOptions::default(),
        )
        .unwrap();
    assert_eq!(
        next_line(&mut said),
        format!("{:?}", WaitOutcome::WorkAvailable)
    );
    assert!(child.wait().unwrap().success());
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn an_enqueue_in_one_process_wakes_another_process_long_poll_through_notify() {
    // The waiting process would poll only after an hour: its wake is the
    // notification the enqueue's transaction sent.
    wakes("wait-notified");
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn without_its_listener_a_long_poll_polls_and_still_wakes() {
    // As behind a pooler in transaction mode, which cannot hold a LISTEN.
    wakes("wait-polling");
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn a_cut_listener_is_said_polled_around_and_comes_back() {
    let db = database();
    let store = db.open(StoreConfig::default());
    assert_eq!(store.long_poll_interval(), None, "listening");
    let (_, schema) = db.postgres_place();
    db.postgres_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'tessera-listen tessera_{schema}'"
    ));
    // The listener reconnects by itself; while it is down, long-polls poll.
    let mut saw_polling = false;
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        match store.long_poll_interval() {
            Some(_) => saw_polling = true,
            None if saw_polling => break,
            None => {}
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(saw_polling, "the cut was never said");
    assert_eq!(store.long_poll_interval(), None, "listening again");
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn a_newer_schema_is_refused_and_left_untouched() {
    let db = database();
    drop(db.open(StoreConfig::default()));
    db.postgres_execute("UPDATE tessera_meta SET value = '99' WHERE key = 'schema_version'");
    db.postgres_execute("DROP INDEX attempts_receipt_key");
    let before = db.table_snapshot();
    let indexes = "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema()";
    let index_count = db.postgres_number(indexes);
    let error = db.open_result(StoreConfig::default()).unwrap_err();
    assert_eq!(error.code(), "schema_too_new", "{error:?}");
    assert!(error.to_string().contains("99"), "{error}");
    // Not even the missing index was made.
    assert_eq!(db.table_snapshot(), before);
    assert_eq!(db.postgres_number(indexes), index_count);
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn retired_indexes_are_dropped_on_open_but_not_while_writes_are_refused() {
    let db = database();
    drop(db.open(StoreConfig::default()));
    let retired = "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() \
         AND indexname IN ('access_audit_at', 'attempts_lapsing', 'attempts_by_state')";
    assert_eq!(db.postgres_number(retired), 0, "a new schema has none");
    // As an earlier build leaves them.
    db.postgres_execute("CREATE INDEX access_audit_at ON access_audit (at)");
    db.postgres_execute(
        "CREATE INDEX attempts_lapsing ON attempts \
         (namespace, queue, priority, lapses_at, expires_at, task) WHERE state = 'leased'",
    );
    db.postgres_execute(
        "CREATE INDEX attempts_by_state ON attempts (namespace, state, task, number)",
    );
    // Writes refused: the schema opens as it is, with nothing written.
    let before = db.table_snapshot();
    drop(db.open(StoreConfig::default().with_refuse_writes(true)));
    assert_eq!(db.table_snapshot(), before);
    assert_eq!(db.postgres_number(retired), 3);
    // Writes allowed: the open drops them.
    drop(db.open(StoreConfig::default()));
    assert_eq!(db.postgres_number(retired), 0);
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn two_processes_opening_a_new_database_at_once_both_succeed_and_create_it_once() {
    let db = database();
    for _ in 0..3 {
        let db = db.fresh();
        let mut children: Vec<Child> = (0..2).map(|_| spawn("open", &db, "")).collect();
        for child in &mut children {
            let mut said = BufReader::new(child.stdout.take().unwrap());
            assert_eq!(next_line(&mut said), "opened");
            // Read to its end, so the child never writes to a closed pipe.
            std::io::copy(&mut said, &mut std::io::sink()).unwrap();
            assert!(child.wait().unwrap().success(), "both opened");
        }
        // One schema, made once: every table and index, one version row.
        assert_eq!(db.postgres_number("SELECT count(*) FROM tessera_meta"), 1);
        let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()";
        assert_eq!(db.postgres_number(tables), 15);
        // And opening it again runs no DDL: it writes nothing.
        let before = db.table_snapshot();
        drop(db.open(StoreConfig::default()));
        assert_eq!(db.table_snapshot(), before);
    }
}

/// A quota refusal at noon: it resets at midnight, twelve hours on.
fn assert_refused_at_noon(error: &tessera_store::Error) {
    assert_quota(error, midnight());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(12 * 3600)));
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn a_full_disk_is_503_until_midnight_and_reads_answer() {
    let db = database();
    let f = Fixture::new(&db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let key = f.key(&[Scope::Enqueue, Scope::Read], Grant::Namespace(ns.clone()));
    let worker = f.login(&key);
    f.store
        .enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(vec![1]),
            &EnqueueOptions::default(),
        )
        .unwrap();
    // The server runs out of disk for every new row: SQLSTATE 53100.
    db.postgres_execute(
        "CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'; END $$; \
         CREATE TRIGGER disk_full BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION disk_full(); \
         CREATE TRIGGER disk_full BEFORE INSERT ON access_audit FOR EACH ROW EXECUTE FUNCTION disk_full();",
    );
    let before = db.table_snapshot();
    let error = f
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(vec![2]),
            &EnqueueOptions::default(),
        )
        .unwrap_err();
    assert_refused_at_noon(&error);
    assert_eq!(db.table_snapshot(), before, "nothing of it was written");
    // Reads answer, health included.
    assert_eq!(f.store.health(&worker, &ns).unwrap().attempts.ready, 1);
    assert_eq!(
        f.store
            .list_keys(&f.admin, &Default::default())
            .unwrap()
            .len(),
        2
    );
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn the_daily_allowance_is_503_until_midnight_and_reads_answer() {
    let db = database();
    let f = Fixture::with(&db, |config| config.with_daily_rows_written_allowance(40));
    let (ns, q) = (namespace("farm"), queue("frames"));
    let key = f.key(
        &[Scope::Enqueue, Scope::Read, Scope::Claim],
        Grant::Namespace(ns.clone()),
    );
    let worker = f.login(&key);
    let mut enqueued = 0;
    let error = loop {
        match f.store.enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(vec![1]),
            &EnqueueOptions::default(),
        ) {
            Ok(_) => enqueued += 1,
            Err(error) => break error,
        }
        assert!(enqueued < 40, "the allowance never ran out");
    };
    assert_refused_at_noon(&error);
    assert!(f.store.rows_written_today() <= 40);
    assert_eq!(
        f.store.health(&worker, &ns).unwrap().attempts.ready,
        enqueued
    );
    // A claim that would lease is a write; one that finds its queue empty
    // writes nothing and answers.
    assert_refused_at_noon(&f.store.claim(&worker, &ns, &q).unwrap_err());
    assert!(matches!(
        f.store.claim(&worker, &ns, &queue("empty")).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    // A new UTC day brings a new allowance.
    f.clock
        .set_utc(Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 1).unwrap());
    f.store
        .enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(vec![1]),
            &EnqueueOptions::default(),
        )
        .unwrap();
}

#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn broken_connections_are_replaced_and_a_statement_timeout_is_a_retryable_error() {
    let db = database();
    let clock = ManualClock::new(noon());
    let store = db
        .open_postgres(
            |options| options.with_statement_timeout(Duration::from_millis(300)),
            StoreConfig::default().with_clock(Arc::new(clock)),
        )
        .unwrap();
    let admin = store
        .authenticate(Some(store.create_admin_key("ops").unwrap().secret.expose()))
        .unwrap();
    // Every pooled connection is cut: the next operations reconnect.
    let (_, schema) = db.postgres_place();
    db.postgres_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'tessera {schema}'"
    ));
    let spec = tessera_store::KeySpec::keyed("acme").with_scopes([Scope::Read]);
    store.create_key(&admin, &spec).unwrap();
    assert_eq!(
        store.list_keys(&admin, &Default::default()).unwrap().len(),
        2
    );

    // A write stuck behind another client's lock past the statement
    // timeout fails as retryable, without a hang, and writes nothing.
    let (url, _) = db.postgres_place();
    let mut blocker = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let mut lock = blocker.transaction().unwrap();
    lock.batch_execute(&format!(
        "LOCK TABLE \"{schema}\".access_keys IN EXCLUSIVE MODE"
    ))
    .unwrap();
    let error = store.create_key(&admin, &spec).unwrap_err();
    assert_eq!((error.status(), error.code()), (500, "storage_error"));
    assert!(error.is_retryable(), "{error:?}");
    lock.rollback().unwrap();
    assert_eq!(
        store.list_keys(&admin, &Default::default()).unwrap().len(),
        2
    );
    store.create_key(&admin, &spec).unwrap();
}

/// A submission that waits for another transaction's lock on its task
/// decides on the task as that transaction left it. Here the other
/// transaction granted the attempt again (a new token): the old token is
/// stale, never accepted, whether the submission is alone or carries
/// the next claim.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn a_submission_that_waited_for_its_task_sees_what_the_other_transaction_wrote() {
    for carrying in [false, true] {
        let answer = submitted_while_the_task_is_locked("FOR UPDATE", true, carrying);
        match answer {
            Err(tessera_store::Error::Conflict { kind, .. }) => {
                assert_eq!(kind, tessera_store::ConflictKind::StaleToken, "{carrying}")
            }
            other => panic!("a stale token, not {other:?} (carrying a claim: {carrying})"),
        }
    }
}

/// A claim's lock on a task (`FOR NO KEY UPDATE`, as a claim whose
/// snapshot predates the task's grant keeps it) does not hold up the
/// task's holder submitting it with the next claim: the submission
/// commits while the lock is still held.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn a_claims_lock_on_a_task_does_not_hold_up_its_submission() {
    let answer = submitted_while_the_task_is_locked("FOR NO KEY UPDATE", false, true);
    assert!(
        matches!(answer, Ok(tessera_store::Submitted::Accepted(_))),
        "{answer:?}"
    );
}

/// Claims a task, locks it in another connection (`lock`, then grants
/// its attempt again there if `regrant`), and submits it, alone or
/// `carrying` the next claim; when `regrant`, the lock is held until the
/// submission waits for it, else until the submission has answered.
fn submitted_while_the_task_is_locked(
    lock: &str,
    regrant: bool,
    carrying: bool,
) -> Result<tessera_store::Submitted, tessera_store::Error> {
    let db = database();
    let f = Fixture::new(&db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, 1);
    let claimed = f.claim(&worker, &ns, &q);

    let (url, schema) = db.postgres_place();
    let mut other = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let mut holding = other.transaction().unwrap();
    let task = format!(
        "(SELECT id FROM \"{schema}\".tasks WHERE task_id = '{}')",
        claimed.task.id.as_str()
    );
    holding
        .batch_execute(&format!(
            "SELECT 1 FROM \"{schema}\".tasks WHERE id = {task} {lock}"
        ))
        .unwrap();
    if regrant {
        holding
            .batch_execute(&format!(
                "UPDATE \"{schema}\".attempts SET token = token + 1 WHERE task = {task}; \
                 UPDATE \"{schema}\".tasks SET last_token = last_token + 1 WHERE id = {task}"
            ))
            .unwrap();
    }
    let request = tessera_store::SubmitRequest {
        task: claimed.task.clone(),
        token: claimed.lease.token(),
        key: tessera_store::IdempotencyKey::parse("k").unwrap(),
        output: tessera_store::Output::bytes("out"),
    };
    let submit = || {
        if carrying {
            f.store
                .submit_and_claim(&worker, &request, &ns, &q)
                .map(|(submitted, _)| submitted)
        } else {
            f.store.submit(
                &worker,
                &request.task,
                request.token,
                &request.key,
                &request.output,
            )
        }
    };
    std::thread::scope(|scope| {
        let submitting = scope.spawn(submit);
        if regrant {
            // The submission waits for the task's lock.
            let mut watcher = postgres::Client::connect(url, postgres::NoTls).unwrap();
            let waiting = format!(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'tessera {schema}' AND wait_event_type = 'Lock'"
            );
            while watcher.query_one(&waiting, &[]).unwrap().get::<_, i64>(0) == 0 {
                assert!(!submitting.is_finished(), "the submission did not wait");
                std::thread::sleep(Duration::from_millis(5));
            }
            holding.commit().unwrap();
            submitting.join().unwrap()
        } else {
            let answer = submitting.join().unwrap();
            holding.commit().unwrap();
            answer
        }
    })
}

#[test]
fn a_server_that_cannot_be_reached_is_a_retryable_error_in_bounded_time() {
    let error = Store::open_postgres(
        tessera_store::postgres::PostgresOptions::new("postgres://nobody@127.0.0.1:1/none")
            .with_connect_timeout(Duration::from_millis(500))
            .with_pool_timeout(Duration::from_millis(500)),
        StoreConfig::default(),
    )
    .unwrap_err();
    assert_eq!(error.code(), "storage_error", "{error:?}");
    assert!(error.is_retryable(), "{error:?}");
}
