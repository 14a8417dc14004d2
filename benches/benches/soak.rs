//! Soak: tasks enqueued, claimed and submitted at a steady rate for a long
//! run, with finished work kept a minute, to show that the database levels
//! off once retention purges as fast as work arrives.
//!
//! Run (SQLite on a file in a temporary directory, PostgreSQL in a schema
//! of its own, `soak_<pid>`, dropped at the end):
//!
//! ```sh
//! cargo bench -p tessera-benches --bench soak -- sqlite 1000000
//! TESSERA_BENCH_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/tessera_soak \
//!     cargo bench -p tessera-benches --bench soak -- postgres 300000
//! ```
//!
//! `soak BACKEND TASKS [--rate R] [--threads T] [--keep-done S]
//! [--interval S] [--reports N] [--speedup K] [--compare N]
//! [--autovacuum N]`; without a
//! backend it prints this usage and exits, so `cargo bench` runs past it.
//!
//! - **The work.** `T` threads (default 2 on SQLite, 4 on PostgreSQL)
//!   share one store, one keyed worker and one queue (`soak/soak`). Task
//!   `i` is due `i / R` seconds after the start (default `R`: 1,000 tasks
//!   a second on SQLite, a quarter of the 4,300 its two threads sustain
//!   back to back on this 2-core machine; 250 on PostgreSQL, half of the
//!   400 to 1,000 its four threads sustain with a synced commit; the
//!   margin is for the retention runs and the other work on the
//!   machine), whatever became of
//!   the tasks before it: the offered rate is fixed, so every quarter of
//!   the run is offered the same work, and a backend that falls behind
//!   shows it as lag and a lower achieved rate rather than as a slower
//!   offer. A thread takes the next due task, sleeps until its time, then
//!   enqueues it, claims the queue's oldest ready task (a claim that
//!   finds the queue empty is counted and tried again) and submits it.
//! - **Retention.** Done tasks are kept `--keep-done` seconds (default
//!   60) and a retention run starts at most every `--interval` seconds
//!   (default 10), from the store's own `maintain` after a write: so a
//!   run of a million tasks sees about a hundred retention runs, each
//!   purging the ten seconds of work whose minute has passed (a few
//!   thousand tasks, in batches of 500), and the tasks kept settle at
//!   about 70 seconds of work within the first report. `--keep-done 0`
//!   with `--compare` is not the same as keeping everything: that is the
//!   comparison run below.
//! - **Every report** (`--reports`, default 20: every 5% of the tasks,
//!   a multiple of 4 so quarters fall on reports): the database size
//!   (SQLite: `page_count`, `freelist_count`, the file and its
//!   write-ahead log, and each table's pages with its indexes from
//!   `dbstat`, one b-tree a read, the audit table's as the pages in use
//!   left over; PostgreSQL: `pg_total_relation_size` of each table, its
//!   indexes and TOAST included, and their sum, with the dead tuples and
//!   vacuums `pg_stat_user_tables` counts), the tasks still stored, the
//!   rows written per task over the interval (the store's meter, deletes
//!   included: on SQLite index entries counted, on PostgreSQL table rows
//!   changed, beside `pg_stat_user_tables`' `n_tup_ins + n_tup_upd +
//!   n_tup_del`, which the server reports up to a second late), and the
//!   claim latency's p50, p99 and maximum over the interval, timed around
//!   `Store::claim` as its caller sees it, so a retention run that a claim
//!   started is in its latency.
//! - **The goals**, printed at the end with whether each was met: (1) the
//!   size at the end of the last quarter is less than 5% above the size at
//!   the end of the second (SQLite: the file and its log; PostgreSQL: the
//!   sum over the tables); (2) the claims' p99 in the last quarter is at
//!   most 1.5× that of the second. Then the rows written per task over the
//!   last quarter beside a comparison run of `--compare` tasks (default a
//!   twentieth of `TASKS`; 0 skips it) on a fresh store at the same rate
//!   with `Retention::FOREVER`: the difference is what the deletes cost.
//! - **The audit's day.** Every enqueue, claim and submission writes an
//!   audit row, and audit rows are kept 24 hours whatever the task
//!   retention says (`tessera_audit::RETENTION`). A run shorter than a day
//!   never sees them deleted, so its total size keeps growing by the
//!   audit rows alone; the per-table figures show it. `--speedup K` runs
//!   the store on a clock that moves K times as fast as real time, with
//!   `--keep-done`, `--interval` and the one-hour lease multiplied by K
//!   (the lease at most a day), so the tasks' retention is the same in
//!   real seconds while the day passes in `86,400 / K` seconds (K = 288:
//!   five minutes).
//! - **PostgreSQL's vacuum.** Deleted and updated rows leave dead tuples
//!   that only `VACUUM` makes room of; the store sets nothing of the
//!   server's autovacuum. `--autovacuum N` does what an operator may: it
//!   sets `autovacuum_vacuum_scale_factor = 0`,
//!   `autovacuum_vacuum_threshold = N` and `autovacuum_vacuum_cost_delay =
//!   0` on the run's own `tasks`, `attempts` and `access_audit`, so each is vacuumed once N of its rows are dead (at
//!   most once per the server's `autovacuum_naptime`).
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use tessera_benches::{PostgresSchema, postgres_url};
use tessera_store::limits::MAX_LEASE_DURATION;
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    Brief, Caller, ClaimOutcome, Clock, EnqueueOptions, Grant, IdempotencyKey, KeySpec,
    MeterSnapshot, Namespace, Output, QueueName, Retention, Scope, Store, StoreConfig, Submitted,
};

const USAGE: &str = "usage: soak sqlite|postgres TASKS [--rate R] [--threads T] \
[--keep-done S] [--interval S] [--reports N] [--speedup K] [--compare N] [--autovacuum N]";

/// The store's lease, in real time: longer than any claim-to-submit gap
/// (on a fast clock, at most the longest lease the store takes).
const LEASE: Duration = Duration::from_secs(3600);

/// How many failed calls are printed; the rest are only counted.
const ERRORS_PRINTED: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// The command line.
#[derive(Debug, Clone)]
struct Options {
    backend: Backend,
    tasks: u64,
    rate: f64,
    threads: usize,
    keep_done: Duration,
    interval: Duration,
    reports: u64,
    speedup: u32,
    compare: u64,
    autovacuum: Option<u64>,
}

impl Options {
    /// `None` without a backend (the usage is printed).
    fn parse(args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        // `cargo bench` passes `--bench` to every bench binary.
        let args: Vec<String> = args.filter(|arg| arg != "--bench").collect();
        let mut positional = Vec::new();
        let mut flags = BTreeMap::new();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            if let Some(name) = arg.strip_prefix("--") {
                let value = it.next().ok_or(format!("--{name} needs a value"))?;
                flags.insert(name.to_owned(), value);
            } else {
                positional.push(arg);
            }
        }
        let Some(backend) = positional.first() else {
            return Ok(None);
        };
        let backend = match backend.as_str() {
            "sqlite" => Backend::Sqlite,
            "postgres" => Backend::Postgres,
            other => return Err(format!("unknown backend {other}")),
        };
        let autovacuum = flags.contains_key("autovacuum");
        let mut number = |name: &str, default: f64| -> Result<f64, String> {
            match flags.remove(name) {
                Some(value) => value
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite() && *n >= 0.0)
                    .ok_or(format!("--{name} {value} is not a number")),
                None => Ok(default),
            }
        };
        let tasks: u64 = positional
            .get(1)
            .ok_or("TASKS is missing")?
            .parse()
            .map_err(|_| "TASKS is a number".to_owned())?;
        let (rate, threads) = match backend {
            Backend::Sqlite => (1000.0, 2.0),
            Backend::Postgres => (250.0, 4.0),
        };
        let seconds = |s: f64| Duration::from_millis((s * 1000.0).round() as u64);
        let options = Self {
            backend,
            tasks,
            rate: number("rate", rate)?,
            threads: number("threads", threads)? as usize,
            keep_done: seconds(number("keep-done", 60.0)?),
            interval: seconds(number("interval", 10.0)?),
            reports: number("reports", 20.0)? as u64,
            speedup: number("speedup", 1.0)? as u32,
            compare: number("compare", (tasks / 20) as f64)? as u64,
            autovacuum: if autovacuum {
                Some(number("autovacuum", 0.0)? as u64)
            } else {
                None
            },
        };
        if let Some(name) = flags.keys().next() {
            return Err(format!("unknown option --{name}"));
        }
        if options.reports == 0 || options.reports % 4 != 0 || options.tasks < options.reports {
            return Err("--reports is a multiple of 4, at most TASKS".to_owned());
        }
        if options.rate <= 0.0 || options.threads == 0 || options.speedup == 0 {
            return Err("--rate, --threads and --speedup are above 0".to_owned());
        }
        Ok(Some(options))
    }
}

/// A clock `factor` times as fast as the system's wall clock, from the
/// moment it is made; its monotonic reading is the real one, so the
/// store's waits (admission, group commit) last what they say.
#[derive(Debug)]
struct FastClock {
    origin_utc: DateTime<Utc>,
    origin: Instant,
    factor: u32,
}

impl FastClock {
    fn new(factor: u32) -> Self {
        Self {
            origin_utc: Utc::now(),
            origin: Instant::now(),
            factor,
        }
    }
}

impl Clock for FastClock {
    fn now_utc(&self) -> DateTime<Utc> {
        let elapsed = self.origin.elapsed() * self.factor;
        self.origin_utc + chrono::TimeDelta::from_std(elapsed).expect("a run lasts less than ages")
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// What a database holds at one moment.
#[derive(Debug, Clone, Default)]
struct Size {
    /// The figure the first goal compares: SQLite's file and log, the sum
    /// of PostgreSQL's tables.
    bytes: u64,
    /// Each table's bytes, its indexes included.
    tables: BTreeMap<String, u64>,
    /// Task rows stored.
    tasks: i64,
    /// SQLite: page size, `page_count`, `freelist_count`, file and log bytes.
    pages: Option<(u64, u64, u64, u64, u64)>,
    /// PostgreSQL: dead tuples, vacuums so far (auto and manual), and
    /// `n_tup_ins + n_tup_upd + n_tup_del`, each summed over the tables.
    server: Option<(i64, i64, i64)>,
    /// How long reading all this took.
    probe: Duration,
}

/// Reads a database's size from a connection of its own.
enum Probe {
    Sqlite {
        path: PathBuf,
        conn: rusqlite::Connection,
    },
    Postgres {
        url: String,
        client: postgres::Client,
        schema: String,
    },
}

impl Probe {
    fn size(&mut self) -> Size {
        let began = Instant::now();
        let mut size = match self {
            Self::Sqlite { path, conn } => sqlite_size(path, conn),
            Self::Postgres {
                url,
                client,
                schema,
            } => {
                // A server restarted under the run (another test's, say)
                // breaks the connection: connect again and read again, for
                // a minute.
                let mut tries = 0;
                loop {
                    match postgres_size(client, schema) {
                        Ok(size) => break size,
                        Err(error) if tries < 60 => {
                            eprintln!("soak: reading the sizes failed ({error}); connecting again");
                            tries += 1;
                            thread::sleep(Duration::from_secs(1));
                            if let Ok(again) = postgres::Client::connect(url, postgres::NoTls) {
                                *client = again;
                            }
                        }
                        Err(error) => panic!("the server is gone: {error}"),
                    }
                }
            }
        };
        size.probe = began.elapsed();
        size
    }
}

fn sqlite_size(path: &Path, conn: &rusqlite::Connection) -> Size {
    let pragma = |name: &str| -> u64 {
        conn.pragma_query_value(None, name, |row| row.get::<_, i64>(0))
            .unwrap() as u64
    };
    let file = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let tasks: i64 = conn
        .query_row("SELECT count(*) FROM tasks", [], |row| row.get(0))
        .unwrap();
    let (page_size, page_count, free) = (
        pragma("page_size"),
        pragma("page_count"),
        pragma("freelist_count"),
    );
    // Each b-tree but the audit table's is read on its own (a short read
    // each: a reader holding one snapshot for the whole file would keep the
    // log from starting over, and grow it); the audit table, the largest,
    // is what remains of the pages in use. Indexes are charged to their
    // table.
    let owners: Vec<(String, String)> = conn
        .prepare(
            "SELECT name, tbl_name FROM sqlite_master \
             WHERE type IN ('table', 'index') AND rootpage > 0 AND tbl_name <> 'access_audit'",
        )
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .chain([("sqlite_schema".to_owned(), "sqlite_schema".to_owned())])
        .collect();
    let mut tables = BTreeMap::new();
    let mut statement = conn
        .prepare("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ?1 AND aggregate = TRUE")
        .unwrap();
    for (name, table) in owners {
        let bytes: i64 = statement.query_row([&name], |row| row.get(0)).unwrap();
        *tables.entry(table).or_default() += bytes as u64;
    }
    let measured: u64 = tables.values().sum();
    tables.insert(
        "access_audit".to_owned(),
        ((page_count - free) * page_size).saturating_sub(measured),
    );
    Size {
        bytes: file + wal,
        tables,
        tasks,
        pages: Some((page_size, page_count, free, file, wal)),
        ..Size::default()
    }
}

fn postgres_size(client: &mut postgres::Client, schema: &str) -> Result<Size, postgres::Error> {
    let rows = client.query(
        "SELECT c.relname::text, pg_total_relation_size(c.oid)::bigint, \
             COALESCE(s.n_dead_tup, 0)::bigint, \
             COALESCE(s.autovacuum_count + s.vacuum_count, 0)::bigint, \
             COALESCE(s.n_tup_ins + s.n_tup_upd + s.n_tup_del, 0)::bigint \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
             WHERE n.nspname = $1 AND c.relkind = 'r'",
        &[&schema],
    )?;
    let mut size = Size::default();
    let (mut dead, mut vacuums, mut changed) = (0, 0, 0);
    for row in rows {
        let bytes = row.get::<_, i64>(1) as u64;
        size.tables.insert(row.get(0), bytes);
        size.bytes += bytes;
        dead += row.get::<_, i64>(2);
        vacuums += row.get::<_, i64>(3);
        changed += row.get::<_, i64>(4);
    }
    size.server = Some((dead, vacuums, changed));
    size.tasks = client
        .query_one(&format!("SELECT count(*) FROM \"{schema}\".tasks"), &[])?
        .get(0);
    Ok(size)
}

/// One report: the tasks finished, when, the meter and the size.
#[derive(Debug, Clone)]
struct Snapshot {
    done: u64,
    at: Duration,
    meter: MeterSnapshot,
    size: Size,
}

/// What the worker threads share.
struct Run<'a> {
    store: &'a Store,
    caller: &'a Caller,
    namespace: Namespace,
    queue: QueueName,
    tasks: u64,
    rate: f64,
    reports: u64,
    start: Instant,
    /// The next task to start.
    next: AtomicU64,
    /// Tasks submitted (or given up on after a failed call).
    finished: AtomicU64,
    /// Claim latencies in microseconds, by the report interval in which
    /// their task finished.
    latencies: Mutex<Vec<Vec<u32>>>,
    /// The most a task started after its due time, in microseconds.
    lag: AtomicU64,
    empty_claims: AtomicU64,
    errors: AtomicU64,
}

impl Run<'_> {
    fn failed(&self, what: &str, error: &tessera_store::Error) {
        if self.errors.fetch_add(1, Ordering::Relaxed) < ERRORS_PRINTED {
            eprintln!("soak: {what} failed: {error}");
        }
    }

    /// One task: enqueued, the oldest claimed, submitted. The claim's
    /// latency, or `None` when a call failed.
    fn task(&self) -> Option<Duration> {
        let brief = Brief::Bytes(br#"{"frame":42}"#.to_vec());
        if let Err(error) = self.store.enqueue(
            self.caller,
            &self.namespace,
            &self.queue,
            &brief,
            &EnqueueOptions::default(),
        ) {
            self.failed("enqueue", &error);
            return None;
        }
        let began = Instant::now();
        let claimed = loop {
            match self.store.claim(self.caller, &self.namespace, &self.queue) {
                Ok(ClaimOutcome::Granted(claimed)) => break claimed,
                Ok(_) => {
                    self.empty_claims.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    self.failed("claim", &error);
                    return None;
                }
            }
        };
        let latency = began.elapsed();
        let key = IdempotencyKey::parse("done").unwrap();
        match self.store.submit(
            self.caller,
            &claimed.task,
            claimed.lease.token(),
            &key,
            &Output::bytes("ok"),
        ) {
            Ok(Submitted::Accepted(_)) => Some(latency),
            Ok(other) => {
                eprintln!("soak: submit answered {other:?}");
                None
            }
            Err(error) => {
                self.failed("submit", &error);
                None
            }
        }
    }

    fn work(&self) {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            if n >= self.tasks {
                return;
            }
            let due = self.start + Duration::from_secs_f64(n as f64 / self.rate);
            let now = Instant::now();
            match due.checked_duration_since(now) {
                Some(wait) => thread::sleep(wait),
                None => {
                    let late = (now - due).as_micros() as u64;
                    self.lag.fetch_max(late, Ordering::Relaxed);
                }
            }
            let latency = self.task();
            let done = self.finished.fetch_add(1, Ordering::Relaxed);
            if let Some(latency) = latency {
                let interval = (done * self.reports / self.tasks) as usize;
                let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
                self.latencies.lock()[interval].push(micros);
            }
        }
    }
}

/// A store and its worker, on `backend`, with `retention`.
struct Opened {
    store: Store,
    caller: Caller,
    probe: Probe,
    // Dropped last: the store's connections close before the schema goes.
    _schema: Option<PostgresSchema>,
    _dir: Option<tempfile::TempDir>,
}

fn open(options: &Options, retention: Retention, label: &str) -> Opened {
    let clock: Arc<dyn Clock> = Arc::new(FastClock::new(options.speedup));
    let config = StoreConfig::default()
        .with_clock(clock)
        .with_lease_duration((LEASE * options.speedup).min(MAX_LEASE_DURATION))
        .with_retention(retention)
        .with_retention_interval(options.interval * options.speedup);
    let (store, probe, schema, dir) = match options.backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tessera.db");
            let store = Store::open(&path, config).unwrap();
            let conn = rusqlite::Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .unwrap();
            (store, Probe::Sqlite { path, conn }, None, Some(dir))
        }
        Backend::Postgres => {
            let url = postgres_url().expect("checked in main");
            let schema =
                PostgresSchema::fresh(&url, format!("soak_{}_{label}", std::process::id()));
            let pg = PostgresOptions::new(url.as_str())
                .with_schema(schema.name())
                .with_pool_size(options.threads as u32 + 2);
            let store = Store::open_postgres(pg, config).unwrap();
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            if let Some(threshold) = options.autovacuum {
                for table in NAMED {
                    client
                        .batch_execute(&format!(
                            "ALTER TABLE \"{}\".{table} SET (autovacuum_vacuum_scale_factor = 0, \
                             autovacuum_vacuum_threshold = {threshold}, \
                             autovacuum_vacuum_cost_delay = 0)",
                            schema.name()
                        ))
                        .unwrap();
                }
            }
            let probe = Probe::Postgres {
                url: url.clone(),
                client,
                schema: schema.name().to_owned(),
            };
            (store, probe, Some(schema), None)
        }
    };
    let admin_key = store.create_admin_key("operators").unwrap();
    let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
    let spec = KeySpec::keyed("soak")
        .with_scopes(Scope::ALL.iter().copied())
        .with_grant(Grant::Namespace(Namespace::parse("soak").unwrap()));
    let key = store.create_key(&admin, &spec).unwrap();
    let caller = store.authenticate(Some(key.secret.expose())).unwrap();
    Opened {
        store,
        caller,
        probe,
        _schema: schema,
        _dir: dir,
    }
}

/// Runs `tasks` tasks on `opened` at the options' rate, calling `report`
/// at each of `reports` evenly spaced counts of finished tasks (and once
/// before the first task). Returns the snapshots and the latencies by
/// interval.
fn soak(
    options: &Options,
    opened: &mut Opened,
    tasks: u64,
    reports: u64,
    mut report: impl FnMut(&[Snapshot], &[u32]),
) -> (Vec<Snapshot>, Vec<Vec<u32>>, RunCounts) {
    let Opened {
        store,
        caller,
        probe,
        ..
    } = opened;
    let run = Run {
        store,
        caller,
        namespace: Namespace::parse("soak").unwrap(),
        queue: QueueName::parse("soak").unwrap(),
        tasks,
        rate: options.rate,
        reports,
        start: Instant::now(),
        next: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        latencies: Mutex::new(vec![Vec::new(); reports as usize]),
        lag: AtomicU64::new(0),
        empty_claims: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    };
    let mut snapshots = vec![Snapshot {
        done: 0,
        at: Duration::ZERO,
        meter: store.meter(),
        size: probe.size(),
    }];
    let mut failed = 0;
    thread::scope(|scope| {
        for _ in 0..options.threads {
            scope.spawn(|| run.work());
        }
        for k in 1..=reports {
            let target = tasks * k / reports;
            while run.finished.load(Ordering::Relaxed) < target {
                thread::sleep(Duration::from_millis(20));
            }
            let at = run.start.elapsed();
            let meter = store.meter();
            let done = run.finished.load(Ordering::Relaxed);
            let size = probe.size();
            snapshots.push(Snapshot {
                done,
                at,
                meter,
                size,
            });
            let latencies = run.latencies.lock()[k as usize - 1].clone();
            report(&snapshots, &latencies);
            let errors = run.errors.load(Ordering::Relaxed);
            if errors > failed {
                eprintln!(
                    "soak: {} calls failed before {done} tasks were done",
                    errors - failed
                );
                failed = errors;
            }
        }
    });
    let counts = RunCounts {
        lag: Duration::from_micros(run.lag.load(Ordering::Relaxed)),
        empty_claims: run.empty_claims.load(Ordering::Relaxed),
        errors: run.errors.load(Ordering::Relaxed),
        elapsed: run.start.elapsed(),
    };
    (snapshots, run.latencies.into_inner(), counts)
}

/// What a run counted beside its snapshots.
#[derive(Debug, Clone, Copy)]
struct RunCounts {
    lag: Duration,
    empty_claims: u64,
    errors: u64,
    elapsed: Duration,
}

/// The `p`-quantile of sorted microseconds, in milliseconds.
fn quantile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1]) / 1000.0
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The tables the reports name one by one; the rest are summed as "other".
const NAMED: [&str; 3] = ["tasks", "attempts", "access_audit"];

fn header(backend: Backend) {
    let (specific, divider) = match backend {
        Backend::Sqlite => ("| pages | free pages | WAL MiB |", "| ---: | ---: | ---: |"),
        Backend::Postgres => (
            "| dead tuples | vacuums | rows/task (pg_stat) |",
            "| ---: | ---: | ---: |",
        ),
    };
    println!(
        "| done | s | tasks/s | size MiB | tasks MiB | attempts MiB | audit MiB | other MiB | tasks stored | rows/task {specific} claim p50 ms | p99 ms | max ms | probe ms |"
    );
    println!(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: {divider} ---: | ---: | ---: | ---: |"
    );
}

fn row(snapshots: &[Snapshot], latencies: &[u32]) {
    let [.., before, now] = snapshots else {
        return;
    };
    let tasks = (now.done - before.done).max(1) as f64;
    let seconds = (now.at - before.at).as_secs_f64().max(1e-9);
    let rows = now.meter.since(&before.meter).rows_written as f64 / tasks;
    let table = |name: &str| mib(now.size.tables.get(name).copied().unwrap_or(0));
    let other: u64 = now
        .size
        .tables
        .iter()
        .filter(|(name, _)| !NAMED.contains(&name.as_str()))
        .map(|(_, bytes)| bytes)
        .sum();
    let specific = match (now.size.pages, now.size.server, before.size.server) {
        (Some((_, pages, free, _, wal)), _, _) => {
            format!("{pages} | {free} | {:.1}", mib(wal))
        }
        (None, Some((dead, vacuums, changed)), Some((_, _, earlier))) => {
            format!(
                "{dead} | {vacuums} | {:.1}",
                (changed - earlier) as f64 / tasks
            )
        }
        _ => "– | – | –".to_owned(),
    };
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    println!(
        "| {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {specific} | {:.2} | {:.2} | {:.1} | {} |",
        now.done,
        now.at.as_secs_f64(),
        tasks / seconds,
        mib(now.size.bytes),
        table("tasks"),
        table("attempts"),
        table("access_audit"),
        mib(other),
        now.size.tasks,
        rows,
        quantile(&sorted, 0.5),
        quantile(&sorted, 0.99),
        quantile(&sorted, 1.0),
        now.size.probe.as_millis(),
    );
}

/// Rows written per task between two snapshots, by the store's meter.
fn rows_per_task(from: &Snapshot, to: &Snapshot) -> f64 {
    to.meter.since(&from.meter).rows_written as f64 / (to.done - from.done).max(1) as f64
}

/// The sorted claim latencies of intervals `range`.
fn merged(latencies: &[Vec<u32>], range: std::ops::Range<usize>) -> Vec<u32> {
    let mut all: Vec<u32> = latencies[range].iter().flatten().copied().collect();
    all.sort_unstable();
    all
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn main() {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("soak: nothing to do without a backend; {USAGE}");
            return;
        }
        Err(error) => {
            eprintln!("soak: {error}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if options.backend == Backend::Postgres && postgres_url().is_none() {
        println!(
            "skipping the PostgreSQL soak: neither TESSERA_BENCH_POSTGRES_URL nor TESSERA_TEST_POSTGRES_URL is set"
        );
        return;
    }
    let retention = Retention {
        done: Some(options.keep_done * options.speedup),
        ..Retention::default()
    };
    println!(
        "soak: {:?}, {} tasks offered at {} a second from {} threads; done kept {:?}, retention every {:?} (real time; the store's clock runs {}x: done kept {:?}, retention every {:?} by it)",
        options.backend,
        options.tasks,
        options.rate,
        options.threads,
        options.keep_done,
        options.interval,
        options.speedup,
        options.keep_done * options.speedup,
        options.interval * options.speedup,
    );
    let mut opened = open(&options, retention, "run");
    header(options.backend);
    let (snapshots, latencies, counts) =
        soak(&options, &mut opened, options.tasks, options.reports, row);
    drop(opened);
    println!(
        "\nran {} tasks in {:.0} s ({:.0} a second); latest start after its due time {:.2?}; empty claims {}; failed calls {}",
        options.tasks,
        counts.elapsed.as_secs_f64(),
        options.tasks as f64 / counts.elapsed.as_secs_f64(),
        counts.lag,
        counts.empty_claims,
        counts.errors,
    );

    let quarter = (options.reports / 4) as usize;
    let (q1, q2, q3, q4) = (
        &snapshots[quarter],
        &snapshots[2 * quarter],
        &snapshots[3 * quarter],
        &snapshots[4 * quarter],
    );
    println!("\nEach table's bytes (indexes included) at the end of each quarter:\n");
    println!("| table | Q1 MiB | Q2 MiB | Q3 MiB | Q4 MiB | Q4 over Q2 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, &bytes) in &q4.size.tables {
        let at = |snapshot: &Snapshot| snapshot.size.tables.get(name).copied().unwrap_or(0);
        let growth = if at(q2) == 0 {
            "–".to_owned()
        } else {
            format!("{:+.1}%", (bytes as f64 / at(q2) as f64 - 1.0) * 100.0)
        };
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {growth} |",
            mib(at(q1)),
            mib(at(q2)),
            mib(at(q3)),
            mib(bytes)
        );
    }
    let without_audit = |snapshot: &Snapshot| -> u64 {
        snapshot
            .size
            .tables
            .iter()
            .filter(|(name, _)| name.as_str() != "access_audit")
            .map(|(_, bytes)| bytes)
            .sum()
    };

    println!("\nGoals:\n");
    let growth = q4.size.bytes as f64 / q2.size.bytes as f64 - 1.0;
    let what = match options.backend {
        Backend::Sqlite => "the file and its log",
        Backend::Postgres => "pg_total_relation_size summed over the tables",
    };
    println!(
        "1. size levels off ({what}): {:.1} MiB at the end of Q2, {:.1} MiB at the end of Q4, {:+.1}% (goal under +5%): {}",
        mib(q2.size.bytes),
        mib(q4.size.bytes),
        growth * 100.0,
        verdict(growth < 0.05),
    );
    let (a, b) = (without_audit(q2), without_audit(q4));
    println!(
        "   without the audit table: {:.1} MiB, {:.1} MiB, {:+.1}%",
        mib(a),
        mib(b),
        (b as f64 / a as f64 - 1.0) * 100.0,
    );
    if let (Some(p2), Some(p4)) = (q2.size.pages, q4.size.pages) {
        let used = |(size, pages, free, _, _): (u64, u64, u64, u64, u64)| (pages - free) * size;
        println!(
            "   pages in use (page_count - freelist_count): {:.1} MiB, {:.1} MiB, {:+.1}%",
            mib(used(p2)),
            mib(used(p4)),
            (used(p4) as f64 / used(p2) as f64 - 1.0) * 100.0,
        );
    }
    let second = merged(&latencies, quarter..2 * quarter);
    let last = merged(&latencies, 3 * quarter..4 * quarter);
    let (p2, p4) = (quantile(&second, 0.99), quantile(&last, 0.99));
    println!(
        "2. claim p99 steady: {p2:.2} ms in Q2, {p4:.2} ms in Q4, {:.2}x (goal at most 1.5x): {}",
        p4 / p2,
        verdict(p4 <= 1.5 * p2),
    );
    println!(
        "   p50 {:.2} / {:.2} ms, p99.9 {:.2} / {:.2} ms, max {:.1} / {:.1} ms",
        quantile(&second, 0.5),
        quantile(&last, 0.5),
        quantile(&second, 0.999),
        quantile(&last, 0.999),
        quantile(&second, 1.0),
        quantile(&last, 1.0),
    );
    let with_deletes = rows_per_task(q3, q4);
    println!(
        "\nRows written per task (the store's meter{}), deletes included, over Q4: {with_deletes:.2}",
        match options.backend {
            Backend::Sqlite => ", index entries counted",
            Backend::Postgres => ": table rows changed",
        }
    );
    if options.backend == Backend::Sqlite {
        println!(
            "   rows read per task over Q4: {:.2}",
            q4.meter.since(&q3.meter).rows_read as f64 / (q4.done - q3.done) as f64
        );
    }
    let server_rows = |from: &Snapshot, to: &Snapshot| match (from.size.server, to.size.server) {
        (Some((_, _, a)), Some((_, _, b))) => Some((b - a) as f64 / (to.done - from.done) as f64),
        _ => None,
    };
    let server_with_deletes = server_rows(q3, q4);
    if let Some(rows) = server_with_deletes {
        println!("   by pg_stat_user_tables (n_tup_ins + n_tup_upd + n_tup_del): {rows:.2}");
    }
    let day = Duration::from_secs(24 * 60 * 60);
    if counts.elapsed * options.speedup < day {
        println!(
            "   (the run lasted {:.1} h on the store's clock, under the audit's day: no audit row was deleted)",
            (counts.elapsed * options.speedup).as_secs_f64() / 3600.0
        );
    }
    if options.compare == 0 {
        return;
    }
    let compare_reports = 4;
    let mut opened = open(&options, Retention::FOREVER, "forever");
    let (snapshots, _, counts) = soak(
        &options,
        &mut opened,
        options.compare,
        compare_reports,
        |_, _| {},
    );
    drop(opened);
    // The first quarter is left out, as its tables warm up.
    let without = rows_per_task(&snapshots[1], &snapshots[compare_reports as usize]);
    println!(
        "   with Retention::FOREVER, {} tasks at the same rate ({:.0} s, failed calls {}), last three quarters: {without:.2}; the deletes add {:.2} a task ({:+.0}%)",
        options.compare,
        counts.elapsed.as_secs_f64(),
        counts.errors,
        with_deletes - without,
        (with_deletes / without - 1.0) * 100.0,
    );
    let last = &snapshots[compare_reports as usize];
    if let (Some(with), Some(without)) = (server_with_deletes, server_rows(&snapshots[1], last)) {
        println!(
            "   by pg_stat_user_tables: {without:.2} with Retention::FOREVER; the deletes add {:.2} a task ({:+.0}%)",
            with - without,
            (with / without - 1.0) * 100.0,
        );
    }
}
