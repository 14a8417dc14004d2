-- Many tasks, in order; a reference that exists (or came earlier in the
-- call) is skipped. Answers what it inserted: id, namespace, task_id,
-- version.
--
-- Arguments, in the order `InsertTasksArgs::params` builds them, one
-- array a column, one element a task.
INSERT INTO tasks (namespace, queue, task_id, version, brief, brief_format, alternatives,
    lapse_backoff_ms, max_tries, last_token, claimable_at, created_at, enqueued_by, priority,
    partition_key, unique_key, unique_slot, unique_states, lease_ms, deadline_at)
SELECT namespace, queue, task_id, version, brief, brief_format, alternatives,
    lapse_backoff_ms, max_tries, 0, claimable_at, created_at, enqueued_by, priority,
    partition_key, unique_key, unique_slot, unique_states, lease_ms, deadline_at
FROM unnest($1::text[] /* namespace */, $2::text[] /* queue */, $3::text[] /* task_id */,
    $4::bigint[] /* version */, $5::bytea[] /* brief */, $6::text[] /* brief_format */,
    $7::bigint[] /* alternatives */, $8::bigint[] /* lapse_backoff_ms */,
    $9::bigint[] /* max_tries */, $10::bigint[] /* claimable_at */,
    $11::bigint[] /* created_at */, $12::text[] /* enqueued_by */,
    $13::bigint[] /* priority */, $14::text[] /* partition_key */,
    $15::text[] /* unique_key */, $16::text[] /* unique_slot */,
    $17::bigint[] /* unique_states */, $18::bigint[] /* lease_ms */,
    $19::bigint[] /* deadline_at */)
    WITH ORDINALITY AS n(namespace, queue, task_id, version, brief, brief_format,
        alternatives, lapse_backoff_ms, max_tries, claimable_at, created_at, enqueued_by,
        priority, partition_key, unique_key, unique_slot, unique_states, lease_ms,
        deadline_at, place)
ORDER BY place
ON CONFLICT (namespace, task_id, version) DO NOTHING
RETURNING id, namespace, task_id, version
