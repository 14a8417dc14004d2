//! Worker child processes: this test binary run again, working the queue
//! of a database another process made, and reporting what it did.
//!
//! A test runs the binary again with `--exact child_process_entry` (the
//! entry test at the crate root, so its name is the same in every
//! build); the entry reads its orders from the environment, works the
//! queue and prints one line per event to stdout (line-buffered, so a line
//! printed is a line the parent reads, even after SIGKILL).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tessera_store::{
    Caller, ClaimOutcome, FencingToken, IdempotencyKey, ManualClock, Namespace, Output, QueueName,
    Retry, Store, StoreConfig, SubmitRequest, Submitted,
};

use crate::harness::{BackendKind, TestDb, namespace, queue, task_number};

/// A small deterministic generator for kill points and choices; the seed
/// is printed so a failure can be replayed with `TESSERA_RELIABILITY_SEED`.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn from_env_or_os() -> Self {
        let seed = match std::env::var("TESSERA_RELIABILITY_SEED") {
            Ok(text) => text.parse().unwrap(),
            Err(_) => {
                let mut bytes = [0_u8; 8];
                getrandom::fill(&mut bytes).unwrap();
                u64::from_le_bytes(bytes)
            }
        };
        eprintln!("reliability seed: TESSERA_RELIABILITY_SEED={seed}");
        Self(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..=high`.
    pub(crate) fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

const ENV_BACKEND: &str = "TESSERA_RELIABILITY_BACKEND";
const ENV_DB: &str = "TESSERA_RELIABILITY_DB";
const ENV_KEY: &str = "TESSERA_RELIABILITY_KEY";
const ENV_AT: &str = "TESSERA_RELIABILITY_AT";
const ENV_THREADS: &str = "TESSERA_RELIABILITY_THREADS";
const ENV_RETRIES: &str = "TESSERA_RELIABILITY_RETRIES";
const ENV_BATCH: &str = "TESSERA_RELIABILITY_BATCH";
const MARK: &str = "@tessera ";

/// The namespace and queue every child works.
pub(crate) fn work_namespace() -> Namespace {
    namespace("farm")
}

pub(crate) fn work_queue() -> QueueName {
    queue("frames")
}

/// What a child is told.
#[derive(Debug, Clone)]
pub(crate) struct ChildOrders<'db> {
    /// The database it works, made by the parent.
    pub(crate) db: &'db TestDb,
    pub(crate) key: String,
    /// The child's clock reads this time throughout.
    pub(crate) at: DateTime<Utc>,
    pub(crate) threads: usize,
    /// Whether some grants are failed with a zero retry backoff, so their
    /// task is granted again (see [`grants_for`]).
    pub(crate) retries: bool,
    /// Claims this many at once and submits them in one
    /// [`submit_batch`](Store::submit_batch); 0 works one lease at a time.
    pub(crate) batch: usize,
}

/// How many grants a task gets when children fail some on purpose: task
/// numbers divisible by 3 are failed once, by 9 twice, before the grant
/// that submits.
pub(crate) fn grants_for(task: usize) -> i64 {
    1 + i64::from(task % 3 == 0) + i64::from(task % 9 == 0)
}

/// Starts the test binary again as a worker child.
pub(crate) fn spawn_child(orders: &ChildOrders<'_>) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_BACKEND, orders.db.kind().name())
        .env(ENV_DB, orders.db.locator())
        .env(ENV_KEY, &orders.key)
        .env(ENV_AT, orders.at.to_rfc3339())
        .env(ENV_THREADS, orders.threads.to_string())
        .env(ENV_RETRIES, if orders.retries { "1" } else { "0" })
        .env(ENV_BATCH, orders.batch.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// One event a child reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A claim returned this lease.
    Grant { task: String, token: i64 },
    /// A fail report with a zero backoff was acknowledged.
    Fail { task: String, token: i64 },
    /// A submission was acknowledged as accepted, with its digest.
    Ack {
        task: String,
        token: i64,
        digest: String,
    },
}

impl Event {
    fn parse(line: &str) -> Option<Self> {
        let start = line.find(MARK)?;
        let fields: Vec<&str> = line[start + MARK.len()..].split(' ').collect();
        let token = |text: &str| text.parse::<i64>().ok();
        match fields.as_slice() {
            ["grant", task, t] => Some(Self::Grant {
                task: (*task).to_owned(),
                token: token(t)?,
            }),
            ["fail", task, t] => Some(Self::Fail {
                task: (*task).to_owned(),
                token: token(t)?,
            }),
            ["ack", task, t, digest] => Some(Self::Ack {
                task: (*task).to_owned(),
                token: token(t)?,
                digest: (*digest).to_owned(),
            }),
            _ => None,
        }
    }

    pub(crate) fn task(&self) -> &str {
        match self {
            Self::Grant { task, .. } | Self::Fail { task, .. } | Self::Ack { task, .. } => task,
        }
    }
}

/// Reads a child's events until `stop` says so (returning `true`) or its
/// stdout ends. Only whole lines count: a line cut short by a kill is
/// dropped.
pub(crate) fn read_events(
    stdout: &mut BufReader<ChildStdout>,
    events: &mut Vec<Event>,
    mut stop: impl FnMut(&Event, &[Event]) -> bool,
) {
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 || !line.ends_with('\n') {
            return;
        }
        if let Some(event) = Event::parse(line.trim_end()) {
            events.push(event);
            let last = events.last().unwrap().clone();
            if stop(&last, events) {
                return;
            }
        }
    }
}

/// The output a child submits for a grant, and so the digest it reports.
pub(crate) fn output_for(task: &str, token: FencingToken) -> Output {
    Output::bytes(format!("{task} rendered under token {token}"))
}

/// The body of the `child_process_entry` test: does nothing unless run as
/// a child by [`spawn_child`].
pub(crate) fn child_main() {
    let Ok(locator) = std::env::var(ENV_DB) else {
        return;
    };
    let env = |name: &str| std::env::var(name).unwrap();
    let db = TestDb::attach(BackendKind::from_name(&env(ENV_BACKEND)), &locator);
    let at: DateTime<Utc> = env(ENV_AT).parse().unwrap();
    let threads: usize = env(ENV_THREADS).parse().unwrap();
    let retries = env(ENV_RETRIES) == "1";
    let batch: usize = env(ENV_BATCH).parse().unwrap();
    let clock = ManualClock::new(at);
    // Other processes write in turn; waiting for them is the normal case
    // here, not a fault.
    let store = db.open_shared(StoreConfig::default().with_clock(Arc::new(clock)));
    let caller = store.authenticate(Some(&env(ENV_KEY))).unwrap();
    let (ns, q) = (work_namespace(), work_queue());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| match batch {
                0 => work(&store, &caller, &ns, &q, retries),
                size => work_batches(&store, &caller, &ns, &q, size),
            });
        }
    });
}

/// Claims until the queue is empty. Every lease is heartbeaten once and
/// submitted, or (with `retries`) failed with a zero backoff as
/// [`grants_for`] says, which makes its task claimable again at once.
fn work(store: &Store, caller: &Caller, ns: &Namespace, q: &QueueName, retries: bool) {
    loop {
        let claimed = match store.claim(caller, ns, q).unwrap() {
            ClaimOutcome::Granted(claimed) => claimed,
            ClaimOutcome::Empty { .. } => return,
        };
        let task = claimed.task.id.as_str().to_owned();
        let token = claimed.lease.token();
        println!("{MARK}grant {task} {token}");
        if retries && token.as_i64() < grants_for(task_number(&task)) {
            store
                .fail(caller, &claimed.task, token, Retry::After(Duration::ZERO))
                .unwrap();
            println!("{MARK}fail {task} {token}");
            continue;
        }
        let lease = store.heartbeat(caller, &claimed.task, token).unwrap();
        assert_eq!(lease.token(), token);
        let output = output_for(&task, token);
        let key = IdempotencyKey::parse(&format!("k{token}")).unwrap();
        let submitted = store
            .submit(caller, &claimed.task, token, &key, &output)
            .unwrap();
        let Submitted::Accepted(receipt) = submitted else {
            panic!("a fresh key is accepted: {submitted:?}");
        };
        println!("{MARK}ack {task} {token} {}", receipt.digest);
    }
}

/// Claims `size` at a time until the queue is empty, and submits each
/// batch's outputs in one [`submit_batch`](Store::submit_batch); an
/// acknowledgement is printed only once the batch's answers are back.
fn work_batches(store: &Store, caller: &Caller, ns: &Namespace, q: &QueueName, size: usize) {
    loop {
        let claimed = store.claim_batch(caller, ns, q, size).unwrap().claimed;
        if claimed.is_empty() {
            return;
        }
        let mut requests = Vec::with_capacity(claimed.len());
        for lease in &claimed {
            let task = lease.task.id.as_str();
            let token = lease.lease.token();
            println!("{MARK}grant {task} {token}");
            requests.push(SubmitRequest {
                task: lease.task.clone(),
                token,
                key: IdempotencyKey::parse(&format!("k{token}")).unwrap(),
                output: output_for(task, token),
            });
        }
        let answers = store.submit_batch(caller, &requests).unwrap();
        for (request, answer) in requests.iter().zip(answers) {
            let Submitted::Accepted(receipt) = answer.unwrap() else {
                panic!("a fresh key is accepted");
            };
            println!(
                "{MARK}ack {} {} {}",
                request.task.id, request.token, receipt.digest
            );
        }
    }
}
