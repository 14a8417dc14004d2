//! The store's final state read raw: every task, attempt, receipt and
//! schedule-fire row of the run's namespace, straight from the tables,
//! not through the store's views (which keep one receipt per done
//! attempt), so a doubled row is there for the checker to see; and the
//! store's `purge_tasks` audit rows, which with the run's retention
//! settings and the time of the read excuse a purged task. Every row is
//! read in one snapshot.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tessera_check::{
    AttemptState, FinalAttempt, FinalFire, FinalRetention, FinalState, FinalTask, Receipt,
};
use tessera_store::{Clock as _, Output, Retention, SystemClock};

use crate::harness::{BackendKind, TestDb};

/// A task row.
struct TaskRow {
    id: i64,
    task_id: String,
    last_token: i64,
    alternatives: i64,
}

/// An attempt row.
struct AttemptRow {
    task: i64,
    number: i64,
    state: String,
    tries: i64,
}

/// A receipt row.
struct ReceiptRow {
    task: i64,
    attempt: i64,
    token: i64,
    key: String,
    digest: String,
    accepted_at: i64,
    output: Option<Vec<u8>>,
}

/// A schedule's fire row.
struct FireRow {
    schedule: String,
    run_at: i64,
    task_id: String,
}

/// The rows of one namespace.
#[derive(Default)]
struct Rows {
    tasks: Vec<TaskRow>,
    attempts: Vec<AttemptRow>,
    receipts: Vec<ReceiptRow>,
    fires: Vec<FireRow>,
    /// The resources of the `purge_tasks` audit rows (`queue:<q>/n<count>`).
    purges: Vec<Option<String>>,
}

const TASKS: &str =
    "SELECT id, task_id, last_token, alternatives FROM tasks WHERE namespace = $1 ORDER BY id";
const ATTEMPTS: &str =
    "SELECT task, number, state, tries FROM attempts WHERE namespace = $1 ORDER BY task, number";
/// Receipts, each in the row of the attempt it ended.
const RECEIPTS: &str = "SELECT task, number AS attempt, token, idempotency_key, digest, \
     accepted_at, output FROM attempts \
     WHERE namespace = $1 AND idempotency_key IS NOT NULL ORDER BY accepted_at, task, number";
const FIRES: &str = "SELECT schedule, run_at, task_id FROM schedule_fires \
     WHERE namespace = $1 ORDER BY id";
const PURGES: &str = "SELECT resource FROM access_audit \
     WHERE namespace = $1 AND action = 'purge_tasks' ORDER BY id";

fn sqlite_rows(db: &TestDb, namespace: &str) -> Rows {
    let connection = rusqlite::Connection::open(db.sqlite_path().unwrap()).unwrap();
    // One read transaction: one snapshot of every table.
    connection.execute_batch("BEGIN").unwrap();
    let sql = |text: &str| text.replace('$', "?");
    let mut rows = Rows::default();
    let mut tasks = connection.prepare(&sql(TASKS)).unwrap();
    rows.tasks = tasks
        .query_map([namespace], |row| {
            Ok(TaskRow {
                id: row.get(0)?,
                task_id: row.get(1)?,
                last_token: row.get(2)?,
                alternatives: row.get(3)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut attempts = connection.prepare(&sql(ATTEMPTS)).unwrap();
    rows.attempts = attempts
        .query_map([namespace], |row| {
            Ok(AttemptRow {
                task: row.get(0)?,
                number: row.get(1)?,
                state: row.get(2)?,
                tries: row.get(3)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut receipts = connection.prepare(&sql(RECEIPTS)).unwrap();
    rows.receipts = receipts
        .query_map([namespace], |row| {
            Ok(ReceiptRow {
                task: row.get(0)?,
                attempt: row.get(1)?,
                token: row.get(2)?,
                key: row.get(3)?,
                digest: row.get(4)?,
                accepted_at: row.get(5)?,
                output: row.get(6)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut fires = connection.prepare(&sql(FIRES)).unwrap();
    rows.fires = fires
        .query_map([namespace], |row| {
            Ok(FireRow {
                schedule: row.get(0)?,
                run_at: row.get(1)?,
                task_id: row.get(2)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut purges = connection.prepare(&sql(PURGES)).unwrap();
    rows.purges = purges
        .query_map([namespace], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    drop((tasks, attempts, receipts, fires, purges));
    connection.execute_batch("COMMIT").unwrap();
    rows
}

fn postgres_rows(db: &TestDb, namespace: &str) -> Rows {
    let (url, schema) = db.postgres_place();
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("SET search_path TO \"{schema}\""))
        .unwrap();
    // One repeatable-read transaction: one snapshot of every table.
    let mut snapshot = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .unwrap();
    let query = |client: &mut postgres::Transaction<'_>, sql: &str| {
        client.query(sql, &[&namespace]).unwrap()
    };
    let client = &mut snapshot;
    let rows = Rows {
        tasks: query(client, TASKS)
            .iter()
            .map(|row| TaskRow {
                id: row.get(0),
                task_id: row.get(1),
                last_token: row.get(2),
                alternatives: row.get(3),
            })
            .collect(),
        attempts: query(client, ATTEMPTS)
            .iter()
            .map(|row| AttemptRow {
                task: row.get(0),
                number: row.get(1),
                state: row.get(2),
                tries: row.get(3),
            })
            .collect(),
        receipts: query(client, RECEIPTS)
            .iter()
            .map(|row| ReceiptRow {
                task: row.get(0),
                attempt: row.get(1),
                token: row.get(2),
                key: row.get(3),
                digest: row.get(4),
                accepted_at: row.get(5),
                output: row.get(6),
            })
            .collect(),
        fires: query(client, FIRES)
            .iter()
            .map(|row| FireRow {
                schedule: row.get(0),
                run_at: row.get(1),
                task_id: row.get(2),
            })
            .collect(),
        purges: query(client, PURGES).iter().map(|row| row.get(0)).collect(),
    };
    snapshot.commit().unwrap();
    rows
}

fn millis(at: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at).unwrap()
}

fn state_of(state: &str) -> AttemptState {
    match state {
        "ready" => AttemptState::Ready,
        "leased" => AttemptState::Leased,
        "done" => AttemptState::Done,
        "failed" => AttemptState::Failed,
        "discarded" => AttemptState::Discarded,
        "cancelled" => AttemptState::Cancelled,
        "backoff" | "scheduled" | "waiting" => AttemptState::Waiting,
        other => panic!("an attempt state the checker does not know: {other}"),
    }
}

/// Every row of `namespace` on `db`, as the checker reads a final state:
/// each receipt row on its own (its digest read back from the stored
/// output where one is kept), each task's alternatives, and each
/// schedule's fire rows, with no run-at listed as due yet; and the
/// run's `retention` with the tasks the audit counts purged, by queue,
/// and the time the read ended.
pub(crate) fn final_state(db: &TestDb, namespace: &str, retention: &Retention) -> FinalState {
    let rows = match db.kind() {
        BackendKind::Sqlite => sqlite_rows(db, namespace),
        BackendKind::Postgres => postgres_rows(db, namespace),
    };
    let read_at = SystemClock.now_utc();
    let names: BTreeMap<i64, &str> = rows
        .tasks
        .iter()
        .map(|task| (task.id, task.task_id.as_str()))
        .collect();
    let mut end = FinalState::default();
    for task in &rows.tasks {
        let attempts = rows
            .attempts
            .iter()
            .filter(|attempt| attempt.task == task.id)
            .map(|attempt| FinalAttempt {
                tries: Some(u32::try_from(attempt.tries).unwrap()),
                ..FinalAttempt::new(
                    u32::try_from(attempt.number).unwrap(),
                    state_of(&attempt.state),
                )
            })
            .collect();
        end.tasks.insert(
            task.task_id.clone(),
            FinalTask {
                last_token: (task.last_token > 0).then_some(task.last_token),
                attempts,
            },
        );
        end.alternatives.insert(
            task.task_id.clone(),
            u16::try_from(task.alternatives).unwrap(),
        );
    }
    for row in &rows.receipts {
        let digest = row.output.as_ref().map_or_else(
            || row.digest.clone(),
            |bytes| Output::bytes(bytes.clone()).payload_digest().to_string(),
        );
        end.receipts.push(tessera_check::FinalReceipt {
            task: names[&row.task].to_owned(),
            receipt: Receipt {
                attempt: u32::try_from(row.attempt).unwrap(),
                token: row.token,
                key: row.key.clone(),
                digest,
                accepted_at: millis(row.accepted_at),
            },
        });
    }
    for fire in &rows.fires {
        end.schedules
            .entry(fire.schedule.clone())
            .or_default()
            .fires
            .push(FinalFire {
                run_at: millis(fire.run_at),
                task: fire.task_id.clone(),
            });
    }
    let millis = |keep: Option<std::time::Duration>| {
        keep.map(|keep| u64::try_from(keep.as_millis()).unwrap())
    };
    let mut purged: BTreeMap<String, u64> = BTreeMap::new();
    for resource in &rows.purges {
        let (queue, count) = resource
            .as_deref()
            .and_then(|r| r.strip_prefix("queue:"))
            .and_then(|r| r.rsplit_once("/n"))
            .and_then(|(queue, count)| Some((queue, count.parse::<u64>().ok()?)))
            .unwrap_or_else(|| panic!("a purge_tasks audit row names no count: {resource:?}"));
        *purged.entry(queue.to_owned()).or_default() += count;
    }
    end.retention = Some(FinalRetention {
        done_ms: millis(retention.done),
        discarded_ms: millis(retention.discarded),
        cancelled_ms: millis(retention.cancelled),
        read_at,
        purged,
    });
    end
}
