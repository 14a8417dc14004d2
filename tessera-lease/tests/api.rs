//! Public-API tests: the rules driven the way a SQL store drives them, one
//! load, one rule and one write per transaction, through plain columns.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tessera_lease::{
    ArtifactKey, AttemptNumber, AttemptRecord, BriefVersion, Digest, FencingToken, IdempotencyKey,
    Jitter, LeaseError, LeaseRecord, Namespace, Principal, QueueName, Receipt, Retry, StateName,
    Submission, Submitted, Task, TaskId, TaskRecord, TaskSpec, TaskState,
};

const LEASE: Duration = Duration::from_secs(30);

fn at(seconds: i64) -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::seconds(seconds)
}

fn who(name: &str) -> Principal {
    Principal::parse(name).unwrap()
}

/// A `tasks` row.
struct TaskRow {
    version: u32,
    lapse_backoff_ms: i64,
    max_tries: u32,
    last_token: i64,
}

/// An `attempts` row, keyed by (task, number).
#[derive(Clone)]
struct AttemptRow {
    state: String,
    until: Option<DateTime<Utc>>,
    discarded: Option<String>,
    last_error: Option<String>,
    tries: i64,
    holder: Option<String>,
    token: Option<i64>,
    granted_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
}

/// Three tables as maps: tasks, attempts, receipts (stored as JSON text).
#[derive(Default)]
struct Rows {
    tasks: HashMap<String, TaskRow>,
    attempts: HashMap<(String, u16), AttemptRow>,
    receipts: HashMap<(String, String, String), String>,
}

impl Rows {
    fn write(&mut self, task: &Task) {
        let record = task.record();
        let id = record.id.to_string();
        self.tasks.insert(
            id.clone(),
            TaskRow {
                version: record.version.as_u32(),
                lapse_backoff_ms: i64::try_from(record.lapse_backoff.as_millis()).unwrap(),
                max_tries: record.max_tries,
                last_token: record.last_token.map_or(0, FencingToken::as_i64),
            },
        );
        for attempt in &record.attempts {
            let lease = attempt.lease.as_ref();
            self.attempts.insert(
                (id.clone(), attempt.number.as_u16()),
                AttemptRow {
                    state: attempt.state.as_str().to_owned(),
                    until: attempt.state.until(),
                    discarded: attempt
                        .state
                        .discard_reason()
                        .map(|r| r.as_str().to_owned()),
                    last_error: attempt.last_error.clone(),
                    tries: i64::from(attempt.tries),
                    holder: lease.map(|l| l.holder.to_string()),
                    token: lease.map(|l| l.token.as_i64()),
                    granted_at: lease.map(|l| l.granted_at),
                    expires_at: lease.map(|l| l.expires_at),
                },
            );
        }
    }

    fn load(&self, id: &str) -> Task {
        let row = &self.tasks[id];
        let mut attempts = Vec::new();
        for number in 1u16.. {
            let Some(a) = self.attempts.get(&(id.to_owned(), number)) else {
                break;
            };
            let state = TaskState::from_parts(
                a.state.parse::<StateName>().unwrap(),
                a.until,
                a.discarded.as_deref().map(|r| r.parse().unwrap()),
            );
            let lease = a.token.map(|token| LeaseRecord {
                holder: a.holder.as_deref().unwrap().parse().unwrap(),
                token: FencingToken::new(token).unwrap(),
                granted_at: a.granted_at.unwrap(),
                expires_at: a.expires_at.unwrap(),
            });
            attempts.push(AttemptRecord {
                number: AttemptNumber::new(number).unwrap(),
                state: state.unwrap(),
                tries: u32::try_from(a.tries).unwrap(),
                lease,
                last_error: a.last_error.clone(),
            });
        }
        Task::restore(TaskRecord {
            id: TaskId::parse(id).unwrap(),
            version: BriefVersion::new(row.version).unwrap(),
            lapse_backoff: Duration::from_millis(u64::try_from(row.lapse_backoff_ms).unwrap()),
            max_tries: row.max_tries,
            priority: 0,
            lease_duration: None,
            deadline: None,
            last_token: (row.last_token > 0).then(|| FencingToken::new(row.last_token).unwrap()),
            attempts,
        })
        .unwrap()
    }

    fn stored_receipt(&self, sub: &Submission, task: &str) -> Option<Receipt> {
        let scope = (
            sub.principal.to_string(),
            task.to_owned(),
            sub.key.to_string(),
        );
        self.receipts
            .get(&scope)
            .map(|json| serde_json::from_str(json).unwrap())
    }

    /// One submit transaction; returns the response body.
    fn submit(
        &mut self,
        task: &str,
        sub: &Submission,
        now: DateTime<Utc>,
    ) -> Result<String, LeaseError> {
        let mut value = self.load(task);
        let stored = self.stored_receipt(sub, task);
        match value.submit(sub, stored.as_ref(), now)? {
            Submitted::Accepted(receipt) => {
                let json = serde_json::to_string(&receipt).unwrap();
                let scope = (
                    sub.principal.to_string(),
                    task.to_owned(),
                    sub.key.to_string(),
                );
                self.receipts.insert(scope, json.clone());
                self.write(&value);
                Ok(json)
            }
            Submitted::Replayed(receipt) => Ok(serde_json::to_string(&receipt).unwrap()),
        }
    }
}

fn submission(principal: &str, token: FencingToken, key: &str, digest: u8) -> Submission {
    Submission {
        principal: who(principal),
        token,
        key: IdempotencyKey::parse(key).unwrap(),
        digest: Digest::from_bytes([digest; 32]),
    }
}

#[test]
fn a_store_loads_applies_one_rule_and_writes_back() {
    let mut rows = Rows::default();
    let id = TaskId::parse("render-1").unwrap();
    rows.write(&Task::new(id, BriefVersion::FIRST, TaskSpec::default()).unwrap());

    let mut task = rows.load("render-1");
    let lease = task.claim(&who("alice"), at(0), LEASE).unwrap();
    rows.write(&task);
    assert_eq!(rows.attempts[&("render-1".into(), 1)].state, "leased");
    assert_eq!(rows.tasks["render-1"].last_token, 1);

    let mut task = rows.load("render-1");
    task.heartbeat(&who("alice"), lease.token(), at(20), LEASE)
        .unwrap();
    rows.write(&task);
    assert_eq!(
        rows.attempts[&("render-1".into(), 1)].expires_at,
        Some(at(50))
    );

    let sub = submission("alice", lease.token(), "upload-1", 3);
    let first = rows.submit("render-1", &sub, at(40)).unwrap();
    assert_eq!(rows.attempts[&("render-1".into(), 1)].state, "done");
    // A retry, long after the lease, gets the same bytes back.
    assert_eq!(rows.submit("render-1", &sub, at(4000)).unwrap(), first);
    let changed = submission("alice", lease.token(), "upload-1", 4);
    assert_eq!(
        rows.submit("render-1", &changed, at(4000)),
        Err(LeaseError::IdempotencyConflict)
    );
}

#[test]
fn an_expired_lease_never_overwrites_a_newer_result() {
    let mut rows = Rows::default();
    let id = TaskId::parse("t").unwrap();
    rows.write(&Task::new(id, BriefVersion::FIRST, TaskSpec::default()).unwrap());
    let mut task = rows.load("t");
    let slow = task.claim(&who("slow"), at(0), LEASE).unwrap();
    rows.write(&task);

    let mut task = rows.load("t");
    let fast = task.claim(&who("fast"), at(31), LEASE).unwrap();
    rows.write(&task);
    assert!(fast.token() > slow.token());
    assert_ne!(fast.artifact(), slow.artifact());
    rows.submit("t", &submission("fast", fast.token(), "k", 1), at(32))
        .unwrap();

    let late = rows.submit("t", &submission("slow", slow.token(), "k", 2), at(33));
    assert_eq!(
        late,
        Err(LeaseError::StaleToken {
            token: slow.token()
        })
    );
}

#[test]
fn competing_attempts_finish_independently_and_are_compared() {
    let mut rows = Rows::default();
    let spec = TaskSpec {
        alternatives: 3,
        lapse_backoff: Duration::from_secs(10),
        ..TaskSpec::default()
    };
    let id = TaskId::parse("essay-7").unwrap();
    rows.write(&Task::new(id, BriefVersion::new(2).unwrap(), spec).unwrap());

    let mut leases = Vec::new();
    for worker in ["a", "b", "c"] {
        let mut task = rows.load("essay-7");
        leases.push(task.claim(&who(worker), at(0), LEASE).unwrap());
        rows.write(&task);
    }
    // b's lease lapses; a sweep records it and the others are untouched.
    let mut task = rows.load("essay-7");
    task.heartbeat(&who("a"), leases[0].token(), at(25), LEASE)
        .unwrap();
    task.heartbeat(&who("c"), leases[2].token(), at(25), LEASE)
        .unwrap();
    assert_eq!(task.expire(at(31)), [AttemptNumber::new(2).unwrap()]);
    rows.write(&task);
    assert_eq!(rows.attempts[&("essay-7".into(), 2)].state, "backoff");
    assert_eq!(rows.attempts[&("essay-7".into(), 1)].state, "leased");

    // a submits; d takes b's attempt after its backoff; c gives up.
    rows.submit(
        "essay-7",
        &submission("a", leases[0].token(), "k", 1),
        at(32),
    )
    .unwrap();
    let mut task = rows.load("essay-7");
    assert_eq!(
        task.claim(&who("d"), at(35), LEASE),
        Err(LeaseError::NoAttemptReady { next_at: at(40) })
    );
    let d = task.claim(&who("d"), at(40), LEASE).unwrap();
    assert_eq!(d.attempt(), AttemptNumber::new(2).unwrap());
    assert_eq!(d.token().as_i64(), 4);
    task.fail(
        &who("c"),
        leases[2].token(),
        at(41),
        Retry::Never,
        &mut Jitter::seeded(0),
    )
    .unwrap();
    rows.write(&task);
    rows.submit("essay-7", &submission("d", d.token(), "k", 2), at(42))
        .unwrap();

    let task = rows.load("essay-7");
    assert!(task.is_finished());
    let receipts: Vec<Receipt> = rows
        .receipts
        .values()
        .map(|json| serde_json::from_str(json).unwrap())
        .collect();
    let finished = task.alternatives(&receipts);
    let summary: Vec<(u16, &str, &str)> = finished
        .iter()
        .map(|r| {
            (
                r.attempt.as_u16(),
                r.principal.as_str(),
                r.artifact.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [(1, "a", "essay-7.a1.t1"), (2, "d", "essay-7.a2.t4")]
    );
    assert!(finished.iter().all(|r| r.version.as_u32() == 2));
}

#[test]
fn names_are_validated_wherever_they_come_from() {
    assert!("main".parse::<Namespace>().is_ok());
    assert!("claims.high".parse::<QueueName>().is_ok());
    assert!("../etc".parse::<TaskId>().is_err());
    assert!(serde_json::from_str::<ArtifactKey>("\"a/b\"").is_err());
    assert!(serde_json::from_str::<IdempotencyKey>("\"\"").is_err());
    let err = Namespace::parse(&"x".repeat(65)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid namespace (length 65): longer than 64 bytes"
    );
    let err = TaskId::parse("a b").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid task id (length 3): byte 1 is not an ascii letter, digit, '-', '_' or '.'"
    );
    // A task record with a bad name inside fails as a whole.
    let json = serde_json::to_string(
        &Task::new(
            TaskId::parse("ok").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(serde_json::from_str::<Task>(&json.replace("\"ok\"", "\".ok\"")).is_err());
}

#[test]
fn refusals_are_typed_and_read_plainly() {
    let mut task = Task::new(
        TaskId::parse("t").unwrap(),
        BriefVersion::FIRST,
        TaskSpec::default(),
    )
    .unwrap();
    let lease = task.claim(&who("a"), at(0), LEASE).unwrap();
    let err = task
        .heartbeat(&who("b"), lease.token(), at(1), LEASE)
        .unwrap_err();
    assert_eq!(err.to_string(), "lease 1 is held by another principal");
    let err = task
        .submit(&submission("a", lease.token(), "k", 1), None, at(30))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "lease 1 expired at 2026-10-29 12:00:30 UTC"
    );
}
