//! Counting rows written and read, so cost tables come from code.

use std::ops::Sub;

use serde::{Deserialize, Serialize};

/// Totals since the store was opened, as SQLite meters them (a backend
/// that does not meter rows, such as PostgreSQL, counts write
/// transactions, refusals and table rows changed; see
/// [`Store::meters_rows`](crate::Store::meters_rows)).
///
/// - **Rows written**: every table row inserted, updated or deleted in a
///   committed transaction, plus one per index entry the change touches, as
///   storage providers bill them. An insert or delete touches every index of
///   its table; an update touches the indexes holding a column the statement
///   assigns, and the partial indexes whose `WHERE` reads one, since the row
///   may enter or leave them (a partial index is counted like a full one: an
///   upper bound).
///   Creating a schema object counts one row, its `sqlite_master` entry.
///   Rolled-back and refused work counts nothing. Measured with SQLite's
///   update hook on the write connection, and for `WITHOUT ROWID` tables
///   (whose key is the table, so a row is one entry), which the hook does
///   not see, from each statement's change count.
/// - **Rows read**: rows the store's statements returned to it; a lookup
///   that finds nothing reads zero rows.
///
/// Take one before and one after an operation and subtract
/// ([`since`](Self::since)) for that operation's cost; concurrent operations
/// on the same store are included in the difference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeterSnapshot {
    /// Rows written, index entries included (see the module docs).
    pub rows_written: u64,
    /// Rows returned by the store's statements.
    pub rows_read: u64,
    /// Write transactions committed that wrote at least one row (a claim
    /// that finds its queue empty on the write path commits nothing). On
    /// SQLite the writes of concurrent callers share transactions (group
    /// commit), so this can be less than the number of writing operations;
    /// rows are counted per operation.
    pub write_transactions: u64,
    /// Write transactions refused as a storage quota refusal.
    pub refused_writes: u64,
}

impl MeterSnapshot {
    /// What happened between `earlier` and this snapshot.
    #[must_use]
    pub fn since(&self, earlier: &MeterSnapshot) -> MeterSnapshot {
        MeterSnapshot {
            rows_written: self.rows_written.saturating_sub(earlier.rows_written),
            rows_read: self.rows_read.saturating_sub(earlier.rows_read),
            write_transactions: self
                .write_transactions
                .saturating_sub(earlier.write_transactions),
            refused_writes: self.refused_writes.saturating_sub(earlier.refused_writes),
        }
    }
}

impl Sub for MeterSnapshot {
    type Output = MeterSnapshot;

    fn sub(self, earlier: MeterSnapshot) -> MeterSnapshot {
        self.since(&earlier)
    }
}
