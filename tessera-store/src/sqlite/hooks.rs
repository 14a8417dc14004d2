//! The write connection's SQLite hooks: the update hook and the authorizer
//! that together meter rows written (index entries included), and the
//! authorizer's refusal of writes like a provider with a spent allowance.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use rusqlite::hooks::{Action, AuthAction, Authorization};

/// What a statement writes, learned by the authorizer as it is prepared.
#[derive(Debug, Default)]
pub(super) struct Effects {
    /// The `(table, column)` pairs it assigns.
    pub(super) assigned: Vec<(String, String)>,
    /// The tables it inserts into or deletes from.
    pub(super) whole_rows: Vec<String>,
    /// The tables it updates.
    pub(super) updated: Vec<String>,
}

/// What each statement run through
/// [`Writer::execute`](super::writer::Writer::execute) writes, by SQL text.
pub(super) type AssignmentCache = RefCell<HashMap<String, Arc<Effects>>>;

/// State shared between the write connection and its SQLite hooks.
#[derive(Debug, Default)]
pub(crate) struct HookState {
    /// Whether the authorizer denies every write-capable statement.
    pub(crate) refusing: AtomicBool,
    /// Rows written by the open transaction, index entries included.
    pub(super) pending_rows: AtomicU64,
    pub(super) inner: Mutex<HookInner>,
}

#[derive(Debug, Default)]
pub(super) struct HookInner {
    /// Each index's columns, by table: those it holds and those its
    /// `WHERE` reads; loaded once from the live schema.
    pub(super) indexes: HashMap<String, Vec<Vec<String>>>,
    /// `WITHOUT ROWID` tables, which the update hook does not see.
    pub(super) without_rowid: HashSet<String>,
    /// What the statement being prepared writes, as the authorizer sees it.
    pub(super) collecting: Option<Effects>,
    /// What the statement being run writes.
    pub(super) running: Option<Arc<Effects>>,
}

impl HookState {
    pub(super) fn rows_for(&self, action: Action, table: &str) -> u64 {
        let inner = self.inner.lock();
        let Some(indexes) = inner.indexes.get(table) else {
            return 1;
        };
        let touched = match action {
            Action::SQLITE_UPDATE => match &inner.running {
                Some(effects) => indexes
                    .iter()
                    .filter(|columns| {
                        columns.iter().any(|column| {
                            effects
                                .assigned
                                .iter()
                                .any(|(t, c)| t == table && c == column)
                        })
                    })
                    .count(),
                None => indexes.len(),
            },
            _ => indexes.len(),
        };
        1 + touched as u64
    }

    /// Rows written by the running statement, which changed `changed` rows,
    /// if it writes a `WITHOUT ROWID` table: the update hook does not see
    /// those, so each changed row counts as a hooked one would (an upsert
    /// as an insert, an upper bound).
    pub(super) fn unhooked_rows(&self, changed: usize) -> u64 {
        let unhooked = {
            let inner = self.inner.lock();
            let Some(effects) = &inner.running else {
                return 0;
            };
            // A statement writes one table: the store uses no triggers.
            let inserted = effects
                .whole_rows
                .iter()
                .map(|t| (t, Action::SQLITE_INSERT));
            let updated = effects.updated.iter().map(|t| (t, Action::SQLITE_UPDATE));
            inserted
                .chain(updated)
                .find(|(table, _)| inner.without_rowid.contains(*table))
                .map(|(table, action)| (table.clone(), action))
        };
        unhooked.map_or(0, |(table, action)| {
            self.rows_for(action, &table) * changed as u64
        })
    }

    pub(super) fn authorize(&self, context: &AuthAction<'_>) -> Authorization {
        if let Some(effects) = self.inner.lock().collecting.as_mut() {
            match *context {
                AuthAction::Update {
                    table_name,
                    column_name,
                } => {
                    effects
                        .assigned
                        .push((table_name.to_owned(), column_name.to_owned()));
                    if !effects.updated.iter().any(|t| t == table_name) {
                        effects.updated.push(table_name.to_owned());
                    }
                }
                AuthAction::Insert { table_name } | AuthAction::Delete { table_name }
                    if !effects.whole_rows.iter().any(|t| t == table_name) =>
                {
                    effects.whole_rows.push(table_name.to_owned());
                }
                _ => {}
            }
        }
        if self.refusing.load(Ordering::Relaxed) && is_write_capable(context) {
            Authorization::Deny
        } else {
            Authorization::Allow
        }
    }

    pub(crate) fn add_pending(&self, rows: u64) {
        self.pending_rows.fetch_add(rows, Ordering::Relaxed);
    }
}

/// The columns of `table_columns` that the `WHERE` clause of the
/// `CREATE INDEX` statement `sql` names. String literals are skipped; a
/// name is matched as SQLite does, ignoring ASCII case.
pub(super) fn filter_columns(sql: &str, table_columns: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_filter = false;
    let mut chars = sql.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let name = match c {
            '\'' => {
                // A literal ends at a quote not doubled.
                while let Some((_, c)) = chars.next() {
                    if c == '\'' && chars.next_if(|&(_, c)| c == '\'').is_none() {
                        break;
                    }
                }
                continue;
            }
            '"' | '`' | '[' => {
                let close = if c == '[' { ']' } else { c };
                let mut name = String::new();
                for (_, c) in chars.by_ref() {
                    if c == close {
                        break;
                    }
                    name.push(c);
                }
                name
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut end = start + c.len_utf8();
                while let Some((i, c)) =
                    chars.next_if(|&(_, c)| c.is_ascii_alphanumeric() || c == '_' || c == '$')
                {
                    end = i + c.len_utf8();
                }
                let word = &sql[start..end];
                if !in_filter {
                    in_filter = word.eq_ignore_ascii_case("where");
                    continue;
                }
                word.to_owned()
            }
            _ => continue,
        };
        if let Some(column) = table_columns
            .iter()
            .find(|column| in_filter && column.eq_ignore_ascii_case(&name))
        {
            if !found.contains(column) {
                found.push(column.clone());
            }
        }
    }
    found
}

/// Whether a statement with this action could change the database, as a
/// provider that refuses every write-capable statement sees it. Reads,
/// schema introspection (`pragma_table_info(...)` and the like) and opening
/// or ending transactions are allowed; a pragma assignment is refused.
fn is_write_capable(action: &AuthAction<'_>) -> bool {
    match action {
        AuthAction::Select
        | AuthAction::Read { .. }
        | AuthAction::Function { .. }
        | AuthAction::Recursive
        | AuthAction::Transaction { .. }
        | AuthAction::Savepoint { .. } => false,
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => pragma_value.is_some() && !is_introspection(pragma_name),
        _ => true,
    }
}

/// Pragmas that only describe the schema, whatever their argument.
fn is_introspection(pragma: &str) -> bool {
    matches!(
        pragma.to_ascii_lowercase().as_str(),
        "table_info"
            | "table_xinfo"
            | "table_list"
            | "index_list"
            | "index_info"
            | "index_xinfo"
            | "foreign_key_list"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_capable_actions_are_refused_and_reads_are_not() {
        assert!(!is_write_capable(&AuthAction::Select));
        assert!(!is_write_capable(&AuthAction::Read {
            table_name: "t",
            column_name: "c"
        }));
        assert!(!is_write_capable(&AuthAction::Pragma {
            pragma_name: "journal_mode",
            pragma_value: None
        }));
        assert!(is_write_capable(&AuthAction::Pragma {
            pragma_name: "journal_mode",
            pragma_value: Some("wal")
        }));
        assert!(!is_write_capable(&AuthAction::Pragma {
            pragma_name: "table_info",
            pragma_value: Some("access_keys")
        }));
        assert!(is_write_capable(&AuthAction::Insert { table_name: "t" }));
        assert!(is_write_capable(&AuthAction::CreateTable {
            table_name: "t"
        }));
    }
}
