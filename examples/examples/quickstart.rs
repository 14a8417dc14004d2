//! Tessera's store, embedded: a burst of one hundred worker threads claims,
//! heartbeats and submits through the blocking claim gate on a SQLite file.
//!
//! It opens the database (default `tessera-quickstart.db` in the working
//! directory, or `--db PATH`; created if missing, never deleted), makes an
//! admin key and two worker keys (a heavy one running 90 threads, a light
//! one running 10), enqueues the tasks in a namespace of its own, runs the
//! burst, checks that no task was leased twice and no submission
//! was lost, and prints what happened. It exits non-zero if a check fails.
//!
//! Run: `cargo run --release --example quickstart [-- --db PATH]`

use std::collections::HashSet;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tessera_store::{
    Brief, Caller, ClaimOutcome, EnqueueOptions, Error, Grant, IdempotencyKey, KeySpec,
    MeterSnapshot, Namespace, Output, QueueName, Scope, Store, StoreConfig, Submitted, TaskRef,
};

const TASKS: usize = 2_000;
const HEAVY_THREADS: usize = 90;
const LIGHT_THREADS: usize = 10;

/// What the workers saw, shared between them.
#[derive(Default)]
struct Tally {
    /// `(task, fencing token)` of every lease granted.
    leases: Vec<(TaskRef, i64)>,
    /// Waits of granted claims, in microseconds.
    waits: Vec<u128>,
    admitted_at_once: usize,
    admitted_after_waiting: usize,
    rate_limited: usize,
    heavy_claims: usize,
    light_claims: usize,
    accepted: usize,
    errors: Vec<String>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = db_path()?;
    let config =
        StoreConfig::default().with_admission(tessera_examples::admission_from_env("quickstart"));
    // An existing file is opened as it is (nothing is deleted); each run
    // works in a namespace of its own.
    let store = Store::open(&path, config)?;
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let renders = Namespace::parse(&format!("renders-{}", run.as_millis()))?;
    println!("database: {}, namespace: {renders}", path.display());

    let admin_key = store.create_admin_key("operators")?;
    let admin = store.authenticate(Some(admin_key.secret.expose()))?;
    let frames = QueueName::parse("frames")?;
    let worker_spec = |account: &str| {
        KeySpec::keyed(account)
            .with_scopes([Scope::Enqueue, Scope::Claim, Scope::Read])
            .with_grant(Grant::Namespace(renders.clone()))
    };
    let heavy_key = store.create_key(&admin, &worker_spec("heavy-farm"))?;
    let light_key = store.create_key(&admin, &worker_spec("light-farm"))?;
    let heavy = store.authenticate(Some(heavy_key.secret.expose()))?;
    let light = store.authenticate(Some(light_key.secret.expose()))?;

    // One lifecycle on its own first, so its rows are this request's alone.
    let costs = measure_lifecycle(&store, &heavy, &renders)?;

    let started = Instant::now();
    for frame in 0..TASKS {
        let brief = Brief::Json(serde_json::json!({ "frame": frame }));
        store.enqueue(
            &heavy,
            &renders,
            &frames,
            &brief,
            &EnqueueOptions::default(),
        )?;
    }
    let enqueued_in = started.elapsed();

    let tally = Mutex::new(Tally::default());
    let done = AtomicUsize::new(0);
    let finished = AtomicBool::new(false);
    let limits = Mutex::new(Vec::<(Duration, u32)>::new());
    let before = store.meter();
    let burst = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| watch(&store, &done, &finished, &limits, burst));
        let workers: Vec<_> = (0..HEAVY_THREADS + LIGHT_THREADS)
            .map(|n| {
                let caller = if n < HEAVY_THREADS { &heavy } else { &light };
                let (store, tally, done) = (&store, &tally, &done);
                let (renders, frames) = (&renders, &frames);
                scope.spawn(move || work(store, caller, renders, frames, n, tally, done))
            })
            .collect();
        for worker in workers {
            worker.join().expect("a worker thread panicked");
        }
        finished.store(true, Ordering::SeqCst);
    });
    let burst_took = burst.elapsed();
    let burst_cost = store.meter().since(&before);
    if std::io::stderr().is_terminal() {
        eprintln!();
    }

    let tally = tally.into_inner().expect("no worker panics");
    let health = store.health(&admin, &renders)?;
    let failures = check(&tally, health.attempts.done);
    report(
        &tally,
        &limits.into_inner().expect("no worker panics"),
        &costs,
        burst_cost,
        (enqueued_in, burst_took),
    );
    if failures.is_empty() {
        println!("checks: every task leased once, every submission stored, no 429");
        Ok(())
    } else {
        for failure in &failures {
            println!("FAILED: {failure}");
        }
        std::process::exit(1);
    }
}

fn db_path() -> Result<PathBuf, String> {
    let mut args = std::env::args().skip(1);
    let mut path = PathBuf::from("tessera-quickstart.db");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--db" => path = args.next().ok_or("--db needs a path")?.into(),
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: quickstart [--db PATH]"
                ));
            }
        }
    }
    Ok(path)
}

/// One worker thread: claim, heartbeat, submit, until the queue is empty.
fn work(
    store: &Store,
    caller: &Caller,
    renders: &Namespace,
    frames: &QueueName,
    worker: usize,
    tally: &Mutex<Tally>,
    done: &AtomicUsize,
) {
    let heavy = worker < HEAVY_THREADS;
    loop {
        let claimed = match store.claim(caller, renders, frames) {
            Ok(ClaimOutcome::Granted(claimed)) => claimed,
            Ok(ClaimOutcome::Empty { .. }) => return,
            Err(Error::RateLimited { .. }) => {
                // A host would retry after Retry-After plus jitter.
                tally.lock().expect("no worker panics").rate_limited += 1;
                continue;
            }
            Err(error) => {
                return tally
                    .lock()
                    .expect("no worker panics")
                    .errors
                    .push(format!("claim: {error}"));
            }
        };
        let token = claimed.lease.token();
        {
            let mut tally = tally.lock().expect("no worker panics");
            tally.leases.push((claimed.task.clone(), token.as_i64()));
            tally.waits.push(claimed.waited.as_micros());
            if claimed.waited.is_zero() {
                tally.admitted_at_once += 1;
            } else {
                tally.admitted_after_waiting += 1;
            }
            if heavy {
                tally.heavy_claims += 1;
            } else {
                tally.light_claims += 1;
            }
        }
        if let Err(error) = store.heartbeat(caller, &claimed.task, token) {
            tally
                .lock()
                .expect("no worker panics")
                .errors
                .push(format!("heartbeat: {error}"));
        }
        let key = IdempotencyKey::parse(&format!("w{worker}-{}", claimed.task.id))
            .expect("a valid idempotency key");
        let output = Output::bytes(format!("rendered {}", claimed.task.id));
        match store.submit(caller, &claimed.task, token, &key, &output) {
            Ok(Submitted::Accepted(_)) => {
                tally.lock().expect("no worker panics").accepted += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Submitted::Replayed(_)) => tally
                .lock()
                .expect("no worker panics")
                .errors
                .push("unexpected replay".into()),
            Err(error) => tally
                .lock()
                .expect("no worker panics")
                .errors
                .push(format!("submit: {error}")),
        }
    }
}

/// Prints a live line and samples the concurrency limit while workers run.
fn watch(
    store: &Store,
    done: &AtomicUsize,
    finished: &AtomicBool,
    limits: &Mutex<Vec<(Duration, u32)>>,
    start: Instant,
) {
    // In place on a terminal; one line every two seconds in a log.
    let terminal = std::io::stderr().is_terminal();
    let mut last_line: Option<Instant> = None;
    while !finished.load(Ordering::SeqCst) {
        let stats = store.claim_stats();
        limits
            .lock()
            .expect("no worker panics")
            .push((start.elapsed(), stats.limit));
        let line = format!(
            "  done {:>5}/{TASKS}  limit {:>4}  in flight {:>3}  waiting {:>3}",
            done.load(Ordering::Relaxed),
            stats.limit,
            stats.in_flight,
            stats.pending
        );
        if terminal {
            eprint!("\r{line}");
            let _ = std::io::stderr().flush();
        } else if last_line.is_none_or(|at| at.elapsed() >= Duration::from_secs(2)) {
            eprintln!("{line}");
            last_line = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Rows written and read by one request of each kind, measured alone.
fn measure_lifecycle(
    store: &Store,
    caller: &Caller,
    renders: &Namespace,
) -> Result<Vec<(&'static str, MeterSnapshot)>, Error> {
    let warmup = QueueName::parse("warmup").expect("a valid queue name");
    let brief = Brief::Json(serde_json::json!({ "frame": "warmup" }));
    let mut costs = Vec::new();
    let (task, cost) =
        store.measure(|s| s.enqueue(caller, renders, &warmup, &brief, &EnqueueOptions::default()));
    costs.push(("enqueue (first in namespace)", cost));
    let task = task?;
    let (claimed, cost) = store.measure(|s| s.claim(caller, renders, &warmup));
    costs.push(("claim, granted", cost));
    let token = claimed?
        .claimed()
        .expect("the warm-up task is ready")
        .lease
        .token();
    // A heartbeat in the claim's own millisecond would leave the expiry as
    // it is; a moment later it moves it, as `cost_table`'s does.
    std::thread::sleep(Duration::from_millis(2));
    let (beat, cost) = store.measure(|s| s.heartbeat(caller, &task, token));
    beat?;
    costs.push(("heartbeat", cost));
    let key = IdempotencyKey::parse("warmup").expect("a valid idempotency key");
    let output = Output::bytes("warm");
    let (first, cost) = store.measure(|s| s.submit(caller, &task, token, &key, &output));
    assert!(matches!(first?, Submitted::Accepted(_)));
    costs.push(("submit", cost));
    let (replay, cost) = store.measure(|s| s.submit(caller, &task, token, &key, &output));
    assert!(matches!(replay?, Submitted::Replayed(_)));
    costs.push(("submit, replayed", cost));
    let (empty, cost) = store.measure(|s| s.claim(caller, renders, &warmup));
    assert!(empty?.claimed().is_none());
    costs.push(("claim, empty queue", cost));
    Ok(costs)
}

fn check(tally: &Tally, stored_done: u64) -> Vec<String> {
    let mut failures = tally.errors.clone();
    let mut tasks = HashSet::new();
    for (task, _) in &tally.leases {
        if !tasks.insert(task) {
            failures.push(format!("task {task} was leased twice"));
        }
    }
    if tally.accepted != TASKS {
        failures.push(format!(
            "{} of {TASKS} submissions accepted",
            tally.accepted
        ));
    }
    // The warm-up task is done too.
    if stored_done != TASKS as u64 + 1 {
        failures.push(format!(
            "{stored_done} done attempts stored, expected {}",
            TASKS + 1
        ));
    }
    if tally.rate_limited > 0 {
        failures.push(format!("{} claims were answered 429", tally.rate_limited));
    }
    failures
}

fn percentile(sorted: &[u128], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index] as f64 / 1000.0
}

fn report(
    tally: &Tally,
    limits: &[(Duration, u32)],
    costs: &[(&str, MeterSnapshot)],
    burst: MeterSnapshot,
    (enqueued_in, burst_took): (Duration, Duration),
) {
    let mut waits = tally.waits.clone();
    waits.sort_unstable();
    println!(
        "\n{TASKS} tasks enqueued in {:.2} s; {} worker threads ({HEAVY_THREADS} on the heavy key, \
         {LIGHT_THREADS} on the light key) finished in {:.2} s",
        enqueued_in.as_secs_f64(),
        HEAVY_THREADS + LIGHT_THREADS,
        burst_took.as_secs_f64()
    );
    println!("  tasks done            {}", tally.accepted);
    println!(
        "  claims                {} admitted at once, {} after waiting their turn",
        tally.admitted_at_once, tally.admitted_after_waiting
    );
    println!(
        "  claims by key         heavy {}, light {}",
        tally.heavy_claims, tally.light_claims
    );
    println!(
        "  wait                  p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        percentile(&waits, 1.0)
    );
    println!(
        "  429 rate_limited      {} (expected 0)",
        tally.rate_limited
    );
    let mut changes: Vec<(Duration, u32)> = Vec::new();
    for &(at, limit) in limits {
        if changes.last().is_none_or(|&(_, last)| last != limit) {
            changes.push((at, limit));
        }
    }
    let timeline: Vec<String> = changes
        .iter()
        .map(|(at, limit)| format!("{limit} at {:.1} s", at.as_secs_f64()))
        .collect();
    println!("  concurrency limit     {}", timeline.join(", "));
    println!("\nrows per request (measured by the store's meter, index entries included):");
    println!(
        "  (each on a caller authenticated once; `cost_table` also counts each request's key\n   \
         lookup, one row read more, and its key was used before, so its first enqueue in a\n   \
         namespace writes no `last_used_at`, one row less)"
    );
    println!("  {:<30} {:>8} {:>8}", "request", "written", "read");
    for (name, cost) in costs {
        println!(
            "  {name:<30} {:>8} {:>8}",
            cost.rows_written, cost.rows_read
        );
    }
    println!(
        "  {:<30} {:>8} {:>8}",
        "burst, per task done",
        burst.rows_written / TASKS as u64,
        burst.rows_read / TASKS as u64
    );
}
