//! Where a store operation's time goes: for each operation, the time it
//! takes, the write transactions and rows it commits, and the pages it
//! appends to the write-ahead log (and which table or index each belongs
//! to), beside raw SQLite commits that append a known number of pages.
//!
//! Run: `cargo run --release -p tessera-benches --bin store_profile [OPERATION] [COUNT]`
//!
//! `OPERATION` is `all` (the default), one of the names it prints, or
//! `claim_behind_100000` / `claim_behind_1000000` (a claim with that many
//! more tasks ready, seeded through the API first), optionally suffixed
//! `_10000_keys` (10,000 keys claiming in turn); `COUNT` (default 5,000) is
//! how many are timed. One operation alone is what
//! `strace -f -c` or `perf record` should watch.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tempfile::TempDir;
use tessera_store::{
    Brief, Caller, ClaimOutcome, Claimed, EnqueueOptions, Grant, IdempotencyKey, KeySpec,
    ManualClock, MeterSnapshot, Namespace, Output, QueueName, Scope, Store, StoreConfig, Submitted,
};

/// Bytes of one frame in the log: its header and one 4 KiB page.
const FRAME_BYTES: u64 = 24 + 4096;
/// The log's own header.
const LOG_HEADER_BYTES: u64 = 32;
/// Operations whose log pages are counted; few enough that the automatic
/// checkpoint (at 1,000 pages) cannot run in between.
const COUNTED: u64 = 60;
/// Operations run before anything is counted.
const WARM_UP: u64 = 200;

/// The pages in a database's write-ahead log.
fn log_frames(database: &Path) -> u64 {
    let mut log = database.as_os_str().to_owned();
    log.push("-wal");
    let bytes = std::fs::metadata(PathBuf::from(log)).map_or(0, |m| m.len());
    bytes.saturating_sub(LOG_HEADER_BYTES) / FRAME_BYTES
}

/// The page numbers of the frames in a database's write-ahead log, in log
/// order (a frame header starts with its page number, big-endian).
fn log_pages(database: &Path) -> Vec<u32> {
    let mut log = database.as_os_str().to_owned();
    log.push("-wal");
    let bytes = std::fs::read(PathBuf::from(log)).unwrap_or_default();
    bytes
        .get(LOG_HEADER_BYTES as usize..)
        .unwrap_or_default()
        .chunks_exact(FRAME_BYTES as usize)
        .map(|frame| u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]))
        .collect()
}

/// Which table or index each page of a checkpointed database file belongs
/// to, found by walking every b-tree from its root page (the file format's
/// page headers: 2 and 5 are interior pages whose cells start with a child
/// page number, the right-most child at header offset 8).
fn page_owners(database: &Path) -> HashMap<u32, String> {
    let conn = Connection::open(database).unwrap();
    let mut roots: Vec<(String, u32)> = conn
        .prepare("SELECT name, rootpage FROM sqlite_master WHERE rootpage > 0")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    roots.push(("sqlite_master".to_owned(), 1));
    let file = std::fs::read(database).unwrap();
    let page_size = match u16::from_be_bytes([file[16], file[17]]) {
        1 => 65_536,
        size => usize::from(size),
    };
    let u16_at = |at: usize| usize::from(u16::from_be_bytes([file[at], file[at + 1]]));
    let u32_at =
        |at: usize| u32::from_be_bytes([file[at], file[at + 1], file[at + 2], file[at + 3]]);
    let mut owners = HashMap::new();
    for (name, root) in roots {
        let mut pending = vec![root];
        while let Some(page) = pending.pop() {
            owners.insert(page, name.clone());
            let start = (page as usize - 1) * page_size;
            let header = start + if page == 1 { 100 } else { 0 };
            if matches!(file[header], 2 | 5) {
                pending.push(u32_at(header + 8));
                for cell in 0..u16_at(header + 3) {
                    pending.push(u32_at(start + u16_at(header + 12 + 2 * cell)));
                }
            }
        }
    }
    owners
}

/// Copies the log into the database and empties it, from a connection of
/// its own; tried again while the store's own checkpoint thread is
/// running one.
fn empty_log(database: &Path) {
    let conn = Connection::open(database).unwrap();
    for _ in 0..1_000 {
        let (busy, _, _): (i64, i64, i64) = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .unwrap();
        if busy == 0 {
            assert_eq!(log_frames(database), 0);
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the checkpoint stayed blocked");
}

/// Something to repeat, on its own database file.
trait Operation {
    fn database(&self) -> &Path;
    fn run(&mut self);
    fn meter(&self) -> MeterSnapshot {
        MeterSnapshot::default()
    }
}

/// `tables` rows, one in each of `tables` tables, in one `BEGIN IMMEDIATE`
/// transaction: a commit that appends `tables` pages to the log.
struct RawCommit {
    _dir: TempDir,
    path: PathBuf,
    conn: Connection,
    tables: usize,
}

impl RawCommit {
    fn new(tables: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        for table in 0..tables {
            conn.execute_batch(&format!(
                "CREATE TABLE t{table} (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)"
            ))
            .unwrap();
        }
        Self {
            _dir: dir,
            path,
            conn,
            tables,
        }
    }
}

impl Operation for RawCommit {
    fn database(&self) -> &Path {
        &self.path
    }

    fn run(&mut self) {
        self.conn
            .prepare_cached("BEGIN IMMEDIATE")
            .unwrap()
            .execute([])
            .unwrap();
        for table in 0..self.tables {
            self.conn
                .prepare_cached(&format!("INSERT INTO t{table} (value) VALUES (1)"))
                .unwrap()
                .execute([])
                .unwrap();
        }
        self.conn
            .prepare_cached("COMMIT")
            .unwrap()
            .execute([])
            .unwrap();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Enqueue,
    Claim,
    /// A claim with `ready` more tasks ready in its queue, by `keys` keys
    /// taking turns.
    ClaimBehind {
        ready: u64,
        keys: usize,
    },
    ClaimEmpty,
    Heartbeat,
    Submit,
}

/// One store operation, repeated on its own store.
struct StoreOperation {
    _dir: TempDir,
    path: PathBuf,
    clock: ManualClock,
    store: Store,
    worker: Caller,
    /// Who claims, in turn (the worker alone unless more keys are asked for).
    claimers: Vec<Caller>,
    turn: std::cell::Cell<usize>,
    namespace: Namespace,
    queue: QueueName,
    kind: Kind,
    held: Option<Claimed>,
    leases: Vec<Claimed>,
    submitted: u64,
}

impl StoreOperation {
    fn new(kind: Kind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tessera.db");
        // Moved on a millisecond per operation, so each heartbeat moves its
        // lease's expiry.
        let clock = ManualClock::new("2026-10-29T12:00:00Z".parse().unwrap());
        let config = StoreConfig::default()
            .with_clock(Arc::new(clock.clone()))
            .with_lease_duration(Duration::from_secs(3600));
        let store = Store::open(&path, config).unwrap();
        let admin_key = store.create_admin_key("operators").unwrap();
        let admin = store.authenticate(Some(admin_key.secret.expose())).unwrap();
        let namespace = Namespace::parse("bench").unwrap();
        let keys = match kind {
            Kind::ClaimBehind { keys, .. } => keys.max(1),
            _ => 1,
        };
        let claimers: Vec<Caller> = (0..keys)
            .map(|_| {
                let key = store
                    .create_key(
                        &admin,
                        &KeySpec::keyed("bench")
                            .with_scopes(Scope::ALL.iter().copied())
                            .with_grant(Grant::Namespace(namespace.clone())),
                    )
                    .unwrap();
                store.authenticate(Some(key.secret.expose())).unwrap()
            })
            .collect();
        let worker = claimers[0].clone();
        let mut operation = Self {
            _dir: dir,
            path,
            clock,
            store,
            worker,
            claimers,
            turn: std::cell::Cell::new(0),
            namespace,
            queue: QueueName::parse("profile").unwrap(),
            kind,
            held: None,
            leases: Vec::new(),
            submitted: 0,
        };
        if kind == Kind::Heartbeat {
            operation.enqueue();
            operation.held = Some(operation.claim());
        }
        operation
    }

    fn enqueue(&self) {
        self.clock.advance(Duration::from_millis(1));
        self.store
            .enqueue(
                &self.worker,
                &self.namespace,
                &self.queue,
                &Brief::Bytes(br#"{"frame":42}"#.to_vec()),
                &EnqueueOptions::default(),
            )
            .unwrap();
    }

    fn claim(&self) -> Claimed {
        let turn = (self.turn.get() + 1) % self.claimers.len();
        self.turn.set(turn);
        match self
            .store
            .claim(&self.claimers[turn], &self.namespace, &self.queue)
            .unwrap()
        {
            ClaimOutcome::Granted(claimed) => claimed,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    /// Work the timed operations consume: tasks to claim, leases to submit.
    fn prepare(&mut self, count: u64) {
        match self.kind {
            Kind::Claim => (0..count).for_each(|_| self.enqueue()),
            Kind::ClaimBehind { ready, .. } => (0..count + ready).for_each(|_| self.enqueue()),
            Kind::Submit => {
                for _ in 0..count {
                    self.enqueue();
                    let claimed = self.claim();
                    self.leases.push(claimed);
                }
            }
            _ => {}
        }
    }
}

impl Operation for StoreOperation {
    fn database(&self) -> &Path {
        &self.path
    }

    fn run(&mut self) {
        self.clock.advance(Duration::from_millis(1));
        match self.kind {
            Kind::Enqueue => self.enqueue(),
            Kind::Claim | Kind::ClaimBehind { .. } => drop(self.claim()),
            Kind::ClaimEmpty => {
                let empty = QueueName::parse("empty").unwrap();
                let outcome = self
                    .store
                    .claim(&self.worker, &self.namespace, &empty)
                    .unwrap();
                assert!(outcome.claimed().is_none());
            }
            Kind::Heartbeat => {
                let held = self.held.as_ref().unwrap();
                self.store
                    .heartbeat(&self.worker, &held.task, held.lease.token())
                    .unwrap();
            }
            Kind::Submit => {
                let claimed = self.leases.pop().expect("prepared");
                self.submitted += 1;
                let key = IdempotencyKey::parse(&format!("k{}", self.submitted)).unwrap();
                let submitted = self
                    .store
                    .submit(
                        &self.worker,
                        &claimed.task,
                        claimed.lease.token(),
                        &key,
                        &Output::bytes(b"rendered".to_vec()),
                    )
                    .unwrap();
                assert!(matches!(submitted, Submitted::Accepted(_)));
            }
        }
    }

    fn meter(&self) -> MeterSnapshot {
        self.store.meter()
    }
}

struct Profile {
    name: String,
    per_operation: Duration,
    frames: f64,
    /// Log pages per operation by table or index (`sqlite_master` is page
    /// 1, which also holds the file's page count).
    pages: String,
    meter: MeterSnapshot,
    count: u64,
}

/// Warms the statement caches and pages, counts the log pages of a few
/// operations, then times `count` of them.
fn profile(name: &str, mut operation: impl Operation, count: u64) -> Profile {
    for _ in 0..WARM_UP {
        operation.run();
    }
    empty_log(operation.database());
    for _ in 0..COUNTED {
        operation.run();
    }
    let written = log_pages(operation.database());
    // Checkpointed, so the file holds every b-tree page the log touched.
    empty_log(operation.database());
    let owners = page_owners(operation.database());
    let mut per_owner: Vec<(String, usize)> = Vec::new();
    for page in &written {
        let owner = owners
            .get(page)
            .cloned()
            .unwrap_or_else(|| "other".to_owned());
        match per_owner.iter_mut().find(|(name, _)| *name == owner) {
            Some((_, pages)) => *pages += 1,
            None => per_owner.push((owner, 1)),
        }
    }
    per_owner.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let pages = per_owner
        .iter()
        .map(|(name, pages)| format!("{name} {:.1}", *pages as f64 / COUNTED as f64))
        .collect::<Vec<_>>()
        .join(", ");
    let before = operation.meter();
    let began = Instant::now();
    for _ in 0..count {
        operation.run();
    }
    let elapsed = began.elapsed();
    Profile {
        name: name.to_owned(),
        per_operation: elapsed / u32::try_from(count).unwrap_or(u32::MAX),
        frames: written.len() as f64 / COUNTED as f64,
        pages,
        meter: operation.meter().since(&before),
        count,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let only = args.next().unwrap_or_else(|| "all".to_owned());
    let count: u64 = args.next().map_or(5_000, |text| text.parse().unwrap());
    let raw = [1, 2, 4, 8, 16];
    let stores = [
        ("enqueue", Kind::Enqueue),
        ("claim", Kind::Claim),
        ("claim_empty", Kind::ClaimEmpty),
        ("heartbeat", Kind::Heartbeat),
        ("submit", Kind::Submit),
    ];
    // Seeding a million tasks through the API takes a minute or two, so
    // these run only when named.
    let behind = [100_000, 1_000_000].into_iter().flat_map(|ready| {
        [1, 10_000].map(|keys| {
            let name = match keys {
                1 => format!("claim_behind_{ready}"),
                _ => format!("claim_behind_{ready}_{keys}_keys"),
            };
            (name, Kind::ClaimBehind { ready, keys })
        })
    });
    let mut profiles = Vec::new();
    for tables in raw {
        let name = format!("raw_commit_{tables}_pages");
        if only == "all" || only == name {
            profiles.push(profile(&name, RawCommit::new(tables), count));
        }
    }
    for (name, kind) in stores {
        if only == "all" || only == name {
            let mut operation = StoreOperation::new(kind);
            operation.prepare(WARM_UP + COUNTED + count + 1);
            profiles.push(profile(name, operation, count));
        }
    }
    for (name, kind) in behind {
        if only == name {
            let mut operation = StoreOperation::new(kind);
            operation.prepare(WARM_UP + COUNTED + count + 1);
            profiles.push(profile(&name, operation, count));
        }
    }
    if profiles.is_empty() {
        eprintln!("unknown operation {only}");
        std::process::exit(2);
    }
    println!(
        "| operation | time | log pages | write transactions | rows written | rows read | log pages by table or index |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
    for p in profiles {
        let per = |total: u64| total as f64 / p.count as f64;
        println!(
            "| {} | {:.1} µs | {:.1} | {:.2} | {:.1} | {:.1} | {} |",
            p.name,
            p.per_operation.as_secs_f64() * 1e6,
            p.frames,
            per(p.meter.write_transactions),
            per(p.meter.rows_written),
            per(p.meter.rows_read),
            p.pages,
        );
    }
}
