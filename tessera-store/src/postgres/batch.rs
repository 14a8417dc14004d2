//! Set-based statements on PostgreSQL: many tasks, receipts or audit rows
//! in one statement each, their values passed as arrays and read back
//! with `unnest`, so a batch of any size costs the same round trips.

use std::collections::HashMap;

use tessera_audit::AuditEvent;

use super::rows::{attempt_row, receipt_row, task_row, version};
use super::transactions::PgTransaction;
use crate::backend::rows::{
    AttemptRow, AttemptWrite, EventRow, TaskRow, TaskWrites, claimable_column, corrupt,
    duration_millis, millis,
};
use crate::backend::{LoadedTask, NewReceipt, NewTask, ReceiptKey, Result, TaskChange};
use crate::model::task::{StoredReceipt, TaskRef};

/// The tasks named by (namespace, id, version), without briefs, each
/// locked, in row order: two batches lock their rows in one order.
const LOCK_TASKS: &str = "SELECT t.id, t.queue, t.task_id, t.version, NULL::bytea, \
     t.brief_format, t.lapse_backoff_ms, t.last_token, t.claimable_at, t.created_at, \
     t.max_tries, t.priority, t.namespace \
     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(namespace, task_id, version) \
     JOIN tasks t ON t.namespace = r.namespace AND t.task_id = r.task_id \
     AND t.version = r.version ORDER BY t.id FOR UPDATE OF t";
/// The attempts of many tasks, in the columns of `attempt_row`, then the
/// task.
const ATTEMPTS_OF_TASKS: &str = "SELECT number, state, until_at, tries, holder, \
     token, granted_at, expires_at, lapses_at, discarded, last_error, task FROM attempts \
     WHERE task = ANY($1::bigint[]) ORDER BY task, number";
/// The receipts stored under many (principal, task, key), in the columns
/// of `receipt_row`, then the key's place.
const RECEIPTS_BY_KEYS: &str = "SELECT r.attempt, r.token, r.principal, \
     r.idempotency_key, r.artifact, r.digest, r.accepted_at, r.output, k.place \
     FROM unnest($1::text[], $2::bigint[], $3::text[]) WITH ORDINALITY \
     AS k(principal, task, idempotency_key, place) \
     JOIN receipts r ON r.principal = k.principal AND r.task = k.task \
     AND r.idempotency_key = k.idempotency_key";
const INSERT_RECEIPTS: &str = "INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::bigint[], $9::bytea[])";
const INSERT_EVENTS: &str = "INSERT INTO access_audit \
     (at, principal, namespace, action, outcome, resource, ip_hash) \
     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::text[])";
/// Attempts whose state alone moved (a submit, a failure report).
const UPDATE_ATTEMPT_STATES: &str = "UPDATE attempts a SET state = u.state, \
     until_at = u.until_at, lapses_at = u.lapses_at, discarded = u.discarded, \
     last_error = u.last_error \
     FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], \
     $6::text[], $7::text[]) AS u(task, number, state, until_at, lapses_at, discarded, last_error) \
     WHERE a.task = u.task AND a.number = u.number";
/// Tasks whose claim column alone moved (a retry after a failure).
const UPDATE_CLAIMABLES: &str = "UPDATE tasks t SET claimable_at = u.claimable_at \
     FROM unnest($1::bigint[], $2::bigint[]) AS u(id, claimable_at) WHERE t.id = u.id";
/// Many tasks, in order; a reference that exists (or came earlier in the
/// call) is skipped. Returns what it inserted.
const INSERT_TASKS: &str = "INSERT INTO tasks (namespace, queue, task_id, version, \
     brief, brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, \
     created_at, enqueued_by, priority) \
     SELECT namespace, queue, task_id, version, brief, brief_format, alternatives, \
     lapse_backoff_ms, max_tries, 0, claimable_at, created_at, enqueued_by, priority \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::text[], \
     $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::text[], \
     $13::bigint[]) WITH ORDINALITY AS n(namespace, queue, task_id, version, brief, \
     brief_format, alternatives, lapse_backoff_ms, max_tries, claimable_at, created_at, \
     enqueued_by, priority, place) ORDER BY place \
     ON CONFLICT (namespace, task_id, version) DO NOTHING RETURNING id, namespace, task_id, version";
const INSERT_ATTEMPTS: &str = "INSERT INTO attempts (task, number, namespace, queue, \
     state, until_at, tries, priority) \
     SELECT task, number, namespace, queue, state, until_at, 0, priority \
     FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], \
     $7::bigint[]) AS a(task, number, namespace, queue, state, until_at, priority)";

/// Where a task's row is looked up by its reference.
fn reference(task: &TaskRef) -> (String, String, i64) {
    (
        task.namespace.as_str().to_owned(),
        task.id.as_str().to_owned(),
        version(task),
    )
}

impl PgTransaction<'_> {
    pub(super) fn lock_tasks_at_once(&self, tasks: &[&TaskRef]) -> Result<Vec<Option<LoadedTask>>> {
        let namespaces: Vec<&str> = tasks.iter().map(|t| t.namespace.as_str()).collect();
        let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        let versions: Vec<i64> = tasks.iter().map(|t| version(t)).collect();
        let rows = self.query(LOCK_TASKS, &[&namespaces, &ids, &versions])?;
        let mut found: HashMap<(String, String, i64), TaskRow> = HashMap::with_capacity(rows.len());
        let mut handles = Vec::with_capacity(rows.len());
        for row in &rows {
            let task = task_row(row)?;
            let namespace: String = row.try_get(12)?;
            handles.push(task.id);
            found.insert((namespace, task.task_id.clone(), task.version), task);
        }
        let mut attempts: HashMap<i64, Vec<AttemptRow>> = HashMap::with_capacity(handles.len());
        if !handles.is_empty() {
            for row in self.query(ATTEMPTS_OF_TASKS, &[&handles])? {
                let task: i64 = row.try_get(11)?;
                attempts.entry(task).or_default().push(attempt_row(&row)?);
            }
        }
        tasks
            .iter()
            .map(|task| match found.remove(&reference(task)) {
                None => Ok(None),
                Some(row) => {
                    let of_task = attempts.remove(&row.id).unwrap_or_default();
                    row.loaded(of_task).map(Some)
                }
            })
            .collect()
    }

    pub(super) fn receipts_at_once(
        &self,
        keys: &[ReceiptKey<'_>],
    ) -> Result<Vec<Option<StoredReceipt>>> {
        let mut answers: Vec<Option<StoredReceipt>> = vec![None; keys.len()];
        if keys.is_empty() {
            return Ok(answers);
        }
        let principals: Vec<&str> = keys.iter().map(|k| k.principal.as_str()).collect();
        let tasks: Vec<i64> = keys.iter().map(|k| k.handle.0).collect();
        let idempotency: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
        for row in self.query(RECEIPTS_BY_KEYS, &[&principals, &tasks, &idempotency])? {
            let place: i64 = row.try_get(8)?;
            let index = usize::try_from(place - 1).map_err(|_| corrupt("receipt row"))?;
            if let Some(key) = keys.get(index) {
                answers[index] = Some(receipt_row(&row)?.stored(key.task)?);
            }
        }
        Ok(answers)
    }

    pub(super) fn insert_receipts_at_once(&self, receipts: &[NewReceipt<'_>]) -> Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        let tasks: Vec<i64> = receipts.iter().map(|r| r.handle.0).collect();
        let attempts: Vec<i64> = receipts
            .iter()
            .map(|r| i64::from(r.receipt.attempt.as_u16()))
            .collect();
        let tokens: Vec<i64> = receipts.iter().map(|r| r.receipt.token.as_i64()).collect();
        let principals: Vec<&str> = receipts
            .iter()
            .map(|r| r.receipt.principal.as_str())
            .collect();
        let keys: Vec<&str> = receipts
            .iter()
            .map(|r| r.receipt.idempotency_key.as_str())
            .collect();
        let artifacts: Vec<&str> = receipts
            .iter()
            .map(|r| r.receipt.artifact.as_str())
            .collect();
        let digests: Vec<String> = receipts
            .iter()
            .map(|r| r.receipt.digest.to_string())
            .collect();
        let accepted: Vec<i64> = receipts
            .iter()
            .map(|r| millis(r.receipt.accepted_at))
            .collect();
        let outputs: Vec<Option<&[u8]>> = receipts.iter().map(|r| r.output).collect();
        self.execute(
            INSERT_RECEIPTS,
            &[
                &tasks,
                &attempts,
                &tokens,
                &principals,
                &keys,
                &artifacts,
                &digests,
                &accepted,
                &outputs,
            ],
        )?;
        Ok(())
    }

    pub(super) fn insert_events_at_once(&self, events: &[AuditEvent]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let rows: Vec<EventRow> = events.iter().map(EventRow::from_event).collect();
        let at: Vec<i64> = rows.iter().map(|r| r.at).collect();
        let principal: Vec<&str> = rows.iter().map(|r| r.principal.as_str()).collect();
        let namespace: Vec<&str> = rows.iter().map(|r| r.namespace.as_str()).collect();
        let action: Vec<&str> = rows.iter().map(|r| r.action.as_str()).collect();
        let outcome: Vec<&str> = rows.iter().map(|r| r.outcome.as_str()).collect();
        let resource: Vec<Option<&str>> = rows.iter().map(|r| r.resource.as_deref()).collect();
        let ip_hash: Vec<Option<&str>> = rows.iter().map(|r| r.ip_hash.as_deref()).collect();
        self.execute(
            INSERT_EVENTS,
            &[
                &at, &principal, &namespace, &action, &outcome, &resource, &ip_hash,
            ],
        )?;
        Ok(())
    }

    /// Writes many tasks' changes: attempts whose state alone moved and
    /// claim columns that alone moved in one statement each, anything
    /// else as one task's write.
    pub(super) fn save_tasks_at_once(&self, changes: &[TaskChange<'_>]) -> Result<()> {
        let mut states: Vec<(i64, AttemptRow)> = Vec::new();
        let mut claimables: Vec<(i64, Option<i64>)> = Vec::new();
        for change in changes {
            let mut writes = TaskWrites::between(change.before, change.after);
            let id = change.handle.0;
            let mut rest = Vec::new();
            for write in writes.attempts.drain(..) {
                match write {
                    AttemptWrite::State(row) => states.push((id, row)),
                    other => rest.push(other),
                }
            }
            writes.attempts = rest;
            if let (None, Some(claimable)) = (writes.last_token, writes.claimable_at) {
                claimables.push((id, claimable));
                writes.claimable_at = None;
            }
            if writes != TaskWrites::default() {
                // Anything else (a lease moved, a token): one task's write.
                self.write_task(change.handle, writes)?;
            }
        }
        if !states.is_empty() {
            let tasks: Vec<i64> = states.iter().map(|(id, _)| *id).collect();
            let numbers: Vec<i64> = states.iter().map(|(_, r)| r.number).collect();
            let state: Vec<&str> = states.iter().map(|(_, r)| r.state.as_str()).collect();
            let until: Vec<Option<i64>> = states.iter().map(|(_, r)| r.until_at).collect();
            let lapses: Vec<Option<i64>> = states.iter().map(|(_, r)| r.lapses_at).collect();
            let discarded: Vec<Option<&str>> =
                states.iter().map(|(_, r)| r.discarded.as_deref()).collect();
            let errors: Vec<Option<&str>> = states
                .iter()
                .map(|(_, r)| r.last_error.as_deref())
                .collect();
            self.execute(
                UPDATE_ATTEMPT_STATES,
                &[
                    &tasks, &numbers, &state, &until, &lapses, &discarded, &errors,
                ],
            )?;
        }
        if !claimables.is_empty() {
            let ids: Vec<i64> = claimables.iter().map(|(id, _)| *id).collect();
            let at: Vec<Option<i64>> = claimables.iter().map(|(_, at)| *at).collect();
            self.execute(UPDATE_CLAIMABLES, &[&ids, &at])?;
        }
        Ok(())
    }

    pub(super) fn insert_tasks_at_once(&self, tasks: &[NewTask<'_>]) -> Result<Vec<bool>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let namespace: Vec<&str> = tasks.iter().map(|t| t.task.namespace.as_str()).collect();
        let queue: Vec<&str> = tasks.iter().map(|t| t.queue.as_str()).collect();
        let task_id: Vec<&str> = tasks.iter().map(|t| t.task.id.as_str()).collect();
        let version: Vec<i64> = tasks.iter().map(|t| version(t.task)).collect();
        let brief: Vec<&[u8]> = tasks.iter().map(|t| t.brief).collect();
        let format: Vec<&str> = tasks.iter().map(|t| t.brief_format).collect();
        let alternatives: Vec<i64> = tasks
            .iter()
            .map(|t| t.record.attempts.len() as i64)
            .collect();
        let lapse: Vec<i64> = tasks
            .iter()
            .map(|t| duration_millis(t.record.lapse_backoff))
            .collect();
        let max_tries: Vec<i64> = tasks
            .iter()
            .map(|t| i64::from(t.record.max_tries))
            .collect();
        let claimable: Vec<Option<i64>> =
            tasks.iter().map(|t| claimable_column(t.record)).collect();
        let created: Vec<i64> = tasks.iter().map(|t| millis(t.created_at)).collect();
        let by: Vec<&str> = tasks.iter().map(|t| t.enqueued_by).collect();
        let priority: Vec<i64> = tasks.iter().map(|t| i64::from(t.record.priority)).collect();
        let inserted = self.query(
            INSERT_TASKS,
            &[
                &namespace,
                &queue,
                &task_id,
                &version,
                &brief,
                &format,
                &alternatives,
                &lapse,
                &max_tries,
                &claimable,
                &created,
                &by,
                &priority,
            ],
        )?;
        self.add_rows(inserted.len() as u64);
        let mut ids: HashMap<(String, String, i64), i64> = HashMap::with_capacity(inserted.len());
        for row in &inserted {
            ids.insert(
                (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?),
                row.try_get(0)?,
            );
        }
        let mut created = Vec::with_capacity(tasks.len());
        let (
            mut a_task,
            mut a_number,
            mut a_ns,
            mut a_queue,
            mut a_state,
            mut a_until,
            mut a_priority,
        ) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for task in tasks {
            // The first of a reference takes its row; a repeat finds it gone.
            let Some(id) = ids.remove(&reference(task.task)) else {
                created.push(false);
                continue;
            };
            created.push(true);
            for attempt in &task.record.attempts {
                let row = AttemptRow::from_record(attempt, task.record.lapse_backoff);
                a_task.push(id);
                a_number.push(row.number);
                a_ns.push(task.task.namespace.as_str());
                a_queue.push(task.queue.as_str());
                a_state.push(row.state);
                a_until.push(row.until_at);
                a_priority.push(i64::from(task.record.priority));
            }
        }
        if !a_task.is_empty() {
            self.execute(
                INSERT_ATTEMPTS,
                &[
                    &a_task,
                    &a_number,
                    &a_ns,
                    &a_queue,
                    &a_state,
                    &a_until,
                    &a_priority,
                ],
            )?;
        }
        Ok(created)
    }
}
