//! One chaos run: a producer in this process enqueues (and now and then
//! cancels) tasks, worker processes claim and finish them, every store
//! purges finished tasks a second or so after they end, faults drawn from
//! the seed strike meanwhile, and at the end the merged history and the
//! store's final state go to the checker.

use std::io::{BufRead, BufReader};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use tessera_chaos::{Link, Recorder, Rng, TcpProxy, monotonic_nanos, pause, read_history};
use tessera_check::{
    AnomalyKind, CheckOptions, Completion, FinalState, History, Operation, Outcome, Report,
    check_with,
};
use tessera_store::faults::InjectedFault;
use tessera_store::lease::CronSchedule;
use tessera_store::lease::StateName;
use tessera_store::{
    Brief, BriefVersion, BulkFilter, Caller, Clock as _, ConcurrencyLimit, EnqueueOptions, Error,
    Grant, ListOrder, Namespace, PartitionKey, QueueName, Retention, ScheduleName, ScheduleSpec,
    Scope, Store, SystemClock, TaskId, TaskQuery, TaskRef, TaskSpec, UniqueKey, Uniqueness,
};

use crate::harness::{BackendKind, Fixture, TestDb, namespace, queue};
use crate::postgres_faults::PostgresFaults;
use crate::worker::{self, Orders, completion_of, refuse_file, stop_file};

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

/// How long the runs keep finished tasks: done ones a second, discarded,
/// failed and cancelled ones three, so purges race with claims, submits,
/// replays, cancels and faults (a paused holder's lease lapses in 2 s,
/// and its task may be done and purged before it wakes).
pub(crate) fn short_retention() -> Retention {
    Retention {
        done: Some(Duration::from_secs(1)),
        discarded: Some(Duration::from_secs(3)),
        cancelled: Some(Duration::from_secs(3)),
    }
}

/// How often each store of a run purges (a retention run at most this
/// often, after a write).
pub(crate) fn retention_interval() -> Duration {
    Duration::from_secs(1)
}

/// Tries each task gets: more than a run ever spends, so nothing is
/// discarded.
const MAX_TRIES: u32 = 50;

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
    /// How long every store of the run keeps finished tasks.
    pub(crate) retention: Retention,
    /// Whether the run fails when no task was purged: retention that
    /// never purged proves nothing.
    pub(crate) purges_must_land: bool,
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
            retention: short_retention(),
            purges_must_land: true,
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

    /// Every store keeps finished tasks as `retention` says, and the run
    /// does not ask that any was purged.
    pub(crate) fn with_retention(self, retention: Retention) -> Self {
        Self {
            retention,
            purges_must_land: false,
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
    /// Tasks the store purged during the run, as its audit counts them.
    pub(crate) purged: u64,
    /// Tasks missing at the end that the checker excused as purged.
    pub(crate) purged_missing: usize,
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
    let setup = Fixture::with(db, |config| {
        config
            .with_clock(Arc::new(SystemClock))
            .with_retention(scenario.retention)
            .with_retention_interval(retention_interval())
    });
    let ns = work_namespace();
    let producer = setup.login(&setup.key(Scope::ALL, Grant::Namespace(ns.clone())));
    // Opens the namespace, so workers find it.
    let _ = setup.store.health(&producer, &ns);
    let producing = Producer {
        store: &setup.store,
        caller: &producer,
        recorder: Recorder::open(dir.path(), 0).unwrap(),
    };
    let put_at = SystemClock.now_utc();
    producing.set_up();

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
                retention: scenario.retention,
            };
            let child = worker::spawn(&orders);
            (orders, child)
        })
        .collect();

    let produced = AtomicBool::new(false);
    let created = AtomicUsize::new(0);
    let mut struck = Vec::new();
    let finished = std::thread::scope(|scope| {
        scope.spawn(|| {
            // Spread over about as long as the faults take, so each strikes
            // while work remains.
            let pace = scenario.faults as u64 * 1_600_000 / scenario.tasks.max(1) as u64;
            let made = produce(&producing, scenario.tasks, pace, rng.fork(2));
            created.store(made, Ordering::SeqCst);
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
            let mut start = monotonic_nanos();
            let (process, count, aimed) = strike(
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
            // An aimed fault struck once it found its mark.
            start = aimed.unwrap_or(start);
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
    let mut end = crate::raw::final_state(db, ns.as_str(), &scenario.retention);
    // Two workers' clocks differ by up to twice the skew each may have.
    let options = CheckOptions {
        clock_skew: TimeDelta::milliseconds(2 * scenario.skew_millis),
    };
    end.schedules.entry(SCHEDULE.to_owned()).or_default().due =
        due_run_ats(&history, put_at, options.clock_skew);
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
    if graphs_ran(&history) == 0 {
        missed.push("Graphs: no task enqueued after parents was granted".to_owned());
    }
    let purged = end.retention.as_ref().map_or(0, |r| r.purged_total());
    if scenario.purges_must_land && purged == 0 {
        missed.push("Retention: no task purged while the run went on".to_owned());
    }
    let toothless = purge_teeth(&history, &end, &options, &report, put_at);
    let summary = summarize(scenario, db.kind(), seed, &report, purged, struck);
    eprintln!(
        "chaos {} on {}: {} operations ({} unknown), {} enqueued, {} granted, {} submitted; \
         lost {}, doubled {}; purged {} ({} missing at the end, each excused); \
         recovery after each fault (ms): {:?}",
        summary.scenario,
        summary.backend,
        summary.operations,
        summary.unknown,
        summary.enqueued,
        summary.granted,
        summary.submitted,
        summary.lost,
        summary.doubled,
        summary.purged,
        summary.purged_missing,
        summary
            .faults
            .iter()
            .map(|f| (f.fault, f.recovery_millis.map(|m| m.round())))
            .collect::<Vec<_>>()
    );
    let kept = keep_history(dir.path(), scenario, db.kind());
    // The run's own tasks, not the schedule's.
    let own = |id: &&String| id.starts_with("c-");
    let tasks = end.tasks.keys().filter(own).count();
    let purged_tasks = report.purged.iter().filter(own).count();
    Executed {
        summary,
        report,
        finished,
        tasks,
        purged_tasks,
        created: created.load(Ordering::SeqCst),
        missed,
        toothless,
        kept,
    }
}

/// How many grants of tasks enqueued after parents the history
/// acknowledged: the graphs the producer made, run.
fn graphs_ran(history: &History) -> usize {
    let children: std::collections::BTreeSet<&str> = history
        .steps()
        .iter()
        .filter_map(|step| match (&step.operation, step.completion.outcome()) {
            (Operation::Enqueue { task, after, .. }, Some(Outcome::Enqueued))
                if !after.is_empty() =>
            {
                Some(task.as_str())
            }
            _ => None,
        })
        .collect();
    history
        .steps()
        .iter()
        .filter(|step| {
            matches!(step.completion.outcome(),
                Some(Outcome::Granted { task, .. }) if children.contains(task.as_str()))
        })
        .count()
}

/// What shows that the run's excuses of purged tasks rest on their
/// evidence: the same end read with retention off, with an audit that
/// counts no purge, or as if read before the run began (before any keep
/// time could pass) must each have the checker report those tasks
/// lost. Returns each way it did not.
fn purge_teeth(
    history: &History,
    end: &FinalState,
    options: &CheckOptions,
    report: &Report,
    put_at: DateTime<Utc>,
) -> Vec<String> {
    if report.purged.is_empty() {
        return Vec::new();
    }
    let lost = |end: &FinalState| {
        let found = check_with(history, end, options);
        let named = |task: &String| {
            found
                .anomalies
                .iter()
                .any(|a| a.kind == AnomalyKind::LostEnqueue && a.task == *task)
        };
        report.purged.iter().filter(|task| !named(task)).count()
    };
    let mut toothless = Vec::new();
    let mut off = end.clone();
    off.retention = None;
    let left = lost(&off);
    if left > 0 {
        toothless.push(format!(
            "with retention off, {left} purged tasks were not lost"
        ));
    }
    let mut early = end.clone();
    if let Some(retention) = &mut early.retention {
        retention.read_at = put_at - TimeDelta::minutes(1);
    }
    let left = lost(&early);
    if left > 0 {
        toothless.push(format!(
            "read before the run began, {left} purged tasks were not lost"
        ));
    }
    let mut uncounted = end.clone();
    if let Some(retention) = &mut uncounted.retention {
        retention.purged.clear();
    }
    let found = check_with(history, &uncounted, options);
    if !found.anomalies.iter().any(|a| {
        a.kind == AnomalyKind::LostEnqueue && (a.task == "*" || a.task.starts_with("queue "))
    }) {
        toothless.push("with no purge audited, no task was lost".to_owned());
    }
    toothless
}

/// A run as it went, before any of its assertions.
pub(crate) struct Executed {
    pub(crate) summary: Summary,
    pub(crate) report: Report,
    /// Every task finished before the deadline.
    pub(crate) finished: bool,
    /// The producer's tasks in the final state.
    pub(crate) tasks: usize,
    /// The producer's tasks missing at the end, excused as purged.
    pub(crate) purged_tasks: usize,
    /// The producer's tasks it was told it created (the others were
    /// duplicates of a unique key's holder).
    pub(crate) created: usize,
    /// Each fault kind that struck and never landed, with what was wanted
    /// (and retention, when it never purged).
    pub(crate) missed: Vec<String>,
    /// Each way the excuses of purged tasks did not rest on their
    /// evidence ([`purge_teeth`]).
    pub(crate) toothless: Vec<String>,
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
        purged_tasks,
        created,
        missed,
        toothless,
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
        toothless.is_empty(),
        "the checker excused purged tasks without their evidence: {toothless:?} \
         (history kept in {}); rerun with TESSERA_CHAOS_SEED={seed}",
        kept.display()
    );
    assert!(
        finished,
        "the run did not finish within {:?}",
        scenario.deadline
    );
    // Every task is there, or was purged once finished: enqueued with an
    // acknowledgement, or by an attempt whose answer was lost (asked
    // again, it is `task_exists`, or a duplicate of itself); those
    // answered duplicates of another were never made.
    assert_eq!(
        tasks + purged_tasks,
        created,
        "every task created is there or purged ({tasks} there, {purged_tasks} purged)"
    );
    assert!(
        created > scenario.tasks / 2,
        "{created} of {} tasks created",
        scenario.tasks
    );
    save(&summary);
    summary
}

/// What a fault needs to strike.
struct Strike<'a> {
    postgres: Option<&'a PostgresFaults>,
    proxy: Option<&'a TcpProxy>,
    dir: &'a Path,
}

/// Strikes `fault`; returns the worker process it struck, if one, what
/// it counted, and when it struck, for a fault that waits for its mark.
fn strike(
    fault: Fault,
    rng: &mut Rng,
    db: &TestDb,
    workers: &mut [(Orders, Child)],
    at: &mut Strike<'_>,
) -> (Option<u32>, u64, Option<u64>) {
    let hold = rng.between(200, 1_500);
    match fault {
        Fault::KillWorker => {
            // Aimed at a worker in the middle of a submission or heartbeat:
            // it holds that lease, and the call's outcome is left unknown.
            // Failing that, at one working on a lease it was granted. A
            // call can end between the aim and the kill; then the kill is
            // made again (up to five times) until one leaves an operation
            // whose outcome is unknown.
            let mut struck = (0, 0);
            for _ in 0..5 {
                let first = rng.between(0, workers.len() as u64 - 1) as usize;
                let n = wait_for(at.dir, workers, first, |line| {
                    line.contains("\"phase\":\"invoke\"")
                        && (line.contains("\"op\":\"submit\"")
                            || line.contains("\"op\":\"heartbeat\""))
                })
                .or_else(|| {
                    wait_for(at.dir, workers, first, |line| {
                        line.contains("\"result\":\"granted\"")
                    })
                })
                .unwrap_or(first);
                let (orders, child) = &mut workers[n];
                let struck_at = monotonic_nanos();
                child.kill().unwrap();
                child.wait().unwrap();
                let left = std::fs::read_to_string(Recorder::path(at.dir, orders.process))
                    .unwrap_or_default();
                let unknown = left
                    .lines()
                    .last()
                    .is_some_and(|line| line.contains("\"phase\":\"invoke\""));
                orders.seed = rng.next_u64();
                *child = worker::spawn(orders);
                struck = (orders.process, struck_at);
                if unknown {
                    break;
                }
            }
            return (Some(struck.0), 0, Some(struck.1));
        }
        Fault::PauseHolder => {
            // Aimed at a worker that was just granted a lease.
            let first = rng.between(0, workers.len() as u64 - 1) as usize;
            let n = wait_for(at.dir, workers, first, |line| {
                line.contains("\"result\":\"granted\"")
            })
            .unwrap_or(first);
            let (orders, child) = &workers[n];
            let struck_at = monotonic_nanos();
            signal(child, "STOP");
            // Its leases lapse, and the others take one over.
            pause(lease_duration().as_millis() as u64);
            wait_for_a_regrant(at.dir, orders.process);
            signal(child, "CONT");
            return (Some(orders.process), 0, Some(struck_at));
        }
        Fault::KillLockHolder => kill_lock_holder(db.sqlite_path().unwrap(), hold),
        Fault::RefuseWrites => {
            std::fs::write(refuse_file(at.dir), b"").unwrap();
            pause(hold.max(500));
            std::fs::remove_file(refuse_file(at.dir)).unwrap();
        }
        Fault::RestartServer => {
            // Aimed at an operation under way.
            let aimed = under_way_now(at.dir, workers, rng);
            at.postgres.unwrap().restart_server(hold);
            return (None, 0, aimed);
        }
        Fault::TerminateBackends => {
            return (None, at.postgres.unwrap().terminate_backends(), None);
        }
        Fault::ExhaustPool => at.postgres.unwrap().exhaust_pool(hold),
        Fault::CutNetwork | Fault::StallNetwork => {
            let proxy = at.proxy.expect("a network fault needs the proxy");
            let link = if fault == Fault::CutNetwork {
                Link::Cut
            } else {
                Link::Stalled
            };
            // A cut is aimed at an operation under way.
            let aimed = (fault == Fault::CutNetwork)
                .then(|| under_way_now(at.dir, workers, rng))
                .flatten();
            proxy.set(link);
            pause(hold);
            proxy.set(Link::Open);
            return (None, 0, aimed);
        }
    }
    (None, 0, None)
}

/// Waits, up to a second, until some worker has an operation under way
/// (its history's last line is an invocation); the moment it saw one.
fn under_way_now(dir: &Path, workers: &[(Orders, Child)], rng: &mut Rng) -> Option<u64> {
    let first = rng.between(0, workers.len() as u64 - 1) as usize;
    wait_for(dir, workers, first, |line| {
        line.contains("\"phase\":\"invoke\"")
    })
    .map(|_| monotonic_nanos())
}

/// Sends `SIGSTOP` or `SIGCONT` (`signal`) to `child`.
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal}");
}

/// The worker, from `first` on, whose history's last line matches
/// `wanted`, waited for up to a second.
fn wait_for(
    dir: &Path,
    workers: &[(Orders, Child)],
    first: usize,
    wanted: impl Fn(&str) -> bool,
) -> Option<usize> {
    for _ in 0..1_000 {
        for k in 0..workers.len() {
            let n = (first + k) % workers.len();
            let path = Recorder::path(dir, workers[n].0.process);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().last().is_some_and(&wanted) {
                return Some(n);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Waits, up to 30 s, until a lease `process` holds (granted to it, not
/// ended by it) has been granted to another process under a newer token;
/// at once when it holds none (it ended every lease before it stopped).
/// Each look reads every history, which grows while the others poll, so
/// the wait is bounded by time, not by looks.
fn wait_for_a_regrant(dir: &Path, process: u32) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < until {
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
        let held: Vec<(&String, i64)> = held.collect();
        if held.is_empty() {
            return;
        }
        let mut regranted = held.into_iter().filter(|(task, token)| {
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
        .execute_batch("BEGIN IMMEDIATE; UPDATE attempts SET idempotency_key = NULL;")
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

/// The run's queue with concurrency limits: its tasks are partitioned.
pub(crate) fn limited_queue() -> QueueName {
    queue("limited")
}

/// At most this many of the limited queue's attempts leased at once, and
/// this many of one partition.
const QUEUE_LIMIT: u32 = 3;
const PARTITION_LIMIT: u32 = 1;

/// The schedule every worker process's scheduler fires: every two
/// seconds, into the run's queue.
const SCHEDULE: &str = "tick";
const SCHEDULE_CRON: &str = "*/2 * * * * *";

/// Where task `n` goes, and what it carries: one in three goes to the
/// limited queue in one of four partitions; one in six of the rest holds
/// one of five unique keys.
fn placement(n: usize) -> (QueueName, Option<PartitionKey>, Option<UniqueKey>) {
    match n % 6 {
        1 | 4 => (
            limited_queue(),
            Some(PartitionKey::parse(&format!("p{}", n % 4)).unwrap()),
            None,
        ),
        2 => (
            work_queue(),
            None,
            Some(UniqueKey::parse(&format!("u{}", n % 5)).unwrap()),
        ),
        _ => (work_queue(), None, None),
    }
}

/// The tasks task `n` runs after: a small graph every six tasks, the
/// fifth after the third and the first (tasks of the run's queue with no
/// unique key, so each is created, and either may be cancelled, which
/// cancels its child).
fn parents(n: usize) -> Vec<usize> {
    if n % 6 == 5 && n >= 6 {
        vec![n - 2, n - 5]
    } else {
        Vec::new()
    }
}

/// Whether task `n` may be cancelled on its own: one of the run's queue
/// with no unique key, so a cancel never meets a bulk retry.
fn cancellable(n: usize) -> bool {
    matches!(n % 6, 0 | 3 | 5)
}

/// The producer's store calls, each recorded: the run's own process.
struct Producer<'a> {
    store: &'a Store,
    caller: &'a Caller,
    recorder: Recorder,
}

impl Producer<'_> {
    /// Records `operation`, runs it, and records how it ended.
    fn record(
        &self,
        operation: Operation,
        run: impl FnOnce() -> Result<Outcome, Error>,
    ) -> Completion {
        let id = self
            .recorder
            .invoke(SystemClock.now_utc(), operation)
            .unwrap();
        let completion = match run() {
            Ok(outcome) => Completion::Ok { outcome },
            Err(error) => completion_of(&error),
        };
        self.recorder
            .complete(id, SystemClock.now_utc(), completion.clone())
            .unwrap();
        completion
    }

    /// Limits the limited queue, and puts the schedule.
    fn set_up(&self) {
        let ns = work_namespace();
        let limit = ConcurrencyLimit {
            queue: NonZeroU32::new(QUEUE_LIMIT),
            per_partition: NonZeroU32::new(PARTITION_LIMIT),
        };
        let completion = self.record(
            Operation::SetLimits {
                queue: limited_queue().to_string(),
                queue_limit: Some(QUEUE_LIMIT),
                partition_limit: Some(PARTITION_LIMIT),
            },
            || {
                self.store
                    .set_queue_limits(self.caller, &ns, &limited_queue(), limit)
                    .map(|_| Outcome::Applied)
            },
        );
        assert!(
            matches!(completion, Completion::Ok { .. }),
            "{completion:?}"
        );
        let spec = ScheduleSpec::new(work_queue(), SCHEDULE_CRON, "UTC", Brief::Bytes(vec![]))
            .with_spec(TaskSpec {
                max_tries: MAX_TRIES,
                lapse_backoff: Duration::ZERO,
                ..TaskSpec::default()
            });
        self.store
            .put_schedule(
                self.caller,
                &ns,
                &ScheduleName::parse(SCHEDULE).unwrap(),
                &spec,
            )
            .unwrap();
    }

    /// Enqueues task `n` where [`placement`] puts it, asking again while
    /// the answer is unknown; whether it was created (a duplicate of a
    /// unique key's holder is not).
    fn enqueue(&self, n: usize) -> bool {
        let id = task_id(n);
        let (queue, partition, unique) = placement(n);
        let ns = work_namespace();
        // A parent done and purged already (retention keeps done tasks a
        // second) is a 400: the task is then enqueued without parents.
        let mut after: Vec<TaskId> = parents(n).into_iter().map(task_id).collect();
        let brief = Brief::Bytes(format!("job {n}").into_bytes());
        loop {
            let mut options =
                EnqueueOptions::default()
                    .with_task_id(id.clone())
                    .with_max_tries(MAX_TRIES)
                    .with_lapse_backoff(Duration::ZERO)
                    .after(after.iter().map(|parent| {
                        TaskRef::new(ns.clone(), parent.clone(), BriefVersion::FIRST)
                    }));
            if let Some(partition) = &partition {
                options = options.with_partition_key(partition.clone());
            }
            if let Some(unique) = &unique {
                options = options.with_unique(Uniqueness::new(unique.clone()));
            }
            let created = std::cell::Cell::new(true);
            let completion = self.record(
                Operation::Enqueue {
                    task: id.as_str().to_owned(),
                    queue: Some(queue.to_string()),
                    partition: partition.as_ref().map(ToString::to_string),
                    unique_key: unique.as_ref().map(ToString::to_string),
                    deadline: None,
                    alternatives: Some(1),
                    max_tries: Some(MAX_TRIES),
                    after: after.iter().map(ToString::to_string).collect(),
                    any_outcome: false,
                },
                || {
                    let enqueued =
                        self.store
                            .enqueue_one(self.caller, &ns, &queue, &brief, &options)?;
                    created.set(enqueued.created);
                    Ok(if enqueued.created {
                        Outcome::Enqueued
                    } else {
                        Outcome::Duplicate {
                            of: enqueued.task.id.to_string(),
                        }
                    })
                },
            );
            match completion {
                // A duplicate of itself: the first ask, whose answer was
                // lost, created it.
                Completion::Ok {
                    outcome: Outcome::Duplicate { of },
                } => return of == id.as_str(),
                Completion::Ok { .. } => return created.get(),
                // Asked again: `task_exists` if the first one landed.
                Completion::Unknown { .. } => pause(50),
                Completion::Fail { error } if error == "task_exists" => return true,
                Completion::Fail { error } if error == "invalid_input" && !after.is_empty() => {
                    after.clear();
                }
                Completion::Fail { .. } => pause(50),
            }
        }
    }

    /// A queue's or the schedule's pause or resume, or a bulk action on
    /// the limited queue, as `step` asks.
    fn act(&self, step: Act) {
        let ns = work_namespace();
        let limited = limited_queue();
        let schedule = ScheduleName::parse(SCHEDULE).unwrap();
        let bulk = |state: StateName| {
            BulkFilter::default()
                .with_queue(limited.clone())
                .with_state(state)
        };
        match step {
            Act::PauseQueue => self.record(
                Operation::PauseQueue {
                    queue: limited.to_string(),
                },
                || {
                    self.store
                        .pause_queue(self.caller, &ns, &limited)
                        .map(|_| Outcome::Applied)
                },
            ),
            Act::ResumeQueue => self.record(
                Operation::ResumeQueue {
                    queue: limited.to_string(),
                },
                || {
                    self.store
                        .resume_queue(self.caller, &ns, &limited)
                        .map(|_| Outcome::Applied)
                },
            ),
            Act::PauseSchedule => self.record(
                Operation::PauseSchedule {
                    schedule: SCHEDULE.to_owned(),
                },
                || {
                    self.store
                        .pause_schedule(self.caller, &ns, &schedule)
                        .map(|_| Outcome::Applied)
                },
            ),
            Act::ResumeSchedule => self.record(
                Operation::ResumeSchedule {
                    schedule: SCHEDULE.to_owned(),
                },
                || {
                    self.store
                        .resume_schedule(self.caller, &ns, &schedule)
                        .map(|_| Outcome::Applied)
                },
            ),
            Act::CancelReady => self.record(
                Operation::CancelTasks {
                    queue: limited.to_string(),
                    state: StateName::Ready.to_string(),
                },
                || {
                    self.store
                        .cancel_tasks(self.caller, &ns, &bulk(StateName::Ready))
                        .map(|count| Outcome::Changed { count })
                },
            ),
            Act::RetryCancelled => self.record(
                Operation::RetryTasks {
                    queue: limited.to_string(),
                    state: StateName::Cancelled.to_string(),
                },
                || {
                    self.store
                        .retry_tasks(self.caller, &ns, &bulk(StateName::Cancelled))
                        .map(|count| Outcome::Changed { count })
                },
            ),
        };
    }
}

/// What the producer does between enqueues now and then.
#[derive(Debug, Clone, Copy)]
enum Act {
    PauseQueue,
    ResumeQueue,
    PauseSchedule,
    ResumeSchedule,
    CancelReady,
    RetryCancelled,
}

/// Enqueues `tasks` tasks one by one, asking again while an answer is
/// unknown; cancels about one in a hundred of those enqueued so far;
/// pauses and resumes the limited queue and the schedule, and cancels the
/// limited queue's ready tasks and retries them, now and then. At the
/// end the queue is resumed, the schedule paused (so the run can finish)
/// and every cancelled task of the limited queue retried. Returns how
/// many tasks were created.
fn produce(producer: &Producer<'_>, tasks: usize, pace_micros: u64, mut rng: Rng) -> usize {
    let ns = work_namespace();
    let mut created = 0;
    for n in 0..tasks {
        created += usize::from(producer.enqueue(n));
        std::thread::sleep(Duration::from_micros(rng.between(0, 2 * pace_micros)));
        if n > 0 && rng.percent(1) {
            let victim = rng.between(0, n as u64) as usize;
            if cancellable(victim) {
                let victim = task_id(victim);
                let task = TaskRef::new(ns.clone(), victim.clone(), BriefVersion::FIRST);
                producer.record(
                    Operation::Cancel {
                        task: victim.as_str().to_owned(),
                    },
                    || {
                        producer
                            .store
                            .cancel_task(producer.caller, &task)
                            .map(|_| Outcome::Cancelled)
                    },
                );
            }
        }
        match n % 60 {
            10 => producer.act(Act::PauseQueue),
            20 => producer.act(Act::ResumeQueue),
            25 => producer.act(Act::CancelReady),
            30 => producer.act(Act::PauseSchedule),
            35 => producer.act(Act::RetryCancelled),
            45 => producer.act(Act::ResumeSchedule),
            _ => {}
        }
    }
    producer.act(Act::ResumeQueue);
    producer.act(Act::PauseSchedule);
    producer.act(Act::RetryCancelled);
    created
}

/// Whether no attempt is ready, leased, backing off, scheduled or
/// waiting for parents.
fn all_finished(store: &Store, admin: &Caller) -> bool {
    let ns = work_namespace();
    [
        StateName::Ready,
        StateName::Leased,
        StateName::Backoff,
        StateName::Scheduled,
        StateName::Waiting,
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

/// The schedule's run-ats that were due: each after the schedule was put
/// and before the last pass, with a scheduler pass acknowledged that
/// began after it and ended before the next run-at, both by more than
/// `margin` (the most two clocks differ).
fn due_run_ats(history: &History, put_at: DateTime<Utc>, margin: TimeDelta) -> Vec<DateTime<Utc>> {
    let schedule = CronSchedule::parse(SCHEDULE_CRON, "UTC").unwrap();
    let passes: Vec<(DateTime<Utc>, DateTime<Utc>)> = history
        .steps()
        .iter()
        .filter(|step| matches!(step.operation, Operation::FireSchedules))
        .filter(|step| matches!(step.completion, Completion::Ok { .. }))
        .filter_map(|step| Some((step.invoked_wall, step.completed_wall?)))
        .collect();
    let Some(last) = passes.iter().map(|(_, done)| *done).max() else {
        return Vec::new();
    };
    let mut due = Vec::new();
    let mut run_at = schedule.next_after(put_at + margin);
    while let Some(at) = run_at.filter(|at| *at < last) {
        let next = schedule.next_after(at).unwrap();
        if passes
            .iter()
            .any(|(began, done)| *began > at + margin && *done + margin < next)
        {
            due.push(at);
        }
        run_at = Some(next);
    }
    due
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
    purged: u64,
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
        purged,
        purged_missing: report.purged.len(),
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

/// Where the guarantees page's table begins and ends.
const TABLE_BEGINS: &str = "<!-- chaos_table: begins -->";
const TABLE_ENDS: &str = "<!-- chaos_table: ends -->";

/// `page` with the text between its table markers replaced by `table`.
pub(crate) fn with_table(page: &str, table: &str) -> String {
    let begins = page
        .find(TABLE_BEGINS)
        .expect("the page has the table's first marker");
    let ends = page
        .find(TABLE_ENDS)
        .expect("the page has the table's last marker");
    format!(
        "{}{TABLE_BEGINS}\n{table}{}",
        &page[..begins],
        &page[ends..]
    )
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
        "| scenario | backend | processes | tasks | faults (landed) | operations (unknown) | anomalies | lost | doubled | purged | recovery after a fault, median / worst (ms) | seed | commit |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
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
        let purged = s["purged"]
            .as_u64()
            .map_or_else(|| "—".to_owned(), |n| n.to_string());
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} ({}) | {} ({}) | {} | {} | {} | {} | {} | {} | {} |\n",
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
            purged,
            recovery,
            s["seed"],
            s["commit"].as_str().unwrap_or("unknown"),
        ));
    }
    out
}
