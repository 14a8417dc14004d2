//! The meter agrees across backends: a commit that wrote no row is no
//! write transaction, and creating the schema is one.

use tessera_store::{Grant, StoreConfig};

use crate::harness::{Fixture, TestDb, namespace, queue};

/// A new database's schema is written in one metered transaction;
/// opening it again writes nothing.
fn creating_the_schema_is_one_metered_write_transaction(db: &TestDb) {
    let store = db.open(StoreConfig::default());
    let created = store.meter();
    assert_eq!(created.write_transactions, 1, "{created:?}");
    assert!(created.rows_written >= 1, "{created:?}");
    assert_eq!(created.refused_writes, 0);
    drop(store);

    let store = db.open(StoreConfig::default());
    let reopened = store.meter();
    assert_eq!(
        (reopened.rows_written, reopened.write_transactions),
        (0, 0),
        "{reopened:?}"
    );
}

/// A key's first claim on an empty queue, and every one after it, writes
/// no row and counts no write transaction.
fn an_empty_claim_counts_no_write_transaction(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("farm"), queue("frames"));
    let before = db.table_snapshot();
    for _ in 0..3 {
        let (outcome, cost) = f.store.measure(|s| s.claim(&worker, &ns, &q).unwrap());
        assert!(outcome.retry_after().is_some(), "the queue is empty");
        assert_eq!(
            (cost.rows_written, cost.write_transactions),
            (0, 0),
            "{cost:?}"
        );
    }
    assert_eq!(db.table_snapshot(), before);
    // A claim that takes a task does write, and is counted.
    f.enqueue(&worker, &ns, &q, 1);
    let (_, cost) = f.store.measure(|s| s.claim(&worker, &ns, &q).unwrap());
    assert_eq!(cost.write_transactions, 1, "{cost:?}");
    assert!(cost.rows_written > 0, "{cost:?}");
}

conformance! {
    creating_the_schema_is_one_metered_write_transaction,
    an_empty_claim_counts_no_write_transaction,
}
