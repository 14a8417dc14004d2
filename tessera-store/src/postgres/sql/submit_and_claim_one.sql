-- A submission and the next claim in one statement: the submission of
-- the one shape it decides, accepted, with `claim_one.sql`'s claim, or
-- nothing at all.
--
-- Arguments, in the order `ClaimArgs::params` then `SubmitArgs::params`
-- build them:
--   $1 to $10 `claim_one.sql`'s: namespace, queue, now, holder,
--   expires_at, claim_principal, claim_namespace, claim_action,
--   claim_outcome, claim_ip_hash;
--   $11 task_namespace, $12 task_id, $13 task_version (the submitted
--   task), $14 token, $15 submitter, $16 idempotency_key, $17 digest,
--   $18 output, $19 to $24 the submission's audit row:
--   submit_principal, submit_namespace, submit_action, submit_outcome,
--   submit_resource, submit_ip_hash.
--
-- `st` takes the submitted task's key-share lock: it conflicts with
-- every transaction that locks the task `FOR UPDATE` (a cancel, the
-- general submission and claims), but not with a claim's `FOR NO KEY
-- UPDATE` (see `claim_one.sql`), which can only grant the task by
-- changing its attempt. `sa` locks that attempt, so it is read as its
-- newest version (as `lock_and_load.sql` reads it): whatever changes the
-- attempt (a grant, a lapse, a cancel, another submission) locks it too,
-- so the two are ordered there.
--
-- `sok` is the one shape decided here: a single attempt, leased under
-- the token to the submitter and not expired, no unique slot, no
-- children waiting on the task (their edges end in the general
-- transaction; a child's enqueue locks its parent `FOR UPDATE` before it
-- counts itself there, so `st`, waiting on that lock, reads the count
-- the enqueue wrote), no receipt
-- under the key (the task's id comes in as a scalar, so the search is
-- one descent of `attempts_receipt_key` on all three columns). It stamps the
-- acceptance at the later of now and the grant, as the lease rules do
-- (`rules.rs`).
--
-- From `picked` to `audited` the claim is `claim_one.sql`'s, made only
-- with the submission (`ok`'s last condition). The submission is written
-- only when the claim is made or the queue is empty (`go`): a claim the
-- statement declines leaves both to the general transaction. `done`
-- (the attempt ended with its receipt) and the audit row are both
-- written for `go`'s row or neither is.
--
-- Two rows: the submission's (`role` `s`: `outcome` `submitted` or
-- `declined`, the task and its attempt as they were, the attempt as
-- written, the audit row's resource, the acceptance time) first, so that
-- the plan locks the submitted task before it picks the next, then the
-- claim's (`role` `c`), in `claim_one.sql`'s columns.
WITH st AS MATERIALIZED (
    SELECT id, queue, task_id, version, NULL::bytea AS brief, brief_format,
        lapse_backoff_ms, last_token, claimable_at, created_at, max_tries, priority,
        partition_key, unique_key, unique_states, lease_ms, deadline_at, alternatives, children
    FROM tasks
    WHERE namespace = $11 /* task_namespace */ AND task_id = $12 /* task_id */
        AND version = $13 /* task_version */
    FOR KEY SHARE
), sa AS MATERIALIZED (
    SELECT a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at,
        a.expires_at, a.lapses_at, a.discarded, a.last_error
    FROM attempts a JOIN st ON a.task = st.id
    WHERE a.number = 1 FOR UPDATE OF a
), sok AS (
    SELECT st.id, GREATEST($3::bigint /* now */, sa.granted_at) AS accepted_at
    FROM st JOIN sa ON true
    WHERE st.alternatives = 1 AND st.unique_states IS NULL AND st.children = 0
        AND sa.state = 'leased' AND sa.token = $14::bigint /* token */
        AND sa.holder = $15::text /* submitter */
        AND sa.expires_at > $3::bigint /* now */
        AND NOT EXISTS (
            SELECT 1 FROM attempts r
            WHERE r.task = (SELECT id FROM st) AND r.holder = $15::text /* submitter */
                AND r.idempotency_key = $16::text /* idempotency_key */
        )
), picked AS (
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
        AND EXISTS (SELECT 1 FROM sok)
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
), go AS (
    SELECT sok.id, sok.accepted_at
    FROM sok CROSS JOIN held h LEFT JOIN picked p ON true
    WHERE EXISTS (SELECT 1 FROM ok)
        OR NOT (p.id IS NOT NULL OR h.lapsed IS NOT NULL OR h.configured)
), done AS (
    UPDATE attempts SET state = 'done', until_at = NULL, lapses_at = NULL, discarded = NULL,
        changed_at = $3::bigint /* now */, idempotency_key = $16::text /* idempotency_key */,
        digest = $17::text /* digest */, accepted_at = go.accepted_at,
        output = $18::bytea /* output */
    FROM go
    WHERE attempts.task = go.id AND attempts.number = 1
    RETURNING attempts.number, attempts.state, attempts.until_at, attempts.tries,
        attempts.holder, attempts.token, attempts.granted_at, attempts.expires_at,
        attempts.lapses_at, attempts.discarded, attempts.last_error, go.accepted_at
), submit_audited AS (
    INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, ip_hash)
    SELECT $3::bigint /* now */, $19::text /* submit_principal */,
        $20::text /* submit_namespace */, $21::text /* submit_action */,
        $22::text /* submit_outcome */, $23::text /* submit_resource */,
        $24::text /* submit_ip_hash */
    FROM go
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
    CASE WHEN d.number IS NOT NULL THEN $23::text /* submit_resource */ END AS resource,
    st.partition_key AS task_partition_key, st.unique_key AS task_unique_key,
    st.unique_states AS task_unique_states, st.lease_ms AS task_lease_ms,
    st.deadline_at AS task_deadline_at,
    d.accepted_at AS accepted_at, 's' AS role
FROM (SELECT 1) AS one LEFT JOIN st ON true LEFT JOIN sa ON true LEFT JOIN done d ON true
UNION ALL
-- The claim's row, in the columns named above.
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
        ELSE 'empty' END,
    p.id, p.queue, p.task_id, p.version, p.brief, p.brief_format, p.lapse_backoff_ms,
    p.last_token, p.claimable_at, p.created_at, p.max_tries, p.priority,
    a.number, a.state, a.until_at, a.tries, a.holder, a.token, a.granted_at, a.expires_at,
    a.lapses_at, a.discarded, a.last_error,
    l.number, l.state, l.until_at, l.tries, l.holder, l.token, l.granted_at, l.expires_at,
    l.lapses_at, l.discarded, l.last_error,
    l.resource, p.partition_key, p.unique_key, p.unique_states, p.lease_ms, p.deadline_at,
    NULL::bigint, 'c'
FROM held h LEFT JOIN picked p ON true LEFT JOIN attempt a ON true
    LEFT JOIN leased l ON true LEFT JOIN moved m ON true
