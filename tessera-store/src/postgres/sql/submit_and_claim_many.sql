-- `submit_and_claim_one.sql` for several callers at once, each with its
-- own submission and its own claim on one queue: what one process's
-- workers hand in while a statement of theirs runs (see `coalesce.rs`).
-- The callers' submitted tasks are distinct.
--
-- Arguments, in the order `ManyArgs::params` builds them: $1 namespace,
-- $2 queue, $3 search_now (the latest of the callers' times, so a lapse
-- due for any of them is seen); then one array an argument, one element
-- a caller, unnested into `c` under the same names: $4 now, $5 holder,
-- $6 expires_at, $7 to $11 the claim's audit row (claim_principal,
-- claim_namespace, claim_action, claim_outcome, claim_ip_hash),
-- $12 task_namespace, $13 task_id, $14 task_version (the submitted
-- task), $15 token, $16 submitter, $17 idempotency_key, $18 digest,
-- $19 output, $20 to $25 the submission's audit row
-- (submit_principal, submit_namespace, submit_action, submit_outcome,
-- submit_resource, submit_ip_hash).
--
-- Each part is `submit_and_claim_one.sql`'s, a row a caller (`c`, with
-- its ordinal `i`): `st` and `sa` lock the submitted tasks and their
-- attempts in id order, so two such statements lock in one order; `sok`
-- ranks the callers whose submissions are of the one shape; `picked`
-- takes as many tasks as `sok` has callers, each ranked in claim order,
-- and the caller of rank r is offered the task of rank r; `held`'s lapse
-- floor is the one above the lowest priority picked when it picked that
-- many. A caller's claim fits (`fit`) on `claim_one.sql`'s conditions,
-- taken with its own task, times and lease, and is made (`ok`) only when
-- every caller ranked before it fits too, so no task is granted past one
-- the statement leaves to the general claim. A caller's submission is
-- written (`go`) when its claim is made, or when there was no task for
-- it, no due lapse, no queue settings and every task picked was granted
-- (an empty queue, as the single statement finds it). The other callers
-- go to the general transaction, as a declined statement's do. The lease
-- rules restated here have twins in Rust (`rules.rs`).
--
-- The answer is two rows a caller, in `submit_and_claim_one.sql`'s
-- columns, and its ordinal (`caller`); the claim's row only for a caller
-- in `sok`.
WITH c AS MATERIALIZED (
    SELECT * FROM unnest(
        $4::bigint[] /* now */, $5::text[] /* holder */, $6::bigint[] /* expires_at */,
        $7::text[] /* claim_principal */, $8::text[] /* claim_namespace */,
        $9::text[] /* claim_action */, $10::text[] /* claim_outcome */,
        $11::text[] /* claim_ip_hash */, $12::text[] /* task_namespace */,
        $13::text[] /* task_id */, $14::bigint[] /* task_version */,
        $15::bigint[] /* token */, $16::text[] /* submitter */,
        $17::text[] /* idempotency_key */, $18::text[] /* digest */,
        $19::bytea[] /* output */,
        $20::text[] /* submit_principal */, $21::text[] /* submit_namespace */,
        $22::text[] /* submit_action */, $23::text[] /* submit_outcome */,
        $24::text[] /* submit_resource */, $25::text[] /* submit_ip_hash */
    ) WITH ORDINALITY AS c(now, holder, expires_at, claim_principal, claim_namespace,
        claim_action, claim_outcome, claim_ip_hash, task_namespace, task_id, task_version,
        token, submitter, idempotency_key, digest, output, submit_principal,
        submit_namespace, submit_action, submit_outcome, submit_resource, submit_ip_hash, i)
), st AS MATERIALIZED (
    SELECT c.i, t.id, t.queue, t.task_id, t.version, NULL::bytea AS brief, t.brief_format,
        t.lapse_backoff_ms, t.last_token, t.claimable_at, t.created_at, t.max_tries,
        t.priority, t.partition_key, t.unique_key, t.unique_states, t.lease_ms,
        t.deadline_at, t.alternatives, t.children
    FROM c JOIN tasks t ON t.namespace = c.task_namespace AND t.task_id = c.task_id
        AND t.version = c.task_version
    ORDER BY t.id FOR KEY SHARE OF t
), sa AS MATERIALIZED (
    SELECT s.i, a.* FROM (SELECT i, id FROM st ORDER BY id) AS s CROSS JOIN LATERAL (
        SELECT a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at,
            a.expires_at, a.lapses_at, a.discarded, a.last_error
        FROM attempts a WHERE a.task = s.id AND a.number = 1 FOR UPDATE
    ) AS a
), sok AS MATERIALIZED (
    SELECT st.i, st.id, GREATEST(c.now, sa.granted_at) AS accepted_at,
        row_number() OVER (ORDER BY st.i) AS rank
    FROM st JOIN sa ON sa.i = st.i JOIN c ON c.i = st.i
    WHERE st.alternatives = 1 AND st.unique_states IS NULL AND st.children = 0
        AND sa.state = 'leased' AND sa.token = c.token AND sa.holder = c.submitter
        AND sa.expires_at > c.now
        AND NOT EXISTS (
            SELECT 1 FROM attempts r
            WHERE r.task = st.id AND r.holder = c.submitter
                AND r.idempotency_key = c.idempotency_key
        )
), picked AS MATERIALIZED (
    SELECT pick.*,
        row_number() OVER (ORDER BY pick.priority DESC, pick.claimable_at, pick.id) AS rank
    FROM (
        SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
            SELECT id, queue, task_id, version, brief, brief_format, lapse_backoff_ms,
                last_token, claimable_at, created_at, max_tries, priority, partition_key,
                unique_key, unique_states, lease_ms, deadline_at, alternatives
            FROM tasks
            WHERE namespace = $1 /* namespace */ AND queue = $2 /* queue */
                AND claimable_at IS NOT NULL AND claimable_at <= $3::bigint /* search_now */
                AND priority = each.level
            ORDER BY claimable_at, id LIMIT (SELECT count(*) FROM sok)
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS turn WHERE each.level >= 0 LIMIT (SELECT count(*) FROM sok)
    ) AS pick
), held AS MATERIALIZED (
    SELECT (
        SELECT lapse.priority FROM (
            SELECT turn.* FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
                SELECT task, lapses_at, priority FROM attempts
                WHERE namespace = $1 /* namespace */ AND queue = $2 /* queue */
                    AND state = 'leased' AND lapses_at <= $3 /* search_now */
                    AND priority = each.level
                ORDER BY lapses_at LIMIT 1
            ) AS turn
            WHERE each.level >= (
                SELECT CASE WHEN count(*) >= (SELECT count(*) FROM sok)
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
), attempt AS MATERIALIZED (
    SELECT p.rank, a.* FROM (SELECT id, rank FROM picked ORDER BY id) AS p CROSS JOIN LATERAL (
        SELECT a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at,
            a.expires_at, a.lapses_at, a.discarded, a.last_error
        FROM attempts a WHERE a.task = p.id AND a.number = 1 FOR UPDATE
    ) AS a
), fit AS MATERIALIZED (
    SELECT s.i, s.rank, p.id, p.last_token + 1 AS token, p.lapse_backoff_ms,
        'task:' || p.task_id || '@' || p.version || '/a1/t' || (p.last_token + 1) AS resource,
        c.now, c.holder, c.expires_at, c.claim_principal, c.claim_namespace, c.claim_action,
        c.claim_outcome, c.claim_ip_hash
    FROM sok s JOIN picked p ON p.rank = s.rank JOIN attempt a ON a.rank = s.rank
        JOIN c ON c.i = s.i CROSS JOIN held h
    WHERE p.alternatives = 1 AND p.claimable_at = 0 AND a.state = 'ready'
        AND (a.granted_at IS NULL OR a.granted_at <= c.now)
        AND p.last_token < 9223372036854775807
        AND p.unique_states IS NULL AND p.lease_ms IS NULL AND p.deadline_at IS NULL
        AND (h.lapsed IS NULL OR h.lapsed <= p.priority) AND NOT h.configured
), ok AS MATERIALIZED (
    SELECT f.* FROM fit f
    WHERE f.rank < coalesce((
        SELECT min(s.rank) FROM sok s WHERE NOT EXISTS (SELECT 1 FROM fit g WHERE g.i = s.i)
    ), 9223372036854775807)
), leased AS (
    UPDATE attempts SET state = 'leased', until_at = NULL, tries = attempts.tries + 1,
        holder = ok.holder, token = ok.token, granted_at = ok.now,
        expires_at = ok.expires_at, lapses_at = ok.expires_at + ok.lapse_backoff_ms,
        changed_at = ok.now
    FROM ok
    WHERE attempts.task = ok.id AND attempts.number = 1
    RETURNING ok.i, attempts.number, attempts.state, attempts.until_at, attempts.tries,
        attempts.holder, attempts.token, attempts.granted_at, attempts.expires_at,
        attempts.lapses_at, attempts.discarded, attempts.last_error, ok.resource
), moved AS (
    UPDATE tasks SET last_token = ok.token, claimable_at = NULL
    FROM ok WHERE tasks.id = ok.id
    RETURNING ok.i, tasks.id
), audited AS (
    INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, ip_hash)
    SELECT ok.now, ok.claim_principal, ok.claim_namespace, ok.claim_action, ok.claim_outcome,
        ok.resource, ok.claim_ip_hash
    FROM ok ORDER BY ok.i
), go AS MATERIALIZED (
    SELECT s.i, s.id, s.accepted_at
    FROM sok s CROSS JOIN held h LEFT JOIN picked p ON p.rank = s.rank
    WHERE EXISTS (SELECT 1 FROM ok WHERE ok.i = s.i)
        OR (NOT (p.id IS NOT NULL OR h.lapsed IS NOT NULL OR h.configured)
            AND NOT EXISTS (
                SELECT 1 FROM picked q WHERE NOT EXISTS (SELECT 1 FROM ok WHERE ok.id = q.id)
            ))
), done AS (
    UPDATE attempts SET state = 'done', until_at = NULL, lapses_at = NULL, discarded = NULL,
        changed_at = c.now, idempotency_key = c.idempotency_key, digest = c.digest,
        accepted_at = go.accepted_at, output = c.output
    FROM go JOIN c ON c.i = go.i
    WHERE attempts.task = go.id AND attempts.number = 1
    RETURNING go.i, attempts.number, attempts.state, attempts.until_at, attempts.tries,
        attempts.holder, attempts.token, attempts.granted_at, attempts.expires_at,
        attempts.lapses_at, attempts.discarded, attempts.last_error, go.accepted_at
), submit_audited AS (
    INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, ip_hash)
    SELECT c.now, c.submit_principal, c.submit_namespace, c.submit_action, c.submit_outcome,
        c.submit_resource, c.submit_ip_hash
    FROM go JOIN c ON c.i = go.i ORDER BY go.i
)
SELECT
    CASE WHEN d.number IS NOT NULL THEN 'submitted' ELSE 'declined' END AS outcome,
    st.id AS task_id, st.queue AS task_queue, st.task_id AS task_task_id,
    st.version AS task_version, st.brief AS task_brief, st.brief_format AS task_brief_format,
    st.lapse_backoff_ms AS task_lapse_backoff_ms, st.last_token AS task_last_token,
    st.claimable_at AS task_claimable_at, st.created_at AS task_created_at,
    st.max_tries AS task_max_tries, st.priority AS task_priority,
    sa.number AS before_number, sa.state AS before_state, sa.until_at AS before_until_at,
    sa.tries AS before_tries, sa.holder AS before_holder, sa.token AS before_token,
    sa.granted_at AS before_granted_at, sa.expires_at AS before_expires_at,
    sa.lapses_at AS before_lapses_at, sa.discarded AS before_discarded,
    sa.last_error AS before_last_error,
    d.number AS after_number, d.state AS after_state, d.until_at AS after_until_at,
    d.tries AS after_tries, d.holder AS after_holder, d.token AS after_token,
    d.granted_at AS after_granted_at, d.expires_at AS after_expires_at,
    d.lapses_at AS after_lapses_at, d.discarded AS after_discarded,
    d.last_error AS after_last_error,
    CASE WHEN d.number IS NOT NULL THEN c.submit_resource END AS resource,
    st.partition_key AS task_partition_key, st.unique_key AS task_unique_key,
    st.unique_states AS task_unique_states, st.lease_ms AS task_lease_ms,
    st.deadline_at AS task_deadline_at,
    d.accepted_at AS accepted_at, 's' AS role, c.i AS caller
FROM c LEFT JOIN st ON st.i = c.i LEFT JOIN sa ON sa.i = c.i LEFT JOIN done d ON d.i = c.i
UNION ALL
-- Each claim's row, in the columns named above.
SELECT
    CASE WHEN l.number IS NOT NULL AND m.id IS NOT NULL THEN 'leased'
        WHEN (p.id IS NOT NULL OR h.lapsed IS NOT NULL OR h.configured) THEN 'declined'
        WHEN EXISTS (
            SELECT 1 FROM (VALUES (3), (2), (1), (0)) AS each(level) CROSS JOIN LATERAL (
                SELECT 1 FROM tasks t
                WHERE t.namespace = $1 /* namespace */ AND t.queue = $2 /* queue */
                    AND t.claimable_at IS NOT NULL AND t.claimable_at <= $3::bigint /* search_now */
                    AND t.priority = each.level
                    AND NOT EXISTS (SELECT 1 FROM picked q WHERE q.id = t.id)
                ORDER BY t.claimable_at, t.id LIMIT 1
            ) AS turn
        ) THEN 'skipped'
        ELSE 'empty' END,
    p.id, p.queue, p.task_id, p.version, p.brief, p.brief_format, p.lapse_backoff_ms,
    p.last_token, p.claimable_at, p.created_at, p.max_tries, p.priority,
    a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at, a.expires_at,
    a.lapses_at, a.discarded, a.last_error,
    l.number, l.state, l.until_at, l.tries, l.holder, l.token, l.granted_at, l.expires_at,
    l.lapses_at, l.discarded, l.last_error,
    l.resource, p.partition_key, p.unique_key, p.unique_states, p.lease_ms, p.deadline_at,
    NULL::bigint, 'c', s.i
FROM sok s CROSS JOIN held h LEFT JOIN picked p ON p.rank = s.rank
    LEFT JOIN attempt a ON a.rank = s.rank LEFT JOIN leased l ON l.i = s.i
    LEFT JOIN moved m ON m.i = s.i
