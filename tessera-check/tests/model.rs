//! Property tests against a model of the store: histories a correct store
//! could produce (random operations of several processes, with some
//! answers lost whether or not they took effect, on a queue that is now
//! and then paused, limited, and fed tasks with unique keys, whose
//! finished tasks retention purges once their keep time has passed) pass
//! the checker, and each way of breaking the end they lead to is found.

mod script;

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};

use proptest::prelude::*;
use tessera_check::{
    AnomalyKind, AttemptState, Completion, FinalAttempt, FinalRetention, FinalState, FinalTask,
    Operation, Outcome, Receipt, check,
};

use script::{
    Enqueued, Script, at, cancel, claim, enqueue_with, fail, heartbeat, pause_queue, refused,
    resume_queue, set_limits, submit, unknown,
};

const LEASE: i64 = 60;
/// How long retention keeps done and cancelled tasks, in seconds.
const KEEP_DONE: i64 = 30;
const KEEP_CANCELLED: i64 = 60;
const QUEUE: &str = "frames";

/// What happens to one operation's answer.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// Acknowledged (or refused) as it ran.
    Answered,
    /// Applied, but the answer was lost.
    AppliedUnknown,
    /// Never applied, and the answer was lost.
    LostUnknown,
    /// The process died after invoking: no completion recorded.
    Killed,
}

#[derive(Debug, Clone)]
enum Action {
    /// An enqueue, unique under one of a few keys or not.
    Enqueue(Option<usize>),
    Claim(u32),
    Heartbeat(u32, usize),
    Submit(u32, usize),
    Replay(u32, usize),
    Fail(u32, usize),
    Cancel(usize),
    Pause,
    Resume,
    Limit(Option<u32>),
    Advance(i64),
    /// A retention pass: finished tasks past their keep time purged.
    Purge,
}

const KEYS: [&str; 3] = ["k0", "k1", "k2"];

fn action() -> impl Strategy<Value = Action> {
    let process = 1..4_u32;
    prop_oneof![
        2 => prop::option::of(0..KEYS.len()).prop_map(Action::Enqueue),
        4 => process.clone().prop_map(Action::Claim),
        2 => (process.clone(), any::<usize>()).prop_map(|(p, n)| Action::Heartbeat(p, n)),
        3 => (process.clone(), any::<usize>()).prop_map(|(p, n)| Action::Submit(p, n)),
        1 => (process.clone(), any::<usize>()).prop_map(|(p, n)| Action::Replay(p, n)),
        1 => (process, any::<usize>()).prop_map(|(p, n)| Action::Fail(p, n)),
        1 => any::<usize>().prop_map(Action::Cancel),
        1 => prop_oneof![Just(Action::Pause), Just(Action::Resume)],
        1 => prop::option::of(1..3_u32).prop_map(Action::Limit),
        2 => (0..90_i64).prop_map(Action::Advance),
        1 => Just(Action::Purge),
    ]
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        12 => Just(Fate::Answered),
        1 => Just(Fate::AppliedUnknown),
        1 => Just(Fate::LostUnknown),
        1 => Just(Fate::Killed),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Ready,
    Leased { token: i64, expires: i64 },
    Done,
    Cancelled,
}

#[derive(Debug, Clone)]
struct Task {
    last_token: i64,
    state: State,
    receipt: Option<Receipt>,
    key: Option<&'static str>,
    /// When it was done or cancelled.
    finished_at: Option<i64>,
}

/// The store, one attempt per task, and what each process believes it
/// holds.
#[derive(Debug, Default)]
struct Model {
    now: i64,
    tasks: BTreeMap<String, Task>,
    held: BTreeMap<u32, Vec<(String, i64)>>,
    script: Script,
    enqueued: usize,
    paused: bool,
    limit: Option<u32>,
    /// Tasks retention purged.
    purged: u64,
}

impl Model {
    fn live(&self, task: &str, token: i64) -> bool {
        matches!(self.tasks.get(task).map(|t| &t.state),
            Some(State::Leased { token: t, expires }) if *t == token && *expires > self.now)
    }

    /// Runs `operation` for `process`: `apply` changes the model and says
    /// what a correct store answers.
    fn step(
        &mut self,
        process: u32,
        operation: Operation,
        fate: Fate,
        apply: impl FnOnce(&mut Self) -> Completion,
    ) -> Option<Outcome> {
        let id = self.script.begin(process, self.now, operation);
        let applied = !matches!(fate, Fate::LostUnknown);
        let completion = if applied { apply(self) } else { unknown() };
        match fate {
            Fate::Answered => {
                self.script.end(id, self.now, completion.clone());
                completion.outcome().cloned()
            }
            Fate::AppliedUnknown | Fate::LostUnknown => {
                self.script.end(id, self.now, unknown());
                None
            }
            Fate::Killed => {
                // A killed process forgets every lease it held.
                self.held.remove(&process);
                None
            }
        }
    }

    fn held(&self, process: u32, pick: usize) -> Option<(String, i64)> {
        let held = self.held.get(&process)?;
        (!held.is_empty()).then(|| held[pick % held.len()].clone())
    }

    fn act(&mut self, action: Action, fate: Fate) {
        match action {
            Action::Enqueue(key) => {
                let task = format!("t{}", self.enqueued);
                self.enqueued += 1;
                let key = key.map(|k| KEYS[k]);
                let operation = enqueue_with(
                    &task,
                    Enqueued {
                        queue: Some(QUEUE),
                        unique_key: key,
                        ..Enqueued::default()
                    },
                );
                self.step(0, operation, fate, |m| {
                    // A key is held while its task is unfinished.
                    let holder = m.tasks.iter().find(|(_, t)| {
                        key.is_some()
                            && t.key == key
                            && matches!(t.state, State::Ready | State::Leased { .. })
                    });
                    if let Some((holder, _)) = holder {
                        return Completion::Ok {
                            outcome: Outcome::Duplicate { of: holder.clone() },
                        };
                    }
                    let fresh = Task {
                        last_token: 0,
                        state: State::Ready,
                        receipt: None,
                        key,
                        finished_at: None,
                    };
                    m.tasks.insert(task.clone(), fresh);
                    Completion::Ok {
                        outcome: Outcome::Enqueued,
                    }
                });
            }
            Action::Claim(process) => {
                let outcome = self.step(process, claim(), fate, |m| {
                    let now = m.now;
                    let live = m
                        .tasks
                        .values()
                        .filter(
                            |t| matches!(t.state, State::Leased { expires, .. } if expires > now),
                        )
                        .count();
                    let full = m.limit.is_some_and(|limit| live >= limit as usize);
                    if m.paused || full {
                        return Completion::Ok {
                            outcome: Outcome::Empty,
                        };
                    }
                    let claimable = m.tasks.iter_mut().find(|(_, t)| match t.state {
                        State::Ready => true,
                        State::Leased { expires, .. } => expires <= now,
                        _ => false,
                    });
                    let Some((id, task)) = claimable else {
                        return Completion::Ok {
                            outcome: Outcome::Empty,
                        };
                    };
                    task.last_token += 1;
                    let token = task.last_token;
                    task.state = State::Leased {
                        token,
                        expires: now + LEASE,
                    };
                    Completion::Ok {
                        outcome: Outcome::Granted {
                            task: id.clone(),
                            attempt: 1,
                            token,
                            granted_at: at(now),
                            expires_at: at(now + LEASE),
                        },
                    }
                });
                if let Some(Outcome::Granted { task, token, .. }) = outcome {
                    self.held.entry(process).or_default().push((task, token));
                }
            }
            Action::Heartbeat(process, pick) => {
                let Some((task, token)) = self.held(process, pick) else {
                    return;
                };
                self.step(process, heartbeat(&task, 1, token), fate, |m| {
                    if !m.tasks.contains_key(&task) {
                        return refused("task_purged");
                    }
                    if !m.live(&task, token) {
                        return refused("lease_ended");
                    }
                    let expires = m.now + LEASE;
                    m.tasks.get_mut(&task).unwrap().state = State::Leased { token, expires };
                    Completion::Ok {
                        outcome: Outcome::Extended {
                            expires_at: at(expires),
                        },
                    }
                });
            }
            Action::Submit(process, pick) | Action::Replay(process, pick) => {
                let Some((task, token)) = self.held(process, pick) else {
                    return;
                };
                let (key, digest) = (format!("k{token}"), format!("d{task}.{token}"));
                if matches!(action, Action::Submit(..)) {
                    self.held.get_mut(&process).unwrap().retain(|h| h.0 != task);
                }
                self.step(process, submit(&task, 1, token, &key, &digest), fate, |m| {
                    let now = m.now;
                    let live = m.live(&task, token);
                    let Some(stored) = m.tasks.get_mut(&task) else {
                        return refused("task_purged");
                    };
                    if let Some(receipt) = &stored.receipt {
                        if receipt.key == key && receipt.token == token {
                            return Completion::Ok {
                                outcome: Outcome::Replayed {
                                    receipt: receipt.clone(),
                                },
                            };
                        }
                    }
                    if !live {
                        return refused("stale_token");
                    }
                    let receipt = Receipt {
                        attempt: 1,
                        token,
                        key: key.clone(),
                        digest: digest.clone(),
                        accepted_at: at(now),
                    };
                    stored.receipt = Some(receipt.clone());
                    stored.state = State::Done;
                    stored.finished_at = Some(now);
                    Completion::Ok {
                        outcome: Outcome::Accepted { receipt },
                    }
                });
            }
            Action::Fail(process, pick) => {
                let Some((task, token)) = self.held(process, pick) else {
                    return;
                };
                self.held.get_mut(&process).unwrap().retain(|h| h.0 != task);
                self.step(process, fail(&task, 1, token, true), fate, |m| {
                    if !m.tasks.contains_key(&task) {
                        return refused("task_purged");
                    }
                    if !m.live(&task, token) {
                        return refused("lease_ended");
                    }
                    m.tasks.get_mut(&task).unwrap().state = State::Ready;
                    Completion::Ok {
                        outcome: Outcome::Failed,
                    }
                });
            }
            Action::Cancel(pick) => {
                if self.enqueued == 0 {
                    return;
                }
                let task = format!("t{}", pick % self.enqueued);
                let now = self.now;
                self.step(0, cancel(&task), fate, |m| match m.tasks.get_mut(&task) {
                    Some(t) if !matches!(t.state, State::Done | State::Cancelled) => {
                        t.state = State::Cancelled;
                        t.finished_at = Some(now);
                        Completion::Ok {
                            outcome: Outcome::Cancelled,
                        }
                    }
                    Some(_) => refused("nothing_to_cancel"),
                    None => refused("task_purged"),
                });
            }
            Action::Pause | Action::Resume => {
                let pause = matches!(action, Action::Pause);
                let operation = if pause { pause_queue() } else { resume_queue() };
                self.step(0, operation, fate, |m| {
                    m.paused = pause;
                    Completion::Ok {
                        outcome: Outcome::Applied,
                    }
                });
            }
            Action::Limit(limit) => {
                self.step(0, set_limits(limit, None), fate, |m| {
                    m.limit = limit;
                    Completion::Ok {
                        outcome: Outcome::Applied,
                    }
                });
            }
            Action::Advance(seconds) => self.now += seconds,
            Action::Purge => {
                let now = self.now;
                let before = self.tasks.len();
                self.tasks.retain(|_, task| {
                    let keep = match task.state {
                        State::Done => KEEP_DONE,
                        State::Cancelled => KEEP_CANCELLED,
                        _ => return true,
                    };
                    task.finished_at.is_none_or(|at| at + keep > now)
                });
                self.purged += (before - self.tasks.len()) as u64;
            }
        }
    }

    fn end(&self) -> FinalState {
        let tasks = self
            .tasks
            .iter()
            .map(|(id, task)| {
                let state = match task.state {
                    State::Ready => AttemptState::Ready,
                    State::Leased { .. } => AttemptState::Leased,
                    State::Done => AttemptState::Done,
                    State::Cancelled => AttemptState::Cancelled,
                };
                let attempt = FinalAttempt {
                    number: 1,
                    state,
                    tries: None,
                    receipts: task.receipt.iter().cloned().collect(),
                };
                let end = FinalTask {
                    last_token: (task.last_token > 0).then_some(task.last_token),
                    attempts: vec![attempt],
                };
                (id.clone(), end)
            })
            .collect();
        let retention = FinalRetention {
            done_ms: Some(KEEP_DONE as u64 * 1_000),
            discarded_ms: None,
            cancelled_ms: Some(KEEP_CANCELLED as u64 * 1_000),
            read_at: at(self.now),
            purged: [(QUEUE.to_owned(), self.purged)].into(),
        };
        FinalState {
            tasks,
            retention: Some(retention),
            ..FinalState::default()
        }
    }
}

fn run(actions: Vec<(Action, Fate)>) -> Model {
    let mut model = Model::default();
    for (action, fate) in actions {
        model.act(action, fate);
    }
    model
}

fn actions() -> impl Strategy<Value = Vec<(Action, Fate)>> {
    prop::collection::vec((action(), fate()), 1..120)
}

proptest! {
    #[test]
    fn a_correct_store_shows_no_anomaly(actions in actions()) {
        let model = run(actions);
        let report = check(&model.script.history(), &model.end());
        prop_assert!(report.is_valid(), "{:#?}", report.anomalies);
    }

    #[test]
    fn a_dropped_acknowledged_receipt_is_a_lost_submission(actions in actions(), pick: usize) {
        let model = run(actions);
        let history = model.script.history();
        // Of tasks still there: a purged task's receipts went with it.
        let acknowledged: Vec<Receipt> = history
            .steps()
            .iter()
            .filter(|step| step.operation.task().is_some_and(|t| model.tasks.contains_key(t)))
            .filter_map(|step| match step.completion.outcome() {
                Some(Outcome::Accepted { receipt } | Outcome::Replayed { receipt }) => {
                    Some(receipt.clone())
                }
                _ => None,
            })
            .collect();
        prop_assume!(!acknowledged.is_empty());
        let dropped = &acknowledged[pick % acknowledged.len()];
        let mut end = model.end();
        for task in end.tasks.values_mut() {
            task.attempts[0].receipts.retain(|r| r != dropped);
        }
        let report = check(&history, &end);
        prop_assert!(report.anomalies.iter().any(|a| a.kind == AnomalyKind::LostSubmit));
        prop_assert!(report.lost() > 0);
    }

    #[test]
    fn a_forgotten_acknowledged_enqueue_is_lost(actions in actions(), pick: usize) {
        let model = run(actions);
        let history = model.script.history();
        let acknowledged: Vec<&str> = history
            .steps()
            .iter()
            .filter(|step| step.completion.outcome() == Some(&Outcome::Enqueued))
            .filter_map(|step| step.operation.task())
            .filter(|task| model.tasks.contains_key(*task))
            .collect();
        prop_assume!(!acknowledged.is_empty());
        let mut end = model.end();
        // Every purge the audit counts shows in the history: none left
        // over to excuse a task lost.
        prop_assume!(check(&history, &end).purged.len() as u64 == model.purged);
        end.tasks.remove(acknowledged[pick % acknowledged.len()]);
        let report = check(&history, &end);
        prop_assert!(report.anomalies.iter().any(|a| a.kind == AnomalyKind::LostEnqueue));
    }

    #[test]
    fn a_rolled_back_token_counter_is_found(actions in actions(), pick: usize) {
        let model = run(actions);
        let history = model.script.history();
        let granted: Vec<(String, i64)> = history
            .steps()
            .iter()
            .filter_map(|step| match step.completion.outcome() {
                Some(Outcome::Granted { task, token, .. }) => Some((task.clone(), *token)),
                _ => None,
            })
            .filter(|(task, _)| model.tasks.contains_key(task))
            .collect();
        prop_assume!(!granted.is_empty());
        let (task, token) = &granted[pick % granted.len()];
        let mut end = model.end();
        end.tasks.get_mut(task).unwrap().last_token = Some(token - 1).filter(|t| *t > 0);
        let report = check(&history, &end);
        prop_assert!(report.anomalies.iter().any(|a| a.kind == AnomalyKind::GrantLost));
    }

    #[test]
    fn a_task_missing_while_unfinished_is_lost(actions in actions(), pick: usize) {
        let model = run(actions);
        let history = model.script.history();
        // Unfinished, acknowledged as made, and nothing that may have
        // finished it: no submission or cancel that may have happened.
        let unfinished: Vec<&String> = model
            .tasks
            .iter()
            .filter(|(_, task)| matches!(task.state, State::Ready | State::Leased { .. }))
            .map(|(id, _)| id)
            .filter(|id| {
                history.steps().iter().any(|step| {
                    step.operation.task() == Some(id.as_str())
                        && step.completion.outcome() == Some(&Outcome::Enqueued)
                })
            })
            .filter(|id| {
                !history.steps().iter().any(|step| {
                    step.operation.task() == Some(id.as_str())
                        && matches!(step.operation, Operation::Submit { .. } | Operation::Cancel { .. })
                        && step.completion.may_have_happened()
                })
            })
            .collect();
        prop_assume!(!unfinished.is_empty());
        let gone = unfinished[pick % unfinished.len()];
        let mut end = model.end();
        end.tasks.remove(gone);
        // Counted as purged, so the count does not give it away.
        *end.retention.as_mut().unwrap().purged.get_mut(QUEUE).unwrap() += 1;
        let report = check(&history, &end);
        prop_assert!(
            report.anomalies.iter().any(|a| a.kind == AnomalyKind::LostEnqueue && a.task == *gone),
            "{:#?}", report.anomalies
        );
    }

    #[test]
    fn a_done_task_missing_before_its_keep_time_is_lost(actions in actions(), pick: usize) {
        let model = run(actions);
        let history = model.script.history();
        // Done, with an acknowledged acceptance.
        let done: Vec<(&str, DateTime<Utc>)> = history
            .steps()
            .iter()
            .filter_map(|step| match step.completion.outcome() {
                Some(Outcome::Accepted { receipt }) => {
                    Some((step.operation.task()?, receipt.accepted_at))
                }
                _ => None,
            })
            .filter(|(task, _)| model.tasks.contains_key(*task))
            .collect();
        prop_assume!(!done.is_empty());
        let (gone, accepted_at) = done[pick % done.len()];
        let mut end = model.end();
        end.tasks.remove(gone);
        // Counted as purged, and read a second before its keep time
        // passed.
        let retention = end.retention.as_mut().unwrap();
        *retention.purged.get_mut(QUEUE).unwrap() += 1;
        retention.read_at = accepted_at + TimeDelta::seconds(KEEP_DONE - 1);
        let report = check(&history, &end);
        prop_assert!(
            report.anomalies.iter().any(|a| a.kind == AnomalyKind::LostEnqueue && a.task == gone),
            "{:#?}", report.anomalies
        );
        prop_assert!(report.anomalies.iter().any(|a| a.kind == AnomalyKind::LostSubmit));
        // Read when its keep time has passed, it is excused.
        end.retention.as_mut().unwrap().read_at = accepted_at + TimeDelta::seconds(KEEP_DONE);
        let report = check(&history, &end);
        prop_assert!(report.purged.iter().any(|t| t == gone), "{:#?}", report);
    }

    #[test]
    fn purges_beyond_the_audits_count_are_lost(actions in actions()) {
        let model = run(actions);
        prop_assume!(model.purged > 0);
        let history = model.script.history();
        let end = model.end();
        let report = check(&history, &end);
        // Every task a correct store purged is excused, unless nothing
        // acknowledged showed it was made (then it needs no excuse).
        prop_assert!(report.purged.len() as u64 <= model.purged);
        prop_assume!(!report.purged.is_empty());
        let mut short = end;
        short.retention.as_mut().unwrap().purged =
            [(QUEUE.to_owned(), report.purged.len() as u64 - 1)].into();
        let report = check(&history, &short);
        prop_assert!(
            report.anomalies.iter().any(|a| a.kind == AnomalyKind::LostEnqueue
                && a.task == format!("queue {QUEUE}")),
            "{:#?}", report.anomalies
        );
    }
}
