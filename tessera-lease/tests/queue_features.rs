//! Property tests of the queue features' rules: uniqueness windows and
//! debounce, schedule firing by several schedulers against one clock, and
//! concurrency-limit accounting under lapses, late heartbeats and late
//! submits.

use std::num::NonZeroU32;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;
use tessera_lease::{
    BriefVersion, ConcurrencyLimit, Digest, Duplicate, FencingToken, Held, Holder, IdempotencyKey,
    LeaseError, Principal, StateName, Submission, Task, TaskId, TaskSpec, UniqueKey, UniqueMode,
    UniqueStates, Uniqueness, decide_duplicate,
};

/// A task of `alternatives` attempts after `steps`: each claims (0),
/// fails with a retry (1), submits (2) or cancels (3) at one second apart.
fn task_after(alternatives: u16, steps: &[u8]) -> Task {
    let spec = TaskSpec {
        alternatives,
        ..TaskSpec::default()
    };
    let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
    let worker = Principal::parse("w").unwrap();
    let mut leases = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let now = at(i64::try_from(n).unwrap());
        match step {
            0 => {
                if let Ok(lease) = task.claim(&worker, now, Duration::from_secs(3_600)) {
                    leases.push(lease);
                }
            }
            1 => {
                if let Some(lease) = leases.pop() {
                    let _ = task.fail(
                        &worker,
                        lease.token(),
                        now,
                        tessera_lease::Retry::After(Duration::from_secs(5)),
                        &mut tessera_lease::Jitter::seeded(1),
                    );
                }
            }
            2 => {
                if let Some(lease) = leases.pop() {
                    let submission = Submission {
                        principal: worker.clone(),
                        token: lease.token(),
                        key: IdempotencyKey::parse("k").unwrap(),
                        digest: Digest::from_bytes([1; 32]),
                    };
                    let _ = task.submit(&submission, None, now);
                }
            }
            _ => {
                let _ = task.cancel();
            }
        }
    }
    task
}

fn start() -> DateTime<Utc> {
    "2026-12-02T10:00:00Z".parse().unwrap()
}

fn at(seconds: i64) -> DateTime<Utc> {
    start() + TimeDelta::seconds(seconds)
}

proptest! {
    /// A duplicate reschedules a task exactly when every attempt is
    /// waiting: then every attempt takes the new not-before time and keeps
    /// its tries; otherwise nothing changes. A task holds a slot counted
    /// while unfinished exactly when it is waiting or leased.
    #[test]
    fn only_a_waiting_task_is_rescheduled(
        alternatives in 1_u16..4,
        steps in prop::collection::vec(0_u8..4, 0..8),
        later in prop::option::of(0_i64..600),
    ) {
        let mut task = task_after(alternatives, &steps);
        let before = task.clone();
        let names: Vec<StateName> = task.attempts().iter().map(|a| a.state.name()).collect();
        let waiting = names.iter().all(|s| matches!(s, StateName::Ready | StateName::Scheduled | StateName::Backoff));
        prop_assert_eq!(task.is_waiting(), waiting);
        let unfinished = Uniqueness::new(UniqueKey::parse("k").unwrap());
        prop_assert_eq!(
            unfinished.holds(names.iter().copied()),
            names.iter().any(|s| !matches!(s, StateName::Done | StateName::Failed | StateName::Discarded | StateName::Cancelled)),
        );
        // A task holding no slot never leaves one; one holding a slot
        // leaves it exactly when it no longer holds it.
        prop_assert!(!task.record().leaves_unique_slot(None));
        prop_assert_eq!(
            task.record().leaves_unique_slot(Some(UniqueStates::UNFINISHED)),
            !unfinished.holds(names.iter().copied()),
        );
        let not_before = later.map(at);
        match task.reschedule(not_before) {
            Ok(changed) => {
                prop_assert!(waiting);
                prop_assert_eq!(changed.len(), task.attempts().len());
                for (new, old) in task.attempts().iter().zip(before.attempts()) {
                    prop_assert_eq!(new.tries, old.tries);
                    match not_before {
                        Some(at) => prop_assert_eq!(new.state, tessera_lease::TaskState::Scheduled { at }),
                        None => prop_assert_eq!(new.state, tessera_lease::TaskState::Ready),
                    }
                }
                // What a store writes back restores.
                prop_assert!(Task::restore(task.record().clone()).is_ok());
            }
            Err(error) => {
                prop_assert!(!waiting);
                prop_assert_eq!(error, LeaseError::TaskFinished);
                prop_assert_eq!(&task, &before);
            }
        }
    }

    /// Two enqueues share a windowed slot exactly when they fall in the same
    /// period: never when a whole window apart, and the slot of one period
    /// is never the slot of another key or of no window.
    #[test]
    fn windowed_slots_are_periods(
        window in 1_u64..100_000,
        first in -1_000_000_i64..1_000_000,
        gap in 0_i64..300_000,
    ) {
        let key = UniqueKey::parse("report").unwrap();
        let unique = Uniqueness { window: Some(Duration::from_millis(window)), ..Uniqueness::new(key.clone()) };
        let (a, b) = (start() + TimeDelta::milliseconds(first), start() + TimeDelta::milliseconds(first + gap));
        let same = unique.slot(a) == unique.slot(b);
        let width = i64::try_from(window).unwrap();
        let period = |t: DateTime<Utc>| t.timestamp_millis().div_euclid(width);
        prop_assert_eq!(same, period(a) == period(b));
        if gap >= width {
            prop_assert!(!same);
        }
        prop_assert_ne!(unique.slot(a), Uniqueness::new(key).slot(a));
        let other = Uniqueness { key: UniqueKey::parse("report-2").unwrap(), ..unique.clone() };
        prop_assert_ne!(unique.slot(a), other.slot(a));
    }

    /// A stream of duplicates under debounce keeps the run at most
    /// `max_delay` after the first enqueue, never moves it earlier, and
    /// puts it `delay` after the last duplicate while that is sooner.
    #[test]
    fn debounce_never_passes_its_maximum(
        delay in 1_u64..600,
        extra in 0_u64..3_600,
        arrivals in prop::collection::vec(0_i64..120, 1..30),
    ) {
        let max_delay = delay + extra;
        let mode = UniqueMode::Debounce { delay: Duration::from_secs(delay), max_delay: Duration::from_secs(max_delay) };
        let holder = Holder { waiting: true, enqueued_at: start() };
        let latest = at(i64::try_from(max_delay).unwrap());
        let mut now = start();
        let mut previous = None;
        for step in arrivals {
            now += TimeDelta::seconds(step);
            let Duplicate::Replace { not_before: Some(run_at) } = decide_duplicate(mode, holder, None, now) else {
                prop_assert!(false, "a waiting holder is always replaced under debounce");
                unreachable!();
            };
            prop_assert!(run_at <= latest);
            prop_assert_eq!(run_at, (now + TimeDelta::seconds(i64::try_from(delay).unwrap())).min(latest));
            if let Some(previous) = previous {
                prop_assert!(run_at >= previous);
            }
            previous = Some(run_at);
        }
    }
}

/// Schedules, with the `schedule` feature that parses cron expressions.
#[cfg(feature = "schedule")]
mod schedules {
    use super::*;
    use std::collections::BTreeSet;

    use tessera_lease::CronSchedule;

    /// The store as schedulers see it: the `(schedule, run_at)` unique index
    /// and the last run-at fired. A fire is one transaction: it inserts only a
    /// run-at later than the last one and not in the index.
    #[derive(Default)]
    struct ScheduleStore {
        fired: BTreeSet<DateTime<Utc>>,
        last: Option<DateTime<Utc>>,
        /// (when, run-at) of each fire that wrote, in commit order.
        log: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    }

    impl ScheduleStore {
        fn fire(&mut self, run_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
            if self.last.is_some_and(|last| run_at <= last) || !self.fired.insert(run_at) {
                return false;
            }
            self.last = Some(run_at);
            self.log.push((now, run_at));
            true
        }
    }

    const EXPRESSIONS: [&str; 4] = [
        "* * * * *",
        "*/5 * * * *",
        "0 * * * *",
        "15,45 9-17 * * 1-5",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// N schedulers against one clock, each reading the last fire as of its
        /// own (possibly stale) read: every run-at fires at most once, fires
        /// rise in commit order, each is an occurrence and the latest one due
        /// when it fired (missed ticks collapse), and once every scheduler has
        /// caught up nothing is left due.
        #[test]
        fn schedulers_fire_each_run_at_once(
            expression in 0_usize..EXPRESSIONS.len(),
            steps in prop::collection::vec((0_usize..4, 0_i64..7_200, any::<bool>()), 1..80),
        ) {
            let schedule = CronSchedule::parse(EXPRESSIONS[expression], "Europe/Stockholm").unwrap();
            let created = start();
            let mut store = ScheduleStore::default();
            let mut seen: [Option<DateTime<Utc>>; 4] = [None; 4];
            let mut now = created;
            for (scheduler, advance, refresh) in steps {
                now += TimeDelta::seconds(advance);
                if refresh {
                    seen[scheduler] = store.last;
                }
                if let Some(run_at) = schedule.due(seen[scheduler].unwrap_or(created), now) {
                    store.fire(run_at, now);
                    seen[scheduler] = store.last;
                }
            }
            for window in store.log.windows(2) {
                prop_assert!(window[0].1 < window[1].1);
            }
            for &(fired_at, run_at) in &store.log {
                prop_assert_eq!(schedule.latest_at_or_before(fired_at), Some(run_at));
                prop_assert!(run_at > created);
            }
            prop_assert_eq!(store.fired.len(), store.log.len());
            // A fresh read at the end finds nothing due.
            prop_assert_eq!(schedule.due(store.last.unwrap_or(created), now), None);
        }
    }
}

const LEASE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
enum Op {
    Claim { worker: usize, task: usize },
    Heartbeat { worker: usize },
    Submit { worker: usize },
    Advance { seconds: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0_usize..3, 0_usize..3).prop_map(|(worker, task)| Op::Claim { worker, task }),
        (0_usize..3).prop_map(|worker| Op::Heartbeat { worker }),
        (0_usize..3).prop_map(|worker| Op::Submit { worker }),
        (1_i64..50).prop_map(|seconds| Op::Advance { seconds }),
    ]
}

/// Whether `token` names a leased attempt whose lease has not lapsed.
fn is_live(task: &Task, token: FencingToken, now: DateTime<Utc>) -> bool {
    task.attempts().iter().any(|attempt| {
        attempt.state.name() == StateName::Leased
            && attempt
                .lease
                .as_ref()
                .is_some_and(|lease| lease.token == token && !lease.is_expired(now))
    })
}

/// Leased attempts as stored, the count a backend makes before a grant.
fn leased(tasks: &[Task], except: Option<usize>) -> u32 {
    let count = tasks
        .iter()
        .enumerate()
        .filter(|(index, _)| Some(*index) != except)
        .flat_map(|(_, task)| task.attempts())
        .filter(|attempt| attempt.state.name() == StateName::Leased)
        .count();
    u32::try_from(count).unwrap()
}

proptest! {
    /// One partition, a limit of one, three workers and three tasks, with
    /// lapses, late heartbeats and late submits at random: never two leased
    /// attempts at once, so never two live leases; every accepted heartbeat
    /// and submit was made under the live lease.
    #[test]
    fn a_partition_limit_of_one_never_leases_two(ops in prop::collection::vec(op(), 1..120)) {
        let limit = ConcurrencyLimit { queue: None, per_partition: NonZeroU32::new(1) };
        let mut tasks: Vec<Task> = (0..3)
            .map(|i| Task::new(TaskId::parse(&format!("t{i}")).unwrap(), BriefVersion::FIRST, TaskSpec::default()).unwrap())
            .collect();
        let workers: Vec<Principal> = (0..3).map(|i| Principal::parse(&format!("w{i}")).unwrap()).collect();
        // Each worker's last grant: (task, token).
        let mut held: [Option<(usize, FencingToken)>; 3] = [None; 3];
        let mut now = start();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Claim { worker, task } => {
                    let candidate = Held { queue: 0, partition: Some(leased(&tasks, Some(task))) };
                    if limit.admits(candidate) {
                        if let Ok(lease) = tasks[task].claim(&workers[worker], now, LEASE) {
                            held[worker] = Some((task, lease.token()));
                        }
                    }
                }
                Op::Heartbeat { worker } => {
                    if let Some((task, token)) = held[worker] {
                        let live = is_live(&tasks[task], token, now);
                        let result = tasks[task].heartbeat(&workers[worker], token, now, LEASE);
                        prop_assert_eq!(result.is_ok(), live, "a heartbeat succeeds exactly under the live lease");
                    }
                }
                Op::Submit { worker } => {
                    if let Some((task, token)) = held[worker].take() {
                        let live = is_live(&tasks[task], token, now);
                        let submission = Submission {
                            principal: workers[worker].clone(),
                            token,
                            key: IdempotencyKey::parse(&format!("k{step}")).unwrap(),
                            digest: Digest::from_bytes([1; 32]),
                        };
                        let result = tasks[task].submit(&submission, None, now);
                        prop_assert_eq!(result.is_ok(), live, "a submit is accepted exactly under the live lease: {:?}", result);
                    }
                }
                Op::Advance { seconds } => now += TimeDelta::seconds(seconds),
            }
            prop_assert!(leased(&tasks, None) <= 1, "two leased attempts in one partition");
        }
    }
}

/// The heartbeat blip that ran a "limit 1" job many times at once elsewhere:
/// a heartbeat that fails, the task granted again, and the old holder's
/// submit after that. The old holder frees nothing, and the partition's
/// second task stays unclaimable until the new holder finishes.
#[test]
fn a_late_holder_never_frees_a_slot_twice() {
    let limit = ConcurrencyLimit {
        queue: None,
        per_partition: NonZeroU32::new(1),
    };
    let mut tasks = [
        Task::new(
            TaskId::parse("a").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap(),
        Task::new(
            TaskId::parse("b").unwrap(),
            BriefVersion::FIRST,
            TaskSpec::default(),
        )
        .unwrap(),
    ];
    let (old, new) = (
        Principal::parse("old").unwrap(),
        Principal::parse("new").unwrap(),
    );
    let admits = |tasks: &[Task], candidate| {
        limit.admits(Held {
            queue: 0,
            partition: Some(leased(tasks, Some(candidate))),
        })
    };

    let first = tasks[0].claim(&old, at(0), LEASE).unwrap();
    assert!(!admits(&tasks, 1), "the partition is full");
    // The heartbeat comes too late: the lease lapsed at 30 s.
    assert!(matches!(
        tasks[0].heartbeat(&old, first.token(), at(31), LEASE),
        Err(LeaseError::LeaseExpired { .. })
    ));
    // Lapsed but not recorded: the slot is still held, so "b" must wait ...
    assert!(!admits(&tasks, 1));
    // ... while "a" itself may be granted again, which records the lapse.
    assert!(admits(&tasks, 0));
    let second = tasks[0].claim(&new, at(32), LEASE).unwrap();
    assert!(second.token() > first.token());

    let late = Submission {
        principal: old,
        token: first.token(),
        key: IdempotencyKey::parse("late").unwrap(),
        digest: Digest::from_bytes([2; 32]),
    };
    assert!(matches!(
        tasks[0].submit(&late, None, at(33)),
        Err(LeaseError::StaleToken { .. })
    ));
    assert!(!admits(&tasks, 1), "the stale submit freed nothing");

    let done = Submission {
        principal: new,
        token: second.token(),
        key: IdempotencyKey::parse("done").unwrap(),
        digest: Digest::from_bytes([3; 32]),
    };
    assert!(matches!(
        tasks[0].submit(&done, None, at(34)),
        Ok(tessera_lease::Submitted::Accepted(_))
    ));
    assert!(
        admits(&tasks, 1),
        "the live holder's submit frees the slot once"
    );
}
