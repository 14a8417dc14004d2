-- The attempts of many new tasks.
--
-- Arguments, in the order `InsertAttemptsArgs::params` builds them, one
-- array a column, one element an attempt.
INSERT INTO attempts (task, number, namespace, queue, state, until_at, tries, priority,
    changed_at)
SELECT task, number, namespace, queue, state, until_at, 0, priority, changed_at
FROM unnest($1::bigint[] /* task */, $2::bigint[] /* number */, $3::text[] /* namespace */,
    $4::text[] /* queue */, $5::text[] /* state */, $6::bigint[] /* until_at */,
    $7::bigint[] /* priority */, $8::bigint[] /* changed_at */)
    AS a(task, number, namespace, queue, state, until_at, priority, changed_at)
