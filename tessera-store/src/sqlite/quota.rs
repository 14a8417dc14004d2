//! SQLite's faults as the store classifies them, and recognising a
//! provider's refusal among them.

use std::fmt;

use rusqlite::ErrorCode;

use crate::error::{Error, StorageError, StorageErrorKind};
use crate::sqlite::QuotaClassifier;

impl From<rusqlite::Error> for StorageError {
    /// Classifies a SQLite error by its result code; the host's
    /// classifier and the simulated provider's refusal are applied where
    /// the transaction ends.
    fn from(error: rusqlite::Error) -> Self {
        let code = error.sqlite_error_code();
        let kind = match code {
            Some(ErrorCode::DiskFull) => StorageErrorKind::QuotaRefused,
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StorageErrorKind::Corrupt,
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                StorageErrorKind::Retryable
            }
            Some(ErrorCode::ConstraintViolation) => StorageErrorKind::Conflict,
            _ => StorageErrorKind::Other,
        };
        StorageError::new(
            kind,
            code.map(|code| code_name(code).to_owned()),
            error.to_string(),
        )
    }
}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        Self::Storage(error.into())
    }
}

/// SQLite's name for a primary result code.
fn code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InternalMalfunction => "SQLITE_INTERNAL",
        ErrorCode::PermissionDenied => "SQLITE_PERM",
        ErrorCode::OperationAborted => "SQLITE_ABORT",
        ErrorCode::DatabaseBusy => "SQLITE_BUSY",
        ErrorCode::DatabaseLocked => "SQLITE_LOCKED",
        ErrorCode::OutOfMemory => "SQLITE_NOMEM",
        ErrorCode::ReadOnly => "SQLITE_READONLY",
        ErrorCode::OperationInterrupted => "SQLITE_INTERRUPT",
        ErrorCode::SystemIoFailure => "SQLITE_IOERR",
        ErrorCode::DatabaseCorrupt => "SQLITE_CORRUPT",
        ErrorCode::NotFound => "SQLITE_NOTFOUND",
        ErrorCode::DiskFull => "SQLITE_FULL",
        ErrorCode::CannotOpen => "SQLITE_CANTOPEN",
        ErrorCode::FileLockingProtocolFailed => "SQLITE_PROTOCOL",
        ErrorCode::SchemaChanged => "SQLITE_SCHEMA",
        ErrorCode::TooBig => "SQLITE_TOOBIG",
        ErrorCode::ConstraintViolation => "SQLITE_CONSTRAINT",
        ErrorCode::TypeMismatch => "SQLITE_MISMATCH",
        ErrorCode::ApiMisuse => "SQLITE_MISUSE",
        ErrorCode::NoLargeFileSupport => "SQLITE_NOLFS",
        ErrorCode::AuthorizationForStatementDenied => "SQLITE_AUTH",
        ErrorCode::ParameterOutOfRange => "SQLITE_RANGE",
        ErrorCode::NotADatabase => "SQLITE_NOTADB",
        _ => "SQLITE_ERROR",
    }
}

/// The rules that decide whether a SQLite fault is a quota refusal.
#[derive(Clone, Default)]
pub(crate) struct QuotaRules {
    classifier: Option<QuotaClassifier>,
}

impl QuotaRules {
    pub(crate) fn new(classifier: Option<QuotaClassifier>) -> Self {
        Self { classifier }
    }

    /// `refusing` says whether the simulated provider (the write authorizer)
    /// is refusing writes, which makes its `SQLITE_AUTH` a quota refusal.
    pub(crate) fn is_refusal(&self, error: &StorageError, refusing: bool) -> bool {
        error.kind() == StorageErrorKind::QuotaRefused
            || (refusing && error.code() == Some("SQLITE_AUTH"))
            || self
                .classifier
                .as_ref()
                .is_some_and(|classify| classify(error))
    }
}

impl fmt::Debug for QuotaRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaRules")
            .field("classifier", &self.classifier.is_some())
            .finish()
    }
}

/// Turns a storage error into what the store is told: a provider refusal
/// (which the store dates), a corrupt database, or a plain storage error.
pub(crate) fn classify(error: Error, rules: &QuotaRules, refusing: bool) -> Error {
    match error {
        Error::Storage(storage) if rules.is_refusal(&storage, refusing) => Error::quota_refused(),
        other => other.classified(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn failure(code: i32) -> StorageError {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None).into()
    }

    #[test]
    fn disk_full_is_a_refusal_and_auth_only_while_refusing() {
        let rules = QuotaRules::default();
        let full = failure(rusqlite::ffi::SQLITE_FULL);
        let auth = failure(rusqlite::ffi::SQLITE_AUTH);
        assert_eq!(full.code(), Some("SQLITE_FULL"));
        assert!(rules.is_refusal(&full, false));
        assert!(!rules.is_refusal(&auth, false));
        assert!(rules.is_refusal(&auth, true));
        let rules = QuotaRules::new(Some(Arc::new(|e: &StorageError| {
            e.code() == Some("SQLITE_READONLY")
        })));
        assert!(rules.is_refusal(&failure(rusqlite::ffi::SQLITE_READONLY), false));
    }

    #[test]
    fn faults_are_classified_by_kind() {
        let kind = |code| failure(code).kind();
        assert_eq!(
            kind(rusqlite::ffi::SQLITE_BUSY),
            StorageErrorKind::Retryable
        );
        assert_eq!(
            kind(rusqlite::ffi::SQLITE_CORRUPT),
            StorageErrorKind::Corrupt
        );
        assert_eq!(
            kind(rusqlite::ffi::SQLITE_NOTADB),
            StorageErrorKind::Corrupt
        );
        assert_eq!(
            kind(rusqlite::ffi::SQLITE_CONSTRAINT),
            StorageErrorKind::Conflict
        );
        assert_eq!(kind(rusqlite::ffi::SQLITE_IOERR), StorageErrorKind::Other);
    }
}
