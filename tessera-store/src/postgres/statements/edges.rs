//! The `task_edges` table: a child task waiting on a parent, written at
//! the child's enqueue and marked ended, once, in the transaction that
//! ends the parent.

/// Writes edges (one array element an edge: parent, child, rule, how the
/// parent ended already if it has, and its place in the child's list), a
/// repeated one changing nothing, and counts each parent's new children
/// on its row, where the one-statement submissions look
/// (`submit_and_claim_one.sql`): they leave a task with children to the
/// general transaction, which ends its edges.
pub(in crate::postgres) const INSERT_EDGES: &str = "WITH e AS (INSERT INTO task_edges \
     (parent, child, run_after, ended, place) SELECT * FROM unnest($1::bigint[], $2::bigint[], \
     $3::text[], $4::text[], $5::bigint[]) \
     ON CONFLICT (parent, child) DO NOTHING RETURNING parent) \
     UPDATE tasks t SET children = t.children + n.added \
     FROM (SELECT parent, count(*) AS added FROM e GROUP BY parent) AS n WHERE t.id = n.parent";

/// Marks the open edges of each parent (one array element a parent: its
/// row id and how it ended) ended, and answers each child's reference
/// and rule with the parent's end.
pub(in crate::postgres) const END_EDGES: &str = "WITH e AS (UPDATE task_edges SET ended = p.ended \
     FROM unnest($1::bigint[], $2::text[]) AS p(parent, ended) \
     WHERE task_edges.parent = p.parent AND task_edges.ended IS NULL \
     RETURNING task_edges.child, task_edges.run_after, p.ended) \
     SELECT t.namespace, t.task_id, t.version, e.run_after, e.ended \
     FROM e JOIN tasks t ON t.id = e.child ORDER BY t.id";

/// The parents of a child, in the order they were stored.
pub(in crate::postgres) const PARENTS_OF: &str = "SELECT t.namespace, t.task_id, t.version \
     FROM task_edges e JOIN tasks t ON t.id = e.parent WHERE e.child = $1 ORDER BY e.place";

/// Of the parents named (one array element a row id), those with a child
/// still waiting.
pub(in crate::postgres) const PARENTS_OF_WAITING: &str = "SELECT DISTINCT e.parent \
     FROM task_edges e JOIN attempts a ON a.task = e.child \
     WHERE e.parent = ANY($1) AND a.state = 'waiting'";

/// How many parents of a child have not ended.
pub(in crate::postgres) const OPEN_PARENTS: &str =
    "SELECT count(*) FROM task_edges WHERE child = $1 AND ended IS NULL";
