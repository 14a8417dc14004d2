//! The cost table: rows written and read per request, measured by the
//! store's own meter, beside the hosted service's figures before and after
//! its October 29 storage hardening ("Rows per request before and after
//! the October 29 hardening"; rows written unless marked "read").
//!
//! Run: `cargo run --release -p tessera-benches --bin cost_table`
//!
//! Every request runs against a store on a real SQLite file, on a
//! `ManualClock`, warm (its key's `last_used_at` already carried by an
//! audited action in the current interval) unless the row says otherwise,
//! and includes resolving its key. Rows written count index entries, as the hosted figures do;
//! rows read are the rows the store's statements returned (see
//! `MeterSnapshot`). The program prints a markdown table with a status
//! column and always exits 0.

use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_store::limits::PRACTICE_QUEUE;
use tessera_store::{
    Brief, BulkFilter, Caller, ClaimOutcome, Claimed, Clock, ConcurrencyLimit, EmptyReason,
    EnqueueOptions, Failure, Grant, IdempotencyKey, IssuedKey, KeySpec, ManualClock, MeterSnapshot,
    MintConfig, Namespace, Output, PartitionKey, QueueName, Retry, ScheduleName, ScheduleSpec,
    Scope, Secret, StateName, Store, StoreConfig, TaskRef, UniqueKey, Uniqueness,
};

/// What a row is held to.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// Rows written at most this.
    Written(u64),
    /// Rows read at most this.
    Read(u64),
    /// Both at most these.
    Both { written: u64, read: u64 },
    /// No figure to meet.
    None,
}

impl Target {
    fn met_by(self, cost: MeterSnapshot) -> bool {
        match self {
            Self::Written(limit) => cost.rows_written <= limit,
            Self::Read(limit) => cost.rows_read <= limit,
            Self::Both { written, read } => cost.rows_written <= written && cost.rows_read <= read,
            Self::None => true,
        }
    }
}

/// One printed row: what Tessera did, and the hosted service's figures
/// before and after its hardening.
struct Row {
    request: String,
    cost: MeterSnapshot,
    main: &'static str,
    branch: &'static str,
    target: Target,
}

fn noon() -> DateTime<Utc> {
    "2026-10-29T12:00:00Z".parse().expect("a valid time")
}

fn namespace(name: &str) -> Namespace {
    Namespace::parse(name).expect("a valid namespace")
}

fn queue(name: &str) -> QueueName {
    QueueName::parse(name).expect("a valid queue")
}

fn brief(n: usize) -> Brief {
    Brief::Bytes(format!("{{\"frame\":{n}}}").into_bytes())
}

/// A distinct /64 for each `n`, from the documentation prefix.
fn address(n: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 1))
}

fn config(clock: &ManualClock) -> StoreConfig {
    StoreConfig::default()
        .with_clock(Arc::new(clock.clone()))
        .with_address_secret(Secret::new(*b"tessera-cost-table-address-key-1").expect("32 bytes"))
        // The scenario mints a thousand sessions in a burst; the
        // per-address limit and the durable quota row still apply.
        .with_mint(MintConfig {
            per_hour: 100_000,
            ..MintConfig::default()
        })
        .with_public_namespace(namespace("health"))
}

/// The scenario's store and its callers.
struct Scenario<'a> {
    path: &'a Path,
    clock: ManualClock,
    store: Store,
    worker_key: IssuedKey,
    rows: Vec<Row>,
}

impl Scenario<'_> {
    fn worker(&self) -> Caller {
        self.store
            .authenticate(Some(self.worker_key.secret.expose()))
            .expect("the worker's key")
    }

    /// One request by the worker: its key resolved, then `work`.
    fn request<T>(&self, work: impl FnOnce(&Store, &Caller) -> T) -> (T, MeterSnapshot) {
        self.store.measure(|store| {
            let caller = self.worker();
            work(store, &caller)
        })
    }

    fn push(
        &mut self,
        request: &str,
        cost: MeterSnapshot,
        main: &'static str,
        branch: &'static str,
        target: Target,
    ) {
        self.rows.push(Row {
            request: request.to_owned(),
            cost,
            main,
            branch,
            target,
        });
    }
}

fn enqueue(store: &Store, caller: &Caller, ns: &Namespace, q: &QueueName, n: usize) -> TaskRef {
    store
        .enqueue(caller, ns, q, &brief(n), &EnqueueOptions::default())
        .expect("enqueued")
}

fn granted(outcome: ClaimOutcome) -> Claimed {
    match outcome {
        ClaimOutcome::Granted(claimed) => claimed,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// A long-poll that times out after `wait`, while another thread moves the
/// manual clock on; returns its cost.
fn long_poll(s: &Scenario<'_>, ns: &Namespace, q: &QueueName, wait: Duration) -> MeterSnapshot {
    thread::scope(|scope| {
        let poll = scope.spawn(|| {
            s.request(|store, caller| {
                store
                    .wait_for_work(caller, ns, q, wait)
                    .expect("a long-poll")
            })
        });
        while !poll.is_finished() {
            thread::sleep(Duration::from_millis(1));
            s.clock.advance(Duration::from_millis(250));
        }
        let (outcome, cost) = poll.join().expect("the long-poll thread");
        assert_eq!(outcome, tessera_store::WaitOutcome::TimedOut);
        cost
    })
}

fn keyed_requests(s: &mut Scenario<'_>) {
    let renders = namespace("renders");
    let frames = queue("frames");
    let worker = s.worker();
    let task = enqueue(&s.store, &worker, &renders, &frames, 0);

    let (_, cost) = s.request(|store, caller| store.read_task(caller, &task).expect("a read"));
    s.push(
        "Keyed read (`read_task`)",
        cost,
        "4",
        "4",
        Target::Written(4),
    );

    let fresh = namespace("fresh");
    let (_, cost) = s.request(|store, caller| enqueue(store, caller, &fresh, &frames, 1));
    s.push(
        "First keyed request to a new namespace (an enqueue)",
        cost,
        "213",
        "218",
        Target::Written(218),
    );

    let lifecycle = s.store.meter();
    let (_, cost) = s.request(|store, caller| enqueue(store, caller, &renders, &frames, 2));
    s.push("Enqueue", cost, "13", "13", Target::Written(13));

    let (claimed, cost) = s
        .request(|store, caller| granted(store.claim(caller, &renders, &frames).expect("a claim")));
    s.push("Granted claim", cost, "13", "13", Target::Written(13));
    let (_, cost) = s
        .request(|store, caller| granted(store.claim(caller, &renders, &frames).expect("a claim")));
    let second = cost;

    // Ten seconds on, so the heartbeat moves the lease's expiry.
    s.clock.advance(Duration::from_secs(10));
    let (_, cost) = s.request(|store, caller| {
        store
            .heartbeat(caller, &claimed.task, claimed.lease.token())
            .expect("a heartbeat")
    });
    s.push("Heartbeat", cost, "10", "10", Target::Written(10));

    let (outcome, cost) =
        s.request(|store, caller| store.claim(caller, &renders, &frames).expect("a claim"));
    assert!(outcome.claimed().is_none(), "the queue is empty");
    s.push(
        "Empty claim (`204`)",
        cost,
        "4, plus a later delete",
        "0 (one counter row a minute)",
        Target::Written(0),
    );

    let (_, cost) = s.request(|store, caller| {
        store
            .submit(
                caller,
                &claimed.task,
                claimed.lease.token(),
                &IdempotencyKey::parse("frame-2").expect("a key"),
                &Output::bytes(b"rendered".to_vec()),
            )
            .expect("a submission")
    });
    s.push("Submit", cost, "20", "20", Target::Written(20));

    let cost = long_poll(s, &renders, &frames, Duration::from_secs(3));
    s.push(
        "Long-poll, `wait=3`, timing out",
        cost,
        "16",
        "4",
        Target::Written(4),
    );
    // The second claim emptied the queue before the empty claim; it is not
    // one of the lifecycle's requests.
    let total = s.store.meter().since(&lifecycle).since(&second);
    s.push(
        "Keyed lifecycle (enqueue, claim, heartbeat, empty claim, submit, long-poll)",
        total,
        "123",
        "99",
        Target::Written(99),
    );
}

/// A unique enqueue, and its duplicate, which writes nothing.
fn unique_tasks(s: &mut Scenario<'_>) {
    let ns = namespace("unique");
    let q = queue("reports");
    let worker = s.worker();
    // The namespace is open already.
    s.store
        .enqueue(&worker, &ns, &q, &brief(0), &EnqueueOptions::default())
        .expect("enqueued");
    let options = EnqueueOptions::default().with_unique(Uniqueness::new(
        UniqueKey::parse("report-7").expect("a key"),
    ));
    let (first, cost) = s.request(|store, caller| {
        store
            .enqueue_one(caller, &ns, &q, &brief(1), &options)
            .expect("enqueued")
    });
    assert!(first.created);
    s.push(
        "Unique enqueue (`with_unique`, its slot taken)",
        cost,
        "–",
        "–",
        Target::Written(13),
    );
    let (again, cost) = s.request(|store, caller| {
        store
            .enqueue_one(caller, &ns, &q, &brief(2), &options)
            .expect("a duplicate")
    });
    assert!(!again.created);
    s.push(
        "Duplicate enqueue (writes nothing: the task holding the slot, `created: false`)",
        cost,
        "–",
        "–",
        Target::Written(0),
    );
}

/// A queue paused, resumed and limited, and claims on it.
fn queue_settings(s: &mut Scenario<'_>) {
    let ns = namespace("settings");
    let q = queue("frames");
    let worker = s.worker();
    for n in 0..4 {
        let options = EnqueueOptions::default().with_partition_key(
            PartitionKey::parse(&format!("customer-{}", n % 2)).expect("a key"),
        );
        s.store
            .enqueue(&worker, &ns, &q, &brief(n), &options)
            .expect("enqueued");
    }
    let (_, cost) = s.request(|store, caller| store.pause_queue(caller, &ns, &q).expect("paused"));
    s.push(
        "Pause a queue (`pause_queue`)",
        cost,
        "–",
        "–",
        Target::None,
    );
    let (outcome, cost) = s.request(|store, caller| store.claim(caller, &ns, &q).expect("a claim"));
    assert_eq!(outcome.empty_reason(), Some(EmptyReason::Paused));
    s.push(
        "Claim on a paused queue (`204`, reason `paused`)",
        cost,
        "–",
        "–",
        Target::Written(0),
    );
    let (_, cost) =
        s.request(|store, caller| store.resume_queue(caller, &ns, &q).expect("resumed"));
    s.push(
        "Resume a queue (`resume_queue`)",
        cost,
        "–",
        "–",
        Target::None,
    );
    let limit = ConcurrencyLimit {
        queue: NonZeroU32::new(2),
        per_partition: NonZeroU32::new(1),
    };
    let (_, cost) = s.request(|store, caller| {
        store
            .set_queue_limits(caller, &ns, &q, limit)
            .expect("limits set")
    });
    s.push(
        "Set a queue's limits (`set_queue_limits`)",
        cost,
        "–",
        "–",
        Target::None,
    );
    let (_, cost) =
        s.request(|store, caller| granted(store.claim(caller, &ns, &q).expect("a claim")));
    s.push(
        "Granted claim in a queue limited in all and per partition key",
        cost,
        "13",
        "13",
        Target::Written(13),
    );
    let (_, cost) =
        s.request(|store, caller| granted(store.claim(caller, &ns, &q).expect("a claim")));
    let _ = cost;
    let (outcome, cost) = s.request(|store, caller| store.claim(caller, &ns, &q).expect("a claim"));
    assert_eq!(outcome.empty_reason(), Some(EmptyReason::Limited));
    s.push(
        "Claim on a queue at its limit (`204`, reason `limited`)",
        cost,
        "–",
        "–",
        Target::Written(0),
    );
}

/// Periodic schedules: putting one, a scheduler pass with nothing due (ten
/// schedules, none due), and a pass that fires one run-at. After the
/// crowded read, so the worker's `last_used_at` is warm; waiting counters
/// are written before each pass, so a pass's row is its own.
fn schedules(s: &mut Scenario<'_>) {
    let ns = namespace("reports");
    let spec = |cron: &str| {
        ScheduleSpec::new(
            queue("daily"),
            cron,
            "Europe/Stockholm",
            Brief::Bytes(b"{\"report\":\"sales\"}".to_vec()),
        )
    };
    let name = |n: usize| ScheduleName::parse(&format!("report-{n}")).expect("a valid name");
    // The namespace exists already, as a keyed namespace in use does.
    enqueue(&s.store, &s.worker(), &ns, &queue("daily"), 0);
    let (_, cost) = s.request(|store, caller| {
        store
            .put_schedule(caller, &ns, &name(0), &spec("*/5 * * * *"))
            .expect("a schedule")
    });
    s.push(
        "Put a schedule (`put_schedule`)",
        cost,
        "–",
        "–",
        Target::Written(5),
    );
    for n in 1..10 {
        let worker = s.worker();
        s.store
            .put_schedule(&worker, &ns, &name(n), &spec("0 3 * * *"))
            .expect("a schedule");
    }
    s.store.flush_counters().expect("counters written");
    let (fired, cost) = s
        .store
        .measure(|store| store.fire_due_schedules().expect("a pass"));
    assert!(fired.is_empty(), "nothing is due yet");
    s.push(
        "Scheduler pass, ten schedules, nothing due (`fire_due_schedules`)",
        cost,
        "–",
        "–",
        Target::Written(0),
    );
    s.clock.advance(Duration::from_secs(5 * 60));
    s.store.flush_counters().expect("counters written");
    let (fired, cost) = s
        .store
        .measure(|store| store.fire_due_schedules().expect("a pass"));
    assert_eq!(fired.len(), 1, "one run-at is due");
    s.push(
        "Scheduler pass firing one run-at: its fire row, task and audit row in one transaction",
        cost,
        "–",
        "–",
        Target::Written(12),
    );
}

fn bulk_and_progress(s: &mut Scenario<'_>) {
    let ns = namespace("bulk");
    let q = queue("exports");
    let worker = s.worker();
    for n in 0..10 {
        enqueue(&s.store, &worker, &ns, &q, n);
    }
    let filter = BulkFilter::default()
        .with_queue(q.clone())
        .with_state(StateName::Ready);
    let (cancelled, cost) = s.request(|store, caller| {
        store
            .cancel_tasks(caller, &ns, &filter)
            .expect("a bulk cancel")
    });
    assert_eq!(cancelled, 10);
    s.push(
        "Bulk cancel of 10 ready tasks by filter (`cancel_tasks`, one batch, one audit row)",
        cost,
        "–",
        "–",
        Target::None,
    );
    let cancelled_filter = BulkFilter::default()
        .with_queue(q.clone())
        .with_state(StateName::Cancelled);
    let (retried, cost) = s.request(|store, caller| {
        store
            .retry_tasks(caller, &ns, &cancelled_filter)
            .expect("a bulk retry")
    });
    assert_eq!(retried, 10);
    s.push(
        "Bulk retry of those 10 by filter (`retry_tasks`, one batch, one audit row)",
        cost,
        "–",
        "–",
        Target::None,
    );
    let claimed = granted(s.store.claim(&worker, &ns, &q).expect("a claim"));
    let progress = serde_json::json!({"done": 40, "of": 100});
    let (_, cost) = s.request(|store, caller| {
        store
            .heartbeat_with_progress(caller, &claimed.task, claimed.lease.token(), &progress)
            .expect("a heartbeat")
    });
    s.push(
        "Heartbeat carrying progress (`heartbeat_with_progress`)",
        cost,
        "10",
        "10",
        Target::Written(10),
    );
}

/// Tasks that wait for others: an enqueue after three parents, a
/// parent's submission that makes three children ready, and a parent's
/// failure that cancels three.
fn dependencies(s: &mut Scenario<'_>) {
    let ns = namespace("graphs");
    let q = queue("steps");
    let worker = s.worker();
    let parents: Vec<TaskRef> = (0..3)
        .map(|n| enqueue(&s.store, &worker, &ns, &q, n))
        .collect();
    let (_, cost) = s.request(|store, caller| {
        store
            .enqueue(
                caller,
                &ns,
                &queue("after"),
                &brief(3),
                &EnqueueOptions::default().after(parents.clone()),
            )
            .expect("enqueued")
    });
    s.push(
        "Enqueue after 3 parents (`after`: each parent locked and read, an edge each)",
        cost,
        "–",
        "–",
        Target::None,
    );
    for (label, fail) in [("ready", false), ("cancelled (`parent_failed`)", true)] {
        let parent = enqueue(&s.store, &worker, &ns, &queue("parents"), 10);
        for n in 0..3 {
            s.store
                .enqueue(
                    &worker,
                    &ns,
                    &queue("children"),
                    &brief(n),
                    &EnqueueOptions::default().after([parent.clone()]),
                )
                .expect("enqueued");
        }
        let claimed = granted(
            s.store
                .claim(&worker, &ns, &queue("parents"))
                .expect("a claim"),
        );
        let (_, cost) = s.request(|store, caller| {
            if fail {
                store
                    .fail(
                        caller,
                        &claimed.task,
                        claimed.lease.token(),
                        Failure::with_error(Retry::Never, "no"),
                    )
                    .map(|_| ())
            } else {
                store
                    .submit(
                        caller,
                        &claimed.task,
                        claimed.lease.token(),
                        &IdempotencyKey::parse("done").expect("a key"),
                        &Output::bytes("ok"),
                    )
                    .map(|_| ())
            }
            .expect("acknowledged")
        });
        let request = if fail {
            format!("A parent's failure for good that leaves 3 children {label}")
        } else {
            format!("A parent's submission that makes its 3 children {label}")
        };
        s.push(&request, cost, "–", "–", Target::None);
    }
}

fn sessions(s: &mut Scenario<'_>) {
    let (_, cost) = s
        .store
        .measure(|store| store.mint_session(address(1)).expect("a session"));
    s.push(
        "Anonymous session minted and never used",
        cost,
        "209",
        "18",
        Target::Written(18),
    );

    let (_, cost) = s.store.measure(|store| {
        let session = store.mint_session(address(2)).expect("a session");
        let caller = store
            .authenticate(Some(session.key.secret.expose()))
            .expect("the session's key");
        granted(
            store
                .claim(&caller, &session.namespace, &queue(PRACTICE_QUEUE))
                .expect("a claim"),
        )
    });
    s.push(
        "Anonymous session minted, then first claim",
        cost,
        "229",
        "238",
        Target::Written(238),
    );
}

fn health(s: &mut Scenario<'_>) {
    let ns = namespace("health");
    let q = queue("public");
    let worker = s.worker();
    for n in 0..500 {
        enqueue(&s.store, &worker, &ns, &q, n);
    }
    let (_, cost) = s.request(|store, caller| store.health(caller, &ns).expect("health"));
    // The hosted keyed namespace health row counts writes only; its read
    // figures are for the health read without a key, below.
    s.push(
        "Keyed health read, 500 tasks, first",
        cost,
        "8",
        "0",
        Target::Written(0),
    );
    let (_, cost) = s.request(|store, caller| store.health(caller, &ns).expect("health"));
    s.push(
        "Keyed health read, 500 tasks, repeated within 15 s",
        cost,
        "8",
        "0",
        Target::Written(0),
    );
    // A change drops the snapshot; the next public read takes it again.
    enqueue(&s.store, &worker, &ns, &q, 500);
    let (_, cost) = s
        .store
        .measure(|store| store.public_health(&ns).expect("health"));
    s.push(
        "Public health read without a key, 501 tasks, first",
        cost,
        "(read 502)",
        "0 (read 501)",
        Target::Both {
            written: 0,
            read: 501,
        },
    );
    let (_, cost) = s
        .store
        .measure(|store| store.public_health(&ns).expect("health"));
    s.push(
        "Public health read without a key, repeated within 15 s",
        cost,
        "(read 502)",
        "0 (read 0)",
        Target::Both {
            written: 0,
            read: 0,
        },
    );
}

fn crowded_read(s: &mut Scenario<'_>) {
    for n in 0..1_000 {
        s.store.mint_session(address(1_000 + n)).expect("a session");
    }
    let worker = s.worker();
    let task = enqueue(
        &s.store,
        &worker,
        &namespace("renders"),
        &queue("frames"),
        9,
    );
    // Five minutes on, so retention is due and runs inside the measured
    // read; waiting counters are written first, so the row shows the read,
    // the retention run and the key's `last_used_at` (due again after five
    // minutes without an audited action, so the read carries it).
    s.clock.advance(Duration::from_secs(5 * 60));
    s.store.flush_counters().expect("counters written");
    let (_, cost) = s.request(|store, caller| store.read_task(caller, &task).expect("a read"));
    s.push(
        "Keyed read with 1,000 anonymous principals and limit rows present (a retention run and the key's due `last_used_at` included)",
        cost,
        "(read 3,040)",
        "(read 36)",
        Target::Read(36),
    );
}

/// An idle worker polling an empty queue, following each empty claim's
/// `Retry-After`, with the host's maintenance timer
/// (`Store::next_maintenance`) flushing counters and running retention;
/// returns the third day's rows, when retention deletes the first full
/// day's rows as it will every day after: what the polls wrote (their own
/// rows and their counter rows) and what retention deleted, apart.
fn idle_day(dir: &Path) -> (MeterSnapshot, MeterSnapshot, IdleBreakdown) {
    let clock = ManualClock::new(noon());
    let store = Store::open(dir.join("idle.db"), config(&clock)).expect("a store");
    let admin_key = store.create_admin_key("operators").expect("an admin key");
    let admin = store
        .authenticate(Some(admin_key.secret.expose()))
        .expect("the admin");
    let ns = namespace("idle");
    let key = store
        .create_key(
            &admin,
            &KeySpec::keyed("acme")
                .with_scopes([Scope::Claim])
                .with_grant(Grant::Namespace(ns.clone())),
        )
        .expect("a key");
    let q = queue("nothing");
    let day = Duration::from_secs(24 * 3600);
    let measured_from = noon() + day * 2;
    let end = noon() + day * 3;
    let mut breakdown = IdleBreakdown::default();
    let mut written = MeterSnapshot::default();
    let mut deleted = MeterSnapshot::default();
    while clock.now_utc() < end {
        let measuring = clock.now_utc() >= measured_from;
        let ((), cost) = store.measure(|store| {
            let caller = store
                .authenticate(Some(key.secret.expose()))
                .expect("the key");
            let outcome = store.claim(&caller, &ns, &q).expect("a claim");
            let wait = outcome.retry_after().expect("an empty claim");
            if measuring {
                breakdown.polls += 1;
            }
            breakdown.next_wait = wait;
        });
        if measuring {
            breakdown.requests += cost.rows_written;
            written = add(written, cost);
        }
        let poll_at = clock.now_utc() + breakdown.next_wait;
        // The host's timer fires at each maintenance time before the poll.
        while let Some(due) = store.next_maintenance().filter(|due| *due <= poll_at) {
            if let Ok(ahead) = (due - clock.now_utc()).to_std() {
                clock.advance(ahead);
            }
            // The counters first, then the rest of maintenance, measured
            // apart so the polls' counter rows and retention's deletes each
            // have their own line.
            let (counters, flushed) =
                store.measure(|store| store.flush_counters().expect("counters written"));
            let (report, cost) = store.measure(|store| store.maintain().expect("maintenance"));
            if (measured_from..end).contains(&clock.now_utc()) {
                written = add(written, flushed);
                deleted = add(deleted, cost);
                breakdown.counter_rows += counters + report.counters_written;
                breakdown.counter_rows_written += flushed.rows_written;
                breakdown.deleted_rows += report.rows_deleted;
            }
            if store.next_maintenance() == Some(due) {
                break;
            }
        }
        if let Ok(ahead) = (poll_at - clock.now_utc()).to_std() {
            clock.advance(ahead);
        }
    }
    (written, deleted, breakdown)
}

fn add(a: MeterSnapshot, b: MeterSnapshot) -> MeterSnapshot {
    MeterSnapshot {
        rows_written: a.rows_written + b.rows_written,
        rows_read: a.rows_read + b.rows_read,
        write_transactions: a.write_transactions + b.write_transactions,
        refused_writes: a.refused_writes + b.refused_writes,
    }
}

/// Where the idle worker's rows come from.
#[derive(Debug, Default)]
struct IdleBreakdown {
    polls: u64,
    next_wait: Duration,
    /// Rows the polls wrote themselves.
    requests: u64,
    /// Counter rows upserted by maintenance.
    counter_rows: u64,
    /// Rows those upserts wrote, index entries included.
    counter_rows_written: u64,
    /// Rows retention deleted.
    deleted_rows: u64,
}

/// A session minted and never used, then purged by retention a day later,
/// on a store of its own so nothing else is purged with it.
fn session_purge(dir: &Path) -> MeterSnapshot {
    let clock = ManualClock::new(noon());
    let store = Store::open(dir.join("purge.db"), config(&clock)).expect("a store");
    store.mint_session(address(1)).expect("a session");
    clock.advance(Duration::from_secs(25 * 3600));
    store
        .measure(|store| store.maintain().expect("maintenance"))
        .1
}

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("tessera.db");
    let clock = ManualClock::new(noon());
    let store = Store::open(&path, config(&clock)).expect("a new store");
    let opened = store.meter();
    let admin_key = store.create_admin_key("operators").expect("an admin key");
    let admin = store
        .authenticate(Some(admin_key.secret.expose()))
        .expect("the admin");
    let worker_key = store
        .create_key(
            &admin,
            &KeySpec::keyed("acme")
                .with_scopes(Scope::ALL.iter().copied())
                .with_grant(Grant::AllNamespaces),
        )
        .expect("a worker key");
    let mut s = Scenario {
        path: &path,
        clock,
        store,
        worker_key,
        rows: Vec::new(),
    };
    s.push(
        "First storage request to a new database (opening it creates the schema)",
        opened,
        "101",
        "106",
        Target::Written(106),
    );
    keyed_requests(&mut s);
    sessions(&mut s);
    let purge = session_purge(dir.path());
    s.push(
        "… that session's purge by retention a day later (deletes)",
        purge,
        "–",
        "–",
        Target::None,
    );
    health(&mut s);
    crowded_read(&mut s);
    queue_settings(&mut s);
    schedules(&mut s);
    unique_tasks(&mut s);
    bulk_and_progress(&mut s);
    dependencies(&mut s);
    let (idle, purged, breakdown) = idle_day(dir.path());
    s.push(
        "Idle worker polling an empty queue, rows a simulated day written by its polls (their counter rows included)",
        idle,
        "≈86,000",
        "≈2,900 (target 1,440)",
        Target::Written(1_440),
    );
    s.push(
        "… and deleted that day by retention (none: each minute's counter row overwrites the one its minute of the day left a day earlier)",
        purged,
        "–",
        "–",
        Target::Written(0),
    );

    let Scenario {
        path, store, rows, ..
    } = s;
    let mut rows = rows;
    drop(store);
    let clock = ManualClock::new(noon());
    let reopened = Store::open(path, config(&clock)).expect("an existing store");
    rows.push(Row {
        request: "Cold start of an existing database".to_owned(),
        cost: reopened.meter(),
        main: "0 (read 207)",
        branch: "0 (read 293)",
        target: Target::Both {
            written: 0,
            read: 293,
        },
    });

    println!(
        "| Request (warm unless noted) | Rows written | Rows read | Hosted, before | Hosted, after | Status |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for row in &rows {
        let status = match row.target {
            Target::None => "–",
            target if target.met_by(row.cost) => "meets",
            _ => "over",
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.request,
            grouped(row.cost.rows_written),
            grouped(row.cost.rows_read),
            row.main,
            row.branch,
            status
        );
    }
    println!();
    println!(
        "- Idle worker, third simulated day (a full earlier day of counter rows stored): \
         {} polls; {} rows written by the polls themselves, {} counter rows upserted by \
         maintenance ({} rows written), {} expired rows deleted by retention ({} rows \
         written), index entries included.",
        grouped(breakdown.polls),
        grouped(breakdown.requests),
        grouped(breakdown.counter_rows),
        grouped(breakdown.counter_rows_written),
        grouped(breakdown.deleted_rows),
        grouped(purged.rows_written)
    );
    println!(
        "- The keyed lifecycle has six of the hosted lifecycle's eleven requests (Tessera has \
         no record writes or blob uploads); the hosted figures after the hardening for those \
         six add up to 60."
    );
    println!(
        "- Rows read are the rows the store's statements returned; the hosted figures sum each \
         cursor's `rowsRead`, rows SQLite visited, so a count over 500 index entries reads 1 \
         row here and about 500 there."
    );
}

/// `12345` as `12,345`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
