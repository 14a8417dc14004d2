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
                !line.starts_with("SCAN ") || line == "SCAN CONSTANT ROW" || arms.contains(line),
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
    assert!(receipt.contains("attempts_task"), "{receipt}");
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
    for name in ["purge session attempts", "purge session tasks"] {
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
