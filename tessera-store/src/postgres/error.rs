//! PostgreSQL's faults as the store classifies them.

use postgres::error::SqlState;

use crate::error::{Error, StorageError, StorageErrorKind};

impl From<postgres::Error> for StorageError {
    /// Classifies by SQLSTATE: class 53 (insufficient resources: a full
    /// disk, too many connections) is a quota refusal; serialization
    /// failures, deadlocks, a cancelled statement (a timeout), a server
    /// shutting down and a lost connection are retryable; a unique
    /// violation is a conflict; data corruption is corrupt.
    fn from(error: postgres::Error) -> Self {
        let code = error.code().map(SqlState::code);
        let kind = match code {
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
            // "error connecting to server" alone does not say why: the
            // cause under it does (a refused port, an unknown host).
            None => match std::error::Error::source(&error) {
                Some(cause) => format!("{error}: {cause}"),
                None => error.to_string(),
            },
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

/// Whether a transaction that failed this way may run again from the
/// start: it lost a serialization race or a deadlock.
pub(crate) fn is_transient(error: &Error) -> bool {
    matches!(error, Error::Storage(storage)
        if matches!(storage.code(), Some("40001" | "40P01")))
}

/// Whether this is the server refusing a write in a read-only
/// transaction (how the store simulates a provider refusing writes).
pub(crate) fn is_read_only_refusal(error: &Error) -> bool {
    matches!(error, Error::Storage(storage) if storage.code() == Some("25006"))
}
