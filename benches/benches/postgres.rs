//! PostgreSQL store benchmarks: the cost of each operation on a real
//! server, beside the cheapest durable write that server can do.
//!
//! Run: `TESSERA_BENCH_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo bench -p tessera-benches --bench postgres -- --warm-up-time 1 --measurement-time 3`
//!
//! The server is `TESSERA_BENCH_POSTGRES_URL`, else
//! `TESSERA_TEST_POSTGRES_URL`; without either the bench says it skipped
//! and exits. Each group runs in a schema of its own, `bench_<pid>_<group>`,
//! dropped with everything in it (the baseline's table too) when the
//! group ends. Every store is opened by `Store::open_postgres` with the
//! store's default PostgreSQL settings, except a pool of at least one
//! connection per thread, and a one-hour lease, so no lease lapses during
//! a run. Its clock is a `ManualClock` moved on by a millisecond before
//! each operation, so every heartbeat really moves its lease's expiry.
//!
//! - `postgres_1_thread/minimal_commit`: the baseline. One row inserted
//!   into a table without secondary indexes, one `BEGIN` … `COMMIT`
//!   transaction per row, on the same server with its own settings
//!   (`synchronous_commit = on`), through a pool of clients with the
//!   insert prepared once on each. Nothing durable is cheaper.
//! - `postgres_1_thread/enqueue`, `claim`, `heartbeat`, `submit`: one
//!   operation through the public API, by a caller authenticated once.
//!   `claim` is admitted at once and runs the lease transaction; its tasks
//!   are enqueued before the timed run. `heartbeat` extends one lease again
//!   and again. `submit` hands in a fresh idempotency key on a lease taken
//!   before the timed run.
//! - `postgres_1_thread/lifecycle`: enqueue, claim, heartbeat and submit
//!   of one task.
//! - `postgres_8_threads/*`: the same, run by 8 threads at once, each with
//!   its own key and queue; one iteration is one operation on each thread,
//!   timed from their common start to the last one's finish. The
//!   baseline's 8 threads share a pool of 8 clients.
//!
//! Several processes claiming from one queue: the `postgres_processes`
//! binary.

use std::hint::black_box;
use std::sync::Arc;

use criterion::Criterion;
use tessera_benches::{
    MinimalCommit, PostgresSchema, StoreFixture, on_threads, operations_on_one_thread,
    operations_on_threads, postgres_url,
};
use tessera_store::Store;
use tessera_store::postgres::PostgresOptions;

/// Threads in the contended group.
const THREADS: usize = 8;

/// A store in a schema of its own, with workers that hold every scope in
/// one namespace, and the baseline in the same schema.
struct Fixture {
    // Fields drop in order: the store's connections close before the
    // schema is dropped.
    on: StoreFixture,
    baseline: MinimalCommit,
    _schema: PostgresSchema,
}

impl Fixture {
    fn new(url: &str, group: &str, threads: usize) -> Self {
        let schema = PostgresSchema::fresh(url, format!("bench_{}_{group}", std::process::id()));
        let options = PostgresOptions::new(url).with_schema(schema.name());
        let pool_size = options.pool_size().max(threads as u32);
        let options = options.with_pool_size(pool_size);
        let on = StoreFixture::new(threads, |config| {
            Store::open_postgres(options, config).unwrap()
        });
        let baseline = MinimalCommit::create(&schema, threads as u32);
        Self {
            on,
            baseline,
            _schema: schema,
        }
    }
}

impl std::ops::Deref for Fixture {
    type Target = StoreFixture;

    fn deref(&self) -> &StoreFixture {
        &self.on
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut StoreFixture {
        &mut self.on
    }
}

fn one_thread(c: &mut Criterion, url: &str) {
    let mut f = Fixture::new(url, "1_thread", 1);
    let mut group = c.benchmark_group("postgres_1_thread");

    let mut value = 0;
    group.bench_function("minimal_commit", |b| {
        b.iter(|| {
            value += 1;
            f.baseline.commit(black_box(value));
        })
    });

    operations_on_one_thread(&mut group, &mut f);
    group.finish();
}

fn eight_threads(c: &mut Criterion, url: &str) {
    let f = Arc::new(Fixture::new(url, "8_threads", THREADS));
    let mut group = c.benchmark_group("postgres_8_threads");

    group.bench_function("minimal_commit", |b| {
        b.iter_custom(|iterations| {
            on_threads(
                THREADS,
                iterations,
                |_, iterations| iterations,
                |_, iterations| {
                    for n in 0..iterations {
                        f.baseline.commit(black_box(n as i64));
                    }
                },
            )
        })
    });

    operations_on_threads(&mut group, &f, THREADS);
    group.finish();
}

fn main() {
    let Some(url) = postgres_url() else {
        println!(
            "skipping the PostgreSQL benches: neither TESSERA_BENCH_POSTGRES_URL nor TESSERA_TEST_POSTGRES_URL is set"
        );
        return;
    };
    let mut criterion = Criterion::default().configure_from_args();
    one_thread(&mut criterion, &url);
    eight_threads(&mut criterion, &url);
    criterion.final_summary();
}
