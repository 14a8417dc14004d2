//! A claim in one statement: one round trip and one transaction, its own
//! (see [`QuickClaim`]).

use std::sync::atomic::Ordering;

use crate::backend::rows::millis;
use crate::backend::{QuickClaim, QuickClaimed, QuickGrant};
use crate::error::Error;

use super::PostgresBackend;
use super::error::is_transient;
use super::rows::{attempt_row_at, task_row_at};
use super::statements::CLAIM_ONE;

/// The table rows a grant changes: the attempt, the task, the audit row.
const GRANT_ROWS: u64 = 3;

/// Where the statement's answer puts the task's columns, the attempt's
/// as they were and as written, and the audit row's resource.
const TASK_AT: usize = 1;
const BEFORE_AT: usize = 13;
const AFTER_AT: usize = 24;
const RESOURCE_AT: usize = 35;

impl PostgresBackend {
    pub(super) fn claim_in_one(&self, claim: &QuickClaim<'_>) -> Result<QuickClaimed, Error> {
        // Refused writes, and a day whose allowance could not take the
        // grant, are the general claim's to answer.
        if self.refusing.load(Ordering::SeqCst)
            || !self.allowance.lock().admits(claim.now, GRANT_ROWS)
        {
            return Ok(QuickClaimed::Declined);
        }
        let mut connection = self.connection()?;
        if connection.client.is_closed() {
            connection = self.connection()?;
        }
        let connection = &mut *connection;
        let statement = match connection.prepared.get(CLAIM_ONE) {
            Some(statement) => statement.clone(),
            None => {
                let statement = connection.client.prepare(CLAIM_ONE)?;
                connection.prepared.insert(CLAIM_ONE, statement.clone());
                statement
            }
        };
        let event = &claim.event;
        // Outside a transaction block the statement is its own
        // transaction: it commits with its answer, in one round trip.
        let row = connection.client.query_one(
            &statement,
            &[
                &claim.namespace.as_str(),
                &claim.queue.as_str(),
                &millis(claim.now),
                &claim.holder.as_str(),
                &millis(claim.expires_at),
                &event.principal,
                &event.namespace,
                &event.action,
                &event.outcome,
                &event.ip_hash,
            ],
        );
        let row = match row.map_err(Error::from) {
            Ok(row) => row,
            // A lost race rolled the statement back: the general claim
            // runs, and retries.
            Err(error) if is_transient(&error) => return Ok(QuickClaimed::Declined),
            Err(error) => return Err(self.classify(error, false)),
        };
        let outcome: &str = row.try_get(0).map_err(Error::from)?;
        match outcome {
            "leased" => {}
            "empty" => return Ok(QuickClaimed::Empty),
            _ => return Ok(QuickClaimed::Declined),
        }
        self.allowance.lock().record(claim.now, GRANT_ROWS);
        self.rows_written.fetch_add(GRANT_ROWS, Ordering::Relaxed);
        self.write_transactions.fetch_add(1, Ordering::Relaxed);
        let task = task_row_at(&row, TASK_AT)?;
        let before = attempt_row_at(&row, BEFORE_AT)?;
        let after = attempt_row_at(&row, AFTER_AT)?;
        let resource = row.try_get(RESOURCE_AT).map_err(Error::from)?;
        Ok(QuickClaimed::Leased(Box::new(QuickGrant {
            before: task.loaded(vec![before])?,
            after,
            resource,
        })))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::{DateTime, TimeDelta, Utc};
    use tessera_lease::{Namespace, Principal, QueueName};

    use crate::backend::rows::EventRow;
    use crate::backend::{QuickClaim, QuickClaimed, QuickGrant};
    use crate::postgres::PostgresOptions;
    use crate::{Brief, EnqueueOptions, Grant, KeySpec, ManualClock, Scope, Store, StoreConfig};

    fn claim<'a>(
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

    /// The statement grants a plain ready task, answers an empty queue,
    /// and declines what the general claim decides: several attempts, a
    /// lapsed lease to record, a queue with settings.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn one_statement_grants_plain_tasks_and_declines_the_rest() {
        let url = std::env::var("TESSERA_TEST_POSTGRES_URL")
            .expect("TESSERA_TEST_POSTGRES_URL names a PostgreSQL server");
        let schema = format!("quick_{}", std::process::id());
        let start = "2026-10-29T12:00:00Z".parse().unwrap();
        let clock = ManualClock::new(start);
        let store = Store::open_postgres(
            PostgresOptions::new(url.as_str())
                .with_schema(schema.as_str())
                .with_listen(false),
            StoreConfig::default()
                .with_clock(Arc::new(clock.clone()))
                .with_lease_duration(Duration::from_secs(30)),
        )
        .unwrap();
        let (ns, q) = (
            Namespace::parse("renders").unwrap(),
            QueueName::parse("jobs").unwrap(),
        );
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
        let holder = worker.lease_principal();
        let brief = Brief::Bytes(b"frame".to_vec());
        let backend = store.backend();
        let now = store.now_utc();

        assert!(matches!(
            backend.claim_quick(&claim(&ns, &q, &holder, now)).unwrap(),
            QuickClaimed::Empty
        ));
        store
            .enqueue(&worker, &ns, &q, &brief, &EnqueueOptions::default())
            .unwrap();
        let QuickClaimed::Leased(grant) =
            backend.claim_quick(&claim(&ns, &q, &holder, now)).unwrap()
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
            backend
                .claim_quick(&claim(&ns, &q, &holder, later))
                .unwrap(),
            QuickClaimed::Declined
        ));
        assert!(matches!(
            store.claim(&worker, &ns, &q).unwrap(),
            crate::ClaimOutcome::Granted(_)
        ));

        // Two competing attempts: the general claim's too.
        let other = QueueName::parse("pairs").unwrap();
        store
            .enqueue(
                &worker,
                &ns,
                &other,
                &brief,
                &EnqueueOptions::default().with_alternatives(2),
            )
            .unwrap();
        assert!(matches!(
            backend
                .claim_quick(&claim(&ns, &other, &holder, later))
                .unwrap(),
            QuickClaimed::Declined
        ));

        // A queue with settings (paused here): the general claim's, which
        // applies them.
        let set = QueueName::parse("settings").unwrap();
        store
            .enqueue(&worker, &ns, &set, &brief, &EnqueueOptions::default())
            .unwrap();
        store.pause_queue(&worker, &ns, &set).unwrap();
        assert!(matches!(
            backend
                .claim_quick(&claim(&ns, &set, &holder, later))
                .unwrap(),
            QuickClaimed::Declined
        ));
        // Resumed, the queue has no settings row again: the statement's.
        store.resume_queue(&worker, &ns, &set).unwrap();
        assert!(matches!(
            backend
                .claim_quick(&claim(&ns, &set, &holder, later))
                .unwrap(),
            QuickClaimed::Leased(_)
        ));
        drop(store);
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .unwrap();
    }
}
