-- The tasks named by (namespace, task_id, version), without briefs, each
-- locked in row order (so two batches lock their rows in one order), one
-- row per attempt: the task's columns and its namespace, then the
-- attempt's, each under its table's own name.
--
-- Arguments, in the order `lock_and_load_args` builds them, one array
-- element a task: $1 namespaces, $2 task_ids, $3 versions.
--
-- The attempts are locked too: under `READ COMMITTED` a task locked after
-- waiting for a concurrent commit is its newest version, while a plain
-- join would read its attempts as the statement's older snapshot has them
-- (a lapse or a grant the other transaction wrote unseen, a stale token
-- accepted).
WITH locked AS MATERIALIZED (
    SELECT t.id, t.queue, t.task_id, t.version, t.brief_format, t.lapse_backoff_ms,
        t.last_token, t.claimable_at, t.created_at, t.max_tries, t.priority, t.namespace,
        t.partition_key, t.unique_key, t.unique_states, t.lease_ms, t.deadline_at
    FROM unnest($1::text[] /* namespaces */, $2::text[] /* task_ids */,
        $3::bigint[] /* versions */) AS r(namespace, task_id, version)
    JOIN tasks t ON t.namespace = r.namespace AND t.task_id = r.task_id
        AND t.version = r.version
    ORDER BY t.id FOR UPDATE OF t
)
SELECT l.id, l.queue, l.task_id, l.version, NULL::bytea AS brief, l.brief_format,
    l.lapse_backoff_ms, l.last_token, l.claimable_at, l.created_at, l.max_tries, l.priority,
    l.namespace, a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at,
    a.expires_at, a.lapses_at, a.discarded, a.last_error,
    l.partition_key, l.unique_key, l.unique_states, l.lease_ms, l.deadline_at
FROM locked l JOIN attempts a ON a.task = l.id
ORDER BY l.id, a.number FOR UPDATE OF a
