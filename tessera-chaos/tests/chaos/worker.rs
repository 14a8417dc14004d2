//! Worker processes: this test binary run again (`--exact
//! child_process_entry`, the mechanism the store's own multi-process
//! tests use), working the run's queue and recording every operation.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::RwLock;
use tessera_chaos::{Recorder, Rng, SkewedClock, pause};
use tessera_check::{Completion, Fire, Operation, Outcome, Receipt};
use tessera_store::faults::InjectedFault;
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    Caller, ClaimOutcome, Claimed, Clock, Error, IdempotencyKey, Output, QueueName, Retention,
    Retry, Store, StoreConfig, SubmitRequest, Submitted, TaskRef,
};

use crate::harness::{BackendKind, TestDb};
use crate::run::{lease_duration, limited_queue, retention_interval, work_namespace, work_queue};

const ENV_BACKEND: &str = "TESSERA_CHAOS_BACKEND";
const ENV_DB: &str = "TESSERA_CHAOS_DB";
const ENV_KEY: &str = "TESSERA_CHAOS_KEY";
const ENV_DIR: &str = "TESSERA_CHAOS_DIR";
const ENV_PROCESS: &str = "TESSERA_CHAOS_PROCESS";
const ENV_SKEW: &str = "TESSERA_CHAOS_SKEW_MS";
const ENV_THREADS: &str = "TESSERA_CHAOS_THREADS";
const ENV_SEED: &str = "TESSERA_CHAOS_WORKER_SEED";
const ENV_WORK: &str = "TESSERA_CHAOS_WORK_MS";
const ENV_INJECT: &str = "TESSERA_CHAOS_INJECT";
const ENV_RETENTION: &str = "TESSERA_CHAOS_RETENTION";

/// What a worker process is told.
#[derive(Debug, Clone)]
pub(crate) struct Orders {
    pub(crate) backend: BackendKind,
    /// The database's locator ([`TestDb::locator`]), with the server
    /// address workers reach it by.
    pub(crate) locator: String,
    pub(crate) key: String,
    /// The run's directory: history files and control files.
    pub(crate) dir: PathBuf,
    pub(crate) process: u32,
    /// How far its clock is off the system's.
    pub(crate) skew_millis: i64,
    pub(crate) threads: usize,
    pub(crate) seed: u64,
    /// How long it works on a lease before submitting, in ms: least, most.
    pub(crate) work_millis: (u64, u64),
    /// A deliberate bug its store runs with.
    pub(crate) injected: Option<InjectedFault>,
    /// How long its store keeps finished tasks before purging them.
    pub(crate) retention: Retention,
}

/// The control file that asks workers to refuse writes while it exists.
pub(crate) fn refuse_file(dir: &Path) -> PathBuf {
    dir.join("refuse-writes")
}

/// The control file that asks workers to stop.
pub(crate) fn stop_file(dir: &Path) -> PathBuf {
    dir.join("stop")
}

/// Starts the test binary again as a worker.
pub(crate) fn spawn(orders: &Orders) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_BACKEND, orders.backend.name())
        .env(ENV_DB, &orders.locator)
        .env(ENV_KEY, &orders.key)
        .env(ENV_DIR, &orders.dir)
        .env(ENV_PROCESS, orders.process.to_string())
        .env(ENV_SKEW, orders.skew_millis.to_string())
        .env(ENV_THREADS, orders.threads.to_string())
        .env(ENV_SEED, orders.seed.to_string())
        .env(
            ENV_WORK,
            format!("{} {}", orders.work_millis.0, orders.work_millis.1),
        )
        .env(
            ENV_INJECT,
            orders.injected.map_or_else(String::new, |fault| {
                serde_json::to_value(fault)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned()
            }),
        )
        .env(
            ENV_RETENTION,
            serde_json::to_string(&orders.retention).unwrap(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// How an operation that returned an error ended: a storage fault leaves
/// its outcome unknown; every other error says nothing changed.
pub(crate) fn completion_of(error: &Error) -> Completion {
    match error.code() {
        "storage_error" | "internal_error" | "corrupt_database" => Completion::Unknown {
            reason: error.to_string(),
        },
        code => Completion::Fail {
            error: code.to_owned(),
        },
    }
}

/// A receipt as the checker reads it.
pub(crate) fn receipt_of(receipt: &tessera_store::Receipt) -> Receipt {
    Receipt {
        attempt: u32::from(receipt.attempt.as_u16()),
        token: receipt.token.as_i64(),
        key: receipt.idempotency_key.as_str().to_owned(),
        digest: receipt.digest.to_string(),
        accepted_at: receipt.accepted_at,
    }
}

/// Opens a store for a worker or the run itself; `None` while the
/// database cannot be reached.
pub(crate) fn open_store(db: &TestDb, config: StoreConfig) -> Option<Store> {
    let result = match db.kind() {
        BackendKind::Sqlite => Store::open_sqlite(
            SqliteOptions::file(db.sqlite_path().unwrap())
                .with_busy_timeout(Duration::from_secs(30)),
            config,
        ),
        BackendKind::Postgres => db.open_postgres(
            |options| {
                options
                    .with_pool_size(2)
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_pool_timeout(Duration::from_secs(3))
                    .with_statement_timeout(Duration::from_secs(10))
            },
            config,
        ),
    };
    match result {
        Ok(store) => Some(store),
        Err(error) => {
            eprintln!("opening the store: {error}");
            None
        }
    }
}

/// One worker process: its store (opened again when the refuse-writes
/// control file appears or goes), its recorder and its clock.
struct Worker {
    db: TestDb,
    dir: PathBuf,
    key: String,
    clock: Arc<SkewedClock>,
    recorder: Recorder,
    store: RwLock<(bool, Arc<Store>, Caller)>,
    work_millis: (u64, u64),
    injected: Option<InjectedFault>,
    retention: Retention,
}

/// Opens the worker's store and logs in, trying again until the
/// database answers. Its store purges finished tasks as `retention`
/// says, a retention run at most every [`retention_interval`].
fn connect(
    db: &TestDb,
    key: &str,
    clock: &Arc<SkewedClock>,
    refuse: bool,
    injected: Option<InjectedFault>,
    retention: Retention,
) -> (Arc<Store>, Caller) {
    loop {
        let config = StoreConfig::default()
            .with_clock(clock.clone())
            .with_lease_duration(lease_duration())
            .with_refuse_writes(refuse)
            .with_injected_fault(injected)
            .with_retention(retention)
            .with_retention_interval(retention_interval());
        if let Some(store) = open_store(db, config) {
            match store.authenticate(Some(key)) {
                Ok(caller) => return (Arc::new(store), caller),
                Err(error) => eprintln!("authenticating: {error}"),
            }
        }
        pause(100);
    }
}

impl Worker {
    /// The store to use now, with its caller.
    fn store(&self) -> (Arc<Store>, Caller) {
        let refuse = refuse_file(&self.dir).exists();
        {
            let current = self.store.read();
            if current.0 == refuse {
                return (Arc::clone(&current.1), current.2.clone());
            }
        }
        let mut current = self.store.write();
        if current.0 != refuse {
            let (store, caller) = connect(
                &self.db,
                &self.key,
                &self.clock,
                refuse,
                self.injected,
                self.retention,
            );
            *current = (refuse, store, caller);
        }
        (Arc::clone(&current.1), current.2.clone())
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now_utc()
    }

    /// Records `operation`, runs it, and records how it ended.
    fn record<T>(
        &self,
        operation: Operation,
        run: impl FnOnce() -> Result<T, Error>,
        outcome: impl FnOnce(&T) -> Outcome,
    ) -> Result<T, Completion> {
        let id = self.recorder.invoke(self.now(), operation).unwrap();
        let result = run();
        let completion = match &result {
            Ok(value) => Completion::Ok {
                outcome: outcome(value),
            },
            Err(error) => completion_of(error),
        };
        self.recorder
            .complete(id, self.now(), completion.clone())
            .unwrap();
        result.map_err(|_| completion)
    }

    /// Claims and works leases until told to stop, from the run's queue
    /// and, one claim in three, its limited queue; a lease claimed with a
    /// submission (`submit_and_claim`) is worked next.
    fn work(&self, mut rng: Rng) {
        let stop = stop_file(&self.dir);
        let ns = work_namespace();
        let mut carried: Option<(Claimed, QueueName)> = None;
        while !stop.exists() {
            let (claimed, q) = match carried.take() {
                Some((claimed, q)) => (Ok(ClaimOutcome::Granted(claimed)), q),
                None => {
                    let q = if rng.percent(33) {
                        limited_queue()
                    } else {
                        work_queue()
                    };
                    let (store, caller) = self.store();
                    let claimed = self.record(
                        claim_operation(&q),
                        || store.claim(&caller, &ns, &q),
                        claim_outcome,
                    );
                    (claimed, q)
                }
            };
            match claimed {
                Ok(ClaimOutcome::Granted(claimed)) => {
                    let lease = &claimed.lease;
                    carried = self
                        .hold(
                            &mut rng,
                            &claimed.task,
                            &q,
                            u32::from(lease.attempt().as_u16()),
                            lease.token(),
                        )
                        .map(|next| (next, q));
                }
                Ok(_) => pause(rng.between(5, 30)),
                Err(_) => pause(rng.between(20, 80)),
            }
        }
    }

    /// A submission that carries the next claim, recorded as two
    /// operations, invoked together and completed together: the claim is
    /// made in the submission's transaction, and a refused submission
    /// claims nothing.
    fn submit_and_claim(
        &self,
        submit: Operation,
        queue: &QueueName,
        run: impl FnOnce() -> Result<(Submitted, Result<ClaimOutcome, Error>), Error>,
    ) -> (Result<Submitted, Completion>, Option<Claimed>) {
        let submit_id = self.recorder.invoke(self.now(), submit).unwrap();
        let claim_id = self
            .recorder
            .invoke(self.now(), claim_operation(queue))
            .unwrap();
        let result = run();
        let now = self.now();
        match result {
            Ok((submitted, claimed)) => {
                let outcome = submitted_outcome(&submitted);
                self.recorder
                    .complete(submit_id, now, Completion::Ok { outcome })
                    .unwrap();
                let (completion, next) = match claimed {
                    Ok(outcome) => (
                        Completion::Ok {
                            outcome: claim_outcome(&outcome),
                        },
                        match outcome {
                            ClaimOutcome::Granted(claimed) => Some(claimed),
                            _ => None,
                        },
                    ),
                    Err(error) => (completion_of(&error), None),
                };
                self.recorder.complete(claim_id, now, completion).unwrap();
                (Ok(submitted), next)
            }
            Err(error) => {
                let completion = completion_of(&error);
                self.recorder
                    .complete(submit_id, now, completion.clone())
                    .unwrap();
                self.recorder
                    .complete(claim_id, now, completion.clone())
                    .unwrap();
                (Err(completion), None)
            }
        }
    }

    /// Works one lease: heartbeats it a few times now and then, snoozes it
    /// or fails it for a retry now and then, and otherwise submits, asking again with
    /// the same key while the answer is unknown. Half the last asks carry
    /// the next claim; its lease, if one was granted, is returned.
    fn hold(
        &self,
        rng: &mut Rng,
        task: &TaskRef,
        queue: &QueueName,
        attempt: u32,
        token: tessera_store::FencingToken,
    ) -> Option<Claimed> {
        let id = task.id.as_str().to_owned();
        let t = token.as_i64();
        // The work itself: a kill often lands here, holding the lease.
        pause(rng.between(self.work_millis.0, self.work_millis.1));
        if rng.percent(15) {
            for _ in 0..rng.between(1, 3) {
                pause(rng.between(0, lease_duration().as_millis() as u64 / 4));
                let (store, caller) = self.store();
                let beat = self.record(
                    Operation::Heartbeat {
                        task: id.clone(),
                        attempt,
                        token: t,
                    },
                    || store.heartbeat(&caller, task, token),
                    |lease| Outcome::Extended {
                        expires_at: lease.expires_at(),
                    },
                );
                if matches!(beat, Err(Completion::Fail { .. })) {
                    return None;
                }
            }
        }
        if rng.percent(3) {
            // Stepped back unstarted: claimable again at once, the try
            // given back.
            let (store, caller) = self.store();
            let _ = self.record(
                Operation::Snooze {
                    task: id,
                    attempt,
                    token: t,
                },
                || store.fail(&caller, task, token, Retry::Snooze(Duration::ZERO)),
                |_| Outcome::Snoozed { until: self.now() },
            );
            return None;
        }
        if rng.percent(5) {
            let (store, caller) = self.store();
            let _ = self.record(
                Operation::Fail {
                    task: id,
                    attempt,
                    token: t,
                    retry: true,
                },
                || store.fail(&caller, task, token, Retry::After(Duration::ZERO)),
                |_| Outcome::Failed,
            );
            return None;
        }
        let key = IdempotencyKey::parse(&format!("k{t}-{}", rng.between(0, 999))).unwrap();
        let output = Output::bytes(format!("{id} under token {t}"));
        // A replay now and then after an acknowledged submission, and
        // every retry after an unknown answer, use the same key.
        let mut asks = 1 + u64::from(rng.percent(3));
        let mut tries = 0;
        while asks > 0 && tries < 20 {
            tries += 1;
            let (store, caller) = self.store();
            let operation = Operation::Submit {
                task: id.clone(),
                attempt,
                token: t,
                key: key.as_str().to_owned(),
                digest: output.payload_digest().to_string(),
            };
            let submitted = if asks == 1 && rng.percent(50) {
                let ns = work_namespace();
                let request = SubmitRequest {
                    task: task.clone(),
                    token,
                    key: key.clone(),
                    output: output.clone(),
                };
                let (submitted, next) = self.submit_and_claim(operation, queue, || {
                    store.submit_and_claim(&caller, &request, &ns, queue)
                });
                if next.is_some() {
                    return next;
                }
                submitted
            } else {
                self.record(
                    operation,
                    || store.submit(&caller, task, token, &key, &output),
                    submitted_outcome,
                )
            };
            match submitted {
                Ok(_) => asks -= 1,
                Err(Completion::Unknown { .. }) => pause(rng.between(20, 200)),
                Err(_) => return None,
            }
        }
        None
    }
}

impl Worker {
    /// Makes a scheduler pass every 100 to 300 ms until told to stop, as
    /// every process of a service does.
    fn schedule(&self, mut rng: Rng) {
        let stop = stop_file(&self.dir);
        while !stop.exists() {
            pause(rng.between(100, 300));
            let (store, _) = self.store();
            let _ = self.record(
                Operation::FireSchedules,
                || store.fire_due_schedules(),
                |fired| Outcome::Fired {
                    fires: fired
                        .iter()
                        .map(|fire| Fire {
                            schedule: fire.schedule.to_string(),
                            run_at: fire.run_at,
                            task: fire.task.id.to_string(),
                        })
                        .collect(),
                },
            );
        }
    }
}

/// A claim of `queue`, as recorded.
fn claim_operation(queue: &QueueName) -> Operation {
    Operation::Claim {
        queue: queue.to_string(),
    }
}

/// A claim's outcome, as recorded.
fn claim_outcome(outcome: &ClaimOutcome) -> Outcome {
    match outcome {
        ClaimOutcome::Granted(claimed) => Outcome::Granted {
            task: claimed.task.id.as_str().to_owned(),
            attempt: u32::from(claimed.lease.attempt().as_u16()),
            token: claimed.lease.token().as_i64(),
            granted_at: claimed.lease.granted_at(),
            expires_at: claimed.lease.expires_at(),
        },
        _ => Outcome::Empty,
    }
}

/// A submission's outcome, as recorded.
fn submitted_outcome(submitted: &Submitted) -> Outcome {
    match submitted {
        Submitted::Accepted(receipt) => Outcome::Accepted {
            receipt: receipt_of(receipt),
        },
        Submitted::Replayed(receipt) => Outcome::Replayed {
            receipt: receipt_of(receipt),
        },
    }
}

/// The body of the `child_process_entry` test: nothing unless run as a
/// worker by [`spawn`].
pub(crate) fn child_main() {
    let Ok(locator) = std::env::var(ENV_DB) else {
        return;
    };
    let env = |name: &str| std::env::var(name).unwrap();
    let db = TestDb::attach(BackendKind::from_name(&env(ENV_BACKEND)), &locator);
    let dir = PathBuf::from(env(ENV_DIR));
    let process: u32 = env(ENV_PROCESS).parse().unwrap();
    let threads: usize = env(ENV_THREADS).parse().unwrap();
    let rng = Rng::new(env(ENV_SEED).parse().unwrap());
    let clock = Arc::new(SkewedClock::new(env(ENV_SKEW).parse().unwrap()));
    let recorder = Recorder::open(&dir, process).unwrap();
    let key = env(ENV_KEY);
    let refuse = refuse_file(&dir).exists();
    let (least, most) = env(ENV_WORK)
        .split_once(' ')
        .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
        .unwrap();
    let injected = InjectedFault::parse(&env(ENV_INJECT));
    let retention: Retention = serde_json::from_str(&env(ENV_RETENTION)).unwrap();
    let (store, caller) = connect(&db, &key, &clock, refuse, injected, retention);
    let worker = Worker {
        db,
        dir,
        key,
        clock,
        recorder,
        store: RwLock::new((refuse, store, caller)),
        work_millis: (least, most),
        injected,
        retention,
    };
    let worker = &worker;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let rng = rng.fork(thread as u64);
            scope.spawn(move || worker.work(rng));
        }
        let rng = rng.fork(threads as u64);
        scope.spawn(move || worker.schedule(rng));
    });
}
