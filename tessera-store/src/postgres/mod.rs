//! The PostgreSQL backend (feature `postgres`): one database shared by
//! store processes on any number of machines.
//!
//! - **Connections**: a pool ([`r2d2`]) of [`postgres`] clients, each with
//!   its prepared statements; a connect timeout, a pool timeout and a
//!   statement timeout bound every wait, so a server that went away is a
//!   retryable storage error, never a hang. A transaction that lost a
//!   serialization race or a deadlock, or whose connection broke before it
//!   committed, runs again from the start a bounded number of times; one
//!   whose `COMMIT` failed is reported failed, never acknowledged.
//! - **Transactions**: `READ COMMITTED`; what a write changes is locked
//!   first (see `transactions/`). Reads run in a `REPEATABLE READ`
//!   read-only transaction, so a multi-statement read sees one snapshot.
//! - **Time**: every time comes from the store's clock as Unix
//!   milliseconds, never from the server's `now()`.
//! - **Signals**: an enqueue runs `pg_notify` in its transaction; each
//!   store `LISTEN`s on one connection of its own and, for another
//!   store's enqueue (its own it acted on at commit), wakes its
//!   long-polls, restarts the queue's idle pacing and drops its health
//!   snapshot. While that connection is down (or listening is off, as
//!   behind a pooler in transaction mode) long-polls read their queue
//!   again every polling interval.
//! - **Schema**: migrated under an advisory lock (see `schema.rs`).
//! - **Batches**: a batch enqueue and a batch of acknowledgements run
//!   set-based statements, their values passed as arrays and read back
//!   with `unnest` (see `batch.rs`), so a batch costs the same round
//!   trips whatever its size.
//!
//! # What each operation costs
//!
//! Round trips to the server (each statement is one; statements are
//! prepared once per connection) and transactions, with `BEGIN` and
//! `COMMIT` counted, for a task of one attempt; an audited action's
//! `last_used_at`, when due, adds a savepoint, its update and a release
//! (three more) at most once a minute per principal. The transaction
//! counts are tested against the server's own statistics
//! (`pg_stat_database.xact_commit`, `tests/postgres/transactions.rs`).
//!
//! | operation | round trips | transactions |
//! | --- | ---: | ---: |
//! | enqueue | 7 (namespace, task, attempt, notify, audit row) | 1 |
//! | enqueue batch of n | 7 (the task and attempt inserts one `unnest` each) | 1 |
//! | claim of a plain ready task (one attempt, ready, no due lapse of a higher priority before it) | 1 (one statement, outside a transaction block) | 1 |
//! | any other claim, on a queue without settings | 1 (the statement, declining) then 4 (`BEGIN`, the claimable tasks locked with their attempts in one statement, one statement writing the leases, token counters and audit rows, `COMMIT`) | 2 (the declining statement's, which writes nothing, and the lease transaction) |
//! | any other claim (a queue with settings, a due lapse, a stale claim time) | as above, then the settings read and a statement per pick and per write (claim index, lapsed leases, attempts, attempt, task, audit row) | 2 |
//! | claim batch of n, on a queue without settings | 4, as the claim above | 1 |
//! | submit and claim (`submit_and_claim`) of a plain submission (the task's one attempt, leased under the token and not expired, no unique slot, no receipt under the key) and a plain claim or an empty queue | 1 (one statement, outside a transaction block) | 1 |
//! | m of them from one process's threads at the same moment | 1 for all m (one statement, each caller's part of it decided as above) | 1 for all m |
//! | any other submit and claim | 1 (the statement, declining) then 6 (`BEGIN`, the submitted task locked with its attempts, its receipt read, the claim's tasks locked, one statement writing both, `COMMIT`) | 2 (the declining statement's, which writes nothing, and the general one) |
//! | heartbeat | 6 (task, attempts, attempt, audit row) | 1 |
//! | submit or failure report, alone | 5 (tasks locked with their attempts, receipts read, one statement writing attempt states with their receipts, claim columns and audit rows) | 1 |
//! | m of them at once (the completer, or `submit_batch`) | 5, as one | 1 for all m |
//! | empty claim of a key that found the queue empty | 1 read | 1 read-only |
//!
//! A claim of one task runs as one statement first
//! (`sql/claim_one.sql`, run by `claim.rs`): a data-modifying CTE takes the queue's first task with
//! `FOR UPDATE SKIP LOCKED`, as the general claim does, and when it is of
//! the one shape whose grant needs nothing but the next token (one
//! attempt, ready, no due lapsed lease of a higher priority), writes the
//! lease, the task's token and claim column and the audit row, and
//! returns the task as it was. The store then applies `tessera-lease`'s
//! claim rule to that task and checks that the statement wrote what the
//! rule says (an error if not). Anything else (a lapse to record, an
//! ended backoff or schedule, several attempts, a unique slot held, a
//! queue with settings (paused or limited), a claim column out of
//! step, a due `last_used_at`, a session's first claim, a batch, refused
//! writes, a day's allowance that could not take the grant) the
//! statement declines, writing nothing, and the general lease transaction
//! claims: its statements are separate, the claim order and the lease
//! rules applied to the rows read.
//!
//! `submit_and_claim` runs as one statement first in the same way: it
//! locks the submitted task and its attempt, and when the submission is
//! of the one shape accepted without a decision beyond the statement's
//! (the task's one attempt, leased under the token to the submitter and
//! not expired, no unique slot to release, no receipt under the key)
//! and the claim is the one-statement claim's (or the queue is empty),
//! writes the attempt done with its receipt, and the audit row, with the
//! claim's writes, and returns the submitted task as it was. The store
//! applies the submit rule to it and checks the acceptance as it checks
//! the grant. Anything else (a replay, a stale token, a claim the
//! statement declines) writes nothing, and the general transaction runs.
//! Calls from several threads of one process at the same moment run as
//! one statement for all of them (`coalesce.rs`): each caller still gets
//! its own submission's answer and its own task, after the one commit.
//! A submit alone, and a batch, keep separate statements (the replay
//! check is a read of the receipts inside the write transaction, under
//! the tasks' row locks).
//!
//! Differences from SQLite, by design: rows are not metered (the
//! [`meter`](crate::Store::meter) counts write transactions, refusals and
//! the table rows statements changed, without index entries or rows read),
//! so the daily allowance counts table rows changed; claim admission and
//! the health snapshot stay per process, so another process's claims and
//! submissions reach a snapshot when it expires (15 s), its enqueues at
//! once.

mod batch;
#[cfg(test)]
mod checks;
mod claim;
mod coalesce;
mod error;
mod listener;
mod options;
mod pool;
mod rows;
#[cfg(test)]
mod rules;
mod schedules;
mod schema;
mod statements;
mod transactions;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use postgres::IsolationLevel;
use tessera_admission::DailyRowAllowance;

use crate::backend::{
    Backend, Capabilities, Committed, Fit, OpenPolicy, QuickClaim, QuickClaimed, QuickSubmit,
    QuickSubmitted, ReadTransaction, SignalSink, WriteTransaction,
};
use crate::error::{Error, StorageError, StorageErrorKind};
use crate::meter::MeterSnapshot;

use error::{is_read_only_refusal, is_transient};
use listener::{Announcer, ListenerState, listen};
use pool::{Manager, PgConnection, QuietErrors};
use transactions::PgTransaction;

pub use options::PostgresOptions;

pub use schema::SCHEMA_VERSION;

/// The PostgreSQL backend.
pub(crate) struct PostgresBackend {
    pool: r2d2::Pool<Manager>,
    announcer: Announcer,
    refusing: AtomicBool,
    allowance: Mutex<DailyRowAllowance>,
    rows_written: AtomicU64,
    write_transactions: AtomicU64,
    refused_writes: AtomicU64,
    retries: u32,
    poll_interval: Duration,
    listener: Arc<ListenerState>,
    listener_thread: Option<JoinHandle<()>>,
    options: PostgresOptions,
    /// `submit_and_claim`'s pairs, coalesced into one statement a lane.
    pairs: Vec<coalesce::Pairs>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("options", &self.options)
            .field(
                "listening",
                &self.listener.listening.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects, brings the schema up to date and starts listening.
    pub(crate) fn open(options: PostgresOptions, policy: OpenPolicy) -> Result<Self, Error> {
        let config = options.config()?;
        let now = policy.now;
        let pool = r2d2::Pool::builder()
            .max_size(options.pool_size)
            .min_idle(Some(0))
            .connection_timeout(options.pool_timeout)
            // A broken connection is found by using it: a write that meets
            // one before its commit runs again, a read too. Testing each
            // on check-out would cost a round trip per operation.
            .test_on_check_out(false)
            .error_handler(Box::new(QuietErrors))
            .build_unchecked(Manager {
                config: config.clone(),
            });
        let migrated = {
            let mut connection = pool.get().map_err(|error| {
                // The pool says only that it timed out; one connection
                // made by hand says why (a wrong password, a database
                // that does not exist, a refused port).
                let cause = match config.connect(postgres::NoTls) {
                    Err(cause) => Error::from(cause),
                    Ok(_) => Error::Storage(error.into()),
                };
                cause.classified()
            })?;
            schema::migrate(
                &mut connection.client,
                options.schema.as_deref(),
                policy.refuse_writes,
            )
            .map_err(Error::classified)?
        };
        // The schema's creation is metered as SQLite meters it: one write
        // transaction, its rows counted against the day.
        let migration_rows = migrated.unwrap_or(0);
        let mut allowance = DailyRowAllowance::new(policy.daily_rows_written_allowance);
        allowance.record(now, migration_rows);
        let listener = Arc::new(ListenerState::default());
        let announcer = Announcer::new(options.channel());
        let (ready, listening) = std::sync::mpsc::sync_channel(1);
        let listener_thread = options.listen.then(|| {
            let state = Arc::clone(&listener);
            let (config, announcer) = (config.clone(), announcer.clone());
            std::thread::Builder::new()
                .name("tessera-listen".to_owned())
                .spawn(move || listen(&config, &announcer, &state, &ready))
                .expect("a thread can be spawned")
        });
        if listener_thread.is_some() {
            // Give the listening connection the time a connection takes, so
            // an enqueue right after opening is heard. A wait for the
            // server, in real time: the store's clock does not apply.
            let _ = listening.recv_timeout(options.connect_timeout);
        }
        Ok(Self {
            pool,
            announcer,
            refusing: AtomicBool::new(policy.refuse_writes),
            allowance: Mutex::new(allowance),
            rows_written: AtomicU64::new(migration_rows),
            write_transactions: AtomicU64::new(u64::from(migrated.is_some())),
            refused_writes: AtomicU64::new(0),
            retries: options.retries,
            poll_interval: options.poll_interval,
            listener,
            listener_thread,
            options,
            pairs: (0..coalesce::LANES)
                .map(|_| coalesce::Pairs::new(policy.ack_batching).parking())
                .collect(),
        })
    }

    fn connection(&self) -> Result<r2d2::PooledConnection<Manager>, Error> {
        self.pool
            .get()
            .map_err(|error| Error::Storage(error.into()))
    }

    /// What a failed write is to its caller at `now`.
    fn classify(&self, error: Error, refusing: bool) -> Error {
        let error = if refusing && is_read_only_refusal(&error) {
            Error::quota_refused()
        } else {
            error.classified()
        };
        if error.is_quota_refusal() {
            self.refused_writes.fetch_add(1, Ordering::Relaxed);
        }
        error
    }

    /// One attempt at a write transaction. `Ok(None)` means it may run
    /// again: it lost a race, or its connection broke before the commit.
    fn try_write(
        &self,
        now: DateTime<Utc>,
        refusing: bool,
        work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<(), Error>,
    ) -> Result<Option<Committed>, Error> {
        let mut connection = self.connection()?;
        let PgConnection { client, prepared } = &mut *connection;
        let transaction = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .read_only(refusing)
            .start()
            .map_err(Error::from);
        let transaction = match transaction {
            Ok(transaction) => transaction,
            Err(error) if is_lost_connection(&error) => return Ok(None),
            Err(error) => return Err(error),
        };
        let pg = PgTransaction::new(transaction, prepared, &self.announcer, true);
        if let Err(error) = work(&pg) {
            let _ = pg.finish(false);
            return match error {
                error if is_transient(&error) || is_lost_connection(&error) => Ok(None),
                error => Err(error),
            };
        }
        let (mut rows, tail) = pg.rows();
        let fit = match Fit::of(&mut self.allowance.lock(), now, rows, tail) {
            Fit::WithoutTail if pg.rollback_tail().is_err() => Fit::Refused,
            fit => fit,
        };
        match fit {
            Fit::Whole => {}
            Fit::WithoutTail => rows = pg.rows().0,
            Fit::Refused => {
                let _ = pg.finish(false);
                return Err(Error::quota_refused());
            }
        }
        let kept_tail = fit == Fit::Whole && tail.is_some();
        // A failed commit is never retried: it may or may not have landed,
        // and the caller is told it failed.
        pg.finish(true)?;
        self.allowance.lock().record(now, rows);
        // As on SQLite, a commit that wrote no row (an empty claim, a
        // replay) is no write transaction.
        if rows > 0 {
            self.rows_written.fetch_add(rows, Ordering::Relaxed);
            self.write_transactions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(Committed { tail: kept_tail }))
    }
}

/// Whether `error` is the connection breaking: closed under the client
/// (no SQLSTATE), a connection exception (class 08), or the server ending
/// the session (57P01 to 57P03). Nothing of an uncommitted transaction
/// survives it.
fn is_lost_connection(error: &Error) -> bool {
    let Error::Storage(storage) = error else {
        return false;
    };
    match storage.code() {
        None => storage.kind() == StorageErrorKind::Retryable,
        Some(code) => code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03"),
    }
}

impl Backend for PostgresBackend {
    fn read(
        &self,
        work: &mut dyn FnMut(&dyn ReadTransaction) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut run = || -> Result<(), Error> {
            let mut connection = self.connection()?;
            // A connection broken before any statement answered is
            // replaced once: a read changes nothing, so it may run again.
            if connection.client.is_closed() {
                connection = self.connection()?;
            }
            let PgConnection { client, prepared } = &mut *connection;
            let transaction = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let pg = PgTransaction::new(transaction, prepared, &self.announcer, false);
            match work(&pg) {
                Ok(()) => Ok(pg.finish(true)?),
                Err(error) => {
                    let _ = pg.finish(false);
                    Err(error)
                }
            }
        };
        match run() {
            Err(error) if is_lost_connection(&error) => run(),
            result => result,
        }
        .map_err(Error::classified)
    }

    fn write(
        &self,
        now: DateTime<Utc>,
        work: &mut dyn FnMut(&dyn WriteTransaction) -> Result<(), Error>,
    ) -> Result<Committed, Error> {
        let refusing = self.refusing.load(Ordering::SeqCst);
        for _ in 0..self.retries {
            match self.try_write(now, refusing, work) {
                Ok(Some(committed)) => return Ok(committed),
                Ok(None) => continue,
                Err(error) => return Err(self.classify(error, refusing)),
            }
        }
        // The last run's error is the answer.
        match self.try_write(now, refusing, work) {
            Ok(Some(committed)) => Ok(committed),
            Ok(None) => Err(Error::Storage(StorageError::new(
                StorageErrorKind::Retryable,
                None,
                "the transaction kept losing to concurrent ones or its connection",
            ))),
            Err(error) => Err(self.classify(error, refusing)),
        }
    }

    fn set_refusing(&self, refuse: bool) {
        self.refusing.store(refuse, Ordering::SeqCst);
    }

    fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::SeqCst)
    }

    fn meter(&self) -> MeterSnapshot {
        MeterSnapshot {
            rows_written: self.rows_written.load(Ordering::Relaxed),
            rows_read: 0,
            write_transactions: self.write_transactions.load(Ordering::Relaxed),
            refused_writes: self.refused_writes.load(Ordering::Relaxed),
        }
    }

    fn rows_written_today(&self, now: DateTime<Utc>) -> u64 {
        self.allowance.lock().used(now)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            metered: false,
            skips_locked: true,
            round_trips: true,
        }
    }

    fn close(&mut self) {
        self.listener.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.listener_thread.take() {
            let _ = thread.join();
        }
    }

    fn claim_quick(&self, claim: &QuickClaim<'_>) -> Result<QuickClaimed, Error> {
        self.claim_in_one(claim)
    }

    fn submit_and_claim_quick(
        &self,
        submit: &QuickSubmit<'_>,
        claim: &QuickClaim<'_>,
    ) -> Result<QuickSubmitted, Error> {
        self.submit_and_claim_coalesced(submit, claim)
    }

    fn listen(&self, sink: SignalSink) {
        if let Ok(mut slot) = self.listener.sink.lock() {
            *slot = Some(sink);
        }
    }

    fn poll_interval(&self) -> Option<Duration> {
        (!self.listener.listening.load(Ordering::SeqCst)).then_some(self.poll_interval)
    }
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use tessera_lease::{Namespace, QueueName};

    use super::*;

    #[test]
    fn faults_are_classified_by_sqlstate() {
        assert!(is_transient(&Error::Storage(StorageError::new(
            StorageErrorKind::Retryable,
            Some("40001".to_owned()),
            "could not serialize access",
        ))));
        let lost = Error::Storage(StorageError::new(
            StorageErrorKind::Retryable,
            None,
            "closed",
        ));
        assert!(is_lost_connection(&lost) && !is_transient(&lost));
    }

    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn a_task_goes_round_on_a_real_server() {
        use crate::{
            Brief, ClaimOutcome, EnqueueOptions, Grant, IdempotencyKey, KeySpec, Output, Scope,
            Store, StoreConfig,
        };
        let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
            .expect("TESSERA_TEST_POSTGRES_URL names a PostgreSQL server");
        let schema = format!("unit_{}", std::process::id());
        let options = PostgresOptions::new(url).with_schema(schema);
        let store = Store::open_postgres(options, StoreConfig::default()).unwrap();
        let admin = store
            .authenticate(Some(store.create_admin_key("ops").unwrap().secret.expose()))
            .unwrap();
        let ns = Namespace::parse("renders").unwrap();
        let queue = QueueName::parse("frames").unwrap();
        let key = store
            .create_key(
                &admin,
                &KeySpec::keyed("acme")
                    .with_scopes(Scope::ALL.iter().copied())
                    .with_grant(Grant::Namespace(ns.clone())),
            )
            .unwrap();
        let worker = store.authenticate(Some(key.secret.expose())).unwrap();
        let task = store
            .enqueue(
                &worker,
                &ns,
                &queue,
                &Brief::Bytes(b"x".to_vec()),
                &EnqueueOptions::default(),
            )
            .unwrap();
        let ClaimOutcome::Granted(claimed) = store.claim(&worker, &ns, &queue).unwrap() else {
            panic!("a task is ready");
        };
        assert_eq!(claimed.task, task);
        let token = claimed.lease.token();
        store.heartbeat(&worker, &task, token).unwrap();
        let done = IdempotencyKey::parse("k").unwrap();
        let first = store
            .submit(&worker, &task, token, &done, &Output::bytes("y"))
            .unwrap();
        let again = store
            .submit(&worker, &task, token, &done, &Output::bytes("y"))
            .unwrap();
        assert_eq!(again, crate::Submitted::Replayed(first.receipt().clone()));
        assert_eq!(store.health(&worker, &ns).unwrap().attempts.done, 1);
        assert!(
            store
                .claim(&worker, &ns, &queue)
                .unwrap()
                .retry_after()
                .is_some()
        );
    }
}
