//! Transactions per operation, as the server counts them
//! (`pg_stat_database.xact_commit`), on a database of the test's own.
//!
//! A session reports its counts to the server's statistics when it ends,
//! so each figure is taken between stores: a store opens, works and
//! closes, and the test waits until no session is left on the database
//! before it reads the count. Opening a store, resolving a key and the
//! upkeep after a store's first write cost the same in every run, so a
//! run's transactions minus those of a run that did one operation are
//! the cost of the rest.

use std::sync::Arc;
use std::time::Duration;

use postgres::{Client, NoTls};
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    Brief, Caller, Claimed, EnqueueOptions, Grant, IdempotencyKey, IssuedKey, KeySpec, ManualClock,
    Namespace, Output, QueueName, Scope, Store, StoreConfig, SubmitRequest, Submitted,
};

use crate::harness::{namespace, noon, queue};

/// A database of its own on the test server, dropped at the end.
struct OwnDatabase {
    admin: Client,
    name: String,
    url: String,
}

impl OwnDatabase {
    fn create(server: &str) -> Self {
        let mut admin = Client::connect(server, NoTls).unwrap();
        let name = format!("tessera_xact_{}", std::process::id());
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let (base, _) = server.rsplit_once('/').expect("a URL names its database");
        Self {
            admin,
            url: format!("{base}/{name}"),
            name,
        }
    }

    /// Transactions committed on the database, once every session on it
    /// has ended and reported them.
    fn commits(&mut self) -> i64 {
        loop {
            let open: i64 = self
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[&self.name],
                )
                .unwrap()
                .get(0);
            if open == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // A session leaves pg_stat_activity before its exit has flushed
        // its counts: read until the count holds still.
        let mut last = self.xact_commit();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.xact_commit();
            if now == last {
                return now;
            }
            last = now;
        }
    }

    fn xact_commit(&mut self) -> i64 {
        self.admin
            .query_one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
                &[&self.name],
            )
            .unwrap()
            .get(0)
    }

    fn open(&self, clock: &ManualClock) -> Store {
        let options = PostgresOptions::new(self.url.as_str())
            .with_pool_size(1)
            .with_listen(false);
        let config = StoreConfig::default()
            .with_clock(Arc::new(clock.clone()))
            .with_lease_duration(Duration::from_secs(3600));
        Store::open_postgres(options, config).unwrap()
    }

    /// Turns autovacuum off for every table of the database, and vacuums
    /// the catalogs: the server counts an autovacuum or autoanalyze
    /// worker's transactions as the database's, whenever a table crosses
    /// its threshold.
    fn quiet_autovacuum(&self) {
        let mut client = Client::connect(&self.url, NoTls).unwrap();
        let tables: Vec<String> = client
            .query(
                "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) \
                 FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        for table in tables {
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} SET (autovacuum_enabled = false)"
                ))
                .unwrap();
        }
        // The system catalogs keep autovacuum; creating the schema left
        // them dead rows enough to start it in the middle of a count.
        // Vacuumed and analyzed now, they give it nothing to do.
        client.batch_execute("VACUUM ANALYZE").unwrap();
    }

    /// The transactions of one store's life: opened, `work`, closed.
    fn run(&mut self, clock: &ManualClock, work: impl FnOnce(&Store)) -> i64 {
        let before = self.commits();
        let store = self.open(clock);
        work(&store);
        drop(store);
        self.commits() - before
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let _ = self.admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

fn login(store: &Store, key: &IssuedKey) -> Caller {
    store.authenticate(Some(key.secret.expose())).unwrap()
}

fn submit(store: &Store, caller: &Caller, lease: &Claimed) {
    let output = Output::bytes(lease.task.id.as_str());
    let submitted = store
        .submit(
            caller,
            &lease.task,
            lease.lease.token(),
            &IdempotencyKey::parse("k").unwrap(),
            &output,
        )
        .unwrap();
    assert!(matches!(submitted, Submitted::Accepted(_)));
}

fn claim(store: &Store, caller: &Caller, ns: &Namespace, q: &QueueName) -> Claimed {
    match store.claim(caller, ns, q).unwrap() {
        tessera_store::ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// One transaction per enqueue, claim, submit, failure report and
/// submission carrying a claim; one per batch however large (enqueue,
/// claim and submit batches). A claim
/// of a plain ready task is one statement outside a transaction block;
/// one the statement declines costs its transaction and the general
/// claim's.
///
/// The server's autovacuum launcher sends a worker to every database
/// once per `autovacuum_naptime` (a minute by default), whether or not a
/// table needs it, and the worker's own transactions count as the
/// database's. One landing inside a count adds to it, so the scenario
/// runs again on a fresh database, up to three times in all; a count
/// that is wrong every time fails. (With `autovacuum_naptime = 1` every
/// attempt is hit, and the test fails.)
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn each_operation_and_each_batch_is_one_transaction() {
    let server = std::env::var("TESSERA_TEST_POSTGRES_URL").expect("TESSERA_TEST_POSTGRES_URL");
    let mut misses = Vec::new();
    for _ in 0..3 {
        match counts_per_operation(&server) {
            Ok(()) => return,
            Err(miss) => misses.push(miss),
        }
    }
    panic!("every attempt counted wrong: {misses:#?}");
}

/// `Err` names the first count that differs from the expected one.
fn same(counted: i64, expected: i64, what: &str) -> Result<(), String> {
    if counted == expected {
        Ok(())
    } else {
        Err(format!("{what}: counted {counted}, expected {expected}"))
    }
}

fn counts_per_operation(server: &str) -> Result<(), String> {
    const K: usize = 20;
    let mut db = OwnDatabase::create(server);
    let clock = ManualClock::new(noon());
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let brief = || Brief::Bytes(b"frame".to_vec());

    // Setting up: a worker key, and tasks to claim and submit.
    let mut worker_key = None;
    db.run(&clock, |store| {
        let admin = login(store, &store.create_admin_key("ops").unwrap());
        let key = store
            .create_key(
                &admin,
                &KeySpec::keyed("acme")
                    .with_scopes(Scope::ALL.iter().copied())
                    .with_grant(Grant::Namespace(ns.clone())),
            )
            .unwrap();
        let worker = login(store, &key);
        store
            .enqueue(&worker, &ns, &q, &brief(), &EnqueueOptions::default())
            .unwrap();
        worker_key = Some(key);
    });
    let key = worker_key.unwrap();
    db.quiet_autovacuum();
    let enqueue = |store: &Store, n: usize| {
        let worker = login(store, &key);
        for _ in 0..n {
            store
                .enqueue(&worker, &ns, &q, &brief(), &EnqueueOptions::default())
                .unwrap();
        }
    };

    // Enqueues: one transaction each; a batch of K, one.
    let one = db.run(&clock, |store| enqueue(store, 1));
    let many = db.run(&clock, |store| enqueue(store, 1 + K));
    same(many - one, K as i64, "one transaction per enqueue")?;
    let batch = db.run(&clock, |store| {
        let worker = login(store, &key);
        let tasks = vec![(brief(), EnqueueOptions::default()); K];
        store.enqueue_batch(&worker, &ns, &q, &tasks).unwrap();
    });
    same(batch, one, "a batch enqueue is one transaction")?;

    // Claims: one each; a batch of K, one. A store's first claim carries
    // its key's `last_used_at`, which the general claim writes; the next
    // prepares the one-statement claim on its connection, which the
    // server counts as a transaction of its own, once per connection.
    db.run(&clock, |store| enqueue(store, 3));
    let one = db.run(&clock, |store| {
        claim(store, &login(store, &key), &ns, &q);
    });
    let two = db.run(&clock, |store| {
        let worker = login(store, &key);
        claim(store, &worker, &ns, &q);
        claim(store, &worker, &ns, &q);
    });
    same(two - one, 2, "a claim, and its statement prepared")?;
    let many = db.run(&clock, |store| {
        let worker = login(store, &key);
        for _ in 0..K + 2 {
            claim(store, &worker, &ns, &q);
        }
    });
    same(many - two, K as i64, "one transaction per claim")?;
    // A claim the one statement declines (a task of two competing
    // attempts is the general claim's): the statement's transaction,
    // which writes nothing, then the lease transaction; the first claim
    // is the general one, the statement prepared once.
    let pairs = queue("pairs");
    db.run(&clock, |store| {
        let worker = login(store, &key);
        let two = EnqueueOptions::default().with_alternatives(2);
        for _ in 0..=K {
            store.enqueue(&worker, &ns, &pairs, &brief(), &two).unwrap();
        }
    });
    let declined = db.run(&clock, |store| {
        let worker = login(store, &key);
        for _ in 0..=K {
            claim(store, &worker, &ns, &pairs);
        }
    });
    same(
        declined - one,
        1 + 2 * K as i64,
        "two transactions per claim the statement declines",
    )?;
    let batch = db.run(&clock, |store| {
        let worker = login(store, &key);
        assert_eq!(
            store
                .claim_batch(&worker, &ns, &q, K)
                .unwrap()
                .claimed
                .len(),
            K
        );
    });
    same(batch, one, "a batch claim is one transaction")?;

    // Submits: one each; a batch of K, one. Leases for them first.
    let mut leases = Vec::new();
    db.run(&clock, |store| {
        let worker = login(store, &key);
        let tasks = vec![(brief(), EnqueueOptions::default()); 3 * K];
        store.enqueue_batch(&worker, &ns, &q, &tasks).unwrap();
        for _ in 0..3 {
            leases.extend(store.claim_batch(&worker, &ns, &q, K).unwrap().claimed);
        }
    });
    let (singles, rest) = leases.split_at(K + 1);
    let (batched, last) = rest.split_at(K);
    let one = db.run(&clock, |store| submit(store, &login(store, &key), &last[0]));
    let many = db.run(&clock, |store| {
        let worker = login(store, &key);
        for lease in singles {
            submit(store, &worker, lease);
        }
    });
    same(many - one, K as i64, "one transaction per submit")?;
    let batch = db.run(&clock, |store| {
        let worker = login(store, &key);
        let requests: Vec<SubmitRequest> = batched
            .iter()
            .map(|lease| SubmitRequest {
                task: lease.task.clone(),
                token: lease.lease.token(),
                key: IdempotencyKey::parse("k").unwrap(),
                output: Output::bytes(lease.task.id.as_str()),
            })
            .collect();
        let answers = store.submit_batch(&worker, &requests).unwrap();
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Ok(Submitted::Accepted(_))))
        );
    });
    same(batch, one, "a batch of submissions is one transaction")?;

    // Submissions that carry the next claim: one transaction each. A
    // store's first one is the general transaction (it carries the key's
    // `last_used_at`); the next prepares the one statement, once per
    // connection, as the claim's does.
    let carried = queue("carried");
    let mut held = Vec::new();
    db.run(&clock, |store| {
        let worker = login(store, &key);
        let tasks = vec![(brief(), EnqueueOptions::default()); 2 * K + 10];
        store.enqueue_batch(&worker, &ns, &carried, &tasks).unwrap();
        for _ in 0..3 {
            held.push(claim(store, &worker, &ns, &carried));
        }
    });
    let chain = |store: &Store, first: &Claimed, n: usize| {
        let worker = login(store, &key);
        let mut lease = first.clone();
        for _ in 0..n {
            let request = SubmitRequest {
                task: lease.task.clone(),
                token: lease.lease.token(),
                key: IdempotencyKey::parse("k").unwrap(),
                output: Output::bytes(lease.task.id.as_str()),
            };
            let (submitted, next) = store
                .submit_and_claim(&worker, &request, &ns, &carried)
                .unwrap();
            assert!(matches!(submitted, Submitted::Accepted(_)));
            lease = match next.unwrap() {
                tessera_store::ClaimOutcome::Granted(next) => next,
                other => panic!("expected a lease, got {other:?}"),
            };
        }
    };
    let one = db.run(&clock, |store| chain(store, &held[0], 1));
    let two = db.run(&clock, |store| chain(store, &held[1], 2));
    same(
        two - one,
        2,
        "a submission carrying a claim, and its statement prepared",
    )?;
    let many = db.run(&clock, |store| chain(store, &held[2], K + 2));
    same(
        many - two,
        K as i64,
        "one transaction per submission carrying a claim",
    )
}
