"""The server's answers as dataclasses, one per JSON object the client
reads; each lists the fields the server's OpenAPI document requires
(``REQUIRED``), which the client's tests check against
``/v1/openapi.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class TaskRef:
    """A task: its namespace, id and brief version."""

    namespace: str
    id: str
    version: int

    @classmethod
    def of(cls, body: dict) -> "TaskRef":
        return cls(body["namespace"], body["id"], int(body["version"]))


@dataclass(frozen=True)
class Enqueued:
    """An enqueue's answer: the task, and whether it was made (a unique
    task's duplicate answers the task holding its key, ``created`` false)."""

    task: TaskRef
    created: bool
    REQUIRED = ("namespace", "id", "version", "created")

    @classmethod
    def of(cls, body: dict) -> "Enqueued":
        return cls(TaskRef.of(body), bool(body["created"]))


@dataclass(frozen=True)
class Lease:
    """A lease on one attempt: its fencing token and when it expires."""

    task: TaskRef
    attempt: int
    token: int
    holder: str
    granted_at: datetime
    expires_at: datetime
    artifact: str
    REQUIRED = ("task", "token", "expires_at")

    @classmethod
    def of(cls, body: dict) -> "Lease":
        return cls(TaskRef.of(body["task"]), int(body["attempt"]), int(body["token"]),
                   str(body["holder"]), _time(body["granted_at"]), _time(body["expires_at"]),
                   str(body["artifact"]))

    @property
    def length(self) -> float:
        """The lease's length in seconds."""
        return (self.expires_at - self.granted_at).total_seconds()


@dataclass(frozen=True)
class Claimed:
    """A claim's grant: the task, its brief (as JSON) and the lease."""

    task: TaskRef
    queue: str
    brief: Any
    lease: Lease
    REQUIRED = ("task", "lease", "brief")

    @classmethod
    def of(cls, body: dict) -> "Claimed":
        brief = body["brief"]
        if isinstance(brief, dict) and brief.get("format") == "json":
            brief = brief.get("value")
        return cls(TaskRef.of(body["task"]), str(body.get("queue", "")), brief,
                   Lease.of(body["lease"]))


@dataclass(frozen=True)
class Empty:
    """A claim that found nothing to lease: why (``empty``, ``paused``,
    ``limited``) and when to ask again (``Retry-After``, seconds)."""

    reason: str
    retry_after: float


@dataclass(frozen=True)
class Receipt:
    """An accepted submission: task, attempt, token, artifact key, the
    output's digest and when it was accepted."""

    task: TaskRef
    attempt: int
    token: int
    artifact: str
    digest: str
    idempotency_key: str
    accepted_at: datetime
    REQUIRED = ("task", "token", "artifact")

    @classmethod
    def of(cls, body: dict) -> "Receipt":
        return cls(TaskRef.of(body["task"]), int(body["attempt"]), int(body["token"]),
                   str(body["artifact"]), str(body["digest"]), str(body["idempotency_key"]),
                   _time(body["accepted_at"]))


@dataclass(frozen=True)
class Health:
    """A namespace's attempts by state."""

    attempts: dict = field(default_factory=dict)
    REQUIRED = ("attempts",)

    @classmethod
    def of(cls, body: dict) -> "Health":
        return cls(dict(body["attempts"]))
