//! The completer: acknowledgements (submits, failure reports) from many
//! threads of one process, coalesced into one commit.
//!
//! A caller hands in its items and blocks until they are answered. The
//! first caller to find no batch committing leads: it takes the waiting
//! items, oldest first, up to [`AckBatching::max_batch`] (N), commits
//! them together through the function it was given, answers every item,
//! and hands the lead on. It takes whole callers' items: one caller's
//! items are never split, so a `submit_batch` larger than N commits in
//! one transaction, alone. Items that arrive while a batch commits wait
//! for the next one, so a batch is what queued during the last commit.
//!
//! The rule: a batch closes when N items wait, or when
//! [`AckBatching::max_wait`] (T) has passed since its leader took the
//! lead, whichever comes first. The leader lingers only when more than
//! one caller was acknowledging as the last batch ended (the callers it
//! carried and those waiting for the next): others acknowledge at the
//! same time, so more are likely on their way, as PostgreSQL's
//! `commit_delay` waits only with `commit_siblings` active. It lingers
//! only until that many callers wait: a steady set of threads, each with
//! one acknowledgement in flight, closes its batch as soon as the last of
//! them arrives rather than after T, and two threads that would take
//! turns committing one acknowledgement each (one waiting while the
//! other commits) are gathered into one batch. A lone caller is never
//! delayed.
//!
//! A caller that hands in N items or more is a full batch by itself: it
//! commits them at once, on its own thread, beside whatever batch is
//! committing, rather than queue behind it. Waiting would gather nothing
//! (its items are never split, nor joined by others'), and threads that
//! each acknowledge a claimed batch of N or more would otherwise commit
//! one at a time.
//!
//! No caller is answered before the commit that holds its items has
//! ended: each gets its own answer (a receipt, a replay, its own error),
//! or, when the commit fails, the commit's error; nothing of a failed
//! commit is acknowledged. A leader that panics answers its batch with
//! an error and hands the lead on.
//!
//! A caller whose items are in a batch that is committing yields the
//! processor a few times, looking for its answers, before it parks: most
//! answers arrive within a commit, and a park and wake-up each cost as
//! much as a small commit.
//!
//! Lock discipline: the queue's mutex is held only to push, take and
//! answer, never while a batch commits (nor while a caller yields); the
//! commit takes the backend's locks alone.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::AckBatching;

/// How many times a caller whose items another caller is committing
/// yields the processor, looking for its answers, before it parks on the
/// condvar. A commit of a batch takes tens of microseconds on SQLite; a
/// park and a wake-up cost about as much again, paid by every caller of
/// every batch. Yielding costs nothing while no other thread waits for the
/// processor, and gives it up when one does.
const SPINS: usize = 200;

/// Where one item's answer arrives, and whose item it is.
struct Slot<R> {
    answer: Mutex<Option<R>>,
    /// The [`Completer::complete`] call that handed it in.
    caller: u64,
}

/// What waits, and whether a batch is committing.
struct Queue<T, R> {
    waiting: VecDeque<(T, Arc<Slot<R>>)>,
    committing: bool,
    /// How many callers were acknowledging when the last batch ended:
    /// those whose items it carried, and those waiting for the next.
    last_batch: usize,
    /// While a leader lingers: the number of waiting callers it waits
    /// for (0 when none lingers).
    linger_for: usize,
}

impl<T, R> Queue<T, R> {
    /// How many of the oldest waiting items the next batch takes: whole
    /// callers' items, oldest first, while they fit in `max`, and the
    /// first caller's whatever their number.
    fn batch_len(&self, max: usize) -> usize {
        let mut end = 0;
        while end < self.waiting.len() {
            let caller = self.waiting[end].1.caller;
            let next = end
                + self
                    .waiting
                    .iter()
                    .skip(end)
                    .take_while(|(_, slot)| slot.caller == caller)
                    .count();
            if end > 0 && next > max {
                break;
            }
            end = next;
        }
        end
    }

    /// How many callers have items waiting (each hands its items in at
    /// once, so they are contiguous).
    fn callers(&self) -> usize {
        let mut count = 0;
        let mut last = None;
        for (_, slot) in &self.waiting {
            if last != Some(slot.caller) {
                count += 1;
                last = Some(slot.caller);
            }
        }
        count
    }
}

/// Coalesces items of type `T` into batches answered with `R`s.
pub(crate) struct Completer<T, R> {
    queue: Mutex<Queue<T, R>>,
    /// Signalled when a batch ends, when N items wait, and when as many
    /// callers wait as a lingering leader waits for.
    changed: Condvar,
    batching: AckBatching,
    /// The number the next caller gets.
    next_caller: AtomicU64,
    /// How many times a waiting caller yields before it parks.
    spins: usize,
}

impl<T, R> std::fmt::Debug for Completer<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer")
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

impl<T, R: Clone> Completer<T, R> {
    pub(crate) fn new(batching: AckBatching) -> Self {
        Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                committing: false,
                last_batch: 0,
                linger_for: 0,
            }),
            changed: Condvar::new(),
            next_caller: AtomicU64::new(0),
            spins: SPINS,
            batching: AckBatching {
                max_batch: batching.max_batch.max(1),
                max_wait: batching.max_wait,
            },
        }
    }

    /// A completer whose waiting callers park at once, without
    /// yielding first: for commits that take longer than a park and a
    /// wake-up (a round trip to a server), where yielding only takes the
    /// processor from the work being waited for.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn parking(mut self) -> Self {
        self.spins = 0;
        self
    }

    /// Hands in `items` and blocks until each is answered, in order.
    ///
    /// `commit` runs one batch (items oldest first, this caller's and
    /// others') and returns one answer per item in the same order; it
    /// runs on whichever caller leads, with no lock of the completer's
    /// held. `failed` is every item's answer when a leader panics.
    pub(crate) fn complete(
        &self,
        items: Vec<T>,
        commit: &dyn Fn(Vec<T>) -> Vec<R>,
        failed: &dyn Fn() -> R,
    ) -> Vec<R> {
        if items.len() >= self.batching.max_batch {
            // A full batch alone: nothing to gather, so it neither queues
            // nor waits for the lead.
            return commit(items);
        }
        let caller = self.next_caller.fetch_add(1, Ordering::Relaxed);
        let slots: Vec<Arc<Slot<R>>> = items
            .iter()
            .map(|_| {
                Arc::new(Slot {
                    answer: Mutex::new(None),
                    caller,
                })
            })
            .collect();
        let mut queue = self.queue.lock();
        for (item, slot) in items.into_iter().zip(&slots) {
            queue.waiting.push_back((item, Arc::clone(slot)));
        }
        if queue.waiting.len() >= self.batching.max_batch
            || (queue.linger_for > 0 && queue.callers() >= queue.linger_for)
        {
            self.changed.notify_all();
        }
        loop {
            if slots.iter().all(|slot| slot.answer.lock().is_some()) {
                drop(queue);
                return slots
                    .iter()
                    .map(|slot| slot.answer.lock().take().expect("answered"))
                    .collect();
            }
            if queue.committing {
                let answered = parking_lot::MutexGuard::unlocked(&mut queue, || {
                    (0..self.spins).any(|_| {
                        std::thread::yield_now();
                        slots.iter().all(|slot| slot.answer.lock().is_some())
                    })
                });
                if !answered && queue.committing {
                    self.changed.wait(&mut queue);
                }
                continue;
            }
            // Lead: linger for more while other callers acknowledge too.
            queue.committing = true;
            if queue.last_batch > 1
                && queue.waiting.len() < self.batching.max_batch
                && !self.batching.max_wait.is_zero()
            {
                let deadline = std::time::Instant::now() + self.batching.max_wait;
                queue.linger_for = queue.last_batch;
                while queue.waiting.len() < self.batching.max_batch
                    && queue.callers() < queue.linger_for
                    && !self.changed.wait_until(&mut queue, deadline).timed_out()
                {}
                queue.linger_for = 0;
            }
            let take = queue.batch_len(self.batching.max_batch);
            let (batch, answers): (Vec<T>, Vec<Arc<Slot<R>>>) = queue.waiting.drain(..take).unzip();
            drop(queue);
            let mut callers: Vec<u64> = answers.iter().map(|slot| slot.caller).collect();
            callers.dedup();
            let count = callers.len();
            let mut lead = Lead {
                completer: self,
                answers,
                failed,
                count,
            };
            let results = commit(batch);
            debug_assert_eq!(results.len(), lead.answers.len(), "one answer per item");
            for (slot, result) in lead.answers.drain(..).zip(results) {
                *slot.answer.lock() = Some(result);
            }
            drop(lead);
            queue = self.queue.lock();
        }
    }
}

/// A leader's batch: hands the lead on when it ends, and answers what
/// it has not answered (a panic in the commit) with the failure.
struct Lead<'a, T, R> {
    completer: &'a Completer<T, R>,
    answers: Vec<Arc<Slot<R>>>,
    failed: &'a dyn Fn() -> R,
    count: usize,
}

impl<T, R> Drop for Lead<'_, T, R> {
    fn drop(&mut self) {
        for slot in self.answers.drain(..) {
            *slot.answer.lock() = Some((self.failed)());
        }
        let mut queue = self.completer.queue.lock();
        queue.committing = false;
        queue.last_batch = self.count + queue.callers();
        self.completer.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Barrier, mpsc};

    use std::time::Duration;

    use super::*;

    fn batching(max_batch: usize) -> AckBatching {
        AckBatching {
            max_batch,
            max_wait: Duration::ZERO,
        }
    }

    #[test]
    fn a_lone_caller_commits_its_items_at_once_in_order() {
        let completer = Completer::<u32, u32>::new(AckBatching::default());
        let commits = AtomicUsize::new(0);
        let answers = completer.complete(
            vec![1, 2, 3],
            &|batch| {
                commits.fetch_add(1, Ordering::SeqCst);
                batch.iter().map(|n| n * 10).collect()
            },
            &|| 0,
        );
        assert_eq!(answers, vec![10, 20, 30]);
        assert_eq!(commits.load(Ordering::SeqCst), 1);
    }

    /// One caller's items commit together even beyond N (a
    /// `submit_batch` is one transaction); the proptest below checks that
    /// other callers' items are added only while they fit in N.
    #[test]
    fn a_callers_items_are_never_split() {
        let completer = Completer::<u32, usize>::new(batching(2));
        let sizes = Mutex::new(Vec::new());
        let answers = completer.complete(
            vec![1, 2, 3, 4, 5],
            &|batch| {
                sizes.lock().push(batch.len());
                vec![batch.len(); batch.len()]
            },
            &|| 0,
        );
        assert_eq!(answers, vec![5; 5]);
        assert_eq!(*sizes.lock(), vec![5]);
    }

    /// While one batch commits, the others' items queue and go together
    /// in the next, and each caller gets its own answers.
    #[test]
    fn items_that_queue_during_a_commit_share_the_next() {
        let completer = Arc::new(Completer::<u32, u32>::new(batching(64)));
        let (entered, in_commit) = mpsc::channel::<()>();
        let release = Arc::new(Barrier::new(2));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let commit = {
            let (batches, release) = (Arc::clone(&batches), Arc::clone(&release));
            let entered = Mutex::new(entered);
            move |batch: Vec<u32>| {
                let first = batches.lock().is_empty();
                batches.lock().push(batch.clone());
                if first {
                    entered.lock().send(()).unwrap();
                    release.wait();
                }
                batch.iter().map(|n| n + 100).collect::<Vec<_>>()
            }
        };
        let commit = Arc::new(commit);
        std::thread::scope(|scope| {
            let first = {
                let (completer, commit) = (Arc::clone(&completer), Arc::clone(&commit));
                scope.spawn(move || completer.complete(vec![0], &*commit, &|| 0))
            };
            in_commit.recv().unwrap();
            let others: Vec<_> = (1..=3)
                .map(|n| {
                    let (completer, commit) = (Arc::clone(&completer), Arc::clone(&commit));
                    scope.spawn(move || completer.complete(vec![n, n * 10], &*commit, &|| 0))
                })
                .collect();
            // Every other caller has queued before the first commit ends.
            while completer.queue.lock().waiting.len() < 6 {
                std::thread::yield_now();
            }
            release.wait();
            assert_eq!(first.join().unwrap(), vec![100]);
            for (n, other) in (1..=3).zip(others) {
                assert_eq!(other.join().unwrap(), vec![n + 100, n * 10 + 100]);
            }
        });
        let batches = batches.lock();
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert_eq!(batches[1].len(), 6);
    }

    /// A full batch does not queue behind the batch that is committing:
    /// it commits on its own thread while the other's commit is still
    /// running (here, the other's commit ends only once the full batch
    /// has committed).
    #[test]
    fn a_full_batch_commits_beside_the_one_committing() {
        let completer = Completer::<u32, u32>::new(batching(3));
        let (entered, in_commit) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let (entered, released) = (Mutex::new(entered), Mutex::new(released));
        let commit = |batch: Vec<u32>| {
            if batch == [1] {
                entered.lock().send(()).unwrap();
                // Released by the full batch's commit; the timeout only
                // keeps a broken completer from hanging the test.
                let beside = released.lock().recv_timeout(Duration::from_secs(30));
                return vec![u32::from(beside.is_ok())];
            }
            release.send(()).unwrap();
            batch
        };
        std::thread::scope(|scope| {
            let first = scope.spawn(|| completer.complete(vec![1], &commit, &|| 0));
            in_commit.recv().unwrap();
            assert_eq!(
                completer.complete(vec![7, 8, 9], &commit, &|| 0),
                vec![7, 8, 9]
            );
            assert_eq!(
                first.join().unwrap(),
                vec![1],
                "the full batch committed beside it"
            );
        });
    }

    /// Two callers that would take turns (one waits while the other
    /// commits alone) are gathered: the one that leads next waits for the
    /// other's next acknowledgement, and they commit together.
    #[test]
    fn two_callers_taking_turns_are_gathered_into_one_batch() {
        let completer = Completer::<u32, u32>::new(AckBatching {
            max_batch: 64,
            max_wait: Duration::from_secs(60),
        });
        let batches = Mutex::new(Vec::new());
        let commit = |batch: Vec<u32>| {
            if batch == [1] {
                // The first commit ends only once the other caller waits.
                while completer.queue.lock().waiting.is_empty() {
                    std::thread::yield_now();
                }
            }
            batches.lock().push(batch.clone());
            batch
        };
        std::thread::scope(|scope| {
            let turns = scope.spawn(|| {
                let first = completer.complete(vec![1], &commit, &|| 0);
                (first, completer.complete(vec![3], &commit, &|| 0))
            });
            while !completer.queue.lock().committing {
                std::thread::yield_now();
            }
            assert_eq!(completer.complete(vec![2], &commit, &|| 0), vec![2]);
            assert_eq!(turns.join().unwrap(), (vec![1], vec![3]));
        });
        assert_eq!(*batches.lock(), vec![vec![1], vec![2, 3]]);
    }

    #[test]
    fn a_panicking_commit_fails_its_batch_and_hands_on_the_lead() {
        let completer = Completer::<u32, Option<u32>>::new(batching(64));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            completer.complete(vec![1], &|_| panic!("a bug"), &|| None)
        }));
        assert!(outcome.is_err());
        let answers = completer.complete(
            vec![2],
            &|batch| batch.into_iter().map(Some).collect(),
            &|| None,
        );
        assert_eq!(answers, vec![Some(2)]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Whatever N and however many threads hand in however many
        /// items: every item is committed exactly once, in a batch of at
        /// most N (or of one caller's items alone) that keeps each
        /// caller's items together and in order, and its caller gets that
        /// item's own answer.
        #[test]
        fn every_item_is_committed_once_and_answered_to_its_caller(
            max_batch in 1_usize..8,
            linger in proptest::bool::ANY,
            callers in proptest::collection::vec(proptest::collection::vec(0_u32..1000, 1..6), 1..6),
        ) {
            let completer = Completer::<(usize, usize, u32), (usize, usize, u32)>::new(AckBatching {
                max_batch,
                max_wait: if linger { Duration::from_micros(200) } else { Duration::ZERO },
            });
            let batches = Mutex::new(Vec::new());
            let commit = |batch: Vec<(usize, usize, u32)>| {
                batches.lock().push(batch.clone());
                batch
            };
            let answers: Vec<Vec<(usize, usize, u32)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = callers
                    .iter()
                    .enumerate()
                    .map(|(caller, items)| {
                        let (completer, commit) = (&completer, &commit);
                        scope.spawn(move || {
                            let items = items
                                .iter()
                                .enumerate()
                                .map(|(place, value)| (caller, place, *value))
                                .collect();
                            completer.complete(items, commit, &|| (usize::MAX, 0, 0))
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (caller, (items, answers)) in callers.iter().zip(&answers).enumerate() {
                let expected: Vec<_> = items
                    .iter()
                    .enumerate()
                    .map(|(place, value)| (caller, place, *value))
                    .collect();
                proptest::prop_assert_eq!(answers, &expected);
            }
            let batches = batches.lock();
            let mut seen = std::collections::HashSet::new();
            let mut batch_of = std::collections::HashMap::new();
            for (at, batch) in batches.iter().enumerate() {
                proptest::prop_assert!(!batch.is_empty());
                proptest::prop_assert!(
                    batch.len() <= max_batch || batch.iter().all(|item| item.0 == batch[0].0),
                    "more than N items from more than one caller"
                );
                for item in batch {
                    proptest::prop_assert!(seen.insert((item.0, item.1)), "committed twice");
                    let first = *batch_of.entry(item.0).or_insert(at);
                    proptest::prop_assert_eq!(first, at, "a caller's items split");
                }
                for caller in 0..callers.len() {
                    let places: Vec<usize> =
                        batch.iter().filter(|i| i.0 == caller).map(|i| i.1).collect();
                    proptest::prop_assert!(places.windows(2).all(|w| w[0] < w[1]));
                }
            }
            let total: usize = callers.iter().map(Vec::len).sum();
            proptest::prop_assert_eq!(seen.len(), total);
        }
    }
}
