//! Tasks that wait for other tasks: the pure rules.
//!
//! A child enqueued [after](RunAfter) some parents waits, holding a count
//! of the parents that have not ended ([`Waiting`]). Each parent's end
//! takes one off ([`Waiting::on_parent_end`]); the last one makes the
//! child ready. Under [`RunAfter::AllDone`], a parent that ends in any
//! other way (failed, discarded or cancelled) cancels the child instead,
//! and the child's own children after it ([`Cascade`]), in bounded
//! batches. Under [`RunAfter::AnyOutcome`] the child runs once every
//! parent has ended, however.
//!
//! Parents must exist before their child, or come earlier in the same
//! batch ([`check_batch`]), so the edges can never close a cycle and a
//! whole graph can be enqueued at once.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::{TaskRecord, TaskState};

/// The most parents one task may wait on: 1,000, the most tasks one
/// enqueue batch holds, so one child can be the fan-in of a whole batch
/// (or of 999 siblings and their fan-out task), while the edges one
/// enqueue writes stay as bounded as its tasks.
pub const MAX_PARENTS: usize = 1_000;

/// When a child with parents becomes claimable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunAfter {
    /// Once every parent is done; a parent that ends any other way
    /// cancels it (reason `parent_failed`). The default.
    #[default]
    AllDone,
    /// Once every parent has ended, however each ended.
    AnyOutcome,
}

impl RunAfter {
    /// The stable name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllDone => "all_done",
            Self::AnyOutcome => "any_outcome",
        }
    }

    /// The rule a stored name names; `None` for a name this build does
    /// not know.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::AllDone, Self::AnyOutcome]
            .into_iter()
            .find(|rule| rule.as_str() == name)
    }
}

/// How a parent ended, as its children see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParentEnd {
    /// A submission was accepted.
    Done,
    /// Given up on: failed for good, or out of tries.
    Failed,
    /// Cancelled, by an operator or by its own parent's failure.
    Cancelled,
}

impl ParentEnd {
    /// The stable name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The end a stored name names; `None` for a name this build does not
    /// know.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Done, Self::Failed, Self::Cancelled]
            .into_iter()
            .find(|end| end.as_str() == name)
    }
}

/// A child that waits: how many of its parents have not ended, and when
/// it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Waiting {
    /// Parents that have not ended.
    pub unfinished: u32,
    /// When it runs.
    pub run_after: RunAfter,
}

/// What a child is after its parents' ends so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Unblocked {
    /// Still waiting, for this many.
    Waiting(Waiting),
    /// Claimable: the last parent ended as it needed to.
    Ready,
    /// Cancelled, reason `parent_failed`: a parent it needed done ended
    /// otherwise.
    Cancelled,
}

/// A dependency broken, or a count that would go below zero.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum DependencyError {
    /// More parents than [`MAX_PARENTS`].
    #[error("task {index} of the batch names {parents} parents, more than {MAX_PARENTS}")]
    TooManyParents {
        /// The task's place in its batch.
        index: usize,
        /// How many it named.
        parents: usize,
    },
    /// A task names itself.
    #[error("task {index} of the batch names itself as a parent")]
    OwnParent {
        /// The task's place in its batch.
        index: usize,
    },
    /// A task names one parent twice.
    #[error("task {index} of the batch names parent {parent} twice")]
    RepeatedParent {
        /// The task's place in its batch.
        index: usize,
        /// The parent's place in the task's list.
        parent: usize,
    },
    /// A parent neither exists nor comes earlier in the batch (a parent
    /// later in the batch could close a cycle).
    #[error("task {index} of the batch names parent {parent}, which does not exist before it")]
    UnknownParent {
        /// The task's place in its batch.
        index: usize,
        /// The parent's place in the task's list.
        parent: usize,
    },
    /// A parent's end arrived for a child that waits for none: the count
    /// would go below zero. A store that sees this has recorded an edge's
    /// end twice.
    #[error("a parent ended for a child that waits for no parent")]
    NothingToWaitFor,
    /// More parents ended at enqueue than the child has.
    #[error("{ended} parents ended of a child with {parents}")]
    MoreEndedThanParents {
        /// The child's parents.
        parents: usize,
        /// Those reported ended.
        ended: usize,
    },
}

impl TaskRecord {
    /// How the task ended, as a task waiting for it sees it: `None` while
    /// an attempt is not final; [`Done`](ParentEnd::Done) once one
    /// attempt is done; otherwise [`Failed`](ParentEnd::Failed) if one
    /// failed or was discarded, and [`Cancelled`](ParentEnd::Cancelled)
    /// if every attempt was cancelled.
    pub fn end(&self) -> Option<ParentEnd> {
        let mut end = ParentEnd::Cancelled;
        for attempt in &self.attempts {
            match attempt.state {
                TaskState::Done => end = ParentEnd::Done,
                TaskState::Failed | TaskState::Discarded { .. } if end != ParentEnd::Done => {
                    end = ParentEnd::Failed;
                }
                state if !state.is_final() => return None,
                _ => {}
            }
        }
        Some(end)
    }

    /// How the task ended, if it ended between `before` and this record:
    /// the end its waiting children are told of, once.
    pub fn ended_since(&self, before: &TaskRecord) -> Option<ParentEnd> {
        before.end().is_none().then(|| self.end()).flatten()
    }
}

impl Waiting {
    /// A child enqueued after `parents` parents (at most
    /// [`MAX_PARENTS`]), of which those in `ended` have ended already
    /// (a parent already done counts as finished).
    pub fn at_enqueue(
        parents: usize,
        ended: &[ParentEnd],
        run_after: RunAfter,
    ) -> Result<Unblocked, DependencyError> {
        if parents > MAX_PARENTS {
            return Err(DependencyError::TooManyParents { index: 0, parents });
        }
        if ended.len() > parents {
            return Err(DependencyError::MoreEndedThanParents {
                parents,
                ended: ended.len(),
            });
        }
        if parents == 0 {
            return Ok(Unblocked::Ready);
        }
        let mut child = Unblocked::Waiting(Self {
            unfinished: parents as u32,
            run_after,
        });
        for &end in ended {
            child = match child {
                Unblocked::Waiting(waiting) => waiting.on_parent_end(end)?,
                // Cancelled stays cancelled; the count no longer matters.
                settled => return Ok(settled),
            };
        }
        Ok(child)
    }

    /// The child after one of its parents ended as `end`: one fewer to
    /// wait for, ready after the last, or cancelled when it needed the
    /// parent done.
    pub fn on_parent_end(self, end: ParentEnd) -> Result<Unblocked, DependencyError> {
        let Some(unfinished) = self.unfinished.checked_sub(1) else {
            return Err(DependencyError::NothingToWaitFor);
        };
        if self.run_after == RunAfter::AllDone && end != ParentEnd::Done {
            return Ok(Unblocked::Cancelled);
        }
        Ok(match unfinished {
            0 => Unblocked::Ready,
            _ => Unblocked::Waiting(Self { unfinished, ..self }),
        })
    }
}

/// Checks one batch's edges before anything is written: each task's
/// parents, `batch[i]` being task `i`'s id and the ids it waits on, are
/// at most [`MAX_PARENTS`], each named once, none the task itself, and
/// each either `exists` already or is an earlier task of the batch.
///
/// Generic over how a task is named (an id, or an id with its version).
pub fn check_batch<T: Ord>(
    batch: &[(&T, &[T])],
    mut exists: impl FnMut(&T) -> bool,
) -> Result<(), DependencyError> {
    let mut earlier: BTreeSet<&T> = BTreeSet::new();
    for (index, (id, parents)) in batch.iter().enumerate() {
        if parents.len() > MAX_PARENTS {
            return Err(DependencyError::TooManyParents {
                index,
                parents: parents.len(),
            });
        }
        let mut named = BTreeSet::new();
        for (position, parent) in parents.iter().enumerate() {
            if parent == *id {
                return Err(DependencyError::OwnParent { index });
            }
            if !named.insert(parent) {
                return Err(DependencyError::RepeatedParent {
                    index,
                    parent: position,
                });
            }
            if !earlier.contains(parent) && !exists(parent) {
                return Err(DependencyError::UnknownParent {
                    index,
                    parent: position,
                });
            }
        }
        earlier.insert(id);
    }
    Ok(())
}

/// A failure's reach, walked in bounded batches: the tasks that ended
/// other than done, whose waiting children are yet to be told.
///
/// The store takes up to a batch of ended tasks ([`Cascade::next`]),
/// applies [`Waiting::on_parent_end`] to each of their waiting children,
/// and hands back the children that were cancelled
/// ([`Cascade::ended`]): they are parents that ended in turn. Each task
/// is walked once, however many paths reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cascade<T: Ord + Clone> {
    pending: VecDeque<T>,
    seen: BTreeSet<T>,
}

impl<T: Ord + Clone> Cascade<T> {
    /// The cascade from `ended`, a task that ended other than done.
    pub fn from(ended: T) -> Self {
        Self::of([ended])
    }

    /// The cascade from every task of `ended`, in order.
    pub fn of(ended: impl IntoIterator<Item = T>) -> Self {
        let mut cascade = Self {
            pending: VecDeque::new(),
            seen: BTreeSet::new(),
        };
        for task in ended {
            cascade.ended(task);
        }
        cascade
    }

    /// `task` ended other than done (a child the cascade cancelled): its
    /// children are to be told, once.
    pub fn ended(&mut self, task: T) {
        if self.seen.insert(task.clone()) {
            self.pending.push_back(task);
        }
    }

    /// Up to `limit` (at least one) ended tasks whose children are to be
    /// told next, in the order they ended; empty once it is walked.
    pub fn next(&mut self, limit: usize) -> Vec<T> {
        let take = limit.max(1).min(self.pending.len());
        self.pending.drain(..take).collect()
    }

    /// Whether every ended task's children were told.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::TaskId;

    fn id(n: usize) -> TaskId {
        TaskId::parse(&format!("t{n}")).unwrap()
    }

    #[test]
    fn the_last_parent_done_makes_the_child_ready() {
        let child = Waiting::at_enqueue(2, &[], RunAfter::AllDone).unwrap();
        let Unblocked::Waiting(child) = child else {
            panic!("{child:?}")
        };
        let Unblocked::Waiting(child) = child.on_parent_end(ParentEnd::Done).unwrap() else {
            panic!("one parent left")
        };
        assert_eq!(child.unfinished, 1);
        assert_eq!(
            child.on_parent_end(ParentEnd::Done).unwrap(),
            Unblocked::Ready
        );
        let done = Waiting {
            unfinished: 0,
            run_after: RunAfter::AllDone,
        };
        assert_eq!(
            done.on_parent_end(ParentEnd::Done),
            Err(DependencyError::NothingToWaitFor),
            "a count never goes below zero"
        );
    }

    #[test]
    fn a_parent_already_done_at_enqueue_counts_as_finished() {
        let ended = [ParentEnd::Done, ParentEnd::Done];
        assert_eq!(
            Waiting::at_enqueue(2, &ended, RunAfter::AllDone),
            Ok(Unblocked::Ready)
        );
        assert_eq!(
            Waiting::at_enqueue(3, &[ParentEnd::Failed], RunAfter::AllDone),
            Ok(Unblocked::Cancelled)
        );
        let anyway = Waiting::at_enqueue(2, &[ParentEnd::Failed], RunAfter::AnyOutcome).unwrap();
        assert_eq!(
            anyway,
            Unblocked::Waiting(Waiting {
                unfinished: 1,
                run_after: RunAfter::AnyOutcome
            })
        );
        assert!(Waiting::at_enqueue(1, &ended, RunAfter::AllDone).is_err());
        assert!(Waiting::at_enqueue(MAX_PARENTS + 1, &[], RunAfter::AllDone).is_err());
        assert_eq!(
            Waiting::at_enqueue(0, &[], RunAfter::AllDone),
            Ok(Unblocked::Ready)
        );
    }

    #[test]
    fn a_batch_names_only_parents_before_it() {
        let (a, b, c) = (id(1), id(2), id(3));
        let old = id(0);
        let exists = |task: &TaskId| task == &id(0);
        let graph = [
            (&a, &[old.clone()][..]),
            (&b, &[a.clone()][..]),
            (&c, &[a.clone(), b.clone()][..]),
        ];
        assert_eq!(check_batch(&graph, exists), Ok(()));
        let forward = [(&a, &[b.clone()][..]), (&b, &[][..])];
        assert_eq!(
            check_batch(&forward, exists),
            Err(DependencyError::UnknownParent {
                index: 0,
                parent: 0
            })
        );
        let own = [(&a, &[a.clone()][..])];
        assert_eq!(
            check_batch(&own, exists),
            Err(DependencyError::OwnParent { index: 0 })
        );
        let twice = [(&a, &[old.clone(), old.clone()][..])];
        assert!(matches!(
            check_batch(&twice, exists),
            Err(DependencyError::RepeatedParent { .. })
        ));
    }

    /// A random graph: task `i`'s parents are some of the tasks before
    /// it, each task runs after all done or any outcome, and each that
    /// runs ends done or failed.
    fn graphs() -> impl Strategy<Value = Vec<(Vec<usize>, RunAfter, bool)>> {
        (1usize..24).prop_flat_map(|size| {
            (0..size)
                .map(|i| {
                    (
                        proptest::sample::subsequence((0..i).collect::<Vec<_>>(), 0..=i.min(4)),
                        prop_oneof![Just(RunAfter::AllDone), Just(RunAfter::AnyOutcome)],
                        proptest::bool::weighted(0.75),
                    )
                })
                .collect::<Vec<_>>()
        })
    }

    /// How each task ends, by recursion on its parents: the model.
    fn model(graph: &[(Vec<usize>, RunAfter, bool)]) -> Vec<ParentEnd> {
        let mut ends: Vec<ParentEnd> = Vec::new();
        for (parents, run_after, succeeds) in graph {
            let cancelled = *run_after == RunAfter::AllDone
                && parents
                    .iter()
                    .any(|&parent| ends[parent] != ParentEnd::Done);
            ends.push(match (cancelled, succeeds) {
                (true, _) => ParentEnd::Cancelled,
                (false, true) => ParentEnd::Done,
                (false, false) => ParentEnd::Failed,
            });
        }
        ends
    }

    proptest! {
        /// Ends delivered in any order the graph allows: every child is
        /// made ready exactly once when its model says it runs, cancelled
        /// once when it says so, and no count goes below zero.
        #[test]
        fn children_end_as_their_parents_decide(graph in graphs(), order in any::<u64>()) {
            let expected = model(&graph);
            let mut state: Vec<Unblocked> = graph
                .iter()
                .map(|(parents, run_after, _)| Waiting::at_enqueue(parents.len(), &[], *run_after).unwrap())
                .collect();
            let mut children: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (child, (parents, _, _)) in graph.iter().enumerate() {
                for &parent in parents {
                    children.entry(parent).or_default().push(child);
                }
            }
            let mut ended: Vec<Option<ParentEnd>> = vec![None; graph.len()];
            let mut readied = vec![0u32; graph.len()];
            // Runnable tasks end in an order drawn from `order`.
            let mut seed = order;
            loop {
                let runnable: Vec<usize> = (0..graph.len())
                    .filter(|&task| ended[task].is_none() && state[task] == Unblocked::Ready)
                    .collect();
                if runnable.is_empty() {
                    break;
                }
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let task = runnable[(seed >> 33) as usize % runnable.len()];
                let end = if graph[task].2 { ParentEnd::Done } else { ParentEnd::Failed };
                ended[task] = Some(end);
                // The end told to its children; a cancellation cascades in
                // batches of two.
                let mut cascade = (end != ParentEnd::Done).then(|| Cascade::from(task));
                let tell = |parent: usize, end: ParentEnd, state: &mut Vec<Unblocked>, readied: &mut Vec<u32>| -> Vec<usize> {
                    let mut cancelled = Vec::new();
                    for &child in children.get(&parent).into_iter().flatten() {
                        if let Unblocked::Waiting(waiting) = state[child] {
                            let next = waiting.on_parent_end(end).unwrap();
                            if next == Unblocked::Ready {
                                readied[child] += 1;
                            }
                            if next == Unblocked::Cancelled {
                                cancelled.push(child);
                            }
                            state[child] = next;
                        }
                    }
                    cancelled
                };
                match cascade.as_mut() {
                    None => {
                        tell(task, end, &mut state, &mut readied);
                    }
                    Some(cascade) => {
                        while !cascade.is_done() {
                            for parent in cascade.next(2) {
                                let parent_end = ended[parent].unwrap_or(ParentEnd::Cancelled);
                                for child in tell(parent, parent_end, &mut state, &mut readied) {
                                    ended[child] = Some(ParentEnd::Cancelled);
                                    cascade.ended(child);
                                }
                            }
                        }
                    }
                }
            }
            for task in 0..graph.len() {
                prop_assert_eq!(ended[task], Some(expected[task]), "task {}", task);
                let runs = expected[task] != ParentEnd::Cancelled && !graph[task].0.is_empty();
                prop_assert_eq!(readied[task], u32::from(runs), "task {} readied", task);
            }
        }
    }
}
