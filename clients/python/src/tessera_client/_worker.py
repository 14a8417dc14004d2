"""A remote worker loop, blocking (``Worker``, threads) and async
(``AsyncWorker``, tasks): claims, honouring ``Retry-After`` with jitter
and long-polling an empty queue; heartbeats each held lease at a fraction
of its length; submits under an idempotency key of the lease, retried
with the same key after a lost answer; waits out ``503`` until
``reset_at``; and reports a handler's exception as a failure."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Optional

import httpx

from ._client import AsyncClient, Client
from ._errors import Conflict, QuotaExhausted, RateLimited, TesseraError, Unavailable
from ._models import Claimed, Empty, Lease, Receipt


@dataclass
class WorkerStats:
    """What a worker loop did."""

    claimed: int = 0
    done: int = 0
    failed: int = 0
    #: Leases lost before their submission landed (a stale token, 409).
    lost: int = 0
    empty: int = 0
    #: Waits a refusal or a lost connection asked for.
    waits: int = 0
    #: Tasks given up because ``stop`` was set while their submission or
    #: failure still waited to be made: their leases lapse.
    abandoned: int = 0
    receipts: list = field(default_factory=list)


def idempotency_key(lease: Lease) -> str:
    """The key a lease's submission is made under: the same for every
    retry of it, another for every other lease."""
    return f"a{lease.attempt}.t{lease.token}"


#: The most jitter a wait gets: a fifth of the wait, up to this.
MAX_JITTER = 30.0


def jittered(base: float, rng: random.Random) -> float:
    """``base`` seconds plus up to a fifth more (at most ``MAX_JITTER``),
    so that workers told the same wait do not come back together."""
    return base + rng.uniform(0, min(base / 5, MAX_JITTER) if base > 0 else 0.05)


def pause_for(error: Exception, attempt: int, rng: random.Random,
              now: Optional[datetime] = None) -> float:
    """Seconds to wait before asking again after ``error``, the
    ``attempt``-th time in a row: a ``Retry-After`` or ``reset_at`` the
    server gave, with jitter (for a spent allowance, the later of
    ``reset_at`` and ``Retry-After``); else a backoff from 0.1 s doubling
    to 5 s, with jitter."""
    if isinstance(error, QuotaExhausted) and error.reset_at is not None:
        # The server's Retry-After too, in case this clock runs ahead.
        now = now or datetime.now(timezone.utc)
        base = max((error.reset_at - now).total_seconds(), float(error.retry_after or 0), 0.0)
    elif isinstance(error, TesseraError) and error.retry_after is not None:
        base = float(error.retry_after)
    else:
        base = min(0.1 * (2 ** min(attempt, 6)), 5.0)
    return jittered(base, rng)


def failure_text(error: BaseException) -> str:
    """A handler's exception as the server takes a failure's text:
    printable ASCII (anything else escaped), at most 2,048 characters."""
    text = f"{type(error).__name__}: {error}".encode("unicode_escape").decode("ascii")
    return text[:2048]


def _unencodable(output: Any) -> Optional[str]:
    """Why ``output`` cannot be sent as JSON, if it cannot."""
    try:
        json.dumps(output, allow_nan=False)
        return None
    except (TypeError, ValueError) as error:
        return failure_text(error)


def _retryable(error: Exception) -> bool:
    return isinstance(error, (httpx.TransportError, RateLimited, QuotaExhausted, Unavailable))


class _Stopped(Exception):
    """``stop`` was set while a call waited to be made again."""


class Worker:
    """Runs ``handler(claimed) -> output`` on the tasks of ``queue``, from
    ``threads`` threads: ``Worker(client, ns, queue, handler).run()``.
    ``wait`` bounds a long-poll, and so how long ``run`` takes to return
    once ``stop`` is set."""

    def __init__(self, client: Client, ns: str, queue: str,
                 handler: Callable[[Claimed], Any], *, wait: float = 10.0,
                 heartbeat_fraction: float = 1 / 3, rng: Optional[random.Random] = None) -> None:
        self.client, self.ns, self.queue, self.handler = client, ns, queue, handler
        self.wait, self.fraction = wait, heartbeat_fraction
        self.rng = rng or random.Random()
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self.stop = threading.Event()
        #: A refusal no wait answers (a key without the claim scope, say):
        #: the first one stops every thread, and ``run`` raises it.
        self.error: Optional[Exception] = None

    def _count(self, name: str, value: Any = 1) -> None:
        with self._lock:
            if name == "receipts":
                self.stats.receipts.append(value)
            else:
                setattr(self.stats, name, getattr(self.stats, name) + value)

    def _retrying(self, call: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            if self.stop.is_set():
                raise _Stopped()
            try:
                return call()
            except Exception as error:  # noqa: BLE001 - sorted below
                if not _retryable(error):
                    raise
                self._count("waits")
                self.stop.wait(pause_for(error, attempt, self.rng))
                attempt += 1

    def run(self, threads: int = 1, *, until_empty: bool = False) -> WorkerStats:
        """Works until ``stop`` is set (or, ``until_empty``, until a claim
        finds the queue empty), from ``threads`` threads; what it did. A
        refusal no wait answers stops every thread and is raised here."""
        workers = [threading.Thread(target=self._loop, args=(until_empty,), daemon=True)
                   for _ in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        if self.error is not None:
            raise self.error
        return self.stats

    def _loop(self, until_empty: bool) -> None:
        try:
            self._claims(until_empty)
        except _Stopped:
            pass
        except Exception as error:  # noqa: BLE001 - handed to `run`
            with self._lock:
                if self.error is None and not self.stop.is_set():
                    self.error = error
            self.stop.set()

    def _claims(self, until_empty: bool) -> None:
        while not self.stop.is_set():
            claimed = self._retrying(lambda: self.client.claim(self.ns, self.queue))
            if isinstance(claimed, Empty):
                self._count("empty")
                if until_empty and claimed.reason == "empty":
                    return
                pause = jittered(claimed.retry_after, self.rng)
                if claimed.reason == "empty":
                    # Work that arrives ends the long-poll early.
                    self._retrying(lambda: self.client.wait_for_work(
                        self.ns, self.queue, min(pause, self.wait)))
                else:
                    # Paused or at its limit: ready work would end a
                    # long-poll at once, so wait the Retry-After out.
                    self.stop.wait(pause)
                continue
            self._count("claimed")
            self._work(claimed)

    def _work(self, claimed: Claimed) -> None:
        held = {"lease": claimed.lease, "lost": False}
        period = max(claimed.lease.length * self.fraction, 0.05)
        beating = threading.Event()

        def beat() -> None:
            while not beating.wait(period):
                try:
                    held["lease"] = self.client.heartbeat(held["lease"])
                except Conflict:
                    held["lost"] = True
                    return
                except Exception:  # noqa: BLE001 - the next beat tries again
                    continue

        # The lease is kept until its submission or failure is made, a
        # wait for a 503's reset_at included.
        heart = threading.Thread(target=beat, daemon=True)
        heart.start()
        try:
            try:
                output = self.handler(claimed)
                refused = _unencodable(output)
            except Exception as error:  # noqa: BLE001 - the task's failure
                output, refused = None, failure_text(error)
            if held["lost"]:
                self._count("lost")
                return
            if refused is not None:
                self._fail(held, refused)
                return
            key = idempotency_key(claimed.lease)
            try:
                receipt: Receipt = self._retrying(
                    lambda: self.client.submit(held["lease"], output, key))
                self._count("done")
                self._count("receipts", receipt)
            except Conflict:
                self._count("lost")
            except _Stopped:
                self._count("abandoned")
        finally:
            beating.set()
            heart.join()

    def _fail(self, held: dict, text: str) -> None:
        try:
            self._retrying(lambda: self.client.fail(held["lease"], text))
            self._count("failed")
        except Conflict:
            self._count("lost")
        except _Stopped:
            self._count("abandoned")
        except TesseraError:
            # Refused for another reason: the lease lapses, and the task
            # comes back under the lease rules; the loop goes on.
            self._count("lost")


class AsyncWorker:
    """:class:`Worker` for asyncio: ``await AsyncWorker(client, ns, queue,
    handler).run(tasks=4)``, the handler a coroutine function."""

    def __init__(self, client: AsyncClient, ns: str, queue: str,
                 handler: Callable[[Claimed], Awaitable[Any]], *, wait: float = 10.0,
                 heartbeat_fraction: float = 1 / 3, rng: Optional[random.Random] = None) -> None:
        self.client, self.ns, self.queue, self.handler = client, ns, queue, handler
        self.wait, self.fraction = wait, heartbeat_fraction
        self.rng = rng or random.Random()
        self.stats = WorkerStats()
        self.stop = asyncio.Event()
        #: As :attr:`Worker.error`.
        self.error: Optional[Exception] = None

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        attempt = 0
        while True:
            if self.stop.is_set():
                raise _Stopped()
            try:
                return await call()
            except Exception as error:  # noqa: BLE001 - sorted below
                if not _retryable(error):
                    raise
                self.stats.waits += 1
                await self._pause(pause_for(error, attempt, self.rng))
                attempt += 1

    async def run(self, tasks: int = 1, *, until_empty: bool = False) -> WorkerStats:
        """Works until ``stop`` is set (or, ``until_empty``, until a claim
        finds the queue empty), from ``tasks`` tasks; what it did. A
        refusal no wait answers stops every task and is raised here."""
        await asyncio.gather(*(self._loop(until_empty) for _ in range(tasks)))
        if self.error is not None:
            raise self.error
        return self.stats

    async def _loop(self, until_empty: bool) -> None:
        try:
            await self._claims(until_empty)
        except _Stopped:
            pass
        except Exception as error:  # noqa: BLE001 - handed to `run`
            if self.error is None and not self.stop.is_set():
                self.error = error
            self.stop.set()

    async def _claims(self, until_empty: bool) -> None:
        while not self.stop.is_set():
            claimed = await self._retrying(lambda: self.client.claim(self.ns, self.queue))
            if isinstance(claimed, Empty):
                self.stats.empty += 1
                if until_empty and claimed.reason == "empty":
                    return
                pause = jittered(claimed.retry_after, self.rng)
                if claimed.reason == "empty":
                    await self._retrying(lambda: self.client.wait_for_work(
                        self.ns, self.queue, min(pause, self.wait)))
                else:
                    await self._pause(pause)
                continue
            self.stats.claimed += 1
            await self._work(claimed)

    async def _work(self, claimed: Claimed) -> None:
        held = {"lease": claimed.lease, "lost": False}
        period = max(claimed.lease.length * self.fraction, 0.05)

        async def beat() -> None:
            while True:
                await asyncio.sleep(period)
                try:
                    held["lease"] = await self.client.heartbeat(held["lease"])
                except Conflict:
                    held["lost"] = True
                    return
                except Exception:  # noqa: BLE001 - the next beat tries again
                    continue

        heart = asyncio.create_task(beat())
        try:
            try:
                output = await self.handler(claimed)
                refused = _unencodable(output)
            except Exception as error:  # noqa: BLE001 - the task's failure
                output, refused = None, failure_text(error)
            if held["lost"]:
                self.stats.lost += 1
                return
            if refused is not None:
                await self._fail(held, refused)
                return
            key = idempotency_key(claimed.lease)
            try:
                receipt = await self._retrying(
                    lambda: self.client.submit(held["lease"], output, key))
                self.stats.done += 1
                self.stats.receipts.append(receipt)
            except Conflict:
                self.stats.lost += 1
            except _Stopped:
                self.stats.abandoned += 1
        finally:
            heart.cancel()

    async def _fail(self, held: dict, text: str) -> None:
        try:
            await self._retrying(lambda: self.client.fail(held["lease"], text))
            self.stats.failed += 1
        except Conflict:
            self.stats.lost += 1
        except _Stopped:
            self.stats.abandoned += 1
        except TesseraError:
            self.stats.lost += 1
