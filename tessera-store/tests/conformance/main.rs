//! The conformance suite: the store's public behaviour, which every backend
//! must show the same.
//!
//! Each test is written once, as `fn name(db: &TestDb)` on a fresh database
//! it may open as often as it likes, and listed in its module's
//! `conformance!`, which makes it a `#[test]` on every backend:
//! `access::sqlite::expired_and_revoked_keys_are_401`. Row counts are
//! checked where the backend meters them (`TestDb::meters_rows`). Tests
//! that mean something on SQLite alone are in `tests/sqlite/`.

// The harness's first database is SQLite, so the suite needs its feature.
#![cfg(feature = "sqlite")]

#[path = "../harness/mod.rs"]
mod harness;
mod workers;

/// Makes each listed test (`fn name(db: &TestDb)`, with any attributes
/// such as `#[ignore = "…"]`) a `#[test]` on a fresh database of every
/// backend, in a module named after the backend.
///
/// The backends are listed here and only here, each with the condition
/// under which this machine cannot run it: its tests are then marked
/// ignored, so the summary counts them as not run. The conditions are
/// cfgs the store's build script sets from the environment.
macro_rules! conformance {
    ($($tests:tt)*) => {
        backend_tests!(
            sqlite,
            $crate::harness::BackendKind::Sqlite,
            cfg_attr(not(feature = "sqlite"), ignore = "needs feature sqlite"),
            $($tests)*
        );
        backend_tests!(
            postgres,
            $crate::harness::BackendKind::Postgres,
            cfg_attr(
                any(not(feature = "postgres"), tessera_no_test_postgres),
                ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
            ),
            $($tests)*
        );
    };
}

/// [`conformance!`] for one backend.
macro_rules! backend_tests {
    (
        $backend:ident,
        $kind:expr,
        $unavailable:meta,
        $($(#[$attribute:meta])* $test:ident),* $(,)?
    ) => {
        /// This module's tests on this backend.
        mod $backend {
            $(
                #[test]
                // A long test on a backend this machine lacks is ignored
                // twice over; either reason keeps it out of the default run.
                #[allow(unused_attributes)]
                #[$unavailable]
                $(#[$attribute])*
                fn $test() {
                    super::$test(&$kind.database());
                }
            )*
        }
    };
}

mod access;
mod acks;
mod attempts;
mod audit;
mod bulk;
mod claim_order;
mod claims;
mod claims_async;
mod cold_start;
mod dependencies;
mod health;
mod long_poll;
mod meter;
mod queue;
mod queue_settings;
mod quota;
mod races;
mod refused_writes;
mod reliability_crash;
mod reliability_faults;
mod reliability_input;
mod reliability_processes;
mod reliability_security;
mod reliability_threads;
mod retention;
#[cfg(feature = "schedule")]
mod schedules;
mod sessions;
mod tasks;
mod timing;
mod unique;
mod worker_loop;

/// Run by the tests that spawn worker processes, in those processes; a
/// no-op otherwise. At the crate root, so its `--exact` name is fixed.
#[test]
#[ignore = "entry point of the worker child processes the other tests spawn"]
fn child_process_entry() {
    #[cfg(feature = "schedule")]
    schedules::scheduler_child();
    workers::child_main();
}
