//! Group commit: write operations from concurrent callers share one
//! transaction and one commit.
//!
//! Each caller runs its own operation on its own thread, holding the write
//! connection. The first to find no transaction open begins one
//! (`BEGIN IMMEDIATE`) and runs its operation in it; a caller that finds
//! one open runs its operation under a savepoint, so a failure rolls back
//! to that savepoint alone and its caller gets its own error. Whoever
//! finishes an operation while no other caller waits for the connection,
//! or with the batch at its cap, commits, and every caller of the batch
//! learns the commit's outcome. There is no added delay: a batch is what
//! queued while the connection was busy.
//!
//! Lock discipline: the connection's mutex is held only while an operation
//! or a commit runs, never while a caller waits for its batch's outcome
//! (that wait is on the batch's own condvar, after the mutex is let go).
//! A caller leaves a transaction open only when another caller is already
//! counted in `queued`: that caller takes the mutex next or soon after,
//! and it or a later one commits, so no batch is ever left without a
//! closer.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Utc};
use parking_lot::{Condvar, Mutex, MutexGuard};

use super::meter::Meter;
use super::quota::QuotaRules;
use super::writer::{WriteConnection, Writer};
use crate::error::{Error, StorageError, StorageErrorKind};

/// The most operations one commit carries; see the group-commit figures in
/// `docs/performance.md` for how it was chosen.
pub(crate) const BATCH_CAP: usize = 32;

/// The write connection, shared by group commit.
pub(crate) struct GroupWriter {
    writing: Mutex<Writing>,
    /// Callers that arrived and have not yet taken `writing`.
    queued: AtomicUsize,
    cap: usize,
}

impl std::fmt::Debug for GroupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWriter")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

/// The connection and the transaction open on it, if any.
struct Writing {
    connection: WriteConnection,
    batch: Option<Batch>,
}

/// The operations run so far in the open transaction.
struct Batch {
    /// Operations kept in it.
    operations: usize,
    /// Operations run in it, kept or rolled back to their savepoints: the
    /// cap counts these, so a stream of failing operations cannot hold a
    /// batch open.
    ran: usize,
    rows: u64,
    /// The newest operation's time, which the allowance records under.
    now: DateTime<Utc>,
    outcome: Arc<Outcome>,
}

/// A batch's commit outcome, for the callers that wait on it.
#[derive(Default)]
struct Outcome {
    result: Mutex<Option<Result<(), Error>>>,
    decided: Condvar,
}

impl Outcome {
    fn decide(&self, result: Result<(), Error>) {
        *self.result.lock() = Some(result);
        self.decided.notify_all();
    }

    fn wait(&self) -> Result<(), Error> {
        let mut result = self.result.lock();
        loop {
            if let Some(result) = result.as_ref() {
                return result.clone();
            }
            self.decided.wait(&mut result);
        }
    }
}

impl GroupWriter {
    pub(crate) fn new(connection: WriteConnection, cap: usize) -> Self {
        Self {
            writing: Mutex::new(Writing {
                connection,
                batch: None,
            }),
            queued: AtomicUsize::new(0),
            cap: cap.max(1),
        }
    }

    /// The connection, for what runs beside group commit: refusal and the
    /// allowance's count, which touch no transaction (a batch may be open
    /// while they run).
    pub(crate) fn connection(&self) -> ConnectionGuard<'_> {
        ConnectionGuard(self.writing.lock())
    }

    /// The connection, with no lock: the writer is being closed.
    pub(crate) fn connection_mut(&mut self) -> &mut WriteConnection {
        &mut self.writing.get_mut().connection
    }

    /// Runs `work` as one operation of a shared transaction and returns,
    /// once that transaction committed, whether its optional tail was
    /// kept. Its own failure is its own error, and nothing of it is kept;
    /// a failed commit fails every operation of the batch. A panic inside
    /// `work` rolls back its operation alone and is resumed on this
    /// thread once the batch no longer needs it.
    pub(crate) fn write(
        &self,
        now: DateTime<Utc>,
        meter: &Meter,
        rules: &QuotaRules,
        work: &mut dyn FnMut(&Writer<'_>) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut writing = self.writing.lock();
        self.queued.fetch_sub(1, Ordering::SeqCst);
        let mut panic: Option<Box<dyn Any + Send>> = None;
        // The store's own steps are guarded too: should one of them panic,
        // the batch is abandoned and its callers told, never left waiting.
        let steps = catch_unwind(AssertUnwindSafe(|| {
            let ran = writing.run(now, meter, rules, |writer| {
                catch_unwind(AssertUnwindSafe(|| work(writer))).unwrap_or_else(|payload| {
                    panic = Some(payload);
                    Err(Error::Storage(StorageError::new(
                        StorageErrorKind::Other,
                        None,
                        "the operation panicked",
                    )))
                })
            });
            (ran, self.close_or_leave(&mut writing, meter, rules))
        }));
        let (ran, waiting) = match steps {
            Ok(steps) => steps,
            Err(payload) => {
                writing.abandon();
                drop(writing);
                resume_unwind(payload);
            }
        };
        drop(writing);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
        let tail = ran?;
        match waiting {
            Closed::Committed(result) => result.map(|()| tail),
            Closed::Later(outcome) => outcome.wait().map(|()| tail),
        }
    }

    /// Commits the open batch unless another caller waits to join it and
    /// it has room; says how this caller learns the batch's outcome.
    fn close_or_leave(
        &self,
        writing: &mut MutexGuard<'_, Writing>,
        meter: &Meter,
        rules: &QuotaRules,
    ) -> Closed {
        let Some(batch) = &writing.batch else {
            return Closed::Committed(Ok(()));
        };
        if batch.ran < self.cap && self.queued.load(Ordering::SeqCst) > 0 {
            return Closed::Later(Arc::clone(&batch.outcome));
        }
        Closed::Committed(writing.commit(meter, rules))
    }
}

/// How a caller learns its batch's outcome.
enum Closed {
    /// It committed the batch (or there was none left to commit).
    Committed(Result<(), Error>),
    /// A later caller commits it.
    Later(Arc<Outcome>),
}

impl Writing {
    /// Runs one operation in the open transaction, beginning one if none
    /// is open; returns whether its optional tail was kept.
    fn run(
        &mut self,
        now: DateTime<Utc>,
        meter: &Meter,
        rules: &QuotaRules,
        work: impl FnOnce(&Writer<'_>) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        if self.batch.is_none() {
            self.connection.begin(meter, rules)?;
        }
        let earlier = self.batch.as_ref().map(|batch| batch.rows);
        let result = self.connection.operation(now, meter, rules, earlier, work);
        if self.connection.is_idle() {
            // No transaction is left: the operation failed alone in it, or
            // SQLite rolled it back whole after a fault, earlier
            // operations included.
            let error = result.as_ref().err().cloned().unwrap_or_else(|| {
                Error::Storage(StorageError::new(
                    StorageErrorKind::Retryable,
                    None,
                    "the transaction was rolled back",
                ))
            });
            if let Some(batch) = self.batch.take() {
                if error.is_quota_refusal() {
                    // Refused once for this operation already.
                    meter.refused_by(batch.operations);
                }
                batch.outcome.decide(Err(error.clone()));
            }
            return Err(error);
        }
        if let Some(batch) = self.batch.as_mut() {
            batch.ran += 1;
        }
        let done = result?;
        let batch = self.batch.get_or_insert_with(|| Batch {
            operations: 0,
            ran: 1,
            rows: 0,
            now,
            outcome: Arc::default(),
        });
        batch.operations += 1;
        batch.rows += done.rows;
        batch.now = batch.now.max(now);
        Ok(done.tail)
    }

    /// Rolls the open transaction back and fails its batch's callers.
    fn abandon(&mut self) {
        self.connection.rollback();
        if let Some(batch) = self.batch.take() {
            batch.outcome.decide(Err(Error::Storage(StorageError::new(
                StorageErrorKind::Other,
                None,
                "the transaction was abandoned",
            ))));
        }
    }

    /// Commits the open batch and tells its callers. The batch stays in
    /// place until the commit returns, so a panic inside it (a host's
    /// quota classifier) leaves it for [`abandon`](Self::abandon) to
    /// answer.
    fn commit(&mut self, meter: &Meter, rules: &QuotaRules) -> Result<(), Error> {
        let Some(batch) = &self.batch else {
            return Ok(());
        };
        let (now, rows, operations) = (batch.now, batch.rows, batch.operations);
        let timer = crate::observe::Timer::start();
        let result = self.connection.commit(now, meter, rules, rows, operations);
        crate::observe::commit(batch.ran, timer.elapsed());
        if let Some(batch) = self.batch.take() {
            batch.outcome.decide(result.clone());
        }
        result
    }
}

/// The write connection held outside group commit.
pub(crate) struct ConnectionGuard<'a>(MutexGuard<'a, Writing>);

impl std::ops::Deref for ConnectionGuard<'_> {
    type Target = WriteConnection;

    fn deref(&self) -> &WriteConnection {
        &self.0.connection
    }
}

impl std::ops::DerefMut for ConnectionGuard<'_> {
    fn deref_mut(&mut self) -> &mut WriteConnection {
        &mut self.0.connection
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::AtomicBool;

    use chrono::TimeZone;
    use proptest::prelude::*;

    use super::*;
    use crate::sqlite::open::Location;

    /// What a test operation does after inserting its row.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Then {
        Succeed,
        Fail,
        Panic,
        /// Succeeds, and the next commit (its batch's) is refused.
        RefuseCommit,
        /// Like `RefuseCommit`, with a quota classifier that panics on
        /// the refusal.
        PanicInCommit,
    }

    /// What the caller of a test operation saw.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Acknowledged,
        Failed(String),
        Panicked,
    }

    struct Scratch {
        group: GroupWriter,
        meter: Meter,
        rules: QuotaRules,
        /// Rules whose quota classifier panics.
        panicking_rules: QuotaRules,
        refuse_commit: Arc<AtomicBool>,
        /// Whether an operation holds the connection, waiting for others
        /// to queue.
        holding: AtomicBool,
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 29, 12, 0, 0).unwrap()
    }

    fn scratch() -> Scratch {
        let mut nonce = [0; 8];
        getrandom::fill(&mut nonce).unwrap();
        let location = Location::Memory(format!(
            "file:/tessera-group-test-{}?vfs=memdb",
            crate::key::hex(&nonce)
        ));
        let writer =
            WriteConnection::open(&location, std::time::Duration::from_secs(1), None, false, 0)
                .unwrap();
        writer
            .connection()
            .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL UNIQUE);")
            .unwrap();
        let refuse_commit = Arc::new(AtomicBool::new(false));
        let refuse = Arc::clone(&refuse_commit);
        writer
            .connection()
            .commit_hook(Some(move || refuse.swap(false, Ordering::SeqCst)));
        Scratch {
            group: GroupWriter::new(writer, BATCH_CAP),
            meter: Meter::default(),
            rules: QuotaRules::default(),
            panicking_rules: QuotaRules::new(Some(Arc::new(|_: &StorageError| -> bool {
                panic!("the classifier panics")
            }))),
            refuse_commit,
            holding: AtomicBool::new(false),
        }
    }

    impl Scratch {
        /// Inserts row `n`, first waiting (holding the connection) until
        /// `queued` other callers wait for it, then does `then`.
        fn insert(&self, n: i64, queued: usize, then: Then) -> Seen {
            let rules = if then == Then::PanicInCommit {
                &self.panicking_rules
            } else {
                &self.rules
            };
            let result = catch_unwind(AssertUnwindSafe(|| {
                self.group.write(now(), &self.meter, rules, &mut |writer| {
                    if queued > 0 {
                        self.holding.store(true, Ordering::SeqCst);
                    }
                    while self.group.queued.load(Ordering::SeqCst) < queued {
                        std::thread::yield_now();
                    }
                    writer.execute("INSERT INTO t (n) VALUES (?1)", [n])?;
                    match then {
                        Then::Succeed => Ok(()),
                        Then::Fail => Err(Error::conflict(
                            crate::error::ConflictKind::Other,
                            format!("operation {n} fails"),
                        )),
                        Then::Panic => panic!("operation {n} panics"),
                        Then::RefuseCommit | Then::PanicInCommit => {
                            self.refuse_commit.store(true, Ordering::SeqCst);
                            Ok(())
                        }
                    }
                })
            }));
            match result {
                Ok(Ok(_)) => Seen::Acknowledged,
                Ok(Err(error)) => Seen::Failed(error.to_string()),
                Err(_) => Seen::Panicked,
            }
        }

        fn rows(&self) -> Vec<i64> {
            let connection = self.group.connection();
            let mut statement = connection
                .connection()
                .prepare("SELECT n FROM t ORDER BY n")
                .unwrap();
            statement
                .query_map([], |row| row.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        }

        /// Runs operation 0 with `first`; while it holds the connection,
        /// operations 1.. (with `rest`) queue behind it, so all share one
        /// transaction.
        fn batch(&self, first: Then, rest: &[Then]) -> Vec<Seen> {
            std::thread::scope(|scope| {
                let leader = scope.spawn(|| self.insert(0, rest.len(), first));
                while !self.holding.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                let followers: Vec<_> = rest
                    .iter()
                    .enumerate()
                    .map(|(i, &then)| {
                        let n = i64::try_from(i + 1).unwrap();
                        scope.spawn(move || self.insert(n, 0, then))
                    })
                    .collect();
                std::iter::once(leader)
                    .chain(followers)
                    .map(|handle| handle.join().unwrap())
                    .collect()
            })
        }
    }

    #[test]
    fn operations_that_queue_while_one_runs_share_its_commit() {
        let s = scratch();
        let seen = s.batch(Then::Succeed, &[Then::Succeed; 3]);
        assert!(
            seen.iter().all(|seen| *seen == Seen::Acknowledged),
            "{seen:?}"
        );
        assert_eq!(s.rows(), [0, 1, 2, 3]);
        assert_eq!(s.meter.snapshot().write_transactions, 1);
        assert_eq!(s.meter.snapshot().rows_written, 4);
    }

    #[test]
    fn a_failing_operation_rolls_back_to_its_savepoint_alone() {
        let s = scratch();
        let seen = s.batch(Then::Succeed, &[Then::Fail, Then::Succeed]);
        assert_eq!(seen[0], Seen::Acknowledged);
        assert_eq!(
            seen[1],
            Seen::Failed("conflict: operation 1 fails".to_owned())
        );
        assert_eq!(seen[2], Seen::Acknowledged);
        assert_eq!(s.rows(), [0, 2]);
        assert_eq!(s.meter.snapshot().rows_written, 2);
        // The first operation of a batch fails alone too.
        let s = scratch();
        let seen = s.batch(Then::Fail, &[Then::Succeed]);
        assert!(matches!(seen[0], Seen::Failed(_)), "{seen:?}");
        assert_eq!(seen[1], Seen::Acknowledged);
        assert_eq!(s.rows(), [1]);
    }

    #[test]
    fn a_refused_commit_fails_every_operation_of_its_batch() {
        let s = scratch();
        let seen = s.batch(Then::Succeed, &[Then::RefuseCommit, Then::Succeed]);
        assert!(
            seen.iter().all(|seen| matches!(seen, Seen::Failed(_))),
            "{seen:?}"
        );
        assert!(s.rows().is_empty());
        assert_eq!(s.meter.snapshot().rows_written, 0);
        // The writer carries on.
        assert_eq!(s.insert(9, 0, Then::Succeed), Seen::Acknowledged);
        assert_eq!(s.rows(), [9]);
    }

    #[test]
    fn a_panicking_operation_rolls_back_alone_and_panics_its_own_caller() {
        let s = scratch();
        let seen = s.batch(Then::Succeed, &[Then::Panic, Then::Succeed]);
        assert_eq!(
            seen,
            [Seen::Acknowledged, Seen::Panicked, Seen::Acknowledged]
        );
        assert_eq!(s.rows(), [0, 2]);
        // A leader's panic leaves its followers' batch whole.
        let s = scratch();
        let seen = s.batch(Then::Panic, &[Then::Succeed, Then::Succeed]);
        assert_eq!(
            seen,
            [Seen::Panicked, Seen::Acknowledged, Seen::Acknowledged]
        );
        assert_eq!(s.rows(), [1, 2]);
    }

    #[test]
    fn a_panic_while_committing_answers_every_caller_of_the_batch() {
        let s = scratch();
        let seen = s.batch(Then::Succeed, &[Then::PanicInCommit]);
        assert!(matches!(seen[0], Seen::Failed(_)), "{seen:?}");
        assert_eq!(seen[1], Seen::Panicked);
        assert!(s.rows().is_empty());
        assert!(s.group.writing.lock().batch.is_none());
        assert_eq!(s.insert(9, 0, Then::Succeed), Seen::Acknowledged);
    }

    #[test]
    fn a_batch_stops_at_its_cap() {
        let s = scratch();
        let rest = vec![Then::Succeed; BATCH_CAP];
        let seen = s.batch(Then::Succeed, &rest);
        assert!(seen.iter().all(|seen| *seen == Seen::Acknowledged));
        assert_eq!(s.rows().len(), BATCH_CAP + 1);
        assert_eq!(s.meter.snapshot().write_transactions, 2);
    }

    fn then() -> impl Strategy<Value = Then> {
        prop_oneof![
            6 => Just(Then::Succeed),
            2 => Just(Then::Fail),
            1 => Just(Then::Panic),
            1 => Just(Then::RefuseCommit),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Threads interleave operations that succeed, fail, panic or have
        /// their batch's commit refused: every acknowledged operation's
        /// row is there afterwards, and no other operation's is.
        #[test]
        fn every_outcome_a_caller_saw_matches_the_database(
            plans in proptest::collection::vec(proptest::collection::vec(then(), 1..12), 2..6)
        ) {
            let s = scratch();
            let seen: Vec<Vec<(i64, Seen)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = plans
                    .iter()
                    .enumerate()
                    .map(|(thread, plan)| {
                        let s = &s;
                        scope.spawn(move || {
                            plan.iter()
                                .enumerate()
                                .map(|(i, &then)| {
                                    let n = i64::try_from(thread * 100 + i).unwrap();
                                    (n, s.insert(n, 0, then))
                                })
                                .collect()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut acknowledged: Vec<i64> = seen
                .iter()
                .flatten()
                .filter(|(_, seen)| *seen == Seen::Acknowledged)
                .map(|(n, _)| *n)
                .collect();
            acknowledged.sort_unstable();
            prop_assert_eq!(s.rows(), acknowledged);
            for (plan, seen) in plans.iter().zip(&seen) {
                for (then, (_, seen)) in plan.iter().zip(seen) {
                    match then {
                        Then::Fail => prop_assert!(matches!(seen, Seen::Failed(_))),
                        Then::Panic => prop_assert_eq!(seen, &Seen::Panicked),
                        Then::Succeed | Then::RefuseCommit | Then::PanicInCommit => {
                            prop_assert!(!matches!(seen, Seen::Panicked));
                        }
                    }
                }
            }
            prop_assert!(s.group.writing.lock().batch.is_none());
        }
    }
}
