"""A client for tessera-server: typed calls (``Client``, ``AsyncClient``)
and a remote worker loop (``Worker``, ``AsyncWorker``).

    from tessera_client import Client, Worker
    client = Client("http://127.0.0.1:8080", key)
    Worker(client, "renders", "frames", lambda task: {"ok": True}).run(threads=4)
"""

from ._client import AsyncClient, Client
from ._errors import (Conflict, NotFound, QuotaExhausted, RateLimited, TesseraError,
                      Unavailable)
from ._models import Claimed, Empty, Enqueued, Health, Lease, Receipt, TaskRef
from ._worker import (AsyncWorker, Worker, WorkerStats, failure_text, idempotency_key, jittered,
                      pause_for)

__all__ = [
    "AsyncClient", "AsyncWorker", "Claimed", "Client", "Conflict", "Empty", "Enqueued",
    "Health", "Lease", "NotFound", "QuotaExhausted", "RateLimited", "Receipt", "TaskRef",
    "TesseraError", "Unavailable", "Worker", "WorkerStats", "failure_text", "idempotency_key",
    "jittered", "pause_for",
]
