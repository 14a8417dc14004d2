//! Opening a database: what every backend does, new or up to date. (What
//! opening does to SQLite files, foreign or damaged ones included, is in
//! `tests/sqlite/cold_start.rs`.)

use tessera_store::StoreConfig;

use crate::harness::TestDb;

fn a_new_database_while_writes_are_refused_is_a_quota_refusal(db: &TestDb) {
    let error = db
        .open_result(StoreConfig::default().with_refuse_writes(true))
        .unwrap_err();
    assert_eq!(error.code(), "storage_quota_exhausted");
    assert_eq!(error.status(), 503);
    assert!(error.reset_at().is_some());
}

/// An up-to-date schema needs no write: the database opens while every
/// write is refused, and not one row changes.
fn reopening_an_up_to_date_database_writes_nothing(db: &TestDb) {
    drop(db.open(StoreConfig::default()));
    let before = db.table_snapshot();
    let store = db.open(StoreConfig::default().with_refuse_writes(true));
    if db.meters_rows() {
        let meter = store.meter();
        assert_eq!(meter.rows_written, 0);
        assert_eq!(meter.write_transactions, 0);
        assert_eq!(meter.refused_writes, 0);
    }
    drop(store);
    drop(db.open(StoreConfig::default()));
    assert_eq!(db.table_snapshot(), before);
}

conformance! {
    a_new_database_while_writes_are_refused_is_a_quota_refusal,
    reopening_an_up_to_date_database_writes_nothing,
}
