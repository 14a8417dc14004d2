// graphile-worker's side of the `peers` bench (benches/src/bin/peers.rs),
// which runs this once per step and reads the one JSON line it prints.
//
//   node graphile.js reset
//   node graphile.js enqueue JOBS PER_CALL       (PER_CALL 1: addJob, else addJobs)
//   node graphile.js process JOBS WORKERS [batched]
//
// DATABASE_URL names the database; the jobs go to the schema graphile_worker.
// `process` runs the stock `run()` with `concurrentJobs` = WORKERS until the
// JOBS no-op jobs already queued are done, then stops it, which waits for
// every completion; `batched` adds a local queue of 100 and batched
// completions. The time counted is from `run()` to the end of `stop()`.
// With TESSERA_PEERS_DEBUG set, the line also says what `SHOW
// synchronous_commit` answers on a connection of graphile-worker's pool.
//
// graphile-worker 0.18 is an ES module: it is found through NODE_PATH
// (`require.resolve`) and loaded with `import()`.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { pathToFileURL } = require("node:url");

const connectionString = process.env.DATABASE_URL;
const LOCAL_QUEUE = 100;
const PACKAGE = "graphile-worker";

let Logger, makeWorkerUtils, run, runMigrations, logger;

/** Loads the package; returns its version. */
async function load() {
  const main = require.resolve(PACKAGE);
  ({ Logger, makeWorkerUtils, run, runMigrations } = await import(pathToFileURL(main).href));
  logger = new Logger(() => () => {});
  const marker = `${path.sep}node_modules${path.sep}${PACKAGE}${path.sep}`;
  const root = main.slice(0, main.lastIndexOf(marker) + marker.length);
  return JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")).version;
}

/** `SHOW synchronous_commit` on a connection of the pool, for a debug run. */
async function synchronousCommit(utils) {
  const { rows } = await utils.withPgClient((client) => client.query("SHOW synchronous_commit"));
  return rows[0].synchronous_commit;
}

function seconds(since) {
  return Number(process.hrtime.bigint() - since) / 1e9;
}

async function reset() {
  const utils = await makeWorkerUtils({ connectionString, logger });
  await utils.withPgClient((client) => client.query("DROP SCHEMA IF EXISTS graphile_worker CASCADE"));
  await utils.release();
  await runMigrations({ connectionString, logger });
  return {};
}

async function enqueue(jobs, perCall) {
  const utils = await makeWorkerUtils({ connectionString, logger });
  await utils.migrate();
  const setting = process.env.TESSERA_PEERS_DEBUG ? await synchronousCommit(utils) : undefined;
  const began = process.hrtime.bigint();
  if (perCall === 1) {
    for (let n = 0; n < jobs; n++) {
      await utils.addJob("noop", { frame: 42 });
    }
  } else {
    for (let n = 0; n < jobs; n += perCall) {
      const specs = [];
      for (let k = 0; k < Math.min(perCall, jobs - n); k++) {
        specs.push({ identifier: "noop", payload: { frame: 42 } });
      }
      await utils.addJobs(specs);
    }
  }
  const elapsed = seconds(began);
  await utils.release();
  return { jobs, seconds: elapsed, synchronous_commit: setting };
}

async function processJobs(jobs, workers, batched) {
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  let setting;
  const taskList = {
    noop: async (_payload, helpers) => {
      if (process.env.TESSERA_PEERS_DEBUG && setting === undefined) {
        setting = "";
        const { rows } = await helpers.query("SHOW synchronous_commit");
        setting = rows[0].synchronous_commit;
      }
      done += 1;
      if (done === jobs) finish();
    },
  };
  const worker = {
    connectionString,
    concurrentJobs: workers,
    maxPoolSize: Math.max(10, workers + 2),
  };
  if (batched) {
    worker.localQueue = { size: LOCAL_QUEUE };
    worker.completeJobBatchDelay = 0;
  }
  const began = process.hrtime.bigint();
  const runner = await run({ preset: { worker }, taskList, logger, noHandleSignals: true });
  await finished;
  await runner.stop();
  const elapsed = seconds(began);
  const utils = await makeWorkerUtils({ connectionString, logger });
  // A last completion can still be on its way to the server when `stop()`
  // returns under load: the table is looked at again for up to 5 s
  // before a job left there counts as lost.
  let left = -1;
  for (let tries = 0; tries < 50 && left !== 0; tries += 1) {
    if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 100));
    const { rows } = await utils.withPgClient((client) =>
      client.query("SELECT count(*)::int AS left FROM graphile_worker._private_jobs"),
    );
    left = rows[0].left;
  }
  await utils.release();
  if (left !== 0) throw new Error(`${left} jobs left after processing`);
  if (done !== jobs) throw new Error(`${done} jobs processed, not ${jobs}`);
  return { jobs: done, seconds: elapsed, synchronous_commit: setting };
}

async function main() {
  const [mode, ...args] = process.argv.slice(2);
  const numbers = args.map(Number);
  const version = await load();
  let result;
  if (mode === "reset") result = await reset();
  else if (mode === "enqueue") result = await enqueue(numbers[0], numbers[1]);
  else if (mode === "process") result = await processJobs(numbers[0], numbers[1], args[2] === "batched");
  else throw new Error(`unknown mode ${mode}`);
  result.version = version;
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
