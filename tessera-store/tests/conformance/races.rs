//! Read-modify-writes raced from two stores on one database, as two
//! processes of a service would: each pair of calls is released at once,
//! many rounds over, and whatever order the database gave them, the result
//! is one the two calls could have had one after the other. On SQLite the
//! writes take turns anyway; on PostgreSQL each change locks its row by
//! name, whether the row exists yet or not.

use std::net::IpAddr;
use std::sync::Barrier;

use tessera_store::lease::StateName;
use tessera_store::{
    AuditQuery, Brief, BulkFilter, Caller, ClaimOutcome, Clock, ConcurrencyLimit, EnqueueOptions,
    Grant, IdempotencyKey, ManualClock, MintConfig, Output, Secret, Store, SubmitRequest,
    Submitted, TaskRef, UniqueKey, UniqueMode, UniqueStates, Uniqueness,
};

use crate::harness::{Fixture, TestDb, json_brief, namespace, queue};

/// Rounds of each race: enough that every one of them failed, on
/// PostgreSQL, before its change locked what it reads.
const ROUNDS: usize = 50;

/// Two stores on one database: the fixture's and a second one, on the
/// fixture's clock, with the same caller logged in on each.
struct Pair<'f, 'db> {
    f: &'f Fixture<'db>,
    other: Store,
    callers: (Caller, Caller),
}

impl<'f, 'db> Pair<'f, 'db> {
    fn new(f: &'f Fixture<'db>) -> Self {
        Self::with(f, f.config())
    }

    fn with(f: &'f Fixture<'db>, config: tessera_store::StoreConfig) -> Self {
        let other = f.db.open_shared(config);
        let key = f.full_worker(Grant::AllNamespaces);
        let callers = (
            f.login(&key),
            other.authenticate(Some(key.secret.expose())).unwrap(),
        );
        Self { f, other, callers }
    }

    /// Runs `a` on the fixture's store and `b` on the other at once.
    fn race<A: Send, B: Send>(
        &self,
        a: impl FnOnce(&Store, &Caller) -> A + Send,
        b: impl FnOnce(&Store, &Caller) -> B + Send,
    ) -> (A, B) {
        let start = Barrier::new(2);
        std::thread::scope(|scope| {
            let first = scope.spawn(|| {
                start.wait();
                a(&self.f.store, &self.callers.0)
            });
            let second = scope.spawn(|| {
                start.wait();
                b(&self.other, &self.callers.1)
            });
            (first.join().unwrap(), second.join().unwrap())
        })
    }
}

fn limit_of(n: u32) -> ConcurrencyLimit {
    ConcurrencyLimit {
        queue: std::num::NonZeroU32::new(n),
        per_partition: None,
    }
}

/// A pause and a limit change of a queue with no settings row yet, at
/// once: both land, whichever comes first; and a resume with a limit
/// change of a paused queue, likewise.
fn a_pause_and_a_limit_change_at_once_both_land(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let ns = namespace("renders");
    for round in 0..ROUNDS {
        let q = queue(&format!("q{round}"));
        pair.race(
            |store, caller| store.pause_queue(caller, &ns, &q).unwrap(),
            |store, caller| {
                store
                    .set_queue_limits(caller, &ns, &q, limit_of(1))
                    .unwrap()
            },
        );
        let settings = f.store.queue_settings(&pair.callers.0, &ns, &q).unwrap();
        assert!(settings.is_paused(), "round {round}: the pause was lost");
        assert_eq!(
            settings.limit,
            limit_of(1),
            "round {round}: the limit was lost"
        );

        pair.race(
            |store, caller| store.resume_queue(caller, &ns, &q).unwrap(),
            |store, caller| {
                store
                    .set_queue_limits(caller, &ns, &q, limit_of(2))
                    .unwrap()
            },
        );
        let settings = f.store.queue_settings(&pair.callers.0, &ns, &q).unwrap();
        assert!(!settings.is_paused(), "round {round}: the resume was lost");
        assert_eq!(
            settings.limit,
            limit_of(2),
            "round {round}: the limit was lost"
        );
    }
}

/// Two revokes of one key at once: one changes it and is audited, the
/// other finds it revoked; both answer the same revocation time.
fn two_revokes_at_once_revoke_and_audit_once(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    for _ in 0..ROUNDS {
        let key = f.worker(Grant::AllNamespaces);
        let id = key.info.key_id.clone();
        let (a, b) = pair.race(
            |store, _| store.revoke_key(&f.admin, &id).unwrap(),
            |store, _| {
                let admin = store
                    .authenticate(Some(f.admin_key.secret.expose()))
                    .unwrap();
                store.revoke_key(&admin, &id).unwrap()
            },
        );
        assert_eq!(a.revoked_at, b.revoked_at);
    }
    let events = f
        .store
        .audit(
            &f.admin,
            &AuditQuery {
                limit: 1000,
                ..AuditQuery::default()
            },
        )
        .unwrap();
    let revokes = events
        .events
        .iter()
        .filter(|event| event.action.as_str() == "revoke_key")
        .count();
    assert_eq!(revokes, ROUNDS);
}

/// Mints from one address on two stores at once never pass the address's
/// hourly limit between them, address after address.
fn mints_from_one_address_on_two_stores_keep_its_limit(db: &TestDb) {
    let secret = Secret::new(*b"tessera-test-address-secret-0001").unwrap();
    let mint = MintConfig {
        per_hour: 100_000,
        per_address_per_hour: 2,
        ..MintConfig::default()
    };
    let f = Fixture::with(db, |config| {
        config
            .with_address_secret(secret.clone())
            .with_mint(mint.clone())
    });
    let pair = Pair::with(
        &f,
        f.config()
            .with_address_secret(secret.clone())
            .with_mint(mint),
    );
    for round in 0..ROUNDS {
        let address: IpAddr = format!("192.0.2.{round}").parse().unwrap();
        let mint_all = |store: &Store| {
            (0..2)
                .filter(|_| store.mint_session(address).is_ok())
                .count()
        };
        let (a, b) = pair.race(|store, _| mint_all(store), |store, _| mint_all(store));
        assert_eq!(a + b, 2, "round {round}: {a} + {b} mints");
    }
}

/// A bulk cancel of ready tasks and a claim at once: a task the claim
/// leased is never cancelled by a filter it no longer matches.
fn a_bulk_cancel_of_ready_tasks_spares_a_lease_granted_meanwhile(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let ns = namespace("renders");
    for round in 0..ROUNDS {
        let q = queue(&format!("q{round}"));
        f.enqueue(&pair.callers.0, &ns, &q, 1);
        let ready = BulkFilter::default()
            .with_queue(q.clone())
            .with_state(StateName::Ready);
        let (claimed, cancelled) = pair.race(
            |store, caller| store.claim(caller, &ns, &q).unwrap(),
            |store, caller| store.cancel_tasks(caller, &ns, &ready).unwrap(),
        );
        if let ClaimOutcome::Granted(claimed) = claimed {
            assert_eq!(cancelled, 0, "round {round}: a live lease was cancelled");
            store_heartbeat(&f, &pair.callers.0, &claimed.task, claimed.lease.token());
        } else {
            assert_eq!(cancelled, 1, "round {round}");
        }
    }
}

fn store_heartbeat(
    f: &Fixture<'_>,
    caller: &Caller,
    task: &TaskRef,
    token: tessera_store::FencingToken,
) {
    f.store.heartbeat(caller, task, token).unwrap();
}

/// A replacing duplicate and a claim of the holder at once, where a lease
/// does not hold the key: the duplicate either replaced the waiting
/// holder's brief, or took the key the claim freed; never an answer that
/// names the holder and changed nothing.
fn a_replacing_duplicate_and_a_claim_at_once_lose_no_brief(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let ns = namespace("renders");
    for round in 0..ROUNDS {
        let q = queue(&format!("q{round}"));
        let mut unique = Uniqueness::new(UniqueKey::parse("k").unwrap());
        unique.mode = UniqueMode::Replace;
        unique.states = UniqueStates::WAITING;
        let options = EnqueueOptions::default().with_unique(unique);
        let holder = f
            .store
            .enqueue_one(&pair.callers.0, &ns, &q, &json_brief(0), &options)
            .unwrap()
            .task;
        let (claimed, duplicate) = pair.race(
            |store, caller| store.claim(caller, &ns, &q).unwrap(),
            |store, caller| {
                store
                    .enqueue_one(caller, &ns, &q, &json_brief(1), &options)
                    .unwrap()
            },
        );
        if duplicate.created {
            assert_ne!(duplicate.task, holder);
        } else {
            assert_eq!(duplicate.task, holder);
            let brief = f.store.read_task(&pair.callers.0, &holder).unwrap().brief;
            assert_eq!(
                brief,
                json_brief(1),
                "round {round}: the duplicate's brief was lost"
            );
        }
        // A claim may also find the holder locked by the duplicate and
        // pass it over (empty): nothing to check of it then.
        let _ = claimed;
    }
}

/// Enqueues into a session's namespace at the end of its lifetime, while
/// another store's retention purges it: every task the enqueues made is
/// purged in the end, none left behind without its namespace.
fn enqueues_into_a_session_while_it_is_purged_leave_no_task_behind(db: &TestDb) {
    let secret = Secret::new(*b"tessera-test-address-secret-0001").unwrap();
    let lifetime = std::time::Duration::from_secs(3600);
    let f = Fixture::with(db, |config| {
        config
            .with_address_secret(secret.clone())
            .with_session_lifetime(lifetime)
    });
    // The purging store runs on a clock of its own, past the sessions' end.
    let purging = ManualClock::new(f.clock.now_utc());
    let pair = Pair::with(
        &f,
        tessera_store::StoreConfig::default()
            .with_clock(std::sync::Arc::new(purging.clone()))
            .with_address_secret(secret)
            .with_session_lifetime(lifetime),
    );
    let jobs = queue("jobs");
    for round in 0..ROUNDS / 5 {
        let address: IpAddr = format!("198.51.100.{round}").parse().unwrap();
        let session = f.store.mint_session(address).unwrap();
        let caller = f
            .store
            .authenticate(Some(session.key.secret.expose()))
            .unwrap();
        f.enqueue(&caller, &session.namespace, &jobs, 1);
        // One millisecond before its end for the enqueuer; past it, and
        // due for a retention run, for the other.
        f.clock
            .set_utc(session.expires_at - chrono::TimeDelta::milliseconds(1));
        purging.set_utc(session.expires_at + chrono::TimeDelta::minutes(10));
        pair.race(
            |store, _| {
                for n in 0..20 {
                    store
                        .enqueue(
                            &caller,
                            &session.namespace,
                            &jobs,
                            &json_brief(n),
                            &EnqueueOptions::default(),
                        )
                        .unwrap();
                }
            },
            |store, _| store.maintain().unwrap(),
        );
        f.clock
            .set_utc(session.expires_at + chrono::TimeDelta::minutes(1));
    }
    purging.advance(std::time::Duration::from_secs(3600));
    assert!(pair.other.maintain().unwrap().retention_ran);
    assert_eq!(
        db.count_rows("tasks"),
        0,
        "tasks left without their namespace"
    );
    assert_eq!(db.count_rows("namespaces"), 0);
}

/// Two batches of the same new unique keys, one in the other's reverse
/// order, at once: both are answered (no deadlock ends one), and each key
/// has one task.
fn batches_of_one_keys_in_other_orders_never_deadlock(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let ns = namespace("renders");
    for round in 0..ROUNDS / 5 {
        let q = queue(&format!("q{round}"));
        let batch = |reverse: bool| -> Vec<(Brief, EnqueueOptions)> {
            let mut keys: Vec<usize> = (0..30).collect();
            if reverse {
                keys.reverse();
            }
            keys.into_iter()
                .map(|n| {
                    let unique = Uniqueness::new(UniqueKey::parse(&format!("k{n}")).unwrap());
                    (json_brief(n), EnqueueOptions::default().with_unique(unique))
                })
                .collect()
        };
        let (forward, backward) = (batch(false), batch(true));
        let (a, b) = pair.race(
            |store, caller| store.enqueue_batch(caller, &ns, &q, &forward),
            |store, caller| store.enqueue_batch(caller, &ns, &q, &backward),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            a.iter().chain(&b).filter(|answer| answer.created).count(),
            30,
            "round {round}: one task per key"
        );
    }
}

/// A purge and an operator's retry of the same finished task at once:
/// either the retry lands first (the task is ready again and kept) or the
/// purge does (the retry finds no task). Never a retry answered and its
/// task gone.
fn a_purge_and_a_retry_at_once_never_lose_the_retry(db: &TestDb) {
    let keep = tessera_store::Retention {
        done: Some(std::time::Duration::from_secs(60)),
        discarded: Some(std::time::Duration::from_secs(60)),
        cancelled: Some(std::time::Duration::from_secs(60)),
    };
    let config = |config: tessera_store::StoreConfig| {
        config
            .with_retention(keep)
            .with_retention_interval(std::time::Duration::ZERO)
    };
    let f = Fixture::with(db, config);
    let pair = Pair::with(&f, config(f.config()));
    let (ns, q) = (namespace("renders"), queue("purged"));
    let (mut retried, mut purged) = (0, 0);
    for round in 0..ROUNDS {
        let task = f
            .store
            .enqueue(
                &pair.callers.0,
                &ns,
                &q,
                &json_brief(round),
                &EnqueueOptions::default(),
            )
            .unwrap();
        f.store.cancel_task(&pair.callers.0, &task).unwrap();
        f.clock.advance(std::time::Duration::from_secs(61));
        let (retry, purge) = pair.race(
            |store, caller| store.retry_task(caller, &task),
            |store, _| store.maintain(),
        );
        purge.unwrap();
        let kept = f.store.read_task(&pair.callers.0, &task);
        match retry {
            Ok(_) => {
                retried += 1;
                let kept = kept.expect("a retried task is kept");
                assert!(
                    kept.record
                        .attempts
                        .iter()
                        .all(|a| a.state.name() == StateName::Ready)
                );
            }
            Err(error) => {
                purged += 1;
                assert!(matches!(error.status(), 404 | 410), "{error}");
                assert!(kept.is_err(), "a retry refused, yet its task is there");
            }
        }
        // Whatever won, the task is either claimable or gone for good.
        if let Ok(ClaimOutcome::Granted(claimed)) = f.store.claim(&pair.callers.0, &ns, &q) {
            f.store.cancel_task(&pair.callers.0, &claimed.task).unwrap();
        }
    }
    assert_eq!(retried + purged, ROUNDS);
}

/// The same snooze sent from two stores at once (a retry racing its
/// first send): one hands the task back, the other answers the same, and
/// the try is given back once.
fn a_snooze_sent_twice_at_once_gives_the_try_back_once(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let (ns, q) = (namespace("renders"), queue("snoozed"));
    for round in 0..ROUNDS {
        let task = f
            .store
            .enqueue(
                &pair.callers.0,
                &ns,
                &q,
                &json_brief(round),
                &EnqueueOptions::default().with_max_tries(2),
            )
            .unwrap();
        let claimed = match f.store.claim(&pair.callers.0, &ns, &q).unwrap() {
            ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("{other:?}"),
        };
        assert_eq!(claimed.task, task);
        let token = claimed.lease.token();
        let delay = std::time::Duration::from_secs(3600);
        let (a, b) = pair.race(
            |store, caller| store.snooze(caller, &task, token, delay),
            |store, caller| store.snooze(caller, &task, token, delay),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        let record = f.store.read_task(&pair.callers.0, &task).unwrap().record;
        assert_eq!(record.attempts[0].tries, 0, "round {round}");
        f.store.cancel_task(&pair.callers.0, &task).unwrap();
    }
}

/// A child's state once its round is over.
fn child_state(f: &Fixture<'_>, caller: &Caller, child: &TaskRef) -> StateName {
    f.store.read_task(caller, child).unwrap().record.attempts[0]
        .state
        .name()
}

/// A child's enqueue after a parent, and that parent's submission (the
/// one-statement submit-and-claim, then the plain submission, on
/// alternate rounds), at once from two stores: whichever commits first,
/// the child is never left waiting for a parent that is done.
fn a_childs_enqueue_and_its_parents_submission_at_once_never_strand_the_child(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let (ns, parents, children) = (namespace("graphs"), queue("parents"), queue("children"));
    for round in 0..4 * ROUNDS {
        let parent = f
            .store
            .enqueue(
                &pair.callers.0,
                &ns,
                &parents,
                &json_brief(round),
                &EnqueueOptions::default(),
            )
            .unwrap();
        let claimed = match f.store.claim(&pair.callers.1, &ns, &parents).unwrap() {
            ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("{other:?}"),
        };
        let request = SubmitRequest {
            task: parent.clone(),
            token: claimed.lease.token(),
            key: IdempotencyKey::parse("done").unwrap(),
            output: Output::bytes("ok"),
        };
        let (child, submitted) = pair.race(
            |store, caller| {
                store.enqueue(
                    caller,
                    &ns,
                    &children,
                    &json_brief(round),
                    &EnqueueOptions::default().after([parent.clone()]),
                )
            },
            |store, caller| {
                // Offsets swept over the rounds, so the submission lands
                // at each point of the enqueue's transaction.
                std::thread::sleep(std::time::Duration::from_micros((round as u64 % 50) * 200));
                if round % 2 == 0 {
                    store
                        .submit_and_claim(caller, &request, &ns, &parents)
                        .map(|(submitted, _)| submitted)
                } else {
                    store.submit(
                        caller,
                        &parent,
                        request.token,
                        &request.key,
                        &request.output,
                    )
                }
            },
        );
        let (child, submitted) = (child.unwrap(), submitted.unwrap());
        assert!(matches!(submitted, Submitted::Accepted(_)), "round {round}");
        assert_eq!(
            child_state(&f, &pair.callers.0, &child),
            StateName::Ready,
            "round {round}: the child waits for a parent that is done"
        );
        f.store.cancel_task(&pair.callers.0, &child).unwrap();
    }
}

/// The two parents of one child submitted at once from two stores: the
/// child is made ready once, by whichever commits second.
fn two_parents_ended_at_once_from_two_stores_unblock_their_child_once(db: &TestDb) {
    let f = Fixture::new(db);
    let pair = Pair::new(&f);
    let ns = namespace("graphs");
    for round in 0..ROUNDS {
        let mut claims = Vec::new();
        let mut parents = Vec::new();
        for side in ["left", "right"] {
            let q = queue(side);
            let parent = f
                .store
                .enqueue(
                    &pair.callers.0,
                    &ns,
                    &q,
                    &json_brief(round),
                    &EnqueueOptions::default(),
                )
                .unwrap();
            claims.push(match f.store.claim(&pair.callers.0, &ns, &q).unwrap() {
                ClaimOutcome::Granted(claimed) => claimed,
                other => panic!("{other:?}"),
            });
            parents.push(parent);
        }
        let child = f
            .store
            .enqueue(
                &pair.callers.0,
                &ns,
                &queue("fan-in"),
                &json_brief(round),
                &EnqueueOptions::default().after(parents.clone()),
            )
            .unwrap();
        let key = IdempotencyKey::parse("done").unwrap();
        let output = Output::bytes("ok");
        let submit = |store: &Store, caller: &Caller, claimed: &tessera_store::Claimed| {
            store.submit(caller, &claimed.task, claimed.lease.token(), &key, &output)
        };
        let (a, b) = pair.race(
            |store, caller| submit(store, caller, &claims[0]),
            |store, caller| submit(store, caller, &claims[1]),
        );
        assert!(matches!(a.unwrap(), Submitted::Accepted(_)));
        assert!(matches!(b.unwrap(), Submitted::Accepted(_)));
        assert_eq!(
            child_state(&f, &pair.callers.0, &child),
            StateName::Ready,
            "round {round}"
        );
        f.store.cancel_task(&pair.callers.0, &child).unwrap();
    }
}

conformance! {
    a_childs_enqueue_and_its_parents_submission_at_once_never_strand_the_child,
    two_parents_ended_at_once_from_two_stores_unblock_their_child_once,
    a_purge_and_a_retry_at_once_never_lose_the_retry,
    a_snooze_sent_twice_at_once_gives_the_try_back_once,
    batches_of_one_keys_in_other_orders_never_deadlock,
    enqueues_into_a_session_while_it_is_purged_leave_no_task_behind,
    a_pause_and_a_limit_change_at_once_both_land,
    two_revokes_at_once_revoke_and_audit_once,
    mints_from_one_address_on_two_stores_keep_its_limit,
    a_bulk_cancel_of_ready_tasks_spares_a_lease_granted_meanwhile,
    a_replacing_duplicate_and_a_claim_at_once_lose_no_brief,
}

/// Races of schedule changes (store feature `schedule`).
#[cfg(feature = "schedule")]
mod schedules {
    use tessera_store::{Brief, ScheduleName, ScheduleSpec};

    use super::{Pair, ROUNDS};
    use crate::harness::{Fixture, TestDb, namespace, queue};

    fn schedule(cron: &str) -> ScheduleSpec {
        ScheduleSpec::new(queue("reports"), cron, "UTC", Brief::Bytes(vec![]))
    }

    /// A replacement of a schedule and its pause at once: the replacement
    /// keeps the pause whichever comes first, and its expression lands too.
    fn a_schedule_replaced_while_paused_stays_paused(db: &TestDb) {
        let f = Fixture::new(db);
        let pair = Pair::new(&f);
        let ns = namespace("ops");
        for round in 0..ROUNDS {
            let name = ScheduleName::parse(&format!("s{round}")).unwrap();
            f.store
                .put_schedule(&pair.callers.0, &ns, &name, &schedule("0 * * * *"))
                .unwrap();
            let ((_, created), _) = pair.race(
                |store, caller| {
                    store
                        .put_schedule(caller, &ns, &name, &schedule("30 * * * *"))
                        .unwrap()
                },
                |store, caller| store.pause_schedule(caller, &ns, &name).unwrap(),
            );
            assert!(!created);
            let view = f.store.read_schedule(&pair.callers.0, &ns, &name).unwrap();
            assert!(view.paused, "round {round}: the pause was lost");
            assert_eq!(view.schedule.cron, "30 * * * *");
        }
    }

    /// A replacement and a delete of one schedule at once: the schedule is
    /// there at the end exactly when the put created it (it came second).
    fn a_schedule_put_and_deleted_at_once_agrees_with_its_answer(db: &TestDb) {
        let f = Fixture::new(db);
        let pair = Pair::new(&f);
        let ns = namespace("ops");
        for round in 0..ROUNDS {
            let name = ScheduleName::parse(&format!("s{round}")).unwrap();
            f.store
                .put_schedule(&pair.callers.0, &ns, &name, &schedule("0 * * * *"))
                .unwrap();
            let ((_, created), deleted) = pair.race(
                |store, caller| {
                    store
                        .put_schedule(caller, &ns, &name, &schedule("30 * * * *"))
                        .unwrap()
                },
                |store, caller| store.delete_schedule(caller, &ns, &name),
            );
            deleted.unwrap();
            let exists = f.store.read_schedule(&pair.callers.0, &ns, &name).is_ok();
            assert_eq!(exists, created, "round {round}");
        }
    }

    /// A scheduler's fire and a delete at once leave no fire row behind.
    fn a_fire_and_a_delete_at_once_leave_no_fire_row(db: &TestDb) {
        let f = Fixture::new(db);
        let pair = Pair::new(&f);
        let ns = namespace("ops");
        for round in 0..ROUNDS {
            let name = ScheduleName::parse(&format!("s{round}")).unwrap();
            f.store
                .put_schedule(&pair.callers.0, &ns, &name, &schedule("* * * * *"))
                .unwrap();
            f.clock.advance(std::time::Duration::from_secs(60));
            let (fired, deleted) = pair.race(
                |store, _| store.fire_due_schedules().unwrap(),
                |store, caller| store.delete_schedule(caller, &ns, &name),
            );
            deleted.unwrap();
            assert!(fired.len() <= 1);
        }
        assert_eq!(db.count_rows("schedule_fires"), 0);
    }

    conformance! {
        a_schedule_replaced_while_paused_stays_paused,
        a_schedule_put_and_deleted_at_once_agrees_with_its_answer,
        a_fire_and_a_delete_at_once_leave_no_fire_row,
    }
}
