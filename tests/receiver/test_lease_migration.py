"""A kit database made before handler leases opens under this kit: the lease columns are
added, every row is kept, and a key its old run left ``processing`` is a dead run's key."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from receiver.postgres import PostgresStore
from receiver.records import Admission, KeyStatus
from receiver.sqlite import SqliteStore
from receiver.store import IdempotencyStore
from tests.fixtures.postgres import DsnFactory
from tests.receiver.support import lease

# The table as the kit made it before leases (PostgreSQL had ``admitted_by`` too).
OLD_SQLITE = (
    "CREATE TABLE receiver_keys (key TEXT PRIMARY KEY, status TEXT NOT NULL, "
    "fencing_token INTEGER, result_id TEXT, error TEXT)"
)
OLD_POSTGRES = (
    "CREATE TABLE receiver_keys (key TEXT PRIMARY KEY, status TEXT NOT NULL, "
    "fencing_token BIGINT, result_id TEXT, error TEXT, admitted_by TEXT)"
)
ROWS = [("left", "processing", 4, None, None), ("made", "done", 2, "order-9", None)]


async def _reads_the_old_rows(store: IdempotencyStore) -> None:
    await store.start()
    try:
        made = await store.get("made")
        assert made is not None
        assert (made.status, made.result_id, made.lease_expires_at) == (
            KeyStatus.DONE,
            "order-9",
            None,
        )
        assert (await store.admit("made", 2, lease())).admission is Admission.DUPLICATE
        left = await store.get("left")
        assert left is not None
        assert (left.status, left.lease_holder, left.lease_expires_at) == (
            KeyStatus.PROCESSING,
            None,
            None,
        )
        # No run of this kit holds it: stuck, or run again by an idempotent handler.
        assert (await store.admit("left", 4, lease())).admission is Admission.STUCK
        rerun = lease(idempotent_handler=True)
        assert (await store.admit("left", 5, rerun)).admission is Admission.RUN
        assert await store.complete("left", "order-10", rerun.holder)
    finally:
        await store.close()


async def test_an_old_sqlite_file_gains_the_lease_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute(OLD_SQLITE)
        conn.executemany("INSERT INTO receiver_keys VALUES (?, ?, ?, ?, ?)", ROWS)
    conn.close()
    await _reads_the_old_rows(SqliteStore(path))
    await _reads_the_old_rows_again(SqliteStore(path))


async def test_an_old_postgres_table_gains_the_lease_columns(
    postgres_factory: DsnFactory,
) -> None:
    dsn = postgres_factory()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(OLD_POSTGRES)
        for row in ROWS:
            conn.execute("INSERT INTO receiver_keys VALUES (%s, %s, %s, %s, %s)", row)
    await _reads_the_old_rows(PostgresStore(dsn))
    await _reads_the_old_rows_again(PostgresStore(dsn))


async def _reads_the_old_rows_again(store: IdempotencyStore) -> None:
    """A second start (the columns exist now) changes nothing."""
    await store.start()
    try:
        left = await store.get("left")
        assert left is not None
        assert (left.status, left.result_id) == (KeyStatus.DONE, "order-10")
    finally:
        await store.close()
