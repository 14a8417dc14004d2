//! The `namespaces` table, and a purged session's tasks with their rows.

pub(in crate::postgres) const INSERT_NAMESPACE: &str = "INSERT INTO namespaces (name, kind, created_at, purge_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING";
pub(in crate::postgres) const NAMESPACE_EXISTS: &str = "SELECT 1 FROM namespaces WHERE name = $1";
/// A page of namespace names, after `$1`, at most `$2`.
pub(in crate::postgres) const NAMESPACE_NAMES: &str =
    "SELECT name FROM namespaces WHERE name > $1 ORDER BY name LIMIT $2";
/// A session namespace's row, held while an enqueue writes into it, so a
/// purge passes it over until the enqueue commits; nothing if it is gone.
pub(in crate::postgres) const LOCK_NAMESPACE: &str =
    "SELECT 1 FROM namespaces WHERE name = $1 FOR KEY SHARE";
/// A batch of purged sessions' namespaces, locked or skipped: one an
/// enqueue holds ([`LOCK_NAMESPACE`]) waits for a later batch. Their tasks
/// are counted by [`PURGE_EMPTY_NAMESPACES`], a later statement, which sees
/// every enqueue committed before these locks were taken.
pub(in crate::postgres) const LOCK_PURGED_NAMESPACES: &str = "SELECT id FROM namespaces \
     WHERE purge_at IS NOT NULL AND purge_at <= $1 \
     ORDER BY purge_at LIMIT $2 FOR UPDATE SKIP LOCKED";
/// The namespaces of `$1` ([`LOCK_PURGED_NAMESPACES`]) that hold no task.
pub(in crate::postgres) const PURGE_EMPTY_NAMESPACES: &str = "DELETE FROM namespaces WHERE id = ANY($1) \
     AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.namespace = namespaces.name)";
/// A batch of purged sessions' tasks, locked or skipped, deleted with
/// their attempts (and so their receipts) in one statement.
pub(in crate::postgres) const PURGE_SESSION_TASKS: &str = "WITH doomed AS (SELECT t.id FROM namespaces n \
     JOIN tasks t ON t.namespace = n.name WHERE n.purge_at IS NOT NULL AND n.purge_at <= $1 \
     ORDER BY t.id LIMIT $2 FOR UPDATE OF t SKIP LOCKED), \
     attempts_gone AS (DELETE FROM attempts WHERE task IN (SELECT id FROM doomed)), \
     edges_gone AS (DELETE FROM task_edges WHERE child IN (SELECT id FROM doomed)) \
     DELETE FROM tasks WHERE id IN (SELECT id FROM doomed)";
