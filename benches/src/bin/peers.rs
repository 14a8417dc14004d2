//! Tessera beside graphile-worker on one PostgreSQL server, each with the
//! server's own statistics, and the server's floor measured in the same
//! run; then Tessera's processing rate on SQLite beside SQLite's floor.
//!
//! Run everything with one command: `benches/peers/run.sh [JOBS]`, which
//! installs graphile-worker (the version `benches/peers/package.json`
//! pins) outside the repository and then runs this program:
//!
//! `TESSERA_PEER_GRAPHILE=<dir with node_modules> TESSERA_BENCH_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --release -p tessera-benches --bin peers -- [JOBS] [postgres|sqlite]`
//!
//! `JOBS` (default 10,000) no-op jobs per step. Without
//! `TESSERA_PEER_GRAPHILE` only Tessera's side runs; without a server URL
//! (`TESSERA_BENCH_POSTGRES_URL`, else `TESSERA_TEST_POSTGRES_URL`) only
//! SQLite does. `TESSERA_PEERS_STEPS` (for example `4,8,4b`) runs only
//! the processing steps it names, by worker count, `b` for batched, in its
//! order; the first enqueues one per call. A step named again runs again
//! (`4,4,4,4` four times), and the run ends with each repeated step's
//! ratios and their median: one run's ratio moves with the machine.
//! Tessera's connection pool holds twice this machine's cores (the
//! server's, as the server runs here), as `PostgresOptions::with_pool_size`
//! advises; `TESSERA_PEERS_POOL` sets another size. graphile-worker keeps
//! its own pool, at least 10.
//!
//! PostgreSQL: each system has a database of its own on the same server,
//! `tessera_bench` and `graphile_bench` (created when missing), so
//! `pg_stat_database` counts one system's work alone. The steps run in
//! this order, each first for Tessera and then for graphile-worker (a
//! repeated step every second time the other way round):
//!
//! 1. enqueue `JOBS`, one per call (`enqueue`; `addJob`), then process
//!    them with 1 worker, one job per claim;
//! 2. for 2, 4 and 8 workers: enqueue `JOBS`, 1,000 per call
//!    (`enqueue_batch`; `addJobs`), then process them one job per claim;
//! 3. for each of `BATCHED_WORKERS`: enqueue `JOBS` 1,000 per call, then
//!    process them batched (Tessera: `claim_batch` of 100 and one
//!    `submit_batch` of what it got; graphile-worker: a local queue of
//!    100 and batched completions).
//!
//! Processing is "no-op": Tessera's workers are threads of one process
//! sharing one `Store`, each with its own key, each claiming and
//! submitting until its claim finds the queue empty (one job per claim:
//! a `claim`, then `submit_and_claim` for each task, whose submission
//! carries the next claim); graphile-worker's
//! are one `run()` with `concurrentJobs` set to the count (the script
//! `benches/peers/graphile.js`). Each step's rate is its jobs over its own
//! time; for graphile-worker that time runs from `run()` to the end of
//! `stop()`, which waits for every completion. Every processing step but
//! the first starts right after a `VACUUM (ANALYZE)` of the system's
//! database: a claim's index search walks past the entries earlier claims
//! left until a vacuum removes them (for both systems alike), so each
//! step starts with none, rather than with however many autovacuum's
//! once-a-minute visit happened to leave. Every step starts right after a
//! `CHECKPOINT`, so each system's first write to a page after it logs the
//! whole page, the same for both. Each step's CPU time a job is the
//! machine's busy time (`/proc/stat`) less this program's and its
//! children's (`/proc/self/stat`: Tessera's threads, graphile-worker's
//! Node process), so with the server on this machine it is the server's
//! work, and then the client's. Around every step this
//! program reads, on a connection to the server's maintenance database,
//! once the system's connections have all closed (so every backend has
//! flushed its counters): `xact_commit`, `tup_inserted`, `tup_updated` and
//! `tup_deleted` of the system's database, and `pg_current_wal_lsn()`.
//! The log position is the whole server's: anything else running on the
//! server at the time is counted too. The floor is one-row commits
//! (`MinimalCommit`) from 1 and from 8 clients, measured before the first
//! step and after the last, so a change in the machine's load during the
//! run shows. Last, the floor of a job's own rows: the six rows one job
//! per claim changes, at random tasks of Tessera's tables, written in one
//! data-modifying statement a job (one round trip, one commit, no reads),
//! from 1, 4 and 8 clients.
//!
//! SQLite: in a temporary directory, the minimal commit (one row,
//! `BEGIN IMMEDIATE` … `COMMIT`, the store's journal settings) from 1
//! thread, then for 1, 2, 4 and 8 worker threads `JOBS` tasks enqueued
//! 1,000 per call and processed one per claim, then batched, then by 1, 2
//! and 4 threads sharing one `Worker` (the worker loop: it fetches 100
//! ahead and acknowledges later, the worker holding up to 100
//! acknowledgements for one transaction through the completer), the same
//! with 2,000 tasks that each take 1 ms (a sleep, as a task waiting on
//! I/O does), and last the floor
//! under a task: the six rows its claim and submission change, written by
//! hand into the same file, 1 and then 100 tasks to a commit. "Minimal
//! commits per task" is the time of one task in minimal commits: the
//! minimal commit rate over the task rate.
//!
//! Every check that could fail is made: each step processes exactly
//! `JOBS` jobs, no Tessera task is claimed twice, and graphile-worker's
//! job table is empty after each processing step.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tessera_benches::{
    MinimalCommit, PostgresSchema, SqliteMinimalCommit, idempotency_key, postgres_url, queue,
};
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    Brief, Caller, ClaimOutcome, Claimed, EnqueueOptions, Grant, KeySpec, Namespace, Output, Scope,
    Store, StoreConfig, SubmitRequest, Submitted, Worker, WorkerNext, WorkerOptions,
};

/// Worker counts of the one-job-per-claim steps.
const WORKERS: [usize; 4] = [1, 2, 4, 8];
/// Worker counts of the batched steps.
const BATCHED_WORKERS: [usize; 2] = [4, 8];
/// Threads sharing one `Worker` in the SQLite worker-loop steps.
const LOOP_THREADS: [usize; 3] = [1, 2, 4];
/// Tasks per `claim_batch`, and graphile-worker's local queue size.
const CLAIM_BATCH: usize = 100;
/// Tasks per `enqueue_batch` and per `addJobs`.
const ENQUEUE_BATCH: usize = 1_000;
/// Client counts of the PostgreSQL floor.
const FLOOR_CLIENTS: [usize; 2] = [1, 8];
/// Minimal commits per floor measurement.
const FLOOR_COMMITS: usize = 2_000;
/// Jobs per measurement of the floor of a job's own rows.
const SAME_ROWS_JOBS: usize = 4_000;
/// Client counts of the floor of a job's own rows.
const SAME_ROWS_CLIENTS: [usize; 3] = [1, 4, 8];
const QUEUE: &str = "peers";
const TESSERA_DATABASE: &str = "tessera_bench";
const GRAPHILE_DATABASE: &str = "graphile_bench";

fn main() {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().map_or(10_000, |arg| arg.parse().unwrap());
    let only = args.next();
    if only.as_deref() != Some("sqlite") {
        match postgres_url() {
            Some(url) => postgres(&url, jobs),
            None => println!(
                "skipping PostgreSQL: neither TESSERA_BENCH_POSTGRES_URL nor TESSERA_TEST_POSTGRES_URL is set"
            ),
        }
    }
    if only.as_deref() != Some("postgres") {
        sqlite(jobs);
    }
}

/// The processing steps in order: worker count and whether batched. By
/// default every step once; `TESSERA_PEERS_STEPS` lists the steps to run
/// in its own order, a step listed twice running twice (a name that is no
/// step, such as `none`, runs nothing).
fn steps() -> Vec<(usize, bool)> {
    let all = WORKERS
        .iter()
        .map(|&workers| (workers, false))
        .chain(BATCHED_WORKERS.iter().map(|&workers| (workers, true)));
    let name =
        |(workers, batched): (usize, bool)| format!("{workers}{}", if batched { "b" } else { "" });
    match std::env::var("TESSERA_PEERS_STEPS") {
        Err(_) => all.collect(),
        Ok(listed) => listed
            .split(',')
            .filter_map(|listed| all.clone().find(|&step| name(step) == listed))
            .collect(),
    }
}

/// The size of Tessera's connection pool: `TESSERA_PEERS_POOL`, else
/// twice this machine's cores.
fn pool_size() -> u32 {
    match std::env::var("TESSERA_PEERS_POOL") {
        Ok(listed) => listed
            .parse()
            .unwrap_or_else(|_| panic!("TESSERA_PEERS_POOL={listed:?} is not a pool size")),
        Err(_) => thread::available_parallelism().map_or(2, |cores| cores.get()) as u32 * 2,
    }
}

/// Measures a step of both systems, graphile-worker's first when
/// `graphile_first`: a step run again swaps the order, so that neither
/// system always runs on the other's heels (its autovacuum, its cache).
fn in_turn(
    monitor: &mut Monitor,
    graphile_first: bool,
    tessera: impl FnOnce(&mut Monitor) -> Measured,
    graphile: impl FnOnce(&mut Monitor) -> Option<Measured>,
) -> (Measured, Option<Measured>) {
    if graphile_first {
        let g = graphile(monitor);
        (tessera(monitor), g)
    } else {
        let t = tessera(monitor);
        (t, graphile(monitor))
    }
}

/// One step's outcome: jobs, seconds, and the server's counters over it.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    jobs: u64,
    seconds: f64,
    counters: Counters,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.jobs as f64 / self.seconds
    }

    fn per_job(&self, value: i64) -> f64 {
        value as f64 / self.jobs as f64
    }

    /// CPU milliseconds a job: the rest of the machine (the server, when it
    /// runs here) and this program with its children (the system's client),
    /// `–` where not measured.
    fn cpu_per_job(&self) -> String {
        let counters = self.counters;
        let rest = counters
            .machine_cpu
            .zip(counters.client_cpu)
            .map(|(machine, client)| machine - client);
        let ms = |cpu: Option<f64>| {
            cpu.map_or("–".to_owned(), |cpu| {
                format!("{:.3}", cpu * 1e3 / self.jobs as f64)
            })
        };
        format!("{} + {}", ms(rest), ms(counters.client_cpu))
    }
}

/// What `pg_stat_database` and the write-ahead log say of one database.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    commits: i64,
    inserted: i64,
    updated: i64,
    deleted: i64,
    wal_bytes: i64,
    /// CPU seconds the whole machine was busy, where `/proc/stat` says.
    machine_cpu: Option<f64>,
    /// CPU seconds of this process and its reaped children (graphile-
    /// worker's Node process).
    client_cpu: Option<f64>,
}

impl Counters {
    fn since(self, earlier: Self) -> Self {
        Self {
            commits: self.commits - earlier.commits,
            inserted: self.inserted - earlier.inserted,
            updated: self.updated - earlier.updated,
            deleted: self.deleted - earlier.deleted,
            wal_bytes: self.wal_bytes - earlier.wal_bytes,
            machine_cpu: self
                .machine_cpu
                .zip(earlier.machine_cpu)
                .map(|(a, b)| a - b),
            client_cpu: self.client_cpu.zip(earlier.client_cpu).map(|(a, b)| a - b),
        }
    }

    fn rows(self) -> i64 {
        self.inserted + self.updated + self.deleted
    }
}

/// The connection that reads the server's statistics, on the maintenance
/// database so that its own transactions count in neither system's.
struct Monitor {
    client: postgres::Client,
    url: String,
}

impl Monitor {
    fn connect(url: &str) -> Self {
        Self {
            client: postgres::Client::connect(url, postgres::NoTls).unwrap(),
            url: url.to_owned(),
        }
    }

    fn ensure_database(&mut self, name: &str) {
        let exists = self
            .client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
            .unwrap()
            .is_some();
        if !exists {
            self.client
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .unwrap();
        }
    }

    /// The counters of `database`, once no client is connected to it: a
    /// backend flushes its counters when it exits.
    fn counters(&mut self, database: &str) -> Counters {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let connected: i64 = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = $1 AND backend_type = 'client backend'",
                    &[&database],
                )
                .unwrap()
                .get(0);
            if connected == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{connected} clients stay connected to {database}"
            );
            thread::sleep(Duration::from_millis(20));
        }
        let row = self
            .client
            .query_one(
                "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted,
                        pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
                 FROM pg_stat_database WHERE datname = $1",
                &[&database],
            )
            .unwrap();
        Counters {
            commits: row.get(0),
            inserted: row.get(1),
            updated: row.get(2),
            deleted: row.get(3),
            wal_bytes: row.get(4),
            machine_cpu: machine_busy(),
            client_cpu: own_cpu(),
        }
    }

    /// Runs `step`, which returns jobs and seconds, between two readings of
    /// `database`'s counters, right after a checkpoint, and when `vacuum`
    /// after a `VACUUM (ANALYZE)` of `database` before it. A claim's index
    /// search walks the entries that earlier claims left behind until a
    /// vacuum removes them, and autovacuum visits each database once a
    /// minute, so without one how many a step starts with would be chance.
    /// (Not before the first processing step: it would record the tables
    /// no job has reached yet as empty, and plans made then would search
    /// them as if they stayed so.) A step that a timed checkpoint falls in
    /// writes each page it touches whole into the log once more, so
    /// without one which system paid for it would be chance too. Where the
    /// role may not vacuum or checkpoint, steps run without.
    fn measure(
        &mut self,
        database: &str,
        vacuum: bool,
        step: impl FnOnce() -> (u64, f64),
    ) -> Measured {
        if vacuum
            && let Ok(mut client) =
                postgres::Client::connect(&with_database(&self.url, database), postgres::NoTls)
        {
            let _ = client.batch_execute("VACUUM (ANALYZE)");
        }
        let _ = self.client.batch_execute("CHECKPOINT");
        let before = self.counters(database);
        let (jobs, seconds) = step();
        let after = self.counters(database);
        Measured {
            jobs,
            seconds,
            counters: after.since(before),
        }
    }
}

/// The kernel's user ticks a second on Linux, the unit of `/proc`'s times.
const TICKS: f64 = 100.0;

/// CPU seconds this process and the children it waited for (graphile-
/// worker's Node process) have run, from `/proc/self/stat`.
fn own_cpu() -> Option<f64> {
    let line = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command's closing parenthesis: state, then utime, stime,
    // cutime and cstime are the 12th to the 15th fields.
    let fields: Vec<&str> = line.rsplit_once(')')?.1.split_whitespace().collect();
    (11..15)
        .map(|at| fields.get(at)?.parse::<f64>().ok())
        .sum::<Option<f64>>()
        .map(|ticks| ticks / TICKS)
}

/// CPU seconds all of the machine's cores have been busy (user, nice,
/// system, interrupts), from `/proc/stat`: idle, I/O wait and time stolen
/// by a hypervisor are left out.
fn machine_busy() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let busy = [0, 1, 2, 5, 6]
        .iter()
        .map(|&at| fields.get(at))
        .sum::<Option<f64>>()?;
    Some(busy / TICKS)
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |at| authority_start + at);
    let mut out = format!("{}/{database}", &base[..path_start]);
    if !query.is_empty() {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// A figure of both systems: Tessera's and, if it ran, graphile-worker's.
struct Row {
    figure: String,
    tessera: Measured,
    graphile: Option<Measured>,
}

fn postgres(url: &str, jobs: usize) {
    let mut monitor = Monitor::connect(url);
    monitor.ensure_database(TESSERA_DATABASE);
    let tessera_url = with_database(url, TESSERA_DATABASE);
    let graphile = Graphile::find(url, &mut monitor);
    if graphile.is_none() {
        println!("graphile-worker: TESSERA_PEER_GRAPHILE is not set; Tessera's side only");
    }
    let floor_schema = PostgresSchema::fresh(&tessera_url, "peers_floor");
    let floor = MinimalCommit::create(&floor_schema, 8);
    let floor_before: Vec<f64> = FLOOR_CLIENTS
        .iter()
        .map(|&clients| postgres_floor(&floor, clients))
        .collect();
    // Its clients close, so that the steps' counters can be read.
    drop(floor);
    let schema = PostgresSchema::fresh(&tessera_url, "peers");
    let tessera = Tessera::setup(&tessera_url, schema.name());
    if let Some(graphile) = &graphile {
        graphile.run(&["reset"]);
    }

    let mut enqueues = Vec::new();
    let mut processing = Vec::new();
    let steps = steps();
    for (round, &(workers, batched)) in steps.iter().enumerate() {
        let step = round as u64 + 1;
        let again = steps[..round]
            .iter()
            .filter(|&&earlier| earlier == (workers, batched))
            .count();
        let graphile_first = again % 2 == 1;
        let per_call = if round == 0 { 1 } else { ENQUEUE_BATCH };
        let figure = if per_call == 1 {
            "enqueue, one per call".to_owned()
        } else {
            format!("enqueue, {per_call} per call (before step {})", round + 1)
        };
        let (t, g) = in_turn(
            &mut monitor,
            graphile_first,
            |monitor| monitor.measure(TESSERA_DATABASE, false, || tessera.enqueue(jobs, per_call)),
            |monitor| {
                graphile.as_ref().map(|graphile| {
                    monitor.measure(GRAPHILE_DATABASE, false, || {
                        graphile.run(&["enqueue", &jobs.to_string(), &per_call.to_string()])
                    })
                })
            },
        );
        report_progress(&figure, &t, g.as_ref());
        enqueues.push(Row {
            figure,
            tessera: t,
            graphile: g,
        });

        let figure = if batched {
            format!("process batched, {workers} workers")
        } else {
            format!(
                "process one per claim, {workers} worker{}",
                if workers == 1 { "" } else { "s" }
            )
        };
        let (t, g) = in_turn(
            &mut monitor,
            graphile_first,
            |monitor| {
                monitor.measure(TESSERA_DATABASE, round > 0, || {
                    tessera.process(jobs, workers, batched, step)
                })
            },
            |monitor| {
                graphile.as_ref().map(|graphile| {
                    monitor.measure(GRAPHILE_DATABASE, round > 0, || {
                        let mut args =
                            vec!["process".to_owned(), jobs.to_string(), workers.to_string()];
                        if batched {
                            args.push("batched".to_owned());
                        }
                        let args: Vec<&str> = args.iter().map(String::as_str).collect();
                        graphile.run(&args)
                    })
                })
            },
        );
        report_progress(&figure, &t, g.as_ref());
        processing.push(Row {
            figure,
            tessera: t,
            graphile: g,
        });
    }
    drop(tessera);
    let same_rows: Vec<f64> = SAME_ROWS_CLIENTS
        .iter()
        .map(|&clients| same_rows_floor(&tessera_url, schema.name(), clients))
        .collect();

    let floor = MinimalCommit::attach(&tessera_url, floor_schema.name(), 8);
    let floor_after: Vec<f64> = FLOOR_CLIENTS
        .iter()
        .map(|&clients| postgres_floor(&floor, clients))
        .collect();
    drop(floor);
    drop(floor_schema);
    drop(schema);

    println!();
    println!(
        "PostgreSQL, {jobs} no-op jobs a step; rates in jobs/s; Tessera's pool: {} connections",
        pool_size()
    );
    println!();
    println!("| figure | Tessera | graphile-worker | Tessera / graphile-worker |");
    println!("| --- | ---: | ---: | ---: |");
    for row in enqueues.iter().take(2).chain(&processing) {
        let graphile = row.graphile.map(|g| g.rate());
        println!(
            "| {} | {:.0} | {} | {} |",
            row.figure,
            row.tessera.rate(),
            graphile.map_or("–".to_owned(), |rate| format!("{rate:.0}")),
            graphile.map_or("–".to_owned(), |rate| format!(
                "{:.2}×",
                row.tessera.rate() / rate
            )),
        );
    }
    print_repeated(&processing);
    let batch_rates: Vec<String> = enqueues
        .iter()
        .skip(1)
        .map(|row| {
            let graphile = row
                .graphile
                .map_or("–".to_owned(), |g| format!("{:.0}", g.rate()));
            format!("{:.0}/{graphile}", row.tessera.rate())
        })
        .collect();
    println!();
    println!(
        "every enqueue of {ENQUEUE_BATCH} per call (Tessera/graphile-worker): {}",
        batch_rates.join(", ")
    );
    println!();
    println!("Per processed job, from the server's statistics (WAL: the whole server's log)");
    println!();
    println!(
        "| step | system | transactions | rows inserted + updated + deleted | WAL bytes | \
         CPU ms: server + client |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for row in enqueues.iter().take(2).chain(&processing) {
        for (system, measured) in [
            ("Tessera", Some(row.tessera)),
            ("graphile-worker", row.graphile),
        ] {
            let Some(m) = measured else { continue };
            println!(
                "| {} | {system} | {:.2} | {:.2} ({:.2} + {:.2} + {:.2}) | {:.0} | {} |",
                row.figure,
                m.per_job(m.counters.commits),
                m.per_job(m.counters.rows()),
                m.per_job(m.counters.inserted),
                m.per_job(m.counters.updated),
                m.per_job(m.counters.deleted),
                m.per_job(m.counters.wal_bytes),
                m.cpu_per_job(),
            );
        }
    }
    println!();
    println!("The server's floor: one-row commits/s, before and after the steps");
    println!();
    println!("| clients | before | after |");
    println!("| ---: | ---: | ---: |");
    for (at, clients) in FLOOR_CLIENTS.iter().enumerate() {
        println!(
            "| {clients} | {:.0} | {:.0} |",
            floor_before[at], floor_after[at]
        );
    }
    println!();
    println!(
        "The floor of a job's own rows: the six rows one job per claim changes, \
         written in one statement a job (jobs/s)"
    );
    println!();
    println!(
        "| clients | the same rows, one statement | Tessera, one per claim | graphile-worker |"
    );
    println!("| ---: | ---: | ---: | ---: |");
    for (clients, rate) in SAME_ROWS_CLIENTS.iter().zip(&same_rows) {
        let step = steps
            .iter()
            .zip(&processing)
            .find(|&(&(workers, batched), _)| workers == *clients && !batched)
            .map(|(_, row)| row);
        let tessera = step.map_or("–".to_owned(), |row| format!("{:.0}", row.tessera.rate()));
        let graphile = step
            .and_then(|row| row.graphile)
            .map_or("–".to_owned(), |g| format!("{:.0}", g.rate()));
        println!("| {clients} | {rate:.0} | {tessera} | {graphile} |");
    }
}

/// For each processing step run more than once beside graphile-worker:
/// its ratios in the order run and their median.
fn print_repeated(processing: &[Row]) {
    let mut figures: Vec<&str> = Vec::new();
    for row in processing {
        let runs = processing.iter().filter(|r| r.figure == row.figure).count();
        if runs > 1 && row.graphile.is_some() && !figures.contains(&row.figure.as_str()) {
            figures.push(&row.figure);
        }
    }
    if figures.is_empty() {
        return;
    }
    println!();
    println!("Steps run more than once, in turn (graphile-worker first every second time)");
    println!();
    println!("| figure | Tessera / graphile-worker, each run | median |");
    println!("| --- | --- | ---: |");
    for figure in figures {
        let mut ratios: Vec<f64> = processing
            .iter()
            .filter(|row| row.figure == figure)
            .filter_map(|row| row.graphile.map(|g| row.tessera.rate() / g.rate()))
            .collect();
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}×")).collect();
        ratios.sort_by(f64::total_cmp);
        let middle = ratios.len() / 2;
        let median = if ratios.len() % 2 == 0 {
            (ratios[middle - 1] + ratios[middle]) / 2.0
        } else {
            ratios[middle]
        };
        println!("| {figure} | {} | {median:.2}× |", each.join(", "));
    }
}

/// The floor of a job's own writes: the six rows one job per claim
/// changes (the submitted attempt, its receipt and audit row; the claimed
/// attempt, its task's token and claim column, and its audit row), on
/// Tessera's tables in `schema`, at random rows of its tasks, in one
/// data-modifying statement a job (one round trip, one commit, no reads,
/// no lock waited for), `SAME_ROWS_JOBS` jobs shared by `clients` threads
/// with a connection each; returns jobs per second.
fn same_rows_floor(url: &str, schema: &str, clients: usize) -> f64 {
    let statement = format!(
        "WITH submitted AS (UPDATE \"{schema}\".attempts SET state = CASE WHEN state = 'done' \
         THEN 'leased' ELSE 'done' END, until_at = NULL, lapses_at = NULL, changed_at = $3 \
         WHERE task = $1 AND number = 1 RETURNING 1), \
         receipt AS (INSERT INTO \"{schema}\".receipts (task, attempt, token, principal, \
         idempotency_key, artifact, digest, accepted_at, output) VALUES ($1, 1, 1, 'p2', \
         'k' || $3, 't-01a23cc863e77c254d21b955aaa0.a1.t1', \
         '762069bc07a6e1b5df123a5ae7bd91c10daa04694fbaa17fba0cd6a8dcce8f22', $3, 'done') \
         RETURNING 1), \
         audited AS (INSERT INTO \"{schema}\".access_audit (at, principal, namespace, action, \
         outcome, resource, ip_hash) VALUES \
         ($3, 'p2', 'bench', 'submit', 'ok', 'task:t-01a23cc863e77c254d21b955aaa0@1/a1/t1', ''), \
         ($3, 'p2', 'bench', 'claim', 'ok', 'task:t-01a23cc863e77c254d21b955aaa0@1/a1/t2', '') \
         RETURNING 1), \
         leased AS (UPDATE \"{schema}\".attempts SET state = CASE WHEN state = 'leased' \
         THEN 'ready' ELSE 'leased' END, tries = tries + 1, holder = 'p2', token = $3, \
         granted_at = $3, expires_at = $3, lapses_at = $3, changed_at = $3 \
         WHERE task = $2 AND number = 1 RETURNING 1), \
         moved AS (UPDATE \"{schema}\".tasks SET last_token = last_token + 1, \
         claimable_at = CASE WHEN claimable_at IS NULL THEN $3 ELSE NULL END \
         WHERE id = $2 RETURNING 1) \
         SELECT (SELECT count(*) FROM submitted) + (SELECT count(*) FROM receipt) \
         + (SELECT count(*) FROM audited) + (SELECT count(*) FROM leased) \
         + (SELECT count(*) FROM moved)"
    );
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let (first, last): (i64, i64) = {
        let row = client
            .query_one(
                &format!("SELECT min(id), max(id) FROM \"{schema}\".tasks"),
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let span = u64::try_from(last - first + 1).unwrap();
    let per_client = SAME_ROWS_JOBS / clients;
    let elapsed = tessera_benches::on_threads(
        clients,
        per_client as u64,
        |_, n| {
            let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
            let prepared = client.prepare(&statement).unwrap();
            (client, prepared, n)
        },
        |thread, (mut client, prepared, n)| {
            // A xorshift stream per thread picks the rows.
            let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (thread as u64 + 1);
            let mut pick = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                first + i64::try_from(state % span).unwrap()
            };
            for job in 0..n {
                // Two tasks: a row changed twice in one statement is
                // changed once.
                let submitted = pick();
                let claimed = std::iter::repeat_with(&mut pick)
                    .find(|&task| task != submitted)
                    .unwrap();
                // Unique per job and measurement, so each receipt's key
                // is new.
                let stamp = (clients as i64) << 48 | (thread as i64) << 40 | job as i64;
                let written: i64 = client
                    .query_one(&prepared, &[&submitted, &claimed, &stamp])
                    .unwrap()
                    .get(0);
                assert_eq!(written, 6, "a job's six rows");
            }
        },
    );
    (per_client * clients) as f64 / elapsed.as_secs_f64()
}

fn report_progress(figure: &str, tessera: &Measured, graphile: Option<&Measured>) {
    let graphile = graphile.map_or(String::new(), |g| {
        format!(
            "; graphile-worker {:.0}/s, {:.2} transactions/job, CPU ms/job {}",
            g.rate(),
            g.per_job(g.counters.commits),
            g.cpu_per_job()
        )
    });
    eprintln!(
        "{figure}: Tessera {:.0}/s, {:.2} transactions/job, CPU ms/job {}{graphile}",
        tessera.rate(),
        tessera.per_job(tessera.counters.commits),
        tessera.cpu_per_job()
    );
}

/// `FLOOR_COMMITS` one-row commits shared by `clients` threads, each on
/// a connection of its own; returns commits per second.
fn postgres_floor(floor: &MinimalCommit, clients: usize) -> f64 {
    let per_client = FLOOR_COMMITS / clients;
    let elapsed = tessera_benches::on_threads(
        clients,
        per_client as u64,
        |_, n| n,
        |thread, n| {
            for value in 0..n {
                floor.commit((thread as i64) << 32 | value as i64);
            }
        },
    );
    (per_client * clients) as f64 / elapsed.as_secs_f64()
}

/// graphile-worker's side: `node benches/peers/graphile.js` with the
/// package from `TESSERA_PEER_GRAPHILE`.
struct Graphile {
    node_path: PathBuf,
    script: PathBuf,
    database_url: String,
}

impl Graphile {
    fn find(url: &str, monitor: &mut Monitor) -> Option<Self> {
        let dir = std::env::var_os("TESSERA_PEER_GRAPHILE").filter(|dir| !dir.is_empty())?;
        monitor.ensure_database(GRAPHILE_DATABASE);
        Some(Self {
            node_path: PathBuf::from(dir).join("node_modules"),
            script: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/graphile.js"),
            database_url: with_database(url, GRAPHILE_DATABASE),
        })
    }

    /// Runs the script with `args`; returns its jobs and seconds.
    fn run(&self, args: &[&str]) -> (u64, f64) {
        let output = Command::new("node")
            .arg(&self.script)
            .args(args)
            .env("NODE_PATH", &self.node_path)
            .env("DATABASE_URL", &self.database_url)
            .output()
            .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "graphile.js {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = stdout.lines().last().unwrap_or_default();
        let field = |name: &str| -> Option<f64> {
            let at = line.find(&format!("\"{name}\":"))? + name.len() + 3;
            let rest = &line[at..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            rest[..end].trim().parse().ok()
        };
        (
            field("jobs").unwrap_or(0.0) as u64,
            field("seconds").unwrap_or(0.0),
        )
    }
}

/// Tessera's side on PostgreSQL or SQLite: a store opened per step (so
/// each step's connections close before the counters are read), one key
/// per worker.
struct Tessera {
    open: Box<dyn Fn() -> Store>,
    workers: Vec<String>,
}

fn namespace() -> Namespace {
    Namespace::parse("bench").unwrap()
}

impl Tessera {
    fn setup(url: &str, schema: &str) -> Self {
        let (url, schema) = (url.to_owned(), schema.to_owned());
        Self::with(Box::new(move || {
            let config = StoreConfig::default().with_lease_duration(Duration::from_secs(3600));
            let options = PostgresOptions::new(&url)
                .with_schema(&schema)
                .with_pool_size(pool_size());
            Store::open_postgres(options, config).unwrap()
        }))
    }

    fn with(open: Box<dyn Fn() -> Store>) -> Self {
        let store = open();
        let admin_key = store.create_admin_key("operators").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        let spec = KeySpec::keyed("bench")
            .with_scopes(Scope::ALL.iter().copied())
            .with_grant(Grant::Namespace(namespace()));
        let most = WORKERS
            .iter()
            .chain(&BATCHED_WORKERS)
            .copied()
            .max()
            .unwrap();
        let workers = (0..most)
            .map(|_| {
                let key = store.create_key(&admin, &spec).unwrap();
                key.secret.expose().to_owned()
            })
            .collect();
        drop(store);
        Self { open, workers }
    }

    fn caller(&self, store: &Store, worker: usize) -> Caller {
        store.authenticate(Some(&self.workers[worker])).unwrap()
    }

    /// Enqueues `jobs` tasks, `per_call` at a time; returns jobs and
    /// seconds.
    fn enqueue(&self, jobs: usize, per_call: usize) -> (u64, f64) {
        let store = (self.open)();
        let caller = self.caller(&store, 0);
        let (namespace, queue) = (namespace(), queue(QUEUE));
        let brief = Brief::Bytes(br#"{"frame":42}"#.to_vec());
        let began = Instant::now();
        if per_call == 1 {
            for _ in 0..jobs {
                store
                    .enqueue(
                        &caller,
                        &namespace,
                        &queue,
                        &brief,
                        &EnqueueOptions::default(),
                    )
                    .unwrap();
            }
        } else {
            let mut left = jobs;
            while left > 0 {
                let tasks = vec![(brief.clone(), EnqueueOptions::default()); left.min(per_call)];
                let enqueued = store
                    .enqueue_batch(&caller, &namespace, &queue, &tasks)
                    .unwrap();
                assert!(enqueued.iter().all(|task| task.created));
                left -= tasks.len();
            }
        }
        (jobs as u64, began.elapsed().as_secs_f64())
    }

    /// Processes the queue with `workers` threads until each finds it
    /// empty: a claim and a submit per task, or a `claim_batch` of
    /// `CLAIM_BATCH` and one `submit_batch`. Checks that `jobs` distinct
    /// tasks were processed.
    fn process(&self, jobs: usize, workers: usize, batched: bool, step: u64) -> (u64, f64) {
        let store = (self.open)();
        let callers: Vec<Caller> = (0..workers).map(|w| self.caller(&store, w)).collect();
        let (namespace, queue) = (namespace(), queue(QUEUE));
        let output = Output::bytes(b"done".to_vec());
        let start = Barrier::new(workers + 1);
        let processed = Mutex::new(Vec::with_capacity(jobs));
        let store = Arc::new(store);
        let began = thread::scope(|scope| {
            for (worker, caller) in callers.iter().enumerate() {
                let (store, start, processed) = (&store, &start, &processed);
                let (namespace, queue, output) = (&namespace, &queue, &output);
                scope.spawn(move || {
                    let mut mine: Vec<String> = Vec::new();
                    let request = |claimed: &Claimed, n: usize| SubmitRequest {
                        task: claimed.task.clone(),
                        token: claimed.lease.token(),
                        key: idempotency_key(worker, step << 32 | n as u64),
                        output: output.clone(),
                    };
                    let granted = |outcome: ClaimOutcome| match outcome {
                        ClaimOutcome::Granted(claimed) => Some(claimed),
                        _ => None,
                    };
                    start.wait();
                    if batched {
                        loop {
                            let claimed = store
                                .claim_batch(caller, namespace, queue, CLAIM_BATCH)
                                .unwrap()
                                .claimed;
                            if claimed.is_empty() {
                                break;
                            }
                            // Batched completions: one `submit_batch` of
                            // what the claim got.
                            let requests: Vec<SubmitRequest> = claimed
                                .iter()
                                .enumerate()
                                .map(|(n, one)| request(one, mine.len() + n))
                                .collect();
                            for answer in store.submit_batch(caller, &requests).unwrap() {
                                assert!(matches!(answer, Ok(Submitted::Accepted(_))));
                            }
                            mine.extend(claimed.iter().map(|one| one.task.id.to_string()));
                        }
                    } else {
                        // One task at a time: each submit carries the
                        // next claim.
                        let mut next = granted(store.claim(caller, namespace, queue).unwrap());
                        while let Some(claimed) = next {
                            let (submitted, outcome) = store
                                .submit_and_claim(
                                    caller,
                                    &request(&claimed, mine.len()),
                                    namespace,
                                    queue,
                                )
                                .unwrap();
                            assert!(matches!(submitted, Submitted::Accepted(_)));
                            mine.push(claimed.task.id.to_string());
                            next = granted(outcome.unwrap());
                        }
                    }
                    processed.lock().unwrap().extend(mine);
                });
            }
            start.wait();
            // The scope joins every worker before it returns.
            Instant::now()
        });
        let seconds = began.elapsed().as_secs_f64();
        let processed = processed.into_inner().unwrap();
        let distinct: HashSet<&String> = processed.iter().collect();
        assert_eq!(processed.len(), jobs, "processed != enqueued");
        assert_eq!(distinct.len(), jobs, "a task was processed twice");
        drop(store);
        (jobs as u64, seconds)
    }
}

impl Tessera {
    /// Processes the queue with `threads` threads sharing one [`Worker`]
    /// (one key, fetching `CLAIM_BATCH` ahead), each taking the next task,
    /// taking `work` over it (a sleep, as a task waiting on I/O does) and
    /// submitting it until the worker answers empty. Checks that `jobs`
    /// distinct tasks were processed; returns them, the seconds, and the
    /// worker's transactions (claims and flushes).
    fn process_with_worker(&self, jobs: usize, threads: usize, work: Duration) -> (u64, f64, u64) {
        let store = (self.open)();
        let caller = self.caller(&store, 0);
        let options = WorkerOptions::default().with_fetch(CLAIM_BATCH);
        let worker = Worker::new(&store, caller, namespace(), queue(QUEUE), options).unwrap();
        let output = Output::bytes(b"done".to_vec());
        let start = Barrier::new(threads + 1);
        let processed = Mutex::new(Vec::with_capacity(jobs));
        let began = thread::scope(|scope| {
            for thread in 0..threads {
                let (worker, start, processed, output) = (&worker, &start, &processed, &output);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    start.wait();
                    let mut pending = Vec::new();
                    while let WorkerNext::Task(claimed) = worker.next().unwrap() {
                        if !work.is_zero() {
                            thread::sleep(work);
                        }
                        let key = idempotency_key(thread, mine.len() as u64);
                        pending.push(worker.submit_later(&claimed, &key, output).unwrap());
                        mine.push(claimed.task.id.to_string());
                    }
                    // The `next` that found the queue empty committed
                    // what was held.
                    for pending in pending {
                        let submitted = worker.answer(pending).unwrap();
                        assert!(matches!(submitted, Submitted::Accepted(_)));
                    }
                    processed.lock().unwrap().extend(mine);
                });
            }
            start.wait();
            Instant::now()
        });
        let seconds = began.elapsed().as_secs_f64();
        let stats = worker.stats();
        let processed = processed.into_inner().unwrap();
        let distinct: HashSet<&String> = processed.iter().collect();
        assert_eq!(processed.len(), jobs, "processed != enqueued");
        assert_eq!(distinct.len(), jobs, "a task was processed twice");
        (jobs as u64, seconds, stats.claims + stats.flushes)
    }
}

fn sqlite(jobs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let floor = {
        let mut floor = SqliteMinimalCommit::open(&dir.path().join("floor.db"));
        let began = Instant::now();
        for _ in 0..FLOOR_COMMITS * 5 {
            floor.commit();
        }
        (FLOOR_COMMITS * 5) as f64 / began.elapsed().as_secs_f64()
    };
    let path = dir.path().join("tessera.db");
    let tessera = Tessera::with(Box::new(move || {
        let config = StoreConfig::default().with_lease_duration(Duration::from_secs(3600));
        Store::open(&path, config).unwrap()
    }));
    let mut rows = Vec::new();
    for (step, (workers, batched)) in steps().into_iter().enumerate() {
        tessera.enqueue(jobs, ENQUEUE_BATCH);
        let (done, seconds) = tessera.process(jobs, workers, batched, step as u64 + 100);
        let rate = done as f64 / seconds;
        let kind = if batched { "batched" } else { "one per claim" };
        eprintln!("SQLite, {kind}, {workers} workers: {rate:.0} tasks/s");
        rows.push((workers, kind.to_owned(), rate));
    }
    let mut slow = Vec::new();
    for (work, tasks) in [(Duration::ZERO, jobs), (SLOW_TASK, SLOW_TASKS)] {
        for threads in LOOP_THREADS {
            tessera.enqueue(tasks, ENQUEUE_BATCH);
            let (done, seconds, transactions) = tessera.process_with_worker(tasks, threads, work);
            let rate = done as f64 / seconds;
            let per_task = transactions as f64 / done as f64;
            if work.is_zero() {
                eprintln!("SQLite, worker loop, {threads} threads: {rate:.0} tasks/s");
                rows.push((threads, "worker loop".to_owned(), rate));
            } else {
                eprintln!(
                    "SQLite, worker loop, {work:?} a task, {threads} threads: {rate:.0} tasks/s"
                );
                slow.push((threads, rate, per_task));
            }
        }
    }
    let path = dir.path().join("tessera.db");
    for per_commit in SQLITE_SAME_ROWS_PER_COMMIT {
        let rate = sqlite_same_rows_floor(&path, per_commit);
        let kind = format!("floor: a task's own rows, {per_commit} a commit");
        eprintln!("SQLite, {kind}: {rate:.0} tasks/s");
        rows.push((1, kind, rate));
    }
    println!();
    println!("SQLite, {jobs} tasks a step; minimal commit {floor:.0}/s from 1 thread");
    println!();
    println!("| workers | processing | tasks/s | minimal commits per task |");
    println!("| ---: | --- | ---: | ---: |");
    for (workers, kind, rate) in rows {
        println!("| {workers} | {kind} | {rate:.0} | {:.1} |", floor / rate);
    }
    println!();
    println!(
        "The worker loop, {SLOW_TASKS} tasks each taking {SLOW_TASK:?} (a sleep, as a task \
         waiting on I/O)"
    );
    println!();
    println!("| threads | tasks/s | transactions per task |");
    println!("| ---: | ---: | ---: |");
    for (threads, rate, per_task) in slow {
        println!("| {threads} | {rate:.0} | {per_task:.3} |");
    }
}

/// How long each task of the slow worker-loop steps takes.
const SLOW_TASK: Duration = Duration::from_millis(1);
/// Tasks of each slow worker-loop step.
const SLOW_TASKS: usize = 2_000;

/// Tasks a commit in the SQLite floor of a task's own rows: one, as a
/// claim and a submission each alone; and a worker loop's batch.
const SQLITE_SAME_ROWS_PER_COMMIT: [usize; 2] = [1, CLAIM_BATCH];
/// Tasks the SQLite floor of a task's own rows writes.
const SQLITE_SAME_ROWS_TASKS: usize = 20_000;

/// The floor under a processed task on SQLite: the six rows one task's
/// claim and submission change (the attempt leased then done, the task's
/// token and claim column, the receipt, two audit rows), written by hand
/// into Tessera's own file, tables and indexes with prepared statements,
/// at tasks in enqueue order, `per_commit` tasks to a `BEGIN IMMEDIATE` …
/// `COMMIT`, no rules, reads or meter. Tasks/s from one thread.
fn sqlite_same_rows_floor(path: &std::path::Path, per_commit: usize) -> f64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let (first, last): (i64, i64) = conn
        .query_row("SELECT min(id), max(id) FROM tasks", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap();
    let span = u64::try_from(last - first + 1).unwrap();
    let run = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
        conn.prepare_cached(sql).unwrap().execute(params).unwrap()
    };
    let began = Instant::now();
    for batch in 0..SQLITE_SAME_ROWS_TASKS / per_commit {
        run("BEGIN IMMEDIATE", &[]);
        for job in 0..per_commit {
            // In enqueue order, as a queue hands its tasks out.
            let task = first + i64::try_from((batch * per_commit + job) as u64 % span).unwrap();
            let stamp =
                i64::try_from(batch * per_commit + job).unwrap() | (per_commit as i64) << 40;
            let written = [
                run(
                    "UPDATE attempts SET state = CASE WHEN state = 'leased' THEN 'ready' \
                     ELSE 'leased' END, tries = tries + 1, holder = 'p2', token = ?2, \
                     granted_at = ?2, expires_at = ?2, lapses_at = ?2, changed_at = ?2 \
                     WHERE task = ?1 AND number = 1",
                    rusqlite::params![task, stamp],
                ),
                run(
                    "UPDATE tasks SET last_token = last_token + 1, claimable_at = CASE \
                     WHEN claimable_at IS NULL THEN ?2 ELSE NULL END WHERE id = ?1",
                    rusqlite::params![task, stamp],
                ),
                run(
                    "INSERT INTO access_audit (at, principal, namespace, action, outcome, \
                     resource, ip_hash) VALUES (?1, 'p2', 'bench', 'claim', 'ok', \
                     'task:t-01a23cc863e77c254d21b955aaa0@1/a1/t2', '')",
                    rusqlite::params![stamp],
                ),
                run(
                    "UPDATE attempts SET state = CASE WHEN state = 'done' THEN 'leased' \
                     ELSE 'done' END, until_at = NULL, lapses_at = NULL, changed_at = ?2 \
                     WHERE task = ?1 AND number = 1",
                    rusqlite::params![task, stamp],
                ),
                run(
                    "INSERT INTO receipts (task, attempt, token, principal, idempotency_key, \
                     artifact, digest, accepted_at, output) VALUES (?1, 1, 1, 'p2', \
                     'k' || ?2, 't-01a23cc863e77c254d21b955aaa0.a1.t1', \
                     '762069bc07a6e1b5df123a5ae7bd91c10daa04694fbaa17fba0cd6a8dcce8f22', ?2, \
                     x'646f6e65')",
                    rusqlite::params![task, stamp],
                ),
                run(
                    "INSERT INTO access_audit (at, principal, namespace, action, outcome, \
                     resource, ip_hash) VALUES (?1, 'p2', 'bench', 'submit', 'ok', \
                     'task:t-01a23cc863e77c254d21b955aaa0@1/a1/t1', '')",
                    rusqlite::params![stamp],
                ),
            ];
            assert_eq!(written, [1; 6], "a task's six rows");
        }
        run("COMMIT", &[]);
    }
    SQLITE_SAME_ROWS_TASKS as f64 / began.elapsed().as_secs_f64()
}
