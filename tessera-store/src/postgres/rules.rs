//! The lease rules the one-statement claims and submissions restate in
//! SQL, where the statement computes them over rows only it picks (the
//! next task's token counter and backoff, the submitted lease's grant
//! time), each beside its twin in Rust: the `tessera-lease` rule itself
//! where it can be called alone, else a small function that says which
//! rule it mirrors. A property test has the test server compute each
//! spelling of the rule in `sql/` over random inputs and compares it with
//! the twin; what a statement can take from Rust (the time, the lease's
//! expiry, the submission's audit resource) it takes as an argument.
//!
//! The after-commit checks (`checked_grant`, `checked_acceptance`) still
//! compare each statement's whole writes with the lease rules.

use std::time::Duration;

use chrono::DateTime;
use postgres::types::{FromSql, ToSql};
use postgres::{Client, NoTls};
use proptest::prelude::*;
use tessera_lease::{
    AttemptNumber, AttemptRecord, BriefVersion, Digest, FencingToken, IdempotencyKey, LeaseRecord,
    MAX_BACKOFF, Principal, Submission, Submitted, Task, TaskId, TaskSpec, TaskState,
};

use super::claim::{CLAIM_ONE, SUBMIT_AND_CLAIM_ONE};
use super::coalesce::SUBMIT_AND_CLAIM_MANY;
use crate::backend::rows::{from_millis, millis};
use crate::model::task::TaskRef;

/// The token a grant takes after the task's counter `last_token` (0
/// before the first grant), or none when the counter is at its end: the
/// lease rules' claim (`Task::claim`), run on a task with that counter.
fn next_token(last_token: i64) -> Option<i64> {
    let id = TaskId::parse("t").expect("a task id");
    let task = Task::new(id, BriefVersion::FIRST, TaskSpec::default()).expect("a task");
    let mut record = task.record().clone();
    record.last_token = FencingToken::new(last_token).ok();
    let mut task = Task::restore(record).expect("a restorable task");
    let holder = Principal::parse("p").expect("a principal");
    let lease = task.claim(&holder, DateTime::UNIX_EPOCH, Duration::from_secs(1));
    lease.ok().map(|lease| lease.token().as_i64())
}

/// [`next_token`] in SQL, over the picked task `p`, with the condition
/// that it exists.
const NEXT_TOKEN: &str = "p.last_token + 1";
const HAS_NEXT_TOKEN: &str = "p.last_token < 9223372036854775807";

/// When a lease that expires at `expires_at` lapses into a claimable
/// attempt, for a task whose lapse backoff is `lapse_backoff_ms`:
/// `tessera-lease`'s `AttemptRecord::lapses_at`.
fn lapse_end(expires_at: i64, lapse_backoff_ms: i64) -> Option<i64> {
    let attempt = AttemptRecord {
        number: AttemptNumber::FIRST,
        state: TaskState::Leased,
        tries: 1,
        lease: Some(LeaseRecord {
            holder: Principal::parse("p").expect("a principal"),
            token: FencingToken::FIRST,
            granted_at: from_millis(expires_at - 1),
            expires_at: from_millis(expires_at),
        }),
        last_error: None,
    };
    let backoff = Duration::from_millis(u64::try_from(lapse_backoff_ms).ok()?);
    attempt.lapses_at(backoff).map(millis)
}

/// [`lapse_end`] in SQL: the one-statement claims' spelling, the expiry
/// an argument, and the coalesced claims', the expiry a caller's.
const LAPSE_END_OF_ONE: &str = "$5::bigint /* expires_at */ + ok.lapse_backoff_ms";
const LAPSE_END_OF_MANY: &str = "ok.expires_at + ok.lapse_backoff_ms";

/// When a claim at `now` stamps its lease, given the attempt's latest
/// grant: the later of the two, as the lease rules' claim (`Task::claim`)
/// stamps it. The statements grant at `now`, so only where this is `now`.
fn grant_time(now: i64, granted_at: Option<i64>) -> i64 {
    granted_at.map_or(now, |granted_at| granted_at.max(now))
}

/// Whether [`grant_time`] is `now`, in SQL: the one-statement claims'
/// spelling and the coalesced claims'.
const GRANTS_NOW_OF_ONE: &str = "(a.granted_at IS NULL OR a.granted_at <= $3::bigint /* now */)";
const GRANTS_NOW_OF_MANY: &str = "(a.granted_at IS NULL OR a.granted_at <= c.now)";

/// When a submission at `now` of a lease granted at `granted_at` is
/// accepted: the lease rules' submission (`Task::submit`), run on a task
/// leased at that time.
fn accepted_at(now: i64, granted_at: i64, lease_ms: i64) -> i64 {
    let id = TaskId::parse("t").expect("a task id");
    let mut task = Task::new(id, BriefVersion::FIRST, TaskSpec::default()).expect("a task");
    let holder = Principal::parse("p").expect("a principal");
    let duration = Duration::from_millis(u64::try_from(lease_ms).expect("a positive lease"));
    let lease = task
        .claim(&holder, from_millis(granted_at), duration)
        .expect("a fresh task is claimable");
    let submission = Submission {
        principal: holder,
        token: lease.token(),
        key: IdempotencyKey::parse("k").expect("a key"),
        digest: Digest::from_bytes([0; 32]),
    };
    match task.submit(&submission, None, from_millis(now)) {
        Ok(Submitted::Accepted(receipt)) => millis(receipt.accepted_at),
        other => panic!("a live lease's submission is accepted, not {other:?}"),
    }
}

/// [`accepted_at`] in SQL, over the submitted attempt `sa`: the single
/// statement's spelling, the time an argument, and the coalesced one's.
const ACCEPTED_AT_OF_ONE: &str = "GREATEST($3::bigint /* now */, sa.granted_at)";
const ACCEPTED_AT_OF_MANY: &str = "GREATEST(c.now, sa.granted_at)";

/// The audit resource of a grant of the picked task `p`'s one attempt
/// under its next token, in SQL; its twin is
/// [`TaskRef::grant_resource`].
const GRANT_RESOURCE: &str =
    "'task:' || p.task_id || '@' || p.version || '/a1/t' || (p.last_token + 1)";

/// Each spelling and the statements that use it.
const SPELLINGS: [(&str, &[&str]); 9] = [
    (
        NEXT_TOKEN,
        &[CLAIM_ONE, SUBMIT_AND_CLAIM_ONE, SUBMIT_AND_CLAIM_MANY],
    ),
    (
        HAS_NEXT_TOKEN,
        &[CLAIM_ONE, SUBMIT_AND_CLAIM_ONE, SUBMIT_AND_CLAIM_MANY],
    ),
    (LAPSE_END_OF_ONE, &[CLAIM_ONE, SUBMIT_AND_CLAIM_ONE]),
    (LAPSE_END_OF_MANY, &[SUBMIT_AND_CLAIM_MANY]),
    (GRANTS_NOW_OF_ONE, &[CLAIM_ONE, SUBMIT_AND_CLAIM_ONE]),
    (GRANTS_NOW_OF_MANY, &[SUBMIT_AND_CLAIM_MANY]),
    (ACCEPTED_AT_OF_ONE, &[SUBMIT_AND_CLAIM_ONE]),
    (ACCEPTED_AT_OF_MANY, &[SUBMIT_AND_CLAIM_MANY]),
    (
        GRANT_RESOURCE,
        &[CLAIM_ONE, SUBMIT_AND_CLAIM_ONE, SUBMIT_AND_CLAIM_MANY],
    ),
];

/// The rules' spellings here are the statements' own: a statement that
/// spells a rule otherwise fails here, and its new spelling needs a twin.
#[test]
fn each_statement_spells_its_rules_as_the_twins_are_tested() {
    for (spelling, statements) in SPELLINGS {
        for statement in statements {
            assert!(
                statement.contains(spelling),
                "a statement no longer spells {spelling:?}"
            );
        }
    }
}

/// `expression` computed by the test server, each input's text in it
/// replaced by a bound argument of its SQL type.
fn evaluate<T: for<'a> FromSql<'a>>(
    client: &mut Client,
    expression: &str,
    inputs: &[(&str, &str, &(dyn ToSql + Sync))],
) -> T {
    let mut sql = expression.to_owned();
    for (n, (text, kind, _)) in inputs.iter().enumerate() {
        assert!(sql.contains(text), "{expression:?} reads {text}");
        sql = sql.replace(text, &format!("${}::{kind}", n + 1));
    }
    let values: Vec<&(dyn ToSql + Sync)> = inputs.iter().map(|(.., value)| *value).collect();
    client
        .query_one(&format!("SELECT {sql}"), &values)
        .unwrap()
        .get(0)
}

fn client() -> Client {
    let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
        .expect("TESSERA_TEST_POSTGRES_URL names a PostgreSQL server");
    Client::connect(&url, NoTls).unwrap()
}

/// The times a store writes: Unix milliseconds of years 1970 to 9999.
fn times() -> impl Strategy<Value = i64> {
    0..=253_402_300_799_000_i64
}

/// The one client of the test server the property tests share: a static,
/// never dropped (a client dropped in a thread's destructor would block on
/// a runtime that is gone).
static CLIENT: std::sync::Mutex<Option<Client>> = std::sync::Mutex::new(None);

/// Runs `work` with the shared client of the test server.
fn with_client<T>(work: impl FnOnce(&mut Client) -> T) -> T {
    let mut slot = CLIENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    work(slot.get_or_insert_with(client))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn the_next_token_is_the_lease_rules(
        last_token in prop_oneof![
            0..=16_i64,
            0..=i64::MAX,
            (i64::MAX - 16)..=i64::MAX,
        ],
    ) {
        let input: &[(&str, &str, &(dyn ToSql + Sync))] =
            &[("p.last_token", "bigint", &last_token)];
        let has_next: bool = with_client(|client| evaluate(client, HAS_NEXT_TOKEN, input));
        prop_assert_eq!(has_next, next_token(last_token).is_some());
        if has_next {
            let token: i64 = with_client(|client| evaluate(client, NEXT_TOKEN, input));
            prop_assert_eq!(Some(token), next_token(last_token));
        }
    }

    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn the_lapse_end_is_the_lease_rules(
        expires_at in 1..=253_402_300_799_000_i64 - 1_000_000_000,
        backoff in 0..=i64::try_from(MAX_BACKOFF.as_millis()).unwrap(),
    ) {
        let expected = lapse_end(expires_at, backoff);
        for (spelling, expiry) in [
            (LAPSE_END_OF_ONE, "$5::bigint /* expires_at */"),
            (LAPSE_END_OF_MANY, "ok.expires_at"),
        ] {
            let end: i64 = with_client(|client| {
                evaluate(
                    client,
                    spelling,
                    &[(expiry, "bigint", &expires_at), ("ok.lapse_backoff_ms", "bigint", &backoff)],
                )
            });
            prop_assert_eq!(Some(end), expected);
        }
    }

    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn a_statement_grants_only_where_the_rules_grant_at_now(
        now in times(),
        granted_at in prop::option::of(times()),
        near in prop::option::of(-2..=2_i64),
    ) {
        // Times a millisecond apart, as well as far ones.
        let granted_at = match near {
            Some(delta) => Some(now.saturating_add(delta)),
            None => granted_at,
        };
        for (spelling, time) in [
            (GRANTS_NOW_OF_ONE, "$3::bigint /* now */"),
            (GRANTS_NOW_OF_MANY, "c.now"),
        ] {
            let grants: bool = with_client(|client| {
                evaluate(
                    client,
                    spelling,
                    &[("a.granted_at", "bigint", &granted_at), (time, "bigint", &now)],
                )
            });
            prop_assert_eq!(grants, grant_time(now, granted_at) == now);
        }
    }

    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn the_acceptance_time_is_the_lease_rules(
        granted_at in 1_000_000_000..=253_402_300_799_000_i64 - 1_000_000_000,
        lease_ms in 1..=86_400_000_i64,
        before in 0..=1_000_000_000_i64,
        after in 0..=86_400_000_i64,
        earlier in any::<bool>(),
    ) {
        // Any time before the grant, or one before the lease expires.
        let now = if earlier { granted_at - before } else { granted_at + after % lease_ms };
        let expected = accepted_at(now, granted_at, lease_ms);
        for (spelling, time) in [
            (ACCEPTED_AT_OF_ONE, "$3::bigint /* now */"),
            (ACCEPTED_AT_OF_MANY, "c.now"),
        ] {
            let at: i64 = with_client(|client| {
                evaluate(
                    client,
                    spelling,
                    &[(time, "bigint", &now), ("sa.granted_at", "bigint", &granted_at)],
                )
            });
            prop_assert_eq!(at, expected);
        }
    }

    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn the_grant_resource_is_the_task_references(
        id in "[A-Za-z0-9][A-Za-z0-9_.:-]{0,40}",
        version in 1..=u32::MAX,
        last_token in 0..i64::MAX,
    ) {
        let Ok(task_id) = TaskId::parse(&id) else {
            return Ok(());
        };
        let task = TaskRef::new(
            tessera_lease::Namespace::parse("n").unwrap(),
            task_id,
            BriefVersion::new(version).unwrap(),
        );
        let token = FencingToken::new(last_token + 1).unwrap();
        let expected = task.grant_resource(AttemptNumber::FIRST, token);
        let stored_version = i64::from(version);
        let resource: String = with_client(|client| {
            evaluate(
                client,
                GRANT_RESOURCE,
                &[
                    ("p.task_id", "text", &id),
                    ("p.version", "bigint", &stored_version),
                    ("p.last_token", "bigint", &last_token),
                ],
            )
        });
        prop_assert_eq!(Some(resource.as_str()), expected.as_ref().map(|r| r.as_str()));
    }
}
