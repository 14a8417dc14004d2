//! The `attempts` table: a task's attempts and their writes, progress,
//! the listing by state, bulk actions' pages, finished attempts for
//! retention, and lapsed leases.
//!
//! An attempt row is read on every claim, ack and heartbeat, so it is
//! read by position as a task row is (see [`tasks`](super::tasks)):
//! [`COLUMNS`] names them in statement order.

use rusqlite::{Row, params};

use super::position;
use crate::backend::rows::{AttemptRow, ListingRow, MatchingRow, ReceiptColumns};
use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

/// An attempt row's columns, in the order [`ATTEMPTS_OF_TASK`] selects
/// them.
pub(crate) const COLUMNS: [&str; 11] = [
    "number",
    "state",
    "until_at",
    "tries",
    "holder",
    "token",
    "granted_at",
    "expires_at",
    "lapses_at",
    "discarded",
    "last_error",
];

/// The position of an attempt column in [`COLUMNS`], found at compile
/// time.
macro_rules! column {
    ($name:literal) => {
        const { position(&COLUMNS, $name) }
    };
}

impl AttemptRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            number: row.get(column!("number"))?,
            state: row.get(column!("state"))?,
            until_at: row.get(column!("until_at"))?,
            tries: row.get(column!("tries"))?,
            holder: row.get(column!("holder"))?,
            token: row.get(column!("token"))?,
            granted_at: row.get(column!("granted_at"))?,
            expires_at: row.get(column!("expires_at"))?,
            lapses_at: row.get(column!("lapses_at"))?,
            discarded: row.get(column!("discarded"))?,
            last_error: row.get(column!("last_error"))?,
        })
    }
}

pub(crate) const INSERT_ATTEMPT: &str = "INSERT INTO attempts (task, number, namespace, queue, \
     state, until_at, tries, priority, changed_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8)";

/// Inserts a new attempt, never yet tried, in its first state (ready or
/// scheduled), with its task's priority.
pub(crate) fn insert_attempt(
    writer: &Writer<'_>,
    task: i64,
    namespace: &str,
    queue: &str,
    priority: i64,
    row: &AttemptRow,
    changed_at: i64,
) -> rusqlite::Result<()> {
    writer.execute(
        INSERT_ATTEMPT,
        params![
            task,
            row.number,
            namespace,
            queue,
            row.state,
            row.until_at,
            priority,
            changed_at
        ],
    )?;
    Ok(())
}

pub(crate) const ATTEMPTS_OF_TASK: &str = "SELECT number, state, until_at, tries, holder, token, \
     granted_at, expires_at, lapses_at, discarded, last_error FROM attempts WHERE task = ?1 \
     ORDER BY number";

/// A task's attempts in number order.
pub(crate) fn attempts_of_task(
    reader: &Reader<'_>,
    task: i64,
) -> rusqlite::Result<Vec<AttemptRow>> {
    reader.all(ATTEMPTS_OF_TASK, [task], AttemptRow::from_row)
}

pub(crate) const UPDATE_ATTEMPT: &str = "UPDATE attempts SET state = ?3, until_at = ?4, \
     tries = ?5, holder = ?6, token = ?7, granted_at = ?8, expires_at = ?9, lapses_at = ?10, \
     discarded = ?11, last_error = ?12, changed_at = coalesce(?13, changed_at) \
     WHERE task = ?1 AND number = ?2";

/// Writes every column of an attempt, and when it changed (kept if
/// `None`).
pub(crate) fn update_attempt(
    writer: &Writer<'_>,
    task: i64,
    row: &AttemptRow,
    changed_at: Option<i64>,
) -> rusqlite::Result<()> {
    writer.execute(
        UPDATE_ATTEMPT,
        params![
            task,
            row.number,
            row.state,
            row.until_at,
            row.tries,
            row.holder,
            row.token,
            row.granted_at,
            row.expires_at,
            row.lapses_at,
            row.discarded,
            row.last_error,
            changed_at,
        ],
    )?;
    Ok(())
}

pub(crate) const UPDATE_ATTEMPT_STATE: &str = "UPDATE attempts SET state = ?3, until_at = ?4, \
     lapses_at = ?5, discarded = ?6, last_error = ?7, changed_at = coalesce(?8, changed_at) \
     WHERE task = ?1 AND number = ?2";

/// [`UPDATE_ATTEMPT_STATE`] of a submission: the state and the receipt
/// it ended the attempt with, in one row write.
pub(crate) const UPDATE_ATTEMPT_RECEIPT: &str = "UPDATE attempts SET state = ?3, until_at = ?4, \
     lapses_at = ?5, discarded = ?6, last_error = ?7, changed_at = coalesce(?8, changed_at), \
     idempotency_key = ?9, digest = ?10, accepted_at = ?11, output = ?12 \
     WHERE task = ?1 AND number = ?2";

/// Writes an attempt's state alone (and its lapse time, which only a
/// leased attempt has), with the receipt of the submission that ended
/// it, if one did.
pub(crate) fn update_attempt_state(
    writer: &Writer<'_>,
    task: i64,
    row: &AttemptRow,
    changed_at: Option<i64>,
    receipt: Option<&ReceiptColumns>,
) -> rusqlite::Result<()> {
    let state = params![
        task,
        row.number,
        row.state,
        row.until_at,
        row.lapses_at,
        row.discarded,
        row.last_error,
        changed_at
    ];
    match receipt {
        None => writer.execute(UPDATE_ATTEMPT_STATE, state)?,
        Some(receipt) => {
            let mut all: Vec<&dyn rusqlite::ToSql> = state.to_vec();
            all.extend([
                &receipt.idempotency_key as &dyn rusqlite::ToSql,
                &receipt.digest,
                &receipt.accepted_at,
                &receipt.output,
            ]);
            writer.execute(UPDATE_ATTEMPT_RECEIPT, all.as_slice())?
        }
    };
    Ok(())
}

pub(crate) const EXTEND_ATTEMPT: &str = "UPDATE attempts SET expires_at = ?3, lapses_at = ?4 \
     WHERE task = ?1 AND number = ?2";

/// Writes an attempt's lease expiry and lapse time alone: its row and its
/// `attempts_leased` entry.
pub(crate) fn extend_attempt(
    writer: &Writer<'_>,
    task: i64,
    row: &AttemptRow,
) -> rusqlite::Result<()> {
    writer.execute(
        EXTEND_ATTEMPT,
        params![task, row.number, row.expires_at, row.lapses_at],
    )?;
    Ok(())
}

/// [`EXTEND_ATTEMPT`] with the progress value a heartbeat carried.
pub(crate) const EXTEND_ATTEMPT_PROGRESS: &str = "UPDATE attempts SET expires_at = ?3, \
     lapses_at = ?4, progress = ?5 WHERE task = ?1 AND number = ?2";

/// An attempt's progress value alone (a heartbeat that moved no expiry).
pub(crate) const UPDATE_PROGRESS: &str =
    "UPDATE attempts SET progress = ?3 WHERE task = ?1 AND number = ?2";

/// Writes an attempt's lease expiry and lapse time with a heartbeat's
/// progress value, or (without an expiry, `row` `None`) the progress alone.
pub(crate) fn save_progress(
    writer: &Writer<'_>,
    task: i64,
    number: i64,
    row: Option<&AttemptRow>,
    progress: &str,
) -> rusqlite::Result<()> {
    match row {
        Some(row) => writer.execute(
            EXTEND_ATTEMPT_PROGRESS,
            params![task, number, row.expires_at, row.lapses_at, progress],
        )?,
        None => writer.execute(UPDATE_PROGRESS, params![task, number, progress])?,
    };
    Ok(())
}

/// The progress values of a task's attempts, in number order.
pub(crate) const PROGRESS_OF_TASK: &str = "SELECT number, progress FROM attempts \
     WHERE task = ?1 AND progress IS NOT NULL ORDER BY number";

/// The progress values of a task's attempts.
pub(crate) fn progress_of_task(
    reader: &Reader<'_>,
    task: i64,
) -> rusqlite::Result<Vec<(i64, String)>> {
    reader.all(PROGRESS_OF_TASK, [task], |row| {
        Ok((row.get("number")?, row.get("progress")?))
    })
}

/// A listing's columns and join, followed by `$tail`.
macro_rules! select_listing {
    ($tail:literal) => {
        concat!(
            "SELECT a.id AS position, a.number, a.state, a.until_at, a.discarded, a.tries, ",
            "t.queue, t.task_id, t.version, t.partition_key, a.progress, a.changed_at ",
            "FROM attempts a JOIN tasks t ON t.id = a.task ",
            "WHERE a.namespace = ?1 AND a.state = ?2 ",
            $tail
        )
    };
}

/// A namespace's attempts in one state after attempt row `?3`, oldest
/// first: one range of `attempts_state`, whose entries end in the row id
/// (attempts are inserted at enqueue, so row ids are enqueue order), each
/// task by its row id.
pub(crate) const TASKS_BY_STATE_OLDEST: &str =
    select_listing!("AND a.id > ?3 ORDER BY a.id LIMIT ?4");

/// [`TASKS_BY_STATE_OLDEST`] newest first, before row `?3`.
pub(crate) const TASKS_BY_STATE_NEWEST: &str =
    select_listing!("AND a.id < ?3 ORDER BY a.id DESC LIMIT ?4");

impl ListingRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            position: row.get("position")?,
            number: row.get("number")?,
            state: row.get("state")?,
            until_at: row.get("until_at")?,
            discarded: row.get("discarded")?,
            tries: row.get("tries")?,
            changed_at: row.get("changed_at")?,
            queue: row.get("queue")?,
            task_id: row.get("task_id")?,
            version: row.get("version")?,
            partition_key: row.get("partition_key")?,
            progress: row.get("progress")?,
        })
    }
}

/// A page of a namespace's attempts in `state`, after attempt row
/// `after` in the order `sql` ([`TASKS_BY_STATE_OLDEST`] or
/// [`TASKS_BY_STATE_NEWEST`]) lists them.
pub(crate) fn tasks_by_state(
    reader: &Reader<'_>,
    sql: &str,
    namespace: &str,
    state: &str,
    after: i64,
    limit: i64,
) -> rusqlite::Result<Vec<ListingRow>> {
    reader.all(
        sql,
        params![namespace, state, after, limit],
        ListingRow::from_row,
    )
}

/// A bulk filter's page of a namespace's attempts whose state is
/// `$state` (a comparison with `'leased'`), after position (`?2`, `?3`,
/// `?4`) in (changed_at, task, number) order, whose state changed at or
/// before `?5`, of queue `?6`, in state `?7` and of partition key `?9`
/// where those are set, each with its task's reference: one range of
/// `attempts_changed`.
macro_rules! attempts_matching {
    ($state:literal) => {
        concat!(
            "SELECT a.changed_at, a.task, a.number, t.task_id, t.version ",
            "FROM attempts a JOIN tasks t ON t.id = a.task ",
            "WHERE a.namespace = ?1 AND (a.changed_at, a.task, a.number) > (?2, ?3, ?4) ",
            "AND a.changed_at <= ?5 AND a.state ",
            $state,
            " AND (?6 IS NULL OR a.queue = ?6) AND (?7 IS NULL OR a.state = ?7) ",
            "AND (?9 IS NULL OR t.partition_key = ?9) ",
            "ORDER BY a.changed_at, a.task, a.number LIMIT ?8"
        )
    };
}
/// The attempts at rest (not leased) a bulk filter matches.
pub(crate) const ATTEMPTS_MATCHING: &str = attempts_matching!("<> 'leased'");
/// The leased attempts a bulk filter matches.
pub(crate) const LEASED_MATCHING: &str = attempts_matching!("= 'leased'");

/// One page of attempts matching a bulk filter (see [`ATTEMPTS_MATCHING`],
/// or [`LEASED_MATCHING`] when `leased`): each one's position, then its
/// task's id and version.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attempts_matching(
    reader: &Reader<'_>,
    leased: bool,
    namespace: &str,
    after: (i64, i64, i64),
    upto: i64,
    queue: Option<&str>,
    state: Option<&str>,
    partition: Option<&str>,
    limit: i64,
) -> rusqlite::Result<Vec<MatchingRow>> {
    reader.all(
        if leased {
            LEASED_MATCHING
        } else {
            ATTEMPTS_MATCHING
        },
        params![
            namespace, after.0, after.1, after.2, upto, queue, state, limit, partition
        ],
        |row| {
            Ok((
                (row.get("changed_at")?, row.get("task")?, row.get("number")?),
                row.get("task_id")?,
                row.get("version")?,
            ))
        },
    )
}

/// Attempts of namespace `?6` in state `?1` that reached it at or before
/// `?2`, after `(?3, ?4)` in (changed_at, task) order, at most `?5`: one
/// range of `attempts_changed`, the state read beside it.
pub(crate) const FINISHED_ATTEMPTS: &str = "SELECT changed_at, task FROM attempts \
     WHERE namespace = ?6 AND (changed_at, task) > (?3, ?4) AND changed_at <= ?2 \
     AND state = ?1 ORDER BY changed_at, task LIMIT ?5";

/// Finished attempts' positions (see [`FINISHED_ATTEMPTS`]).
pub(crate) fn finished_attempts(
    reader: &Reader<'_>,
    namespace: &str,
    state: &str,
    cutoff: i64,
    after: (i64, i64),
    limit: i64,
) -> rusqlite::Result<Vec<(i64, i64)>> {
    reader.all(
        FINISHED_ATTEMPTS,
        params![state, cutoff, after.0, after.1, limit, namespace],
        |row| Ok((row.get("changed_at")?, row.get("task")?)),
    )
}

/// A task's attempts: state and when it was reached.
pub(crate) const ATTEMPT_ENDS: &str =
    "SELECT state, changed_at FROM attempts WHERE task = ?1 ORDER BY number";

/// A task's attempts' states and when each was reached.
pub(crate) fn attempt_ends(reader: &Reader<'_>, id: i64) -> rusqlite::Result<Vec<(String, i64)>> {
    reader.all(ATTEMPT_ENDS, [id], |row| {
        Ok((row.get("state")?, row.get("changed_at")?))
    })
}

/// Leased attempts of a namespace whose lease expired, at most `?3`.
pub(crate) const LAPSED_LEASES: &str = "SELECT task FROM attempts \
     WHERE namespace = ?1 AND state = 'leased' AND expires_at <= ?2 LIMIT ?3";

/// [`LAPSED_LEASES`] of one queue (`?4`), the longest expired first.
pub(crate) const LAPSED_IN_QUEUE: &str = "SELECT task FROM attempts \
     WHERE namespace = ?1 AND queue = ?4 AND state = 'leased' AND expires_at <= ?2 \
     ORDER BY expires_at, task LIMIT ?3";

/// Tasks with an expired lease in a namespace, at most `limit`.
pub(crate) fn lapsed_leases(
    reader: &Reader<'_>,
    namespace: &str,
    queue: Option<&str>,
    now: i64,
    limit: i64,
) -> rusqlite::Result<Vec<i64>> {
    match queue {
        Some(queue) => reader.all(
            LAPSED_IN_QUEUE,
            params![namespace, now, limit, queue],
            |row| row.get(0),
        ),
        None => reader.all(LAPSED_LEASES, params![namespace, now, limit], |row| {
            row.get(0)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::{SqliteBackend, SqliteOptions};

    #[test]
    fn the_attempt_statement_selects_the_columns_in_their_order() {
        let backend = SqliteBackend::for_tests(SqliteOptions::in_memory());
        let columns = backend
            .with_reader(|reader| reader.columns(ATTEMPTS_OF_TASK))
            .unwrap();
        assert_eq!(columns, COLUMNS);
    }
}
