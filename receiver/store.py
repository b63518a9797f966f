"""The one small interface every idempotency store implements, and how to open one by URL.

A store must make ``admit`` atomic per key across every process that shares it: two
simultaneous requests for one key get RUN at most once between them. ``complete``, ``fail``
and ``renew`` are fenced by the run's lease holder: a run whose key was reclaimed (its
lease ran out and another run took the key) changes nothing.
"""

from __future__ import annotations

from typing import Protocol

from receiver.errors import StoreUnavailable as StoreUnavailable  # where callers look
from receiver.records import Decision, KeyRecord, LeaseTerms


class IdempotencyStore(Protocol):
    """Keys recorded at receipt, settled by the handler's outcome."""

    async def start(self) -> None:
        """Open connections and create the table if it is missing."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    async def admit(self, key: str, fencing_token: int | None, terms: LeaseTerms) -> Decision:
        """Record a request for ``key`` and decide it (``receiver.records.admit``), atomically;
        a RUN stores the lease ``terms`` describe."""
        ...

    async def complete(self, key: str, result_id: str, holder: str) -> bool:
        """The handler returned: the key is ``done`` with ``result_id``, if ``holder`` still
        holds its lease (False: it did not, nothing changed)."""
        ...

    async def fail(self, key: str, error: str, holder: str) -> bool:
        """The handler raised: the key is ``failed`` (the next attempt may run it again), if
        ``holder`` still holds its lease."""
        ...

    async def renew(self, key: str, holder: str, expires_at: float) -> bool:
        """The handler is still running: its lease lasts until ``expires_at`` (unix seconds),
        if ``holder`` still holds it and the key is still ``processing``."""
        ...

    async def get(self, key: str) -> KeyRecord | None:
        """The key's record, or None if no request with it was received."""
        ...


def open_store(url: str) -> IdempotencyStore:
    """A store for ``sqlite:///path/to/file`` or ``postgresql://...`` (psycopg needed)."""
    if url.startswith(("postgresql://", "postgres://")):
        from receiver.postgres import PostgresStore  # psycopg only when asked for

        return PostgresStore(url)
    if url.startswith("sqlite://"):
        from receiver.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite://"))
    raise ValueError(
        "receiver store URL must start with sqlite:// or postgresql:// "
        "(e.g. sqlite:///var/lib/app/receiver.sqlite3)"
    )
