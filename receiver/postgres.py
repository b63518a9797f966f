"""The PostgreSQL idempotency store, for receivers that run on several hosts.

The key's row is inserted if missing and then locked (``FOR UPDATE``) in one transaction,
so the read, the decision and the write of one admission are one step for every process.
Needs ``psycopg`` with its pool (``delivery-ledger[postgres]``).
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from receiver.records import Decision, KeyRecord, KeyStatus, admit

SCHEMA = """
CREATE TABLE IF NOT EXISTS receiver_keys (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    fencing_token BIGINT,
    result_id TEXT,
    error TEXT
)
"""


class PostgresStore:
    """Idempotency records in a PostgreSQL table, through a small connection pool."""

    def __init__(self, dsn: str, *, max_connections: int = 8) -> None:
        self._pool = AsyncConnectionPool(dsn, min_size=1, max_size=max_connections, open=False)

    async def start(self) -> None:
        """Open the pool and create the table."""
        await self._pool.open(wait=True, timeout=30)
        async with self._pool.connection() as conn:
            # A lock so that two receivers starting at once do not race on CREATE TABLE.
            await conn.execute("SELECT pg_advisory_xact_lock(7411)")
            await conn.execute(SCHEMA)

    async def close(self) -> None:
        """Close the pool."""
        await self._pool.close()

    async def admit(self, key: str, fencing_token: int | None) -> Decision:
        """Insert-if-missing, lock the row, decide, write: one transaction."""
        async with self._pool.connection() as conn, conn.transaction():
            inserted = await conn.execute(
                "INSERT INTO receiver_keys (key, status, fencing_token) VALUES (%s, %s, %s) "
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, KeyStatus.PROCESSING.value, fencing_token),
            )
            if await inserted.fetchone() is not None:
                return admit(None, key, fencing_token)
            cursor = await conn.execute(
                "SELECT status, fencing_token, result_id, error FROM receiver_keys "
                "WHERE key = %s FOR UPDATE",
                (key,),
            )
            decision = admit(_record(key, await cursor.fetchone()), key, fencing_token)
            new = decision.record
            await conn.execute(
                "UPDATE receiver_keys SET status = %s, fencing_token = %s, result_id = %s, "
                "error = %s WHERE key = %s",
                (new.status.value, new.fencing_token, new.result_id, new.error, key),
            )
            return decision

    async def complete(self, key: str, result_id: str) -> None:
        """Mark the key done with the handler's result id."""
        await self._settle(key, KeyStatus.DONE, result_id, None)

    async def fail(self, key: str, error: str) -> None:
        """Mark the key failed."""
        await self._settle(key, KeyStatus.FAILED, None, error)

    async def _settle(
        self, key: str, status: KeyStatus, result_id: str | None, error: str | None
    ) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE receiver_keys SET status = %s, result_id = %s, error = %s WHERE key = %s",
                (status.value, result_id, error, key),
            )

    async def get(self, key: str) -> KeyRecord | None:
        """The key's record, if any."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT status, fencing_token, result_id, error FROM receiver_keys WHERE key = %s",
                (key,),
            )
            return _record(key, await cursor.fetchone())


def _record(key: str, row: tuple[Any, ...] | None) -> KeyRecord | None:
    if row is None:
        return None
    return KeyRecord(key, KeyStatus(row[0]), row[1], row[2], row[3])
