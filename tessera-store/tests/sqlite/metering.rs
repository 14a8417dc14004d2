//! Rows written and read per operation, measured by the store itself:
//! SQLite meters rows, and these tests are about nothing else.

use std::time::Duration;

use tessera_store::{AuditQuery, Grant, KeyFilter, KeySpec, MeterSnapshot, Store};

use crate::harness::{Fixture, TestDb, json_brief, namespace, noon, queue};

/// The rows of one audit row: its row and its `access_audit_principal`
/// entry (the table's own row ids keep it in time order).
const AUDIT: u64 = 2;

#[test]
fn an_unauthenticated_request_and_a_repeated_read_write_nothing_but_the_audit_row() {
    let db = TestDb::sqlite();
    let f = Fixture::new(&db);
    let key = f.worker(Grant::AllNamespaces);

    let (_, unauthenticated) = f.store.measure(|s| s.authenticate(Some("tsk_unknown")));
    assert_eq!(unauthenticated.rows_written, 0);
    assert_eq!(unauthenticated.write_transactions, 0);

    // First keyed read: the coalesced last_used_at (1 row) and the read's
    // audit row (its row and its principal index entry).
    let (_, first) = f.store.measure(|s| {
        let caller = s.authenticate(Some(key.secret.expose())).unwrap();
        s.list_keys(&caller, &KeyFilter::default()).unwrap()
    });
    assert_eq!(first.rows_written, 1 + AUDIT);
    // The same read within the observation interval: only the audit row.
    f.clock.advance(Duration::from_secs(30));
    let (_, repeated) = f.store.measure(|s| {
        let caller = s.authenticate(Some(key.secret.expose())).unwrap();
        s.list_keys(&caller, &KeyFilter::default()).unwrap()
    });
    assert_eq!(repeated.rows_written, AUDIT);
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
    let db = TestDb::sqlite();
    let f = Fixture::new(&db);
    let mut table: Vec<(&str, MeterSnapshot)> = Vec::new();

    let (issued, cost) = f.store.measure(|s| {
        s.create_key(
            &f.admin,
            &KeySpec::keyed("acme").with_grant(Grant::AllNamespaces),
        )
        .unwrap()
    });
    // Principal (row + purge index), key (row + 3 indexes), audit,
    // and the admin's first last_used_at, carried by its first audited
    // action.
    assert_eq!(cost.rows_written, 2 + 4 + AUDIT + 1);
    table.push(("create key, new principal", cost));

    // The observation rides with the next audited action instead.
    let (caller, cost) = f
        .store
        .measure(|s| s.authenticate(Some(issued.secret.expose())).unwrap());
    assert_eq!(cost.rows_written, 0);
    table.push(("authenticate, first in interval", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.authenticate(Some(issued.secret.expose())).unwrap());
    assert_eq!(cost.rows_written, 0);
    table.push(("authenticate, repeated", cost));

    let (_, cost) = f.store.measure(|s| s.authenticate(None));
    assert_eq!(cost, MeterSnapshot::default());
    table.push(("authenticate, missing key", cost));

    // Its audit row and the key's first last_used_at.
    let (_, cost) = f
        .store
        .measure(|s| s.list_keys(&caller, &KeyFilter::default()).unwrap());
    assert_eq!(cost.rows_written, AUDIT + 1);
    table.push(("list own keys, first audited action", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.expire_key(&f.admin, caller.key_id(), noon()).unwrap());
    // expires_at is in no index: the key row and the audit row.
    assert_eq!(cost.rows_written, 1 + AUDIT);
    table.push(("expire key", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.revoke_key(&f.admin, caller.key_id()).unwrap());
    assert_eq!(cost.rows_written, 1 + AUDIT);
    table.push(("revoke key", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.revoke_key(&f.admin, caller.key_id()).unwrap());
    assert_eq!(cost.rows_written, 0);
    table.push(("revoke key again (no-op)", cost));

    let (_, cost) = f
        .store
        .measure(|s| s.audit(&f.admin, &AuditQuery::default()).unwrap());
    // Two waiting counters (the missing key, the no-op revocation), each
    // one row of the clustered counter table and no index entry, then the
    // read's audit row.
    assert_eq!(cost.rows_written, 2 + AUDIT);
    table.push(("admin audit read, two counters waiting", cost));

    println!("| operation | rows written | rows read |");
    println!("| --- | ---: | ---: |");
    for (name, cost) in table {
        println!("| {name} | {} | {} |", cost.rows_written, cost.rows_read);
    }
}

/// Rows written and read per work-queue request, measured by the store's
/// meter with warm caches (each key's `last_used_at` already carried by an
/// earlier audited action). Run with `--nocapture` to print the table.
#[test]
fn operation_cost_table() {
    use std::net::IpAddr;
    use tessera_store::{
        ClaimOutcome, EnqueueOptions, IdempotencyKey, Output, QueueName, Retry, Secret,
    };

    let db = TestDb::sqlite();
    let f = Fixture::with(&db, |config| {
        config.with_address_secret(Secret::new(*b"tessera-cost-table-secret-000001").unwrap())
    });
    let key = f.full_worker(Grant::AllNamespaces);
    let worker = f.store.authenticate(Some(key.secret.expose())).unwrap();
    f.store.list_keys(&worker, &KeyFilter::default()).unwrap();
    let ns = namespace("renders");
    let jobs = QueueName::parse("jobs").unwrap();
    let brief = json_brief(0);
    let mut table: Vec<(&str, MeterSnapshot)> = Vec::new();
    let mut row = |name, cost: MeterSnapshot, written: u64| {
        assert_eq!(cost.rows_written, written, "{name}: {cost:?}");
        table.push((name, cost));
    };

    let enqueue = |s: &Store| {
        s.enqueue(&worker, &ns, &jobs, &brief, &EnqueueOptions::default())
            .unwrap()
    };
    // Namespace row (+ name and purge indexes: the meter counts every
    // index of an inserted row, a partial one included) on first use, then
    // task (+ 2 indexes),
    // attempt (+ 4 indexes: task, state, lapsing, changed), audit (+
    // principal index).
    let (_, cost) = f.store.measure(enqueue);
    row("enqueue, first in a namespace", cost, 3 + 3 + 5 + AUDIT);
    let (task, cost) = f.store.measure(enqueue);
    row("enqueue", cost, 3 + 5 + AUDIT);

    // Task (token and claim time: row + claim index), attempt (row + state,
    // lease and changed indexes), audit.
    let (claimed, cost) = f
        .store
        .measure(|s| match s.claim(&worker, &ns, &jobs).unwrap() {
            ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("{other:?}"),
        });
    row("claim, granted", cost, 2 + 4 + AUDIT);
    let _ = task;

    // Attempt expiry (row + lease index), audit; the task row is not
    // touched, since a leased task is out of the claim index. (At the
    // claim's own instant the expiry would not move and only the audit row
    // would be written.)
    f.clock.advance(Duration::from_secs(20));
    let (_, cost) = f.store.measure(|s| {
        s.heartbeat(&worker, &claimed.task, claimed.lease.token())
            .unwrap()
    });
    row("heartbeat", cost, 2 + AUDIT);

    let output = Output::bytes("rendered");
    let submit_key = IdempotencyKey::parse("upload-1").unwrap();
    let submit = |s: &Store| {
        s.submit(
            &worker,
            &claimed.task,
            claimed.lease.token(),
            &submit_key,
            &output,
        )
        .unwrap()
    };
    // Attempt state with its receipt in one row write (row + state,
    // lease and changed indexes), audit; the task, out of the claim index
    // while leased, stays out.
    let (_, cost) = f.store.measure(submit);
    row("submit", cost, 4 + AUDIT);
    let (_, cost) = f.store.measure(submit);
    row("submit, replayed", cost, 0);

    let (_, cost) = f.store.measure(|s| {
        s.claim(&worker, &ns, &QueueName::parse("idle").unwrap())
            .unwrap()
    });
    row("claim, empty queue", cost, 0);

    let second = f.claim(&worker, &ns, &jobs);
    let (_, cost) = f.store.measure(|s| {
        s.fail(
            &worker,
            &second.task,
            second.lease.token(),
            Retry::After(Duration::from_secs(30)),
        )
        .unwrap()
    });
    // Attempt state (row + state, lease and changed indexes), the task
    // back in the claim index at the backoff's end (row + index), audit.
    row("fail with retry", cost, 4 + 2 + AUDIT);

    // The same however long it waits; here it times out at once.
    let (_, cost) = f.store.measure(|s| {
        s.wait_for_work(&worker, &ns, &jobs, Duration::ZERO)
            .unwrap()
    });
    row("long-poll", cost, AUDIT);

    // Not audited: an aggregate status read writes nothing.
    let (_, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    row("health, first", cost, 0);
    let (_, cost) = f.store.measure(|s| s.health(&worker, &ns).unwrap());
    assert_eq!(cost.rows_read, 0);
    row("health, repeated within 15 s", cost, 0);

    let (_, cost) = f
        .store
        .measure(|s| s.read_task(&worker, &claimed.task).unwrap());
    row("read task", cost, AUDIT);

    let address: IpAddr = "192.0.2.1".parse().unwrap();
    let (session, cost) = f.store.measure(|s| s.mint_session(address).unwrap());
    row("anonymous session minted", cost, 2 + 4 + 3 + AUDIT);
    let anonymous = f
        .store
        .authenticate(Some(session.key.secret.expose()))
        .unwrap();
    let practice = QueueName::parse(tessera_store::limits::PRACTICE_QUEUE).unwrap();
    let (_, cost) = f
        .store
        .measure(|s| s.claim(&anonymous, &session.namespace, &practice).unwrap());
    // Namespace row, three practice tasks with their attempts, the lease,
    // its audit row and the session's first last_used_at.
    row(
        "session's first claim",
        cost,
        3 + 3 * (3 + 5) + 2 + 4 + AUDIT + 1,
    );

    println!("| request | rows written | rows read |");
    println!("| --- | ---: | ---: |");
    for (name, cost) in table {
        println!("| {name} | {} | {} |", cost.rows_written, cost.rows_read);
    }
}

/// The health cache is the store's own; only the rows it reads show it.
#[test]
fn a_change_elsewhere_keeps_the_snapshot() {
    let db = TestDb::sqlite();
    let f = Fixture::new(&db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (a, b) = (namespace("a"), namespace("b"));
    f.enqueue(&worker, &a, &queue("q"), 1);
    f.store.health(&worker, &a).unwrap();
    f.enqueue(&worker, &b, &queue("q"), 1);
    let (_, cost) = f.store.measure(|s| s.health(&worker, &a).unwrap());
    assert_eq!(cost.rows_read, 0);
}
