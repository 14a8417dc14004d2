//! Shared set-up for the reliability tests: stores on files driven by a
//! manual clock, worker child processes (the test binary run again), and
//! checks made on the database file itself with a plain SQLite connection.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};
use tessera_store::sqlite::SqliteOptions;
use tessera_store::{
    Caller, ClaimOutcome, EnqueueOptions, FencingToken, Grant, IdempotencyKey, IssuedKey, KeySpec,
    ManualClock, Namespace, Output, QueueName, Retry, Scope, Store, StoreConfig, Submitted, TaskId,
    TaskRef,
};

#[path = "../common/mod.rs"]
mod common;

/// A store on a fresh file, a manual clock and an admin.
pub use common::Fixture as Setup;
// Each test binary uses its own part of the shared set-up.
#[allow(unused_imports)]
pub use common::{namespace, noon, queue};

/// The task id of task number `n`: `t-00042`.
pub fn task_id(n: usize) -> TaskId {
    TaskId::parse(&format!("t-{n:05}")).unwrap()
}

/// The number in a task id made by [`task_id`].
pub fn task_number(id: &str) -> usize {
    id.strip_prefix("t-").unwrap().parse().unwrap()
}

impl Setup {
    /// The store's default settings on this setup's clock.
    pub fn config(&self) -> StoreConfig {
        StoreConfig::default().with_clock(Arc::new(self.clock.clone()))
    }

    /// Closes the store and opens the file again with `config`.
    pub fn reopen(&mut self, config: StoreConfig) {
        self.reopen_with(SqliteOptions::file(self.path()), config);
    }

    /// Closes the store and opens the file again with SQLite `options`.
    pub fn reopen_with(&mut self, options: SqliteOptions, config: StoreConfig) {
        // Closed first, so the new store is the only one on the file.
        let placeholder = Store::open_in_memory(StoreConfig::default()).unwrap();
        drop(std::mem::replace(&mut self.store, placeholder));
        self.store = Store::open_sqlite(options, config).unwrap();
        self.admin = self.login(&self.admin_key);
    }

    pub fn key(&self, scopes: &[Scope], grant: Grant) -> IssuedKey {
        self.store
            .create_key(
                &self.admin,
                &KeySpec::keyed("acme")
                    .with_scopes(scopes.iter().copied())
                    .with_grant(grant),
            )
            .unwrap()
    }

    /// Enqueues tasks `from..to` (ids from [`task_id`]) with small JSON
    /// briefs.
    pub fn enqueue_range(
        &self,
        caller: &Caller,
        ns: &Namespace,
        q: &QueueName,
        from: usize,
        to: usize,
    ) {
        for n in from..to {
            self.store
                .enqueue(
                    caller,
                    ns,
                    q,
                    &tessera_store::Brief::Json(serde_json::json!({ "n": n })),
                    &EnqueueOptions::default().with_task_id(task_id(n)),
                )
                .unwrap();
        }
    }
}

impl Setup {
    /// Enqueues task number `n` (id from [`task_id`]) and returns it.
    pub fn enqueue_one(&self, caller: &Caller, ns: &Namespace, q: &QueueName, n: usize) -> TaskRef {
        self.store
            .enqueue(
                caller,
                ns,
                q,
                &tessera_store::Brief::Json(serde_json::json!({ "n": n })),
                &EnqueueOptions::default().with_task_id(task_id(n)),
            )
            .unwrap()
    }
}

/// `PRAGMA integrity_check` on the file, through a connection of its own.
pub fn integrity_check(path: &Path) -> String {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn.prepare("PRAGMA integrity_check").unwrap();
    let lines: Vec<String> = statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    lines.join("\n")
}

/// Every table's row count and a digest of all its rows, read through a
/// connection of its own: two equal snapshots mean nothing was written.
pub fn table_snapshot(path: &Path) -> BTreeMap<String, (u64, [u8; 32])> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut snapshot = BTreeMap::new();
    for table in tables {
        // A WITHOUT ROWID table has no rowid; it is read in its key order.
        let clustered: bool = conn
            .query_row(
                "SELECT wr FROM pragma_table_list WHERE name = ?1",
                [&table],
                |row| row.get(0),
            )
            .unwrap();
        let order = if clustered { "" } else { " ORDER BY rowid" };
        let mut statement = conn
            .prepare(&format!("SELECT * FROM \"{table}\"{order}"))
            .unwrap();
        let columns = statement.column_count();
        let mut rows = statement.query([]).unwrap();
        let mut hash = Sha256::new();
        let mut count = 0;
        while let Some(row) = rows.next().unwrap() {
            count += 1;
            for column in 0..columns {
                hash.update(format!("{:?}\u{1f}", row.get_ref(column).unwrap()).as_bytes());
            }
            hash.update(b"\x1e");
        }
        snapshot.insert(table, (count, hash.finalize().into()));
    }
    snapshot
}

/// Rows in `table`, through a connection of its own.
pub fn count_rows(path: &Path, table: &str) -> u64 {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |row| {
        row.get(0)
    })
    .unwrap()
}

/// The bytes of the database file and its WAL and shared-memory files.
pub fn database_bytes(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        if let Ok(content) = std::fs::read(PathBuf::from(name)) {
            bytes.extend(content);
        }
    }
    bytes
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// A small deterministic generator for kill points and choices; the seed
/// is printed so a failure can be replayed with `TESSERA_RELIABILITY_SEED`.
pub struct Rng(u64);

impl Rng {
    pub fn from_env_or_os() -> Self {
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

    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

// ---------------------------------------------------------------------------
// Worker child processes.
//
// A test binary runs itself again with `--exact child_process_entry`; the
// entry test reads its orders from the environment, works the queue and
// prints one line per event to stdout (line-buffered, so a line printed is a
// line the parent reads, even after SIGKILL).

const ENV_DB: &str = "TESSERA_RELIABILITY_DB";
const ENV_KEY: &str = "TESSERA_RELIABILITY_KEY";
const ENV_AT: &str = "TESSERA_RELIABILITY_AT";
const ENV_THREADS: &str = "TESSERA_RELIABILITY_THREADS";
const ENV_RETRIES: &str = "TESSERA_RELIABILITY_RETRIES";
const MARK: &str = "@tessera ";

/// The namespace and queue every child works.
pub fn work_namespace() -> Namespace {
    namespace("farm")
}

pub fn work_queue() -> QueueName {
    queue("frames")
}

/// What a child is told.
#[derive(Debug, Clone)]
pub struct ChildOrders {
    pub db: PathBuf,
    pub key: String,
    /// The child's clock reads this time throughout.
    pub at: DateTime<Utc>,
    pub threads: usize,
    /// Whether some grants are failed with a zero retry backoff, so their
    /// task is granted again (see [`grants_for`]).
    pub retries: bool,
}

/// How many grants a task gets when children fail some on purpose: task
/// numbers divisible by 3 are failed once, by 9 twice, before the grant
/// that submits.
pub fn grants_for(task: usize) -> i64 {
    1 + i64::from(task % 3 == 0) + i64::from(task % 9 == 0)
}

/// Starts the test binary again as a worker child.
pub fn spawn_child(orders: &ChildOrders) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_DB, &orders.db)
        .env(ENV_KEY, &orders.key)
        .env(ENV_AT, orders.at.to_rfc3339())
        .env(ENV_THREADS, orders.threads.to_string())
        .env(ENV_RETRIES, if orders.retries { "1" } else { "0" })
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// One event a child reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
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

    pub fn task(&self) -> &str {
        match self {
            Self::Grant { task, .. } | Self::Fail { task, .. } | Self::Ack { task, .. } => task,
        }
    }
}

/// Reads a child's events until `stop` says so (returning `true`) or its
/// stdout ends. Only whole lines count: a line cut short by a kill is
/// dropped.
pub fn read_events(
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
pub fn output_for(task: &str, token: FencingToken) -> Output {
    Output::bytes(format!("{task} rendered under token {token}"))
}

/// The body of the `child_process_entry` test: does nothing unless run as
/// a child by [`spawn_child`].
pub fn child_main() {
    let Ok(db) = std::env::var(ENV_DB) else {
        return;
    };
    let env = |name: &str| std::env::var(name).unwrap();
    let at: DateTime<Utc> = env(ENV_AT).parse().unwrap();
    let threads: usize = env(ENV_THREADS).parse().unwrap();
    let retries = env(ENV_RETRIES) == "1";
    let clock = ManualClock::new(at);
    let store = Store::open_sqlite(
        // Other processes hold the write lock in turn; waiting for it is
        // the normal case here, not a fault.
        SqliteOptions::file(&db).with_busy_timeout(Duration::from_secs(120)),
        StoreConfig::default().with_clock(Arc::new(clock)),
    )
    .unwrap();
    let caller = store.authenticate(Some(&env(ENV_KEY))).unwrap();
    let (ns, q) = (work_namespace(), work_queue());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| work(&store, &caller, &ns, &q, retries));
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
