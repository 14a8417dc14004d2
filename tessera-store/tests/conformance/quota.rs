//! Storage quota refusals from a provider refusing every write. (SQLite's
//! page cap, the daily allowance and host classifiers are in
//! `tests/sqlite/`.)

use tessera_store::{Action, AuditQuery, Grant, KeyFilter, KeySpec, Scope};

use crate::harness::{Fixture, TestDb, assert_quota, midnight, namespace};

fn reads_answer_while_every_write_is_refused(db: &TestDb) {
    let f = Fixture::new(db);
    let key = f.worker(Grant::Namespace(namespace("renders")));
    let worker = f.login(&key);
    f.store.refuse_writes(true);
    assert!(f.store.is_refusing_writes());
    let before = f.store.meter();

    // Authentication, authorization, listing and audit reads answer.
    let again = f.store.authenticate(Some(key.secret.expose())).unwrap();
    assert_eq!(again.principal(), worker.principal());
    f.store
        .authorize(&again, &namespace("renders"), Scope::Read, Action::ReadTask)
        .unwrap();
    assert_eq!(
        f.store
            .list_keys(&worker, &KeyFilter::default())
            .unwrap()
            .len(),
        1
    );
    let page = f.store.audit(&f.admin, &AuditQuery::default()).unwrap();
    assert!(!page.events.is_empty());

    // Writes are refused with the next UTC midnight, and leave nothing.
    let error = f
        .store
        .create_key(&f.admin, &KeySpec::keyed("acme"))
        .unwrap_err();
    assert_quota(&error, midnight());
    let error = f.store.revoke_key(&f.admin, worker.key_id()).unwrap_err();
    assert_quota(&error, midnight());
    assert!(f.store.authenticate(Some(key.secret.expose())).is_ok());

    if db.meters_rows() {
        let cost = f.store.meter().since(&before);
        assert_eq!(cost.rows_written, 0);
        assert!(cost.refused_writes >= 2);
    }

    // Nothing was reset or deleted to get around it: once the provider
    // accepts writes again, everything is as it was.
    f.store.refuse_writes(false);
    assert_eq!(
        f.store
            .list_keys(&f.admin, &KeyFilter::default())
            .unwrap()
            .len(),
        2
    );
    f.store.revoke_key(&f.admin, worker.key_id()).unwrap();
}

fn strict_read_audit_fails_reads_whose_audit_row_is_refused(db: &TestDb) {
    let f = Fixture::with(db, |config| config.with_strict_read_audit(true));
    f.store.refuse_writes(true);
    let error = f
        .store
        .list_keys(&f.admin, &KeyFilter::default())
        .unwrap_err();
    assert!(error.is_quota_exhausted());
}

conformance! {
    reads_answer_while_every_write_is_refused,
    strict_read_audit_fails_reads_whose_audit_row_is_refused,
}
