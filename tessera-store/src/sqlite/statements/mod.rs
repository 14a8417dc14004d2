//! SQLite's statements, one module per table or concern, each statement
//! beside the Rust that binds its arguments and decodes its answer.
//!
//! A statement lives with the table it reads or writes; one that spans
//! tables lives with the rows it answers with or removes (the listing
//! with the attempts, a task's deletes with the task), and the searches
//! across both claim indexes in [`claim`]. Answers are read by column
//! name, computed columns named with `AS`; the task and attempt rows,
//! read on every claim, ack and heartbeat, are read by a position found
//! from the column's name at compile time (see [`tasks`]).
//!
//! `HOT_STATEMENTS` lists every statement on a request path; a test runs
//! `EXPLAIN QUERY PLAN` over each and fails on a full table scan. A new
//! statement on a request path is added there.

pub(super) mod attempts;
pub(super) mod audit;
pub(super) mod claim;
pub(super) mod edges;
pub(super) mod health;
pub(super) mod keys;
pub(super) mod limits;
pub(super) mod meta;
pub(super) mod namespaces;
pub(super) mod queues;
pub(super) mod receipts;
pub(super) mod schedules;
pub(super) mod tasks;
pub(super) mod unique_slots;

/// The position of column `name` in `columns`; in a `const` block, a name
/// that is not there fails the build.
const fn position(columns: &[&str], name: &str) -> usize {
    let mut index = 0;
    while index < columns.len() {
        if same(columns[index].as_bytes(), name.as_bytes()) {
            return index;
        }
        index += 1;
    }
    panic!("no such column")
}

const fn same(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    let mut index = 0;
    while index < left.len() {
        if left[index] != right[index] {
            return false;
        }
        index += 1;
    }
    true
}

/// A statement on a request path, named for the failure message.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HotStatement {
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Every statement on a request path (see the module docs).
#[cfg(test)]
pub(crate) const HOT_STATEMENTS: &[HotStatement] = &[
    HotStatement {
        name: "insert edge",
        sql: edges::INSERT_EDGE,
    },
    HotStatement {
        name: "open children of a parent",
        sql: edges::OPEN_CHILDREN,
    },
    HotStatement {
        name: "end edges",
        sql: edges::END_EDGES,
    },
    HotStatement {
        name: "open parents of a child",
        sql: edges::OPEN_PARENTS,
    },
    HotStatement {
        name: "parents of a child",
        sql: edges::PARENTS_OF,
    },
    HotStatement {
        name: "a parent with a waiting child",
        sql: edges::PARENT_OF_WAITING,
    },
    HotStatement {
        name: "key by key id",
        sql: keys::KEY_BY_KEY_ID,
    },
    HotStatement {
        name: "keys of a principal",
        sql: keys::KEYS_OF_PRINCIPAL,
    },
    HotStatement {
        name: "all keys",
        sql: keys::KEYS_ALL,
    },
    HotStatement {
        name: "revoke key",
        sql: keys::REVOKE_KEY,
    },
    HotStatement {
        name: "expire key",
        sql: keys::EXPIRE_KEY,
    },
    HotStatement {
        name: "touch principal",
        sql: keys::TOUCH_PRINCIPAL,
    },
    HotStatement {
        name: "insert audit event",
        sql: audit::INSERT_EVENT,
    },
    HotStatement {
        name: "add to counter",
        sql: audit::ADD_TO_COUNTER,
    },
    HotStatement {
        name: "events of a principal",
        sql: audit::EVENTS_OF_PRINCIPAL,
    },
    HotStatement {
        name: "all events",
        sql: audit::EVENTS_ALL,
    },
    HotStatement {
        name: "first event from a row id",
        sql: audit::EVENT_FROM,
    },
    HotStatement {
        name: "event row id span",
        sql: audit::EVENT_SPAN,
    },
    HotStatement {
        name: "counters of a principal",
        sql: audit::COUNTERS_OF_PRINCIPAL,
    },
    HotStatement {
        name: "all counters",
        sql: audit::COUNTERS_ALL,
    },
    HotStatement {
        name: "purge audit events",
        sql: audit::PURGE_EVENTS,
    },
    HotStatement {
        name: "purge counters",
        sql: audit::PURGE_COUNTERS,
    },
    HotStatement {
        name: "purge keys",
        sql: keys::PURGE_KEYS,
    },
    HotStatement {
        name: "purge session attempts",
        sql: tasks::PURGE_SESSION_TASKS[0],
    },
    HotStatement {
        name: "purge session edges",
        sql: tasks::PURGE_SESSION_TASKS[1],
    },
    HotStatement {
        name: "purge session tasks",
        sql: tasks::PURGE_SESSION_TASKS[2],
    },
    HotStatement {
        name: "purge namespaces",
        sql: namespaces::PURGE_NAMESPACES,
    },
    HotStatement {
        name: "purge principals",
        sql: keys::PURGE_PRINCIPALS,
    },
    HotStatement {
        name: "purge limits",
        sql: limits::PURGE_LIMITS,
    },
    HotStatement {
        name: "insert namespace",
        sql: namespaces::INSERT_NAMESPACE,
    },
    HotStatement {
        name: "namespace exists",
        sql: namespaces::NAMESPACE_EXISTS,
    },
    HotStatement {
        name: "insert task",
        sql: tasks::INSERT_TASK,
    },
    HotStatement {
        name: "oldest claimable task of a queue",
        sql: claim::OLDEST_CLAIMABLE,
    },
    HotStatement {
        name: "queue has a claimable task",
        sql: claim::HAS_CLAIMABLE,
    },
    HotStatement {
        name: "oldest lapsed lease of a queue",
        sql: claim::OLDEST_LAPSED,
    },
    HotStatement {
        name: "task by reference",
        sql: tasks::TASK_BY_REF,
    },
    HotStatement {
        name: "task with brief by reference",
        sql: tasks::TASK_WITH_BRIEF_BY_REF,
    },
    HotStatement {
        name: "task by id",
        sql: tasks::TASK_BY_ID,
    },
    HotStatement {
        name: "task with brief by id",
        sql: tasks::TASK_WITH_BRIEF_BY_ID,
    },
    HotStatement {
        name: "update token",
        sql: tasks::UPDATE_TOKEN,
    },
    HotStatement {
        name: "tasks by state, oldest first",
        sql: attempts::TASKS_BY_STATE_OLDEST,
    },
    HotStatement {
        name: "tasks by state, newest first",
        sql: attempts::TASKS_BY_STATE_NEWEST,
    },
    HotStatement {
        name: "update tries",
        sql: tasks::UPDATE_MAX_TRIES,
    },
    HotStatement {
        name: "update task",
        sql: tasks::UPDATE_TASK,
    },
    HotStatement {
        name: "update claim time",
        sql: tasks::UPDATE_CLAIMABLE,
    },
    HotStatement {
        name: "insert attempt",
        sql: attempts::INSERT_ATTEMPT,
    },
    HotStatement {
        name: "attempts of a task",
        sql: attempts::ATTEMPTS_OF_TASK,
    },
    HotStatement {
        name: "update attempt",
        sql: attempts::UPDATE_ATTEMPT,
    },
    HotStatement {
        name: "update attempt state",
        sql: attempts::UPDATE_ATTEMPT_STATE,
    },
    HotStatement {
        name: "extend attempt",
        sql: attempts::EXTEND_ATTEMPT,
    },
    HotStatement {
        name: "extend attempt with progress",
        sql: attempts::EXTEND_ATTEMPT_PROGRESS,
    },
    HotStatement {
        name: "update progress",
        sql: attempts::UPDATE_PROGRESS,
    },
    HotStatement {
        name: "progress of a task",
        sql: attempts::PROGRESS_OF_TASK,
    },
    HotStatement {
        name: "attempts matching a bulk filter",
        sql: attempts::ATTEMPTS_MATCHING,
    },
    HotStatement {
        name: "leases matching a bulk filter",
        sql: attempts::LEASED_MATCHING,
    },
    HotStatement {
        name: "lapsed leases",
        sql: attempts::LAPSED_LEASES,
    },
    HotStatement {
        name: "finished attempts",
        sql: attempts::FINISHED_ATTEMPTS,
    },
    HotStatement {
        name: "unique slots whose window ended",
        sql: unique_slots::PURGE_ENDED_SLOTS,
    },
    HotStatement {
        name: "a finished task's place",
        sql: tasks::TASK_PLACE,
    },
    HotStatement {
        name: "a finished task's attempt ends",
        sql: attempts::ATTEMPT_ENDS,
    },
    HotStatement {
        name: "purge a task's attempts",
        sql: tasks::DELETE_TASK[0],
    },
    HotStatement {
        name: "purge a task's edges to its children",
        sql: tasks::DELETE_TASK[1],
    },
    HotStatement {
        name: "purge a task's edges to its parents",
        sql: tasks::DELETE_TASK[2],
    },
    HotStatement {
        name: "purge a task's unique slot",
        sql: tasks::DELETE_TASK[3],
    },
    HotStatement {
        name: "purge a task",
        sql: tasks::DELETE_TASK[4],
    },
    HotStatement {
        name: "trim a schedule's fires",
        sql: schedules::TRIM_FIRES,
    },
    HotStatement {
        name: "namespace names",
        sql: namespaces::NAMESPACE_NAMES,
    },
    HotStatement {
        name: "lapsed leases of a queue",
        sql: attempts::LAPSED_IN_QUEUE,
    },
    HotStatement {
        name: "count lapsed leases",
        sql: health::COUNT_LAPSED_LEASES,
    },
    HotStatement {
        name: "attempts by state",
        sql: health::COUNT_BY_STATE,
    },
    HotStatement {
        name: "receipt by idempotency key",
        sql: receipts::RECEIPT_BY_KEY,
    },
    HotStatement {
        name: "receipts of an attempt",
        sql: receipts::RECEIPTS_OF_ATTEMPT,
    },
    HotStatement {
        name: "receipts of a task",
        sql: receipts::RECEIPTS_OF_TASK,
    },
    HotStatement {
        name: "meta value",
        sql: meta::META_VALUE,
    },
    HotStatement {
        name: "insert meta value",
        sql: meta::INSERT_META,
    },
    HotStatement {
        name: "mint quota count",
        sql: limits::LIMIT_COUNT,
    },
    HotStatement {
        name: "count a mint",
        sql: limits::BUMP_LIMIT,
    },
    HotStatement {
        name: "schedule by name",
        sql: schedules::SCHEDULE_BY_NAME,
    },
    HotStatement {
        name: "schedules of a namespace",
        sql: schedules::SCHEDULES_OF,
    },
    HotStatement {
        name: "active schedules",
        sql: schedules::ACTIVE_SCHEDULES,
    },
    HotStatement {
        name: "put schedule",
        sql: schedules::PUT_SCHEDULE,
    },
    HotStatement {
        name: "delete schedule fires",
        sql: schedules::DELETE_FIRES,
    },
    HotStatement {
        name: "delete schedule",
        sql: schedules::DELETE_SCHEDULE,
    },
    HotStatement {
        name: "insert fire",
        sql: schedules::INSERT_FIRE,
    },
];

#[cfg(test)]
mod tests;
