//! The `unique_slots` table: the slot a unique task holds in its queue,
//! taken at enqueue, freed when the task leaves its unique states, and
//! purged once its window ended.

use rusqlite::params;

use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const TAKE_UNIQUE_SLOT: &str = "INSERT INTO unique_slots \
     (namespace, queue, slot, task_id, version, ends_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
     ON CONFLICT (namespace, queue, slot) DO NOTHING";

pub(crate) const UNIQUE_SLOT_HOLDER: &str = "SELECT task_id, version FROM unique_slots \
     WHERE namespace = ?1 AND queue = ?2 AND slot = ?3";

/// What taking a unique slot found.
#[derive(Debug)]
pub(crate) enum Take {
    /// The slot is the task's now.
    Taken,
    /// Another task holds it: that task's id and version.
    Held(String, i64),
    /// The slot was taken, yet no row holds it.
    HolderMissing,
}

/// Takes a queue's slot for task (`task_id`, `version`) until `ends_at`
/// (for good when `None`); if another task holds it, reads which.
pub(crate) fn take_unique_slot(
    writer: &Writer<'_>,
    namespace: &str,
    queue: &str,
    slot: &str,
    (task_id, version): (&str, i64),
    ends_at: Option<i64>,
) -> rusqlite::Result<Take> {
    let taken = writer.execute(
        TAKE_UNIQUE_SLOT,
        params![namespace, queue, slot, task_id, version, ends_at],
    )?;
    if taken == 1 {
        return Ok(Take::Taken);
    }
    let reader: &Reader<'_> = writer;
    let holder = reader.optional(UNIQUE_SLOT_HOLDER, params![namespace, queue, slot], |row| {
        Ok((row.get("task_id")?, row.get("version")?))
    })?;
    Ok(match holder {
        Some((task_id, version)) => Take::Held(task_id, version),
        None => Take::HolderMissing,
    })
}

pub(crate) const FREE_UNIQUE_SLOT: &str =
    "DELETE FROM unique_slots WHERE namespace = ?1 AND queue = ?2 AND slot = ?3";

/// Frees a queue's slot, whoever holds it.
pub(crate) fn free_unique_slot(
    writer: &Writer<'_>,
    namespace: &str,
    queue: &str,
    slot: &str,
) -> rusqlite::Result<()> {
    writer.execute(FREE_UNIQUE_SLOT, params![namespace, queue, slot])?;
    Ok(())
}

/// A task's slot row, then its slot columns.
pub(crate) const RELEASE_UNIQUE_SLOT: [&str; 2] = [
    "DELETE FROM unique_slots WHERE (namespace, queue, slot) = \
     (SELECT namespace, queue, unique_slot FROM tasks WHERE id = ?1)",
    "UPDATE tasks SET unique_slot = NULL, unique_states = NULL WHERE id = ?1",
];

/// Frees the slot task row `id` holds, and forgets it on the task.
pub(crate) fn release_unique_slot(writer: &Writer<'_>, id: i64) -> rusqlite::Result<()> {
    for statement in RELEASE_UNIQUE_SLOT {
        writer.execute(statement, [id])?;
    }
    Ok(())
}

/// Up to `?2` unique slots whose window ended at or before `?1`, oldest
/// first: one range of the partial `unique_slots_ending` index.
pub(crate) const PURGE_ENDED_SLOTS: &str = "DELETE FROM unique_slots WHERE (namespace, queue, slot) \
     IN (SELECT namespace, queue, slot FROM unique_slots WHERE ends_at IS NOT NULL \
     AND ends_at <= ?1 ORDER BY ends_at LIMIT ?2)";

/// One batch of slots whose window ended (see [`PURGE_ENDED_SLOTS`]);
/// returns how many it deleted.
pub(crate) fn purge_ended_slots(
    writer: &Writer<'_>,
    cutoff: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    writer.execute(PURGE_ENDED_SLOTS, params![cutoff, limit])
}
