//! Criterion benchmarks for Tessera; see `benches/` and `docs/performance.md`.
//! This library holds what several benches share.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
#[cfg(target_os = "linux")]
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkGroup, Criterion};
use tessera_store::{
    Brief, Caller, ClaimOutcome, Claimed, EnqueueOptions, Grant, IdempotencyKey, KeySpec,
    ManualClock, Namespace, Output, QueueName, Scope, Store, StoreConfig, Submitted, TaskRef,
};

/// How far a fixture's clock moves before each operation.
pub const TICK: Duration = Duration::from_millis(1);

/// Runs `work(thread, prepared)` on `threads` threads released together,
/// after each ran `prepare(thread, iterations)` untimed, and returns the
/// time from their common start to the last one's finish: the measurement
/// criterion's `iter_custom` wants for work shared between threads.
pub fn on_threads<T: Send>(
    threads: usize,
    iterations: u64,
    prepare: impl Fn(usize, u64) -> T + Sync,
    work: impl Fn(usize, T) + Sync,
) -> Duration {
    let start = Barrier::new(threads);
    thread::scope(|scope| {
        let runs: Vec<_> = (0..threads)
            .map(|thread| {
                let (start, prepare, work) = (&start, &prepare, &work);
                scope.spawn(move || {
                    let prepared = prepare(thread, iterations);
                    start.wait();
                    let began = Instant::now();
                    work(thread, prepared);
                    (began, Instant::now())
                })
            })
            .collect();
        let spans: Vec<(Instant, Instant)> = runs
            .into_iter()
            .map(|run| run.join().expect("a benchmark thread panicked"))
            .collect();
        let began = spans.iter().map(|span| span.0).min();
        let ended = spans.iter().map(|span| span.1).max();
        match (began, ended) {
            (Some(began), Some(ended)) => ended - began,
            _ => Duration::ZERO,
        }
    })
}

/// A store with workers that hold every scope in one namespace, its clock
/// a `ManualClock` moved on by a millisecond before each operation (so
/// every heartbeat really moves its lease's expiry), and a one-hour lease.
#[derive(Debug)]
pub struct StoreFixture {
    /// The clock.
    pub clock: ManualClock,
    /// The store.
    pub store: Store,
    /// The workers' namespace.
    pub namespace: Namespace,
    /// An admin caller.
    pub admin: Caller,
    /// Callers with every scope in `namespace`.
    pub workers: Vec<Caller>,
    next_key: u64,
}

impl StoreFixture {
    /// A store `open` makes with the fixture's settings, and `workers`
    /// worker keys.
    pub fn new(workers: usize, open: impl FnOnce(StoreConfig) -> Store) -> Self {
        let clock = ManualClock::new("2026-10-29T12:00:00Z".parse().unwrap());
        let config = StoreConfig::default()
            .with_clock(Arc::new(clock.clone()))
            .with_lease_duration(Duration::from_secs(3600));
        let store = open(config);
        let admin_key = store.create_admin_key("operators").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        let mut fixture = Self {
            clock,
            store,
            namespace: Namespace::parse("bench").unwrap(),
            admin,
            workers: Vec::new(),
            next_key: 0,
        };
        fixture.add_workers(workers);
        fixture
    }

    /// Adds `count` worker keys.
    pub fn add_workers(&mut self, count: usize) {
        let spec = KeySpec::keyed("bench")
            .with_scopes(Scope::ALL.iter().copied())
            .with_grant(Grant::Namespace(self.namespace.clone()));
        for _ in 0..count {
            let key = self.store.create_key(&self.admin, &spec).unwrap();
            let caller = self.store.authenticate(Some(key.secret.expose())).unwrap();
            self.workers.push(caller);
        }
    }

    /// Enqueues a small task into `queue`.
    pub fn enqueue(&self, caller: &Caller, queue: &QueueName) -> TaskRef {
        self.clock.advance(TICK);
        self.store
            .enqueue(
                caller,
                &self.namespace,
                queue,
                &Brief::Bytes(br#"{"frame":42}"#.to_vec()),
                &EnqueueOptions::default(),
            )
            .unwrap()
    }

    /// Claims from `queue`, expecting a lease.
    pub fn claim(&self, caller: &Caller, queue: &QueueName) -> Claimed {
        self.clock.advance(TICK);
        match self.store.claim(caller, &self.namespace, queue).unwrap() {
            ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    /// Extends `claimed`'s lease.
    pub fn heartbeat(&self, caller: &Caller, claimed: &Claimed) {
        self.clock.advance(TICK);
        self.store
            .heartbeat(caller, &claimed.task, claimed.lease.token())
            .unwrap();
    }

    /// Submits `claimed` under a fresh idempotency key.
    pub fn submit(&mut self, caller: &Caller, claimed: &Claimed) {
        self.next_key += 1;
        let key = IdempotencyKey::parse(&format!("k{}", self.next_key)).unwrap();
        self.submit_with(caller, claimed, &key);
    }

    /// Submits `claimed` under `key`.
    pub fn submit_with(&self, caller: &Caller, claimed: &Claimed, key: &IdempotencyKey) {
        self.clock.advance(TICK);
        let submitted = self
            .store
            .submit(
                caller,
                &claimed.task,
                claimed.lease.token(),
                key,
                &Output::bytes(b"rendered".to_vec()),
            )
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
    }
}

/// Benchmarks `enqueue`, `claim`, `heartbeat`, `submit` and `lifecycle`
/// from one thread, each one operation through the public API by the
/// fixture's first worker: `claim` runs on tasks enqueued before the timed
/// run, `heartbeat` extends one lease again and again, `submit` hands in a
/// fresh idempotency key on a lease taken before the timed run.
pub fn operations_on_one_thread(group: &mut BenchmarkGroup<'_, WallTime>, f: &mut StoreFixture) {
    let worker = f.workers[0].clone();
    let q = queue("enqueue");
    group.bench_function("enqueue", |b| b.iter(|| f.enqueue(&worker, &q)));

    let q = queue("claim");
    group.bench_function("claim", |b| {
        b.iter_custom(|iterations| {
            for _ in 0..iterations {
                f.enqueue(&worker, &q);
            }
            let began = Instant::now();
            for _ in 0..iterations {
                black_box(f.claim(&worker, &q));
            }
            began.elapsed()
        })
    });

    let q = queue("heartbeat");
    f.enqueue(&worker, &q);
    let held = f.claim(&worker, &q);
    group.bench_function("heartbeat", |b| b.iter(|| f.heartbeat(&worker, &held)));

    let q = queue("submit");
    group.bench_function("submit", |b| {
        b.iter_custom(|iterations| {
            let leases: Vec<Claimed> = (0..iterations)
                .map(|_| {
                    f.enqueue(&worker, &q);
                    f.claim(&worker, &q)
                })
                .collect();
            let began = Instant::now();
            for claimed in &leases {
                f.submit(&worker, claimed);
            }
            began.elapsed()
        })
    });

    let q = queue("lifecycle");
    group.bench_function("lifecycle", |b| {
        b.iter(|| {
            f.enqueue(&worker, &q);
            let claimed = f.claim(&worker, &q);
            f.heartbeat(&worker, &claimed);
            f.submit(&worker, &claimed);
        })
    });
}

/// The same operations on `threads` threads at once, each with the
/// fixture's worker and a queue of its own; one iteration is one
/// operation on each thread, timed from their common start to the last
/// one's finish ([`on_threads`]).
pub fn operations_on_threads(
    group: &mut BenchmarkGroup<'_, WallTime>,
    f: &StoreFixture,
    threads: usize,
) {
    let queues: Vec<QueueName> = (0..threads).map(|t| queue(&format!("q{t}"))).collect();
    group.bench_function("enqueue", |b| {
        b.iter_custom(|iterations| {
            on_threads(
                threads,
                iterations,
                |_, iterations| iterations,
                |t, iterations| {
                    for _ in 0..iterations {
                        black_box(f.enqueue(&f.workers[t], &queues[t]));
                    }
                },
            )
        })
    });

    group.bench_function("claim", |b| {
        b.iter_custom(|iterations| {
            on_threads(
                threads,
                iterations,
                |t, iterations| {
                    for _ in 0..iterations {
                        f.enqueue(&f.workers[t], &queues[t]);
                    }
                    iterations
                },
                |t, iterations| {
                    for _ in 0..iterations {
                        black_box(f.claim(&f.workers[t], &queues[t]));
                    }
                },
            )
        })
    });

    let held: Vec<Claimed> = (0..threads)
        .map(|t| {
            let q = queue(&format!("held{t}"));
            f.enqueue(&f.workers[t], &q);
            f.claim(&f.workers[t], &q)
        })
        .collect();
    group.bench_function("heartbeat", |b| {
        b.iter_custom(|iterations| {
            on_threads(
                threads,
                iterations,
                |_, iterations| iterations,
                |t, iterations| {
                    for _ in 0..iterations {
                        f.heartbeat(&f.workers[t], &held[t]);
                    }
                },
            )
        })
    });

    let mut sample = 0_u64;
    group.bench_function("submit", |b| {
        b.iter_custom(|iterations| {
            sample += 1;
            on_threads(
                threads,
                iterations,
                |t, iterations| {
                    (0..iterations)
                        .map(|n| {
                            f.enqueue(&f.workers[t], &queues[t]);
                            let claimed = f.claim(&f.workers[t], &queues[t]);
                            let key =
                                idempotency_key(t, sample.wrapping_mul(1 << 32).wrapping_add(n));
                            (claimed, key)
                        })
                        .collect::<Vec<_>>()
                },
                |t, leases| {
                    for (claimed, key) in &leases {
                        f.submit_with(&f.workers[t], claimed, key);
                    }
                },
            )
        })
    });

    group.bench_function("lifecycle", |b| {
        b.iter_custom(|iterations| {
            sample += 1;
            on_threads(
                threads,
                iterations,
                |_, iterations| iterations,
                |t, iterations| {
                    let worker = &f.workers[t];
                    for n in 0..iterations {
                        f.enqueue(worker, &queues[t]);
                        let claimed = f.claim(worker, &queues[t]);
                        f.heartbeat(worker, &claimed);
                        let key = idempotency_key(t, sample.wrapping_mul(1 << 32).wrapping_add(n));
                        f.submit_with(worker, &claimed, &key);
                    }
                },
            )
        })
    });
}

/// A queue name.
pub fn queue(name: &str) -> QueueName {
    QueueName::parse(name).unwrap()
}

/// Unique idempotency keys across threads and samples.
pub fn idempotency_key(thread: usize, n: u64) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("t{thread}-{n}")).unwrap()
}

/// The PostgreSQL server the PostgreSQL benches run against:
/// `TESSERA_BENCH_POSTGRES_URL`, else `TESSERA_TEST_POSTGRES_URL`; `None`
/// when neither is set.
pub fn postgres_url() -> Option<String> {
    ["TESSERA_BENCH_POSTGRES_URL", "TESSERA_TEST_POSTGRES_URL"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|url| !url.is_empty()))
}

/// A schema name for one bench run on a server: a leftover of that name is
/// dropped now, and the schema, with everything in it, when this is
/// dropped (a panicking run included).
#[derive(Debug)]
pub struct PostgresSchema {
    url: String,
    name: String,
}

impl PostgresSchema {
    /// `name` (lowercase letters, digits and `_`) on the server at `url`,
    /// which must be reachable.
    pub fn fresh(url: &str, name: impl Into<String>) -> Self {
        let schema = Self {
            url: url.to_owned(),
            name: name.into(),
        };
        schema.drop_schema().unwrap();
        schema
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn drop_schema(&self) -> Result<(), postgres::Error> {
        let mut client = postgres::Client::connect(&self.url, postgres::NoTls)?;
        client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name))
    }
}

impl Drop for PostgresSchema {
    fn drop(&mut self) {
        if let Err(error) = self.drop_schema() {
            eprintln!("schema {} was not dropped: {error}", self.name);
        }
    }
}

/// PostgreSQL's cheapest durable write, the baseline of the PostgreSQL
/// benches: one row inserted into a table without secondary indexes, one
/// `BEGIN` … `COMMIT` transaction per row, through a pool of clients
/// (server defaults, so `synchronous_commit = on`).
#[derive(Debug)]
pub struct MinimalCommit {
    pool: r2d2::Pool<MinimalCommitClients>,
}

impl MinimalCommit {
    /// Creates `schema` if it is missing and the table `minimal_commit` in
    /// it, then [`attach`](Self::attach)es to it.
    pub fn create(schema: &PostgresSchema, connections: u32) -> Self {
        let mut client = postgres::Client::connect(schema.url(), postgres::NoTls).unwrap();
        client
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS \"{name}\";
                 CREATE TABLE \"{name}\".minimal_commit (
                     id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                     value BIGINT NOT NULL
                 )",
                name = schema.name()
            ))
            .unwrap();
        Self::attach(schema.url(), schema.name(), connections)
    }

    /// A pool of up to `connections` clients, all connected now, on the
    /// table `minimal_commit` that [`create`](Self::create) made in
    /// `schema` on the server at `url` (from another process, say).
    pub fn attach(url: &str, schema: &str, connections: u32) -> Self {
        let clients = MinimalCommitClients {
            config: url.parse().unwrap(),
            insert: format!("INSERT INTO \"{schema}\".minimal_commit (value) VALUES ($1)"),
        };
        // No check on checkout: nothing but the three statements reaches
        // the server.
        let pool = r2d2::Pool::builder()
            .max_size(connections.max(1))
            .test_on_check_out(false)
            .build(clients)
            .unwrap();
        Self { pool }
    }

    /// Inserts one row carrying `value` in a transaction of its own.
    pub fn commit(&self, value: i64) {
        let mut connection = self.pool.get().unwrap();
        let PreparedClient { client, insert } = &mut *connection;
        let mut transaction = client.transaction().unwrap();
        transaction.execute(&*insert, &[&value]).unwrap();
        transaction.commit().unwrap();
    }
}

/// Opens [`MinimalCommit`]'s clients, each with its insert prepared once.
#[derive(Debug)]
struct MinimalCommitClients {
    config: postgres::Config,
    insert: String,
}

/// A client and its prepared insert.
struct PreparedClient {
    client: postgres::Client,
    insert: postgres::Statement,
}

impl r2d2::ManageConnection for MinimalCommitClients {
    type Connection = PreparedClient;
    type Error = postgres::Error;

    fn connect(&self) -> Result<PreparedClient, postgres::Error> {
        let mut client = self.config.connect(postgres::NoTls)?;
        let insert = client.prepare(&self.insert)?;
        Ok(PreparedClient { client, insert })
    }

    fn is_valid(&self, connection: &mut PreparedClient) -> Result<(), postgres::Error> {
        connection.client.simple_query("").map(drop)
    }

    fn has_broken(&self, connection: &mut PreparedClient) -> bool {
        connection.client.is_closed()
    }
}

/// SQLite's cheapest durable write, the baseline of the SQLite benches:
/// one row inserted into a table without secondary indexes, one
/// `BEGIN IMMEDIATE` … `COMMIT` transaction per row, on a file of its own
/// with the store's journal settings (WAL, `synchronous=NORMAL`); the
/// three statements are prepared once.
#[derive(Debug)]
pub struct SqliteMinimalCommit {
    conn: rusqlite::Connection,
    next: i64,
}

impl SqliteMinimalCommit {
    /// Creates the file at `path` with its one table.
    pub fn open(path: &std::path::Path) -> Self {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute_batch("CREATE TABLE rows (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
            .unwrap();
        Self { conn, next: 0 }
    }

    /// Inserts one row in a transaction of its own.
    pub fn commit(&mut self) {
        self.next += 1;
        let conn = &self.conn;
        conn.prepare_cached("BEGIN IMMEDIATE")
            .unwrap()
            .execute([])
            .unwrap();
        conn.prepare_cached("INSERT INTO rows (value) VALUES (?1)")
            .unwrap()
            .execute([black_box(self.next)])
            .unwrap();
        conn.prepare_cached("COMMIT").unwrap().execute([]).unwrap();
    }
}

/// The CPU time of the calling thread, as a criterion measurement: on a
/// machine shared with other work, time the thread spent waiting for a CPU
/// is not counted, so single-threaded figures and their baselines measured
/// in the same run compare fairly. Linux only (elsewhere the benches that
/// use it fall back to wall time through [`CpuOrWallTime`]).
#[cfg(target_os = "linux")]
pub struct ThreadCpuTime {
    /// Lends its formatter: the values are durations as well.
    wall: WallTime,
}

#[cfg(target_os = "linux")]
impl Default for ThreadCpuTime {
    fn default() -> Self {
        Self { wall: WallTime }
    }
}

#[cfg(target_os = "linux")]
impl std::fmt::Debug for ThreadCpuTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ThreadCpuTime")
    }
}

#[cfg(target_os = "linux")]
impl ThreadCpuTime {
    fn now() -> Duration {
        let time = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(
            u64::try_from(time.tv_sec).unwrap_or(0),
            u32::try_from(time.tv_nsec).unwrap_or(0),
        )
    }
}

#[cfg(target_os = "linux")]
impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        Self::now()
    }

    fn end(&self, started: Duration) -> Duration {
        Self::now().saturating_sub(started)
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        self.wall.formatter()
    }
}

/// [`ThreadCpuTime`] on Linux, wall time elsewhere.
#[cfg(target_os = "linux")]
pub type CpuOrWallTime = ThreadCpuTime;

/// [`ThreadCpuTime`] on Linux, wall time elsewhere.
#[cfg(not(target_os = "linux"))]
pub type CpuOrWallTime = WallTime;

/// A criterion that measures in [`CpuOrWallTime`].
pub fn cpu_time_criterion() -> Criterion<CpuOrWallTime> {
    #[cfg(target_os = "linux")]
    let measurement = ThreadCpuTime::default();
    #[cfg(not(target_os = "linux"))]
    let measurement = WallTime;
    Criterion::default().with_measurement(measurement)
}

/// The code examples of the pages under `docs/`, compiled and run as
/// doctests, as the README's are.
#[cfg(doctest)]
mod docs {
    #[doc = include_str!("../../docs/backends.md")]
    struct Backends;
    #[doc = include_str!("../../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../../docs/cost-table.md")]
    struct CostTable;
    #[doc = include_str!("../../docs/contributing.md")]
    struct Contributing;
}
