//! What edges between tasks cost: a 1,000-task graph (999 tasks fanned
//! out, and one fan-in task after all of them) enqueued in one batch and
//! run by 4 worker threads sharing one `Worker`, beside the same 1,000
//! tasks without edges, on a SQLite file and on PostgreSQL; tasks per
//! second and the ratio, the median of the rounds.
//!
//! Run: `cargo run --release -p tessera-benches --bin dag -- [ROUNDS] [sqlite|postgres]`
//! (default 3 rounds, both backends). PostgreSQL is
//! `TESSERA_BENCH_POSTGRES_URL`, else `TESSERA_TEST_POSTGRES_URL`; it is
//! skipped when neither is set.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tessera_benches::{PostgresSchema, postgres_url, queue};
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    Brief, Caller, EnqueueOptions, Grant, IdempotencyKey, KeySpec, Namespace, Output, Scope, Store,
    StoreConfig, TaskId, TaskRef, Worker, WorkerNext, WorkerOptions,
};

/// Tasks in the graph: `FAN_OUT` independent ones and one after them all.
const TASKS: usize = 1_000;
const FAN_OUT: usize = TASKS - 1;
const THREADS: usize = 4;

fn namespace() -> Namespace {
    Namespace::parse("dag").unwrap()
}

/// A store and a key that may enqueue, claim and read in the namespace.
fn caller(store: &Store) -> Caller {
    let admin = store
        .authenticate(Some(
            store.create_admin_key("operators").unwrap().secret.expose(),
        ))
        .unwrap();
    let key = store
        .create_key(
            &admin,
            &KeySpec::keyed("bench")
                .with_scopes(Scope::ALL.iter().copied())
                .with_grant(Grant::Namespace(namespace())),
        )
        .unwrap();
    store.authenticate(Some(key.secret.expose())).unwrap()
}

/// Enqueues the 1,000 tasks, the last after the other 999 if `edges`, in
/// one batch, and runs them with 4 threads; tasks per second.
fn run(store: Arc<Store>, edges: bool) -> f64 {
    let caller = caller(&store);
    let ns = namespace();
    let q = queue("steps");
    let ids: Vec<TaskId> = (0..TASKS)
        .map(|n| TaskId::parse(&format!("step-{n}")).unwrap())
        .collect();
    let refs: Vec<TaskRef> = ids
        .iter()
        .map(|id| TaskRef::new(ns.clone(), id.clone(), tessera_store::BriefVersion::FIRST))
        .collect();
    let batch: Vec<(Brief, EnqueueOptions)> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            let mut options = EnqueueOptions::default().with_task_id(id.clone());
            if edges && n == FAN_OUT {
                options = options.after(refs[..FAN_OUT].iter().cloned());
            }
            (Brief::Bytes(format!("{n}").into_bytes()), options)
        })
        .collect();
    let started = Instant::now();
    store.enqueue_batch(&caller, &ns, &q, &batch).unwrap();
    let worker = Worker::new(
        store.clone(),
        caller.clone(),
        ns.clone(),
        q.clone(),
        WorkerOptions::default(),
    )
    .unwrap();
    let key = IdempotencyKey::parse("done").unwrap();
    thread::scope(|scope| {
        for _ in 0..THREADS {
            let (worker, key, store, caller, last) =
                (&worker, &key, &store, &caller, &refs[FAN_OUT]);
            scope.spawn(move || {
                loop {
                    match worker.next().unwrap() {
                        WorkerNext::Task(claimed) => {
                            let _ = worker.submit(&claimed, key, &Output::bytes("ok")).unwrap();
                        }
                        _ => {
                            // Empty: done once the last task is.
                            let last = store.read_task(caller, last).unwrap();
                            if last.record.attempts[0].state.is_final() {
                                return;
                            }
                            thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
            });
        }
    });
    TASKS as f64 / started.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn measure(name: &str, rounds: usize, open: &dyn Fn(usize) -> Store) {
    let mut plain = Vec::new();
    let mut graph = Vec::new();
    for round in 0..rounds {
        plain.push(run(Arc::new(open(2 * round)), false));
        graph.push(run(Arc::new(open(2 * round + 1)), true));
    }
    let (plain, graph) = (median(plain), median(graph));
    println!(
        "| {name} | {plain:.0} | {graph:.0} | {:.2}× |",
        plain / graph
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args
        .next()
        .map_or(3, |arg| arg.parse().expect("a round count"));
    let only = args.next();
    let wanted = |name: &str| only.as_deref().is_none_or(|only| only == name);
    println!(
        "| backend | without edges, tasks/s | 999 into one fan-in, tasks/s | cost of the edges |"
    );
    println!("| --- | ---: | ---: | ---: |");
    let dir = tempfile::tempdir().unwrap();
    // The worker's empty claims are paced: a short wait keeps the run
    // from idling between the last parent and the fan-in.
    let config = || StoreConfig::default().with_lease_duration(Duration::from_secs(600));
    if wanted("sqlite") {
        measure("SQLite file", rounds, &|n| {
            Store::open(dir.path().join(format!("dag-{n}.db")), config()).unwrap()
        });
    }
    if wanted("postgres") {
        match postgres_url() {
            Some(url) => {
                let schemas: Vec<PostgresSchema> = (0..2 * rounds)
                    .map(|n| PostgresSchema::fresh(&url, format!("dag_{n}")))
                    .collect();
                measure("PostgreSQL", rounds, &|n| {
                    let options =
                        PostgresOptions::new(schemas[n].url()).with_schema(schemas[n].name());
                    Store::open_postgres(options, config()).unwrap()
                });
            }
            None => eprintln!(
                "skipping PostgreSQL: neither TESSERA_BENCH_POSTGRES_URL nor TESSERA_TEST_POSTGRES_URL is set"
            ),
        }
    }
}
