"""The Python client against a real tessera-server.

1. Its models and requests against the server's `/v1/openapi.json`: each
   route it calls exists with its method, each answer's required fields
   are the ones its model lists, and each field it sends is one the route
   takes; a changed route fails here.
2. Its worker loops, `Worker` (threads) and `AsyncWorker` (asyncio), each
   processing TASKS tasks from 8 workers while the server is killed and
   started again in the middle: every task done once in the store, one
   accepted receipt per task, none doubled.

usage: against_server.py SERVER_BINARY [TASKS]
On PostgreSQL too when TESSERA_TEST_POSTGRES_URL is set.
"""

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

from tessera_client import (AsyncClient, AsyncWorker, Claimed, Client, Conflict, Enqueued, Health,
                            Lease, Receipt, Worker)

BINARY = sys.argv[1]
TASKS = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
WORKERS = 8
NS = "pyclient"


def check(condition, what):
    if not condition:
        raise SystemExit(f"python client: FAILED: {what}")
    print(f"ok: {what}")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """tessera-server on a port of its own, killed and started again on it."""

    def __init__(self, work, backend_args):
        self.work, self.args, self.port = work, backend_args, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = None

    def start(self):
        out = open(os.path.join(self.work, "out"), "ab")
        self.process = subprocess.Popen(
            [BINARY, "--port", str(self.port), "--admin-key-file",
             os.path.join(self.work, "admin.key"), *self.args],
            stdout=out, stderr=subprocess.STDOUT)
        for _ in range(200):
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise SystemExit("python client: the server did not start")

    def kill(self):
        self.process.kill()
        self.process.wait()

    def admin(self):
        with open(os.path.join(self.work, "admin.key")) as key:
            return key.read().strip()


def required(spec, path, method, status):
    schema = spec["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
    return set(schema.get("required", []))


def body_properties(spec, path, method):
    body = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return set(body["properties"])


def check_models(base):
    spec = httpx.get(f"{base}/v1/openapi.json").json()
    tasks = "/v1/ns/{ns}/queues/{queue}/tasks"
    lease = "/v1/ns/{ns}/tasks/{task}/heartbeat"
    submit = "/v1/ns/{ns}/tasks/{task}/submit"
    claim = "/v1/ns/{ns}/queues/{queue}/claims"
    check(required(spec, tasks, "post", "201") == set(Enqueued.REQUIRED), "Enqueued is enqueue's answer")
    check(required(spec, claim, "post", "200") == set(Claimed.REQUIRED), "Claimed is a claim's answer")
    check(set(spec["paths"][claim]["post"]["responses"]) >= {"200", "204", "429"},
          "a claim answers 200, 204 or 429")
    check(required(spec, lease, "post", "200") == set(Lease.REQUIRED), "Lease is a heartbeat's answer")
    check(required(spec, submit, "post", "200") == set(Receipt.REQUIRED), "Receipt is a submission's answer")
    check(required(spec, "/v1/ns/{ns}/health", "get", "200") == set(Health.REQUIRED), "Health is health's answer")
    check(body_properties(spec, lease, "post") >= {"token", "version", "progress"}, "heartbeat's body")
    check(body_properties(spec, submit, "post") >= {"token", "version", "output"}, "submit's body")
    check(body_properties(spec, "/v1/ns/{ns}/tasks/{task}/fail", "post")
          >= {"token", "version", "retry", "error", "after_ms"}, "fail's body")
    check(body_properties(spec, "/v1/ns/{ns}/queues/{queue}/wait", "post") >= {"timeout_ms"},
          "wait's body")
    check(body_properties(spec, tasks, "post") >= {"brief", "id", "priority", "not_before", "unique"},
          "enqueue's body")
    headers = {p["name"] for p in spec["paths"][submit]["post"]["parameters"] if p["in"] == "header"}
    check("Idempotency-Key" in headers, "a submission's Idempotency-Key header")


def make_key(server):
    body = {"account": "py-worker", "scopes": ["enqueue", "claim", "read"],
            "grants": [f"namespace:{NS}"]}
    reply = httpx.post(f"{server.base}/v1/keys", json=body,
                       headers={"Authorization": f"Bearer {server.admin()}"})
    reply.raise_for_status()
    return reply.json()["key"]


def restart_midway(server, count_done, total, label):
    """Kills the server once about half the tasks are done, then starts it
    again on the same port and storage."""
    while count_done() < total // 2:
        time.sleep(0.01)
    server.kill()
    time.sleep(0.3)
    server.start()
    print(f"ok: {label}: the server was killed at {count_done()} of {total} done and started again")


def check_store(client, queue, stats, handled, label, before):
    health = client.health(NS).attempts
    check(health.get("done") == before.get("done", 0) + TASKS and not health.get("leased")
          and health.get("ready", 0) == before.get("ready", 0),
          f"{label}: the store holds {health.get('done', 0) - before.get('done', 0)} more done,"
          f" none more ready, none leased")
    receipts = stats.receipts
    per_task = {}
    for receipt in receipts:
        per_task.setdefault(receipt.task.id, set()).add((receipt.attempt, receipt.token))
    doubled = [task for task, leases in per_task.items() if len(leases) > 1]
    check(len(per_task) == TASKS and not doubled and stats.done == TASKS,
          f"{label}: {TASKS} tasks acknowledged once each ({stats.lost} leases lost and redone,"
          f" {stats.waits} waits)")
    sample = sorted(per_task)[:: max(1, TASKS // 50)]
    for task in sample:
        detail = client.read_task(NS, task)
        states = [attempt["state"]["state"] for attempt in detail["record"]["attempts"]]
        if states != ["done"]:
            raise SystemExit(f"python client: FAILED: {label}: {task} is {states} in the store")
    check(set(handled) >= set(per_task), f"{label}: every acknowledged task was worked on")


def run_sync(server, key):
    client = Client(server.base, key)
    for n in range(TASKS):
        client.enqueue(NS, "sync", {"n": n}, id=f"sync-{n}")
    handled = []
    lock = threading.Lock()

    def handler(task):
        with lock:
            handled.append(task.task.id)
        return {"n": task.brief["n"], "squared": task.brief["n"] ** 2}

    before = client.health(NS).attempts
    before["ready"] = before.get("ready", 0) - TASKS
    worker = Worker(client, NS, "sync", handler, wait=1.0)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (worker.run(threads=WORKERS), done.set()))
    runner.start()
    restart_midway(server, lambda: worker.stats.done, TASKS, "sync")
    deadline = time.time() + 300
    while worker.stats.done < TASKS and time.time() < deadline:
        time.sleep(0.05)
    worker.stop.set()
    runner.join()
    check_store(client, "sync", worker.stats, handled, "Worker, 8 threads", before)
    return client


async def run_async(server, key):
    async with AsyncClient(server.base, key) as client:
        for n in range(TASKS):
            await client.enqueue(NS, "async", {"n": n}, id=f"async-{n}")
        handled = []

        async def handler(task):
            handled.append(task.task.id)
            await asyncio.sleep(0)
            return {"n": task.brief["n"]}

        before = (await client.health(NS)).attempts
        before["ready"] = before.get("ready", 0) - TASKS
        worker = AsyncWorker(client, NS, "async", handler, wait=1.0)
        running = asyncio.create_task(worker.run(tasks=WORKERS))
        restart = asyncio.get_running_loop().run_in_executor(
            None, restart_midway, server, lambda: worker.stats.done, TASKS, "async")
        deadline = time.time() + 300
        while worker.stats.done < TASKS and time.time() < deadline:
            await asyncio.sleep(0.05)
        worker.stop.set()
        await restart
        await running
    check_store(Client(server.base, key), "async", worker.stats, handled, "AsyncWorker, 8 tasks",
                before)


def stale_submission_is_a_conflict(server, key):
    client = Client(server.base, key)
    client.enqueue(NS, "stale", {}, id="stale-1")
    claimed = client.claim(NS, "stale")
    old = claimed.lease
    client.submit(old, {"ok": 1}, "once")
    again = client.submit(old, {"ok": 1}, "once")
    check(again.digest == client.submit(old, {"ok": 1}, "once").digest,
          "a submission again under its key answers the same receipt")
    try:
        client.submit(old, {"ok": 2}, "once")
        check(False, "another payload under the same key is a conflict")
    except Conflict as error:
        check(error.status == 409, f"another payload under the same key is a 409 ({error.code})")


def handlers_that_misbehave(server, key):
    """A handler longer than its lease, one that raises with text the
    server would refuse as is, one whose result is not JSON, and a paused
    queue: each task ends once, the loop goes on, and nothing spins."""
    client = Client(server.base, key)
    client.enqueue(NS, "slow", {"n": 1}, id="slow-1", lease_ms=1500)
    runs = []

    def slow(task):
        runs.append(task.task.id)
        time.sleep(5)  # over three lease lengths: only heartbeats keep it
        return {"slow": True}

    worker = Worker(client, NS, "slow", slow, wait=0.5)
    worker.run(threads=2, until_empty=True)
    check(runs == ["slow-1"] and worker.stats.done == 1 and worker.stats.lost == 0,
          f"a handler three leases long is run once and submitted ({worker.stats.done} done,"
          f" {worker.stats.lost} lost)")

    for n, kind in enumerate(["raises", "unencodable", "fine"]):
        client.enqueue(NS, "odd", {"kind": kind}, id=f"odd-{n}", max_tries=1)

    def odd(task):
        if task.brief["kind"] == "raises":
            raise KeyError("clé\nwith\ta newline")
        if task.brief["kind"] == "unencodable":
            return {"when": object()}
        return {"ok": True}

    worker = Worker(client, NS, "odd", odd, wait=0.5)
    worker.run(threads=1, until_empty=True)
    check(worker.stats.failed == 2 and worker.stats.done == 1,
          f"a raising handler and an unencodable result fail their tasks and the loop goes on"
          f" ({worker.stats.failed} failed, {worker.stats.done} done)")
    detail = client.read_task(NS, "odd-0")
    error = detail["record"]["attempts"][0].get("last_error") or ""
    check("KeyError" in error and "\\n" in error, f"the failure's text, escaped: {error!r}")

    client.enqueue(NS, "held", {}, id="held-1")
    admin = {"Authorization": f"Bearer {server.admin()}"}
    httpx.put(f"{server.base}/v1/ns/{NS}/queues/held/pause", headers=admin).raise_for_status()
    worker = Worker(client, NS, "held", lambda task: {}, wait=0.5)
    stopper = threading.Timer(2.0, worker.stop.set)
    stopper.start()
    worker.run(threads=2)
    check(worker.stats.empty <= 4 and worker.stats.claimed == 0,
          f"a paused queue is waited out, not polled ({worker.stats.empty} claims in 2 s"
          f" from 2 threads)")
    httpx.put(f"{server.base}/v1/ns/{NS}/queues/held/resume", headers=admin).raise_for_status()


def backend(label, args):
    with tempfile.TemporaryDirectory() as work:
        server = Server(work, args(work))
        server.start()
        try:
            check_models(server.base)
            key = make_key(server)
            stale_submission_is_a_conflict(server, key)
            handlers_that_misbehave(server, key)
            run_sync(server, key)
            asyncio.run(run_async(server, key))
        finally:
            server.kill()
        print(f"python client on {label}: passed")


def check_refusals():
    """Which refusals the worker waits out, and for how long."""
    import datetime
    import random

    from tessera_client._errors import QuotaExhausted, TesseraError, Unavailable, error_of
    from tessera_client._worker import pause_for

    def body(code):
        return {"error": {"code": code, "message": "x"}}

    check(isinstance(error_of(500, body("storage_error"), None), Unavailable),
          "a 500 storage_error is waited out")
    check(type(error_of(500, body("corrupt_database"), None)) is TesseraError,
          "another 500 is not")
    check(isinstance(error_of(408, body("request_timeout"), None), Unavailable),
          "a 408 is waited out")
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    past = QuotaExhausted(503, "storage_quota_exhausted", "x", 5, now - datetime.timedelta(seconds=10))
    check(5 <= pause_for(past, 1, random.Random(1), now) <= 6,
          "a spent allowance whose reset_at this clock has passed still waits its Retry-After")


def main():
    check_refusals()
    backend("SQLite", lambda work: ["--db", os.path.join(work, "tessera.db")])
    url = os.environ.get("TESSERA_TEST_POSTGRES_URL")
    if url:
        schema = f"pyclient_{os.getpid()}"
        backend("PostgreSQL", lambda work: ["--postgres", url, "--schema", schema])
    else:
        print("python client on PostgreSQL: skipped (TESSERA_TEST_POSTGRES_URL is not set)")


if __name__ == "__main__":
    main()
