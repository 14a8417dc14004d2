//! What the store does on SQLite alone: the file and its write-ahead log,
//! the row meter and the daily allowance it keeps, the page cap, the busy
//! timeout and host classifiers. Every other test runs on every backend,
//! in `tests/conformance/`.

#[path = "../harness/mod.rs"]
mod harness;

mod allowance;
mod busy;
mod cold_start;
mod metering;
mod page_cap;

use std::path::PathBuf;

use chrono::{DateTime, TimeZone, Utc};
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{ClaimOutcome, Claimed, Error, IdempotencyKey, Store, StoreConfig};

use harness::Fixture;

impl Fixture<'_> {
    /// The database file.
    fn path(&self) -> PathBuf {
        self.db.sqlite_path().expect("a SQLite database").to_owned()
    }

    /// Closes the store and opens the file again with SQLite `options`.
    fn reopen_with(&mut self, options: SqliteOptions, config: StoreConfig) {
        // Closed first, so the new store is the only one on the file.
        let placeholder = Store::open_in_memory(StoreConfig::default()).unwrap();
        drop(std::mem::replace(&mut self.store, placeholder));
        self.store = Store::open_sqlite(options, config).unwrap();
        self.admin = self.login(&self.admin_key);
    }
}

/// 2026-10-30 00:00:00 UTC: when the fixtures' day (see
/// [`harness::noon`]) ends, and so when a quota refusal resets.
fn midnight() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 30, 0, 0, 0).unwrap()
}

/// A quota refusal resetting at `reset_at`, in the error and its body.
fn assert_quota(error: &Error, reset_at: DateTime<Utc>) {
    assert!(error.is_quota_exhausted(), "{error:?}");
    assert_eq!(error.status(), 503);
    assert_eq!(error.code(), "storage_quota_exhausted");
    assert_eq!(error.reset_at(), Some(reset_at));
    let body = serde_json::to_value(error.body()).unwrap();
    assert_eq!(
        body["error"]["reset_at"],
        serde_json::to_value(reset_at).unwrap()
    );
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn claimed(outcome: ClaimOutcome) -> Claimed {
    match outcome {
        ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("expected a lease, got {other:?}"),
    }
}
