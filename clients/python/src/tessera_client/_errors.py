"""The server's refusals, as exceptions: each carries the HTTP status and
the error body's stable code, message, ``retry_after`` and ``reset_at``."""

from __future__ import annotations

from datetime import datetime
from typing import Optional


class TesseraError(Exception):
    """A refusal: ``status``, ``code`` (e.g. ``stale_token``), ``message``,
    and for 429 and 503 ``retry_after`` (seconds) and ``reset_at``."""

    def __init__(self, status: int, code: str, message: str,
                 retry_after: Optional[float] = None,
                 reset_at: Optional[datetime] = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.reset_at = reset_at


class RateLimited(TesseraError):
    """429: claim admission refused under real overload; ask again after
    ``retry_after``."""


class QuotaExhausted(TesseraError):
    """503 ``storage_quota_exhausted``: storage refuses writes until
    ``reset_at``; reads still answer."""


class Conflict(TesseraError):
    """409: a stale or unknown fencing token, an ended lease, or an
    idempotency key reused with another payload."""


class NotFound(TesseraError):
    """404: no such task, schedule or route."""


class Unavailable(TesseraError):
    """408, 502, 504, 503 other than a spent quota, or 500
    ``storage_error`` (the server restarting behind a proxy, shutting
    down, storage failing or failing over): ask again after
    ``retry_after``."""


def error_of(status: int, body: object, retry_after_header: Optional[str]) -> TesseraError:
    """The exception for a refusal with JSON ``body``."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        # Not the server's own body (a proxy's page, say).
        error = {"message": str(error)} if error is not None else {}
    code = str(error.get("code") or "unknown")
    message = str(error.get("message") or f"http {status}")
    retry_after = error.get("retry_after")
    if not isinstance(retry_after, (int, float)):
        retry_after = None
    if retry_after is None and retry_after_header:
        try:
            retry_after = float(retry_after_header)
        except ValueError:
            retry_after = None
    reset_at = error.get("reset_at")
    try:
        reset = datetime.fromisoformat(reset_at.replace("Z", "+00:00")) if reset_at else None
    except (AttributeError, ValueError):
        reset = None
    kind = TesseraError
    if status == 429:
        kind = RateLimited
    elif status == 503 and code == "storage_quota_exhausted":
        kind = QuotaExhausted
    elif status in (408, 502, 503, 504) or (status == 500 and code == "storage_error"):
        kind = Unavailable
    elif status == 409:
        kind = Conflict
    elif status == 404:
        kind = NotFound
    return kind(status, code, message, retry_after, reset)
