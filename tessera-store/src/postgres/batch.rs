//! Set-based statements on PostgreSQL: many tasks, receipts or audit rows
//! in one statement each, their values passed as arrays and read back
//! with `unnest`, so a batch of any size costs the same round trips.

use std::collections::HashMap;

use tessera_audit::AuditEvent;
use tessera_lease::{PartitionKey, UniqueKey};

use super::rows::{attempt_row_at, receipt_row, task_row, version};
use super::statements::{each_priority, lapse_floor, lapsed_leases};
use super::transactions::PgTransaction;
use crate::backend::rows::{
    AttemptRow, AttemptWrite, EventRow, TaskRow, TaskWrites, claimable_column, corrupt,
    duration_millis, millis, timing_columns,
};
use crate::backend::{LoadedTask, NewReceipt, NewTask, ReceiptKey, Result, TaskChange};
use crate::model::task::{StoredReceipt, TaskRef};

/// The tasks named by (namespace, id, version), without briefs, each
/// locked (in row order, so two batches lock their rows in one order),
/// one row per attempt: the task's columns in `task_row`'s order, its
/// namespace, then the attempt's in `attempt_row`'s. The attempts are
/// locked too: under `READ COMMITTED` a task locked after waiting for a
/// concurrent commit is its newest version, while a plain join would read
/// its attempts as the statement's older snapshot has them (a lapse or a
/// grant the other transaction wrote unseen, a stale token accepted).
const LOCK_AND_LOAD: &str = "WITH locked AS MATERIALIZED (SELECT t.id, t.queue, t.task_id, \
     t.version, t.brief_format, t.lapse_backoff_ms, t.last_token, t.claimable_at, t.created_at, \
     t.max_tries, t.priority, t.namespace, t.partition_key, t.unique_key, t.unique_states, \
     t.lease_ms, t.deadline_at \
     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(namespace, task_id, version) \
     JOIN tasks t ON t.namespace = r.namespace AND t.task_id = r.task_id \
     AND t.version = r.version ORDER BY t.id FOR UPDATE OF t) \
     SELECT l.id, l.queue, l.task_id, l.version, NULL::bytea, l.brief_format, \
     l.lapse_backoff_ms, l.last_token, l.claimable_at, l.created_at, l.max_tries, l.priority, \
     l.namespace, a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at, \
     a.expires_at, a.lapses_at, a.discarded, a.last_error, \
     l.partition_key, l.unique_key, l.unique_states, l.lease_ms, l.deadline_at \
     FROM locked l JOIN attempts a ON a.task = l.id ORDER BY l.id, a.number FOR UPDATE OF a";
/// Where the attempt's columns start in [`LOCK_AND_LOAD`] and
/// [`LOCK_CLAIMABLE`].
const ATTEMPT_COLUMNS: usize = 13;
/// Up to `$4` claimable tasks of a queue without a settings row (running,
/// no limit) in claim order (`NEXT_CLAIMABLE`'s search, `$4` rows a
/// priority), with briefs, each locked or skipped, then
/// their attempts, locked too so that they are read as the newest
/// versions; one row per attempt, in the columns of [`LOCK_AND_LOAD`],
/// then whether the queue has a due lapsed lease that the claim order
/// may put in the batch (from `lapse_floor`'s priority up).
const LOCK_CLAIMABLE: &str = concat!(
    "WITH picked AS MATERIALIZED (",
    each_priority!(
        "SELECT id, queue, task_id, version, brief, brief_format, lapse_backoff_ms, \
         last_token, claimable_at, created_at, max_tries, priority, namespace, \
         partition_key, unique_key, unique_states, lease_ms, deadline_at FROM tasks \
         WHERE namespace = $1 AND queue = $2 AND claimable_at IS NOT NULL \
         AND claimable_at <= $3 AND NOT EXISTS (SELECT 1 FROM queue_settings s \
         WHERE s.namespace = $1 AND s.queue = $2)",
        "ORDER BY claimable_at, id LIMIT $4 FOR UPDATE SKIP LOCKED",
        "0",
        "$4"
    ),
    "), attempt AS (SELECT a.task, a.number, a.state, a.until_at, a.tries, a.holder, a.token, \
     a.granted_at, a.expires_at, a.lapses_at, a.discarded, a.last_error \
     FROM attempts a JOIN picked p ON a.task = p.id FOR UPDATE OF a) \
     SELECT p.id, p.queue, p.task_id, p.version, p.brief, p.brief_format, p.lapse_backoff_ms, \
     p.last_token, p.claimable_at, p.created_at, p.max_tries, p.priority, p.namespace, \
     a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at, a.expires_at, \
     a.lapses_at, a.discarded, a.last_error, p.partition_key, p.unique_key, p.unique_states, \
     p.lease_ms, p.deadline_at, \
     EXISTS (",
    each_priority!(
        lapsed_leases!(),
        "ORDER BY lapses_at LIMIT 1",
        lapse_floor!("$4")
    ),
    ") AS lapse_due FROM picked p JOIN attempt a ON a.task = p.id \
     ORDER BY p.priority DESC, p.claimable_at, p.id, a.number"
);
/// The receipts stored under many (principal, task, key), in the columns
/// of `receipt_row`, then the key's place. The fenced lateral search
/// (`OFFSET 0`) keeps a generic plan made while the table was small on
/// the unique index, instead of a hash join over every receipt.
const RECEIPTS_BY_KEYS: &str = "SELECT r.attempt, r.token, r.principal, \
     r.idempotency_key, r.artifact, r.digest, r.accepted_at, r.output, k.place \
     FROM unnest($1::text[], $2::bigint[], $3::text[]) WITH ORDINALITY \
     AS k(principal, task, idempotency_key, place) \
     CROSS JOIN LATERAL (SELECT * FROM receipts r WHERE r.principal = k.principal \
     AND r.task = k.task AND r.idempotency_key = k.idempotency_key OFFSET 0) r";
/// What a batch decided, in one statement: attempts whose state alone
/// moved (a submit, a failure report), attempts written whole (a grant),
/// leases whose expiry alone moved (a heartbeat without progress),
/// task rows whose token counter or claim column moved (a grant, a
/// retry), the receipts and the audit rows. Returns the rows it changed.
const WRITE_ACKNOWLEDGED: &str = "WITH states AS (UPDATE attempts a SET state = u.state, \
     until_at = u.until_at, lapses_at = u.lapses_at, discarded = u.discarded, \
     last_error = u.last_error, changed_at = u.changed_at \
     FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], \
     $6::text[], $7::text[], $26::bigint[]) \
     AS u(task, number, state, until_at, lapses_at, discarded, last_error, changed_at) \
     WHERE a.task = u.task AND a.number = u.number RETURNING 1), \
     wholes AS (UPDATE attempts a SET state = u.state, until_at = u.until_at, \
     tries = u.tries, holder = u.holder, token = u.token, granted_at = u.granted_at, \
     expires_at = u.expires_at, lapses_at = u.lapses_at, discarded = u.discarded, \
     last_error = u.last_error, changed_at = u.changed_at \
     FROM unnest($29::bigint[], $30::bigint[], $31::text[], $32::bigint[], $33::bigint[], \
     $34::text[], $35::bigint[], $36::bigint[], $37::bigint[], $38::bigint[], $39::text[], \
     $40::text[], $41::bigint[]) AS u(task, number, state, until_at, tries, holder, token, \
     granted_at, expires_at, lapses_at, discarded, last_error, changed_at) \
     WHERE a.task = u.task AND a.number = u.number RETURNING 1), \
     expiries AS (UPDATE attempts a SET expires_at = u.expires_at, lapses_at = u.lapses_at \
     FROM unnest($42::bigint[], $43::bigint[], $44::bigint[], $45::bigint[]) \
     AS u(task, number, expires_at, lapses_at) \
     WHERE a.task = u.task AND a.number = u.number RETURNING 1), \
     claims AS (UPDATE tasks t SET last_token = coalesce(u.last_token, t.last_token), \
     claimable_at = CASE WHEN u.moves THEN u.claimable_at ELSE t.claimable_at END \
     FROM unnest($8::bigint[], $9::bigint[], $27::bigint[], $28::boolean[]) \
     AS u(id, claimable_at, last_token, moves) WHERE t.id = u.id \
     RETURNING 1), \
     receipts_added AS (INSERT INTO receipts (task, attempt, token, principal, \
     idempotency_key, artifact, digest, accepted_at, output) \
     SELECT * FROM unnest($10::bigint[], $11::bigint[], $12::bigint[], $13::text[], $14::text[], \
     $15::text[], $16::text[], $17::bigint[], $18::bytea[]) RETURNING 1), \
     audited AS (INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, \
     ip_hash) SELECT * FROM unnest($19::bigint[], $20::text[], $21::text[], $22::text[], \
     $23::text[], $24::text[], $25::text[]) RETURNING 1) \
     SELECT (SELECT count(*) FROM states) + (SELECT count(*) FROM wholes) \
     + (SELECT count(*) FROM expiries) \
     + (SELECT count(*) FROM claims) \
     + (SELECT count(*) FROM receipts_added) + (SELECT count(*) FROM audited)";
/// Many tasks' insert, in order, returning what it inserted, up to what
/// it does with an existing reference.
macro_rules! insert_tasks {
    ($conflict:literal) => {
        concat!(
            "INSERT INTO tasks (namespace, queue, task_id, version, \
             brief, brief_format, alternatives, lapse_backoff_ms, max_tries, last_token, \
             claimable_at, created_at, enqueued_by, priority, partition_key, unique_key, \
             unique_slot, unique_states, lease_ms, deadline_at) \
             SELECT namespace, queue, task_id, version, brief, brief_format, alternatives, \
             lapse_backoff_ms, max_tries, 0, claimable_at, created_at, enqueued_by, priority, \
             partition_key, unique_key, unique_slot, unique_states, lease_ms, deadline_at \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], \
             $6::text[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], \
             $12::text[], $13::bigint[], $14::text[], $15::text[], $16::text[], $17::bigint[], \
             $18::bigint[], $19::bigint[]) \
             WITH ORDINALITY AS n(namespace, queue, task_id, version, brief, brief_format, \
             alternatives, lapse_backoff_ms, max_tries, claimable_at, created_at, enqueued_by, \
             priority, partition_key, unique_key, unique_slot, unique_states, lease_ms, \
             deadline_at, place) \
             ORDER BY place ",
            $conflict,
            "RETURNING id, namespace, task_id, version"
        )
    };
}
/// Many tasks, in order; a reference that exists (or came earlier in the
/// call) is skipped. Returns what it inserted.
const INSERT_TASKS: &str = insert_tasks!("ON CONFLICT (namespace, task_id, version) DO NOTHING ");
/// [`INSERT_TASKS`] for tasks whose ids the store drew
/// ([`NewTask::drawn_id`]): a plain insert, without the speculative
/// insertion `ON CONFLICT` makes of each row (which took 23–44% longer
/// for 100,000 rows on PostgreSQL 15).
const INSERT_NEW_TASKS: &str = insert_tasks!("");
const INSERT_ATTEMPTS: &str = "INSERT INTO attempts (task, number, namespace, queue, \
     state, until_at, tries, priority, changed_at) \
     SELECT task, number, namespace, queue, state, until_at, 0, priority, changed_at \
     FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], \
     $7::bigint[], $8::bigint[]) \
     AS a(task, number, namespace, queue, state, until_at, priority, changed_at)";

/// Where a task's row is looked up by its reference.
fn reference(task: &TaskRef) -> (String, String, i64) {
    (
        task.namespace.as_str().to_owned(),
        task.id.as_str().to_owned(),
        version(task),
    )
}

impl PgTransaction<'_> {
    /// The tasks `tasks` names, locked, with their attempts: one
    /// statement.
    pub(super) fn lock_tasks_at_once(&self, tasks: &[&TaskRef]) -> Result<Vec<Option<LoadedTask>>> {
        let namespaces: Vec<&str> = tasks.iter().map(|t| t.namespace.as_str()).collect();
        let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        let versions: Vec<i64> = tasks.iter().map(|t| version(t)).collect();
        let rows = self.query(LOCK_AND_LOAD, &[&namespaces, &ids, &versions])?;
        let mut found: HashMap<(String, String, i64), (TaskRow, Vec<AttemptRow>)> =
            HashMap::with_capacity(tasks.len());
        for row in &rows {
            let task = task_row(row)?;
            let namespace: String = row.try_get(12)?;
            let attempt = attempt_row_at(row, ATTEMPT_COLUMNS)?;
            found
                .entry((namespace, task.task_id.clone(), task.version))
                .or_insert_with(|| (task, Vec::new()))
                .1
                .push(attempt);
        }
        tasks
            .iter()
            .map(|task| match found.remove(&reference(task)) {
                None => Ok(None),
                Some((row, attempts)) => row.loaded(attempts).map(Some),
            })
            .collect()
    }

    /// See [`WriteTransaction::lock_claimable`]: one statement
    /// ([`LOCK_CLAIMABLE`]).
    pub(super) fn lock_claimable_at_once(
        &self,
        namespace: &str,
        queue: &str,
        now: i64,
        count: i64,
    ) -> Result<Option<Vec<LoadedTask>>> {
        let rows = self.query(LOCK_CLAIMABLE, &[&namespace, &queue, &now, &count])?;
        if rows.is_empty() {
            // No claimable task: whether a lapse is due is the general
            // claim's to find.
            return Ok(None);
        }
        let mut tasks: Vec<(TaskRow, Vec<AttemptRow>)> = Vec::new();
        for row in &rows {
            if row.try_get::<_, bool>("lapse_due")? {
                return Ok(None);
            }
            let attempt = attempt_row_at(row, ATTEMPT_COLUMNS)?;
            let id: i64 = row.try_get(0)?;
            match tasks.last_mut() {
                Some((task, attempts)) if task.id == id => attempts.push(attempt),
                _ => tasks.push((task_row(row)?, vec![attempt])),
            }
        }
        tasks
            .into_iter()
            .map(|(task, attempts)| task.loaded(attempts))
            .collect::<Result<Vec<_>>>()
            .map(Some)
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

    /// What a batch decided, in one statement ([`WRITE_ACKNOWLEDGED`]);
    /// a change of another kind (progress with its lease's expiry, a retry's
    /// tries) is written as one task's, before it.
    pub(super) fn write_acknowledged_at_once(
        &self,
        changes: &[TaskChange<'_>],
        receipts: &[NewReceipt<'_>],
        events: &[AuditEvent],
    ) -> Result<()> {
        let mut states: Vec<(i64, AttemptRow, i64)> = Vec::new();
        let mut wholes: Vec<(i64, AttemptRow, i64)> = Vec::new();
        let mut expiries: Vec<(i64, AttemptRow)> = Vec::new();
        // A task's new token counter and claim column, each if it moved.
        let mut claimables: Vec<(i64, Option<Option<i64>>, Option<i64>)> = Vec::new();
        for change in changes {
            let mut writes = TaskWrites::between(change.before, change.after, change.at);
            let id = change.handle.0;
            let mut rest = Vec::new();
            for write in writes.attempts.drain(..) {
                match write {
                    AttemptWrite::State(row) => states.push((id, row, millis(change.at))),
                    AttemptWrite::Whole(row) => wholes.push((id, row, millis(change.at))),
                    // Progress is written with its lease's expiry.
                    AttemptWrite::Expiry(row)
                        if writes
                            .progress
                            .as_ref()
                            .is_none_or(|(n, _)| *n != row.number) =>
                    {
                        expiries.push((id, row));
                    }
                    other @ AttemptWrite::Expiry(_) => rest.push(other),
                }
            }
            writes.attempts = rest;
            if writes.last_token.is_some() || writes.claimable_at.is_some() {
                claimables.push((id, writes.claimable_at.take(), writes.last_token.take()));
            }
            if !writes.is_empty() {
                self.write_task(change.handle, writes)?;
            }
        }
        if states.is_empty()
            && wholes.is_empty()
            && expiries.is_empty()
            && claimables.is_empty()
            && receipts.is_empty()
            && events.is_empty()
        {
            return Ok(());
        }
        let state_task: Vec<i64> = states.iter().map(|(id, ..)| *id).collect();
        let number: Vec<i64> = states.iter().map(|(_, r, _)| r.number).collect();
        let state: Vec<&str> = states.iter().map(|(_, r, _)| r.state.as_str()).collect();
        let until: Vec<Option<i64>> = states.iter().map(|(_, r, _)| r.until_at).collect();
        let lapses: Vec<Option<i64>> = states.iter().map(|(_, r, _)| r.lapses_at).collect();
        let changed_at: Vec<i64> = states.iter().map(|(.., at)| *at).collect();
        let discarded: Vec<Option<&str>> = states
            .iter()
            .map(|(_, r, _)| r.discarded.as_deref())
            .collect();
        let error: Vec<Option<&str>> = states
            .iter()
            .map(|(_, r, _)| r.last_error.as_deref())
            .collect();
        let claim_task: Vec<i64> = claimables.iter().map(|(id, ..)| *id).collect();
        let claimable: Vec<Option<i64>> =
            claimables.iter().map(|(_, at, _)| at.flatten()).collect();
        let moves: Vec<bool> = claimables.iter().map(|(_, at, _)| at.is_some()).collect();
        let last_token: Vec<Option<i64>> = claimables.iter().map(|(.., token)| *token).collect();
        let w_task: Vec<i64> = wholes.iter().map(|(id, ..)| *id).collect();
        let w_number: Vec<i64> = wholes.iter().map(|(_, r, _)| r.number).collect();
        let w_state: Vec<&str> = wholes.iter().map(|(_, r, _)| r.state.as_str()).collect();
        let w_until: Vec<Option<i64>> = wholes.iter().map(|(_, r, _)| r.until_at).collect();
        let w_tries: Vec<i64> = wholes.iter().map(|(_, r, _)| r.tries).collect();
        let w_holder: Vec<Option<&str>> =
            wholes.iter().map(|(_, r, _)| r.holder.as_deref()).collect();
        let w_token: Vec<Option<i64>> = wholes.iter().map(|(_, r, _)| r.token).collect();
        let w_granted: Vec<Option<i64>> = wholes.iter().map(|(_, r, _)| r.granted_at).collect();
        let w_expires: Vec<Option<i64>> = wholes.iter().map(|(_, r, _)| r.expires_at).collect();
        let w_lapses: Vec<Option<i64>> = wholes.iter().map(|(_, r, _)| r.lapses_at).collect();
        let w_discarded: Vec<Option<&str>> = wholes
            .iter()
            .map(|(_, r, _)| r.discarded.as_deref())
            .collect();
        let w_error: Vec<Option<&str>> = wholes
            .iter()
            .map(|(_, r, _)| r.last_error.as_deref())
            .collect();
        let w_changed: Vec<i64> = wholes.iter().map(|(.., at)| *at).collect();
        let e_task: Vec<i64> = expiries.iter().map(|(id, _)| *id).collect();
        let e_number: Vec<i64> = expiries.iter().map(|(_, r)| r.number).collect();
        let e_expires: Vec<Option<i64>> = expiries.iter().map(|(_, r)| r.expires_at).collect();
        let e_lapses: Vec<Option<i64>> = expiries.iter().map(|(_, r)| r.lapses_at).collect();
        let r_task: Vec<i64> = receipts.iter().map(|r| r.handle.0).collect();
        let r_attempt: Vec<i64> = receipts
            .iter()
            .map(|r| i64::from(r.receipt.attempt.as_u16()))
            .collect();
        let r_token: Vec<i64> = receipts.iter().map(|r| r.receipt.token.as_i64()).collect();
        let r_principal: Vec<&str> = receipts
            .iter()
            .map(|r| r.receipt.principal.as_str())
            .collect();
        let r_key: Vec<&str> = receipts
            .iter()
            .map(|r| r.receipt.idempotency_key.as_str())
            .collect();
        let r_artifact: Vec<&str> = receipts
            .iter()
            .map(|r| r.receipt.artifact.as_str())
            .collect();
        let r_digest: Vec<String> = receipts
            .iter()
            .map(|r| r.receipt.digest.to_string())
            .collect();
        let r_accepted: Vec<i64> = receipts
            .iter()
            .map(|r| millis(r.receipt.accepted_at))
            .collect();
        let r_output: Vec<Option<&[u8]>> = receipts.iter().map(|r| r.output).collect();
        let rows: Vec<EventRow> = events.iter().map(EventRow::from_event).collect();
        let at: Vec<i64> = rows.iter().map(|r| r.at).collect();
        let principal: Vec<&str> = rows.iter().map(|r| r.principal.as_str()).collect();
        let namespace: Vec<&str> = rows.iter().map(|r| r.namespace.as_str()).collect();
        let action: Vec<&str> = rows.iter().map(|r| r.action.as_str()).collect();
        let outcome: Vec<&str> = rows.iter().map(|r| r.outcome.as_str()).collect();
        let resource: Vec<Option<&str>> = rows.iter().map(|r| r.resource.as_deref()).collect();
        let ip_hash: Vec<Option<&str>> = rows.iter().map(|r| r.ip_hash.as_deref()).collect();
        let changed = self.query(
            WRITE_ACKNOWLEDGED,
            &[
                &state_task,
                &number,
                &state,
                &until,
                &lapses,
                &discarded,
                &error,
                &claim_task,
                &claimable,
                &r_task,
                &r_attempt,
                &r_token,
                &r_principal,
                &r_key,
                &r_artifact,
                &r_digest,
                &r_accepted,
                &r_output,
                &at,
                &principal,
                &namespace,
                &action,
                &outcome,
                &resource,
                &ip_hash,
                &changed_at,
                &last_token,
                &moves,
                &w_task,
                &w_number,
                &w_state,
                &w_until,
                &w_tries,
                &w_holder,
                &w_token,
                &w_granted,
                &w_expires,
                &w_lapses,
                &w_discarded,
                &w_error,
                &w_changed,
                &e_task,
                &e_number,
                &e_expires,
                &e_lapses,
            ],
        )?;
        let changed: i64 = match changed.first() {
            Some(row) => row.try_get(0)?,
            None => 0,
        };
        self.add_rows(u64::try_from(changed).unwrap_or(0));
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
        let partition: Vec<Option<&str>> = tasks
            .iter()
            .map(|t| t.partition_key.map(PartitionKey::as_str))
            .collect();
        let unique_key: Vec<Option<&str>> = tasks
            .iter()
            .map(|t| t.unique_key.map(UniqueKey::as_str))
            .collect();
        let unique_slot: Vec<Option<&str>> = tasks
            .iter()
            .map(|t| t.unique.map(|u| u.slot.as_str()))
            .collect();
        let unique_states: Vec<Option<i64>> = tasks
            .iter()
            .map(|t| t.unique.map(|u| i64::from(u.states.bits())))
            .collect();
        let (lease, deadline): (Vec<Option<i64>>, Vec<Option<i64>>) =
            tasks.iter().map(|t| timing_columns(t.record)).unzip();
        let statement = if tasks.iter().all(|task| task.drawn_id) {
            INSERT_NEW_TASKS
        } else {
            INSERT_TASKS
        };
        let inserted = self.query(
            statement,
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
                &partition,
                &unique_key,
                &unique_slot,
                &unique_states,
                &lease,
                &deadline,
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
        let mut attempts: Vec<(i64, &NewTask<'_>, AttemptRow)> = Vec::new();
        for task in tasks {
            // The first of a reference takes its row; a repeat finds it gone.
            let id = ids.remove(&reference(task.task));
            created.push(id.is_some());
            if let Some(id) = id {
                attempts.extend(task.record.attempts.iter().map(|attempt| {
                    let row = AttemptRow::from_record(attempt, task.record.lapse_backoff);
                    (id, task, row)
                }));
            }
        }
        if !attempts.is_empty() {
            let a_task: Vec<i64> = attempts.iter().map(|(id, ..)| *id).collect();
            let a_number: Vec<i64> = attempts.iter().map(|(.., row)| row.number).collect();
            let a_ns: Vec<&str> = attempts
                .iter()
                .map(|(_, t, _)| t.task.namespace.as_str())
                .collect();
            let a_queue: Vec<&str> = attempts.iter().map(|(_, t, _)| t.queue.as_str()).collect();
            let a_state: Vec<&str> = attempts
                .iter()
                .map(|(.., row)| row.state.as_str())
                .collect();
            let a_until: Vec<Option<i64>> = attempts.iter().map(|(.., row)| row.until_at).collect();
            let a_priority: Vec<i64> = attempts
                .iter()
                .map(|(_, t, _)| i64::from(t.record.priority))
                .collect();
            let a_changed: Vec<i64> = attempts
                .iter()
                .map(|(_, t, _)| millis(t.created_at))
                .collect();
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
                    &a_changed,
                ],
            )?;
        }
        Ok(created)
    }
}
