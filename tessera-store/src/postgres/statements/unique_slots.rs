//! The `unique_slots` table: a unique key's slot, taken, held, freed.

/// Takes a unique slot unless it is held; waits for a transaction that is
/// taking it.
pub(in crate::postgres) const TAKE_UNIQUE_SLOT: &str = "INSERT INTO unique_slots \
     (namespace, queue, slot, task_id, version, ends_at) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (namespace, queue, slot) DO NOTHING";
/// Up to `$2` unique slots whose window ended at or before `$1`, oldest
/// first: one range of the partial `unique_slots_ending` index.
pub(in crate::postgres) const PURGE_ENDED_SLOTS: &str = "DELETE FROM unique_slots WHERE (namespace, queue, slot) \
     IN (SELECT namespace, queue, slot FROM unique_slots WHERE ends_at IS NOT NULL \
     AND ends_at <= $1 ORDER BY ends_at LIMIT $2)";
pub(in crate::postgres) const UNIQUE_SLOT_HOLDER: &str = "SELECT task_id, version FROM unique_slots \
     WHERE namespace = $1 AND queue = $2 AND slot = $3";
pub(in crate::postgres) const FREE_UNIQUE_SLOT: &str =
    "DELETE FROM unique_slots WHERE namespace = $1 AND queue = $2 AND slot = $3";
/// A task's slot row and its slot columns, in one statement.
/// (Every part reads the statement's snapshot, so `held` sees the slot
/// `cleared` sets to `NULL`.)
pub(in crate::postgres) const RELEASE_UNIQUE_SLOT: &str = "WITH held AS (SELECT namespace, queue, \
     unique_slot AS slot FROM tasks WHERE id = $1 AND unique_slot IS NOT NULL), \
     cleared AS (UPDATE tasks SET unique_slot = NULL, unique_states = NULL \
     WHERE id = $1 AND unique_slot IS NOT NULL RETURNING 1) \
     DELETE FROM unique_slots s USING held h \
     WHERE s.namespace = h.namespace AND s.queue = h.queue AND s.slot = h.slot";
