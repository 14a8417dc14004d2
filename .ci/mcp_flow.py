"""An MCP client not written here (the Python `mcp` SDK) runs a worker's
flow against a running tessera-server: list tools, enqueue, claim,
heartbeat, submit, an empty claim with retry_after, and a JSON-RPC batch of
20 claims that admission takes one call at a time, as its counters show;
then an operator's: every option of enqueue, a task's detail and
alternatives, retry, bulk actions, a queue's controls and schedules.

usage: mcp_flow.py BASE_URL ADMIN_KEY
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

BASE, ADMIN = sys.argv[1], sys.argv[2]
NAMESPACE, QUEUE = "flow", "frames"


def check(condition, what):
    if not condition:
        raise SystemExit(f"mcp flow: FAILED: {what}")
    print(f"ok: {what}")


def make_worker():
    body = {"account": "flow", "scopes": ["enqueue", "claim", "read"],
            "grants": [f"namespace:{NAMESPACE}"]}
    reply = httpx2.post(f"{BASE}/v1/keys", json=body,
                        headers={"Authorization": f"Bearer {ADMIN}"})
    reply.raise_for_status()
    return reply.json()["key"]


def metric(text, name):
    """The sum of a Prometheus metric's samples named exactly `name`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def structured(result):
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def flow(key):
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as client:
        async with streamable_http_client(f"{BASE}/mcp", http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.send_ping()
                tools = [tool.name for tool in (await session.list_tools()).tools]
                check({"enqueue", "claim", "heartbeat", "submit", "snooze", "cancel", "list_tasks",
                       "health", "audit"} <= set(tools), f"tools listed: {tools}")

                where = {"namespace": NAMESPACE, "queue": QUEUE}
                done = await session.call_tool("enqueue", {**where, "brief": {"frame": 1}, "id": "frame-1"})
                check(not done.is_error, "enqueue")

                claimed = await session.call_tool("claim", where)
                lease = structured(claimed)["lease"]
                check(not claimed.is_error and lease is not None, "claim granted a lease")
                held = {"namespace": NAMESPACE, "task": "frame-1", "token": lease["token"]}

                beat = await session.call_tool("heartbeat", held)
                check(not beat.is_error, "heartbeat")

                submitted = await session.call_tool(
                    "submit", {**held, "output": {"pixels": 42}, "idempotency_key": "frame-1-once"})
                check(not submitted.is_error and structured(submitted)["receipt"] is not None, "submit")

                stale = await session.call_tool("heartbeat", {**held, "token": lease["token"] + 7})
                check(stale.is_error and structured(stale)["status"] == 409
                      and "retry_after" in structured(stale) and "reset_at" in structured(stale),
                      "a stale token is the tool-error envelope")

                empty = await session.call_tool("claim", where)
                body = structured(empty)
                check(not empty.is_error and body["lease"] is None and body["retry_after"] >= 1,
                      f"an empty claim: lease null, retry_after {body['retry_after']}")

                for n in range(20):
                    await session.call_tool("enqueue", {**where, "brief": {"frame": n}, "id": f"batch-{n}"})

    # A batch of 20 claims: a JSON-RPC array, which the SDK's session does
    # not send, so it goes over the same transport by hand.
    before = httpx2.get(f"{BASE}/metrics").text
    batch = [{"jsonrpc": "2.0", "id": n, "method": "tools/call",
              "params": {"name": "claim", "arguments": {"namespace": NAMESPACE, "queue": QUEUE}}}
             for n in range(20)]
    reply = httpx2.post(f"{BASE}/mcp", json=batch, timeout=60,
                        headers={**headers, "Accept": "application/json, text/event-stream"})
    reply.raise_for_status()
    answers = reply.json()
    after = httpx2.get(f"{BASE}/metrics").text
    check(len(answers) == 20 and [a["id"] for a in answers] == list(range(20)), "20 answers, in order")
    tasks = {a["result"]["structuredContent"]["task"]["id"] for a in answers
             if not a["result"]["isError"]}
    check(len(tasks) == 20, "20 distinct leases")
    granted = metric(after, "tessera_claims_granted_total") - metric(before, "tessera_claims_granted_total")
    waits = metric(after, "tessera_claim_wait_seconds_count") - metric(before, "tessera_claim_wait_seconds_count")
    rejected = metric(after, "tessera_claims_rejected_total") - metric(before, "tessera_claims_rejected_total")
    check(granted == 20 and waits == 20 and rejected == 0,
          f"admission counters: {granted:.0f} granted, {waits:.0f} admissions, {rejected:.0f} rejected")
    check(metric(after, "tessera_claim_in_flight") == 0 and metric(after, "tessera_claim_pending") == 0,
          "nothing left in flight or waiting")
    print(f"admission: {granted:.0f} claims granted one call at a time in one batch, "
          f"window {metric(after, 'tessera_claim_limit'):.0f}, 0 rejected")


ROUTE_TOOLS = {"read_task", "alternatives", "retry_task", "cancel_tasks", "retry_tasks",
               "enqueue_batch", "pause_queue", "resume_queue", "set_queue_limits",
               "queue_settings", "put_schedule", "read_schedule", "list_schedules",
               "pause_schedule", "resume_schedule", "delete_schedule"}


async def operator(admin):
    """An operator's agent: enqueue with every option, a task's detail and
    alternatives, retry, bulk cancel and retry by filter, a queue's pause,
    resume and limits, and a schedule's life, each a tool call, each
    checked against what the store then says."""
    headers = {"Authorization": f"Bearer {admin}"}
    ns, queue = "ops", "reports"
    async with httpx2.AsyncClient(headers=headers, timeout=60) as client:
        async with streamable_http_client(f"{BASE}/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()

                async def call(name, arguments):
                    result = await session.call_tool(name, arguments)
                    return result.is_error, structured(result)

                listed = {tool.name: tool for tool in (await session.list_tools()).tools}
                check(ROUTE_TOOLS <= set(listed), "every operator tool is listed")
                check(all(listed[name].input_schema.get("additionalProperties") is False
                          for name in ROUTE_TOOLS), "each with a closed input schema")

                every = {"namespace": ns, "queue": queue, "brief": {"report": "q3"},
                         "id": "report-q3", "version": 2, "alternatives": 2, "priority": 3,
                         "max_tries": 4, "not_before": "2020-01-01T00:00:00Z",
                         "lease_ms": 60000, "timeout_ms": 3600000, "partition_key": "acme",
                         "unique": {"key": "report-q3", "mode": "keep"}}
                failed, body = await call("enqueue", every)
                check(not failed and body["task"]["id"] == "report-q3"
                      and body["task"]["version"] == 2 and body["created"] is True,
                      "enqueue with every option")
                failed, body = await call("enqueue", {**every, "id": "report-q3-again"})
                check(not failed and body["task"]["id"] == "report-q3" and body["created"] is False,
                      "a unique duplicate answers the task holding the key, created false")

                where = {"ns": ns, "task": "report-q3", "version": 2}
                failed, detail = await call("read_task", where)
                record = detail.get("record", {})
                check(not failed and len(record.get("attempts", [])) == 2
                      and record.get("priority") == 3 and record.get("max_tries") == 4
                      and detail.get("partition_key") == "acme",
                      "read_task: both alternatives, priority, tries and partition key")

                for attempt in range(2):
                    failed, claimed = await call("claim", {"namespace": ns, "queue": queue})
                    lease = claimed["lease"]
                    check(not failed and lease is not None, f"alternative {attempt + 1} claimed")
                    failed, _ = await call("submit", {
                        "namespace": ns, "task": "report-q3", "version": 2, "token": lease["token"],
                        "output": {"draft": attempt}, "idempotency_key": f"draft-{attempt}"})
                    check(not failed, f"alternative {attempt + 1} submitted")
                failed, body = await call("alternatives", where)
                outputs = sorted(item["output"]["draft"] for item in body.get("items", []))
                check(not failed and outputs == [0, 1], "alternatives: both receipts, with outputs")

                failed, _ = await call("enqueue", {"namespace": ns, "queue": queue,
                                                   "brief": {}, "id": "flaky"})
                failed, body = await call("cancel", {"namespace": ns, "task": "flaky"})
                check(not failed, "cancel")
                failed, body = await call("retry_task", {"ns": ns, "task": "flaky",
                                                         "body": {"version": 1}})
                check(not failed, f"retry_task: {body}")
                failed, detail = await call("read_task", {"ns": ns, "task": "flaky"})
                states = [a["state"]["state"] for a in detail["record"]["attempts"]]
                check(states == ["ready"], f"the retried task is ready again: {states}")

                batch = [{"brief": {"n": n}, "id": f"bulk-{n}"} for n in range(3)]
                failed, body = await call("enqueue_batch", {"ns": ns, "queue": queue,
                                                            "body": {"tasks": batch}})
                check(not failed, "enqueue_batch")
                failed, body = await call("cancel_tasks", {"ns": ns, "body": {"queue": queue,
                                                                              "state": "ready"}})
                check(not failed and body["changed"] == 4,
                      f"cancel_tasks by filter: {body.get('changed')} changed")
                failed, body = await call("retry_tasks", {"ns": ns, "body": {"state": "cancelled"}})
                check(not failed and body["changed"] == 4,
                      f"retry_tasks by filter: {body.get('changed')} changed")

                failed, body = await call("pause_queue", {"ns": ns, "queue": queue})
                check(not failed and body["paused_at"] is not None, "pause_queue")
                failed, claimed = await call("claim", {"namespace": ns, "queue": queue})
                check(not failed and claimed["lease"] is None and claimed["reason"] == "paused",
                      "a paused queue's claim is empty, reason paused")
                failed, body = await call("resume_queue", {"ns": ns, "queue": queue})
                check(not failed and body["paused_at"] is None, "resume_queue")
                failed, body = await call("set_queue_limits", {"ns": ns, "queue": queue,
                                                               "body": {"queue": 2}})
                check(not failed and body["limit"]["queue"] == 2, "set_queue_limits")
                failed, body = await call("queue_settings", {"ns": ns, "queue": queue})
                check(not failed and body["limit"]["queue"] == 2, "queue_settings reads it back")
                failed, body = await call("set_queue_limits", {"ns": ns, "queue": queue,
                                                               "body": {"queue": -1}})
                check(failed and body["status"] == 400, "a bad limit is a 400 tool error")

                nightly = {"ns": ns, "name": "nightly"}
                failed, body = await call("put_schedule", {**nightly, "body": {
                    "queue": queue, "cron": "0 3 * * *", "brief": {"report": "nightly"}}})
                check(not failed and body["name"] == "nightly"
                      and body["next_run_at"] is not None, "put_schedule")
                failed, body = await call("list_schedules", {"ns": ns, "limit": 10})
                check(not failed and [s["name"] for s in body["schedules"]] == ["nightly"],
                      "list_schedules")
                failed, body = await call("pause_schedule", nightly)
                check(not failed and body["paused"] is True, "pause_schedule")
                failed, body = await call("resume_schedule", nightly)
                check(not failed and body["paused"] is False, "resume_schedule")
                failed, body = await call("read_schedule", nightly)
                check(not failed and body["queue"] == queue, "read_schedule")
                failed, body = await call("delete_schedule", nightly)
                check(not failed, "delete_schedule")
                failed, body = await call("read_schedule", nightly)
                check(failed and body["status"] == 404, "a deleted schedule is a 404 tool error")

                try:
                    await session.call_tool("pause_queue", {"ns": ns, "queue": queue, "extra": 1})
                    refused = False
                except Exception:  # the SDK raises the JSON-RPC error
                    refused = True
                check(refused, "an argument the schema does not name is refused")
                try:
                    await session.call_tool("read_task", {"ns": ns, "task": 5})
                    refused = False
                except Exception:  # the SDK raises the JSON-RPC error
                    refused = True
                check(refused, "an argument of another type than its schema's is refused")
                limits = listed["set_queue_limits"].input_schema["properties"]["body"]
                check(limits["properties"]["queue"]["type"] == ["integer", "null"],
                      "schemas are JSON Schema: a nullable type lists null")


async def without_key():
    """The SDK without a key: the server answers 401 with WWW-Authenticate
    naming its protected-resource metadata, and the session never starts."""
    raw = httpx2.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                      headers={"Accept": "application/json, text/event-stream"})
    challenge = raw.headers.get("www-authenticate", "")
    check(raw.status_code == 401 and "/.well-known/oauth-protected-resource" in challenge,
          f"no key: 401, WWW-Authenticate {challenge!r}")
    metadata = httpx2.get(f"{BASE}/.well-known/oauth-protected-resource").json()
    check(metadata["resource"].endswith("/mcp"), "the protected-resource metadata names /mcp")
    started = False
    try:
        async with httpx2.AsyncClient(timeout=10) as client:
            async with streamable_http_client(f"{BASE}/mcp", http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await asyncio.wait_for(session.initialize(), 10)
                    started = True
    except BaseException as error:  # the SDK raises from its task group
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
    check(not started, "the SDK without a key cannot start a session")


def main():
    key = make_worker()
    asyncio.run(flow(key))
    asyncio.run(operator(ADMIN))
    asyncio.run(without_key())
    print("mcp flow: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
