//! Model test: random interleavings of claim, heartbeat, time passing (and
//! stepping back), expiry sweeps, submissions, resubmissions, failure
//! reports, operators' retries and cancels by several workers on several
//! tasks with few tries each, one of them scheduled, checked against a
//! simple independent model of what each rule must allow.
//!
//! Tasks live serialized between steps, as a store keeps them, so every
//! reachable state also passes `Task::restore`.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;
use tessera_lease::{
    BriefVersion, Digest, DiscardReason, FencingToken, IdempotencyKey, Jitter, LeaseError,
    Principal, RETRY_BACKOFF_BASE, Receipt, Retry, Submission, Submitted, Task, TaskId, TaskSpec,
    TaskState,
};

const WORKERS: usize = 3;
const LEASE: Duration = Duration::from_secs(30);
const EXTENSION: Duration = Duration::from_secs(20);

/// (alternatives, lapse backoff in seconds, tries) of each task.
const TASKS: [(u16, u64, u32); 3] = [(1, 0, 2), (2, 0, 3), (2, 15, 20)];

/// Each task's not-before time, in seconds from the start.
const SCHEDULED: [Option<i64>; 3] = [None, Some(40), None];

#[derive(Debug, Clone)]
enum Op {
    Claim {
        worker: usize,
        task: usize,
    },
    Heartbeat {
        worker: usize,
        task: usize,
        pick: usize,
    },
    Advance {
        seconds: i64,
    },
    Expire {
        task: usize,
    },
    Submit {
        worker: usize,
        task: usize,
        pick: usize,
        key: u8,
        digest: u8,
    },
    /// A failure report asking for `retry`: give up, the default backoff,
    /// a backoff of some seconds, or a snooze of some seconds.
    Fail {
        worker: usize,
        task: usize,
        pick: usize,
        retry: Retry,
    },
    /// An operator's retry.
    Retry {
        task: usize,
    },
    /// An operator's cancel.
    Cancel {
        task: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let worker = 0..WORKERS;
    let task = 0..TASKS.len();
    prop_oneof![
        3 => (worker.clone(), task.clone()).prop_map(|(worker, task)| Op::Claim { worker, task }),
        2 => (worker.clone(), task.clone(), any::<usize>())
            .prop_map(|(worker, task, pick)| Op::Heartbeat { worker, task, pick }),
        // Mostly forward; sometimes the wall clock steps back.
        3 => prop_oneof![4 => 0i64..25, 1 => -15i64..0].prop_map(|seconds| Op::Advance { seconds }),
        1 => task.clone().prop_map(|task| Op::Expire { task }),
        4 => (worker.clone(), task.clone(), any::<usize>(), 0u8..2, 0u8..2).prop_map(
            |(worker, task, pick, key, digest)| Op::Submit { worker, task, pick, key, digest }
        ),
        2 => (worker, task.clone(), any::<usize>(), prop_oneof![
            Just(Retry::Never),
            Just(Retry::Backoff),
            (0u64..40).prop_map(|s| Retry::After(Duration::from_secs(s))),
            (0u64..40).prop_map(|s| Retry::Snooze(Duration::from_secs(s))),
        ])
            .prop_map(|(worker, task, pick, retry)| Op::Fail { worker, task, pick, retry }),
        1 => task.clone().prop_map(|task| Op::Retry { task }),
        1 => task.prop_map(|task| Op::Cancel { task }),
    ]
}

#[derive(Debug, Clone)]
struct Grant {
    token: i64,
    holder: usize,
    granted_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    Done,
    Failed,
    Discarded(DiscardReason),
    Cancelled,
    /// Ended by a failure report with a retry, or by a lapse a sweep
    /// recorded; claimable from `until` (`None`: at once).
    Waiting {
        until: Option<DateTime<Utc>>,
    },
}

/// A wait that ends at or before `now` is no wait.
fn wait_until(until: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    (until > now).then_some(until)
}

#[derive(Debug, Clone, Default)]
struct ModelAttempt {
    latest: Option<Grant>,
    ended: Option<Ended>,
    accepted: usize,
    tries: u32,
    /// A not-before time not yet passed or claimed.
    scheduled: Option<DateTime<Utc>>,
}

impl ModelAttempt {
    fn claimable(&self, now: DateTime<Utc>, lapse_backoff: TimeDelta, max_tries: u32) -> bool {
        match (&self.latest, self.ended) {
            (_, Some(Ended::Done | Ended::Failed | Ended::Discarded(_) | Ended::Cancelled)) => {
                false
            }
            (_, Some(Ended::Waiting { until })) => until.is_none_or(|u| u <= now),
            (None, None) => self.scheduled.is_none_or(|at| at <= now),
            (Some(grant), None) => {
                self.tries < max_tries && grant.expires_at + lapse_backoff <= now
            }
        }
    }

    fn is_final(&self) -> bool {
        matches!(
            self.ended,
            Some(Ended::Done | Ended::Failed | Ended::Discarded(_) | Ended::Cancelled)
        )
    }

    fn state(&self) -> TaskState {
        match (&self.latest, self.ended) {
            (_, Some(Ended::Waiting { until: None })) => TaskState::Ready,
            (None, None) => self
                .scheduled
                .map_or(TaskState::Ready, |at| TaskState::Scheduled { at }),
            (Some(_), None) => TaskState::Leased,
            (_, Some(Ended::Done)) => TaskState::Done,
            (_, Some(Ended::Failed)) => TaskState::Failed,
            (_, Some(Ended::Discarded(reason))) => TaskState::Discarded { reason },
            (_, Some(Ended::Cancelled)) => TaskState::Cancelled,
            (_, Some(Ended::Waiting { until: Some(until) })) => TaskState::Backoff { until },
        }
    }

    fn live(&self, now: DateTime<Utc>) -> Option<&Grant> {
        self.latest
            .as_ref()
            .filter(|grant| self.ended.is_none() && now < grant.expires_at)
    }

    /// Whether `token`, held by `worker`, is this attempt's latest grant
    /// and the attempt was cancelled.
    fn cancelled_under(&self, worker: usize, token: FencingToken) -> bool {
        self.ended == Some(Ended::Cancelled)
            && self
                .latest
                .as_ref()
                .is_some_and(|g| g.token == token.as_i64() && g.holder == worker)
    }
}

struct Model {
    now: DateTime<Utc>,
    /// Each task serialized, as a store would keep it.
    stored: Vec<String>,
    attempts: Vec<Vec<ModelAttempt>>,
    /// Every token granted per task, in grant order.
    granted: Vec<Vec<i64>>,
    /// Each task's tries per attempt; an operator's retry raises it.
    max_tries: Vec<u32>,
    /// Receipts by (worker, task, key), with their serialized bytes.
    receipts: HashMap<(usize, usize, u8), (Receipt, Vec<u8>)>,
}

fn principal(worker: usize) -> Principal {
    Principal::parse(&format!("worker-{worker}")).unwrap()
}

fn lapse_backoff(task: usize) -> TimeDelta {
    TimeDelta::seconds(TASKS[task].1 as i64)
}

fn start() -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse().unwrap()
}

impl Model {
    fn new() -> Self {
        let stored = TASKS
            .iter()
            .enumerate()
            .map(|(i, &(alternatives, backoff, max_tries))| {
                let spec = TaskSpec {
                    alternatives,
                    lapse_backoff: Duration::from_secs(backoff),
                    max_tries,
                    not_before: SCHEDULED[i].map(|s| start() + TimeDelta::seconds(s)),
                    ..TaskSpec::default()
                };
                let id = TaskId::parse(&format!("task-{i}")).unwrap();
                serde_json::to_string(&Task::new(id, BriefVersion::FIRST, spec).unwrap()).unwrap()
            })
            .collect();
        Self {
            now: start(),
            stored,
            attempts: TASKS
                .iter()
                .zip(SCHEDULED)
                .map(|(&(n, _, _), scheduled)| {
                    let attempt = ModelAttempt {
                        scheduled: scheduled.map(|s| start() + TimeDelta::seconds(s)),
                        ..ModelAttempt::default()
                    };
                    vec![attempt; usize::from(n)]
                })
                .collect(),
            granted: vec![Vec::new(); TASKS.len()],
            max_tries: TASKS.iter().map(|&(_, _, tries)| tries).collect(),
            receipts: HashMap::new(),
        }
    }

    fn load(&self, task: usize) -> Task {
        serde_json::from_str(&self.stored[task]).expect("a stored task always restores")
    }

    fn save(&mut self, task: usize, value: &Task) {
        self.stored[task] = serde_json::to_string(value).unwrap();
    }

    /// A token to present: any granted so far, or one never granted.
    fn pick_token(&self, task: usize, pick: usize) -> FencingToken {
        let granted = &self.granted[task];
        let value = if pick % 5 == 0 || granted.is_empty() {
            granted.last().copied().unwrap_or(0) + 1
        } else {
            granted[pick % granted.len()]
        };
        FencingToken::new(value).unwrap()
    }

    /// The attempt whose live lease is `token` held by `worker`, per the model.
    fn valid(&self, task: usize, worker: usize, token: FencingToken) -> Option<usize> {
        self.attempts[task].iter().position(|attempt| {
            attempt
                .live(self.now)
                .is_some_and(|g| g.token == token.as_i64() && g.holder == worker)
        })
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Advance { seconds } => self.now += TimeDelta::seconds(seconds),
            Op::Claim { worker, task } => self.claim(worker, task),
            Op::Heartbeat { worker, task, pick } => self.heartbeat(worker, task, pick),
            Op::Expire { task } => self.expire(task),
            Op::Submit {
                worker,
                task,
                pick,
                key,
                digest,
            } => self.submit(worker, task, pick, key, digest),
            Op::Fail {
                worker,
                task,
                pick,
                retry,
            } => self.fail(worker, task, pick, retry),
            Op::Retry { task } => self.retry(task),
            Op::Cancel { task } => self.cancel(task),
        }
        self.check_leases();
    }

    fn claim(&mut self, worker: usize, task: usize) {
        let mut value = self.load(task);
        let before = value.clone();
        let max_tries = self.max_tries[task];
        let expected = self.attempts[task]
            .iter()
            .position(|a| a.claimable(self.now, lapse_backoff(task), max_tries));
        match (value.claim(&principal(worker), self.now, LEASE), expected) {
            (Ok(lease), Some(index)) => {
                assert_eq!(usize::from(lease.attempt().as_u16()) - 1, index);
                let token = lease.token().as_i64();
                if let Some(&last) = self.granted[task].last() {
                    assert!(token > last, "token {token} after {last}");
                }
                let attempt = &mut self.attempts[task][index];
                assert!(
                    attempt.live(self.now).is_none(),
                    "a second unexpired lease on one attempt"
                );
                // An attempt's grants are stamped in token order, even when
                // the clock stepped back: from now or the latest grant.
                let granted_at = attempt
                    .latest
                    .as_ref()
                    .map_or(self.now, |latest| latest.granted_at.max(self.now));
                assert_eq!(lease.granted_at(), granted_at, "a grant's stamp");
                if let Some(latest) = &attempt.latest {
                    assert!(
                        lease.granted_at() >= latest.granted_at,
                        "a lease stamped before the one it follows"
                    );
                }
                attempt.latest = Some(Grant {
                    token,
                    holder: worker,
                    granted_at,
                    expires_at: lease.expires_at(),
                });
                attempt.ended = None;
                attempt.scheduled = None;
                attempt.tries += 1;
                assert!(attempt.tries <= max_tries, "a grant past the last try");
                assert_eq!(lease.expires_at(), granted_at + TimeDelta::seconds(30));
                self.granted[task].push(token);
                self.save(task, &value);
            }
            (Err(LeaseError::TaskFinished), None) => {
                // Final, or leased on the last try: never claimable again.
                assert!(
                    self.attempts[task]
                        .iter()
                        .all(|a| a.is_final() || (a.ended.is_none() && a.tries >= max_tries))
                );
                assert_eq!(value, before);
            }
            (Err(LeaseError::NoAttemptReady { next_at }), None) => {
                assert!(next_at > self.now);
                assert_eq!(value, before);
            }
            (outcome, expected) => panic!("claim gave {outcome:?}, model expected {expected:?}"),
        }
    }

    fn heartbeat(&mut self, worker: usize, task: usize, pick: usize) {
        let token = self.pick_token(task, pick);
        let mut value = self.load(task);
        let before = value.clone();
        let result = value.heartbeat(&principal(worker), token, self.now, EXTENSION);
        let cancelled = self.attempts[task]
            .iter()
            .any(|a| a.cancelled_under(worker, token));
        assert_eq!(
            cancelled,
            matches!(result, Err(LeaseError::TaskCancelled { .. })),
            "a cancelled lease's holder learns it, and only it: {result:?}"
        );
        match (result, self.valid(task, worker, token)) {
            (Ok(lease), Some(index)) => {
                let grant = self.attempts[task][index].latest.as_mut().unwrap();
                let wanted = grant.expires_at.max(self.now + TimeDelta::seconds(20));
                assert_eq!(lease.expires_at(), wanted, "expiry never moves back");
                grant.expires_at = wanted;
                self.save(task, &value);
            }
            (Err(_), None) => assert_eq!(value, before, "a refused heartbeat changed the task"),
            (outcome, valid) => panic!("heartbeat gave {outcome:?}, model valid {valid:?}"),
        }
    }

    fn submit(&mut self, worker: usize, task: usize, pick: usize, key: u8, digest: u8) {
        let submission = Submission {
            principal: principal(worker),
            token: self.pick_token(task, pick),
            key: IdempotencyKey::parse(&format!("key-{key}")).unwrap(),
            digest: Digest::from_bytes([digest; 32]),
        };
        let stored = self.receipts.get(&(worker, task, key)).cloned();
        let mut value = self.load(task);
        let before = value.clone();
        let result = value.submit(&submission, stored.as_ref().map(|(r, _)| r), self.now);
        match (result, stored) {
            (Ok(Submitted::Replayed(receipt)), Some((first, bytes))) => {
                assert_eq!(first.digest, submission.digest);
                assert_eq!(
                    serde_json::to_vec(&receipt).unwrap(),
                    bytes,
                    "replay not identical"
                );
                assert_eq!(value, before, "a replay changed the task");
            }
            (Err(LeaseError::IdempotencyConflict), Some((first, _))) => {
                assert_ne!(first.digest, submission.digest);
                assert_eq!(value, before);
            }
            (Ok(Submitted::Accepted(receipt)), None) => {
                let index = self
                    .valid(task, worker, submission.token)
                    .expect("accepted without a live lease of its token");
                let attempt = &mut self.attempts[task][index];
                let grant = attempt.latest.as_ref().unwrap();
                assert_eq!(
                    receipt.token.as_i64(),
                    grant.token,
                    "accepted a stale token"
                );
                assert_eq!(receipt.accepted_at, self.now.max(grant.granted_at));
                assert_eq!(usize::from(receipt.attempt.as_u16()) - 1, index);
                attempt.accepted += 1;
                assert_eq!(attempt.accepted, 1, "an attempt was done twice");
                attempt.ended = Some(Ended::Done);
                let bytes = serde_json::to_vec(&receipt).unwrap();
                self.receipts.insert((worker, task, key), (receipt, bytes));
                self.save(task, &value);
            }
            (Err(_), None) => {
                assert_eq!(self.valid(task, worker, submission.token), None);
                assert_eq!(value, before, "a refused submission changed the task");
            }
            (outcome, stored) => panic!("submit gave {outcome:?} with stored {stored:?}"),
        }
    }

    fn fail(&mut self, worker: usize, task: usize, pick: usize, retry: Retry) {
        let token = self.pick_token(task, pick);
        let mut value = self.load(task);
        let before = value.clone();
        let seed = token.as_i64() as u64;
        let result = value.fail(
            &principal(worker),
            token,
            self.now,
            retry,
            &mut Jitter::seeded(seed),
        );
        let max_tries = self.max_tries[task];
        match (result, self.valid(task, worker, token)) {
            (Ok(state), Some(index)) => {
                let now = self.now;
                let attempt = &mut self.attempts[task][index];
                let ended = match retry {
                    Retry::Never => Ended::Failed,
                    Retry::Snooze(delay) => {
                        // A snooze spends no try, on any try.
                        attempt.tries -= 1;
                        Ended::Waiting {
                            until: (!delay.is_zero())
                                .then(|| now + TimeDelta::from_std(delay).unwrap()),
                        }
                    }
                    _ if attempt.tries >= max_tries => Ended::Discarded(DiscardReason::Failed),
                    Retry::After(backoff) if backoff.is_zero() => Ended::Waiting { until: None },
                    Retry::After(backoff) => Ended::Waiting {
                        until: Some(now + TimeDelta::from_std(backoff).unwrap()),
                    },
                    Retry::Backoff => {
                        let TaskState::Backoff { until } = state else {
                            panic!("a default backoff gave {state:?}");
                        };
                        let step = RETRY_BACKOFF_BASE * (1 << (attempt.tries - 1));
                        let wait = (until - now).to_std().unwrap();
                        assert!(wait >= step / 2 && wait <= step, "backoff {wait:?}");
                        let mut again = before.clone();
                        let replay = again.fail(
                            &principal(worker),
                            token,
                            now,
                            retry,
                            &mut Jitter::seeded(seed),
                        );
                        assert_eq!(replay, Ok(state), "the same seed, the same backoff");
                        Ended::Waiting { until: Some(until) }
                    }
                };
                attempt.ended = Some(ended);
                assert_eq!(state, attempt.state());
                self.save(task, &value);
            }
            (Err(_), None) => assert_eq!(value, before, "a refused failure changed the task"),
            (outcome, valid) => panic!("fail gave {outcome:?}, model valid {valid:?}"),
        }
    }

    fn retry(&mut self, task: usize) {
        let mut value = self.load(task);
        let before = value.clone();
        let dead: Vec<usize> = self.attempts[task]
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                matches!(
                    a.ended,
                    Some(Ended::Failed | Ended::Discarded(_) | Ended::Cancelled)
                )
            })
            .map(|(index, _)| index)
            .collect();
        match value.retry() {
            Ok(retried) => {
                let retried: Vec<usize> = retried
                    .iter()
                    .map(|n| usize::from(n.as_u16()) - 1)
                    .collect();
                assert_eq!(retried, dead);
                let most = dead.iter().map(|&i| self.attempts[task][i].tries).max();
                let max_tries = self.max_tries[task].max(most.unwrap() + 1);
                self.max_tries[task] = max_tries;
                assert_eq!(value.max_tries(), max_tries);
                for index in dead {
                    self.attempts[task][index].ended = Some(Ended::Waiting { until: None });
                }
                self.save(task, &value);
            }
            Err(LeaseError::NothingToRetry) => {
                assert!(dead.is_empty());
                assert_eq!(value, before);
            }
            Err(error) => panic!("retry gave {error:?}"),
        }
    }

    fn cancel(&mut self, task: usize) {
        let mut value = self.load(task);
        let before = value.clone();
        let open: Vec<usize> = self.attempts[task]
            .iter()
            .enumerate()
            .filter(|(_, a)| !a.is_final())
            .map(|(index, _)| index)
            .collect();
        match value.cancel() {
            Ok(cancelled) => {
                let cancelled: Vec<usize> = cancelled
                    .iter()
                    .map(|n| usize::from(n.as_u16()) - 1)
                    .collect();
                assert_eq!(cancelled, open);
                for index in open {
                    self.attempts[task][index].ended = Some(Ended::Cancelled);
                }
                self.save(task, &value);
            }
            Err(LeaseError::NothingToCancel) => {
                assert!(open.is_empty());
                assert_eq!(value, before);
            }
            Err(error) => panic!("cancel gave {error:?}"),
        }
    }

    fn expire(&mut self, task: usize) {
        let mut value = self.load(task);
        let before = value.clone();
        let changed = value.expire(self.now);
        let differs: Vec<_> = before
            .attempts()
            .iter()
            .zip(value.attempts())
            .filter(|(old, new)| old != new)
            .map(|(_, new)| new.number)
            .collect();
        assert_eq!(
            changed, differs,
            "expire must report exactly what it changed"
        );
        // A recorded lapse stays recorded, even if the clock later steps back.
        let now = self.now;
        let max_tries = self.max_tries[task];
        for attempt in &mut self.attempts[task] {
            match (&attempt.latest, attempt.ended) {
                (Some(grant), None) if now >= grant.expires_at && attempt.tries >= max_tries => {
                    attempt.ended = Some(Ended::Discarded(DiscardReason::Lapsed));
                }
                (Some(grant), None) if now >= grant.expires_at => {
                    let until = grant.expires_at + lapse_backoff(task);
                    attempt.ended = Some(Ended::Waiting {
                        until: wait_until(until, now),
                    });
                }
                (_, Some(Ended::Waiting { until: Some(until) })) if until <= now => {
                    attempt.ended = Some(Ended::Waiting { until: None });
                }
                (None, None) if attempt.scheduled.is_some_and(|at| at <= now) => {
                    attempt.scheduled = None;
                }
                _ => {}
            }
        }
        self.save(task, &value);
    }

    /// Invariants that hold after every step.
    fn check_leases(&self) {
        for task in 0..TASKS.len() {
            let value = self.load(task);
            assert_eq!(
                value.last_token().map(FencingToken::as_i64),
                self.granted[task].last().copied(),
                "the task's token counter"
            );
            for (attempt, model) in value.attempts().iter().zip(&self.attempts[task]) {
                let live = value.live_lease(attempt.number, self.now);
                assert_eq!(
                    live.as_ref().map(|l| l.token().as_i64()),
                    model.live(self.now).map(|g| g.token),
                    "at most one unexpired lease per attempt, the model's"
                );
                assert_eq!(attempt.state, model.state(), "attempt state");
                assert_eq!(attempt.tries, model.tries, "tries");
                assert!(attempt.tries <= value.max_tries(), "tries within the limit");
                assert!(model.accepted <= 1);
                assert_eq!(model.accepted == 1, attempt.state == TaskState::Done);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lease_rules_hold_over_random_interleavings(ops in proptest::collection::vec(op(), 1..80)) {
        let mut model = Model::new();
        for op in &ops {
            model.step(op);
        }
    }
}
