"""The PostgreSQL idempotency store, for receivers that run on several hosts.

The key's row is inserted if missing and then locked (``FOR UPDATE``) in one transaction,
so the read, the decision and the write of one admission are one step for every process.
Needs ``psycopg`` (``delivery-ledger[postgres]``).

A restart of the database (or dropped connections) does not stop the receiver: each call
retries with capped, jittered backoff for up to ``unavailable_after_s``, then raises
``StoreUnavailable`` (the kit answers 503 and runs nothing); the log says so once per
outage (events/outage.py). A retried admission that had committed before its answer was
lost is recognised by the attempt's own mark (``admitted_by``, the lease holder), so it
still runs once. A table made by an earlier kit gains the handler-lease columns on start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from events.outage import Backoff, Outage, config_problem, reason
from receiver.errors import StoreUnavailable
from receiver.records import Admission, Decision, KeyRecord, KeyStatus, LeaseTerms, admit

SCHEMA = """
CREATE TABLE IF NOT EXISTS receiver_keys (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    fencing_token BIGINT,
    result_id TEXT,
    error TEXT,
    admitted_by TEXT,
    lease_holder TEXT,
    lease_expires_at DOUBLE PRECISION
)
"""
# A table made by an earlier version of the kit lacks the admission mark and the lease
# (NULL there: no lease, see ``receiver.records.lease_expired``).
MIGRATE = (
    "ALTER TABLE receiver_keys ADD COLUMN IF NOT EXISTS admitted_by TEXT",
    "ALTER TABLE receiver_keys ADD COLUMN IF NOT EXISTS lease_holder TEXT",
    "ALTER TABLE receiver_keys ADD COLUMN IF NOT EXISTS lease_expires_at DOUBLE PRECISION",
)
COLUMNS = "status, fencing_token, result_id, error, lease_holder, lease_expires_at"

T = TypeVar("T")
log = logging.getLogger("receiver")
# The database's own failures: a lost connection, a server shutting down or starting up.
_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError, OSError, TimeoutError)
MAX_ATTEMPTS = 1000  # per call, beside its time budget


class PostgresStore:
    """Idempotency records in a PostgreSQL table, through a small pool of connections."""

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 8,
        unavailable_after_s: float = 5.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self._dsn = dsn
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[AsyncConnection[Any]] = []
        self._budget_s = unavailable_after_s
        self._start_timeout_s = start_timeout_s
        # Only the log lines: each call's own budget (unavailable_after_s) ends an outage.
        self.outage = Outage(log, "receiver idempotency store (PostgreSQL)", limit_s=math.inf)

    async def start(self) -> None:
        """Connect (waiting up to ``start_timeout_s`` for a server that is not up yet) and
        create the table; a configuration error (bad DSN, credentials, database) raises
        ``ValueError`` at once."""
        await self._attempt(self._create, self._start_timeout_s)

    async def _create(self, conn: AsyncConnection[Any]) -> None:
        async with conn.transaction():
            # A lock so that two receivers starting at once do not race on CREATE TABLE.
            await conn.execute("SELECT pg_advisory_xact_lock(7411)")
            await conn.execute(SCHEMA)
            for statement in MIGRATE:
                await conn.execute(statement)

    async def close(self) -> None:
        """Close the idle connections (those in use close when their call ends)."""
        await self._drop_idle()

    async def admit(self, key: str, fencing_token: int | None, terms: LeaseTerms) -> Decision:
        """Insert-if-missing, lock the row, decide, write: one transaction."""
        mark = terms.holder  # this admission's, the same in every retry of it

        async def once(conn: AsyncConnection[Any]) -> Decision:
            async with conn.transaction():
                first = admit(None, key, fencing_token, terms)
                inserted = await conn.execute(
                    "INSERT INTO receiver_keys (key, status, fencing_token, admitted_by, "
                    "lease_holder, lease_expires_at) VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (key) DO NOTHING RETURNING key",
                    (
                        key,
                        first.record.status.value,
                        fencing_token,
                        mark,
                        first.record.lease_holder,
                        first.record.lease_expires_at,
                    ),
                )
                if await inserted.fetchone() is not None:
                    return first
                cursor = await conn.execute(
                    f"SELECT {COLUMNS}, admitted_by "  # noqa: S608 - constant columns
                    "FROM receiver_keys WHERE key = %s FOR UPDATE",
                    (key,),
                )
                row = await cursor.fetchone()
                existing = _record(key, row)
                if row is not None and existing is not None and row[6] == mark:
                    # This very admission committed before its answer was lost: it runs.
                    return Decision(Admission.RUN, existing)
                decision = admit(existing, key, fencing_token, terms)
                new = decision.record
                await conn.execute(
                    "UPDATE receiver_keys SET status = %s, fencing_token = %s, result_id = %s, "
                    "error = %s, lease_holder = %s, lease_expires_at = %s, "
                    "admitted_by = CASE WHEN %s THEN %s ELSE admitted_by END "
                    "WHERE key = %s",
                    (
                        new.status.value,
                        new.fencing_token,
                        new.result_id,
                        new.error,
                        new.lease_holder,
                        new.lease_expires_at,
                        decision.admission is Admission.RUN,
                        mark,
                        key,
                    ),
                )
                return decision

        return await self._attempt(once)

    async def complete(self, key: str, result_id: str, holder: str) -> bool:
        """Mark the key done with the handler's result id, if ``holder`` still holds it."""
        return await self._settle(key, holder, KeyStatus.DONE, result_id, None)

    async def fail(self, key: str, error: str, holder: str) -> bool:
        """Mark the key failed, if ``holder`` still holds it."""
        return await self._settle(key, holder, KeyStatus.FAILED, None, error)

    async def _settle(
        self, key: str, holder: str, status: KeyStatus, result_id: str | None, error: str | None
    ) -> bool:
        async def once(conn: AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(
                "UPDATE receiver_keys SET status = %s, result_id = %s, error = %s "
                "WHERE key = %s AND lease_holder = %s AND status = %s",
                (status.value, result_id, error, key, holder, KeyStatus.PROCESSING.value),
            )
            return cursor.rowcount == 1

        # The handler has run: its outcome is worth a longer wait than a new request. A
        # retried UPDATE that had committed finds the key settled already: by this holder.
        if await self._attempt(once, 3 * self._budget_s):
            return True
        record = await self.get(key)
        return record is not None and record.lease_holder == holder and record.status is status

    async def renew(self, key: str, holder: str, expires_at: float) -> bool:
        """Extend ``holder``'s lease on the key to ``expires_at``, if it still holds it."""

        async def once(conn: AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(
                "UPDATE receiver_keys "
                "SET lease_expires_at = GREATEST(COALESCE(lease_expires_at, 0), %s) "
                "WHERE key = %s AND lease_holder = %s AND status = %s",
                (expires_at, key, holder, KeyStatus.PROCESSING.value),
            )
            return cursor.rowcount == 1

        return await self._attempt(once)

    async def get(self, key: str) -> KeyRecord | None:
        """The key's record, if any."""

        async def once(conn: AsyncConnection[Any]) -> KeyRecord | None:
            cursor = await conn.execute(
                f"SELECT {COLUMNS} FROM receiver_keys WHERE key = %s",  # noqa: S608 - constant
                (key,),
            )
            return _record(key, await cursor.fetchone())

        return await self._attempt(once)

    # Connections and retries ---------------------------------------------------------

    async def _attempt(
        self, work: Callable[[AsyncConnection[Any]], Awaitable[T]], budget_s: float | None = None
    ) -> T:
        """``work`` on a connection; on the database's own failure, again on a new one
        after a backoff, until the budget is spent (then ``StoreUnavailable``)."""
        deadline = time.monotonic() + (self._budget_s if budget_s is None else budget_s)
        backoff = Backoff()
        for attempt in range(MAX_ATTEMPTS):
            try:
                async with self._connection(deadline) as conn:
                    result = await work(conn)
            except _UNAVAILABLE as exc:
                if config_problem(exc):
                    raise ValueError(
                        f"receiver store: {reason(exc)} (check the DSN: user, password, database)"
                    ) from None
                await self._drop_idle()  # a restart took every connection with it
                self.outage.failed(exc)
                # The first failure may be a connection the restart left behind: at once.
                delay = 0.0 if attempt == 0 else backoff.next_delay()
                if time.monotonic() + delay >= deadline:
                    gone = f"idempotency store unreachable: {reason(exc)}"
                    raise StoreUnavailable(gone) from None
                await asyncio.sleep(delay)
                continue
            self.outage.recovered()
            return result
        raise StoreUnavailable("idempotency store unreachable: too many attempts")

    @asynccontextmanager
    async def _connection(self, deadline: float) -> AsyncIterator[AsyncConnection[Any]]:
        remaining = max(0.1, deadline - time.monotonic())
        await asyncio.wait_for(self._slots.acquire(), timeout=remaining)
        try:
            if self._idle:
                conn = self._idle.pop()
            else:
                try:
                    conn = await psycopg.AsyncConnection.connect(
                        self._dsn, autocommit=True, connect_timeout=max(1, math.ceil(remaining))
                    )
                except psycopg.ProgrammingError as exc:  # a DSN it cannot parse
                    raise ValueError(f"receiver store: {reason(exc)} (check the DSN)") from None
            try:
                yield conn
            except BaseException:
                await _close(conn)
                raise
            if conn.broken or conn.info.transaction_status is not TransactionStatus.IDLE:
                await _close(conn)
            else:
                self._idle.append(conn)
        finally:
            self._slots.release()

    async def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)


async def _close(conn: AsyncConnection[Any]) -> None:
    with contextlib.suppress(*_UNAVAILABLE):
        await conn.close()


def _record(key: str, row: tuple[Any, ...] | None) -> KeyRecord | None:
    if row is None:
        return None
    return KeyRecord(key, KeyStatus(row[0]), *row[1:6])
