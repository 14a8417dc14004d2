//! PostgreSQL's faults as the store classifies them.

use postgres::error::SqlState;

use crate::error::{Error, StorageError, StorageErrorKind};

impl From<postgres::Error> for StorageError {
    /// Classifies by SQLSTATE: class 53 (insufficient resources: a full
    /// disk, too many connections) is a quota refusal; serialization
    /// failures, deadlocks, a cancelled statement (a timeout), a server
    /// shutting down and a lost connection are retryable; a unique
    /// violation is a conflict, but one of [`RACED_REFERENCE`] a lost
    /// race, retryable; data corruption is corrupt.
    fn from(error: postgres::Error) -> Self {
        let code = error.code().map(SqlState::code);
        let constraint = error.as_db_error().and_then(|db| db.constraint());
        let kind = match code {
            Some("23505") if constraint == Some(RACED_REFERENCE) => StorageErrorKind::Retryable,
            Some(code) if code.starts_with("53") => StorageErrorKind::QuotaRefused,
            Some("40001" | "40P01" | "57014" | "57P01" | "57P02" | "57P03" | "55P03") => {
                StorageErrorKind::Retryable
            }
            Some(code) if code.starts_with("08") => StorageErrorKind::Retryable,
            Some("23505") => StorageErrorKind::Conflict,
            Some("XX001" | "XX002") => StorageErrorKind::Corrupt,
            Some(_) => StorageErrorKind::Other,
            // No SQLSTATE: the connection failed or closed under us.
            None => StorageErrorKind::Retryable,
        };
        let message = match error.as_db_error() {
            Some(db) => db.message().to_owned(),
            None => error.to_string(),
        };
        StorageError::new(kind, code.map(str::to_owned), message)
    }
}

impl From<postgres::Error> for Error {
    fn from(error: postgres::Error) -> Self {
        Self::Storage(error.into())
    }
}

impl From<r2d2::Error> for StorageError {
    /// No connection could be had from the pool in time: the server is
    /// down, unreachable, or every connection is busy.
    fn from(error: r2d2::Error) -> Self {
        StorageError::new(StorageErrorKind::Retryable, None, error.to_string())
    }
}

/// The unique index a batch enqueue can race on. The batch inserts the
/// references it does not find, without `ON CONFLICT` (whose speculative
/// insertion costs a third more a row), so a reference another
/// transaction inserted after its snapshot and before its insert is a
/// unique violation here. The transaction runs again, and finds it.
pub(crate) const RACED_REFERENCE: &str = "tasks_ref";

/// Whether a transaction that failed this way may run again from the
/// start: it lost a serialization race, a deadlock, or a race to insert
/// a task reference ([`RACED_REFERENCE`]).
pub(crate) fn is_transient(error: &Error) -> bool {
    matches!(error, Error::Storage(storage)
        if matches!(storage.code(), Some("40001" | "40P01"))
            || (storage.code() == Some("23505")
                && storage.kind() == StorageErrorKind::Retryable))
}

/// Whether this is the server refusing a write in a read-only
/// transaction (how the store simulates a provider refusing writes).
pub(crate) fn is_read_only_refusal(error: &Error) -> bool {
    matches!(error, Error::Storage(storage) if storage.code() == Some("25006"))
}
