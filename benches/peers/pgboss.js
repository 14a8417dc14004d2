// pg-boss's side of the `peers` bench (benches/src/bin/peers.rs), which runs
// this once per step, as it runs graphile.js, and reads the one JSON line it
// prints.
//
//   node pgboss.js reset
//   node pgboss.js enqueue JOBS PER_CALL       (PER_CALL 1: send, else insert)
//   node pgboss.js process JOBS WORKERS [batched]
//
// DATABASE_URL names the database; pg-boss keeps its tables in the schema
// pgboss, the jobs in one queue of the standard policy. `reset` drops the
// schema and has pg-boss create it and the queue again.
//
// `process` runs `work()` with `localConcurrency` = WORKERS and `batchSize`
// 1 (one job a fetch, completed alone), or 100 when `batched` (one fetch and
// one completion for up to 100 jobs), until the JOBS no-op jobs already
// queued are done, then a graceful `stop()`, which waits for every
// completion. The time counted is from `start()` to the end of `stop()`.
// A pg-boss worker waits `pollingIntervalSeconds` (0.5 s at the least)
// after every fetch unless it is in burst mode, which it is while its
// fetches come back full and either `burstWhenBatchFull` (for a batch of
// more than one) or the queue's cached ready count is over
// `burstWhenReadyExceeds`; both are set, so a worker fetches again at once
// while jobs are left. The cached count is what pg-boss's supervisor last
// counted, so before the timed part one `supervise()` of the queue counts
// the jobs just enqueued, as pg-boss's own supervisor would within a
// minute. Each instance runs with its supervisor, scheduler and instance
// registry off, so that no timer of theirs writes during a step.
//
// With TESSERA_PEERS_DEBUG set, the line also says what `SHOW
// synchronous_commit` answers on a connection of pg-boss's pool.
//
// pg-boss 12 is an ES module: it is found through NODE_PATH
// (`require.resolve`) and loaded with `import()`.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");
const { pathToFileURL } = require("node:url");

const connectionString = process.env.DATABASE_URL;
const PACKAGE = "pg-boss";
const SCHEMA = "pgboss";
const QUEUE = "noop";
const BATCH = 100;
const QUIET = { supervise: false, schedule: false, registerInstance: false };

let PgBoss, pg, version;
let failure;

function seconds(since) {
  return Number(process.hrtime.bigint() - since) / 1e9;
}

/** Loads pg-boss, and the `pg` it uses. */
async function load() {
  const main = require.resolve(PACKAGE);
  ({ PgBoss } = await import(pathToFileURL(main).href));
  pg = createRequire(main)("pg");
  const marker = `${path.sep}node_modules${path.sep}${PACKAGE}${path.sep}`;
  const root = main.slice(0, main.lastIndexOf(marker) + marker.length);
  version = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")).version;
}

/** An instance on DATABASE_URL; its first error fails the step. */
function boss(options = {}) {
  const instance = new PgBoss({ connectionString, schema: SCHEMA, migrate: false, ...QUIET, ...options });
  instance.on("error", (error) => {
    console.error(error);
    failure = failure || error;
  });
  return instance;
}

/** `SHOW synchronous_commit` on a connection of the pool, for a debug run. */
async function synchronousCommit(instance) {
  if (!process.env.TESSERA_PEERS_DEBUG) return undefined;
  const { rows } = await instance.getDb().executeSql("SHOW synchronous_commit");
  return rows[0].synchronous_commit;
}

/** Runs `sql` on a connection of its own. */
async function query(sql, values) {
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    return (await client.query(sql, values)).rows;
  } finally {
    await client.end();
  }
}

async function reset() {
  await query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`);
  const instance = boss({ migrate: true });
  await instance.start();
  await instance.createQueue(QUEUE);
  await instance.stop();
  return {};
}

async function enqueue(jobs, perCall) {
  const instance = boss();
  await instance.start();
  const setting = await synchronousCommit(instance);
  const began = process.hrtime.bigint();
  if (perCall === 1) {
    for (let n = 0; n < jobs; n++) {
      await instance.send(QUEUE, { frame: 42 });
    }
  } else {
    for (let n = 0; n < jobs; n += perCall) {
      const specs = [];
      for (let k = 0; k < Math.min(perCall, jobs - n); k++) {
        specs.push({ data: { frame: 42 } });
      }
      await instance.insert(QUEUE, specs);
    }
  }
  const elapsed = seconds(began);
  await instance.stop();
  return { jobs, seconds: elapsed, synchronous_commit: setting };
}

async function processJobs(jobs, workers, batched) {
  // The supervisor's count of the queue, which the workers' burst mode
  // reads when they start.
  const supervisor = boss();
  await supervisor.start();
  await supervisor.supervise(QUEUE);
  await supervisor.stop();

  let done = 0;
  let setting;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const options = {
    batchSize: batched ? BATCH : 1,
    localConcurrency: workers,
    pollingIntervalSeconds: 0.5,
    burstWhenReadyExceeds: 1,
    burstWhenBatchFull: true,
  };
  const began = process.hrtime.bigint();
  const instance = boss({ max: Math.max(10, workers + 2) });
  await instance.start();
  await instance.work(QUEUE, options, async (batch) => {
    if (process.env.TESSERA_PEERS_DEBUG && setting === undefined) {
      setting = "";
      setting = await synchronousCommit(instance);
    }
    done += batch.length;
    if (done >= jobs) finish();
  });
  await finished;
  await instance.stop({ graceful: true });
  const elapsed = seconds(began);

  const [{ left }] = await query(
    `SELECT count(*)::int AS left FROM ${SCHEMA}.job WHERE name = $1 AND state <> 'completed'`,
    [QUEUE],
  );
  if (left !== 0) throw new Error(`${left} jobs left after processing`);
  if (done !== jobs) throw new Error(`${done} jobs processed, not ${jobs}`);
  return { jobs: done, seconds: elapsed, synchronous_commit: setting };
}

async function main() {
  const [mode, ...args] = process.argv.slice(2);
  const numbers = args.map(Number);
  await load();
  let result;
  if (mode === "reset") result = await reset();
  else if (mode === "enqueue") result = await enqueue(numbers[0], numbers[1]);
  else if (mode === "process") result = await processJobs(numbers[0], numbers[1], args[2] === "batched");
  else throw new Error(`unknown mode ${mode}`);
  if (failure) throw failure;
  result.version = version;
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
