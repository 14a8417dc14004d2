//! Tessera beside two peers, graphile-worker and pg-boss, on one
//! PostgreSQL server, each with the server's own statistics, in two
//! commit regimes over several rounds, and the server's floor measured in
//! the same run; then Tessera's processing rate on SQLite beside SQLite's
//! floor.
//!
//! Run everything with one command: `benches/peers/run.sh [JOBS]`, which
//! installs the peers (the versions `benches/peers/package.json` pins,
//! with the Node they ask for) outside the repository and then runs this
//! program:
//!
//! `TESSERA_PEER_GRAPHILE=<dir with node_modules> TESSERA_BENCH_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --release -p tessera-benches --bin peers -- [JOBS] [postgres|sqlite]`
//!
//! `JOBS` (default 10,000) no-op jobs per step. Without
//! `TESSERA_PEER_GRAPHILE` only Tessera's side runs; without a server URL
//! (`TESSERA_BENCH_POSTGRES_URL`, else `TESSERA_TEST_POSTGRES_URL`) only
//! SQLite does. The peers' scripts run on the Node in
//! `TESSERA_PEER_GRAPHILE/node_modules/.bin` when there is one, else on
//! the `node` on the path. `TESSERA_PEERS_WITH` (`graphile`, `pgboss`,
//! both separated by a comma, or `none`) picks the peers, both by default.
//! `TESSERA_PEERS_REGIMES` (`default`, `off`, or both) picks the regimes,
//! both by default. `TESSERA_PEERS_ROUNDS` (default 3) sets the rounds.
//! `TESSERA_PEERS_STEPS` (for example `4,8,4b`) runs only the processing
//! steps it names, by worker count, `b` for batched, in its order: `4`
//! processes one at a time with 4 workers (Tessera: its `Worker` with its
//! defaults, and the `submit_and_claim` loop), `4b` batched with 4
//! (Tessera: its `Worker` fetching 100 with held acknowledgements, and
//! `claim_batch` with `submit_batch`); the first enqueues one per call. A
//! step named again runs again (`4,4,4,4` four times a round).
//! `TESSERA_PEERS_DEBUG`, when set, has each peer's script report what
//! `SHOW synchronous_commit` answers on its own pool, which this program
//! prints. Tessera's connection pool holds twice this machine's cores (the
//! server's, as the server runs here), as
//! `PostgresOptions::with_pool_size` advises (each of its two sides opens
//! its own store, one at a time); `TESSERA_PEERS_POOL` sets
//! another size. graphile-worker and pg-boss keep their own pools, at
//! least 10 and at least the workers and 2.
//!
//! PostgreSQL: each system has a database of its own on the same server,
//! `tessera_bench`, `graphile_bench` and `pgboss_bench` (created when
//! missing), so `pg_stat_database` counts one system's work alone
//! (Tessera's two sides, below, each on a schema of its own in
//! `tessera_bench`, never run at once). The regimes, each with its own set
//! of tables:
//!
//! - the server's defaults (`ALTER DATABASE … RESET synchronous_commit`
//!   for each of the three, in case an earlier run left the other);
//! - `synchronous_commit = off` for every session of the three databases
//!   (`ALTER DATABASE … SET synchronous_commit = off`), so that a commit
//!   returns before its log record is flushed and what a flush costs drops
//!   out; the floors run in it too.
//!
//! A database's setting reaches the sessions that start after it is set,
//! and every session of a step starts in the step (each step opens its own
//! store, and runs each peer's script anew), so it is set before anything
//! of the regime connects; each regime's heading says what a new session
//! of each database answers to `SHOW synchronous_commit`. The databases
//! are reset to the server's default at the end, a panicking run
//! included.
//!
//! Each regime runs its steps `TESSERA_PEERS_ROUNDS` times, each round on
//! empty tables (Tessera's two schemas made anew, each peer's schema
//! dropped and made anew by its script). A round runs the steps in this
//! order, each for every system in turn (Tessera's `Worker`, the peers,
//! Tessera's store calls; the system that starts a step moves on by one
//! every time the step runs again, so no system always runs on another's
//! heels):
//!
//! 1. enqueue `JOBS`, one per call (`enqueue`; `addJob`; pg-boss `send`),
//!    then process them with 1 worker, one job at a time;
//! 2. for 2, 4 and 8 workers: enqueue `JOBS`, 1,000 per call
//!    (`enqueue_batch`; `addJobs`; pg-boss `insert`), then process them
//!    one job at a time;
//! 3. for each of `BATCHED_WORKERS` (1, 4 and 8): enqueue `JOBS` 1,000 per
//!    call, then process them batched (Tessera: its `Worker` fetching 100
//!    ahead, acknowledgements held and committed together;
//!    graphile-worker: a local queue of 100 and batched completions;
//!    pg-boss: `work()` with `batchSize` 100, one fetch and one completion
//!    a batch).
//!
//! Processing is "no-op", and a worker count means the same for every
//! system: that many workers in one process sharing one worker loop.
//! Tessera's are threads sharing one `Worker` (tessera-store's worker
//! loop, one key), each taking the next task and submitting it until the
//! worker answers empty: one at a time with `WorkerOptions::default()`
//! (it fetches 10 ahead; a thread's `submit` waits for its commit, the
//! store's completer coalescing the threads' submissions), as
//! graphile-worker's stock `run()` and pg-boss's `batchSize` 1 are those
//! peers' defaults; batched with `with_fetch(100)` and `submit_later`, the
//! worker holding up to 100 acknowledgements for one transaction, each
//! thread collecting its answers once the worker answered empty (as
//! `process_with_worker` does on SQLite too). graphile-worker's are one
//! `run()` with `concurrentJobs` set to the count (the script
//! `benches/peers/graphile.js`); pg-boss's are one `work()` with
//! `localConcurrency` set to the count and `batchSize` 1, or 100 when
//! batched (the script `benches/peers/pgboss.js`, which says how its
//! workers are kept fetching while jobs are left).
//!
//! Each step also runs Tessera through direct store calls, reported in
//! rows of their own labelled "Tessera, submit_and_claim loop" (one at a
//! time) and "Tessera, claim_batch + submit_batch" (batched), on a schema
//! of its own (`peers_calls`, made anew each round, so that each of
//! Tessera's sides works on tables holding its own jobs alone, as each
//! peer does): threads of one process sharing one `Store`, each with its
//! own key, each claiming and submitting until its claim finds the queue
//! empty (one at a time: a `claim`, then `submit_and_claim` for each task,
//! whose submission carries the next claim; batched: `claim_batch` of 100
//! and one `submit_batch` of what it got). Its enqueues, the same calls
//! as the `Worker` side's, fill its queue and are not shown.
//!
//! Each step's rate is its jobs over its own time; for a peer that time
//! runs from starting it to the end of its `stop()`, which waits for every
//! completion, and for Tessera from its threads' start to the last one's
//! end, every submission committed. Every
//! processing step but the first of a round starts right after a
//! `VACUUM (ANALYZE)` of the system's database: a claim's index search
//! walks past the entries earlier claims left until a vacuum removes them
//! (for every system alike), so each step starts with none, rather than
//! with however many autovacuum's once-a-minute visit happened to leave.
//! Every step starts right after a `CHECKPOINT`, so each system's first
//! write to a page after it logs the whole page, the same for all. Each
//! step's CPU time a job is the machine's busy time (`/proc/stat`) less
//! this program's and its children's (`/proc/self/stat`: Tessera's
//! threads, the peers' Node processes), so with the server on this
//! machine it is the server's work, and then the client's. Around every
//! step this program reads, on a connection to the server's maintenance
//! database, once the system's connections have all closed (so every
//! backend has flushed its counters): `xact_commit`, `tup_inserted`,
//! `tup_updated` and `tup_deleted` of the system's database, and
//! `pg_current_wal_lsn()`. The log position is the whole server's:
//! anything else running on the server at the time is counted too.
//!
//! Each regime's tables: every figure's rate, the median over the rounds
//! (Tessera's column its `Worker`, each processing step followed by a row
//! of its store calls); Tessera's rate over each peer's, per mode (a
//! figure, all the enqueues of 1,000 per call being one), the `Worker`'s
//! and then, in rows of their own, the store calls', each round's ratio,
//! their median and the lowest: one round's ratio moves with the machine;
//! per processed job, for every system and the store calls, transactions,
//! rows and log bytes, and the CPU time, each the median over the rounds;
//! the floor, one-row commits (`MinimalCommit`) from 1 and from 8 clients,
//! measured before the regime's first round and after its last, so a
//! change in the machine's load during the run shows; last, the floor of
//! a job's own rows: the five rows the `submit_and_claim` loop changes a
//! job (the submitted attempt, which carries its receipt, and the claimed
//! attempt, its task and two audit rows), at random tasks of Tessera's
//! `Worker` tables (those of the last round), written in one
//! data-modifying statement a job (one round trip, one commit, no reads),
//! from 1, 4 and 8 clients, each measured as a step is, with its rows and
//! log bytes a job, beside the one-at-a-time rates of as many workers.
//!
//! SQLite: in a temporary directory, the minimal commit (one row,
//! `BEGIN IMMEDIATE` … `COMMIT`, the store's journal settings) from 1
//! thread, then for 1, 2, 4 and 8 worker threads `JOBS` tasks enqueued
//! 1,000 per call and processed one per claim, then batched with 1, 4 and
//! 8, then by 1, 2 and 4 threads sharing one `Worker` (the worker loop: it
//! fetches 100 ahead and acknowledges later, the worker holding up to 100
//! acknowledgements for one transaction through the completer), the same
//! with 2,000 tasks that each take 1 ms (a sleep, as a task waiting on
//! I/O does), and last the floor
//! under a task: the five rows its claim and submission change, written by
//! hand into the same file, 1 and then 100 tasks to a commit. "Minimal
//! commits per task" is the time of one task in minimal commits: the
//! minimal commit rate over the task rate.
//!
//! Every check that could fail is made: each step processes exactly
//! `JOBS` jobs, no Tessera task is claimed twice, graphile-worker's job
//! table is empty after each processing step, and pg-boss has no job of
//! the queue left but completed ones.

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
const BATCHED_WORKERS: [usize; 3] = [1, 4, 8];
/// Threads sharing one `Worker` in the SQLite worker-loop steps.
const LOOP_THREADS: [usize; 3] = [1, 2, 4];
/// Tasks per `claim_batch`, graphile-worker's local queue size and
/// pg-boss's `batchSize` in the batched steps (their scripts say so too).
const CLAIM_BATCH: usize = 100;
/// Tasks per `enqueue_batch`, per `addJobs` and per pg-boss `insert`.
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

    /// CPU milliseconds a job of the rest of the machine: the server, when
    /// it runs here.
    fn server_ms_per_job(&self) -> Option<f64> {
        let counters = self.counters;
        let rest = counters
            .machine_cpu
            .zip(counters.client_cpu)
            .map(|(machine, client)| machine - client);
        rest.map(|cpu| cpu * 1e3 / self.jobs as f64)
    }

    /// CPU milliseconds a job of this program with its children: the
    /// system's client.
    fn client_ms_per_job(&self) -> Option<f64> {
        self.counters
            .client_cpu
            .map(|cpu| cpu * 1e3 / self.jobs as f64)
    }

    /// Server and client CPU milliseconds a job, `–` where not measured.
    fn cpu_per_job(&self) -> String {
        let ms = |cpu: Option<f64>| cpu.map_or("–".to_owned(), |cpu| format!("{cpu:.3}"));
        format!(
            "{} + {}",
            ms(self.server_ms_per_job()),
            ms(self.client_ms_per_job())
        )
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
    /// CPU seconds of this process and its reaped children (the peers'
    /// Node processes).
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

/// CPU seconds this process and the children it waited for (the peers'
/// Node processes) have run, from `/proc/self/stat`.
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

/// A figure of every system, over the rounds: `runs[round][system]`, the
/// systems in `Systems` order (Tessera's `Worker` first, its store-call
/// side last).
struct Row {
    /// The figure as the tables name it.
    figure: String,
    /// The figure less where it runs, for the ratios over the rounds: the
    /// enqueues of `ENQUEUE_BATCH` per call before every step are one mode.
    mode: String,
    /// The store-call side's label where the tables show it (the
    /// processing steps): its rows follow the figure's.
    extra: Option<String>,
    runs: Vec<Vec<Measured>>,
}

impl Row {
    fn new(figure: String, mode: String, extra: Option<String>) -> Self {
        Self {
            figure,
            mode,
            extra,
            runs: Vec::new(),
        }
    }

    /// The median over the rounds of `value` of `system`'s runs, `None`
    /// where any run has none.
    fn median(&self, system: usize, value: impl Fn(&Measured) -> Option<f64>) -> Option<f64> {
        let values: Option<Vec<f64>> = self.runs.iter().map(|run| value(&run[system])).collect();
        values.map(median)
    }

    fn rate(&self, system: usize) -> f64 {
        self.median(system, |m| Some(m.rate())).unwrap()
    }
}

/// The median of `values`, which are not empty: the mean of the middle
/// two of an even count.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 0 {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

/// The rounds each regime runs: `TESSERA_PEERS_ROUNDS`, else 3.
fn rounds() -> usize {
    match std::env::var("TESSERA_PEERS_ROUNDS") {
        Ok(listed) => listed
            .parse()
            .ok()
            .filter(|&rounds| rounds > 0)
            .unwrap_or_else(|| panic!("TESSERA_PEERS_ROUNDS={listed:?} is not a count of rounds")),
        Err(_) => 3,
    }
}

/// How the systems' sessions commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// The server's own settings.
    Default,
    /// `synchronous_commit = off` for every session of the systems'
    /// databases: a commit returns before its log record is flushed, so
    /// what a flush costs drops out.
    AsyncCommit,
}

impl Regime {
    /// Both, in order; `TESSERA_PEERS_REGIMES` (`default`, `off`, or both
    /// separated by a comma) lists which to run, in its own order.
    fn selected() -> Vec<Self> {
        let all = [Self::Default, Self::AsyncCommit];
        match std::env::var("TESSERA_PEERS_REGIMES") {
            Err(_) => all.to_vec(),
            Ok(listed) => listed
                .split(',')
                .map(|name| {
                    all.into_iter()
                        .find(|regime| regime.key() == name.trim())
                        .unwrap_or_else(|| {
                            panic!("TESSERA_PEERS_REGIMES: {name:?} is neither default nor off")
                        })
                })
                .collect(),
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::AsyncCommit => "off",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::Default => "the server's defaults",
            Self::AsyncCommit => "synchronous_commit = off",
        }
    }

    /// Sets `database`'s sessions to this regime: the setting for each new
    /// session, which every system's pool then opens (each step opens its
    /// own).
    fn apply(self, client: &mut postgres::Client, database: &str) {
        let statement = match self {
            Self::Default => format!("ALTER DATABASE \"{database}\" RESET synchronous_commit"),
            Self::AsyncCommit => {
                format!("ALTER DATABASE \"{database}\" SET synchronous_commit = off")
            }
        };
        client
            .batch_execute(&statement)
            .unwrap_or_else(|error| panic!("{statement}: {error}"));
    }
}

/// Puts the systems' databases back to the server's default commit when
/// dropped, a panicking run included.
struct RegimeReset {
    url: String,
    databases: Vec<String>,
}

impl Drop for RegimeReset {
    fn drop(&mut self) {
        match postgres::Client::connect(&self.url, postgres::NoTls) {
            Ok(mut client) => {
                for database in &self.databases {
                    Regime::Default.apply(&mut client, database);
                }
            }
            Err(error) => eprintln!("synchronous_commit was not reset: {error}"),
        }
    }
}

/// `SHOW synchronous_commit` on a new session of `database`.
fn synchronous_commit(url: &str, database: &str) -> String {
    let mut client = postgres::Client::connect(&with_database(url, database), postgres::NoTls)
        .expect("the database takes a connection");
    client
        .query_one("SHOW synchronous_commit", &[])
        .unwrap()
        .get(0)
}

/// The systems of a round: Tessera through its `Worker`, the peers that
/// run beside it, and last Tessera through direct store calls (the
/// `submit_and_claim` loop, or `claim_batch` and `submit_batch`), on a
/// schema of its own, reported as extra rows.
struct Systems<'a> {
    tessera: Tessera,
    peers: &'a [Peer],
    calls: Tessera,
}

/// The systems' names in the tables' columns: Tessera, then `peers`. The
/// store-call side, measured after them (at index `names.len()` of every
/// run), has rows of its own.
fn names(peers: &[Peer]) -> Vec<&'static str> {
    std::iter::once("Tessera")
        .chain(peers.iter().map(|peer| peer.spec.name))
        .collect()
}

/// The store-call side's label in a processing step's rows.
fn calls_label(batched: bool) -> &'static str {
    if batched {
        "Tessera, claim_batch + submit_batch"
    } else {
        "Tessera, submit_and_claim loop"
    }
}

/// The store-call side's label in the enqueue steps' progress lines.
const CALLS_SIDE: &str = "Tessera, store-call side";

impl Systems<'_> {
    fn count(&self) -> usize {
        2 + self.peers.len()
    }

    fn is_tessera(&self, system: usize) -> bool {
        system == 0 || system == self.count() - 1
    }

    fn tessera(&self, system: usize) -> &Tessera {
        if system == 0 {
            &self.tessera
        } else {
            &self.calls
        }
    }

    fn database(&self, system: usize) -> &'static str {
        if self.is_tessera(system) {
            TESSERA_DATABASE
        } else {
            self.peers[system - 1].spec.database
        }
    }

    /// Measures `action` of every system, each between readings of its own
    /// database's counters, in turn: the `occurrence`th run of a step
    /// starts with the system after the one that started the run before,
    /// so that no system always runs on another's heels (its autovacuum,
    /// its cache). Returns the systems' measures in their own order.
    fn in_turn(
        &self,
        monitor: &mut Monitor,
        occurrence: usize,
        vacuum: bool,
        mut action: impl FnMut(usize) -> (u64, f64),
    ) -> Vec<Measured> {
        let count = self.count();
        let mut measured = vec![Measured::default(); count];
        for turn in 0..count {
            let system = (turn + occurrence) % count;
            measured[system] = monitor.measure(self.database(system), vacuum, || action(system));
        }
        measured
    }

    fn enqueue(&self, system: usize, jobs: usize, per_call: usize) -> (u64, f64) {
        if self.is_tessera(system) {
            self.tessera(system).enqueue(jobs, per_call)
        } else {
            self.peers[system - 1].run(&["enqueue", &jobs.to_string(), &per_call.to_string()])
        }
    }

    fn process(
        &self,
        system: usize,
        jobs: usize,
        workers: usize,
        batched: bool,
        step: u64,
    ) -> (u64, f64) {
        if system == 0 {
            let (jobs, seconds, _) =
                self.tessera
                    .process_with_worker(jobs, workers, Duration::ZERO, batched, step);
            (jobs, seconds)
        } else if self.is_tessera(system) {
            self.calls.process(jobs, workers, batched, step)
        } else {
            let (jobs, workers) = (jobs.to_string(), workers.to_string());
            let mut args = vec!["process", &jobs, &workers];
            if batched {
                args.push("batched");
            }
            self.peers[system - 1].run(&args)
        }
    }
}

fn postgres(url: &str, jobs: usize) {
    let mut monitor = Monitor::connect(url);
    monitor.ensure_database(TESSERA_DATABASE);
    let tessera_url = with_database(url, TESSERA_DATABASE);
    let peers = Peer::find(url, &mut monitor);
    let names = names(&peers);
    let node = peers.first().map(Peer::node_version);
    let steps = steps();
    let rounds = rounds();
    let databases: Vec<&str> = std::iter::once(TESSERA_DATABASE)
        .chain(peers.iter().map(|peer| peer.spec.database))
        .collect();
    // Back to the server's default once the run ends, however it ends.
    let _reset = RegimeReset {
        url: url.to_owned(),
        databases: databases
            .iter()
            .map(|&database| database.to_owned())
            .collect(),
    };
    for regime in Regime::selected() {
        // Before any of the regime's sessions opens: a session takes its
        // database's settings when it starts.
        for database in &databases {
            regime.apply(&mut monitor.client, database);
        }
        let settings: Vec<String> = databases
            .iter()
            .map(|database| format!("{database} {}", synchronous_commit(url, database)))
            .collect();
        let settings = settings.join(", ");
        eprintln!(
            "{}: synchronous_commit of a new session: {settings}",
            regime.title()
        );

        // The floor, in the regime too: its clients connect now.
        let floor_schema = PostgresSchema::fresh(&tessera_url, "peers_floor");
        let floor = MinimalCommit::create(&floor_schema, 8);
        let floor_before: Vec<f64> = FLOOR_CLIENTS
            .iter()
            .map(|&clients| postgres_floor(&floor, clients))
            .collect();
        // Its clients close, so that the steps' counters can be read.
        drop(floor);

        let mut enqueues: Vec<Row> = Vec::new();
        let mut processing: Vec<Row> = Vec::new();
        let mut schema = None;
        for round in 0..rounds {
            // Each round on empty tables: Tessera's schemas made anew (one
            // for its `Worker`, one for its store-call side, so that each
            // side's tables hold its own steps' jobs alone, as each peer's
            // do), and each peer's by its script.
            drop(schema.take());
            let fresh = PostgresSchema::fresh(&tessera_url, "peers");
            let fresh_calls = PostgresSchema::fresh(&tessera_url, "peers_calls");
            let systems = Systems {
                tessera: Tessera::setup(&tessera_url, fresh.name()),
                peers: &peers,
                calls: Tessera::setup(&tessera_url, fresh_calls.name()),
            };
            schema = Some((fresh, fresh_calls));
            for peer in &peers {
                peer.run(&["reset"]);
            }
            for (at, &(workers, batched)) in steps.iter().enumerate() {
                let step = (round * steps.len() + at) as u64 + 1;
                let same = |&&earlier: &&(usize, bool)| earlier == (workers, batched);
                // How many times this step ran before in this regime.
                let occurrence = round * steps.iter().filter(same).count()
                    + steps[..at].iter().filter(same).count();
                let per_call = if at == 0 { 1 } else { ENQUEUE_BATCH };
                if round == 0 {
                    let (figure, mode) = if per_call == 1 {
                        let figure = "enqueue, one per call".to_owned();
                        (figure.clone(), figure)
                    } else {
                        (
                            format!("enqueue, {per_call} per call (before step {})", at + 1),
                            format!("enqueue, {per_call} per call"),
                        )
                    };
                    enqueues.push(Row::new(figure, mode, None));
                    let kind = if batched { "batched" } else { "one at a time" };
                    let figure = format!("process {kind}, {workers} worker{}", plural(workers));
                    let calls = calls_label(batched).to_owned();
                    processing.push(Row::new(figure.clone(), figure, Some(calls)));
                }
                let measured = systems.in_turn(&mut monitor, occurrence, false, |system| {
                    systems.enqueue(system, jobs, per_call)
                });
                let labels: Vec<&str> = names.iter().copied().chain([CALLS_SIDE]).collect();
                report_progress(&labels, round, &enqueues[at].figure, &measured);
                enqueues[at].runs.push(measured);

                let measured = systems.in_turn(&mut monitor, occurrence, at > 0, |system| {
                    systems.process(system, jobs, workers, batched, step)
                });
                let labels: Vec<&str> = names
                    .iter()
                    .copied()
                    .chain([calls_label(batched)])
                    .collect();
                report_progress(&labels, round, &processing[at].figure, &measured);
                processing[at].runs.push(measured);
            }
        }
        // At the last round's tasks; none where no step enqueued any.
        let same_rows: Vec<Measured> = match &schema {
            Some((schema, _)) if !steps.is_empty() => SAME_ROWS_CLIENTS
                .iter()
                .map(|&clients| {
                    let measured =
                        same_rows_floor(&mut monitor, &tessera_url, schema.name(), clients);
                    eprintln!(
                        "the floor of a job's own rows, {clients} client{}: {:.0}/s, \
                         {:.2} rows/job, {:.0} WAL bytes/job",
                        plural(clients),
                        measured.rate(),
                        measured.per_job(measured.counters.rows()),
                        measured.per_job(measured.counters.wal_bytes),
                    );
                    measured
                })
                .collect(),
            _ => Vec::new(),
        };
        let floor = MinimalCommit::attach(&tessera_url, floor_schema.name(), 8);
        let floor_after: Vec<f64> = FLOOR_CLIENTS
            .iter()
            .map(|&clients| postgres_floor(&floor, clients))
            .collect();
        drop(floor);
        drop(floor_schema);
        drop(schema);

        println!();
        println!("## PostgreSQL, {}", regime.title());
        println!();
        println!(
            "{jobs} no-op jobs a step, {rounds} round{}; synchronous_commit of a new session: \
             {settings}",
            plural(rounds)
        );
        let mut about = vec![format!("Tessera's pool: {} connections", pool_size())];
        about.extend(
            peers
                .iter()
                .map(|peer| format!("{} {}", peer.spec.name, peer.version)),
        );
        about.extend(node.iter().map(|node| format!("Node {node}")));
        println!("{}", about.join("; "));
        print_regime(
            &names,
            &steps,
            &enqueues,
            &processing,
            &same_rows,
            [&floor_before, &floor_after],
        );
    }
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// The tables of one regime.
fn print_regime(
    names: &[&str],
    steps: &[(usize, bool)],
    enqueues: &[Row],
    processing: &[Row],
    same_rows: &[Measured],
    [floor_before, floor_after]: [&[f64]; 2],
) {
    // The store-call side's place in every run, after the columns'.
    let calls = names.len();
    let shown: Vec<&Row> = enqueues.iter().take(2).chain(processing).collect();
    println!();
    println!(
        "Rates in jobs/s, each the median over the rounds. Tessera: threads sharing one \
         `Worker` (one at a time: `WorkerOptions::default()`, `submit`; batched: \
         `with_fetch({CLAIM_BATCH})`, `submit_later`); the rows \"Tessera, …\" after a step: \
         Tessera's direct store calls, threads sharing one `Store`, a key each"
    );
    println!();
    println!("| figure | {} |", names.join(" | "));
    println!("| --- |{}", " ---: |".repeat(names.len()));
    for row in &shown {
        let rates: Vec<String> = (0..names.len())
            .map(|system| format!("{:.0}", row.rate(system)))
            .collect();
        println!("| {} | {} |", row.figure, rates.join(" | "));
        if let Some(label) = &row.extra {
            println!(
                "| {}: {label} | {:.0} |{}",
                row.figure,
                row.rate(calls),
                " – |".repeat(names.len() - 1)
            );
        }
    }
    if enqueues.len() > 2 {
        let each: Vec<String> = enqueues
            .iter()
            .skip(1)
            .map(|row| {
                let rates: Vec<String> = (0..names.len())
                    .map(|system| format!("{:.0}", row.rate(system)))
                    .collect();
                rates.join("/")
            })
            .collect();
        println!();
        println!(
            "every enqueue of {ENQUEUE_BATCH} per call ({}): {}",
            names.join("/"),
            each.join(", ")
        );
    }

    if names.len() > 1 {
        println!();
        println!(
            "Tessera's rate over each peer's: each round's ratio (every run of the mode, in \
             order), their median and the lowest"
        );
        println!();
        println!("| figure | peer | each round | median | lowest |");
        println!("| --- | --- | --- | ---: | ---: |");
        let mut modes: Vec<&str> = Vec::new();
        for row in &shown {
            if !modes.contains(&row.mode.as_str()) {
                modes.push(&row.mode);
            }
        }
        let all: Vec<&Row> = enqueues.iter().chain(processing).collect();
        for mode in modes {
            let rows: Vec<&Row> = all.iter().copied().filter(|row| row.mode == mode).collect();
            // Tessera's `Worker`, then its store-call side where shown.
            let sides = std::iter::once((0, mode.to_owned())).chain(
                rows.iter()
                    .find_map(|row| row.extra.as_deref())
                    .map(|label| (calls, format!("{mode}: {label}"))),
            );
            for (tessera, figure) in sides {
                for peer in 1..names.len() {
                    let ratios: Vec<f64> = rows
                        .iter()
                        .flat_map(|row| &row.runs)
                        .map(|run| run[tessera].rate() / run[peer].rate())
                        .collect();
                    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}×")).collect();
                    let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
                    println!(
                        "| {figure} | {} | {} | {:.2}× | {lowest:.2}× |",
                        names[peer],
                        each.join(", "),
                        median(ratios),
                    );
                }
            }
        }
    }

    println!();
    println!(
        "Per processed job, from the server's statistics, each the median over the rounds \
         (WAL: the whole server's log)"
    );
    println!();
    println!(
        "| step | system | transactions | rows inserted + updated + deleted | WAL bytes | \
         CPU ms: server + client |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for row in &shown {
        let systems = names
            .iter()
            .copied()
            .enumerate()
            .chain(row.extra.as_deref().map(|label| (calls, label)));
        for (system, name) in systems {
            let per_job = |value: fn(&Counters) -> i64| {
                row.median(system, |m| Some(m.per_job(value(&m.counters))))
                    .unwrap()
            };
            let cpu = |part: fn(&Measured) -> Option<f64>| {
                row.median(system, part)
                    .map_or("–".to_owned(), |cpu| format!("{cpu:.3}"))
            };
            println!(
                "| {} | {name} | {:.2} | {:.2} ({:.2} + {:.2} + {:.2}) | {:.0} | {} + {} |",
                row.figure,
                per_job(|c| c.commits),
                per_job(|c| c.rows()),
                per_job(|c| c.inserted),
                per_job(|c| c.updated),
                per_job(|c| c.deleted),
                per_job(|c| c.wal_bytes),
                cpu(Measured::server_ms_per_job),
                cpu(Measured::client_ms_per_job),
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
    if same_rows.is_empty() {
        return;
    }
    println!();
    println!(
        "The floor of a job's own rows: the five rows the submit_and_claim loop changes a \
         job, written in one statement a job (jobs/s, the systems' medians one at a time; \
         the floor's rows and WAL bytes a job from the server's statistics, WAL the whole \
         server's log)"
    );
    println!();
    let columns: Vec<&str> = names.iter().copied().chain([calls_label(false)]).collect();
    println!(
        "| clients | the same rows, one statement | its rows a job | its WAL bytes a job |{}",
        columns
            .iter()
            .map(|name| format!(" {name} |"))
            .collect::<String>()
    );
    println!(
        "| ---: | ---: | ---: | ---: |{}",
        " ---: |".repeat(columns.len())
    );
    for (clients, floor) in SAME_ROWS_CLIENTS.iter().zip(same_rows) {
        let step = steps
            .iter()
            .zip(processing)
            .find(|&(&(workers, batched), _)| workers == *clients && !batched)
            .map(|(_, row)| row);
        let rates: Vec<String> = (0..columns.len())
            .map(|system| step.map_or("–".to_owned(), |row| format!("{:.0}", row.rate(system))))
            .collect();
        println!(
            "| {clients} | {:.0} | {:.2} | {:.0} | {} |",
            floor.rate(),
            floor.per_job(floor.counters.rows()),
            floor.per_job(floor.counters.wal_bytes),
            rates.join(" | ")
        );
    }
}

/// The floor of a job's own writes: the five rows one job per claim
/// changes (the submitted attempt, its receipt written in its row, and its
/// audit row; the claimed attempt, its task's token and claim column, and
/// its audit row), on Tessera's tables in `schema`, at random rows of its
/// tasks, in one data-modifying statement a job (one round trip, one
/// commit, no reads, no lock waited for), `SAME_ROWS_JOBS` jobs shared by
/// `clients` threads with a connection each, measured by `monitor` as a
/// step is (right after a checkpoint, between two readings of the
/// database's counters).
fn same_rows_floor(monitor: &mut Monitor, url: &str, schema: &str, clients: usize) -> Measured {
    let statement = format!(
        "WITH submitted AS (UPDATE \"{schema}\".attempts SET state = CASE WHEN state = 'done' \
         THEN 'leased' ELSE 'done' END, until_at = NULL, lapses_at = NULL, changed_at = $3, \
         idempotency_key = 'k' || $3::bigint, \
         digest = '762069bc07a6e1b5df123a5ae7bd91c10daa04694fbaa17fba0cd6a8dcce8f22', \
         accepted_at = $3, output = 'done' \
         WHERE task = $1 AND number = 1 RETURNING 1), \
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
         SELECT (SELECT count(*) FROM submitted) + (SELECT count(*) FROM audited) \
         + (SELECT count(*) FROM leased) + (SELECT count(*) FROM moved)"
    );
    let (first, last): (i64, i64) = {
        let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
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
    monitor.measure(TESSERA_DATABASE, false, || {
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
                    // Unique per job and measurement, so each submission's
                    // idempotency key is new, as a worker's are.
                    let stamp = (clients as i64) << 48 | (thread as i64) << 40 | job as i64;
                    let written: i64 = client
                        .query_one(&prepared, &[&submitted, &claimed, &stamp])
                        .unwrap()
                        .get(0);
                    assert_eq!(written, 5, "a job's five rows");
                }
            },
        );
        ((per_client * clients) as u64, elapsed.as_secs_f64())
    })
}

fn report_progress(names: &[&str], round: usize, figure: &str, measured: &[Measured]) {
    let each: Vec<String> = names
        .iter()
        .zip(measured)
        .map(|(name, m)| {
            format!(
                "{name} {:.0}/s, {:.2} transactions/job, CPU ms/job {}",
                m.rate(),
                m.per_job(m.counters.commits),
                m.cpu_per_job()
            )
        })
        .collect();
    eprintln!("round {}, {figure}: {}", round + 1, each.join("; "));
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

/// What a peer is: its name in the tables, its names in
/// `TESSERA_PEERS_WITH`, its npm package, its script in `benches/peers/`
/// and its database.
struct PeerSpec {
    name: &'static str,
    keys: [&'static str; 2],
    package: &'static str,
    script: &'static str,
    database: &'static str,
}

/// The peers, in the order the tables show them.
const PEER_SPECS: [PeerSpec; 2] = [
    PeerSpec {
        name: "graphile-worker",
        keys: ["graphile", "graphile-worker"],
        package: "graphile-worker",
        script: "graphile.js",
        database: "graphile_bench",
    },
    PeerSpec {
        name: "pg-boss",
        keys: ["pgboss", "pg-boss"],
        package: "pg-boss",
        script: "pgboss.js",
        database: "pgboss_bench",
    },
];

/// A peer's side: `node benches/peers/<script>` with the packages
/// installed in `TESSERA_PEER_GRAPHILE`, and the Node there if one is.
struct Peer {
    spec: &'static PeerSpec,
    node: PathBuf,
    node_path: PathBuf,
    script: PathBuf,
    database_url: String,
    /// The package's version, as its script reports it.
    version: String,
}

impl Peer {
    /// The peers of this run, each with its database (created when
    /// missing) and its schema made anew: those `TESSERA_PEERS_WITH` names
    /// (`graphile`, `pgboss`, separated by commas; `none` for none), else
    /// every peer; none without `TESSERA_PEER_GRAPHILE`.
    fn find(url: &str, monitor: &mut Monitor) -> Vec<Self> {
        let Some(dir) = std::env::var_os("TESSERA_PEER_GRAPHILE").filter(|dir| !dir.is_empty())
        else {
            println!("TESSERA_PEER_GRAPHILE is not set: Tessera's side only");
            return Vec::new();
        };
        let node_path = PathBuf::from(dir).join("node_modules");
        let local = node_path.join(".bin").join("node");
        let node = if local.exists() {
            local
        } else {
            PathBuf::from("node")
        };
        let specs: Vec<&'static PeerSpec> = match std::env::var("TESSERA_PEERS_WITH") {
            Err(_) => PEER_SPECS.iter().collect(),
            Ok(listed) => listed
                .split(',')
                .map(str::trim)
                .filter(|&name| name != "none" && !name.is_empty())
                .map(|name| {
                    PEER_SPECS
                        .iter()
                        .find(|spec| spec.keys.contains(&name))
                        .unwrap_or_else(|| panic!("TESSERA_PEERS_WITH: no peer is named {name:?}"))
                })
                .collect(),
        };
        specs
            .into_iter()
            .map(|spec| {
                assert!(
                    node_path.join(spec.package).is_dir(),
                    "{} is not installed in {}: benches/peers/run.sh installs it",
                    spec.package,
                    node_path.display()
                );
                monitor.ensure_database(spec.database);
                let mut peer = Self {
                    spec,
                    node: node.clone(),
                    node_path: node_path.clone(),
                    script: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("peers")
                        .join(spec.script),
                    database_url: with_database(url, spec.database),
                    version: String::new(),
                };
                let reset = peer.call(&["reset"]);
                peer.version = reset["version"].as_str().unwrap_or("?").to_owned();
                peer
            })
            .collect()
    }

    /// `node --version`.
    fn node_version(&self) -> String {
        let output = Command::new(&self.node)
            .arg("--version")
            .output()
            .expect("node runs");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Runs the script with `args`; returns the JSON line it printed last.
    /// With `TESSERA_PEERS_DEBUG` set the script says what `SHOW
    /// synchronous_commit` answered on its pool, and this prints it.
    fn call(&self, args: &[&str]) -> serde_json::Value {
        let output = Command::new(&self.node)
            .arg(&self.script)
            .args(args)
            .env("NODE_PATH", &self.node_path)
            .env("DATABASE_URL", &self.database_url)
            .output()
            .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{} {args:?} failed: {}\n{stdout}",
            self.spec.script,
            String::from_utf8_lossy(&output.stderr)
        );
        let line = stdout.lines().last().unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|error| {
            panic!("{} {args:?} printed {line:?}: {error}", self.spec.script)
        });
        if let Some(setting) = value["synchronous_commit"].as_str() {
            eprintln!(
                "{} {args:?}: synchronous_commit {setting} on its pool",
                self.spec.name
            );
        }
        value
    }

    /// Runs the script with `args`; returns its jobs and seconds.
    fn run(&self, args: &[&str]) -> (u64, f64) {
        let value = self.call(args);
        (
            value["jobs"].as_u64().unwrap_or(0),
            value["seconds"].as_f64().unwrap_or(0.0),
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

    /// Processes the queue through direct store calls, with `workers`
    /// threads sharing one `Store`, a key each, until each finds it empty:
    /// a claim and a submit per task (the `submit_and_claim` loop), or a
    /// `claim_batch` of `CLAIM_BATCH` and one `submit_batch`. Checks that
    /// `jobs` distinct tasks were processed.
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
    /// (one key), each taking the next task, taking `work` over it (a
    /// sleep, as a task waiting on I/O does) and submitting it until the
    /// worker answers empty. One at a time (not `batched`): the worker's
    /// defaults (`WorkerOptions::default()`, fetching 10 ahead) and
    /// `submit`, which waits for its commit (the completer coalescing the
    /// threads' submissions). Batched: fetching `CLAIM_BATCH` ahead and
    /// `submit_later`, the worker holding up to `CLAIM_BATCH`
    /// acknowledgements for one transaction, each thread collecting its
    /// answers at the end. Checks that `jobs` distinct tasks were
    /// processed; returns them, the seconds, and the worker's transactions
    /// (claims and flushes of held acknowledgements).
    fn process_with_worker(
        &self,
        jobs: usize,
        threads: usize,
        work: Duration,
        batched: bool,
        step: u64,
    ) -> (u64, f64, u64) {
        let store = (self.open)();
        let caller = self.caller(&store, 0);
        let options = if batched {
            WorkerOptions::default().with_fetch(CLAIM_BATCH)
        } else {
            WorkerOptions::default()
        };
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
                        let key = idempotency_key(thread, step << 32 | mine.len() as u64);
                        if batched {
                            pending.push(worker.submit_later(&claimed, &key, output).unwrap());
                        } else {
                            let submitted = worker.submit(&claimed, &key, output).unwrap();
                            assert!(matches!(submitted, Submitted::Accepted(_)));
                        }
                        mine.push(claimed.task.id.to_string());
                    }
                    // Batched: the `next` that found the queue empty
                    // committed what was held.
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
        if std::env::var_os("TESSERA_PEERS_DEBUG").is_some() {
            eprintln!("worker stats: {stats:?}");
        }
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
    let mut step = 200;
    // One at a time through the worker loop: `submit`, which carries the
    // next claim while the buffer has room.
    for threads in LOOP_THREADS {
        tessera.enqueue(jobs, ENQUEUE_BATCH);
        step += 1;
        let (done, seconds, _) =
            tessera.process_with_worker(jobs, threads, Duration::ZERO, false, step);
        let rate = done as f64 / seconds;
        eprintln!("SQLite, worker loop one at a time, {threads} threads: {rate:.0} tasks/s");
        rows.push((
            threads,
            "worker loop, one at a time (`submit`)".to_owned(),
            rate,
        ));
    }
    let mut slow = Vec::new();
    for (work, tasks) in [(Duration::ZERO, jobs), (SLOW_TASK, SLOW_TASKS)] {
        for threads in LOOP_THREADS {
            tessera.enqueue(tasks, ENQUEUE_BATCH);
            step += 1;
            let (done, seconds, transactions) =
                tessera.process_with_worker(tasks, threads, work, true, step);
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

/// The floor under a processed task on SQLite: the five rows one task's
/// claim and submission change (the attempt leased, then done with its
/// receipt in the same row, the task's token and claim column, two audit
/// rows), written by hand into Tessera's own file, tables and indexes
/// with prepared statements, at tasks in enqueue order, `per_commit`
/// tasks to a `BEGIN IMMEDIATE` … `COMMIT`, no rules, reads or meter.
/// Tasks/s from one thread.
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
                     ELSE 'done' END, until_at = NULL, lapses_at = NULL, changed_at = ?2, \
                     idempotency_key = 'k' || ?2, \
                     digest = '762069bc07a6e1b5df123a5ae7bd91c10daa04694fbaa17fba0cd6a8dcce8f22', \
                     accepted_at = ?2, output = x'646f6e65' \
                     WHERE task = ?1 AND number = 1",
                    rusqlite::params![task, stamp],
                ),
                run(
                    "INSERT INTO access_audit (at, principal, namespace, action, outcome, \
                     resource, ip_hash) VALUES (?1, 'p2', 'bench', 'submit', 'ok', \
                     'task:t-01a23cc863e77c254d21b955aaa0@1/a1/t1', '')",
                    rusqlite::params![stamp],
                ),
            ];
            assert_eq!(written, [1; 5], "a task's five rows");
        }
        run("COMMIT", &[]);
    }
    SQLITE_SAME_ROWS_TASKS as f64 / began.elapsed().as_secs_f64()
}
