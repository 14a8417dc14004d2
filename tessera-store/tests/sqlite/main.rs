//! What the store does on SQLite alone: the file and its write-ahead log,
//! the row meter and the daily allowance it keeps, the page cap, the busy
//! timeout and host classifiers. Every other test runs on every backend,
//! in `tests/conformance/`.

#![cfg(feature = "sqlite")]

#[path = "../harness/mod.rs"]
mod harness;

mod allowance;
mod busy;
mod cold_start;
mod log;
mod metering;
mod page_cap;

use std::path::PathBuf;

use tessera_store::sqlite::SqliteOptions;

pub(crate) use harness::{assert_quota, midnight};
use tessera_store::{ClaimOutcome, Claimed, IdempotencyKey, Store, StoreConfig};

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

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).unwrap()
}

fn claimed(outcome: ClaimOutcome) -> Claimed {
    match outcome {
        ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("expected a lease, got {other:?}"),
    }
}
