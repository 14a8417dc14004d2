//! Bad input: identifiers that are empty, too long, path-like, SQL-like or
//! full of control characters; bytes that are not UTF-8; oversized briefs
//! and outputs; invalid store settings; and a wall clock that steps back.
//! (SQLite's page cap setting, the daily allowance and truncated files are
//! in `tests/sqlite/`.)

use std::time::Duration;

use chrono::TimeDelta;
use tessera_store::limits::MAX_BRIEF_BYTES;
use tessera_store::{
    AdmissionConfig, AttemptNumber, AuditQuery, Brief, Caller, ClaimOutcome, EnqueueOptions, Error,
    Grant, IdempotencyKey, IdleConfig, KeyFilter, KeyId, KeySpec, MintConfig, Namespace, Output,
    PrincipalId, QueueName, Retry, Scope, Store, StoreConfig, Submitted, TaskId, TaskRef,
    TaskState,
};

use crate::harness::{Fixture, TestDb, namespace, noon, queue};

fn assert_invalid(error: &Error) {
    assert_eq!(
        (error.status(), error.code()),
        (400, "invalid_input"),
        "{error:?}"
    );
}

/// Values no identifier accepts, whatever its kind.
fn hostile_names() -> Vec<String> {
    [
        "",
        "../x",
        "..",
        "a/b",
        "/etc/passwd",
        "a\\b",
        ".hidden",
        "trailing.",
        "a..b",
        "x'; DROP TABLE tasks;--",
        "x\" OR \"1\"=\"1",
        "tab\there",
        "nul\0byte",
        "new\nline",
        "bell\u{7}",
        " padded",
        "%2e%2e%2f",
        "ünïcødé",
        "名前",
    ]
    .iter()
    .map(|name| (*name).to_owned())
    .collect()
}

/// No database: runs once, not per backend.
#[test]
fn hostile_identifiers_are_refused_as_invalid_input_in_every_role() {
    let mut refused = 0;
    let too_long = |max: usize| "n".repeat(max + 1);
    for name in hostile_names() {
        let label = format!("{name:?}");
        let errors = [
            Namespace::parse(&name).map(drop),
            QueueName::parse(&name).map(drop),
            TaskId::parse(&name).map(drop),
            IdempotencyKey::parse(&name).map(drop),
        ];
        for error in errors {
            let error = Error::from(error.expect_err(&label));
            assert_invalid(&error);
            // The message says what is wrong, without echoing the value.
            if name.len() > 3 {
                assert!(!error.to_string().contains(&name), "{error}");
            }
            refused += 1;
        }
        // A host decoding a request body gets the same refusal.
        let body = serde_json::json!({ "namespace": name, "id": "t", "version": 1 });
        assert!(serde_json::from_value::<TaskRef>(body).is_err(), "{label}");
        let body = serde_json::json!({ "namespace": "ns", "id": name, "version": 1 });
        assert!(serde_json::from_value::<TaskRef>(body).is_err(), "{label}");
        assert_invalid(&Grant::parse(&format!("namespace:{name}")).expect_err(&label));
        assert_invalid(&KeyId::parse(&name).expect_err(&label));
        assert_invalid(&PrincipalId::parse(&name).expect_err(&label));
    }
    for error in [
        Namespace::parse(&too_long(Namespace::MAX_LEN)).map(drop),
        QueueName::parse(&too_long(QueueName::MAX_LEN)).map(drop),
        TaskId::parse(&too_long(TaskId::MAX_LEN)).map(drop),
        IdempotencyKey::parse(&too_long(IdempotencyKey::MAX_LEN)).map(drop),
    ] {
        let error = Error::from(error.unwrap_err());
        assert_invalid(&error);
        assert!(error.to_string().contains("longer than"), "{error}");
        refused += 1;
    }
    assert_eq!(refused, hostile_names().len() * 4 + 4);
}

fn identifiers_at_their_longest_work_end_to_end(db: &TestDb) {
    let setup = Fixture::new(db);
    let ns = Namespace::parse(&"n".repeat(Namespace::MAX_LEN)).unwrap();
    let q = QueueName::parse(&"q".repeat(QueueName::MAX_LEN)).unwrap();
    let id = TaskId::parse(&format!("{}.x-_", "t".repeat(TaskId::MAX_LEN - 4))).unwrap();
    let key = IdempotencyKey::parse(&"k".repeat(IdempotencyKey::MAX_LEN)).unwrap();
    let worker = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    let options = EnqueueOptions::default().with_task_id(id.clone());
    let task = setup
        .store
        .enqueue(&worker, &ns, &q, &Brief::Bytes(vec![1]), &options)
        .unwrap();
    let ClaimOutcome::Granted(claimed) = setup.store.claim(&worker, &ns, &q).unwrap() else {
        panic!("the task is claimable");
    };
    assert_eq!(claimed.task, task);
    let output = Output::bytes("done");
    let submitted = setup
        .store
        .submit(&worker, &task, claimed.lease.token(), &key, &output)
        .unwrap();
    assert_eq!(submitted.receipt().idempotency_key, key);
    assert_eq!(submitted.receipt().task, id);
    // The artifact key has room for the longest task id.
    assert!(
        submitted
            .receipt()
            .artifact
            .as_str()
            .starts_with(id.as_str())
    );
}

fn free_text_is_stored_verbatim_and_never_interpreted(db: &TestDb) {
    let setup = Fixture::new(db);
    let texts = [
        "x'; DROP TABLE tasks;--",
        "Robert'); DELETE FROM access_keys; --",
        "../../etc/passwd",
        "a/b\\c",
        "%s %n {} {0} $(rm -rf /) `id`",
        "Ünïcødé ☃ 名前",
        "",
    ];
    let mut issued = Vec::new();
    for text in texts {
        // An account may not be empty; a label may.
        let account = if text.is_empty() { "acme" } else { text };
        let key = setup
            .store
            .create_key(&setup.admin, &KeySpec::keyed(account).with_label(text))
            .unwrap();
        issued.push((key.info.key_id.clone(), account, text));
    }
    let listed = setup
        .store
        .list_keys(&setup.admin, &KeyFilter::default())
        .unwrap();
    for (key_id, account, label) in &issued {
        let info = listed.iter().find(|info| &info.key_id == key_id).unwrap();
        assert_eq!(
            (info.account.as_str(), info.label.as_str()),
            (*account, *label)
        );
    }
    // Nothing was run or created: the tables are all there, and a
    // database kept in files (SQLite's three) has no other beside it.
    assert_eq!(db.count_rows("tasks"), 0);
    assert_eq!(db.count_rows("access_keys"), 1 + texts.len() as u64);
    if let Some(files) = db.files() {
        assert_eq!(files, ["tessera.db", "tessera.db-shm", "tessera.db-wal"]);
    }
    // A hostile presented key is a plain 401.
    for presented in texts.iter().chain(&["tsk_'; DROP TABLE access_keys;--_x"]) {
        let error = setup.store.authenticate(Some(presented)).unwrap_err();
        assert_eq!(error.status(), 401);
    }
    assert!(
        setup
            .store
            .authenticate(Some(setup.admin_key.secret.expose()))
            .is_ok()
    );
}

fn bad_account_and_label_text_is_refused_and_writes_nothing(db: &TestDb) {
    let setup = Fixture::new(db);
    let long = "a".repeat(tessera_store::limits::MAX_ACCOUNT_LEN + 1);
    let long_label = "l".repeat(tessera_store::limits::MAX_LABEL_LEN + 1);
    let specs = [
        KeySpec::keyed(""),
        KeySpec::keyed(&long),
        KeySpec::keyed("tab\there"),
        KeySpec::keyed("nul\0"),
        KeySpec::keyed("acme").with_label("line\nbreak"),
        KeySpec::keyed("acme").with_label("escape\u{1b}[31m"),
        KeySpec::keyed("acme").with_label(&long_label),
    ];
    let snapshot = db.table_snapshot();
    for spec in specs {
        let (result, cost) = setup.store.measure(|s| s.create_key(&setup.admin, &spec));
        assert_invalid(&result.unwrap_err());
        if db.meters_rows() {
            assert_eq!(cost.rows_written, 0, "{spec:?}");
        }
    }
    assert_eq!(db.table_snapshot(), snapshot);
    // At the limits they are accepted.
    let longest = "a".repeat(tessera_store::limits::MAX_ACCOUNT_LEN);
    let label = "l".repeat(tessera_store::limits::MAX_LABEL_LEN);
    let key = setup
        .store
        .create_key(&setup.admin, &KeySpec::keyed(&longest).with_label(&label))
        .unwrap();
    assert_eq!(key.info.account, longest);
}

fn bytes_that_are_not_utf8_are_stored_and_returned_as_they_are(db: &TestDb) {
    let setup = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let worker = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    let mut bytes: Vec<u8> = (0..=255).collect();
    bytes.extend_from_slice(b"\xff\xfe\xc0\x80'; DROP TABLE tasks;--\0");
    assert!(String::from_utf8(bytes.clone()).is_err());
    let json = Brief::Json(serde_json::json!({
        "sql": "x'; DROP TABLE tasks;--",
        "path": "../../x",
        "control": "\u{0}\u{1b}\n",
        "nested": [[[{"deep": true}]]],
    }));
    let raw = setup
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(bytes.clone()),
            &EnqueueOptions::default(),
        )
        .unwrap();
    let structured = setup
        .store
        .enqueue(&worker, &ns, &q, &json, &EnqueueOptions::default())
        .unwrap();

    let ClaimOutcome::Granted(claimed) = setup.store.claim(&worker, &ns, &q).unwrap() else {
        panic!("the task is claimable");
    };
    assert_eq!(claimed.task, raw);
    assert_eq!(claimed.brief, Brief::Bytes(bytes.clone()));
    let output = Output::bytes(bytes.iter().rev().copied().collect::<Vec<u8>>());
    let key = IdempotencyKey::parse("k").unwrap();
    let submitted = setup
        .store
        .submit(&worker, &raw, claimed.lease.token(), &key, &output)
        .unwrap();
    assert_eq!(submitted.receipt().digest, output.payload_digest());
    let stored = setup
        .store
        .read_receipt(&worker, &raw, AttemptNumber::FIRST)
        .unwrap();
    let reversed: Vec<u8> = bytes.iter().rev().copied().collect();
    assert_eq!(stored.output, Some(reversed));
    assert_eq!(
        setup.store.read_task(&worker, &structured).unwrap().brief,
        json
    );
    assert_eq!(
        setup.store.read_task(&worker, &raw).unwrap().brief,
        Brief::Bytes(bytes)
    );
    assert_eq!(db.count_rows("tasks"), 2);
}

fn oversized_briefs_and_outputs_are_refused_with_their_limit(db: &TestDb) {
    let setup = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let worker = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    let limit = MAX_BRIEF_BYTES.to_string();

    // Exactly at the limit: accepted, and handed out whole.
    let at_limit = setup
        .store
        .enqueue(
            &worker,
            &ns,
            &q,
            &Brief::Bytes(vec![7; MAX_BRIEF_BYTES]),
            &EnqueueOptions::default(),
        )
        .unwrap();

    // One byte over, as bytes or as encoded JSON: refused naming the limit,
    // counted, nothing written.
    let over_json = Brief::Json(serde_json::json!({ "pad": "x".repeat(MAX_BRIEF_BYTES) }));
    for brief in [Brief::Bytes(vec![7; MAX_BRIEF_BYTES + 1]), over_json] {
        let counted = setup.store.pending_counters();
        let (result, cost) = setup
            .store
            .measure(|s| s.enqueue(&worker, &ns, &q, &brief, &EnqueueOptions::default()));
        let error = result.unwrap_err();
        assert_invalid(&error);
        assert!(error.to_string().contains(&limit), "{error}");
        if db.meters_rows() {
            assert_eq!(cost.rows_written, 0);
        }
        assert_eq!(setup.store.pending_counters(), counted + 1);
    }

    let ClaimOutcome::Granted(claimed) = setup.store.claim(&worker, &ns, &q).unwrap() else {
        panic!("the task at the limit is claimable");
    };
    assert_eq!(claimed.task, at_limit);
    assert_eq!(claimed.brief, Brief::Bytes(vec![7; MAX_BRIEF_BYTES]));

    // An output one byte over is refused the same way; the lease is
    // untouched and an output at the limit is then accepted.
    let token = claimed.lease.token();
    let key = IdempotencyKey::parse("k").unwrap();
    let too_big = Output::bytes(vec![1; MAX_BRIEF_BYTES + 1]);
    let (result, cost) = setup
        .store
        .measure(|s| s.submit(&worker, &at_limit, token, &key, &too_big));
    let error = result.unwrap_err();
    assert_invalid(&error);
    assert!(error.to_string().contains(&limit), "{error}");
    if db.meters_rows() {
        assert_eq!(cost.rows_written, 0);
    }
    let view = setup.store.read_task(&worker, &at_limit).unwrap();
    assert_eq!(view.record.attempts[0].state, TaskState::Leased);
    let fits = Output::bytes(vec![1; MAX_BRIEF_BYTES]);
    let submitted = setup
        .store
        .submit(&worker, &at_limit, token, &key, &fits)
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
}

/// Opens a store on a fresh database like `db` with `config`; on failure
/// also checks the database was never created.
fn open_fresh(db: &TestDb, config: StoreConfig) -> Result<Store, Error> {
    let db = db.fresh();
    let result = db.open_result(config);
    if result.is_err() {
        assert!(
            !db.exists(),
            "settings are checked before the file is touched"
        );
    }
    result
}

fn invalid_claim_idle_and_mint_settings_are_refused_before_the_file_is_touched(db: &TestDb) {
    let admission = AdmissionConfig::default();
    let cases: Vec<(StoreConfig, &str)> = vec![
        (
            AdmissionConfig {
                initial_concurrency: 0,
                ..admission.clone()
            },
            "initial_concurrency",
        ),
        (
            AdmissionConfig {
                max_concurrency: 0,
                ..admission.clone()
            },
            "max_concurrency",
        ),
        (
            AdmissionConfig {
                min_concurrency: 0,
                ..admission.clone()
            },
            "min_concurrency",
        ),
        (
            AdmissionConfig {
                max_pending: 0,
                ..admission.clone()
            },
            "max_pending",
        ),
        (
            AdmissionConfig {
                max_wait: Duration::ZERO,
                ..admission.clone()
            },
            "max_wait",
        ),
        (
            AdmissionConfig {
                target: Duration::ZERO,
                ..admission.clone()
            },
            "target",
        ),
        (
            AdmissionConfig {
                ewma_weight: f64::NAN,
                ..admission.clone()
            },
            "ewma_weight",
        ),
        (
            AdmissionConfig {
                ewma_weight: -0.5,
                ..admission.clone()
            },
            "ewma_weight",
        ),
        (
            AdmissionConfig {
                initial_concurrency: 64,
                max_concurrency: 32,
                ..admission.clone()
            },
            "initial_concurrency",
        ),
    ]
    .into_iter()
    .map(|(config, name)| (StoreConfig::default().with_admission(config), name))
    .chain([
        (
            StoreConfig::default().with_idle(IdleConfig { capacity: 0 }),
            "idle.capacity",
        ),
        (
            StoreConfig::default().with_mint(MintConfig {
                per_hour: 1,
                ..MintConfig::default()
            }),
            "mint.per_hour",
        ),
        (
            StoreConfig::default().with_mint(MintConfig {
                per_address_per_hour: 0,
                ..MintConfig::default()
            }),
            "mint.per_address_per_hour",
        ),
        (
            StoreConfig::default().with_mint(MintConfig {
                address_capacity: 0,
                ..MintConfig::default()
            }),
            "mint.address_capacity",
        ),
    ])
    .collect();
    for (config, name) in cases {
        let error = open_fresh(db, config).unwrap_err();
        assert_invalid(&error);
        assert!(error.to_string().contains(name), "{name}: {error}");
    }
}

fn an_invalid_lease_duration_is_refused_when_the_store_opens(db: &TestDb) {
    for duration in [
        Duration::ZERO,
        tessera_lease::MAX_LEASE_DURATION + Duration::from_secs(1),
    ] {
        let result = open_fresh(db, StoreConfig::default().with_lease_duration(duration));
        let error = result.expect_err("an invalid lease duration opens a store");
        assert_invalid(&error);
        assert!(error.to_string().contains("lease"), "{error}");
    }
}

fn a_zero_session_lifetime_is_refused_when_the_store_opens(db: &TestDb) {
    let result = open_fresh(
        db,
        StoreConfig::default().with_session_lifetime(Duration::ZERO),
    );
    let error = result.expect_err("a zero session lifetime opens a store");
    assert_invalid(&error);
    assert!(error.to_string().contains("session"), "{error}");
}

fn the_wall_clock_stepping_back_never_shortens_revives_or_backdates_a_lease(db: &TestDb) {
    let setup = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let alice = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    let bob = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    let first = setup.enqueue_one(&alice, &ns, &q, 1);
    let ClaimOutcome::Granted(held) = setup.store.claim(&alice, &ns, &q).unwrap() else {
        panic!("claimable");
    };
    let expiry = held.lease.expires_at();
    assert_eq!(expiry, noon() + TimeDelta::seconds(60));

    // An hour back: the lease is not shortened, and nobody else gets it.
    setup.clock.set_utc(noon() - TimeDelta::hours(1));
    let beat = setup
        .store
        .heartbeat(&alice, &first, held.lease.token())
        .unwrap();
    assert_eq!(beat.expires_at(), expiry);
    assert!(matches!(
        setup.store.claim(&bob, &ns, &q).unwrap(),
        ClaimOutcome::Empty { .. }
    ));
    assert!(setup.store.expire_leases(&ns, 10).unwrap().is_empty());
    assert_eq!(setup.store.health(&alice, &ns).unwrap().expired_leases, 0);

    // A lease granted in the past-stepped time lapses when the clock comes
    // back; a later step back never revives it for its old holder.
    let second = setup.enqueue_one(&alice, &ns, &q, 2);
    let ClaimOutcome::Granted(early) = setup.store.claim(&alice, &ns, &q).unwrap() else {
        panic!("claimable");
    };
    assert_eq!(early.task, second);
    assert_eq!(early.lease.granted_at(), noon() - TimeDelta::hours(1));
    setup.clock.set_utc(noon());
    let ClaimOutcome::Granted(taken) = setup.store.claim(&bob, &ns, &q).unwrap() else {
        panic!("the lapsed lease is taken over");
    };
    assert_eq!(taken.task, second);
    assert!(taken.lease.token() > early.lease.token());
    setup
        .clock
        .set_utc(noon() - TimeDelta::minutes(59) - TimeDelta::seconds(30));
    let stale = setup
        .store
        .heartbeat(&alice, &second, early.lease.token())
        .unwrap_err();
    assert_eq!(stale.status(), 409);
    let key = IdempotencyKey::parse("k").unwrap();
    let stale = setup
        .store
        .submit(
            &alice,
            &second,
            early.lease.token(),
            &key,
            &Output::bytes("late"),
        )
        .unwrap_err();
    assert_eq!(stale.status(), 409);

    // A submission while the clock is behind is never dated before its
    // grant.
    let receipt = setup
        .store
        .submit(
            &bob,
            &second,
            taken.lease.token(),
            &key,
            &Output::bytes("bob"),
        )
        .unwrap();
    assert_eq!(receipt.receipt().accepted_at, noon());
    let receipt = setup
        .store
        .submit(
            &alice,
            &first,
            held.lease.token(),
            &key,
            &Output::bytes("alice"),
        )
        .unwrap();
    assert!(receipt.receipt().accepted_at >= held.lease.granted_at());
    for task in [&first, &second] {
        let view = setup.store.read_task(&alice, task).unwrap();
        assert_eq!(view.record.attempts[0].state, TaskState::Done);
    }
}

/// A claim whose time reads before the attempt's latest grant (a clock
/// behind, or a time read before a wait for the server) stamps its lease
/// from that grant: an attempt's leases start in token order, so the
/// first lease's term never seems to overlap the third's.
fn a_lease_is_never_stamped_before_the_grant_it_follows(db: &TestDb) {
    let setup = Fixture::new(db);
    let (ns, q) = (namespace("farm"), queue("frames"));
    let grant = Grant::Namespace(ns.clone());
    let [alice, bob, carol] =
        ["alice", "bob", "carol"].map(|_| setup.login(&setup.key(Scope::ALL, grant.clone())));
    // Carol's key is seen at noon, so her claim below is a plain one (on
    // PostgreSQL, the one-statement claim's to decline).
    let task = setup.enqueue_one(&carol, &ns, &q, 1);
    let claim = |who: &Caller| match setup.store.claim(who, &ns, &q).unwrap() {
        ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("claimable, got {other:?}"),
    };
    let first = claim(&alice);
    assert_eq!(first.lease.granted_at(), noon());

    // An hour on, the lapsed lease is taken over, and given back for a
    // retry at once.
    let later = noon() + TimeDelta::hours(1);
    setup.clock.set_utc(later);
    let second = claim(&bob);
    assert_eq!(second.lease.granted_at(), later);
    setup
        .store
        .fail(
            &bob,
            &task,
            second.lease.token(),
            Retry::After(Duration::ZERO),
        )
        .unwrap();

    // A claim that read its time while the first lease still ran.
    setup.clock.set_utc(noon() + TimeDelta::seconds(30));
    let third = claim(&carol);
    assert_eq!(third.task, task);
    assert!(third.lease.token() > second.lease.token());
    assert_eq!(third.lease.granted_at(), later);
    assert_eq!(
        third.lease.expires_at(),
        later + TimeDelta::seconds(60),
        "the lease runs its whole term from its grant"
    );
    assert!(third.lease.granted_at() >= first.lease.expires_at());
    let view = setup.store.read_task(&carol, &task).unwrap();
    let stored = view.record.attempts[0].lease.as_ref().unwrap();
    assert_eq!(
        (stored.token, stored.granted_at, stored.expires_at),
        (third.lease.token(), later, later + TimeDelta::seconds(60))
    );
}

fn the_wall_clock_stepping_back_loses_no_count_and_deletes_nothing_young(db: &TestDb) {
    let setup = Fixture::new(db);
    let minute = |m: i64| noon() + TimeDelta::minutes(m);
    // Three denials at 12:00:30, two after a step back to 11:58:10.
    setup.clock.set_utc(minute(0) + TimeDelta::seconds(30));
    for _ in 0..3 {
        assert!(setup.store.authenticate(None).is_err());
    }
    setup.clock.set_utc(minute(-2) + TimeDelta::seconds(10));
    for _ in 0..2 {
        assert!(setup.store.authenticate(None).is_err());
    }
    // Nothing is due yet: neither minute has passed on the clock as it is.
    assert_eq!(setup.store.maintain().unwrap().counters_written, 0);
    assert_eq!(setup.store.pending_counters(), 5);
    setup.clock.set_utc(minute(2));
    assert_eq!(setup.store.maintain().unwrap().counters_written, 2);
    // Back into a minute already written: the count is added to its row.
    setup.clock.set_utc(minute(0) + TimeDelta::seconds(45));
    assert!(setup.store.authenticate(None).is_err());
    setup.store.flush_counters().unwrap();
    let denied = |page: &tessera_store::AuditPage| -> Vec<(i64, u64)> {
        let mut rows: Vec<(i64, u64)> = page
            .counters
            .iter()
            .filter(|c| c.key.action().as_str() == "authenticate")
            .map(|c| ((c.key.minute().start() - noon()).num_minutes(), c.count))
            .collect();
        rows.sort_unstable();
        rows
    };
    setup.clock.set_utc(minute(3));
    let page = setup
        .store
        .audit(&setup.admin, &AuditQuery::default())
        .unwrap();
    assert_eq!(denied(&page), [(-2, 2), (0, 4)]);
    let young: Vec<_> = page.events.iter().map(|e| (e.time, e.action)).collect();
    assert!(!young.is_empty());

    // Two days back: retention runs (a step back must not stall it) but
    // deletes nothing, and no row is lost when the clock returns.
    setup.clock.set_utc(noon() - TimeDelta::days(2));
    let report = setup.store.maintain().unwrap();
    assert!(report.retention_ran);
    assert_eq!(report.rows_deleted, 0);
    setup.clock.set_utc(noon() + TimeDelta::hours(23));
    setup.store.maintain().unwrap();
    let page = setup
        .store
        .audit(&setup.admin, &AuditQuery::default())
        .unwrap();
    for event in &young {
        assert!(
            page.events.iter().any(|e| (e.time, e.action) == *event),
            "{event:?} was lost"
        );
    }
    assert_eq!(denied(&page), [(-2, 2), (0, 4)]);
    // Once they are past the window, they go.
    setup.clock.set_utc(noon() + TimeDelta::hours(25));
    let report = setup.store.maintain().unwrap();
    assert!(report.rows_deleted >= young.len() as u64);
    let page = setup
        .store
        .audit(&setup.admin, &AuditQuery::default())
        .unwrap();
    assert!(page.events.iter().all(|e| e.time > noon()));
    assert!(denied(&page).is_empty());
}

conformance! {
    identifiers_at_their_longest_work_end_to_end,
    free_text_is_stored_verbatim_and_never_interpreted,
    bad_account_and_label_text_is_refused_and_writes_nothing,
    bytes_that_are_not_utf8_are_stored_and_returned_as_they_are,
    oversized_briefs_and_outputs_are_refused_with_their_limit,
    invalid_claim_idle_and_mint_settings_are_refused_before_the_file_is_touched,
    an_invalid_lease_duration_is_refused_when_the_store_opens,
    a_zero_session_lifetime_is_refused_when_the_store_opens,
    the_wall_clock_stepping_back_never_shortens_revives_or_backdates_a_lease,
    the_wall_clock_stepping_back_loses_no_count_and_deletes_nothing_young,
    a_lease_is_never_stamped_before_the_grant_it_follows,
}
