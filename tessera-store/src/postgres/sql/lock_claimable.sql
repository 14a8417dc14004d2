-- Up to `count` claimable tasks of a queue without a settings row
-- (running, no limit) in claim order (the general claim's search, `count`
-- rows a priority), with briefs, each locked or skipped, then their
-- attempts, locked too so that they are read as the newest versions; one
-- row per attempt, in `lock_and_load.sql`'s columns, then `lapse_due`:
-- whether the queue has a due lapsed lease that the claim order may put
-- in the batch (from the lapse floor's priority up: the one above the
-- lowest priority picked when it picked `count`, else the lowest).
--
-- Arguments, in the order `lock_claimable_args` builds them:
--   $1 namespace, $2 queue, $3 now, $4 count.
WITH picked AS MATERIALIZED (
    SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
        SELECT id, queue, task_id, version, brief, brief_format, lapse_backoff_ms,
            last_token, claimable_at, created_at, max_tries, priority, namespace,
            partition_key, unique_key, unique_states, lease_ms, deadline_at
        FROM tasks
        WHERE namespace = $1 /* namespace */ AND queue = $2 /* queue */
            AND claimable_at IS NOT NULL AND claimable_at <= $3 /* now */
            AND NOT EXISTS (
                SELECT 1 FROM queue_settings s
                WHERE s.namespace = $1 /* namespace */ AND s.queue = $2 /* queue */
            )
            AND priority = each.level
        ORDER BY claimable_at, id LIMIT $4 /* count */ FOR UPDATE SKIP LOCKED
    ) AS turn WHERE each.level >= 0 LIMIT $4 /* count */
), attempt AS (
    SELECT a.task, a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at,
        a.expires_at, a.lapses_at, a.discarded, a.last_error
    FROM attempts a JOIN picked p ON a.task = p.id FOR UPDATE OF a
)
SELECT p.id, p.queue, p.task_id, p.version, p.brief, p.brief_format, p.lapse_backoff_ms,
    p.last_token, p.claimable_at, p.created_at, p.max_tries, p.priority, p.namespace,
    a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at, a.expires_at,
    a.lapses_at, a.discarded, a.last_error, p.partition_key, p.unique_key, p.unique_states,
    p.lease_ms, p.deadline_at,
    EXISTS (
        SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
            SELECT task, lapses_at, priority FROM attempts
            WHERE namespace = $1 /* namespace */ AND queue = $2 /* queue */
                AND state = 'leased' AND lapses_at <= $3 /* now */
                AND priority = each.level
            ORDER BY lapses_at LIMIT 1
        ) AS turn
        WHERE each.level >= (
            SELECT CASE WHEN count(*) >= $4 /* count */
                THEN min(CASE WHEN claimable_at = 0 THEN priority + 1 ELSE priority END)
                ELSE 0 END
            FROM picked
        )
        LIMIT 1
    ) AS lapse_due
FROM picked p JOIN attempt a ON a.task = p.id
ORDER BY p.priority DESC, p.claimable_at, p.id, a.number
