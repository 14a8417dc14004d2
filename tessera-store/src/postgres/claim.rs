//! A claim in one statement: one round trip and one transaction, its own
//! (see [`QuickClaim`]), and a submission with the next claim in one
//! more. Each statement is a file of `sql/`; its arguments are built by
//! one function here, in the order and under the names its SQL gives
//! them, and its answer is read here by column name.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use postgres::Row;
use postgres::types::ToSql;

use crate::backend::rows::{EventRow, corrupt, from_millis, millis};
use crate::backend::{
    QuickAcceptance, QuickClaim, QuickClaimed, QuickGrant, QuickSubmit, QuickSubmitted,
};
use crate::error::Error;

use super::PostgresBackend;
use super::error::is_transient;
use super::rows::{AttemptColumns, TaskColumns, version};

/// A claim in one statement.
pub(super) const CLAIM_ONE: &str = include_str!("sql/claim_one.sql");
/// A submission and the next claim in one statement.
pub(super) const SUBMIT_AND_CLAIM_ONE: &str = include_str!("sql/submit_and_claim_one.sql");

/// The table rows a grant changes: the attempt, the task, the audit row.
pub(super) const GRANT_ROWS: u64 = 3;
/// The table rows an accepted submission writes: the attempt, the
/// receipt, the audit row.
pub(super) const SUBMIT_ROWS: u64 = 3;

/// An argument of a statement, under the name its SQL gives it.
pub(super) type Named<'a> = (&'static str, &'a (dyn ToSql + Sync));

/// The answers' columns beside the task's (`task_`) and the attempt's
/// (`before_`, `after_`): what became of the claim or the submission,
/// the audit row's resource, a submission's acceptance time, and whose
/// row it is (`s` the submission's, `c` the claim's).
pub(super) const OUTCOME: &str = "outcome";
pub(super) const RESOURCE: &str = "resource";
pub(super) const ACCEPTED_AT: &str = "accepted_at";
pub(super) const ROLE: &str = "role";

impl PostgresBackend {
    pub(super) fn claim_in_one(&self, claim: &QuickClaim<'_>) -> Result<QuickClaimed, Error> {
        let args = ClaimArgs::of(claim);
        let rows = self.one_statement(CLAIM_ONE, &args.params(), claim.now, GRANT_ROWS)?;
        let Some(row) = rows.as_ref().and_then(|rows| rows.first()) else {
            return Ok(QuickClaimed::Declined);
        };
        let claimed = claimed(row)?;
        self.wrote(claim.now, &claimed, 0);
        Ok(claimed)
    }

    pub(super) fn submit_and_claim_in_one(
        &self,
        submit: &QuickSubmit<'_>,
        claim: &QuickClaim<'_>,
    ) -> Result<QuickSubmitted, Error> {
        let (claim_args, submit_args) = (ClaimArgs::of(claim), SubmitArgs::of(submit));
        let mut params = claim_args.params().to_vec();
        params.extend_from_slice(&submit_args.params());
        let rows = self.one_statement(
            SUBMIT_AND_CLAIM_ONE,
            &params,
            claim.now,
            SUBMIT_ROWS + GRANT_ROWS,
        )?;
        let Some(rows) = rows else {
            return Ok(QuickSubmitted::Declined);
        };
        let role = |role: &str| {
            rows.iter()
                .find(|row| row.try_get::<_, &str>(ROLE).ok() == Some(role))
                .ok_or_else(|| corrupt("a one-statement submission's answer"))
        };
        let submitted = role("s")?;
        let outcome: &str = submitted.try_get(OUTCOME).map_err(Error::from)?;
        if outcome != "submitted" {
            return Ok(QuickSubmitted::Declined);
        }
        let claimed = claimed(role("c")?)?;
        self.wrote(claim.now, &claimed, SUBMIT_ROWS);
        accepted(submitted, claimed)
    }

    /// Runs `statement` outside a transaction block, so it is its own
    /// transaction and commits with its answer, in one round trip; `None`
    /// when it was not run or rolled back: writes are refused, the day's
    /// allowance could not take `rows`, or a lost race (the general
    /// transaction then decides, and retries).
    pub(super) fn one_statement(
        &self,
        statement: &'static str,
        params: &[Named<'_>],
        now: DateTime<Utc>,
        rows: u64,
    ) -> Result<Option<Vec<Row>>, Error> {
        if self.refusing.load(Ordering::SeqCst) || !self.allowance.lock().admits(now, rows) {
            return Ok(None);
        }
        let mut connection = self.connection()?;
        if connection.client.is_closed() {
            connection = self.connection()?;
        }
        let connection = &mut *connection;
        let prepared = match connection.prepared.get(statement) {
            Some(prepared) => prepared.clone(),
            None => {
                let prepared = connection.client.prepare(statement)?;
                connection.prepared.insert(statement, prepared.clone());
                prepared
            }
        };
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(_, value)| *value).collect();
        match connection
            .client
            .query(&prepared, &values)
            .map_err(Error::from)
        {
            Ok(rows) => Ok(Some(rows)),
            Err(error) if is_transient(&error) => Ok(None),
            Err(error) => Err(self.classify(error, false)),
        }
    }

    /// Counts what a one-statement claim wrote, with `more` rows of its
    /// own beside the claim's.
    fn wrote(&self, now: DateTime<Utc>, claimed: &QuickClaimed, more: u64) {
        self.wrote_rows(now, more + claimed.rows());
    }

    /// Counts `rows` written by one transaction, if it wrote any.
    pub(super) fn wrote_rows(&self, now: DateTime<Utc>, rows: u64) {
        if rows == 0 {
            return;
        }
        self.allowance.lock().record(now, rows);
        self.rows_written.fetch_add(rows, Ordering::Relaxed);
        self.write_transactions.fetch_add(1, Ordering::Relaxed);
    }
}

impl QuickClaimed {
    /// The table rows the claim wrote: a grant's, or none.
    pub(super) fn rows(&self) -> u64 {
        if matches!(self, Self::Leased(_)) {
            GRANT_ROWS
        } else {
            0
        }
    }
}

/// [`CLAIM_ONE`]'s arguments, held for the statement's life.
pub(super) struct ClaimArgs<'a> {
    pub(super) namespace: &'a str,
    pub(super) queue: &'a str,
    pub(super) now: i64,
    pub(super) holder: &'a str,
    pub(super) expires_at: i64,
    pub(super) event: &'a EventRow,
}

impl<'a> ClaimArgs<'a> {
    fn of(claim: &'a QuickClaim<'a>) -> Self {
        Self {
            namespace: claim.namespace.as_str(),
            queue: claim.queue.as_str(),
            now: millis(claim.now),
            holder: claim.holder.as_str(),
            expires_at: millis(claim.expires_at),
            event: &claim.event,
        }
    }

    /// `$1` to `$10` of [`CLAIM_ONE`] and [`SUBMIT_AND_CLAIM_ONE`].
    pub(super) fn params(&self) -> [Named<'_>; 10] {
        let event = self.event;
        [
            ("namespace", &self.namespace),
            ("queue", &self.queue),
            ("now", &self.now),
            ("holder", &self.holder),
            ("expires_at", &self.expires_at),
            ("claim_principal", &event.principal),
            ("claim_namespace", &event.namespace),
            ("claim_action", &event.action),
            ("claim_outcome", &event.outcome),
            ("claim_ip_hash", &event.ip_hash),
        ]
    }
}

/// [`SUBMIT_AND_CLAIM_ONE`]'s arguments after the claim's.
pub(super) struct SubmitArgs<'a> {
    pub(super) task_namespace: &'a str,
    pub(super) task_id: &'a str,
    pub(super) task_version: i64,
    pub(super) token: i64,
    pub(super) submitter: &'a str,
    pub(super) idempotency_key: &'a str,
    pub(super) digest: String,
    pub(super) output: Option<&'a [u8]>,
    pub(super) event: &'a EventRow,
}

impl<'a> SubmitArgs<'a> {
    fn of(submit: &'a QuickSubmit<'a>) -> Self {
        let (task, submission) = (submit.task, submit.submission);
        Self {
            task_namespace: task.namespace.as_str(),
            task_id: task.id.as_str(),
            task_version: version(task),
            token: submission.token.as_i64(),
            submitter: submission.principal.as_str(),
            idempotency_key: submission.key.as_str(),
            digest: submission.digest.to_string(),
            output: submit.output,
            event: &submit.event,
        }
    }

    /// `$11` to `$24` of [`SUBMIT_AND_CLAIM_ONE`].
    pub(super) fn params(&self) -> [Named<'_>; 14] {
        let event = self.event;
        [
            ("task_namespace", &self.task_namespace),
            ("task_id", &self.task_id),
            ("task_version", &self.task_version),
            ("token", &self.token),
            ("submitter", &self.submitter),
            ("idempotency_key", &self.idempotency_key),
            ("digest", &self.digest),
            ("output", &self.output),
            ("submit_principal", &event.principal),
            ("submit_namespace", &event.namespace),
            ("submit_action", &event.action),
            ("submit_outcome", &event.outcome),
            ("submit_resource", &event.resource),
            ("submit_ip_hash", &event.ip_hash),
        ]
    }
}

/// A submission the statement wrote, in [`SUBMIT_AND_CLAIM_ONE`]'s
/// columns (the `s` row), with the claim made beside it.
pub(super) fn accepted(submitted: &Row, claimed: QuickClaimed) -> Result<QuickSubmitted, Error> {
    let task = TaskColumns::TASK.read(submitted)?;
    let before = AttemptColumns::BEFORE.read(submitted)?;
    let accepted_at: i64 = submitted.try_get(ACCEPTED_AT).map_err(Error::from)?;
    Ok(QuickSubmitted::Accepted(Box::new(QuickAcceptance {
        before: task.loaded(vec![before])?,
        after: AttemptColumns::AFTER.read(submitted)?,
        accepted_at: from_millis(accepted_at),
        resource: submitted.try_get(RESOURCE).map_err(Error::from)?,
        claimed,
    })))
}

/// A claim's answer in [`CLAIM_ONE`]'s columns.
pub(super) fn claimed(row: &Row) -> Result<QuickClaimed, Error> {
    let outcome: &str = row.try_get(OUTCOME).map_err(Error::from)?;
    match outcome {
        "leased" => {}
        "empty" => return Ok(QuickClaimed::Empty),
        "skipped" => return Ok(QuickClaimed::Skipped),
        _ => return Ok(QuickClaimed::Declined),
    }
    let task = TaskColumns::TASK.read(row)?;
    let before = AttemptColumns::BEFORE.read(row)?;
    let after = AttemptColumns::AFTER.read(row)?;
    let resource = row.try_get(RESOURCE).map_err(Error::from)?;
    Ok(QuickClaimed::Leased(Box::new(QuickGrant {
        before: task.loaded(vec![before])?,
        after,
        resource,
    })))
}

/// Every column [`claimed`] reads.
#[cfg(test)]
pub(super) fn claim_columns() -> Vec<&'static str> {
    let mut names = vec![OUTCOME, RESOURCE];
    names.extend(TaskColumns::TASK.names());
    names.extend(AttemptColumns::BEFORE.names());
    names.extend(AttemptColumns::AFTER.names());
    names
}

/// Every column [`submit_and_claim_in_one`](PostgresBackend::submit_and_claim_in_one)
/// and [`accepted`] read, with [`claimed`]'s.
#[cfg(test)]
pub(super) fn submission_columns() -> Vec<&'static str> {
    let mut names = claim_columns();
    names.extend([ACCEPTED_AT, ROLE]);
    names
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::{DateTime, TimeDelta, Utc};
    use tessera_lease::{Namespace, Principal, QueueName};

    use crate::backend::rows::EventRow;
    use crate::backend::{QuickClaim, QuickClaimed, QuickGrant, QuickSubmitted};
    use crate::postgres::PostgresOptions;
    use crate::{Brief, EnqueueOptions, Grant, KeySpec, ManualClock, Scope, Store, StoreConfig};

    pub(in crate::postgres) fn claim<'a>(
        ns: &'a Namespace,
        q: &'a QueueName,
        holder: &'a Principal,
        now: DateTime<Utc>,
    ) -> QuickClaim<'a> {
        QuickClaim {
            namespace: ns,
            queue: q,
            holder,
            now,
            expires_at: now + TimeDelta::seconds(30),
            event: EventRow {
                id: 0,
                at: 0,
                principal: holder.as_str().to_owned(),
                namespace: ns.as_str().to_owned(),
                action: "claim".to_owned(),
                outcome: "ok".to_owned(),
                resource: None,
                ip_hash: None,
            },
        }
    }

    /// A store on a schema of its own on the test server, its clock, and
    /// a worker keyed for the namespace `renders`.
    pub(in crate::postgres) struct Quick {
        pub(in crate::postgres) url: String,
        pub(in crate::postgres) schema: String,
        pub(in crate::postgres) clock: ManualClock,
        pub(in crate::postgres) store: Store,
        pub(in crate::postgres) worker: crate::Caller,
        pub(in crate::postgres) ns: Namespace,
    }

    impl Quick {
        pub(in crate::postgres) fn open(prefix: &str) -> Self {
            let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
                .expect("TESSERA_TEST_POSTGRES_URL names a PostgreSQL server");
            let schema = format!("{prefix}_{}", std::process::id());
            let clock = ManualClock::new("2026-10-29T12:00:00Z".parse().unwrap());
            let store = Store::open_postgres(
                PostgresOptions::new(url.as_str())
                    .with_schema(schema.as_str())
                    .with_listen(false),
                StoreConfig::default()
                    .with_clock(Arc::new(clock.clone()))
                    .with_lease_duration(Duration::from_secs(30)),
            )
            .unwrap();
            let ns = Namespace::parse("renders").unwrap();
            let admin = store
                .authenticate(Some(store.create_admin_key("ops").unwrap().secret.expose()))
                .unwrap();
            let key = store
                .create_key(
                    &admin,
                    &KeySpec::keyed("acme")
                        .with_scopes(Scope::ALL.iter().copied())
                        .with_grant(Grant::Namespace(ns.clone())),
                )
                .unwrap();
            let worker = store.authenticate(Some(key.secret.expose())).unwrap();
            Self {
                url,
                schema,
                clock,
                store,
                worker,
                ns,
            }
        }

        /// Closes the store and drops its schema.
        pub(in crate::postgres) fn finish(self) {
            let Self {
                url, schema, store, ..
            } = self;
            drop(store);
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client
                .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                .unwrap();
        }
    }

    /// The statement grants a plain ready task, answers an empty queue,
    /// and declines what the general claim decides: several attempts, a
    /// lapsed lease to record, a queue with settings.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn one_statement_grants_plain_tasks_and_declines_the_rest() {
        let quick = Quick::open("quick");
        let Quick {
            clock,
            store,
            worker,
            ns,
            ..
        } = &quick;
        let q = QueueName::parse("jobs").unwrap();
        let holder = worker.lease_principal();
        let brief = Brief::Bytes(b"frame".to_vec());
        let backend = store.backend();
        let now = store.now_utc();

        assert!(matches!(
            backend.claim_quick(&claim(ns, &q, &holder, now)).unwrap(),
            QuickClaimed::Empty
        ));
        store
            .enqueue(worker, ns, &q, &brief, &EnqueueOptions::default())
            .unwrap();
        let QuickClaimed::Leased(grant) =
            backend.claim_quick(&claim(ns, &q, &holder, now)).unwrap()
        else {
            panic!("a plain ready task is granted by the statement");
        };
        let QuickGrant {
            before,
            after,
            resource,
        } = *grant;
        assert_eq!(after.token, Some(1));
        assert_eq!(after.state, "leased");
        assert!(resource.unwrap().ends_with("/a1/t1"));
        assert_eq!(before.brief, Some(brief.clone()));

        // The lease lapses: recording it is the general claim's.
        clock.advance(Duration::from_secs(60));
        let later = store.now_utc();
        assert!(matches!(
            backend.claim_quick(&claim(ns, &q, &holder, later)).unwrap(),
            QuickClaimed::Declined
        ));
        assert!(matches!(
            store.claim(worker, ns, &q).unwrap(),
            crate::ClaimOutcome::Granted(_)
        ));

        // Two competing attempts: the general claim's too.
        let other = QueueName::parse("pairs").unwrap();
        store
            .enqueue(
                worker,
                ns,
                &other,
                &brief,
                &EnqueueOptions::default().with_alternatives(2),
            )
            .unwrap();
        assert!(matches!(
            backend
                .claim_quick(&claim(ns, &other, &holder, later))
                .unwrap(),
            QuickClaimed::Declined
        ));

        // A queue with settings (paused here): the general claim's, which
        // applies them.
        let set = QueueName::parse("settings").unwrap();
        store
            .enqueue(worker, ns, &set, &brief, &EnqueueOptions::default())
            .unwrap();
        store.pause_queue(worker, ns, &set).unwrap();
        assert!(matches!(
            backend
                .claim_quick(&claim(ns, &set, &holder, later))
                .unwrap(),
            QuickClaimed::Declined
        ));
        // Resumed, the queue has no settings row again: the statement's.
        store.resume_queue(worker, ns, &set).unwrap();
        assert!(matches!(
            backend
                .claim_quick(&claim(ns, &set, &holder, later))
                .unwrap(),
            QuickClaimed::Leased(_)
        ));

        // A due lapse above the ready task's priority comes first: the
        // general claim's. One of its own priority or below it does not:
        // the statement's (which searches only the priorities above).
        for (lapsed, ready, quick_grants) in [(2, 1, false), (1, 1, true), (0, 1, true)] {
            let ranked = QueueName::parse(&format!("ranked{lapsed}")).unwrap();
            let at = |priority| EnqueueOptions::default().with_priority(priority);
            store
                .enqueue(worker, ns, &ranked, &brief, &at(lapsed))
                .unwrap();
            let now = store.now_utc();
            assert!(matches!(
                backend
                    .claim_quick(&claim(ns, &ranked, &holder, now))
                    .unwrap(),
                QuickClaimed::Leased(_)
            ));
            clock.advance(Duration::from_secs(60));
            store
                .enqueue(worker, ns, &ranked, &brief, &at(ready))
                .unwrap();
            let later = store.now_utc();
            let answer = backend.claim_quick(&claim(ns, &ranked, &holder, later));
            match answer.unwrap() {
                QuickClaimed::Leased(grant) => {
                    assert!(quick_grants, "a lapse at {lapsed} comes before {ready}");
                    assert_eq!(grant.before.record.priority, ready);
                }
                QuickClaimed::Declined => assert!(!quick_grants, "declined below {ready}"),
                QuickClaimed::Empty | QuickClaimed::Skipped => {
                    panic!("a ready task and a due lapse are not empty")
                }
            }
        }
        quick.finish();
    }

    /// A queue whose only claimable task another transaction holds
    /// locked is not empty: the statement says it skipped one, and once
    /// the lock is gone it grants the task.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn a_task_another_statement_holds_is_skipped_not_empty() {
        let quick = Quick::open("quick_skipped");
        let Quick {
            url,
            schema,
            store,
            worker,
            ns,
            ..
        } = &quick;
        let q = QueueName::parse("jobs").unwrap();
        let holder = worker.lease_principal();
        let backend = store.backend();
        store
            .enqueue(
                worker,
                ns,
                &q,
                &Brief::Bytes(b"frame".to_vec()),
                &EnqueueOptions::default(),
            )
            .unwrap();
        let mut other = postgres::Client::connect(url, postgres::NoTls).unwrap();
        let mut holding = other.transaction().unwrap();
        let held = holding
            .query(
                &format!(
                    "SELECT id FROM \"{schema}\".tasks WHERE claimable_at IS NOT NULL \
                     FOR NO KEY UPDATE"
                ),
                &[],
            )
            .unwrap();
        assert_eq!(held.len(), 1);
        let now = store.now_utc();
        assert!(matches!(
            backend.claim_quick(&claim(ns, &q, &holder, now)).unwrap(),
            QuickClaimed::Skipped
        ));
        holding.rollback().unwrap();
        assert!(matches!(
            backend.claim_quick(&claim(ns, &q, &holder, now)).unwrap(),
            QuickClaimed::Leased(_)
        ));
        // Taken, the queue is empty again.
        assert!(matches!(
            backend.claim_quick(&claim(ns, &q, &holder, now)).unwrap(),
            QuickClaimed::Empty
        ));
        quick.finish();
    }

    /// The statement accepts a submission of the plain shape with the
    /// next claim, checked against the lease rules, and declines, writing
    /// nothing, a stale token, a replay, and a claim it leaves to the
    /// general transaction; an empty queue still takes the submission.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn one_statement_submits_and_claims_the_plain_shape_and_declines_the_rest() {
        use crate::ops::lease::complete::{Checked, checked_acceptance};
        use crate::{ClaimOutcome, IdempotencyKey, Output, SubmitRequest, Submitted};

        let quick = Quick::open("quick_submit");
        let Quick {
            url,
            schema,
            store,
            worker,
            ns,
            ..
        } = &quick;
        let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
        let mut rows = |table: &str| -> i64 {
            client
                .query_one(&format!("SELECT count(*) FROM \"{schema}\".{table}"), &[])
                .unwrap()
                .get(0)
        };
        let (q, empty) = (
            QueueName::parse("jobs").unwrap(),
            QueueName::parse("none").unwrap(),
        );
        let holder = worker.lease_principal();
        let backend = store.backend();
        for _ in 0..3 {
            store
                .enqueue(
                    worker,
                    ns,
                    &q,
                    &Brief::Bytes(b"frame".to_vec()),
                    &EnqueueOptions::default(),
                )
                .unwrap();
        }
        let ClaimOutcome::Granted(first) = store.claim(worker, ns, &q).unwrap() else {
            panic!("a ready task is granted");
        };
        let request = |token, key: &str| SubmitRequest {
            task: first.task.clone(),
            token,
            key: IdempotencyKey::parse(key).unwrap(),
            output: Output::bytes(b"done".to_vec()),
        };
        let ack = |request: &SubmitRequest| match store.submission(worker, request).unwrap() {
            Checked::Ack(ack) => ack,
            Checked::Answered(_) => panic!("a submission for the completer"),
        };
        let written = |rows: &mut dyn FnMut(&str) -> i64| {
            (
                rows("attempts WHERE idempotency_key IS NOT NULL"),
                rows("access_audit"),
            )
        };
        let now = store.now_utc();

        // A stale token: declined, nothing written.
        let before = written(&mut rows);
        let stale = ack(&request(tessera_lease::FencingToken::new(7).unwrap(), "k"));
        assert!(matches!(
            backend
                .submit_and_claim_quick(
                    &stale.quick_submit(now).unwrap(),
                    &claim(ns, &q, &holder, now)
                )
                .unwrap(),
            QuickSubmitted::Declined
        ));
        assert_eq!(written(&mut rows), before);

        // A claim the statement leaves to the general one (the queue is
        // paused): declined whole, the submission not made either.
        store.pause_queue(worker, ns, &q).unwrap();
        let paused = written(&mut rows);
        let good = ack(&request(first.lease.token(), "k"));
        assert!(matches!(
            backend
                .submit_and_claim_quick(
                    &good.quick_submit(now).unwrap(),
                    &claim(ns, &q, &holder, now)
                )
                .unwrap(),
            QuickSubmitted::Declined
        ));
        assert_eq!(written(&mut rows), paused);
        store.resume_queue(worker, ns, &q).unwrap();
        let before = written(&mut rows);

        // The plain shape: accepted, and the next task leased, each as the
        // lease rules make them.
        let QuickSubmitted::Accepted(acceptance) = backend
            .submit_and_claim_quick(
                &good.quick_submit(now).unwrap(),
                &claim(ns, &q, &holder, now),
            )
            .unwrap()
        else {
            panic!("a live lease's submission, with a ready task next, is the statement's");
        };
        let good_submit = good.quick_submit(now).unwrap();
        let Ok(Submitted::Accepted(receipt)) = checked_acceptance(&good_submit, &acceptance, now)
        else {
            panic!("the statement's acceptance is the lease rules'");
        };
        assert_eq!(receipt.token, first.lease.token());
        // Writes other than the rules' are an error.
        let mut other = (*acceptance).clone();
        other.accepted_at += TimeDelta::milliseconds(1);
        assert!(checked_acceptance(&good_submit, &other, now).is_err());
        let mut other = (*acceptance).clone();
        other.after.state = "ready".to_owned();
        assert!(checked_acceptance(&good_submit, &other, now).is_err());
        let QuickClaimed::Leased(grant) = &acceptance.claimed else {
            panic!("the next task is leased");
        };
        assert_ne!(grant.before.record.id, first.task.id);
        assert_eq!(written(&mut rows), (before.0 + 1, before.1 + 2));
        // The store answers the same submission as a replay.
        assert!(matches!(
            store
                .submit(
                    worker,
                    &first.task,
                    first.lease.token(),
                    &IdempotencyKey::parse("k").unwrap(),
                    &Output::bytes(b"done".to_vec())
                )
                .unwrap(),
            Submitted::Replayed(_)
        ));

        // A replay: declined (the attempt is done), nothing written.
        let before = written(&mut rows);
        assert!(matches!(
            backend
                .submit_and_claim_quick(
                    &good.quick_submit(now).unwrap(),
                    &claim(ns, &q, &holder, now)
                )
                .unwrap(),
            QuickSubmitted::Declined
        ));
        assert_eq!(written(&mut rows), before);

        // An empty queue: the submission alone.
        let ClaimOutcome::Granted(third) = store.claim(worker, ns, &q).unwrap() else {
            panic!("the third task is granted");
        };
        let before = written(&mut rows);
        let last = ack(&SubmitRequest {
            task: third.task.clone(),
            token: third.lease.token(),
            key: IdempotencyKey::parse("k").unwrap(),
            output: Output::bytes(b"done".to_vec()),
        });
        let QuickSubmitted::Accepted(acceptance) = backend
            .submit_and_claim_quick(
                &last.quick_submit(now).unwrap(),
                &claim(ns, &empty, &holder, now),
            )
            .unwrap()
        else {
            panic!("a submission with an empty queue next is the statement's");
        };
        assert!(matches!(acceptance.claimed, QuickClaimed::Empty));
        assert!(checked_acceptance(&last.quick_submit(now).unwrap(), &acceptance, now).is_ok());
        assert_eq!(written(&mut rows), (before.0 + 1, before.1 + 1));

        quick.finish();
    }
}
