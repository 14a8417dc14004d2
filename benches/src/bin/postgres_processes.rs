//! Claims from several processes on one PostgreSQL database: the rate of
//! claim-and-submit from 1 process and from 4 processes draining one
//! queue, beside the minimal-commit rate from as many processes.
//!
//! Run: `TESSERA_BENCH_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --release -p tessera-benches --bin postgres_processes [TASKS] [COMMITS]`
//!
//! The server is `TESSERA_BENCH_POSTGRES_URL`, else
//! `TESSERA_TEST_POSTGRES_URL`; without either the program says it skipped
//! and exits. For each process count (1, then 4) it enqueues `TASKS`
//! (default 4,000) tasks into one queue of a fresh schema through the
//! public API, then starts that many copies of itself, each with its own
//! key and its own store (default PostgreSQL settings, the system clock, a
//! one-hour lease). Each copy opens its store, says it is ready and, once
//! all are, claims and submits until its claim finds the queue empty. The
//! rate is all claims over the time from the first copy's start to the
//! last one's finish; copies report their wall-clock span and every task
//! they claimed. The program then checks that no task was leased twice
//! (every task id claimed once, each on its first attempt and token) and
//! that the namespace's health, read by a fresh store, counts all `TASKS`
//! done and nothing ready or leased. The baseline is the same number of
//! copies each doing `COMMITS` (default 2,000) minimal commits (one row,
//! `BEGIN` … `COMMIT`, on one client of its own with the insert prepared).
//! Every schema is `bench_<pid>_…` and dropped at the end.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_benches::{MinimalCommit, PostgresSchema, idempotency_key, postgres_url, queue};
use tessera_store::postgres::PostgresOptions;
use tessera_store::{
    AttemptNumber, Brief, ClaimOutcome, EnqueueOptions, FencingToken, Grant, KeySpec, Namespace,
    Output, Store, StoreConfig, Submitted,
};

/// Which copy this is: unset in the parent, `claim` or `commit` in a child.
const ROLE: &str = "TESSERA_BENCH_ROLE";
/// The child's schema.
const SCHEMA: &str = "TESSERA_BENCH_SCHEMA";
/// The child's key secret.
const KEY: &str = "TESSERA_BENCH_KEY";
/// The child's number, for its idempotency keys.
const INDEX: &str = "TESSERA_BENCH_INDEX";
/// How many minimal commits a `commit` child makes.
const COMMITS: &str = "TESSERA_BENCH_COMMITS";

const PROCESS_COUNTS: [usize; 2] = [1, 4];
const QUEUE: &str = "shared";

fn main() {
    let Some(url) = postgres_url() else {
        println!(
            "skipping postgres_processes: neither TESSERA_BENCH_POSTGRES_URL nor TESSERA_TEST_POSTGRES_URL is set"
        );
        return;
    };
    match std::env::var(ROLE).as_deref() {
        Ok("claim") => claim_child(&url),
        Ok("commit") => commit_child(&url),
        Ok(other) => panic!("unknown {ROLE} {other:?}"),
        Err(_) => parent(&url),
    }
}

fn parent(url: &str) {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().map_or(4_000, |arg| arg.parse().unwrap());
    let commits: usize = args.next().map_or(2_000, |arg| arg.parse().unwrap());
    let pid = std::process::id();
    let mut rows = Vec::new();
    for processes in PROCESS_COUNTS {
        let commit_rate = minimal_commits(
            url,
            &format!("bench_{pid}_commit_{processes}"),
            processes,
            commits,
        );
        let claim_rate = claims(
            url,
            &format!("bench_{pid}_claim_{processes}"),
            processes,
            tasks,
        );
        rows.push((processes, claim_rate, commit_rate));
    }
    println!();
    println!(
        "| processes | claims/s (claim + submit) | minimal commits/s | claim / minimal commit |"
    );
    println!("|---:|---:|---:|---:|");
    for (processes, claim_rate, commit_rate) in rows {
        println!(
            "| {processes} | {claim_rate:.0} | {commit_rate:.0} | {:.3} |",
            claim_rate / commit_rate
        );
    }
}

/// The store settings of every copy: the defaults and a one-hour lease.
fn open_store(url: &str, schema: &str) -> Store {
    let config = StoreConfig::default().with_lease_duration(Duration::from_secs(3600));
    Store::open_postgres(PostgresOptions::new(url).with_schema(schema), config).unwrap()
}

fn namespace() -> Namespace {
    Namespace::parse("bench").unwrap()
}

/// Fills a queue with `tasks` tasks, drains it from `processes` children,
/// checks every task was done once, and returns claims per second.
fn claims(url: &str, schema_name: &str, processes: usize, tasks: usize) -> f64 {
    let schema = PostgresSchema::fresh(url, schema_name);
    let store = open_store(url, schema.name());
    let admin_key = store.create_admin_key("operators").unwrap();
    let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
    let spec = KeySpec::keyed("bench")
        .with_scopes(tessera_store::Scope::ALL.iter().copied())
        .with_grant(Grant::Namespace(namespace()));
    let secrets: Vec<String> = (0..processes)
        .map(|_| {
            let key = store.create_key(&admin, &spec).unwrap();
            key.secret.expose().to_owned()
        })
        .collect();
    let worker = store.authenticate(Some(&secrets[0])).unwrap();
    let began = Instant::now();
    for _ in 0..tasks {
        store
            .enqueue(
                &worker,
                &namespace(),
                &queue(QUEUE),
                &Brief::Bytes(br#"{"frame":42}"#.to_vec()),
                &EnqueueOptions::default(),
            )
            .unwrap();
    }
    eprintln!(
        "{processes} process(es): {tasks} tasks enqueued in {:.1?}",
        began.elapsed()
    );
    drop(store);

    let children: Vec<_> = secrets
        .iter()
        .enumerate()
        .map(|(index, secret)| {
            spawn(url, schema.name(), "claim", |command| {
                command.env(KEY, secret).env(INDEX, index.to_string());
            })
        })
        .collect();
    let reports = run(children);

    let mut seen = HashSet::new();
    let mut repeated = 0;
    let mut not_first = 0;
    let mut per_process = Vec::new();
    for report in &reports {
        per_process.push(report.lines.len().to_string());
        for line in &report.lines {
            let mut fields = line.split(' ');
            let (Some("claimed"), Some(task), Some(first)) =
                (fields.next(), fields.next(), fields.next())
            else {
                panic!("unexpected line from a child: {line:?}");
            };
            if !seen.insert(task.to_owned()) {
                repeated += 1;
            }
            if first != "first" {
                not_first += 1;
            }
        }
    }
    let claimed: usize = reports.iter().map(|report| report.lines.len()).sum();
    let span = span(&reports);
    let health = {
        let store = open_store(url, schema.name());
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        store.health(&admin, &namespace()).unwrap().attempts
    };
    println!(
        "{processes} process(es): {claimed} claims ({} per process) in {span:.2?}; \
         distinct tasks {}, claimed again {repeated}, not on a first lease {not_first}; \
         health: done {}, ready {}, leased {}, failed {}, backoff {}",
        per_process.join(" + "),
        seen.len(),
        health.done,
        health.ready,
        health.leased,
        health.failed,
        health.backoff,
    );
    let tasks = tasks as u64;
    assert_eq!(claimed as u64, tasks, "claims != tasks");
    assert_eq!(
        seen.len() as u64,
        tasks,
        "a task was claimed twice or never"
    );
    assert_eq!((repeated, not_first), (0, 0), "a task was leased twice");
    assert_eq!(health.done, tasks, "not every task is done");
    assert_eq!(health.total(), tasks, "tasks left in other states");
    claimed as f64 / span.as_secs_f64()
}

/// `processes` children each making `commits` minimal commits; returns
/// commits per second.
fn minimal_commits(url: &str, schema_name: &str, processes: usize, commits: usize) -> f64 {
    let schema = PostgresSchema::fresh(url, schema_name);
    drop(MinimalCommit::create(&schema, 1));
    let children: Vec<_> = (0..processes)
        .map(|_| {
            spawn(url, schema.name(), "commit", |command| {
                command.env(COMMITS, commits.to_string());
            })
        })
        .collect();
    let reports = run(children);
    let span = span(&reports);
    let total = processes * commits;
    println!("{processes} process(es): {total} minimal commits in {span:.2?}");
    total as f64 / span.as_secs_f64()
}

/// A started copy of this program, once it said it is ready.
struct Started {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// What a copy reported: its wall-clock span and its other lines.
struct Report {
    began_us: u128,
    ended_us: u128,
    lines: Vec<String>,
}

fn spawn(url: &str, schema: &str, role: &str, configure: impl FnOnce(&mut Command)) -> Started {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env("TESSERA_BENCH_POSTGRES_URL", url)
        .env(ROLE, role)
        .env(SCHEMA, schema)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    configure(&mut command);
    let mut child = command.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    Started {
        child,
        stdin,
        stdout,
    }
}

/// Waits until every child is ready, lets them all go, and collects what
/// each reported.
fn run(mut children: Vec<Started>) -> Vec<Report> {
    for started in &mut children {
        let mut line = String::new();
        started.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "a child did not start");
    }
    for started in &mut children {
        started.stdin.write_all(b"go\n").unwrap();
        started.stdin.flush().unwrap();
    }
    children
        .into_iter()
        .map(|mut started| {
            let mut lines: Vec<String> = (&mut started.stdout)
                .lines()
                .map(|line| line.unwrap())
                .collect();
            let status = started.child.wait().unwrap();
            assert!(status.success(), "a child failed: {status}");
            let span = lines.pop().expect("a child reported nothing");
            let mut fields = span.split(' ');
            let (Some("span"), Some(began), Some(ended)) =
                (fields.next(), fields.next(), fields.next())
            else {
                panic!("unexpected last line from a child: {span:?}");
            };
            Report {
                began_us: began.parse().unwrap(),
                ended_us: ended.parse().unwrap(),
                lines,
            }
        })
        .collect()
}

/// From the first child's start to the last one's finish.
fn span(reports: &[Report]) -> Duration {
    let began = reports.iter().map(|report| report.began_us).min().unwrap();
    let ended = reports.iter().map(|report| report.ended_us).max().unwrap();
    Duration::from_micros((ended - began) as u64)
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// Says the child is ready and waits for the parent's go.
fn ready() {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn claim_child(url: &str) {
    let store = open_store(url, &env(SCHEMA));
    let caller = store.authenticate(Some(&env(KEY))).unwrap();
    let index: usize = env(INDEX).parse().unwrap();
    let (namespace, queue) = (namespace(), queue(QUEUE));
    let output = Output::bytes(b"rendered".to_vec());
    let mut claimed = Vec::new();
    ready();
    let began = unix_micros();
    // Until a claim finds the queue empty.
    while let ClaimOutcome::Granted(lease) = store.claim(&caller, &namespace, &queue).unwrap() {
        let key = idempotency_key(index, claimed.len() as u64);
        let submitted = store
            .submit(&caller, &lease.task, lease.lease.token(), &key, &output)
            .unwrap();
        assert!(matches!(submitted, Submitted::Accepted(_)));
        let first = lease.lease.attempt() == AttemptNumber::FIRST
            && lease.lease.token() == FencingToken::FIRST;
        claimed.push((lease.task.id, first));
    }
    let ended = unix_micros();
    let mut stdout = BufWriter::new(std::io::stdout().lock());
    for (task, first) in claimed {
        let first = if first { "first" } else { "again" };
        writeln!(stdout, "claimed {task} {first}").unwrap();
    }
    writeln!(stdout, "span {began} {ended}").unwrap();
    stdout.flush().unwrap();
}

fn commit_child(url: &str) {
    let commits: i64 = env(COMMITS).parse().unwrap();
    let baseline = MinimalCommit::attach(url, &env(SCHEMA), 1);
    ready();
    let began = unix_micros();
    for value in 0..commits {
        baseline.commit(value);
    }
    let ended = unix_micros();
    println!("span {began} {ended}");
}
