use tessera_audit::{Action, Counter, CounterKey, Outcome};
use tessera_lease::{Jitter, Retry, Task, TaskSpec};

use super::*;
use crate::model::access::Scope;

fn at(seconds: i64) -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::TimeDelta::seconds(seconds)
}

#[test]
fn the_claim_columns_hold_the_lease_rules_values() {
    let who = Principal::parse("p1").unwrap();
    let spec = TaskSpec {
        alternatives: 2,
        lapse_backoff: Duration::from_secs(5),
        ..TaskSpec::default()
    };
    let mut task = Task::new(TaskId::parse("t").unwrap(), BriefVersion::FIRST, spec).unwrap();
    assert_eq!(claimable_column(task.record()), Some(0));
    task.claim(&who, at(0), Duration::from_secs(30)).unwrap();
    assert_eq!(
        claimable_column(task.record()),
        Some(0),
        "attempt 2 is ready"
    );
    let second = task.claim(&who, at(1), Duration::from_secs(30)).unwrap();
    // Both leased: out of the claim index; each lease's row holds its
    // lapse plus the lapse backoff.
    assert_eq!(claimable_column(task.record()), None);
    let lapses = |task: &Task| -> Vec<Option<i64>> {
        task.record()
            .attempts
            .iter()
            .map(|a| AttemptRow::from_record(a, spec.lapse_backoff).lapses_at)
            .collect()
    };
    assert_eq!(
        lapses(&task),
        vec![Some(millis(at(35))), Some(millis(at(36)))]
    );
    task.fail(
        &who,
        second.token(),
        at(2),
        Retry::After(Duration::from_secs(10)),
        &mut Jitter::seeded(0),
    )
    .unwrap();
    assert_eq!(claimable_column(task.record()), Some(millis(at(12))));
    assert_eq!(
        claimable_from_column(claimable_column(task.record())),
        ClaimableAt::At(at(12))
    );
    assert_eq!(lapses(&task), vec![Some(millis(at(35))), None]);
}

#[test]
fn attempt_rows_round_trip() {
    let who = Principal::parse("p1").unwrap();
    let mut task = Task::new(
        TaskId::parse("t").unwrap(),
        BriefVersion::FIRST,
        TaskSpec::default(),
    )
    .unwrap();
    task.claim(&who, at(0), Duration::from_secs(30)).unwrap();
    let record = &task.record().attempts[0];
    let row = AttemptRow::from_record(record, Duration::ZERO);
    assert_eq!(row.lapses_at, row.expires_at, "leased, no lapse backoff");
    assert_eq!(&row.record().unwrap(), record);
    let mut broken = row.clone();
    broken.holder = None;
    assert!(broken.record().is_err());
}

#[test]
fn counter_rows_round_trip() {
    let now = at(30);
    for principal in [Some("p3"), None] {
        let counter = Counter {
            key: CounterKey::new(
                now,
                principal.map(|name| tessera_audit::Principal::new(name).unwrap()),
                tessera_audit::Namespace::new("*").unwrap(),
                Action::Claim,
                Outcome::Empty,
            ),
            count: 5,
        };
        let row = CounterRow::from_counter(&counter);
        assert_eq!(row.principal, principal.unwrap_or(""));
        assert_eq!(row.counter().unwrap(), counter);
    }
}

#[test]
fn unknown_stored_names_are_skipped() {
    let scopes = names(r#"["read","teleport"]"#, Scope::parse).unwrap();
    assert_eq!(scopes, vec![Scope::Read]);
    assert!(names("not json", Scope::parse).is_err());
}
