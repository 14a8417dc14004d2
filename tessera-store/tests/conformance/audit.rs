//! Audit rows, counters and retention through the public API.

use std::time::Duration;

use tessera_store::limits::STORE_NAMESPACE;
use tessera_store::{
    Action, AuditCursor, AuditQuery, Clock, EnqueueOptions, Grant, KeyFilter, Outcome, Scope,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, noon, queue};

fn an_audit_read_writes_waiting_counters_first(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::Namespace(namespace("renders"))));
    let before = f.store.meter();
    for _ in 0..3 {
        assert!(f.store.authenticate(Some("tsk_bogus")).is_err());
    }
    assert!(
        f.store
            .authorize(&worker, &namespace("billing"), Scope::Claim, Action::Claim)
            .is_err()
    );
    if db.meters_rows() {
        assert_eq!(f.store.meter().since(&before).rows_written, 0);
    }
    assert_eq!(f.store.pending_counters(), 4);

    // Same minute: not due on their own, but the audit read writes them.
    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    assert_eq!(f.store.pending_counters(), 0);
    let unauthorized = page
        .counters
        .iter()
        .find(|c| c.key.outcome() == Outcome::Unauthorized)
        .unwrap();
    assert_eq!(unauthorized.count, 3);
    assert_eq!(unauthorized.key.principal(), None);
    assert_eq!(unauthorized.key.namespace().as_str(), STORE_NAMESPACE);
    assert_eq!(unauthorized.key.action(), Action::Authenticate);
    let forbidden = page
        .counters
        .iter()
        .find(|c| c.key.outcome() == Outcome::Forbidden)
        .unwrap();
    assert_eq!(forbidden.count, 1);
    assert_eq!(forbidden.key.namespace().as_str(), "billing");
    assert_eq!(
        forbidden.key.principal().map(|p| p.as_str().to_owned()),
        Some(worker.principal().to_string())
    );

    // A later flush adds to the same rows rather than duplicating them.
    assert!(f.store.authenticate(Some("tsk_bogus")).is_err());
    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let unauthorized: Vec<_> = page
        .counters
        .iter()
        .filter(|c| c.key.outcome() == Outcome::Unauthorized)
        .collect();
    assert_eq!(unauthorized.len(), 1);
    assert_eq!(unauthorized[0].count, 4);
}

fn counters_are_written_once_their_minute_has_passed(db: &TestDb) {
    let f = Fixture::new(db);
    assert!(f.store.authenticate(None).is_err());
    assert!(f.store.maintain().unwrap().counters_written == 0);
    assert_eq!(f.store.pending_counters(), 1);
    let due = f.store.next_maintenance().unwrap();
    assert!(due <= noon() + chrono::TimeDelta::minutes(1));
    f.clock.advance(Duration::from_secs(60));
    let report = f.store.maintain().unwrap();
    assert_eq!(report.counters_written, 1);
    assert_eq!(f.store.pending_counters(), 0);
}

/// A counted request never writes, even the first after a minute
/// boundary; `maintain()` at `next_maintenance()` writes the minute that
/// passed.
fn a_counted_request_never_writes_and_maintenance_writes_the_minute(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::Namespace(namespace("renders"))));
    let (ns, q) = (namespace("renders"), queue("frames"));
    let before = db.table_snapshot();
    let no_ops = |f: &Fixture<'_>| {
        let (_, cost) = f.store.measure(|s| {
            assert!(s.authenticate(Some("tsk_bogus")).is_err());
            assert!(s.claim(&worker, &namespace("billing"), &q).is_err());
            assert!(s.claim(&worker, &ns, &q).unwrap().retry_after().is_some());
        });
        assert_eq!(
            (cost.rows_written, cost.write_transactions),
            (0, 0),
            "{cost:?}"
        );
    };
    no_ops(&f);
    assert_eq!(f.store.pending_counters(), 3);
    // Past the minute's end, the same requests still write nothing.
    f.clock.advance(Duration::from_secs(60));
    no_ops(&f);
    assert_eq!(f.store.pending_counters(), 6);
    assert_eq!(db.table_snapshot(), before);

    let due = f.store.next_maintenance().unwrap();
    assert!(due <= f.clock.now_utc(), "the passed minute is due");
    let (report, cost) = f.store.measure(|s| s.maintain().unwrap());
    assert_eq!(report.counters_written, 3, "the passed minute's counters");
    assert_eq!(cost.write_transactions, 1, "{cost:?}");
    assert_eq!(f.store.pending_counters(), 3, "this minute's wait");
    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let minutes: Vec<i64> = page
        .counters
        .iter()
        .map(|counter| (counter.key.minute().start() - noon()).num_minutes())
        .collect();
    assert_eq!(minutes.len(), 6, "the audit read writes the rest first");
    assert_eq!(minutes.iter().filter(|m| **m == 0).count(), 3);
    assert_eq!(minutes.iter().filter(|m| **m == 1).count(), 3);
}

fn callers_read_their_own_audit_and_admins_everyones(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::AllNamespaces));
    let other = f.login(&f.worker(Grant::AllNamespaces));
    f.store.list_keys(&worker, &KeyFilter::default()).unwrap();
    f.store.list_keys(&other, &KeyFilter::default()).unwrap();

    let own = f.store.audit(&worker, &AuditQuery::default()).unwrap();
    assert_eq!(own.events.len(), 1);
    assert_eq!(own.events[0].action, Action::ListKeys);
    assert_eq!(
        own.events[0].principal.as_str(),
        worker.principal().to_string()
    );

    let theirs = AuditQuery {
        principal: Some(other.principal()),
        ..AuditQuery::default()
    };
    assert_eq!(f.store.audit(&worker, &theirs).unwrap_err().status(), 403);
    let as_admin = f.store.audit(&f.admin, &theirs).unwrap();
    assert_eq!(as_admin.events.len(), 1);
    assert_eq!(
        as_admin.events[0].principal.as_str(),
        other.principal().to_string()
    );

    let everyone = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    // Three keys created, two listings, and two audit reads before this one.
    assert_eq!(everyone.events.len(), 7);
    // Newest first.
    assert!(everyone.events.windows(2).all(|w| w[0].time >= w[1].time));
}

fn reads_hide_expired_rows_and_retention_deletes_them_in_batches(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::AllNamespaces));
    for _ in 0..1200 {
        f.store.list_keys(&worker, &KeyFilter::default()).unwrap();
    }
    // Admin key, worker key, 1,200 listings.
    let events = 1202;

    f.clock.advance(Duration::from_secs(24 * 3600 + 60));
    // With writes refused, retention cannot run: the expired rows are still
    // there, and the read must hide them itself.
    f.store.refuse_writes(true);
    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    assert!(page.events.is_empty(), "{:?}", page.events.first());
    f.store.refuse_writes(false);

    let before = f.store.meter();
    let report = f.store.maintain().unwrap();
    let cost = f.store.meter().since(&before);
    assert!(report.retention_ran);
    assert_eq!(report.rows_deleted, events);
    if db.meters_rows() {
        // Events in batches of 500, 500 and 202. The short batches of
        // keys, principals, limits, counters, session tasks and namespaces
        // find nothing to delete: a commit that wrote nothing is no write
        // transaction.
        assert_eq!(cost.write_transactions, 3);
        // Each deleted event is its row and its principal index entry.
        assert_eq!(cost.rows_written, events * 2);
    }

    // At most once per five minutes.
    f.clock.advance(Duration::from_secs(299));
    assert!(!f.store.maintain().unwrap().retention_ran);
    f.clock.advance(Duration::from_secs(1));
    assert!(f.store.maintain().unwrap().retention_ran);
}

fn a_counter_costs_one_row_and_retention_deletes_quiet_counters(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.worker(Grant::Namespace(namespace("renders"))));
    // A counter of its own each minute, each written once its minute passed.
    let minutes = 510;
    for _ in 0..minutes {
        assert!(f.store.authenticate(None).is_err());
        f.clock.advance(Duration::from_secs(60));
        let (report, cost) = f.store.measure(|s| s.maintain().unwrap());
        assert_eq!(report.counters_written, 1);
        if db.meters_rows() {
            assert_eq!(cost.rows_written, 1, "one row and no index entry");
        }
    }
    // Adding to a stored counter is one row too.
    let deny = || {
        let denied = f
            .store
            .authorize(&worker, &namespace("billing"), Scope::Claim, Action::Claim);
        assert!(denied.is_err());
    };
    for _ in 0..2 {
        deny();
        let (_, cost) = f.store.measure(|s| s.flush_counters().unwrap());
        if db.meters_rows() {
            assert_eq!(cost.rows_written, 1);
        }
    }
    // A caller reads only its own counters, out of every minute's.
    let own = f.store.audit(&worker, &AuditQuery::default()).unwrap();
    assert_eq!(own.counters.len(), 1);
    assert_eq!(own.counters[0].count, 2);
    assert_eq!(
        own.counters[0]
            .key
            .principal()
            .map(|p| p.as_str().to_owned()),
        Some(worker.principal().to_string())
    );
    let all = AuditQuery {
        limit: tessera_store::limits::MAX_AUDIT_ROWS,
        ..AuditQuery::default()
    };
    let everyone = f.store.audit(&f.admin, &all).unwrap();
    assert_eq!(everyone.counters.len(), minutes + 1);

    f.clock.advance(Duration::from_secs(25 * 3600));
    let events = db.count_rows("access_audit");
    let counters = db.counter_rows();
    assert_eq!(counters, minutes as u64 + 1);
    // Retention through the next day, every five minutes: the events at
    // once, in batches; the counters, which went quiet, as retention
    // passes them (PostgreSQL: at once, by minute; SQLite: by minute of
    // the day, the hour before the cutoff in each run).
    let (mut deleted, mut written) = (0, 0);
    for run in 0..=24 * 12 {
        let (report, cost) = f.store.measure(|s| s.maintain().unwrap());
        assert!(report.retention_ran, "run {run}");
        deleted += report.rows_deleted;
        written += cost.rows_written;
        f.clock.advance(Duration::from_secs(300));
    }
    assert_eq!(deleted, events + counters);
    if db.meters_rows() {
        // An event is its row and its principal index entry, a counter
        // one row.
        assert_eq!(written, events * 2 + counters);
    }
    assert_eq!(db.counter_rows(), 0);
}

/// A counter that recurs every minute costs one row a minute, deletes
/// included: each day's row overwrites the one its minute of the day left
/// a day earlier, and retention deletes nothing of it. (On PostgreSQL,
/// which keys counters by minute, retention deletes the day-old rows.)
/// A counter that recurs every 30 minutes, for three days.
fn a_counter_that_recurs_daily_overwrites_yesterdays_row(db: &TestDb) {
    recurs_daily(db, 30);
}

/// [`a_counter_that_recurs_daily_overwrites_yesterdays_row`] every minute.
fn a_counter_that_recurs_every_minute_overwrites_yesterdays_row(db: &TestDb) {
    recurs_daily(db, 1);
}

/// A denial every `every` minutes for three days, each minute's counter
/// written by maintenance: on the third day each overwrites the row its
/// minute of the day left the day before, and retention deletes nothing.
fn recurs_daily(db: &TestDb, every: u64) {
    const DAY: u64 = 1440;
    let f = Fixture::new(db);
    let mut written = 0;
    let mut deleted = 0;
    for minute in (0..3 * DAY).step_by(every as usize) {
        assert!(f.store.authenticate(None).is_err());
        f.clock.advance(Duration::from_secs(60 * every));
        let (report, cost) = f.store.measure(|s| s.maintain().unwrap());
        if minute >= 2 * DAY {
            written += cost.rows_written;
            deleted += report.rows_deleted;
        }
    }
    if db.meters_rows() {
        // The third day: one row a counted minute, nothing deleted.
        assert_eq!((written, deleted), (DAY / every, 0));
        assert_eq!(db.counter_rows(), DAY / every);
    }
    // Readers see the last 24 hours alone, whatever is stored.
    let all = AuditQuery {
        limit: tessera_store::limits::MAX_AUDIT_ROWS,
        ..AuditQuery::default()
    };
    let page = f.store.audit(&f.admin, &all).unwrap();
    let cutoff = f.store.clock().now_utc() - chrono::TimeDelta::hours(24);
    assert!(!page.counters.is_empty());
    assert!(
        page.counters
            .iter()
            .all(|counter| counter.key.minute().start() >= cutoff - chrono::TimeDelta::minutes(1)),
        "a counter older than the window was read"
    );
    assert!(page.counters.iter().all(|counter| counter.count == 1));
}

/// The resources an audit page names, leaving out the audit reads
/// themselves (each read adds one).
fn resources(events: &[tessera_store::AuditEvent]) -> Vec<Option<String>> {
    events
        .iter()
        .filter(|event| event.action != Action::ReadAudit)
        .map(|event| event.resource.as_ref().map(|r| r.as_str().to_owned()))
        .collect()
}

/// Pages through the audit, `limit` events at a time; returns each page's
/// resources and whether later pages had counters.
fn every_page(f: &Fixture<'_>, query: AuditQuery) -> (Vec<Vec<Option<String>>>, bool) {
    let mut pages = Vec::new();
    let mut later_counters = false;
    let mut before = None;
    loop {
        let page = f
            .store
            .audit(
                &f.admin,
                &AuditQuery {
                    before,
                    ..query.clone()
                },
            )
            .unwrap();
        later_counters |= before.is_some() && !page.counters.is_empty();
        pages.push(resources(&page.events));
        match page.next {
            Some(next) => before = Some(next),
            None => return (pages, later_counters),
        }
    }
}

fn the_audit_is_read_a_page_at_a_time_past_its_newest_limit(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.full_worker(Grant::AllNamespaces);
    let worker = f.login(&key);
    // 25 enqueues a second apart, then a denied call for a counter.
    for n in 0..25 {
        f.store
            .enqueue(
                &worker,
                &namespace("renders"),
                &queue("jobs"),
                &json_brief(n),
                &EnqueueOptions::default(),
            )
            .unwrap();
        f.clock.advance(Duration::from_secs(1));
    }
    assert!(f.store.authenticate(Some("tsk_bogus")).is_err());
    let newest = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    let all = resources(&newest.events);
    assert!(all.len() > 25, "the enqueues and the setup's key creations");
    assert_eq!(newest.next, None, "one page holds them all");
    // Ten at a time: the same events in the same order, none twice.
    let query = AuditQuery {
        limit: 10,
        ..AuditQuery::default()
    };
    let (pages, later_counters) = every_page(&f, query);
    assert!(pages.len() >= 3);
    assert_eq!(pages.concat(), all);
    assert!(!later_counters, "counters come with the first page only");
    // One principal's, seven at a time.
    let principal = key.info.principal;
    let theirs = f
        .store
        .audit(
            &f.admin,
            &AuditQuery {
                principal: Some(principal),
                ..AuditQuery::default()
            },
        )
        .unwrap();
    assert_eq!(theirs.events.len(), 25);
    let (pages, _) = every_page(
        &f,
        AuditQuery {
            principal: Some(principal),
            limit: 7,
            ..AuditQuery::default()
        },
    );
    assert_eq!(pages.len(), 4);
    let mine = resources(&theirs.events);
    assert_eq!(pages.concat(), mine);
    // A cursor travels as text, and a made-up one is a clear 400.
    let cursor = newest_cursor(&f);
    assert_eq!(cursor.to_string().parse::<AuditCursor>().unwrap(), cursor);
    let json = serde_json::to_string(&cursor).unwrap();
    assert_eq!(serde_json::from_str::<AuditCursor>(&json).unwrap(), cursor);
    assert_eq!(
        "12".parse::<AuditCursor>().unwrap_err().code(),
        "invalid_input"
    );
}

/// The cursor after the newest event.
fn newest_cursor(f: &Fixture<'_>) -> AuditCursor {
    f.store
        .audit(
            &f.admin,
            &AuditQuery {
                limit: 1,
                ..AuditQuery::default()
            },
        )
        .unwrap()
        .next
        .expect("a full page of one has a next")
}

conformance! {
    the_audit_is_read_a_page_at_a_time_past_its_newest_limit,
    an_audit_read_writes_waiting_counters_first,
    counters_are_written_once_their_minute_has_passed,
    a_counted_request_never_writes_and_maintenance_writes_the_minute,
    callers_read_their_own_audit_and_admins_everyones,
    reads_hide_expired_rows_and_retention_deletes_them_in_batches,
    a_counter_costs_one_row_and_retention_deletes_quiet_counters,
    a_counter_that_recurs_daily_overwrites_yesterdays_row,
    #[ignore = "long: run by .ci/run"]
    a_counter_that_recurs_every_minute_overwrites_yesterdays_row,
}
