//! What a processed job costs on PostgreSQL, as the server counts it:
//! jobs per second from 1, 2, 4 and 8 worker threads, one job per claim
//! and batched, with transactions, rows changed and WAL bytes per job, and
//! batch enqueue, beside the server's one-row-commit floor in the same
//! run.
//!
//! Run: `TESSERA_BENCH_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --release -p tessera-benches --bin job_costs [JOBS]`
//!
//! Each figure runs on a database of its own (`tessera_jobs_<pid>`,
//! dropped at the end), so the server's per-database counters
//! (`pg_stat_database`: `xact_commit`, and tuples inserted, updated and
//! deleted) count this program's work alone; they are read after the
//! store closed, once no session is left on the database (a session
//! reports its counts when it ends). WAL bytes are the server's
//! (`pg_current_wal_lsn`) and include whatever else the server did
//! meanwhile: run it on a server of its own for exact figures. `JOBS`
//! (default 4,000) no-op jobs are enqueued 1,000 per call, then worker
//! threads (one store, a pool of one connection per thread, the system
//! clock, a one-hour lease) each claim and submit until the queue is
//! empty: one job per claim (`claim` + `submit`), or batched
//! (`claim_batch` of 100 + one `submit_batch` of what it got).

use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use tessera_benches::postgres_url;
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    Brief, Caller, ClaimOutcome, EnqueueOptions, Grant, IdempotencyKey, KeySpec, Namespace, Output,
    QueueName, Scope, Store, StoreConfig, SubmitRequest, Submitted,
};

/// The server's counters for one database.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    commits: i64,
    rows: i64,
    wal: i64,
}

/// Where each byte of a figure's WAL went, by record type and relation,
/// when `TESSERA_JOB_COSTS_WAL_DIR` names the server's `pg_wal` directory
/// (readable here, with `pg_waldump` on the `PATH` or in
/// `TESSERA_JOB_COSTS_WALDUMP`): one line a (record, relation), in bytes
/// per job, largest first.
fn wal_breakdown(db: &mut Database, start: i64, end: i64, jobs: usize) {
    let Ok(dir) = std::env::var("TESSERA_JOB_COSTS_WAL_DIR") else {
        return;
    };
    let waldump =
        std::env::var("TESSERA_JOB_COSTS_WALDUMP").unwrap_or_else(|_| "pg_waldump".into());
    let lsn = |at: i64| format!("{:X}/{:X}", at >> 32, at & 0xffff_ffff);
    let mut names = std::collections::HashMap::new();
    {
        let mut client = Client::connect(&db.url, NoTls).unwrap();
        for row in client
            .query("SELECT pg_relation_filenode(oid)::bigint, relname::text FROM pg_class WHERE pg_relation_filenode(oid) IS NOT NULL", &[])
            .unwrap()
        {
            names.insert(row.get::<_, i64>(0).to_string(), row.get::<_, String>(1));
        }
    }
    let out = std::process::Command::new(waldump)
        .args(["-p", &dir, "-s", &lsn(start), "-e", &lsn(end)])
        .output()
        .expect("pg_waldump runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut bytes: std::collections::HashMap<(String, String), (i64, i64)> =
        std::collections::HashMap::new();
    for line in text.lines() {
        let field = |name: &str| {
            line.split(name).nth(1).map(|rest| {
                rest.trim_start()
                    .split([',', ' '])
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
        };
        let Some(rmgr) = field("rmgr:") else { continue };
        let total: i64 = line
            .split("len (rec/tot):")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|pair| pair.split('/').nth(1))
            .and_then(|tot| tot.trim().parse().ok())
            .unwrap_or(0);
        let kind = line
            .split("desc:")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or("")
            .to_owned();
        let relation = line
            .split("rel ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|rel| rel.rsplit('/').next())
            .map(|node| {
                names
                    .get(node)
                    .cloned()
                    .unwrap_or_else(|| format!("filenode {node}"))
            })
            .unwrap_or_default();
        let entry = bytes
            .entry((format!("{rmgr}/{kind}"), relation))
            .or_default();
        entry.0 += 1;
        entry.1 += total;
    }
    let mut lines: Vec<_> = bytes.into_iter().collect();
    lines.sort_by_key(|(_, (_, total))| -total);
    println!("| record | relation | records per job | bytes per job |");
    println!("| --- | --- | ---: | ---: |");
    for ((record, relation), (count, total)) in lines.into_iter().take(30) {
        println!(
            "| {record} | {relation} | {:.2} | {:.0} |",
            count as f64 / jobs as f64,
            total as f64 / jobs as f64
        );
    }
}

/// A database of this program's own.
struct Database {
    admin: Client,
    name: String,
    url: String,
}

impl Database {
    fn create(server: &str) -> Self {
        let mut admin = Client::connect(server, NoTls).expect("the server answers");
        let name = format!("tessera_jobs_{}", std::process::id());
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

    /// The counters, once every session on the database has ended.
    fn counts(&mut self) -> Counts {
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
        let row = self
            .admin
            .query_one(
                "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted, \
                 pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint \
                 FROM pg_stat_database WHERE datname = $1",
                &[&self.name],
            )
            .unwrap();
        Counts {
            commits: row.get(0),
            rows: row.get(1),
            wal: row.get(2),
        }
    }

    fn open(&self, threads: u32) -> Store {
        let options = PostgresOptions::new(self.url.as_str())
            .with_pool_size(threads + 1)
            .with_listen(false);
        let config = StoreConfig::default().with_lease_duration(Duration::from_secs(3600));
        Store::open_postgres(options, config).unwrap()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = self.admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// One measured figure.
struct Figure {
    what: String,
    jobs: usize,
    seconds: f64,
    cost: Counts,
    /// Updates of `attempts` and `tasks` and how many of them were HOT
    /// (no index entry written), by `pg_stat_user_tables`.
    hot: String,
}

/// Updates and HOT updates by table, from `pg_stat_user_tables` of the
/// figure's database (read once no session is left on it, so every
/// session's counts are in).
fn updates(db: &Database) -> std::collections::HashMap<String, (i64, i64)> {
    let mut client = Client::connect(&db.url, NoTls).unwrap();
    client
        .query(
            "SELECT relname::text, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect()
}

/// "table: HOT/updates" for the tables a job updates, between two reads
/// of [`updates`].
fn hot_share(
    before: &std::collections::HashMap<String, (i64, i64)>,
    after: &std::collections::HashMap<String, (i64, i64)>,
) -> String {
    ["attempts", "tasks"]
        .iter()
        .map(|table| {
            let (u0, h0) = before.get(*table).copied().unwrap_or_default();
            let (u1, h1) = after.get(*table).copied().unwrap_or_default();
            format!("{table} {}/{}", h1 - h0, u1 - u0)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn namespace() -> Namespace {
    Namespace::parse("jobs").unwrap()
}

fn queue() -> QueueName {
    QueueName::parse("work").unwrap()
}

/// A worker key on a fresh store of `db`; the secret.
fn worker_secret(db: &Database) -> String {
    let store = db.open(1);
    let admin_key = store.create_admin_key("ops").unwrap();
    let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
    let key = store
        .create_key(
            &admin,
            &KeySpec::keyed("bench")
                .with_scopes(Scope::ALL.iter().copied())
                .with_grant(Grant::Namespace(namespace())),
        )
        .unwrap();
    key.secret.expose().to_owned()
}

fn enqueue(store: &Store, caller: &Caller, jobs: usize, per_call: usize) {
    let brief = Brief::Bytes(b"{}".to_vec());
    let mut left = jobs;
    while left > 0 {
        let n = left.min(per_call);
        if n == 1 {
            store
                .enqueue(
                    caller,
                    &namespace(),
                    &queue(),
                    &brief,
                    &EnqueueOptions::default(),
                )
                .unwrap();
        } else {
            let tasks = vec![(brief.clone(), EnqueueOptions::default()); n];
            store
                .enqueue_batch(caller, &namespace(), &queue(), &tasks)
                .unwrap();
        }
        left -= n;
    }
}

/// Claims and submits until the queue is empty; the jobs it finished.
fn work(store: &Store, caller: &Caller, batch: Option<usize>) -> usize {
    let key = IdempotencyKey::parse("done").unwrap();
    let mut done = 0;
    loop {
        match batch {
            None => {
                let ClaimOutcome::Granted(claimed) =
                    store.claim(caller, &namespace(), &queue()).unwrap()
                else {
                    return done;
                };
                let output = Output::bytes("ok");
                let submitted = store
                    .submit(caller, &claimed.task, claimed.lease.token(), &key, &output)
                    .unwrap();
                assert!(matches!(submitted, Submitted::Accepted(_)));
                done += 1;
            }
            Some(size) => {
                let claimed = store
                    .claim_batch(caller, &namespace(), &queue(), size)
                    .unwrap()
                    .claimed;
                if claimed.is_empty() {
                    return done;
                }
                let requests: Vec<SubmitRequest> = claimed
                    .iter()
                    .map(|lease| SubmitRequest {
                        task: lease.task.clone(),
                        token: lease.lease.token(),
                        key: key.clone(),
                        output: Output::bytes("ok"),
                    })
                    .collect();
                for answer in store.submit_batch(caller, &requests).unwrap() {
                    assert!(matches!(answer, Ok(Submitted::Accepted(_))));
                }
                done += claimed.len();
            }
        }
    }
}

/// Enqueues `jobs` `per_call` at a time on a fresh store: the figure.
fn measure_enqueue(db: &mut Database, secret: &str, jobs: usize, per_call: usize) -> Figure {
    let before = db.counts();
    let store = db.open(1);
    let caller = store.authenticate(Some(secret)).unwrap();
    let start = Instant::now();
    enqueue(&store, &caller, jobs, per_call);
    let seconds = start.elapsed().as_secs_f64();
    drop(store);
    let after = db.counts();
    Figure {
        what: format!("enqueue, {per_call} per call"),
        jobs,
        seconds,
        cost: difference(before, after),
        hot: String::new(),
    }
}

/// Processes the queue's `jobs` with `threads` workers: the figure.
fn measure_processing(
    db: &mut Database,
    secret: &str,
    jobs: usize,
    threads: usize,
    batch: Option<usize>,
) -> Figure {
    let before = db.counts();
    let updates_before = updates(db);
    let store = db.open(threads as u32);
    let caller = store.authenticate(Some(secret)).unwrap();
    let start = Instant::now();
    let done: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| scope.spawn(|| work(&store, &caller, batch)))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let seconds = start.elapsed().as_secs_f64();
    drop(store);
    assert_eq!(done, jobs, "every job processed once");
    let after = db.counts();
    let hot = hot_share(&updates_before, &updates(db));
    wal_breakdown(db, before.wal, after.wal, jobs);
    let what = match batch {
        None => format!("process one job per claim, {threads} workers"),
        Some(size) => format!("process batched ({size}), {threads} workers"),
    };
    Figure {
        what,
        jobs,
        seconds,
        cost: difference(before, after),
        hot,
    }
}

/// One-row commits from `threads` clients: the server's floor.
fn measure_floor(db: &mut Database, commits: usize, threads: usize) -> Figure {
    {
        let mut client = Client::connect(&db.url, NoTls).unwrap();
        client
            .batch_execute("CREATE TABLE IF NOT EXISTS floor (id BIGSERIAL PRIMARY KEY, v BIGINT)")
            .unwrap();
    }
    let before = db.counts();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let url = db.url.clone();
            scope.spawn(move || {
                let mut client = Client::connect(&url, NoTls).unwrap();
                let insert = client.prepare("INSERT INTO floor (v) VALUES ($1)").unwrap();
                for n in 0..commits / threads {
                    let mut transaction = client.transaction().unwrap();
                    transaction.execute(&insert, &[&(n as i64)]).unwrap();
                    transaction.commit().unwrap();
                }
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    let after = db.counts();
    Figure {
        what: format!("floor: one-row commits, {threads} clients"),
        jobs: commits / threads * threads,
        seconds,
        cost: difference(before, after),
        hot: String::new(),
    }
}

fn difference(before: Counts, after: Counts) -> Counts {
    Counts {
        commits: after.commits - before.commits,
        rows: after.rows - before.rows,
        wal: after.wal - before.wal,
    }
}

fn main() {
    let Some(server) = postgres_url() else {
        println!(
            "skipping: neither TESSERA_BENCH_POSTGRES_URL nor TESSERA_TEST_POSTGRES_URL is set"
        );
        return;
    };
    let jobs: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("JOBS is a number"))
        .unwrap_or(4_000);
    let mut db = Database::create(&server);
    let secret = worker_secret(&db);
    let mut figures = vec![
        measure_floor(&mut db, 2_000, 1),
        measure_floor(&mut db, 4_000, 8),
        measure_enqueue(&mut db, &secret, 1_000, 1),
        measure_enqueue(&mut db, &secret, jobs, 1_000),
    ];
    // The one-by-one enqueue's jobs are processed with the first batch.
    let mut pending = 1_000 + jobs;
    for batch in [None, Some(100)] {
        for threads in [1, 2, 4, 8] {
            if pending == 0 {
                let store = db.open(1);
                let caller = store.authenticate(Some(&secret)).unwrap();
                enqueue(&store, &caller, jobs, 1_000);
                drop(store);
                pending = jobs;
            }
            figures.push(measure_processing(
                &mut db, &secret, pending, threads, batch,
            ));
            pending = 0;
        }
    }
    println!(
        "| figure | jobs/s | transactions per job | rows per job | WAL bytes per job | HOT updates / updates |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for figure in &figures {
        let per = |value: i64| value as f64 / figure.jobs as f64;
        println!(
            "| {} | {:.0} | {:.3} | {:.2} | {:.0} | {} |",
            figure.what,
            figure.jobs as f64 / figure.seconds,
            per(figure.cost.commits),
            per(figure.cost.rows),
            per(figure.cost.wal),
            figure.hot,
        );
    }
}
