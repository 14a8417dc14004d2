//! The claim order (ready first, oldest first; then lapsed leases and ended
//! backoffs by when each became claimable) and what a heartbeat writes,
//! checked against `tessera-lease`'s own rules as a model.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use tessera_lease::{Jitter, Task, TaskSpec};
use tessera_store::{
    Caller, ClaimOutcome, EnqueueOptions, FencingToken, Grant, IdempotencyKey, KeySpec,
    ManualClock, Namespace, Output, QueueName, Retry, Scope, Store, StoreConfig, TaskRef,
};

use crate::harness::{BackendKind, Fixture, TestDb, json_brief, namespace, noon, queue};

/// Enqueues a task of one attempt into `renders/jobs`, its lapse backoff
/// `backoff`.
fn enqueue_lapsing(f: &Fixture<'_>, worker: &Caller, backoff: Duration) -> TaskRef {
    let options = EnqueueOptions::default().with_lapse_backoff(backoff);
    f.store
        .enqueue(
            worker,
            &namespace("renders"),
            &queue("jobs"),
            &json_brief(0),
            &options,
        )
        .unwrap()
}

fn claimed_task(outcome: ClaimOutcome) -> Option<TaskRef> {
    outcome.claimed().map(|claimed| claimed.task.clone())
}

fn lapsed_leases_and_ended_backoffs_come_in_the_order_they_became_claimable(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let enqueue = |backoff| enqueue_lapsing(&f, &worker, backoff);
    let a = enqueue(Duration::ZERO);
    let b = enqueue(Duration::from_secs(30));
    let c = enqueue(Duration::ZERO);
    let d = enqueue(Duration::ZERO);
    // a and b leased until 12:01 (b claimable again at 12:01:30), c failed
    // with a retry at 12:01:10, d still ready.
    for _ in 0..3 {
        f.claim(&worker, &ns, &q);
    }
    let c_lease = f.store.read_task(&worker, &c).unwrap().record.attempts[0]
        .lease
        .clone()
        .unwrap();
    f.store
        .fail(
            &worker,
            &c,
            c_lease.token,
            Retry::After(Duration::from_secs(70)),
        )
        .unwrap();

    f.clock.advance(Duration::from_secs(75));
    let next = || claimed_task(f.store.claim(&worker, &ns, &q).unwrap());
    assert_eq!(next(), Some(d), "ready first");
    assert_eq!(next(), Some(a), "lapsed at 12:01");
    assert_eq!(next(), Some(c), "backoff ended at 12:01:10");
    assert_eq!(next(), None, "b's lapse backoff runs to 12:01:30");
    f.clock.advance(Duration::from_secs(15));
    assert_eq!(
        claimed_task(f.store.claim(&worker, &ns, &q).unwrap()),
        Some(b)
    );
}

/// Leases that lapse at the same time come back oldest task first,
/// whichever expired first: the lease rules' claim order breaks a tie by
/// the task, not by the lease.
fn leases_that_lapse_together_come_back_oldest_task_first(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    let enqueue = |backoff| enqueue_lapsing(&f, &worker, backoff);
    let older = enqueue(Duration::ZERO);
    let newer = enqueue(Duration::from_secs(30));
    // Both leased at 12:00 until 12:01; the older task's lease is then
    // extended to 12:01:30, when the newer one's 30 s lapse backoff ends.
    let first = f.claim(&worker, &ns, &q);
    assert_eq!(first.task, older);
    assert_eq!(f.claim(&worker, &ns, &q).task, newer);
    f.clock.advance(Duration::from_secs(30));
    f.store
        .heartbeat(&worker, &older, first.lease.token())
        .unwrap();
    f.clock.advance(Duration::from_secs(60));
    let next = || claimed_task(f.store.claim(&worker, &ns, &q).unwrap());
    assert_eq!(
        next(),
        Some(older),
        "both lapsed at 12:01:30: the older task first"
    );
    assert_eq!(next(), Some(newer));
    assert_eq!(next(), None);
}

/// A table's rows, as a count and a digest, read behind the store's back.
fn rows(db: &TestDb, table: &str) -> (u64, [u8; 32]) {
    db.table_snapshot()[table]
}

fn a_heartbeat_writes_its_attempt_and_audit_row_and_leaves_the_task_alone(db: &TestDb) {
    let f = Fixture::new(db);
    let worker = f.login(&f.full_worker(Grant::AllNamespaces));
    let (ns, q) = (namespace("renders"), queue("jobs"));
    f.enqueue(&worker, &ns, &q, 1);
    let claimed = f.claim(&worker, &ns, &q);
    let (tasks, attempts) = (rows(db, "tasks"), rows(db, "attempts"));
    f.clock.advance(Duration::from_secs(20));
    let (lease, cost) = f
        .store
        .measure(|s| s.heartbeat(&worker, &claimed.task, claimed.lease.token()));
    assert!(lease.unwrap().expires_at() > claimed.lease.expires_at());
    if db.meters_rows() {
        // The attempt row and its attempts_leased entry, the audit row and
        // its principal index entry.
        assert_eq!((cost.rows_written, cost.write_transactions), (2 + 2, 1));
    }
    assert_eq!(rows(db, "tasks"), tasks, "the task row is untouched");
    assert_ne!(rows(db, "attempts"), attempts);
    // Out of the claim index while leased, found again once it lapses.
    f.clock.advance(Duration::from_secs(59));
    assert!(f.store.claim(&worker, &ns, &q).unwrap().claimed().is_none());
    f.clock.advance(Duration::from_secs(2));
    let again = f.claim(&worker, &ns, &q);
    assert_eq!(again.task, claimed.task);
    assert_eq!(again.lease.token().as_i64(), 2);
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        queue: usize,
        alternatives: u16,
        lapse_backoff: u64,
    },
    Claim {
        queue: usize,
    },
    ClaimBatch {
        queue: usize,
        count: usize,
    },
    Heartbeat {
        pick: usize,
    },
    Submit {
        pick: usize,
    },
    Fail {
        pick: usize,
        retry: Option<u64>,
    },
    Advance {
        seconds: u64,
    },
    Expire,
}

/// Mostly one queue, so lapsed leases, ended backoffs and ready tasks
/// compete for the same claims; the other checks queues stay apart.
fn queue_index() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0_usize), 1 => Just(1_usize)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (queue_index(), 1..=3_u16, prop_oneof![Just(0_u64), Just(5), Just(30)]).prop_map(
            |(queue, alternatives, lapse_backoff)| Op::Enqueue {
                queue,
                alternatives,
                lapse_backoff,
            }
        ),
        4 => queue_index().prop_map(|queue| Op::Claim { queue }),
        2 => (queue_index(), 2..=4_usize).prop_map(|(queue, count)| Op::ClaimBatch { queue, count }),
        1 => any::<usize>().prop_map(|pick| Op::Heartbeat { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Submit { pick }),
        3 => (any::<usize>(), proptest::option::weighted(0.8, 1..120_u64))
            .prop_map(|(pick, retry)| Op::Fail { pick, retry }),
        3 => (1..120_u64).prop_map(|seconds| Op::Advance { seconds }),
        1 => Just(Op::Expire),
    ]
}

/// A task as the model keeps it: the lease rules' own state.
struct Modelled {
    task: TaskRef,
    queue: usize,
    rules: Task,
}

/// Where the model says a claim of `queue` goes at `now`: ready tasks
/// oldest first, then by when each became claimable, ties to the older.
fn expected(model: &[Modelled], queue: usize, now: DateTime<Utc>) -> Option<usize> {
    model
        .iter()
        .enumerate()
        .filter(|(_, m)| m.queue == queue && m.rules.next_claimable_at(now) == Some(now))
        .min_by_key(|(n, m)| {
            let record = m.rules.record();
            let ready = record
                .attempts
                .iter()
                .any(|a| a.state == tessera_lease::TaskState::Ready);
            let at = (!ready).then(|| {
                record
                    .attempts
                    .iter()
                    .filter_map(|a| match (a.state, &a.lease) {
                        (tessera_lease::TaskState::Backoff { until }, _) => Some(until),
                        (tessera_lease::TaskState::Leased, Some(lease)) => {
                            Some(lease.expires_at + record.lapse_backoff)
                        }
                        _ => None,
                    })
                    .min()
                    .unwrap()
            });
            (at, *n)
        })
        .map(|(n, _)| n)
}

struct World {
    clock: ManualClock,
    store: Store,
    /// The case's own database, kept while the store works on it.
    _db: TestDb,
    worker: Caller,
    ns: Namespace,
    queues: [QueueName; 2],
    model: Vec<Modelled>,
    /// Leases handed out: (model index, token).
    leases: Vec<(usize, FencingToken)>,
    submissions: u64,
}

impl World {
    /// A store on a fresh database like `db`.
    fn new(db: &TestDb) -> Self {
        let db = db.fresh();
        let clock = ManualClock::new(noon());
        let config = StoreConfig::default().with_clock(Arc::new(clock.clone()));
        let store = db.open(config);
        let admin_key = store.create_admin_key("ops").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        let key = store
            .create_key(
                &admin,
                &KeySpec::keyed("acme")
                    .with_scopes(Scope::ALL.iter().copied())
                    .with_grant(Grant::AllNamespaces),
            )
            .unwrap();
        let worker = store.authenticate(Some(key.secret.expose())).unwrap();
        Self {
            clock,
            store,
            _db: db,
            worker,
            ns: namespace("model"),
            queues: [queue("q0"), queue("q1")],
            model: Vec::new(),
            leases: Vec::new(),
            submissions: 0,
        }
    }

    fn now(&self) -> DateTime<Utc> {
        use tessera_store::Clock;
        self.clock.now_utc()
    }

    /// A lease handed out earlier: for an even `pick` one the model holds
    /// live (so most heartbeats, failures and submissions take effect),
    /// for an odd one any, stale ones included.
    fn lease(&self, pick: usize) -> Option<(usize, FencingToken)> {
        let now = self.now();
        let live: Vec<_> = self
            .leases
            .iter()
            .copied()
            .filter(|(n, token)| {
                self.model[*n].rules.record().attempts.iter().any(|a| {
                    a.state == tessera_lease::TaskState::Leased
                        && a.lease
                            .as_ref()
                            .is_some_and(|l| l.token == *token && !l.is_expired(now))
                })
            })
            .collect();
        let from = if pick % 2 == 0 && !live.is_empty() {
            &live
        } else {
            &self.leases
        };
        (!from.is_empty()).then(|| from[pick / 2 % from.len()])
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now();
        let holder = self.worker.lease_principal();
        let lease_duration = Duration::from_secs(60);
        match *op {
            Op::Enqueue {
                queue,
                alternatives,
                lapse_backoff,
            } => {
                let options = EnqueueOptions::default()
                    .with_alternatives(alternatives)
                    .with_lapse_backoff(Duration::from_secs(lapse_backoff));
                let brief = json_brief(self.model.len());
                let task = self
                    .store
                    .enqueue(
                        &self.worker,
                        &self.ns,
                        &self.queues[queue],
                        &brief,
                        &options,
                    )
                    .unwrap();
                let spec = TaskSpec {
                    alternatives,
                    lapse_backoff: Duration::from_secs(lapse_backoff),
                    ..TaskSpec::default()
                };
                let rules = Task::new(task.id.clone(), task.version, spec).unwrap();
                self.model.push(Modelled { task, queue, rules });
            }
            Op::Claim { queue } => {
                let outcome = self
                    .store
                    .claim(&self.worker, &self.ns, &self.queues[queue])
                    .unwrap();
                let want = expected(&self.model, queue, now);
                match (outcome.claimed(), want) {
                    (None, None) => {}
                    (Some(claimed), Some(n)) => {
                        prop_assert_eq!(&claimed.task, &self.model[n].task);
                        let lease = self.model[n]
                            .rules
                            .claim(&holder, now, lease_duration)
                            .unwrap();
                        prop_assert_eq!(&claimed.lease, &lease);
                        self.leases.push((n, lease.token()));
                    }
                    (got, want) => {
                        return Err(TestCaseError::fail(format!(
                            "claim at {now}: got {got:?}, the model wants {want:?}"
                        )));
                    }
                }
            }
            Op::ClaimBatch { queue, count } => {
                let batch = self
                    .store
                    .claim_batch(&self.worker, &self.ns, &self.queues[queue], count)
                    .unwrap();
                // The model's picks, one at a time, until the queue has
                // none or the next is a task this batch took.
                let mut picked: Vec<usize> = Vec::new();
                while picked.len() < count {
                    match expected(&self.model, queue, now) {
                        Some(n) if !picked.contains(&n) => picked.push(n),
                        _ => break,
                    }
                    let n = picked[picked.len() - 1];
                    let lease = self.model[n]
                        .rules
                        .claim(&holder, now, lease_duration)
                        .unwrap();
                    let Some(claimed) = batch.claimed.get(picked.len() - 1) else {
                        return Err(TestCaseError::fail(format!(
                            "batch of {count} at {now}: got {} tasks, the model wants more",
                            batch.claimed.len()
                        )));
                    };
                    prop_assert_eq!(&claimed.task, &self.model[n].task);
                    prop_assert_eq!(&claimed.lease, &lease);
                    self.leases.push((n, lease.token()));
                }
                prop_assert_eq!(batch.claimed.len(), picked.len());
            }
            Op::Heartbeat { pick } => {
                let Some((n, token)) = self.lease(pick) else {
                    return Ok(());
                };
                let stored = self
                    .store
                    .heartbeat(&self.worker, &self.model[n].task, token);
                let modelled = self.model[n]
                    .rules
                    .heartbeat(&holder, token, now, lease_duration);
                prop_assert_eq!(stored.ok(), modelled.ok());
            }
            Op::Submit { pick } => {
                let Some((n, token)) = self.lease(pick) else {
                    return Ok(());
                };
                self.submissions += 1;
                let key = IdempotencyKey::parse(&format!("k{}", self.submissions)).unwrap();
                let output = Output::bytes(format!("out {}", self.submissions));
                let stored =
                    self.store
                        .submit(&self.worker, &self.model[n].task, token, &key, &output);
                let submission = tessera_lease::Submission {
                    principal: holder.clone(),
                    token,
                    key,
                    digest: output.payload_digest(),
                };
                let modelled = self.model[n].rules.submit(&submission, None, now);
                prop_assert_eq!(stored.is_ok(), modelled.is_ok());
            }
            Op::Fail { pick, retry } => {
                let Some((n, token)) = self.lease(pick) else {
                    return Ok(());
                };
                let retry = retry.map_or(Retry::Never, |s| Retry::After(Duration::from_secs(s)));
                let stored = self
                    .store
                    .fail(&self.worker, &self.model[n].task, token, retry);
                let modelled =
                    self.model[n]
                        .rules
                        .fail(&holder, token, now, retry, &mut Jitter::seeded(0));
                prop_assert_eq!(stored.ok(), modelled.ok());
            }
            Op::Advance { seconds } => self.clock.advance(Duration::from_secs(seconds)),
            Op::Expire => {
                let mut stored = self.store.expire_leases(&self.ns, 1000).unwrap();
                stored.sort();
                // Only tasks with a lapsed lease are visited.
                let mut modelled: Vec<TaskRef> = self
                    .model
                    .iter_mut()
                    .filter(|m| {
                        m.rules.record().attempts.iter().any(|a| {
                            a.state == tessera_lease::TaskState::Leased
                                && a.lease.as_ref().is_some_and(|l| l.is_expired(now))
                        })
                    })
                    .filter_map(|m| (!m.rules.expire(now).is_empty()).then(|| m.task.clone()))
                    .collect();
                modelled.sort();
                prop_assert_eq!(stored, modelled);
            }
        }
        Ok(())
    }
}

/// Every claim, of one task or a batch, takes the tasks the lease rules' claimability and the
/// documented order pick, whatever mix of leases, heartbeats, failures,
/// submissions, expiry and time came before: a few cases in the default
/// run, with every saved regression.
fn claims_follow_the_lease_rules_and_the_documented_order(db: &TestDb) {
    // Each case opens a fresh database; a server's costs more than a file.
    claims_follow_the_rules(
        db,
        match db.kind() {
            BackendKind::Sqlite => 16,
            BackendKind::Postgres => 1,
        },
        50,
    );
}

/// [`claims_follow_the_lease_rules_and_the_documented_order`] at full size.
fn claims_follow_the_lease_rules_and_the_documented_order_at_full_size(db: &TestDb) {
    claims_follow_the_rules(
        db,
        match db.kind() {
            BackendKind::Sqlite => 128,
            BackendKind::Postgres => 24,
        },
        100,
    );
}

/// `cases` random runs of up to `most_ops` operations each, after the saved
/// regressions.
fn claims_follow_the_rules(db: &TestDb, cases: u32, most_ops: usize) {
    let mut runner = TestRunner::new(Config {
        cases,
        // Beside this file: claim_order.proptest-regressions.
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    let strategy = proptest::collection::vec(op(), 1..most_ops);
    let result = runner.run(&strategy, |ops| {
        let mut world = World::new(db);
        for op in &ops {
            world.step(op)?;
        }
        // Every record the store holds is the model's.
        for m in &world.model {
            let view = world.store.read_task(&world.worker, &m.task).unwrap();
            prop_assert_eq!(&view.record, m.rules.record());
        }
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}\n{runner}");
    }
}

conformance! {
    lapsed_leases_and_ended_backoffs_come_in_the_order_they_became_claimable,
    leases_that_lapse_together_come_back_oldest_task_first,
    a_heartbeat_writes_its_attempt_and_audit_row_and_leaves_the_task_alone,
    claims_follow_the_lease_rules_and_the_documented_order,
    #[ignore = "long: run by .ci/run"]
    claims_follow_the_lease_rules_and_the_documented_order_at_full_size,
}
