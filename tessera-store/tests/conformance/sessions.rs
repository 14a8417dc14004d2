//! Anonymous sessions: mint limits per address group and overall, the
//! durable per-address quota, what a mint writes, and the namespace made on
//! first use.

use std::net::IpAddr;
use std::sync::Arc;

use tessera_store::limits::PRACTICE_QUEUE;
use tessera_store::{ClaimOutcome, ManualClock, MintConfig, PrincipalKind, Secret, StoreConfig};

use crate::harness::{Fixture, TestDb, namespace, noon, queue};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn secret() -> Secret {
    Secret::new(*b"tessera-test-address-secret-0001").unwrap()
}

fn ipv6_rotation_inside_one_64_shares_one_limit(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_address_secret(secret()));
    for n in 1..=10 {
        f.store
            .mint_session(ip(&format!("2001:db8:0:1::{n:x}")))
            .unwrap();
    }
    let refused = f
        .store
        .mint_session(ip("2001:db8:0:1:ffff::7"))
        .unwrap_err();
    assert_eq!((refused.status(), refused.code()), (429, "rate_limited"));
    assert!(refused.to_string().contains("address"), "{refused}");
    assert!(refused.retry_after().unwrap().as_secs() >= 1);
    // The neighbouring /64 is another group.
    f.store.mint_session(ip("2001:db8:0:2::1")).unwrap();
    // IPv4 and its mapped form are one group.
    for _ in 0..10 {
        f.store.mint_session(ip("192.0.2.7")).unwrap();
    }
    assert_eq!(
        f.store
            .mint_session(ip("::ffff:192.0.2.7"))
            .unwrap_err()
            .status(),
        429
    );
}

fn the_global_allowance_refuses_with_the_time_until_the_next_session(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config.with_address_secret(secret()).with_mint(MintConfig {
            per_hour: 20,
            ..MintConfig::default()
        })
    });
    // A tenth at once, then the other 18 evenly: one every 200 s.
    f.store.mint_session(ip("192.0.2.1")).unwrap();
    f.store.mint_session(ip("192.0.2.2")).unwrap();
    let refused = f.store.mint_session(ip("192.0.2.3")).unwrap_err();
    assert_eq!(refused.status(), 429);
    let wait = refused.retry_after().unwrap();
    assert_eq!(wait.as_secs(), 200);
    f.clock.advance(wait);
    f.store.mint_session(ip("192.0.2.3")).unwrap();
}

fn the_per_address_quota_is_durable_across_a_restart(db: &TestDb) {
    let clock = ManualClock::new(noon());
    let open = || {
        db.open(
            StoreConfig::default()
                .with_clock(Arc::new(clock.clone()))
                .with_address_secret(secret()),
        )
    };
    let store = open();
    for _ in 0..10 {
        store.mint_session(ip("198.51.100.9")).unwrap();
    }
    drop(store);
    // A new process: the in-memory allowance is fresh, the row is not.
    let store = open();
    let refused = store.mint_session(ip("198.51.100.9")).unwrap_err();
    assert_eq!(refused.status(), 429);
    store.mint_session(ip("198.51.100.10")).unwrap();
}

fn a_minted_session_writes_only_its_principal_key_limit_and_audit_rows(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_address_secret(secret()));
    let (session, cost) = f
        .store
        .measure(|s| s.mint_session(ip("203.0.113.5")).unwrap());
    if db.meters_rows() {
        // Principal (row + purge index), key (row + 3 indexes), limit (row
        // + 2 indexes), audit (row + principal index); no namespace, no
        // task.
        assert_eq!(cost.rows_written, 2 + 4 + 3 + 2);
        assert_eq!(cost.write_transactions, 1);
    }
    assert_eq!(session.expires_at, noon() + chrono::TimeDelta::hours(24));
    // The same address again only counts on its limit row.
    let (_, cost) = f
        .store
        .measure(|s| s.mint_session(ip("203.0.113.5")).unwrap());
    if db.meters_rows() {
        assert_eq!(cost.rows_written, 2 + 4 + 1 + 2);
    }

    // The session's first claim creates its namespace with practice tasks.
    let caller = f
        .store
        .authenticate(Some(session.key.secret.expose()))
        .unwrap();
    assert_eq!(caller.kind(), PrincipalKind::Anonymous);
    let health = f.store.health(&caller, &session.namespace).unwrap();
    assert_eq!(
        health.attempts.total(),
        0,
        "nothing exists before first use"
    );
    let outcome = f
        .store
        .claim(&caller, &session.namespace, &queue(PRACTICE_QUEUE))
        .unwrap();
    let ClaimOutcome::Granted(claimed) = outcome else {
        panic!("the first claim finds a practice task");
    };
    assert_eq!(claimed.task.id.as_str(), "practice-1");
    let health = f.store.health(&caller, &session.namespace).unwrap();
    assert_eq!(health.attempts.total(), 3);
    // Another namespace is not the session's.
    let error = f
        .store
        .claim(&caller, &namespace("renders"), &queue("jobs"))
        .unwrap_err();
    assert_eq!(error.status(), 403);

    // The mint's audit row carries the hashed address, never the address.
    let page = f
        .store
        .audit(&f.admin, &tessera_store::AuditQuery::default())
        .unwrap();
    let mint = page
        .events
        .iter()
        .find(|e| e.action.as_str() == "mint_session")
        .unwrap();
    let hash = mint.ip_hash.as_ref().unwrap();
    assert_eq!(hash, &f.store.hash_address(ip("203.0.113.5")).unwrap());
    assert!(!hash.as_str().contains("203.0.113.5"));
}

fn a_generated_address_secret_is_kept_once(db: &TestDb) {
    let f = Fixture::new(db);
    let (first, cost) = f
        .store
        .measure(|s| s.hash_address(ip("192.0.2.1")).unwrap());
    if db.meters_rows() {
        // The marker row and its primary key entry.
        assert_eq!(cost.rows_written, 2);
    }
    let (again, cost) = f
        .store
        .measure(|s| s.hash_address(ip("192.0.2.1")).unwrap());
    assert_eq!(first, again);
    if db.meters_rows() {
        assert_eq!((cost.rows_written, cost.rows_read), (0, 0));
    }
    // Reopened, the store hashes with the same secret.
    let reopened = db.open(StoreConfig::default().with_clock(Arc::new(f.clock.clone())));
    assert_eq!(
        reopened.hash_address(ip("192.0.2.1")).unwrap(),
        f.store.hash_address(ip("192.0.2.1")).unwrap()
    );
}

/// Past its lifetime a session's key stops working at once, and retention
/// deletes its principal, key and per-address limit row; keyed principals
/// stay.
fn retention_purges_a_session_past_its_lifetime_and_keeps_keyed_principals(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config
            .with_address_secret(secret())
            .with_session_lifetime(std::time::Duration::from_secs(3600))
    });
    let session = f.store.mint_session(ip("203.0.113.7")).unwrap();
    assert!(
        f.store
            .authenticate(Some(session.key.secret.expose()))
            .is_ok()
    );
    assert_eq!(db.count_rows("access_principals"), 2);
    assert_eq!(db.count_rows("access_limits"), 1);

    f.clock.advance(std::time::Duration::from_secs(2 * 3600));
    // Its key stops at its purge time, before retention runs.
    assert!(
        f.store
            .authenticate(Some(session.key.secret.expose()))
            .is_err()
    );
    let report = f.store.maintain().unwrap();
    assert!(report.retention_ran);
    assert_eq!(
        report.rows_deleted, 3,
        "principal, key and limit row: {report:?}"
    );
    assert_eq!(db.count_rows("access_principals"), 1, "the admin stays");
    assert_eq!(db.count_rows("access_keys"), 1);
    assert_eq!(db.count_rows("access_limits"), 0);
    assert!(
        f.store
            .authenticate(Some(f.admin_key.secret.expose()))
            .is_ok()
    );
}

/// A used session's namespace, its practice tasks, their attempts and
/// receipts go with the session, in batches; a keyed namespace stays.
fn retention_purges_what_a_session_made_and_keeps_keyed_namespaces(db: &TestDb) {
    let f = Fixture::with(db, |config| {
        config
            .with_address_secret(secret())
            .with_session_lifetime(std::time::Duration::from_secs(3600))
    });
    let keyed = f.login(&f.full_worker(tessera_store::Grant::Namespace(namespace("renders"))));
    f.enqueue(&keyed, &namespace("renders"), &queue("jobs"), 2);
    let session = f.store.mint_session(ip("203.0.113.9")).unwrap();
    let caller = f
        .store
        .authenticate(Some(session.key.secret.expose()))
        .unwrap();
    let practice = queue(PRACTICE_QUEUE);
    let ClaimOutcome::Granted(claimed) = f
        .store
        .claim(&caller, &session.namespace, &practice)
        .unwrap()
    else {
        panic!("a practice task");
    };
    let output = tessera_store::Output::bytes("done");
    let key = tessera_store::IdempotencyKey::parse("practice").unwrap();
    let submitted = f
        .store
        .submit(&caller, &claimed.task, claimed.lease.token(), &key, &output)
        .unwrap();
    assert!(matches!(submitted, tessera_store::Submitted::Accepted(_)));
    assert_eq!(db.count_rows("namespaces"), 2);
    assert_eq!(db.count_rows("tasks"), 2 + 3);
    assert_eq!(db.count_receipts(), 1);

    f.clock.advance(std::time::Duration::from_secs(2 * 3600));
    let report = f.store.maintain().unwrap();
    assert!(report.retention_ran);
    assert_eq!(db.count_rows("namespaces"), 1, "the keyed namespace stays");
    assert_eq!(db.count_rows("tasks"), 2);
    assert_eq!(db.count_rows("attempts"), 2);
    assert_eq!(db.count_receipts(), 0);
    // The keyed namespace's tasks are untouched, and its health too.
    let health = f.store.health(&keyed, &namespace("renders")).unwrap();
    assert_eq!(health.attempts.ready, 2);
    // A purge with nothing left to purge deletes nothing more.
    f.clock.advance(std::time::Duration::from_secs(600));
    let again = f.store.maintain().unwrap();
    assert!(again.retention_ran);
    assert_eq!(db.count_rows("namespaces"), 1);
    assert_eq!(db.count_rows("tasks"), 2);
}

conformance! {
    retention_purges_what_a_session_made_and_keeps_keyed_namespaces,
    retention_purges_a_session_past_its_lifetime_and_keeps_keyed_principals,
    ipv6_rotation_inside_one_64_shares_one_limit,
    the_global_allowance_refuses_with_the_time_until_the_next_session,
    the_per_address_quota_is_durable_across_a_restart,
    a_minted_session_writes_only_its_principal_key_limit_and_audit_rows,
    a_generated_address_secret_is_kept_once,
}
