//! Chaos runs on both backends: worker processes work one queue while
//! faults drawn from a seed strike, every store purges finished tasks a
//! second or so after they end ([`run::short_retention`]), every
//! operation is recorded, and the checker must find no anomaly in the
//! history. A run fails too when no task was purged.
//!
//! Each scenario runs short by default (4 worker processes, 300 tasks,
//! a fixed seed; `TESSERA_CHAOS_SEED` replays another) and long under
//! `--ignored` (`chaos_long_*`: 4 worker processes of 3 threads, 10,000
//! tasks, 40 faults, the seed from `TESSERA_CHAOS_SEED` or drawn and
//! printed). PostgreSQL scenarios need `TESSERA_TEST_POSTGRES_URL` and are
//! ignored without it; the server restart also needs
//! `TESSERA_TEST_POSTGRES_CLUSTER` (`15 main`: the cluster serving that
//! URL, which it stops and starts) and runs while no other run of this
//! binary does.
//! Each run's summary (lost and doubled counts, recovery after each
//! fault) is printed and saved under the target directory's
//! `tmp/chaos/`.

// The runs use both backends, and the shared harness opens PostgreSQL
// under this crate's `postgres` feature (on by default).
#![cfg(feature = "postgres")]

#[path = "../../../tessera-store/tests/harness/mod.rs"]
mod harness;
mod landed;
mod postgres_faults;
mod raw;
mod run;
mod worker;

use std::time::Duration;

use harness::BackendKind;
use parking_lot::RwLock;
use run::{Fault, Scenario};
use tessera_store::Retention;
use tessera_store::faults::InjectedFault;

/// The seed of the short runs.
const SHORT_SEED: u64 = 29;

/// Held for reading by every PostgreSQL run and for writing by the one
/// that restarts the server, so no run meets a restart it did not ask for.
static SERVER: RwLock<()> = RwLock::new(());

fn short(backend: BackendKind, scenario: Scenario) {
    let _server = SERVER.read();
    let db = backend.database();
    run::run(&db, &scenario, run::seed(SHORT_SEED));
}

/// The seed of a long run: `TESSERA_CHAOS_SEED`, or drawn (and printed
/// by the run).
fn long_seed() -> u64 {
    std::env::var("TESSERA_CHAOS_SEED").map_or_else(
        |_| {
            let mut bytes = [0_u8; 8];
            getrandom::fill(&mut bytes).unwrap();
            u64::from_le_bytes(bytes) >> 1
        },
        |text| text.parse().expect("TESSERA_CHAOS_SEED is a number"),
    )
}

fn long(backend: BackendKind, scenario: Scenario) {
    let _server = SERVER.read();
    let db = backend.database();
    run::run(&db, &scenario.long(), long_seed());
}

const KILLS: &[Fault] = &[Fault::KillWorker];

/// The scenarios of both backends.
fn killed() -> Scenario {
    Scenario::short("workers_killed", KILLS)
}

const PAUSES: &[Fault] = &[Fault::PauseHolder];

/// A worker stopped while it holds leases, until they lapse and are
/// granted again, then continued: the classic fencing case. Workers work
/// a while on each lease, so a stopped one holds some.
fn paused() -> Scenario {
    Scenario::short("paused_holder", PAUSES).with_work(20, 120)
}

/// [`paused`] on a store with a deliberate bug: stale submissions
/// answered as accepted and stored nowhere. The checker must catch it.
///
/// Done tasks are kept ten minutes here, longer than the run (other
/// states as in every run): an acknowledged stale submission shows as
/// lost only while its task, done by the newer holder, is there to show
/// its receipt missing. Purged, the task takes its receipts with it, and
/// the checker rightly excuses what it can no longer see.
fn caught(backend: BackendKind) {
    let _server = SERVER.read();
    let db = backend.database();
    let keep_done = Retention {
        done: Some(Duration::from_secs(600)),
        ..run::short_retention()
    };
    let scenario = paused()
        .with_injected(InjectedFault::AcceptStaleSubmits)
        .with_retention(keep_done);
    let executed = run::execute(&db, &scenario, run::seed(SHORT_SEED));
    assert!(
        executed.missed.is_empty(),
        "the pauses never landed: {:?}",
        executed.missed
    );
    assert!(
        !executed.report.is_valid(),
        "a store that accepts stale submissions passed the checker"
    );
    assert!(
        executed.report.lost() > 0,
        "its acknowledged, unstored submissions are lost work: {:?}",
        executed.report.anomalies
    );
}

fn skewed() -> Scenario {
    // Lease 2 s: clocks up to 0.4 s apart either way, with kills so
    // leases lapse and are taken over across skewed clocks.
    Scenario::short("clock_skew", KILLS).with_skew(400)
}

mod sqlite {
    use super::*;

    const B: BackendKind = BackendKind::Sqlite;

    fn lock_holder() -> Scenario {
        Scenario::short(
            "lock_holder_killed",
            &[Fault::KillLockHolder, Fault::KillWorker],
        )
    }

    fn refused() -> Scenario {
        Scenario::short("writes_refused", &[Fault::RefuseWrites])
    }

    #[test]
    fn workers_killed_at_random_points_repeatedly() {
        short(B, killed());
    }

    #[test]
    fn a_process_killed_holding_the_write_lock() {
        short(B, lock_holder());
    }

    #[test]
    fn writes_refused_then_restored() {
        short(B, refused());
    }

    #[test]
    fn clocks_skewed_within_the_lease_margin() {
        short(B, skewed());
    }

    #[test]
    fn a_paused_holder_is_fenced_off() {
        short(B, paused());
    }

    #[test]
    fn a_store_accepting_stale_submissions_is_caught() {
        caught(B);
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_CHAOS_SEED"]
    fn chaos_long_workers_killed() {
        long(B, killed());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_CHAOS_SEED"]
    fn chaos_long_lock_holder_killed() {
        long(B, lock_holder());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_CHAOS_SEED"]
    fn chaos_long_writes_refused() {
        long(B, refused());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_CHAOS_SEED"]
    fn chaos_long_clock_skew() {
        long(B, skewed());
    }
}

mod postgres {
    use super::*;

    const B: BackendKind = BackendKind::Postgres;

    fn terminated() -> Scenario {
        Scenario::short("backends_terminated", &[Fault::TerminateBackends])
    }

    fn exhausted() -> Scenario {
        Scenario::short("pool_exhausted", &[Fault::ExhaustPool])
    }

    fn restarted() -> Scenario {
        Scenario::short("server_restarted", &[Fault::RestartServer])
    }

    /// Stops and starts the server: alone, holding [`SERVER`] for writing.
    fn restart(scenario: Scenario, seed: u64) {
        let _alone = SERVER.write();
        let db = B.database();
        run::run(&db, &scenario, seed);
    }

    fn network() -> Scenario {
        Scenario::short("network_cut", &[Fault::CutNetwork, Fault::StallNetwork]).through_proxy()
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn workers_killed_at_random_points_repeatedly() {
        short(B, killed());
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn backends_terminated() {
        short(B, terminated());
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn a_pool_exhausted_by_held_connections() {
        short(B, exhausted());
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn the_network_cut_and_stalled_through_a_proxy() {
        short(B, network());
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn clocks_skewed_within_the_lease_margin() {
        short(B, skewed());
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn a_paused_holder_is_fenced_off() {
        short(B, paused());
    }

    #[test]
    #[cfg_attr(not(postgres_server), ignore = "needs TESSERA_TEST_POSTGRES_URL")]
    fn a_store_accepting_stale_submissions_is_caught() {
        caught(B);
    }

    #[test]
    #[cfg_attr(
        not(postgres_cluster),
        ignore = "needs TESSERA_TEST_POSTGRES_URL and TESSERA_TEST_POSTGRES_CLUSTER"
    )]
    fn the_server_restarted_mid_run() {
        restart(restarted(), run::seed(SHORT_SEED));
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_TEST_POSTGRES_URL, TESSERA_TEST_POSTGRES_CLUSTER, TESSERA_CHAOS_SEED"]
    fn chaos_long_server_restarted() {
        restart(restarted().long(), long_seed());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_TEST_POSTGRES_URL, TESSERA_CHAOS_SEED"]
    fn chaos_long_workers_killed() {
        long(B, killed());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_TEST_POSTGRES_URL, TESSERA_CHAOS_SEED"]
    fn chaos_long_backends_terminated() {
        long(B, terminated());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_TEST_POSTGRES_URL, TESSERA_CHAOS_SEED"]
    fn chaos_long_pool_exhausted() {
        long(B, exhausted());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_TEST_POSTGRES_URL, TESSERA_CHAOS_SEED"]
    fn chaos_long_network_cut() {
        long(B, network());
    }

    #[test]
    #[ignore = "long: 10,000 tasks; TESSERA_TEST_POSTGRES_URL, TESSERA_CHAOS_SEED"]
    fn chaos_long_clock_skew() {
        long(B, skewed());
    }
}

/// Run by the scenarios in their worker processes; a no-op otherwise.
#[test]
#[ignore = "entry point of the worker processes the scenarios spawn"]
fn child_process_entry() {
    worker::child_main();
}

/// Run by the lock-holder fault in the process it kills; a no-op
/// otherwise.
#[test]
#[ignore = "entry point of the process the lock-holder fault kills"]
fn lock_holder_entry() {
    run::lock_holder_main();
}

/// Writes the table of the guarantees page from the summaries the last
/// runs saved (each saved only once its run's assertions passed): per
/// scenario and backend, the tasks, the faults and how many landed, the
/// anomaly, lost and doubled counts, the recovery after its faults, and
/// the commit it ran on. Prints it too.
#[test]
#[ignore = "writes the table of docs/guarantees.md from the last runs' summaries"]
fn chaos_table() {
    let table = run::table();
    println!("{table}");
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guarantees.md");
    let text = std::fs::read_to_string(&page).unwrap();
    std::fs::write(&page, run::with_table(&text, &table)).unwrap();
}
