//! The live row counters behind [`MeterSnapshot`], fed by the write
//! connection's hooks and the readers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::meter::MeterSnapshot;

/// The live counters behind [`MeterSnapshot`].
#[derive(Debug, Default)]
pub(crate) struct Meter {
    rows_written: AtomicU64,
    rows_read: AtomicU64,
    write_transactions: AtomicU64,
    refused_writes: AtomicU64,
}

impl Meter {
    pub(crate) fn read(&self, rows: u64) {
        self.rows_read.fetch_add(rows, Ordering::Relaxed);
    }

    /// A commit of `rows`; one that wrote none (an empty claim or a
    /// replay on the write path) is no write transaction.
    pub(crate) fn committed(&self, rows: u64) {
        if rows > 0 {
            self.rows_written.fetch_add(rows, Ordering::Relaxed);
            self.write_transactions.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn refused(&self) {
        self.refused_by(1);
    }

    /// Counts `operations` refused writes at once: the operations of a
    /// refused batch.
    pub(crate) fn refused_by(&self, operations: usize) {
        self.refused_writes
            .fetch_add(operations as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MeterSnapshot {
        MeterSnapshot {
            rows_written: self.rows_written.load(Ordering::Relaxed),
            rows_read: self.rows_read.load(Ordering::Relaxed),
            write_transactions: self.write_transactions.load(Ordering::Relaxed),
            refused_writes: self.refused_writes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_field_by_field() {
        let meter = Meter::default();
        meter.committed(3);
        let before = meter.snapshot();
        meter.committed(4);
        meter.read(2);
        meter.refused();
        let delta = meter.snapshot() - before;
        assert_eq!(
            delta,
            MeterSnapshot {
                rows_written: 4,
                rows_read: 2,
                write_transactions: 1,
                refused_writes: 1,
            }
        );
    }
}
