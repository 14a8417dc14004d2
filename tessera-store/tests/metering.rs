//! Rows written and read per operation, measured by the store itself.

mod common;

use std::time::Duration;

use common::Fixture;
use tessera_store::{AuditQuery, Grant, KeyFilter, KeySpec, MeterSnapshot, Store};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_store_is_shared_between_threads() {
    assert_send_sync::<Store>();
}

#[test]
fn an_unauthenticated_request_and_a_repeated_read_write_nothing_but_the_audit_row() {
    let f = Fixture::new();
    let key = f.worker(Grant::AllNamespaces);

    let (_, unauthenticated) = f.store.measure(|s| s.authenticate(Some("tsk_unknown")));
    assert_eq!(unauthenticated.rows_written, 0);
    assert_eq!(unauthenticated.write_transactions, 0);

    // First keyed read: the coalesced last_used_at (1 row) and the read's
    // audit row (its row and two index entries).
    let (_, first) = f.store.measure(|s| {
        let caller = s.authenticate(Some(key.secret.expose())).unwrap();
        s.list_keys(&caller, &KeyFilter::default()).unwrap()
    });
    assert_eq!(first.rows_written, 1 + 3);
    // The same read within the observation interval: only the audit row.
    f.clock.advance(Duration::from_secs(30));
    let (_, repeated) = f.store.measure(|s| {
        let caller = s.authenticate(Some(key.secret.expose())).unwrap();
        s.list_keys(&caller, &KeyFilter::default()).unwrap()
    });
    assert_eq!(repeated.rows_written, 3);
    // Key lookup (one row) and the listing (one key).
    assert_eq!(repeated.rows_read, 2);
    // Key resolution alone writes nothing within the interval.
    let (_, resolution) = f
        .store
        .measure(|s| s.authenticate(Some(key.secret.expose())));
    assert_eq!(resolution.rows_written, 0);
    assert_eq!(resolution.rows_read, 1);
}

/// The cost of each foundation operation, as the store counts it. Run with
/// `--nocapture` to print the table.
#[test]
fn cost_table() {
    let f = Fixture::new();
    let mut table: Vec<(&str, MeterSnapshot)> = Vec::new();

    let (issued, cost) = f.store.measure(|s| {
        s.create_key(
            &f.admin,
            &KeySpec::keyed("acme").with_grant(Grant::AllNamespaces),
        )
        .unwrap()
    });
    // Principal (row + purge index), key (row + 3 indexes), audit (row + 2).
    assert_eq!(cost.rows_written, 2 + 4 + 3);
    table.push(("create key, new principal", cost));

    let (caller, cost) = f
        .store
        .measure(|s| s.authenticate(Some(issued.secret.expose())).unwrap());
    assert_eq!(cost.rows_written, 1);
    table.push(("authenticate, first in interval", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.authenticate(Some(issued.secret.expose())).unwrap());
    assert_eq!(cost.rows_written, 0);
    table.push(("authenticate, repeated", cost));

    let (_, cost) = f.store.measure(|s| s.authenticate(None));
    assert_eq!(cost, MeterSnapshot::default());
    table.push(("authenticate, missing key", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.list_keys(&caller, &KeyFilter::default()).unwrap());
    assert_eq!(cost.rows_written, 3);
    table.push(("list own keys", cost));

    let (_, cost) = f.store.measure(|s| {
        s.expire_key(&f.admin, caller.key_id(), common::noon())
            .unwrap()
    });
    // expires_at is in no index: the key row and the audit row.
    assert_eq!(cost.rows_written, 1 + 3);
    table.push(("expire key", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.revoke_key(&f.admin, caller.key_id()).unwrap());
    assert_eq!(cost.rows_written, 1 + 3);
    table.push(("revoke key", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.revoke_key(&f.admin, caller.key_id()).unwrap());
    assert_eq!(cost.rows_written, 0);
    table.push(("revoke key again (no-op)", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.audit(&f.admin, &AuditQuery::default()).unwrap());
    // Two waiting counters (the missing key, the no-op revocation), each a
    // new row with two index entries, then the read's audit row.
    assert_eq!(cost.rows_written, 2 * 3 + 3);
    table.push(("admin audit read, two counters waiting", cost));

    println!("| operation | rows written | rows read |");
    println!("| --- | ---: | ---: |");
    for (name, cost) in table {
        println!("| {name} | {} | {} |", cost.rows_written, cost.rows_read);
    }
}
