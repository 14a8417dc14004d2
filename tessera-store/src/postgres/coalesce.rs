//! `submit_and_claim` from many threads of one process, coalesced into
//! one statement.
//!
//! One job per claim costs one statement a job (`claim.rs`), and most of
//! a statement's server time is its start-up and its commit, not its rows.
//! Workers of one process that submit and claim at the same moment hand
//! their pairs to a [`Completer`] (the one that coalesces
//! acknowledgements, with the same [`AckBatching`] rule): its leader runs
//! what waits in one statement, [`SUBMIT_AND_CLAIM_MANY`], and answers
//! each caller with its own submission and its own claim. A lone caller
//! runs [`SUBMIT_AND_CLAIM_ONE`](super::claim::SUBMIT_AND_CLAIM_ONE)
//! as before.
//!
//! One statement takes the pairs of one queue whose submitted tasks are
//! distinct: a batch's pairs are grouped by queue, and a pair that
//! submits a task another pair of its group submits runs alone. Every
//! caller's answer comes after the commit that holds its pair; a caller
//! the statement could not decide (or the whole statement, on a lost
//! race) is declined, as the single statement declines, and the store's
//! general transaction decides it.

use chrono::{DateTime, Utc};
use tessera_lease::{Namespace, Principal, QueueName, Submission};

use crate::backend::rows::{EventRow, millis};
use crate::backend::{QuickClaim, QuickSubmit, QuickSubmitted};
use crate::error::{Error, StorageError, StorageErrorKind};
use crate::model::task::TaskRef;
use crate::state::completer::Completer;

use super::PostgresBackend;
use super::claim::{GRANT_ROWS, Named, OUTCOME, ROLE, SUBMIT_ROWS, accepted, claimed};
use super::rows::version;

/// [`SUBMIT_AND_CLAIM_ONE`](super::claim::SUBMIT_AND_CLAIM_ONE) for several
/// callers at once.
pub(super) const SUBMIT_AND_CLAIM_MANY: &str = include_str!("sql/submit_and_claim_many.sql");

/// The answer's column beside [`SUBMIT_AND_CLAIM_ONE`](super::claim::SUBMIT_AND_CLAIM_ONE)'s:
/// the caller's ordinal, from 1.
pub(super) const CALLER: &str = "caller";

/// One caller's submission and claim, owned, for whichever caller leads.
#[derive(Debug, Clone)]
pub(super) struct Pair {
    task: TaskRef,
    submission: Submission,
    output: Option<Vec<u8>>,
    submit_event: EventRow,
    namespace: Namespace,
    queue: QueueName,
    holder: Principal,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    claim_event: EventRow,
}

impl Pair {
    fn of(submit: &QuickSubmit<'_>, claim: &QuickClaim<'_>) -> Self {
        Self {
            task: submit.task.clone(),
            submission: submit.submission.clone(),
            output: submit.output.map(<[u8]>::to_vec),
            submit_event: submit.event.clone(),
            namespace: claim.namespace.clone(),
            queue: claim.queue.clone(),
            holder: claim.holder.clone(),
            now: claim.now,
            expires_at: claim.expires_at,
            claim_event: claim.event.clone(),
        }
    }

    fn submit(&self) -> QuickSubmit<'_> {
        QuickSubmit {
            task: &self.task,
            submission: &self.submission,
            output: self.output.as_deref(),
            event: self.submit_event.clone(),
        }
    }

    fn claim(&self) -> QuickClaim<'_> {
        QuickClaim {
            namespace: &self.namespace,
            queue: &self.queue,
            holder: &self.holder,
            now: self.now,
            expires_at: self.expires_at,
            event: self.claim_event.clone(),
        }
    }
}

/// A caller's answer.
pub(super) type PairAnswer = Result<QuickSubmitted, Error>;

/// The completer of [`Pair`]s: one a lane.
pub(super) type Pairs = Completer<Pair, PairAnswer>;

/// How many statements of coalesced pairs one process runs at once: two,
/// so that one executes while the other waits for its commit to reach
/// the disk. One lane left the server's second core idle while its
/// statement committed, and four split 4 workers into statements of one;
/// the runs behind this are in `docs/performance-peers.md`.
pub(super) const LANES: usize = 2;

/// This thread's lane: threads are numbered as they first submit and
/// claim, so a steady set of workers is spread evenly across the lanes
/// and each keeps to its own.
fn thread_lane() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static LANE: Cell<Option<usize>> = const { Cell::new(None) };
    }
    LANE.with(|lane| {
        let number = lane
            .get()
            .unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
        lane.set(Some(number));
        number
    })
}

impl PostgresBackend {
    /// [`submit_and_claim_in_one`](Self::submit_and_claim_in_one), in one
    /// statement with the pairs other threads hand in at the same moment.
    pub(super) fn submit_and_claim_coalesced(
        &self,
        submit: &QuickSubmit<'_>,
        claim: &QuickClaim<'_>,
    ) -> PairAnswer {
        let pair = Pair::of(submit, claim);
        let lane = &self.pairs[thread_lane() % self.pairs.len()];
        let mut answers = lane.complete(vec![pair], &|batch| self.run_pairs(batch), &|| {
            Err(Error::Storage(StorageError::new(
                StorageErrorKind::Other,
                None,
                "the submission's statement was interrupted; its outcome is unknown",
            )))
        });
        answers.pop().expect("one answer a pair")
    }

    /// One batch: a statement a group of pairs (one queue, distinct
    /// submitted tasks), a lone pair's the single statement's.
    fn run_pairs(&self, batch: Vec<Pair>) -> Vec<PairAnswer> {
        let mut answers: Vec<Option<PairAnswer>> = vec![None; batch.len()];
        let mut left: Vec<usize> = (0..batch.len()).collect();
        while !left.is_empty() {
            let first = &batch[left[0]];
            let mut group: Vec<usize> = Vec::new();
            let mut rest = Vec::new();
            for index in left {
                let pair = &batch[index];
                let joins = pair.namespace == first.namespace
                    && pair.queue == first.queue
                    && group.iter().all(|other| batch[*other].task != pair.task);
                if joins {
                    group.push(index);
                } else {
                    rest.push(index);
                }
            }
            left = rest;
            if let [only] = group[..] {
                let pair = &batch[only];
                answers[only] = Some(self.submit_and_claim_in_one(&pair.submit(), &pair.claim()));
                continue;
            }
            let pairs: Vec<&Pair> = group.iter().map(|index| &batch[*index]).collect();
            for (index, answer) in group.iter().zip(self.submit_and_claim_many(&pairs)) {
                answers[*index] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.expect("every pair answered"))
            .collect()
    }

    /// [`SUBMIT_AND_CLAIM_MANY`] for `pairs` (one queue, distinct
    /// submitted tasks): one answer a pair, in order.
    fn submit_and_claim_many(&self, pairs: &[&Pair]) -> Vec<PairAnswer> {
        let declined = || pairs.iter().map(|_| Ok(QuickSubmitted::Declined)).collect();
        let search_now = pairs
            .iter()
            .map(|pair| pair.now)
            .max()
            .expect("a group has pairs");
        let args = ManyArgs::of(pairs, search_now);
        let rows = (SUBMIT_ROWS + GRANT_ROWS) * pairs.len() as u64;
        let rows = match self.one_statement(SUBMIT_AND_CLAIM_MANY, &args.params(), search_now, rows)
        {
            Ok(Some(rows)) => rows,
            Ok(None) => return declined(),
            // One caller's conflict (another process's receipt under its
            // key) rolled back every caller's part: each goes to the
            // general transaction, which answers it alone.
            Err(Error::Storage(error)) if error.kind() == StorageErrorKind::Conflict => {
                return declined();
            }
            Err(error) => return pairs.iter().map(|_| Err(error.clone())).collect(),
        };
        let answer = |caller: usize, role: &str| {
            rows.iter().find(|row| {
                row.try_get::<_, i64>(CALLER).ok() == Some(caller as i64 + 1)
                    && row.try_get::<_, &str>(ROLE).ok() == Some(role)
            })
        };
        let mut written = 0;
        let answers = (0..pairs.len())
            .map(|caller| {
                let Some(submitted) = answer(caller, "s") else {
                    return Ok(QuickSubmitted::Declined);
                };
                let outcome: &str = submitted.try_get(OUTCOME).map_err(Error::from)?;
                if outcome != "submitted" {
                    return Ok(QuickSubmitted::Declined);
                }
                let claimed_row = answer(caller, "c").ok_or_else(|| {
                    crate::backend::rows::corrupt("a coalesced submission's answer")
                })?;
                let claim = claimed(claimed_row)?;
                written += SUBMIT_ROWS + claim.rows();
                accepted(submitted, claim)
            })
            .collect();
        self.wrote_rows(search_now, written);
        answers
    }
}

/// [`SUBMIT_AND_CLAIM_MANY`]'s arguments: after the queue and the time
/// its searches use, one array an argument, one element a pair.
#[derive(Debug, Default)]
pub(super) struct ManyArgs<'a> {
    pub(super) namespace: &'a str,
    pub(super) queue: &'a str,
    pub(super) search_now: i64,
    pub(super) now: Vec<i64>,
    pub(super) holder: Vec<&'a str>,
    pub(super) expires_at: Vec<i64>,
    pub(super) claim_principal: Vec<&'a str>,
    pub(super) claim_namespace: Vec<&'a str>,
    pub(super) claim_action: Vec<&'a str>,
    pub(super) claim_outcome: Vec<&'a str>,
    pub(super) claim_ip_hash: Vec<Option<&'a str>>,
    pub(super) task_namespace: Vec<&'a str>,
    pub(super) task_id: Vec<&'a str>,
    pub(super) task_version: Vec<i64>,
    pub(super) token: Vec<i64>,
    pub(super) submitter: Vec<&'a str>,
    pub(super) idempotency_key: Vec<&'a str>,
    pub(super) digest: Vec<String>,
    pub(super) output: Vec<Option<&'a [u8]>>,
    pub(super) submit_principal: Vec<&'a str>,
    pub(super) submit_namespace: Vec<&'a str>,
    pub(super) submit_action: Vec<&'a str>,
    pub(super) submit_outcome: Vec<&'a str>,
    pub(super) submit_resource: Vec<Option<&'a str>>,
    pub(super) submit_ip_hash: Vec<Option<&'a str>>,
}

impl<'a> ManyArgs<'a> {
    fn of(pairs: &[&'a Pair], search_now: DateTime<Utc>) -> Self {
        let each = |f: &dyn Fn(&'a Pair) -> &'a str| pairs.iter().map(|pair| f(pair)).collect();
        let each_opt = |f: &dyn Fn(&'a Pair) -> Option<&'a str>| {
            pairs.iter().map(|pair| f(pair)).collect::<Vec<_>>()
        };
        Self {
            namespace: pairs[0].namespace.as_str(),
            queue: pairs[0].queue.as_str(),
            search_now: millis(search_now),
            now: pairs.iter().map(|pair| millis(pair.now)).collect(),
            holder: each(&|pair| pair.holder.as_str()),
            expires_at: pairs.iter().map(|pair| millis(pair.expires_at)).collect(),
            claim_principal: each(&|pair| pair.claim_event.principal.as_str()),
            claim_namespace: each(&|pair| pair.claim_event.namespace.as_str()),
            claim_action: each(&|pair| pair.claim_event.action.as_str()),
            claim_outcome: each(&|pair| pair.claim_event.outcome.as_str()),
            claim_ip_hash: each_opt(&|pair| pair.claim_event.ip_hash.as_deref()),
            task_namespace: each(&|pair| pair.task.namespace.as_str()),
            task_id: each(&|pair| pair.task.id.as_str()),
            task_version: pairs.iter().map(|pair| version(&pair.task)).collect(),
            token: pairs
                .iter()
                .map(|pair| pair.submission.token.as_i64())
                .collect(),
            submitter: each(&|pair| pair.submission.principal.as_str()),
            idempotency_key: each(&|pair| pair.submission.key.as_str()),
            digest: pairs
                .iter()
                .map(|pair| pair.submission.digest.to_string())
                .collect(),
            output: pairs.iter().map(|pair| pair.output.as_deref()).collect(),
            submit_principal: each(&|pair| pair.submit_event.principal.as_str()),
            submit_namespace: each(&|pair| pair.submit_event.namespace.as_str()),
            submit_action: each(&|pair| pair.submit_event.action.as_str()),
            submit_outcome: each(&|pair| pair.submit_event.outcome.as_str()),
            submit_resource: each_opt(&|pair| pair.submit_event.resource.as_deref()),
            submit_ip_hash: each_opt(&|pair| pair.submit_event.ip_hash.as_deref()),
        }
    }

    /// `$1` to `$25` of [`SUBMIT_AND_CLAIM_MANY`].
    pub(super) fn params(&self) -> [Named<'_>; 25] {
        [
            ("namespace", &self.namespace),
            ("queue", &self.queue),
            ("search_now", &self.search_now),
            ("now", &self.now),
            ("holder", &self.holder),
            ("expires_at", &self.expires_at),
            ("claim_principal", &self.claim_principal),
            ("claim_namespace", &self.claim_namespace),
            ("claim_action", &self.claim_action),
            ("claim_outcome", &self.claim_outcome),
            ("claim_ip_hash", &self.claim_ip_hash),
            ("task_namespace", &self.task_namespace),
            ("task_id", &self.task_id),
            ("task_version", &self.task_version),
            ("token", &self.token),
            ("submitter", &self.submitter),
            ("idempotency_key", &self.idempotency_key),
            ("digest", &self.digest),
            ("output", &self.output),
            ("submit_principal", &self.submit_principal),
            ("submit_namespace", &self.submit_namespace),
            ("submit_action", &self.submit_action),
            ("submit_outcome", &self.submit_outcome),
            ("submit_resource", &self.submit_resource),
            ("submit_ip_hash", &self.submit_ip_hash),
        ]
    }
}

/// Every column [`submit_and_claim_many`](PostgresBackend::submit_and_claim_many)
/// reads, with the single statement's.
#[cfg(test)]
pub(super) fn many_columns() -> Vec<&'static str> {
    let mut names = super::claim::submission_columns();
    names.push(CALLER);
    names
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use tessera_lease::{FencingToken, QueueName};

    use super::Pair;
    use crate::backend::{OpenPolicy, QuickClaimed, QuickSubmitted};
    use crate::ops::lease::complete::{Checked, checked_acceptance};
    use crate::postgres::claim::tests::{Quick, claim};
    use crate::postgres::{PostgresBackend, PostgresOptions};
    use crate::{
        Brief, ClaimOutcome, EnqueueOptions, IdempotencyKey, Output, StoreConfig, SubmitRequest,
        Submitted,
    };

    /// A store on a schema of its own, a second backend on that schema
    /// whose batches a test runs by hand, and a client that counts rows.
    struct Scene {
        quick: Quick,
        backend: PostgresBackend,
        client: RefCell<postgres::Client>,
    }

    impl Scene {
        fn open(prefix: &str) -> Self {
            let quick = Quick::open(prefix);
            let backend = PostgresBackend::open(
                PostgresOptions::new(quick.url.as_str())
                    .with_schema(quick.schema.as_str())
                    .with_listen(false),
                OpenPolicy::of(&StoreConfig::default()),
            )
            .unwrap();
            let client = postgres::Client::connect(&quick.url, postgres::NoTls).unwrap();
            Self {
                quick,
                backend,
                client: RefCell::new(client),
            }
        }

        /// The rows of `table`.
        fn count(&self, table: &str) -> i64 {
            let sql = format!("SELECT count(*) FROM \"{}\".{table}", self.quick.schema);
            self.client
                .borrow_mut()
                .query_one(&sql, &[])
                .unwrap()
                .get(0)
        }

        /// Closes both and drops the schema.
        fn finish(self) {
            let Self {
                quick,
                backend,
                client,
            } = self;
            drop((backend, client));
            quick.finish();
        }
    }

    /// Pairs run together: each caller's submission is accepted or
    /// declined on its own, each accepted one gets its own task, in claim
    /// order, and a second pair for a task already in the group, or a
    /// pair of another queue, runs in a statement of its own.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn pairs_of_one_queue_each_get_their_own_answer_in_one_statement() {
        let scene = Scene::open("coalesced");
        let (store, worker, ns) = (&scene.quick.store, &scene.quick.worker, &scene.quick.ns);
        let count = |table: &str| scene.count(table);
        let (q, empty) = (
            QueueName::parse("jobs").unwrap(),
            QueueName::parse("none").unwrap(),
        );
        let enqueued: Vec<_> = (0..8u8)
            .map(|n| {
                store
                    .enqueue(
                        worker,
                        ns,
                        &q,
                        &Brief::Bytes(vec![n]),
                        &EnqueueOptions::default(),
                    )
                    .unwrap()
            })
            .collect();
        let leased: Vec<_> = (0..5)
            .map(|_| match store.claim(worker, ns, &q).unwrap() {
                ClaimOutcome::Granted(claimed) => claimed,
                other => panic!("a ready task is granted, not {other:?}"),
            })
            .collect();
        let acks: Vec<_> = leased
            .iter()
            .enumerate()
            .map(|(n, claimed)| {
                // The fourth is stale: declined alone.
                let token = if n == 3 {
                    FencingToken::new(9).unwrap()
                } else {
                    claimed.lease.token()
                };
                let request = SubmitRequest {
                    task: claimed.task.clone(),
                    token,
                    key: IdempotencyKey::parse("k").unwrap(),
                    output: Output::bytes(vec![n as u8]),
                };
                match store.submission(worker, &request).unwrap() {
                    Checked::Ack(ack) => ack,
                    Checked::Answered(_) => panic!("a submission for the statement"),
                }
            })
            .collect();
        // The same task again, under another key: alone, after the first.
        let again = match store
            .submission(
                worker,
                &SubmitRequest {
                    task: leased[0].task.clone(),
                    token: leased[0].lease.token(),
                    key: IdempotencyKey::parse("again").unwrap(),
                    output: Output::bytes(b"again".to_vec()),
                },
            )
            .unwrap()
        {
            Checked::Ack(ack) => ack,
            Checked::Answered(_) => panic!("a submission for the statement"),
        };
        let holder = worker.lease_principal();
        let now = store.now_utc();
        let mut batch: Vec<Pair> = acks[..4]
            .iter()
            .chain([&again])
            .map(|ack| {
                Pair::of(
                    &ack.quick_submit(now).unwrap(),
                    &claim(ns, &q, &holder, now),
                )
            })
            .collect();
        // The fifth task's submission claims from another, empty queue.
        batch.push(Pair::of(
            &acks[4].quick_submit(now).unwrap(),
            &claim(ns, &empty, &holder, now),
        ));

        let (receipts, audits) = (
            count("attempts WHERE idempotency_key IS NOT NULL"),
            count("access_audit"),
        );
        let answers = scene.backend.run_pairs(batch.clone());
        assert_eq!(answers.len(), 6);

        let mut granted = Vec::new();
        for (n, answer) in answers.iter().enumerate() {
            let answer = answer.as_ref().unwrap();
            match (n, answer) {
                // The stale token, and the second pair for the first task
                // (its attempt done by then): declined, nothing written.
                (3 | 4, QuickSubmitted::Declined) => {}
                (0..=2 | 5, QuickSubmitted::Accepted(acceptance)) => {
                    let submit = batch[n].submit();
                    assert!(
                        matches!(
                            checked_acceptance(&submit, acceptance, now),
                            Ok(Submitted::Accepted(_))
                        ),
                        "pair {n}'s acceptance is the lease rules'"
                    );
                    assert_eq!(acceptance.before.record.id, batch[n].task.id);
                    match (&acceptance.claimed, n) {
                        (QuickClaimed::Empty, 5) => {}
                        (QuickClaimed::Leased(grant), 0..=2) => {
                            assert_eq!(grant.after.holder.as_deref(), Some(holder.as_str()));
                            assert_eq!(grant.after.state, "leased");
                            granted.push(grant.before.record.id.clone());
                        }
                        (other, n) => panic!("pair {n} claimed {other:?}"),
                    }
                }
                (n, other) => panic!("pair {n} answered {other:?}"),
            }
        }
        // Three tasks granted, each once, in claim (enqueue) order, to the
        // callers in theirs: the sixth, seventh and eighth enqueued.
        let expected: Vec<_> = enqueued[5..].iter().map(|task| task.id.clone()).collect();
        assert_eq!(granted, expected);
        // Four receipts, and an audit row per submission and per grant.
        assert_eq!(
            count("attempts WHERE idempotency_key IS NOT NULL"),
            receipts + 4
        );
        assert_eq!(count("access_audit"), audits + 4 + 3);
        scene.finish();
    }

    /// A task the statement leaves to the general claim stops the grants
    /// ranked after it, and keeps a caller with no task of its own from
    /// being answered with an empty queue: every caller of the batch is
    /// declined, and nothing is written.
    #[test]
    #[cfg_attr(
        tessera_no_test_postgres,
        ignore = "needs a PostgreSQL server: set TESSERA_TEST_POSTGRES_URL"
    )]
    fn a_task_left_to_the_general_claim_stops_the_grants_behind_it() {
        let scene = Scene::open("coalesced_cut");
        let (store, worker, ns) = (&scene.quick.store, &scene.quick.worker, &scene.quick.ns);
        let count = |table: &str| scene.count(table);
        let queue = |name: &str| QueueName::parse(name).unwrap();
        let (held, mixed, lone) = (queue("held"), queue("mixed"), queue("lone"));
        let brief = Brief::Bytes(b"frame".to_vec());
        let two = EnqueueOptions::default().with_alternatives(2);
        let plain = EnqueueOptions::default();
        // The head of `mixed` has two attempts (the general claim's), a
        // plain task behind it; `lone` holds only such a task.
        for (q, options) in [(&mixed, &two), (&mixed, &plain), (&lone, &two)] {
            store.enqueue(worker, ns, q, &brief, options).unwrap();
        }
        for _ in 0..4 {
            store.enqueue(worker, ns, &held, &brief, &plain).unwrap();
        }
        let holder = worker.lease_principal();
        let now = store.now_utc();
        let acks: Vec<_> = (0..4u8)
            .map(|n| {
                let ClaimOutcome::Granted(claimed) = store.claim(worker, ns, &held).unwrap() else {
                    panic!("a ready task is granted");
                };
                let request = SubmitRequest {
                    task: claimed.task.clone(),
                    token: claimed.lease.token(),
                    key: IdempotencyKey::parse("k").unwrap(),
                    output: Output::bytes(vec![n]),
                };
                let Checked::Ack(ack) = store.submission(worker, &request).unwrap() else {
                    panic!("a submission for the statement");
                };
                ack
            })
            .collect();
        let mut pairs = acks.iter();
        let before = (
            count("attempts WHERE idempotency_key IS NOT NULL"),
            count("access_audit"),
        );
        for q in [&mixed, &lone] {
            let batch: Vec<Pair> = pairs
                .by_ref()
                .take(2)
                .map(|ack| Pair::of(&ack.quick_submit(now).unwrap(), &claim(ns, q, &holder, now)))
                .collect();
            let answers = scene.backend.run_pairs(batch);
            assert!(
                answers
                    .iter()
                    .all(|answer| matches!(answer, Ok(QuickSubmitted::Declined))),
                "{q}: every caller declined, not {answers:?}"
            );
        }
        assert_eq!(
            (
                count("attempts WHERE idempotency_key IS NOT NULL"),
                count("access_audit")
            ),
            before
        );
        scene.finish();
    }
}
