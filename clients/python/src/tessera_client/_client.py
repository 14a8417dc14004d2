"""Typed calls to tessera-server over HTTP, blocking (``Client``) and
async (``AsyncClient``): each builds the same request and reads the same
answer, so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union
from urllib.parse import quote

import httpx

from ._errors import error_of
from ._models import Claimed, Empty, Enqueued, Health, Lease, Receipt


def _seg(text: str) -> str:
    # `.` and `..` would be resolved as dot segments, not sent.
    if text in (".", ".."):
        return text.replace(".", "%2E")
    return quote(text, safe="")


@dataclass(frozen=True)
class _Call:
    """One request and how its answer is read."""

    method: str
    path: str
    body: Optional[dict]
    headers: dict
    read: Callable[[httpx.Response], Any]


def _json(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {}
        raise error_of(response.status_code, body, response.headers.get("retry-after"))
    return response.json() if response.content else {}


def _claim_answer(response: httpx.Response) -> Union[Claimed, Empty]:
    if response.status_code == 204:
        return Empty(response.headers.get("x-claim-empty-reason", "empty"),
                     float(response.headers.get("retry-after", "5")))
    return Claimed.of(_json(response))


class _Calls:
    """The requests, shared by both clients."""

    @staticmethod
    def enqueue(ns: str, queue: str, brief: Any, **options: Any) -> _Call:
        body = {"brief": brief, **{k: v for k, v in options.items() if v is not None}}
        return _Call("POST", f"/v1/ns/{_seg(ns)}/queues/{_seg(queue)}/tasks", body, {},
                     lambda r: Enqueued.of(_json(r)))

    @staticmethod
    def claim(ns: str, queue: str) -> _Call:
        return _Call("POST", f"/v1/ns/{_seg(ns)}/queues/{_seg(queue)}/claims", None, {},
                     _claim_answer)

    @staticmethod
    def wait(ns: str, queue: str, timeout_ms: int) -> _Call:
        return _Call("POST", f"/v1/ns/{_seg(ns)}/queues/{_seg(queue)}/wait",
                     {"timeout_ms": timeout_ms}, {},
                     lambda r: _json(r)["outcome"] == "work_available")

    @staticmethod
    def heartbeat(lease: Lease, progress: Any = None) -> _Call:
        body = {"token": lease.token, "version": lease.task.version}
        if progress is not None:
            body["progress"] = progress
        return _Call("POST", f"/v1/ns/{_seg(lease.task.namespace)}/tasks/{_seg(lease.task.id)}/heartbeat",
                     body, {}, lambda r: Lease.of(_json(r)))

    @staticmethod
    def submit(lease: Lease, output: Any, idempotency_key: str) -> _Call:
        body = {"token": lease.token, "version": lease.task.version, "output": output}
        return _Call("POST", f"/v1/ns/{_seg(lease.task.namespace)}/tasks/{_seg(lease.task.id)}/submit",
                     body, {"Idempotency-Key": idempotency_key}, lambda r: Receipt.of(_json(r)))

    @staticmethod
    def fail(lease: Lease, error: Optional[str], retry: str = "backoff",
             after_ms: Optional[int] = None) -> _Call:
        body = {"token": lease.token, "version": lease.task.version, "retry": retry}
        if error is not None:
            body["error"] = error
        if after_ms is not None:
            body["after_ms"] = after_ms
        return _Call("POST", f"/v1/ns/{_seg(lease.task.namespace)}/tasks/{_seg(lease.task.id)}/fail",
                     body, {}, lambda r: _json(r)["state"])

    @staticmethod
    def health(ns: str) -> _Call:
        return _Call("GET", f"/v1/ns/{_seg(ns)}/health", None, {}, lambda r: Health.of(_json(r)))

    @staticmethod
    def read_task(ns: str, task: str, version: int = 1) -> _Call:
        return _Call("GET", f"/v1/ns/{_seg(ns)}/tasks/{_seg(task)}?version={version}", None, {},
                     _json)


class Client:
    """Blocking calls with one API key: ``Client(base_url, key)``. Every
    refusal raises a :class:`TesseraError` subclass; transport failures
    raise ``httpx.TransportError``."""

    def __init__(self, base_url: str, key: str, *, timeout: float = 30.0,
                 http: Optional[httpx.Client] = None) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self._headers = {"Authorization": f"Bearer {key}"}

    def _send(self, call: _Call) -> Any:
        response = self._http.request(call.method, call.path, json=call.body,
                                      headers={**self._headers, **call.headers})
        return call.read(response)

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def enqueue(self, ns: str, queue: str, brief: Any, **options: Any) -> Enqueued:
        """Enqueues a task; ``options`` are the route's body fields (``id``,
        ``priority``, ``not_before``, ``unique``, ...)."""
        return self._send(_Calls.enqueue(ns, queue, brief, **options))

    def claim(self, ns: str, queue: str) -> Union[Claimed, Empty]:
        """Claims the next task: a :class:`Claimed`, or :class:`Empty`."""
        return self._send(_Calls.claim(ns, queue))

    def wait_for_work(self, ns: str, queue: str, timeout: float) -> bool:
        """Long-polls ``queue`` for up to ``timeout`` seconds: whether work
        arrived."""
        return self._send(_Calls.wait(ns, queue, int(timeout * 1000)))

    def heartbeat(self, lease: Lease, progress: Any = None) -> Lease:
        """Extends ``lease``; the extended lease."""
        return self._send(_Calls.heartbeat(lease, progress))

    def submit(self, lease: Lease, output: Any, idempotency_key: str) -> Receipt:
        """Submits ``output`` once under ``idempotency_key``: the same key
        and output again answers the same receipt."""
        return self._send(_Calls.submit(lease, output, idempotency_key))

    def fail(self, lease: Lease, error: Optional[str] = None, retry: str = "backoff",
             after_ms: Optional[int] = None) -> Any:
        """Reports a failure; the attempt's new state."""
        return self._send(_Calls.fail(lease, error, retry, after_ms))

    def health(self, ns: str) -> Health:
        """A namespace's attempts by state."""
        return self._send(_Calls.health(ns))

    def read_task(self, ns: str, task: str, version: int = 1) -> dict:
        """A task's detail: brief, attempts, leases, progress."""
        return self._send(_Calls.read_task(ns, task, version))


class AsyncClient:
    """:class:`Client`'s calls for asyncio."""

    def __init__(self, base_url: str, key: str, *, timeout: float = 30.0,
                 http: Optional[httpx.AsyncClient] = None) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self._headers = {"Authorization": f"Bearer {key}"}

    async def _send(self, call: _Call) -> Any:
        response = await self._http.request(call.method, call.path, json=call.body,
                                            headers={**self._headers, **call.headers})
        return call.read(response)

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def enqueue(self, ns: str, queue: str, brief: Any, **options: Any) -> Enqueued:
        """See :meth:`Client.enqueue`."""
        return await self._send(_Calls.enqueue(ns, queue, brief, **options))

    async def claim(self, ns: str, queue: str) -> Union[Claimed, Empty]:
        """See :meth:`Client.claim`."""
        return await self._send(_Calls.claim(ns, queue))

    async def wait_for_work(self, ns: str, queue: str, timeout: float) -> bool:
        """See :meth:`Client.wait_for_work`."""
        return await self._send(_Calls.wait(ns, queue, int(timeout * 1000)))

    async def heartbeat(self, lease: Lease, progress: Any = None) -> Lease:
        """See :meth:`Client.heartbeat`."""
        return await self._send(_Calls.heartbeat(lease, progress))

    async def submit(self, lease: Lease, output: Any, idempotency_key: str) -> Receipt:
        """See :meth:`Client.submit`."""
        return await self._send(_Calls.submit(lease, output, idempotency_key))

    async def fail(self, lease: Lease, error: Optional[str] = None, retry: str = "backoff",
                   after_ms: Optional[int] = None) -> Any:
        """See :meth:`Client.fail`."""
        return await self._send(_Calls.fail(lease, error, retry, after_ms))

    async def health(self, ns: str) -> Health:
        """See :meth:`Client.health`."""
        return await self._send(_Calls.health(ns))

    async def read_task(self, ns: str, task: str, version: int = 1) -> dict:
        """See :meth:`Client.read_task`."""
        return await self._send(_Calls.read_task(ns, task, version))
