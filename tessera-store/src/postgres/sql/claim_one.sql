-- A claim in one statement (see `QuickClaim` and `claim.rs`).
--
-- Arguments, in the order `ClaimArgs::params` builds them:
--   $1 namespace, $2 queue, $3 now, $4 holder, $5 expires_at,
--   $6 to $10 the audit row's claim_principal, claim_namespace,
--   claim_action, claim_outcome and claim_ip_hash.
--
-- `picked` is the general claim's search for the queue's first claimable
-- task, its lock `FOR NO KEY UPDATE` (it changes no key of the task):
-- that excludes every other claim and every transaction that locks the
-- task `FOR UPDATE`, but not `submit_and_claim_one.sql`'s key-share lock
-- of the task it submits. A claim whose snapshot predates the commit
-- that leased a task still locks that task (PostgreSQL locks the newest
-- version, finds it no longer claimable, and keeps the lock to the end
-- of the statement), and the task's holder submitting it then need not
-- wait for that claim. Each priority is one turn of a lateral subquery
-- (`each(level)`), so the plan holds one index search, not one a
-- priority.
--
-- `held` is one row read once, for `ok` and for the answer: `lapsed`,
-- the priority of the queue's first due lapsed lease, searched from the
-- highest priority down to the lapse floor (the one above a ready picked
-- task's, as a ready task comes before every lapse of its own priority;
-- the lowest when nothing was picked), and `configured`, whether the
-- queue has a settings row. `attempt` locks the task's attempt, so under
-- `READ COMMITTED` it reads the newest version.
--
-- `ok` is the one shape the statement decides: a single attempt, ready,
-- its task ready in the claim column, no earlier grant of the attempt
-- stamped after now (the lease rules stamp the grant at the later of the
-- two), a token counter with a next token, no unique slot held, no lease
-- or deadline of the task's own, no due lapsed lease of a higher
-- priority, and a queue without settings. It spells the grant's token
-- and audit resource once, for the writes and for the answer. The lease
-- rules these restate have twins in Rust (`rules.rs`).
--
-- The three writes run only for `ok`'s row. The answer is one row:
-- `outcome` (`leased`; `declined`, a task, a due lapse or queue settings
-- left to the general claim; `skipped`, when no task was free but the
-- snapshot holds a claimable one: another statement has it locked, or
-- took it since, so the caller asks again rather than hear "empty"; or
-- `empty`), the task (`task_`) and its
-- attempt as they were (`before_`), the attempt as written (`after_`) and
-- the audit row's `resource`. Each part is a join of one-row results,
-- not a subquery a column: every subquery is a plan of its own that each
-- run starts up.
WITH picked AS (
    SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
        SELECT id, queue, task_id, version, brief, brief_format, lapse_backoff_ms,
            last_token, claimable_at, created_at, max_tries, priority, partition_key,
            unique_key, unique_states, lease_ms, deadline_at, alternatives
        FROM tasks
        WHERE namespace = $1 /* namespace */ AND queue = $2 /* queue */
            AND claimable_at IS NOT NULL AND claimable_at <= $3::bigint /* now */
            AND priority = each.level
        ORDER BY claimable_at, id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED
    ) AS turn WHERE each.level >= 0 LIMIT 1
), held AS MATERIALIZED (
    SELECT (
        SELECT lapse.priority FROM (
            SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
                SELECT task, lapses_at, priority FROM attempts
                WHERE namespace = $1 /* namespace */ AND queue = $2 /* queue */
                    AND state = 'leased' AND lapses_at <= $3 /* now */
                    AND priority = each.level
                ORDER BY lapses_at LIMIT 1
            ) AS turn
            WHERE each.level >= (
                SELECT CASE WHEN count(*) >= 1
                    THEN min(CASE WHEN claimable_at = 0 THEN priority + 1 ELSE priority END)
                    ELSE 0 END
                FROM picked
            )
            LIMIT 1
        ) AS lapse
    ) AS lapsed,
    EXISTS (
        SELECT 1 FROM queue_settings s
        WHERE s.namespace = $1 /* namespace */ AND s.queue = $2 /* queue */
    ) AS configured
), attempt AS (
    SELECT a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at,
        a.expires_at, a.lapses_at, a.discarded, a.last_error
    FROM attempts a JOIN picked p ON a.task = p.id
    WHERE a.number = 1 FOR UPDATE OF a
), ok AS (
    SELECT p.id, p.last_token + 1 AS token, p.lapse_backoff_ms,
        'task:' || p.task_id || '@' || p.version || '/a1/t' || (p.last_token + 1) AS resource
    FROM picked p JOIN attempt a ON true JOIN held h ON true
    WHERE p.alternatives = 1 AND p.claimable_at = 0 AND a.state = 'ready'
        AND (a.granted_at IS NULL OR a.granted_at <= $3::bigint /* now */)
        AND p.last_token < 9223372036854775807
        AND p.unique_states IS NULL AND p.lease_ms IS NULL AND p.deadline_at IS NULL
        AND (h.lapsed IS NULL OR h.lapsed <= p.priority) AND NOT h.configured
), leased AS (
    UPDATE attempts SET state = 'leased', until_at = NULL, tries = attempts.tries + 1,
        holder = $4::text /* holder */, token = ok.token,
        granted_at = $3::bigint /* now */, expires_at = $5::bigint /* expires_at */,
        lapses_at = $5::bigint /* expires_at */ + ok.lapse_backoff_ms,
        changed_at = $3::bigint /* now */
    FROM ok
    WHERE attempts.task = ok.id AND attempts.number = 1
    RETURNING attempts.number, attempts.state, attempts.until_at, attempts.tries,
        attempts.holder, attempts.token, attempts.granted_at, attempts.expires_at,
        attempts.lapses_at, attempts.discarded, attempts.last_error, ok.resource
), moved AS (
    UPDATE tasks SET last_token = ok.token, claimable_at = NULL
    FROM ok WHERE tasks.id = ok.id
    RETURNING tasks.id
), audited AS (
    INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, ip_hash)
    SELECT $3::bigint /* now */, $6::text /* claim_principal */,
        $7::text /* claim_namespace */, $8::text /* claim_action */,
        $9::text /* claim_outcome */, ok.resource, $10::text /* claim_ip_hash */
    FROM ok
)
SELECT
    CASE WHEN l.number IS NOT NULL AND m.id IS NOT NULL THEN 'leased'
        WHEN (p.id IS NOT NULL OR h.lapsed IS NOT NULL OR h.configured) THEN 'declined'
        WHEN EXISTS (
            SELECT 1 FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
                SELECT 1 FROM tasks t
                WHERE t.namespace = $1 /* namespace */ AND t.queue = $2 /* queue */
                    AND t.claimable_at IS NOT NULL AND t.claimable_at <= $3::bigint /* now */
                    AND t.priority = each.level
                ORDER BY t.claimable_at, t.id LIMIT 1
            ) AS turn
        ) THEN 'skipped'
        ELSE 'empty' END AS outcome,
    p.id AS task_id, p.queue AS task_queue, p.task_id AS task_task_id,
    p.version AS task_version, p.brief AS task_brief, p.brief_format AS task_brief_format,
    p.lapse_backoff_ms AS task_lapse_backoff_ms, p.last_token AS task_last_token,
    p.claimable_at AS task_claimable_at, p.created_at AS task_created_at,
    p.max_tries AS task_max_tries, p.priority AS task_priority,
    a.number AS before_number, a.state AS before_state, a.until_at AS before_until_at,
    a.tries AS before_tries, a.holder AS before_holder, a.token AS before_token,
    a.granted_at AS before_granted_at, a.expires_at AS before_expires_at,
    a.lapses_at AS before_lapses_at, a.discarded AS before_discarded,
    a.last_error AS before_last_error,
    l.number AS after_number, l.state AS after_state, l.until_at AS after_until_at,
    l.tries AS after_tries, l.holder AS after_holder, l.token AS after_token,
    l.granted_at AS after_granted_at, l.expires_at AS after_expires_at,
    l.lapses_at AS after_lapses_at, l.discarded AS after_discarded,
    l.last_error AS after_last_error,
    l.resource AS resource,
    p.partition_key AS task_partition_key, p.unique_key AS task_unique_key,
    p.unique_states AS task_unique_states, p.lease_ms AS task_lease_ms,
    p.deadline_at AS task_deadline_at
FROM held h LEFT JOIN picked p ON true LEFT JOIN attempt a ON true
    LEFT JOIN leased l ON true LEFT JOIN moved m ON true
