use postgres::types::ToSql;

use super::*;
use crate::postgres::checks::fresh_schema;
use crate::postgres::claim::CLAIM_ONE;
use crate::postgres::coalesce::SUBMIT_AND_CLAIM_MANY;
use crate::postgres::options::PostgresOptions;

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Every claim, listing and audit-page statement searches an index (with
/// sequential scans priced out, as on a table too large to scan), and
/// the claim statements search the claim indexes once per priority.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn claim_listing_and_audit_statements_search_their_indexes() {
    let (mut client, schema) = fresh_schema("plans");
    client.batch_execute("SET enable_seqscan = off").unwrap();
    let (ns, queue, state) = ("renders", "jobs", "ready");
    let (now, zero, limit, big) = (1_i64, 0_i64, 10_i64, i64::MAX);
    let claim: &[&(dyn ToSql + Sync)] = &[&ns, &queue, &now, &zero];
    let probe: &[&(dyn ToSql + Sync)] = &[&ns, &queue, &now];
    let listing: &[&(dyn ToSql + Sync)] = &[&ns, &state, &zero, &zero, &limit];
    let principal = "p1";
    let mine: &[&(dyn ToSql + Sync)] = &[&principal, &zero, &limit, &big, &big];
    let all: &[&(dyn ToSql + Sync)] = &[&zero, &limit, &big];
    let (no_queue, some_state) = (None::<&str>, Some(state));
    let bulk: &[&(dyn ToSql + Sync)] = &[
        &ns,
        &zero,
        &zero,
        &zero,
        &big,
        &no_queue,
        &some_state,
        &limit,
        &no_queue,
    ];
    let cases: [(&str, &str, Params<'_>, &str, usize); 9] = [
        (
            "attempts matching a bulk filter",
            ATTEMPTS_MATCHING,
            bulk,
            "attempts_changed_at_rest",
            1,
        ),
        (
            "next claimable",
            NEXT_CLAIMABLE,
            claim,
            "tasks_claim_order",
            1,
        ),
        (
            "peek claimable",
            PEEK_CLAIMABLE,
            claim,
            "tasks_claim_order",
            1,
        ),
        ("next lapsed", NEXT_LAPSED, claim, "attempts_lapse_order", 1),
        (
            "has claimable",
            HAS_CLAIMABLE,
            probe,
            "attempts_lapse_order",
            1,
        ),
        (
            "listing, oldest",
            TASKS_BY_STATE_OLDEST,
            listing,
            "attempts_at_rest",
            1,
        ),
        (
            "listing, newest",
            TASKS_BY_STATE_NEWEST,
            listing,
            "attempts_at_rest",
            1,
        ),
        (
            "one principal's audit",
            EVENTS_OF_PRINCIPAL,
            mine,
            "access_audit_by_principal",
            1,
        ),
        ("everyone's audit", EVENTS_ALL, all, "access_audit_pkey", 1),
    ];
    let mut failures = Vec::new();
    for (name, sql, params, index, searches) in cases {
        let plan: Vec<String> = client
            .query(&format!("EXPLAIN {sql}"), params)
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        let found = plan.matches(&format!("using {index}")).count();
        // A sort above the search would read every row the range holds;
        // an incremental one sorts only the rows of one time.
        let sorts = plan.matches("Sort").count() - plan.matches("Incremental Sort").count();
        // A search run again for each priority bounds it by the
        // priority, so it never walks another priority's entries.
        let per_priority =
            !sql.contains("each(level)") || plan.contains("(priority = \"*VALUES*\".column1)");
        if plan.contains("Seq Scan") || found < searches || sorts > 0 || !per_priority {
            failures.push(format!(
                "{name}: {searches} searches of {index} wanted\n{plan}"
            ));
        }
    }
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// With few leases among many attempts in the statistics, as on a
/// queue with a long history, every search of leased attempts reads
/// `attempts_lapse_order`, never the listing index: a search there
/// would walk, on every claim, the entry each ended lease leaves in
/// it until a vacuum.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn lease_searches_read_the_lapse_index_when_leases_are_rare() {
    let (mut client, schema) = fresh_schema("rare_leases");
    client
        .batch_execute(
            "INSERT INTO attempts (task, number, namespace, queue, state, tries, holder, \
             token, granted_at, expires_at, lapses_at, changed_at) \
             SELECT n, 1, 'renders', 'jobs', CASE WHEN n <= 8 THEN 'leased' ELSE 'done' END, \
             1, 'p1', 1, 1, 10, 10, 1 FROM generate_series(1, 20000) AS n; \
             ANALYZE attempts; SET plan_cache_mode = force_generic_plan;",
        )
        .unwrap();
    // Generic plans, as the prepared statements run; each case's
    // arguments are its parameters' values.
    let claim = "'renders', 'jobs', 5, 'p1', 5, 'p1', 'renders', 'claim', 'ok', NULL";
    let cases = [
        ("a claim in one statement", CLAIM_ONE, claim),
        ("next lapsed", NEXT_LAPSED, "'renders', 'jobs', 5, 0"),
        ("has claimable", HAS_CLAIMABLE, "'renders', 'jobs', 5"),
        ("expired leases", LAPSED_TASKS, "'renders', 5, 10"),
        (
            "expired leases of a queue",
            LAPSED_IN_QUEUE,
            "'renders', 5, 10, 'jobs'",
        ),
        ("expired leases, counted", COUNT_LAPSED, "'renders', 5"),
        ("leases of a queue", LEASED_IN_QUEUE, "'renders', 'jobs'"),
        (
            "leased, oldest",
            LEASED_OLDEST,
            "'renders', 'leased', 0, 0, 10",
        ),
        (
            "leased, newest",
            LEASED_NEWEST,
            "'renders', 'leased', 9223372036854775807, 0, 10",
        ),
        ("counts by state", COUNT_BY_STATE, "'renders'"),
        ("queue depth, leased", QUEUE_LEASED, "'renders'"),
    ];
    let mut failures = Vec::new();
    for (n, (name, sql, arguments)) in cases.into_iter().enumerate() {
        client
            .batch_execute(&format!("PREPARE search_{n} AS {sql}"))
            .unwrap();
        let plan: Vec<String> = client
            .query(&format!("EXPLAIN EXECUTE search_{n}({arguments})"), &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        if !plan.contains("using attempts_lapse_order") {
            failures.push(format!("{name}: attempts_lapse_order wanted\n{plan}"));
        }
    }
    // Retention's search of one namespace's final state is one range
    // of `attempts_changed_at_rest`, in a generic plan too.
    client
        .batch_execute(&format!("PREPARE finished AS {FINISHED_ATTEMPTS}"))
        .unwrap();
    let plan: Vec<String> = client
        .query(
            "EXPLAIN EXECUTE finished('done', 5, 0, 0, 10, 'renders')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    if !plan.contains("using attempts_changed_at_rest") {
        failures.push(format!(
            "finished attempts: attempts_changed_at_rest wanted\n{plan}"
        ));
    }
    // A queue depth reads the claim order, not the tasks.
    client
        .batch_execute(&format!("PREPARE depth AS {QUEUE_CLAIMABLE}"))
        .unwrap();
    let plan: Vec<String> = client
        .query("EXPLAIN EXECUTE depth('renders', 5)", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    if !plan.contains("using tasks_claim_order") {
        failures.push(format!("queue depth: tasks_claim_order wanted\n{plan}"));
    }
    // And the slots whose window ended are one range of theirs.
    client
        .batch_execute(&format!("PREPARE ended AS {PURGE_ENDED_SLOTS}"))
        .unwrap();
    let plan: Vec<String> = client
        .query("EXPLAIN EXECUTE ended(5, 500)", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    if !plan.contains("using unique_slots_ending") {
        failures.push(format!("ended slots: unique_slots_ending wanted\n{plan}"));
    }
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// On a queue with a history (20,000 tasks, 10,000 receipts), both
/// the custom plans a prepared statement starts with and the generic
/// plan it keeps find the rows of [`SUBMIT_AND_CLAIM_MANY`] through
/// indexes: no plan reads a whole table to lock a few attempts.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn coalesced_submissions_search_their_indexes_in_every_plan() {
    let (mut client, schema) = fresh_schema("many_plans");
    client
        .batch_execute(
            "INSERT INTO tasks (namespace, queue, task_id, version, brief, brief_format, \
             alternatives, lapse_backoff_ms, max_tries, last_token, claimable_at, created_at, \
             enqueued_by, priority) SELECT 'renders', 'jobs', 't-' || n, 1, '\\x00', 'bytes', \
             1, 0, 20, 0, 0, 0, 'p1', 0 FROM generate_series(1, 20000) AS n; \
             INSERT INTO attempts (task, number, namespace, queue, state, tries, priority, \
             changed_at, holder, token, idempotency_key, digest, accepted_at) \
             SELECT id, 1, 'renders', 'jobs', CASE WHEN id % 2 = 0 THEN 'done' ELSE 'ready' END, \
             0, 0, 0, CASE WHEN id % 2 = 0 THEN 'p1' END, CASE WHEN id % 2 = 0 THEN 1 END, \
             CASE WHEN id % 2 = 0 THEN 'k' || id END, CASE WHEN id % 2 = 0 THEN 'd' END, \
             CASE WHEN id % 2 = 0 THEN 0 END FROM tasks; ANALYZE tasks; ANALYZE attempts;",
        )
        .unwrap();
    client
        .batch_execute(&format!("PREPARE many AS {SUBMIT_AND_CLAIM_MANY}"))
        .unwrap();
    let four = |value: &str| format!("'{{{value},{value},{value},{value}}}'");
    let arguments = [
        "'renders'".to_owned(),
        "'jobs'".to_owned(),
        "5".to_owned(),
        four("5"),
        four("p1"),
        four("50"),
        four("p1"),
        four("renders"),
        four("claim"),
        four("ok"),
        four("NULL"),
        four("renders"),
        "'{t-1,t-2,t-3,t-4}'".to_owned(),
        four("1"),
        four("1"),
        four("p1"),
        "'{k-1,k-2,k-3,k-4}'".to_owned(),
        four("d"),
        four("NULL"),
        four("p1"),
        four("renders"),
        four("submit"),
        four("ok"),
        four("r"),
        four("NULL"),
    ]
    .join(", ");
    let mut failures = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        client
            .batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .unwrap();
        read_whole(
            &mut client,
            &format!("many({arguments})"),
            mode,
            &mut failures,
        );
    }
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Adds to `failures`, under `label`, each of `tasks` and `attempts` that
/// the plan of the prepared statement call `execute` reads whole.
fn read_whole(
    client: &mut postgres::Client,
    execute: &str,
    label: &str,
    failures: &mut Vec<String>,
) {
    let plan: Vec<String> = client
        .query(&format!("EXPLAIN EXECUTE {execute}"), &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    for table in ["tasks", "attempts"] {
        if plan.contains(&format!("Seq Scan on {table}")) {
            failures.push(format!("{label}: {table} read whole\n{plan}"));
        }
    }
}

/// A connection keeps each statement's plan from its first call, which
/// is often made while the tables are nearly empty. On the store's own
/// connections (its session settings) those plans still find the rows of
/// `tasks` and `attempts` through indexes: a plan that read a whole
/// table, cheap while it is small, would read all of it on every call as
/// it grows, until the next `ANALYZE`.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn plans_kept_from_empty_tables_search_indexes() {
    use crate::postgres::batch::{
        INSERT_ATTEMPTS, INSERT_NEW_TASKS, INSERT_TASKS, LOCK_AND_LOAD, LOCK_CLAIMABLE,
        RECEIPTS_BY_KEYS, WRITE_ACKNOWLEDGED,
    };
    use crate::postgres::claim::SUBMIT_AND_CLAIM_ONE;

    let (client, schema) = fresh_schema("empty_plans");
    drop(client);
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL").unwrap();
    let mut client = PostgresOptions::new(url.as_str())
        .with_schema(schema.as_str())
        .config()
        .unwrap()
        .connect(postgres::NoTls)
        .unwrap();
    let statements = [
        ("write_acknowledged.sql", WRITE_ACKNOWLEDGED),
        ("lock_and_load.sql", LOCK_AND_LOAD),
        ("lock_claimable.sql", LOCK_CLAIMABLE),
        ("receipts_by_keys.sql", RECEIPTS_BY_KEYS),
        ("insert_tasks.sql", INSERT_TASKS),
        ("insert_new_tasks.sql", INSERT_NEW_TASKS),
        ("insert_attempts.sql", INSERT_ATTEMPTS),
        ("claim_one.sql", CLAIM_ONE),
        ("submit_and_claim_one.sql", SUBMIT_AND_CLAIM_ONE),
        ("submit_and_claim_many.sql", SUBMIT_AND_CLAIM_MANY),
    ];
    let mut failures = Vec::new();
    for (index, (name, sql)) in statements.into_iter().enumerate() {
        let parameters = client.prepare(sql).unwrap().params().len();
        client
            .batch_execute(&format!("PREPARE kept_{index} AS {sql}"))
            .unwrap();
        // Every parameter is typed by a cast in the statement, so nulls
        // stand for any arguments: the kept plan does not depend on them.
        let arguments = vec!["NULL"; parameters].join(", ");
        read_whole(
            &mut client,
            &format!("kept_{index}({arguments})"),
            name,
            &mut failures,
        );
    }
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
