//! The statements on a request path, and how times are stored.
//!
//! [`HOT_STATEMENTS`] lists every statement on a request path; a test runs
//! `EXPLAIN QUERY PLAN` over each and fails on a full table scan. A new
//! statement on a request path is added there.

#[cfg(test)]
use super::{access, audit, schedules, session, tasks};

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
        name: "key by key id",
        sql: access::KEY_BY_KEY_ID,
    },
    HotStatement {
        name: "keys of a principal",
        sql: access::KEYS_OF_PRINCIPAL,
    },
    HotStatement {
        name: "all keys",
        sql: access::KEYS_ALL,
    },
    HotStatement {
        name: "revoke key",
        sql: access::REVOKE_KEY,
    },
    HotStatement {
        name: "expire key",
        sql: access::EXPIRE_KEY,
    },
    HotStatement {
        name: "touch principal",
        sql: access::TOUCH_PRINCIPAL,
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
        sql: audit::PURGE_KEYS,
    },
    HotStatement {
        name: "purge session receipts",
        sql: tasks::PURGE_SESSION_TASKS[0],
    },
    HotStatement {
        name: "purge session attempts",
        sql: tasks::PURGE_SESSION_TASKS[1],
    },
    HotStatement {
        name: "purge session tasks",
        sql: tasks::PURGE_SESSION_TASKS[2],
    },
    HotStatement {
        name: "purge namespaces",
        sql: tasks::PURGE_NAMESPACES,
    },
    HotStatement {
        name: "purge principals",
        sql: audit::PURGE_PRINCIPALS,
    },
    HotStatement {
        name: "purge limits",
        sql: audit::PURGE_LIMITS,
    },
    HotStatement {
        name: "insert namespace",
        sql: tasks::INSERT_NAMESPACE,
    },
    HotStatement {
        name: "namespace exists",
        sql: tasks::NAMESPACE_EXISTS,
    },
    HotStatement {
        name: "insert task",
        sql: tasks::INSERT_TASK,
    },
    HotStatement {
        name: "oldest claimable task of a queue",
        sql: tasks::OLDEST_CLAIMABLE,
    },
    HotStatement {
        name: "queue has a claimable task",
        sql: tasks::HAS_CLAIMABLE,
    },
    HotStatement {
        name: "oldest lapsed lease of a queue",
        sql: tasks::OLDEST_LAPSED,
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
        sql: tasks::TASKS_BY_STATE_OLDEST,
    },
    HotStatement {
        name: "tasks by state, newest first",
        sql: tasks::TASKS_BY_STATE_NEWEST,
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
        sql: tasks::INSERT_ATTEMPT,
    },
    HotStatement {
        name: "attempts of a task",
        sql: tasks::ATTEMPTS_OF_TASK,
    },
    HotStatement {
        name: "update attempt",
        sql: tasks::UPDATE_ATTEMPT,
    },
    HotStatement {
        name: "update attempt state",
        sql: tasks::UPDATE_ATTEMPT_STATE,
    },
    HotStatement {
        name: "extend attempt",
        sql: tasks::EXTEND_ATTEMPT,
    },
    HotStatement {
        name: "extend attempt with progress",
        sql: tasks::EXTEND_ATTEMPT_PROGRESS,
    },
    HotStatement {
        name: "update progress",
        sql: tasks::UPDATE_PROGRESS,
    },
    HotStatement {
        name: "progress of a task",
        sql: tasks::PROGRESS_OF_TASK,
    },
    HotStatement {
        name: "attempts matching a bulk filter",
        sql: tasks::ATTEMPTS_MATCHING,
    },
    HotStatement {
        name: "lapsed leases",
        sql: tasks::LAPSED_LEASES,
    },
    HotStatement {
        name: "finished attempts",
        sql: tasks::FINISHED_ATTEMPTS,
    },
    HotStatement {
        name: "unique slots whose window ended",
        sql: tasks::PURGE_ENDED_SLOTS,
    },
    HotStatement {
        name: "a finished task's place",
        sql: tasks::TASK_PLACE,
    },
    HotStatement {
        name: "a finished task's attempt ends",
        sql: tasks::ATTEMPT_ENDS,
    },
    HotStatement {
        name: "purge a task's receipts",
        sql: tasks::DELETE_TASK[0],
    },
    HotStatement {
        name: "purge a task's attempts",
        sql: tasks::DELETE_TASK[1],
    },
    HotStatement {
        name: "purge a task's unique slot",
        sql: tasks::DELETE_TASK[2],
    },
    HotStatement {
        name: "purge a task",
        sql: tasks::DELETE_TASK[3],
    },
    HotStatement {
        name: "trim a schedule's fires",
        sql: schedules::TRIM_FIRES,
    },
    HotStatement {
        name: "namespace names",
        sql: tasks::NAMESPACE_NAMES,
    },
    HotStatement {
        name: "lapsed leases of a queue",
        sql: tasks::LAPSED_IN_QUEUE,
    },
    HotStatement {
        name: "count lapsed leases",
        sql: tasks::COUNT_LAPSED_LEASES,
    },
    HotStatement {
        name: "attempts by state",
        sql: tasks::COUNT_BY_STATE,
    },
    HotStatement {
        name: "insert receipt",
        sql: tasks::INSERT_RECEIPT,
    },
    HotStatement {
        name: "receipt by idempotency key",
        sql: tasks::RECEIPT_BY_KEY,
    },
    HotStatement {
        name: "receipts of an attempt",
        sql: tasks::RECEIPTS_OF_ATTEMPT,
    },
    HotStatement {
        name: "receipts of a task",
        sql: tasks::RECEIPTS_OF_TASK,
    },
    HotStatement {
        name: "meta value",
        sql: session::META_VALUE,
    },
    HotStatement {
        name: "insert meta value",
        sql: session::INSERT_META,
    },
    HotStatement {
        name: "mint quota count",
        sql: session::LIMIT_COUNT,
    },
    HotStatement {
        name: "count a mint",
        sql: session::BUMP_LIMIT,
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
mod tests {
    use super::*;
    use crate::backend::rows::{from_millis, millis};
    use crate::sqlite::{SqliteBackend, SqliteOptions};
    use chrono::{DateTime, Utc};

    /// The plan lines of every hot statement, against the real schema.
    fn plans() -> Vec<(&'static str, Vec<String>)> {
        let backend = SqliteBackend::for_tests(SqliteOptions::in_memory());
        backend
            .with_reader(|reader| {
                let mut out = Vec::new();
                for statement in HOT_STATEMENTS {
                    let lines = reader.explain(statement.sql)?;
                    out.push((statement.name, lines));
                }
                Ok(out)
            })
            .unwrap()
    }

    #[test]
    fn hot_statements_never_scan_a_table() {
        // A plain INSERT has no plan lines; everything else must search
        // (a select of subqueries alone "scans" its one constant row, and
        // a claim's arm per priority "scans" the one row its co-routine
        // `p<priority>` found, as does the probe of both claim indexes),
        // but the counter reads: see the test below.
        let arms: Vec<String> = tessera_lease::priorities()
            .map(|p| format!("SCAN p{p}"))
            .chain(["SCAN claimable".to_owned(), "SCAN lapsed".to_owned()])
            .collect();
        for (name, lines) in plans() {
            if COUNTER_READS.contains(&name) {
                continue;
            }
            for line in &lines {
                assert!(
                    !line.starts_with("SCAN ")
                        || line == "SCAN CONSTANT ROW"
                        || arms.contains(line),
                    "{name} scans: {line}\nwhole plan: {lines:#?}"
                );
            }
        }
    }

    #[test]
    fn schedule_reads_use_their_indexes() {
        let plans = plans();
        let plan = |name: &str| {
            plans
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, lines)| lines.join(" | "))
                .unwrap()
        };
        assert!(
            plan("active schedules").contains("schedules_active"),
            "{}",
            plan("active schedules")
        );
        assert!(
            plan("schedule by name").contains("schedules_name"),
            "{}",
            plan("schedule by name")
        );
        assert!(
            plan("schedule by name").contains("schedule_fires_run_at"),
            "{}",
            plan("schedule by name")
        );
    }

    #[test]
    fn claim_and_lease_lookups_use_their_indexes() {
        let plans = plans();
        let plan = |name: &str| {
            plans
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, lines)| lines.join(" | "))
                .unwrap()
        };
        // One search per priority, each to its first due entry: however
        // many entries are not yet due, none is read.
        let searches = |plan: &str, index: &str| {
            plan.matches(&format!(
                "INDEX {index} (namespace=? AND queue=? AND priority=? AND"
            ))
            .count()
        };
        let levels = tessera_lease::priorities().count();
        let claim = plan("oldest claimable task of a queue");
        assert_eq!(searches(&claim, "tasks_claim_order"), levels, "{claim}");
        // The index order is the claim order: no sort step.
        assert!(!claim.contains("TEMP B-TREE"), "{claim}");
        // Lapsed leases come from the partial index alone, in lapse order
        // for a claim; a heartbeat then never touches the task row.
        for name in [
            "oldest lapsed lease of a queue",
            "queue has a claimable task",
            "count lapsed leases",
            "lapsed leases",
        ] {
            let lapsed = plan(name);
            if name.starts_with("queue") {
                assert!(
                    lapsed.contains("COVERING INDEX tasks_claim_order"),
                    "{lapsed}"
                );
                assert_eq!(searches(&lapsed, "tasks_claim_order"), levels, "{lapsed}");
            }
            if name.starts_with("queue") || name.starts_with("oldest") {
                assert_eq!(
                    searches(&lapsed, "attempts_lapse_order"),
                    levels,
                    "{lapsed}"
                );
            }
            assert!(
                lapsed.contains("COVERING INDEX attempts_lapse_order"),
                "{name}: {lapsed}"
            );
            assert!(!lapsed.contains("TEMP B-TREE"), "{name}: {lapsed}");
        }
        let receipt = plan("receipt by idempotency key");
        assert!(receipt.contains("receipts_key"), "{receipt}");
        let attempts = plan("attempts of a task");
        assert!(attempts.contains("attempts_task"), "{attempts}");
        // A listing page is one range of `attempts_state`, already in its
        // row-id order, each task found by its row id.
        for name in [
            "tasks by state, oldest first",
            "tasks by state, newest first",
        ] {
            let listing = plan(name);
            assert!(
                listing.contains("INDEX attempts_state (namespace=? AND state=? AND rowid"),
                "{name}: {listing}"
            );
            assert!(listing.contains("INTEGER PRIMARY KEY"), "{name}: {listing}");
            assert!(!listing.contains("TEMP B-TREE"), "{name}: {listing}");
        }
        // A bulk action's page is one range of `attempts_changed`, in its
        // order, bounded by the position and the end of the time range.
        let bulk = plan("attempts matching a bulk filter");
        assert!(
            bulk.contains("INDEX attempts_changed (namespace=? AND "),
            "{bulk}"
        );
        assert!(!bulk.contains("TEMP B-TREE"), "{bulk}");
    }

    #[test]
    fn a_session_purge_finds_its_namespaces_and_tasks_through_indexes() {
        let plans = plans();
        for name in [
            "purge session receipts",
            "purge session attempts",
            "purge session tasks",
        ] {
            let (_, lines) = plans.iter().find(|(n, _)| *n == name).unwrap();
            let plan = lines.join(" | ");
            assert!(plan.contains("namespaces_purge"), "{name}: {plan}");
            assert!(plan.contains("tasks_ref"), "{name}: {plan}");
        }
        let (_, lines) = plans
            .iter()
            .find(|(n, _)| *n == "purge namespaces")
            .unwrap();
        let plan = lines.join(" | ");
        assert!(
            plan.contains("namespaces_purge") && plan.contains("tasks_ref"),
            "{plan}"
        );
    }

    /// The counter reads: the table holds at most one day of each
    /// counter, so a read of the 24-hour window reads it whole either way.
    const COUNTER_READS: [&str; 2] = ["counters of a principal", "all counters"];

    #[test]
    fn counters_are_written_and_purged_through_their_clustered_key() {
        let plans = plans();
        let plan = |name: &str| {
            let (_, lines) = plans.iter().find(|(n, _)| *n == name).unwrap();
            lines.join(" | ")
        };
        // An insert has no search; its conflict target is the key.
        let add = plan("add to counter");
        assert!(!add.contains("SCAN"), "{add}");
        let purge = plan("purge counters");
        assert!(
            purge.contains(
                "SEARCH access_day_counters USING PRIMARY KEY (day_minute>? AND day_minute<?)"
            ),
            "{purge}"
        );
        assert!(!purge.contains("SCAN"), "{purge}");
        // The reads read the counter table alone, never another.
        for name in COUNTER_READS {
            let read = plan(name);
            assert!(
                read.starts_with("SCAN access_day_counters"),
                "{name}: {read}"
            );
            assert!(!read.contains("access_audit"), "{name}: {read}");
        }
    }

    #[test]
    fn a_full_scan_would_be_caught() {
        let backend = SqliteBackend::for_tests(SqliteOptions::in_memory());
        let lines = backend
            .with_reader(|reader| reader.explain("SELECT id FROM access_keys WHERE label = ?1"))
            .unwrap();
        assert!(
            lines.iter().any(|line| line.starts_with("SCAN ")),
            "{lines:?}"
        );
    }

    #[test]
    fn millis_round_trip() {
        let now = DateTime::from_timestamp_millis(1_793_000_000_123).unwrap();
        assert_eq!(from_millis(millis(now)), now);
        assert_eq!(from_millis(i64::MAX), DateTime::<Utc>::MAX_UTC);
        let fine = now + chrono::TimeDelta::nanoseconds(999_999);
        assert_eq!(crate::clock::storable(fine), now);
        let before_epoch = DateTime::from_timestamp_nanos(-1);
        assert_eq!(crate::clock::storable(before_epoch), from_millis(-1));
    }
}
