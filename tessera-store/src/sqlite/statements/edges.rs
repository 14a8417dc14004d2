//! The `task_edges` table: a child task waiting on a parent, written at
//! the child's enqueue and marked ended, once, in the transaction that
//! ends the parent.

use rusqlite::params;

use crate::sqlite::readers::Reader;
use crate::sqlite::writer::Writer;

pub(crate) const INSERT_EDGE: &str = "INSERT INTO task_edges \
     (parent, child, run_after, ended, place) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (parent, child) DO NOTHING";

/// Writes one edge (`ended`: how its parent ended already, if it has;
/// `place`: the parent's place in the child's list); a repeated one
/// changes nothing.
pub(crate) fn insert_edge(
    writer: &Writer<'_>,
    (parent, child): (i64, i64),
    run_after: &str,
    ended: Option<&str>,
    place: i64,
) -> rusqlite::Result<usize> {
    writer.execute(INSERT_EDGE, params![parent, child, run_after, ended, place])
}

pub(crate) const OPEN_CHILDREN: &str = "SELECT e.child, e.run_after, t.namespace, t.task_id, \
     t.version FROM task_edges e JOIN tasks t ON t.id = e.child \
     WHERE e.parent = ?1 AND e.ended IS NULL ORDER BY e.child";

pub(crate) const END_EDGES: &str =
    "UPDATE task_edges SET ended = ?2 WHERE parent = ?1 AND ended IS NULL";

/// An open edge of a parent: the child's row id, its rule, and its
/// namespace, id and version.
pub(crate) type OpenChild = (i64, String, String, String, i64);

/// Marks the open edges of `parent` ended as `end`, and answers them.
pub(crate) fn end_edges(
    writer: &Writer<'_>,
    parent: i64,
    end: &str,
) -> rusqlite::Result<Vec<OpenChild>> {
    let reader: &Reader<'_> = writer;
    let children = reader.all(OPEN_CHILDREN, [parent], |row| {
        Ok((
            row.get("child")?,
            row.get("run_after")?,
            row.get("namespace")?,
            row.get("task_id")?,
            row.get("version")?,
        ))
    })?;
    if !children.is_empty() {
        writer.execute(END_EDGES, params![parent, end])?;
    }
    Ok(children)
}

pub(crate) const PARENTS_OF: &str = "SELECT t.namespace, t.task_id, t.version \
     FROM task_edges e JOIN tasks t ON t.id = e.parent WHERE e.child = ?1 ORDER BY e.place";

/// The parents of `child`: each one's namespace, id and version.
pub(crate) fn parents_of(
    reader: &Reader<'_>,
    child: i64,
) -> rusqlite::Result<Vec<(String, String, i64)>> {
    reader.all(PARENTS_OF, [child], |row| {
        Ok((
            row.get("namespace")?,
            row.get("task_id")?,
            row.get("version")?,
        ))
    })
}

pub(crate) const PARENT_OF_WAITING: &str = "SELECT EXISTS (SELECT 1 FROM task_edges e \
     JOIN attempts a ON a.task = e.child WHERE e.parent = ?1 AND a.state = 'waiting') AS kept";

/// Whether a child of `parent` still waits.
pub(crate) fn parent_of_waiting(reader: &Reader<'_>, parent: i64) -> rusqlite::Result<bool> {
    Ok(reader
        .optional(PARENT_OF_WAITING, [parent], |row| row.get("kept"))?
        .unwrap_or(false))
}

pub(crate) const OPEN_PARENTS: &str =
    "SELECT count(*) AS open FROM task_edges WHERE child = ?1 AND ended IS NULL";

/// How many parents of `child` have not ended.
pub(crate) fn open_parents(reader: &Reader<'_>, child: i64) -> rusqlite::Result<i64> {
    Ok(reader
        .optional(OPEN_PARENTS, [child], |row| row.get("open"))?
        .unwrap_or(0))
}
