-- The receipts stored under many (principal, task, idempotency key),
-- each read from the attempt it ended under `receipt_row`'s names, then
-- `place`: the key's, from 1.
--
-- Arguments, in the order `receipts_by_keys_args` builds them, one array
-- element a key: $1 principals, $2 tasks, $3 idempotency_keys.
--
-- The fenced lateral search (`OFFSET 0`) keeps a generic plan made while
-- the table was small on the task's attempts, instead of a hash join
-- over every attempt.
SELECT r.number AS attempt, r.token, r.holder AS principal, r.idempotency_key, r.digest,
    r.accepted_at, r.output, k.place
FROM unnest($1::text[] /* principals */, $2::bigint[] /* tasks */,
    $3::text[] /* idempotency_keys */) WITH ORDINALITY
    AS k(principal, task, idempotency_key, place)
CROSS JOIN LATERAL (
    SELECT * FROM attempts r
    WHERE r.task = k.task AND r.holder = k.principal
        AND r.idempotency_key = k.idempotency_key
    OFFSET 0
) r
