//! The statements kept in `sql/` checked against the Rust that binds and
//! decodes them: each argument named in the SQL (`$n::type /* name */`)
//! as the one function that builds its list names it, in its place, and
//! each answer's columns those its decoder reads, as the test server
//! prepares the statement.

use std::collections::BTreeMap;

use postgres::{Client, NoTls};

use super::batch::{
    AcknowledgedArgs, INSERT_ATTEMPTS, INSERT_NEW_TASKS, INSERT_TASKS, InsertAttemptsArgs,
    InsertTasksArgs, LOCK_AND_LOAD, LOCK_CLAIMABLE, LockAndLoadArgs, LockClaimableArgs,
    RECEIPTS_BY_KEYS, ReceiptsByKeysArgs, WRITE_ACKNOWLEDGED, answer_columns,
};
use super::claim::{
    CLAIM_ONE, ClaimArgs, Named, SUBMIT_AND_CLAIM_ONE, SubmitArgs, claim_columns,
    submission_columns,
};
use super::coalesce::{ManyArgs, SUBMIT_AND_CLAIM_MANY, many_columns};
use crate::backend::rows::EventRow;
use crate::postgres::PostgresOptions;
use crate::{Store, StoreConfig};

/// The name each `$n` of `sql` carries, by `n`, outside `--` comments;
/// panics on a `$n` without a name, or named twice differently.
fn argument_names(file: &str, sql: &str) -> BTreeMap<usize, String> {
    let code: Vec<&str> = sql
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect();
    let code = code.join("\n");
    let mut names = BTreeMap::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let number: usize = rest[..digits].parse().expect("a number after $");
        let mut after = &rest[digits..];
        if let Some(cast) = after.strip_prefix("::") {
            let end = cast
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '[' || c == ']'))
                .unwrap_or(cast.len());
            after = &cast[end..];
        }
        let comment = after
            .trim_start()
            .strip_prefix("/*")
            .unwrap_or_else(|| panic!("{file}: ${number} has no /* name */"));
        let name = comment[..comment.find("*/").expect("a closed comment")].trim();
        let earlier = names.insert(number, name.to_owned());
        assert!(
            earlier.as_deref().is_none_or(|earlier| earlier == name),
            "{file}: ${number} is named {earlier:?} and {name}"
        );
    }
    names
}

fn named(params: &[Named<'_>]) -> Vec<&'static str> {
    params.iter().map(|(name, _)| *name).collect()
}

fn event() -> EventRow {
    EventRow {
        id: 0,
        at: 0,
        principal: String::new(),
        namespace: String::new(),
        action: String::new(),
        outcome: String::new(),
        resource: None,
        ip_hash: None,
    }
}

/// Each statement of `sql/`, by file name, with the names its Rust
/// gives its arguments, in order.
fn statements() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let event = event();
    let claim = ClaimArgs {
        namespace: "",
        queue: "",
        now: 0,
        holder: "",
        expires_at: 0,
        event: &event,
    };
    let submit = SubmitArgs {
        task_namespace: "",
        task_id: "",
        task_version: 0,
        token: 0,
        submitter: "",
        idempotency_key: "",
        digest: String::new(),
        output: None,
        event: &event,
    };
    let mut claim_then_submit = named(&claim.params());
    claim_then_submit.extend(named(&submit.params()));
    let inserts = named(&InsertTasksArgs::default().params());
    vec![
        ("claim_one.sql", CLAIM_ONE, named(&claim.params())),
        (
            "submit_and_claim_one.sql",
            SUBMIT_AND_CLAIM_ONE,
            claim_then_submit,
        ),
        (
            "submit_and_claim_many.sql",
            SUBMIT_AND_CLAIM_MANY,
            named(&ManyArgs::default().params()),
        ),
        (
            "lock_and_load.sql",
            LOCK_AND_LOAD,
            named(&LockAndLoadArgs::default().params()),
        ),
        (
            "lock_claimable.sql",
            LOCK_CLAIMABLE,
            named(&LockClaimableArgs::default().params()),
        ),
        (
            "receipts_by_keys.sql",
            RECEIPTS_BY_KEYS,
            named(&ReceiptsByKeysArgs::default().params()),
        ),
        (
            "write_acknowledged.sql",
            WRITE_ACKNOWLEDGED,
            named(&AcknowledgedArgs::default().params()),
        ),
        ("insert_tasks.sql", INSERT_TASKS, inserts.clone()),
        ("insert_new_tasks.sql", INSERT_NEW_TASKS, inserts),
        (
            "insert_attempts.sql",
            INSERT_ATTEMPTS,
            named(&InsertAttemptsArgs::default().params()),
        ),
    ]
}

/// Every `$n` of every statement carries the name its Rust builder gives
/// the n-th argument, and the builder builds no argument the statement
/// leaves unused.
#[test]
fn every_argument_is_named_as_its_builder_names_it() {
    for (file, sql, built) in statements() {
        let names = argument_names(file, sql);
        let in_sql: Vec<&str> = names.values().map(String::as_str).collect();
        assert_eq!(
            names.keys().copied().collect::<Vec<_>>(),
            (1..=names.len()).collect::<Vec<_>>(),
            "{file}: arguments numbered with gaps"
        );
        assert_eq!(in_sql, built, "{file}: the SQL's names and the builder's");
    }
}

/// The claim inside `submit_and_claim_one.sql` is `claim_one.sql`'s, word
/// for word, but for its one added condition; the two task inserts differ
/// by the conflict clause alone.
#[test]
fn copies_of_a_statement_stay_the_same() {
    let start = CLAIM_ONE
        .find("WITH picked AS (")
        .expect("claim_one.sql's CTEs")
        + 5;
    let end = CLAIM_ONE
        .find("\nSELECT\n")
        .expect("claim_one.sql's answer");
    let claim = &CLAIM_ONE[start..end];
    let gate = "        AND EXISTS (SELECT 1 FROM sok)\n";
    assert_eq!(SUBMIT_AND_CLAIM_ONE.matches(gate).count(), 1);
    assert!(
        SUBMIT_AND_CLAIM_ONE.replace(gate, "").contains(claim),
        "submit_and_claim_one.sql's claim is claim_one.sql's"
    );
    let body = |sql: &'static str| &sql[sql.find("INSERT INTO").expect("an insert")..];
    assert_eq!(
        body(INSERT_TASKS).replace("ON CONFLICT (namespace, task_id, version) DO NOTHING\n", ""),
        body(INSERT_NEW_TASKS)
    );
}

/// A client on a new Tessera schema of the test server, named from
/// `prefix`, its search path that schema.
pub(super) fn fresh_schema(prefix: &str) -> (Client, String) {
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
        .expect("TESSERA_TEST_POSTGRES_URL names a PostgreSQL server");
    let schema = format!("{prefix}_{}", std::process::id());
    let options = PostgresOptions::new(url.as_str()).with_schema(schema.as_str());
    drop(Store::open_postgres(options, StoreConfig::default()).unwrap());
    let mut client = Client::connect(&url, NoTls).unwrap();
    client
        .batch_execute(&format!("SET search_path TO \"{schema}\""))
        .unwrap();
    (client, schema)
}

/// Each answer has exactly the columns its decoder reads, each once, as
/// the server prepares the statement.
#[test]
#[cfg_attr(
    tessera_no_test_postgres,
    ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
)]
fn every_answer_has_the_columns_its_decoder_reads() {
    let (mut client, schema) = fresh_schema("answers");
    let mut answers = vec![
        ("claim_one.sql", CLAIM_ONE, claim_columns()),
        (
            "submit_and_claim_one.sql",
            SUBMIT_AND_CLAIM_ONE,
            submission_columns(),
        ),
        (
            "submit_and_claim_many.sql",
            SUBMIT_AND_CLAIM_MANY,
            many_columns(),
        ),
        (
            "insert_new_tasks.sql",
            INSERT_NEW_TASKS,
            answer_columns()[4].1.clone(),
        ),
        ("insert_attempts.sql", INSERT_ATTEMPTS, Vec::new()),
    ];
    answers.extend(
        answer_columns()
            .into_iter()
            .map(|(sql, columns)| ("a batch statement", sql, columns)),
    );
    let mut failures = Vec::new();
    for (file, sql, mut read) in answers {
        let statement = client.prepare(sql).unwrap();
        let mut answered: Vec<&str> = statement.columns().iter().map(|c| c.name()).collect();
        answered.sort_unstable();
        read.sort_unstable();
        if answered != read {
            failures.push(format!(
                "{file}:\n  answers {answered:?}\n  decoder {read:?}"
            ));
        }
    }
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
