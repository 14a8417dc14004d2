"""An MCP client not written here (the Python `mcp` SDK) runs a worker's
flow against a running tessera-server: list tools, enqueue, claim,
heartbeat, submit, an empty claim with retry_after, and a JSON-RPC batch of
20 claims that admission takes one call at a time, as its counters show.

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
    asyncio.run(without_key())
    print("mcp flow: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
