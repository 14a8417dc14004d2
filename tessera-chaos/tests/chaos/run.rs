//! One chaos run: a producer in this process enqueues (and now and then
//! cancels) tasks, worker processes claim and finish them, faults drawn
//! from the seed strike meanwhile, and at the end the merged history and
//! the store's final state go to the checker.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use tessera_chaos::{Link, Recorder, Rng, TcpProxy, monotonic_nanos, pause, read_history};
use tessera_check::{
    AttemptState, CheckOptions, Completion, FinalAttempt, FinalState, FinalTask, History,
    Operation, Outcome, Report, check_with,
};
use tessera_store::faults::InjectedFault;
use tessera_store::lease::StateName;
use tessera_store::{
    Brief, BriefVersion, Caller, Clock as _, EnqueueOptions, Error, Grant, ListOrder, Namespace,
    Output, QueueName, Scope, Store, SystemClock, TaskId, TaskQuery, TaskRef, TaskState,
};

use crate::harness::{BackendKind, Fixture, TestDb, namespace, queue};
use crate::postgres_faults::PostgresFaults;
use crate::worker::{self, Orders, completion_of, receipt_of, refuse_file, stop_file};

/// The namespace and queue of every run.
pub(crate) fn work_namespace() -> Namespace {
    namespace("chaos")
}

pub(crate) fn work_queue() -> QueueName {
    queue("jobs")
}

/// Leases are short, so a killed worker's leases lapse and are taken
/// over within the run.
pub(crate) fn lease_duration() -> Duration {
    Duration::from_secs(2)
}

/// A fault a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Fault {
    /// SIGKILL of a worker process at a random point; it is started again.
    KillWorker,
    /// SQLite: a process killed while it holds the write lock with an
    /// uncommitted write (every receipt deleted) in the log.
    KillLockHolder,
    /// SQLite: every worker refuses writes for a while, then writes again.
    RefuseWrites,
    /// PostgreSQL: the server stopped (immediate) and started again.
    RestartServer,
    /// PostgreSQL: `pg_terminate_backend` of every worker connection.
    TerminateBackends,
    /// PostgreSQL: every connection slot of the workers' role held by
    /// someone else for a while, after their own were terminated.
    ExhaustPool,
    /// PostgreSQL: the network between workers and the server cut (every
    /// connection dropped, none accepted) for a while.
    CutNetwork,
    /// PostgreSQL: the network stalled (no byte moves) for a while.
    StallNetwork,
    /// A worker process stopped (`SIGSTOP`) until its leases have lapsed
    /// and been granted again, then continued (`SIGCONT`): its heartbeats
    /// and submissions under the old tokens must be refused.
    PauseHolder,
}

/// A run's shape.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) processes: usize,
    pub(crate) threads: usize,
    pub(crate) tasks: usize,
    /// Faults struck, in all, one after another.
    pub(crate) faults: usize,
    /// The kinds drawn from.
    pub(crate) kinds: &'static [Fault],
    /// The most a worker's clock is off the system's, either way.
    pub(crate) skew_millis: i64,
    /// Workers reach PostgreSQL through a proxy the run can cut.
    pub(crate) through_proxy: bool,
    /// The longest the run may take before it counts as stuck.
    pub(crate) deadline: Duration,
    /// How long a worker works on a lease before it submits, in ms: the
    /// least and the most.
    pub(crate) work_millis: (u64, u64),
    /// A deliberate bug the workers' stores run with (the store's
    /// `fault-injection`), for a run that must be caught.
    pub(crate) injected: Option<InjectedFault>,
}

impl Scenario {
    /// A short run: 4 workers, a few hundred tasks, a handful of faults.
    pub(crate) fn short(name: &'static str, kinds: &'static [Fault]) -> Self {
        Self {
            name,
            processes: 4,
            threads: 2,
            tasks: 300,
            faults: 4,
            kinds,
            skew_millis: 0,
            through_proxy: false,
            deadline: Duration::from_secs(600),
            work_millis: (0, 10),
            injected: None,
        }
    }

    /// The long mode: 4 workers of 3 threads, 10,000 tasks, many faults.
    pub(crate) fn long(self) -> Self {
        Self {
            processes: 4,
            threads: 3,
            tasks: 10_000,
            faults: 40,
            deadline: Duration::from_secs(3_600),
            ..self
        }
    }

    pub(crate) fn with_skew(self, millis: i64) -> Self {
        Self {
            skew_millis: millis,
            ..self
        }
    }

    /// Workers work `least..=most` ms on each lease before submitting.
    pub(crate) fn with_work(self, least: u64, most: u64) -> Self {
        Self {
            work_millis: (least, most),
            ..self
        }
    }

    /// The workers' stores run with `fault`.
    pub(crate) fn with_injected(self, fault: InjectedFault) -> Self {
        Self {
            injected: Some(fault),
            ..self
        }
    }

    pub(crate) fn through_proxy(self) -> Self {
        Self {
            through_proxy: true,
            ..self
        }
    }
}

/// The seed of a run: `TESSERA_CHAOS_SEED` when set (to rerun a failure
/// or for the long mode), else `fixed`.
pub(crate) fn seed(fixed: u64) -> u64 {
    match std::env::var("TESSERA_CHAOS_SEED") {
        Ok(text) => text.parse().expect("TESSERA_CHAOS_SEED is a number"),
        Err(_) => fixed,
    }
}

/// One fault as struck.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Struck {
    pub(crate) fault: Fault,
    /// Monotonic nanoseconds when it struck and when it was lifted.
    pub(crate) began: u64,
    pub(crate) lifted: u64,
    /// The worker process it struck, for a fault that strikes one.
    pub(crate) process: Option<u32>,
    /// What it counted: connections terminated.
    pub(crate) count: u64,
    /// Whether the history shows it landed ([`crate::landed`]).
    pub(crate) landed: bool,
    /// From its lifting to the first acknowledged submission invoked
    /// after it, in milliseconds; `None` if none followed.
    pub(crate) recovery_millis: Option<f64>,
}

/// What a run reports.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    pub(crate) scenario: String,
    pub(crate) backend: &'static str,
    pub(crate) seed: u64,
    pub(crate) processes: usize,
    pub(crate) tasks: usize,
    pub(crate) operations: usize,
    pub(crate) unknown: usize,
    pub(crate) enqueued: usize,
    pub(crate) granted: usize,
    pub(crate) submitted: usize,
    pub(crate) lost: usize,
    pub(crate) doubled: usize,
    pub(crate) anomalies: usize,
    pub(crate) faults: Vec<Struck>,
    pub(crate) worst_recovery_millis: Option<f64>,
    /// The commit the run ran on (`git rev-parse --short HEAD`, with
    /// `-dirty` for uncommitted changes), or `unknown`.
    pub(crate) commit: String,
}

/// Runs `scenario` on `db` from `seed` and checks its history: what
/// [`run`] asserts on, and a run with a deliberate bug expects to fail.
pub(crate) fn execute(db: &TestDb, scenario: &Scenario, seed: u64) -> Executed {
    eprintln!(
        "chaos {} on {}: TESSERA_CHAOS_SEED={seed}",
        scenario.name,
        db.kind().name()
    );
    let rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let setup = Fixture::with(db, |config| config.with_clock(Arc::new(SystemClock)));
    let ns = work_namespace();
    let producer = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    // Opens the namespace, so workers find it.
    let _ = setup.store.health(&producer, &ns);

    let postgres = match db.kind() {
        BackendKind::Postgres => Some(PostgresFaults::new(db, scenario.processes)),
        BackendKind::Sqlite => None,
    };
    let proxy = match (&postgres, scenario.through_proxy) {
        (Some(pg), true) => Some(TcpProxy::start(pg.server_address()).unwrap()),
        _ => None,
    };
    let locator = match &postgres {
        Some(pg) => pg.worker_locator(proxy.as_ref().map(TcpProxy::address)),
        None => db.locator(),
    };

    let mut skews = rng.fork(1);
    let mut workers: Vec<(Orders, Child)> = (0..scenario.processes)
        .map(|n| {
            let key = setup.key(&[Scope::Claim, Scope::Read], Grant::Namespace(ns.clone()));
            let skew = if scenario.skew_millis > 0 {
                let span = 2 * scenario.skew_millis as u64;
                skews.between(0, span) as i64 - scenario.skew_millis
            } else {
                0
            };
            let orders = Orders {
                backend: db.kind(),
                locator: locator.clone(),
                key: key.secret.expose().to_owned(),
                dir: dir.path().to_owned(),
                process: n as u32 + 1,
                skew_millis: skew,
                threads: scenario.threads,
                seed: rng.fork(100 + n as u64).next_u64(),
                work_millis: scenario.work_millis,
                injected: scenario.injected,
            };
            let child = worker::spawn(&orders);
            (orders, child)
        })
        .collect();

    let produced = AtomicBool::new(false);
    let mut struck = Vec::new();
    let finished = std::thread::scope(|scope| {
        scope.spawn(|| {
            // Spread over about as long as the faults take, so each strikes
            // while work remains.
            let pace = scenario.faults as u64 * 1_600_000 / scenario.tasks.max(1) as u64;
            produce(
                &setup.store,
                &producer,
                dir.path(),
                scenario.tasks,
                pace,
                rng.fork(2),
            );
            produced.store(true, Ordering::SeqCst);
        });
        let mut faults = rng.fork(3);
        let began = monotonic_nanos();
        for _ in 0..scenario.faults {
            pause(faults.between(300, 1_500));
            if produced.load(Ordering::SeqCst) && all_finished(&setup.store, &setup.admin) {
                break;
            }
            let fault = scenario.kinds[faults.between(0, scenario.kinds.len() as u64 - 1) as usize];
            let start = monotonic_nanos();
            let (process, count) = strike(
                fault,
                &mut faults,
                db,
                &mut workers,
                &mut Strike {
                    postgres: postgres.as_ref(),
                    proxy: proxy.as_ref(),
                    dir: dir.path(),
                },
            );
            struck.push(Struck {
                fault,
                began: start,
                lifted: monotonic_nanos(),
                process,
                count,
                landed: false,
                recovery_millis: None,
            });
        }
        // Every task finished, or the deadline.
        let deadline = began + scenario.deadline.as_nanos() as u64;
        loop {
            if produced.load(Ordering::SeqCst) && all_finished(&setup.store, &setup.admin) {
                break true;
            }
            if monotonic_nanos() > deadline {
                break false;
            }
            pause(250);
        }
    });
    std::fs::write(stop_file(dir.path()), b"").unwrap();
    for (_, child) in &mut workers {
        stop(child);
    }
    drop(proxy);

    let history = History::from_records(read_history(dir.path()).unwrap()).unwrap();
    let end = final_state(&setup.store, &setup.admin, &ns);
    // Two workers' clocks differ by up to twice the skew each may have.
    let options = CheckOptions {
        clock_skew: chrono::TimeDelta::milliseconds(2 * scenario.skew_millis),
    };
    let report = check_with(&history, &end, &options);
    for fault in &mut struck {
        fault.recovery_millis = recovery(&history, fault.lifted);
        fault.landed = crate::landed::landed(fault, &history);
    }
    let mut missed = crate::landed::missed(&struck, &history);
    if scenario.kinds.contains(&Fault::KillWorker) && report.unknown == 0 {
        missed.push("KillWorker: no operation left with an unknown outcome".to_owned());
    }
    let refused: usize = struck
        .iter()
        .filter(|s| s.fault == Fault::PauseHolder)
        .map(|s| crate::landed::stale_answers(history.steps(), s).0)
        .sum();
    if scenario.injected.is_none() && scenario.kinds.contains(&Fault::PauseHolder) && refused == 0 {
        missed.push("PauseHolder: no stale heartbeat or submission shown refused".to_owned());
    }
    let summary = summarize(scenario, db.kind(), seed, &report, struck);
    eprintln!(
        "chaos {} on {}: {} operations ({} unknown), {} enqueued, {} granted, {} submitted; \
         lost {}, doubled {}; recovery after each fault (ms): {:?}",
        summary.scenario,
        summary.backend,
        summary.operations,
        summary.unknown,
        summary.enqueued,
        summary.granted,
        summary.submitted,
        summary.lost,
        summary.doubled,
        summary
            .faults
            .iter()
            .map(|f| (f.fault, f.recovery_millis.map(|m| m.round())))
            .collect::<Vec<_>>()
    );
    let kept = keep_history(dir.path(), scenario, db.kind());
    Executed {
        summary,
        report,
        finished,
        tasks: end.tasks.len(),
        missed,
        kept,
    }
}

/// A run as it went, before any of its assertions.
pub(crate) struct Executed {
    pub(crate) summary: Summary,
    pub(crate) report: Report,
    /// Every task finished before the deadline.
    pub(crate) finished: bool,
    /// Tasks in the final state.
    pub(crate) tasks: usize,
    /// Each fault kind that struck and never landed, with what was wanted.
    pub(crate) missed: Vec<String>,
    /// Where the history was kept.
    pub(crate) kept: PathBuf,
}

/// Runs `scenario` on `db` from `seed`, checks its history, and fails on
/// any anomaly, on a fault that never landed, on a run that did not
/// finish, or on a task missing; only then prints and saves its summary
/// for the guarantees table.
pub(crate) fn run(db: &TestDb, scenario: &Scenario, seed: u64) -> Summary {
    let executed = execute(db, scenario, seed);
    let Executed {
        summary,
        report,
        finished,
        tasks,
        missed,
        kept,
    } = executed;
    if !report.is_valid() {
        for anomaly in report.anomalies.iter().take(30) {
            eprintln!("  {anomaly}");
        }
        panic!(
            "{} anomalies (history kept in {}); rerun with TESSERA_CHAOS_SEED={seed}",
            report.anomalies.len(),
            kept.display()
        );
    }
    assert!(
        missed.is_empty(),
        "faults that never landed, so the run proves nothing: {missed:?} \
         (history kept in {}); rerun with TESSERA_CHAOS_SEED={seed}",
        kept.display()
    );
    assert!(
        finished,
        "the run did not finish within {:?}",
        scenario.deadline
    );
    // Every task is there: enqueued with an acknowledgement, or by an
    // attempt whose answer was lost (asked again, it is `task_exists`).
    assert_eq!(tasks, scenario.tasks, "every task was enqueued");
    save(&summary);
    summary
}

/// What a fault needs to strike.
struct Strike<'a> {
    postgres: Option<&'a PostgresFaults>,
    proxy: Option<&'a TcpProxy>,
    dir: &'a Path,
}

/// Strikes `fault`; returns the worker process it struck, if one, and
/// what it counted.
fn strike(
    fault: Fault,
    rng: &mut Rng,
    db: &TestDb,
    workers: &mut [(Orders, Child)],
    at: &mut Strike<'_>,
) -> (Option<u32>, u64) {
    let hold = rng.between(200, 1_500);
    match fault {
        Fault::KillWorker => {
            let n = rng.between(0, workers.len() as u64 - 1) as usize;
            let (orders, child) = &mut workers[n];
            // Every other kill waits for an operation under way, so some
            // outcome is left unknown; the others strike where they fall,
            // most often while a lease is held.
            if rng.percent(50) {
                wait_for_operation_under_way(at.dir, orders.process);
            }
            child.kill().unwrap();
            child.wait().unwrap();
            orders.seed = rng.next_u64();
            *child = worker::spawn(orders);
            return (Some(orders.process), 0);
        }
        Fault::PauseHolder => {
            let first = rng.between(0, workers.len() as u64 - 1) as usize;
            let n = wait_for_a_holder(at.dir, workers, first);
            let (orders, child) = &workers[n];
            signal(child, "STOP");
            // Its leases lapse, and the others take one over.
            pause(lease_duration().as_millis() as u64);
            wait_for_a_regrant(at.dir, orders.process);
            signal(child, "CONT");
            return (Some(orders.process), 0);
        }
        Fault::KillLockHolder => kill_lock_holder(db.sqlite_path().unwrap(), hold),
        Fault::RefuseWrites => {
            std::fs::write(refuse_file(at.dir), b"").unwrap();
            pause(hold.max(500));
            std::fs::remove_file(refuse_file(at.dir)).unwrap();
        }
        Fault::RestartServer => at.postgres.unwrap().restart_server(hold),
        Fault::TerminateBackends => return (None, at.postgres.unwrap().terminate_backends()),
        Fault::ExhaustPool => at.postgres.unwrap().exhaust_pool(hold),
        Fault::CutNetwork | Fault::StallNetwork => {
            let proxy = at.proxy.expect("a network fault needs the proxy");
            let link = if fault == Fault::CutNetwork {
                Link::Cut
            } else {
                Link::Stalled
            };
            proxy.set(link);
            pause(hold);
            proxy.set(Link::Open);
        }
    }
    (None, 0)
}

/// Sends `SIGSTOP` or `SIGCONT` (`signal`) to `child`.
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal}");
}

/// The worker, from `first` on, whose last record is a granted claim (it
/// is working on that lease), waited for up to a second; `first` if none.
fn wait_for_a_holder(dir: &Path, workers: &[(Orders, Child)], first: usize) -> usize {
    for _ in 0..1_000 {
        for k in 0..workers.len() {
            let n = (first + k) % workers.len();
            let path = Recorder::path(dir, workers[n].0.process);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text
                .lines()
                .last()
                .is_some_and(|line| line.contains("\"result\":\"granted\""))
            {
                return n;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    first
}

/// Waits, up to 30 s, until a lease `process` holds (granted to it, not
/// ended by it) has been granted to another process under a newer token.
fn wait_for_a_regrant(dir: &Path, process: u32) {
    for _ in 0..600 {
        pause(50);
        // A line being written is read as a bad one: read again.
        let Ok(records) = read_history(dir) else {
            continue;
        };
        let Ok(history) = History::from_records(records) else {
            continue;
        };
        let steps = history.steps();
        let held = steps
            .iter()
            .filter(|step| step.id.process == process)
            .filter_map(|step| match step.completion.outcome() {
                Some(Outcome::Granted { task, token, .. }) => Some((task, *token)),
                _ => None,
            })
            .filter(|(task, token)| {
                !steps.iter().any(|step| {
                    step.id.process == process
                        && matches!(step.completion, Completion::Ok { .. })
                        && matches!(
                            &step.operation,
                            Operation::Submit { task: t, token: k, .. }
                            | Operation::Fail { task: t, token: k, .. }
                            if t == *task && k == token
                        )
                })
            });
        let mut regranted = held.filter(|(task, token)| {
            steps.iter().any(|step| {
                step.id.process != process
                    && matches!(
                        step.completion.outcome(),
                        Some(Outcome::Granted { task: t, token: k, .. }) if t == *task && k > token
                    )
            })
        });
        if regranted.next().is_some() {
            return;
        }
    }
}

/// Waits, up to a second, until the last line of `process`'s history is
/// an invocation: an operation under way.
fn wait_for_operation_under_way(dir: &Path, process: u32) {
    let path = Recorder::path(dir, process);
    for _ in 0..1_000 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text
            .lines()
            .last()
            .is_some_and(|line| line.contains("\"phase\":\"invoke\""))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Starts a process that takes SQLite's write lock, writes without
/// committing (deleting every receipt), says so, and waits; kills it
/// `hold` ms later.
fn kill_lock_holder(path: &Path, hold: u64) {
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lock_holder_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LOCK_HOLDER_DB, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let locked = lines.any(|line| line.is_ok_and(|l| l.contains(LOCKED)));
    assert!(locked, "the lock holder took the write lock");
    pause(hold);
    holder.kill().unwrap();
    holder.wait().unwrap();
}

const LOCK_HOLDER_DB: &str = "TESSERA_CHAOS_LOCK_DB";
const LOCKED: &str = "@chaos locked";

/// The body of the `lock_holder_entry` test: nothing unless run by
/// [`kill_lock_holder`].
pub(crate) fn lock_holder_main() {
    let Ok(path) = std::env::var(LOCK_HOLDER_DB) else {
        return;
    };
    let connection = rusqlite::Connection::open(path).unwrap();
    connection.busy_timeout(Duration::from_secs(60)).unwrap();
    connection
        .execute_batch("BEGIN IMMEDIATE; DELETE FROM receipts;")
        .unwrap();
    println!("{LOCKED}");
    loop {
        pause(1_000);
    }
}

/// Asks a worker to stop (the stop file exists) and kills it if it has
/// not within a while.
fn stop(child: &mut Child) {
    for _ in 0..200 {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        pause(100);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The id of the run's task `n`.
fn task_id(n: usize) -> TaskId {
    TaskId::parse(&format!("c-{n:06}")).unwrap()
}

/// Enqueues `tasks` tasks one by one, asking again while an answer is
/// unknown, and cancels about one in a hundred of those enqueued so far.
fn produce(
    store: &Store,
    caller: &Caller,
    dir: &Path,
    tasks: usize,
    pace_micros: u64,
    mut rng: Rng,
) {
    let recorder = Recorder::open(dir, 0).unwrap();
    let (ns, q) = (work_namespace(), work_queue());
    let record = |operation: Operation, run: &dyn Fn() -> Result<Outcome, Error>| {
        let id = recorder.invoke(SystemClock.now_utc(), operation).unwrap();
        let completion = match run() {
            Ok(outcome) => Completion::Ok { outcome },
            Err(error) => completion_of(&error),
        };
        recorder
            .complete(id, SystemClock.now_utc(), completion.clone())
            .unwrap();
        completion
    };
    for n in 0..tasks {
        let id = task_id(n);
        let options = EnqueueOptions::default()
            .with_task_id(id.clone())
            .with_max_tries(50)
            .with_lapse_backoff(Duration::ZERO);
        let brief = Brief::Bytes(format!("job {n}").into_bytes());
        loop {
            let completion = record(Operation::enqueue(id.as_str()), &|| {
                store
                    .enqueue(caller, &ns, &q, &brief, &options)
                    .map(|_| Outcome::Enqueued)
            });
            match completion {
                Completion::Ok { .. } => break,
                // Asked again: `task_exists` if the first one landed.
                Completion::Unknown { .. } => pause(50),
                Completion::Fail { error } if error == "task_exists" => break,
                Completion::Fail { .. } => pause(50),
            }
        }
        std::thread::sleep(Duration::from_micros(rng.between(0, 2 * pace_micros)));
        if n > 0 && rng.percent(1) {
            let victim = task_id(rng.between(0, n as u64) as usize);
            let task = TaskRef::new(ns.clone(), victim.clone(), BriefVersion::FIRST);
            record(
                Operation::Cancel {
                    task: victim.as_str().to_owned(),
                },
                &|| store.cancel_task(caller, &task).map(|_| Outcome::Cancelled),
            );
        }
    }
}

/// Whether no attempt is ready, leased, backing off or scheduled.
fn all_finished(store: &Store, admin: &Caller) -> bool {
    let ns = work_namespace();
    [
        StateName::Ready,
        StateName::Leased,
        StateName::Backoff,
        StateName::Scheduled,
    ]
    .into_iter()
    .all(|state| {
        let query = TaskQuery {
            limit: 1,
            order: ListOrder::Oldest,
            ..TaskQuery::new(state)
        };
        store
            .list_tasks(admin, &ns, &query)
            .is_ok_and(|page| page.tasks.is_empty())
    })
}

/// Reads `f` until it answers: the run's own store may meet the tail of
/// a fault.
fn retried<T>(mut f: impl FnMut() -> Result<T, Error>) -> T {
    let mut last = None;
    for _ in 0..100 {
        match f() {
            Ok(value) => return value,
            Err(error) => last = Some(error),
        }
        pause(100);
    }
    panic!("the store did not answer: {last:?}");
}

/// Every task of the namespace as the store holds it, with every
/// receipt's payload digest read back from the stored payload.
fn final_state(store: &Store, admin: &Caller, ns: &Namespace) -> FinalState {
    let mut ids = Vec::new();
    for state in StateName::ALL {
        let mut query = TaskQuery {
            limit: 1_000,
            order: ListOrder::Oldest,
            ..TaskQuery::new(state)
        };
        loop {
            let page = retried(|| store.list_tasks(admin, ns, &query));
            ids.extend(page.tasks.iter().map(|listing| listing.task.clone()));
            match page.next {
                Some(next) => query.after = Some(next),
                None => break,
            }
        }
    }
    ids.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    ids.dedup();
    let mut end = FinalState::default();
    for task in ids {
        let view = retried(|| store.read_task(admin, &task));
        let stored = retried(|| store.alternatives(admin, &task));
        let attempts = view
            .record
            .attempts
            .iter()
            .map(|attempt| FinalAttempt {
                number: u32::from(attempt.number.as_u16()),
                state: state_of(&attempt.state),
                receipts: stored
                    .iter()
                    .filter(|s| s.receipt.attempt == attempt.number)
                    .map(|s| {
                        let mut receipt = receipt_of(&s.receipt);
                        if let Some(bytes) = &s.output {
                            receipt.digest =
                                Output::bytes(bytes.clone()).payload_digest().to_string();
                        }
                        receipt
                    })
                    .collect(),
            })
            .collect();
        end.tasks.insert(
            task.id.as_str().to_owned(),
            FinalTask {
                last_token: view.record.last_token.map(|t| t.as_i64()),
                attempts,
            },
        );
    }
    end
}

fn state_of(state: &TaskState) -> AttemptState {
    match state {
        TaskState::Ready => AttemptState::Ready,
        TaskState::Leased => AttemptState::Leased,
        TaskState::Done => AttemptState::Done,
        TaskState::Failed => AttemptState::Failed,
        TaskState::Discarded { .. } => AttemptState::Discarded,
        TaskState::Cancelled => AttemptState::Cancelled,
        _ => AttemptState::Waiting,
    }
}

/// From `lifted` to the first acknowledged submission invoked after it.
fn recovery(history: &History, lifted: u64) -> Option<f64> {
    history
        .steps()
        .iter()
        .filter(|step| step.invoked >= lifted)
        .filter(|step| matches!(step.completion.outcome(), Some(Outcome::Accepted { .. })))
        .filter_map(|step| step.completed)
        .min()
        .map(|done| (done - lifted) as f64 / 1e6)
}

fn summarize(
    scenario: &Scenario,
    backend: BackendKind,
    seed: u64,
    report: &Report,
    faults: Vec<Struck>,
) -> Summary {
    let worst = faults
        .iter()
        .filter_map(|f| f.recovery_millis)
        .fold(None, |worst: Option<f64>, m| {
            Some(worst.map_or(m, |w| w.max(m)))
        });
    Summary {
        scenario: scenario.name.to_owned(),
        backend: backend.name(),
        seed,
        processes: scenario.processes,
        tasks: scenario.tasks,
        operations: report.operations,
        unknown: report.unknown,
        enqueued: report.enqueued,
        granted: report.granted,
        submitted: report.submitted,
        lost: report.lost(),
        doubled: report.doubled(),
        anomalies: report.anomalies.len(),
        faults,
        worst_recovery_millis: worst,
        commit: commit(),
    }
}

/// The commit the workspace is at, `-dirty` if it has uncommitted
/// changes; `unknown` without git.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{head}-dirty"),
            _ => head,
        },
        None => "unknown".to_owned(),
    }
}

/// Where summaries and failing histories are kept.
fn results_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn save(summary: &Summary) {
    let path = results_dir().join(format!(
        "{}-{}-{}.json",
        summary.scenario, summary.backend, summary.tasks
    ));
    std::fs::write(path, serde_json::to_vec_pretty(summary).unwrap()).unwrap();
}

/// Copies the run's history files where they outlive it (the last run of
/// each scenario and backend), to be read again after a failure.
fn keep_history(dir: &Path, scenario: &Scenario, backend: BackendKind) -> PathBuf {
    let kept = results_dir().join(format!("{}-{}-history", scenario.name, backend.name()));
    let _ = std::fs::remove_dir_all(&kept);
    std::fs::create_dir_all(&kept).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let _ = std::fs::copy(entry.path(), kept.join(entry.file_name()));
    }
    kept
}

/// The markdown table of every saved summary, sorted by scenario,
/// backend and size.
pub(crate) fn table() -> String {
    let mut summaries: Vec<serde_json::Value> = std::fs::read_dir(results_dir())
        .unwrap()
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
        .map(|entry| serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap())
        .collect();
    let key = |s: &serde_json::Value| {
        (
            s["scenario"].as_str().unwrap_or("").to_owned(),
            s["backend"].as_str().unwrap_or("").to_owned(),
            s["tasks"].as_u64().unwrap_or(0),
        )
    };
    summaries.sort_by_key(key);
    let mut out = String::from(
        "| scenario | backend | processes | tasks | faults (landed) | operations (unknown) | anomalies | lost | doubled | recovery after a fault, median / worst (ms) | seed | commit |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for s in &summaries {
        let mut recoveries: Vec<f64> = s["faults"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["recovery_millis"].as_f64())
            .collect();
        recoveries.sort_by(f64::total_cmp);
        let recovery = match recoveries.as_slice() {
            [] => "—".to_owned(),
            all => format!("{:.0} / {:.0}", all[all.len() / 2], all[all.len() - 1]),
        };
        let faults = s["faults"].as_array().map_or(&[][..], Vec::as_slice);
        let landed = faults.iter().filter(|f| f["landed"] == true).count();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} ({}) | {} ({}) | {} | {} | {} | {} | {} | {} |\n",
            s["scenario"].as_str().unwrap_or(""),
            s["backend"].as_str().unwrap_or(""),
            s["processes"],
            s["tasks"],
            faults.len(),
            landed,
            s["operations"],
            s["unknown"],
            s["anomalies"],
            s["lost"],
            s["doubled"],
            recovery,
            s["seed"],
            s["commit"].as_str().unwrap_or("unknown"),
        ));
    }
    out
}
