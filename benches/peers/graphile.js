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
"use strict";

const { Logger, makeWorkerUtils, run, runMigrations } = require("graphile-worker");

const connectionString = process.env.DATABASE_URL;
const logger = new Logger(() => () => {});
const LOCAL_QUEUE = 100;

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
  return { jobs, seconds: elapsed };
}

async function processJobs(jobs, workers, batched) {
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const taskList = {
    noop: async () => {
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
  const { rows } = await utils.withPgClient((client) =>
    client.query("SELECT count(*)::int AS left FROM graphile_worker._private_jobs"),
  );
  await utils.release();
  if (rows[0].left !== 0) throw new Error(`${rows[0].left} jobs left after processing`);
  return { jobs: done, seconds: elapsed };
}

async function main() {
  const [mode, ...args] = process.argv.slice(2);
  const numbers = args.map(Number);
  let result;
  if (mode === "reset") result = await reset();
  else if (mode === "enqueue") result = await enqueue(numbers[0], numbers[1]);
  else if (mode === "process") result = await processJobs(numbers[0], numbers[1], args[2] === "batched");
  else throw new Error(`unknown mode ${mode}`);
  result.version = require("graphile-worker/package.json").version;
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
