"""The SQLite idempotency store (the default): one file, shared safely by several processes.

``BEGIN IMMEDIATE`` takes SQLite's write lock before the key is read, so the read, the
decision and the write of one admission are one step for every process using the file.
Calls run in a worker thread so the event loop never waits on the file lock.
A file made by an earlier kit gains the handler-lease columns when a store opens it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

from receiver.records import Decision, KeyRecord, KeyStatus, LeaseTerms, admit

SCHEMA = """
CREATE TABLE IF NOT EXISTS receiver_keys (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    fencing_token INTEGER,
    result_id TEXT,
    error TEXT,
    lease_holder TEXT,
    lease_expires_at REAL
)
"""
# The columns a table made by an earlier version of the kit lacks (NULL there: no lease).
LEASE_COLUMNS = {"lease_holder": "TEXT", "lease_expires_at": "REAL"}
COLUMNS = "status, fencing_token, result_id, error, lease_holder, lease_expires_at"
BUSY_TIMEOUT_S = 30.0


class SqliteStore:
    """Idempotency records in a SQLite file (``":memory:"`` for one process only)."""

    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection: one statement sequence at a time

    async def start(self) -> None:
        """Open the file (WAL mode) and create the table."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        if self._path != ":memory:":
            _owner_only(Path(self._path))
        conn = sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")  # two receivers opening one old file: one migrates
        try:
            conn.execute(SCHEMA)
            present = {row[1] for row in conn.execute("PRAGMA table_info(receiver_keys)")}
            for name, kind in LEASE_COLUMNS.items():
                if name not in present:
                    conn.execute(f"ALTER TABLE receiver_keys ADD COLUMN {name} {kind}")
        except BaseException:
            conn.execute("ROLLBACK")
            conn.close()
            raise
        conn.execute("COMMIT")
        self._conn = conn

    async def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            with self._lock:
                self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the store is not started: call 'await store.start()' first")
        return self._conn

    async def admit(self, key: str, fencing_token: int | None, terms: LeaseTerms) -> Decision:
        """Read, decide and write the key under SQLite's write lock."""
        return await asyncio.to_thread(self._admit, key, fencing_token, terms)

    def _admit(self, key: str, fencing_token: int | None, terms: LeaseTerms) -> Decision:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                decision = admit(_read(conn, key), key, fencing_token, terms)
                _write(conn, decision.record)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return decision

    async def complete(self, key: str, result_id: str, holder: str) -> bool:
        """Mark the key done with the handler's result id, if ``holder`` still holds it."""
        return await asyncio.to_thread(self._settle, key, holder, KeyStatus.DONE, result_id, None)

    async def fail(self, key: str, error: str, holder: str) -> bool:
        """Mark the key failed, if ``holder`` still holds it."""
        return await asyncio.to_thread(self._settle, key, holder, KeyStatus.FAILED, None, error)

    def _settle(
        self, key: str, holder: str, status: KeyStatus, result_id: str | None, error: str | None
    ) -> bool:
        with self._lock:
            cursor = self._connection().execute(
                "UPDATE receiver_keys SET status = ?, result_id = ?, error = ? "
                "WHERE key = ? AND lease_holder = ? AND status = ?",
                (status.value, result_id, error, key, holder, KeyStatus.PROCESSING.value),
            )
            return cursor.rowcount == 1

    async def renew(self, key: str, holder: str, expires_at: float) -> bool:
        """Extend ``holder``'s lease on the key to ``expires_at``, if it still holds it."""
        return await asyncio.to_thread(self._renew, key, holder, expires_at)

    def _renew(self, key: str, holder: str, expires_at: float) -> bool:
        with self._lock:
            cursor = self._connection().execute(
                "UPDATE receiver_keys SET lease_expires_at = MAX(COALESCE(lease_expires_at, 0), ?) "
                "WHERE key = ? AND lease_holder = ? AND status = ?",
                (expires_at, key, holder, KeyStatus.PROCESSING.value),
            )
            return cursor.rowcount == 1

    async def get(self, key: str) -> KeyRecord | None:
        """The key's record, if any."""
        return await asyncio.to_thread(self._get, key)

    def _get(self, key: str) -> KeyRecord | None:
        with self._lock:
            return _read(self._connection(), key)


def _read(conn: sqlite3.Connection, key: str) -> KeyRecord | None:
    row = conn.execute(
        f"SELECT {COLUMNS} FROM receiver_keys WHERE key = ?",  # noqa: S608 - constant columns
        (key,),
    ).fetchone()
    if row is None:
        return None
    return KeyRecord(key, KeyStatus(row[0]), *row[1:])


def _write(conn: sqlite3.Connection, record: KeyRecord) -> None:
    conn.execute(
        f"INSERT INTO receiver_keys (key, {COLUMNS}) "  # noqa: S608 - constant columns
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET status = excluded.status, "
        "fencing_token = excluded.fencing_token, result_id = excluded.result_id, "
        "error = excluded.error, lease_holder = excluded.lease_holder, "
        "lease_expires_at = excluded.lease_expires_at",
        (
            record.key,
            record.status.value,
            record.fencing_token,
            record.result_id,
            record.error,
            record.lease_holder,
            record.lease_expires_at,
        ),
    )


def _owner_only(path: Path) -> None:
    """Received keys and payload hashes: the file 0600 (SQLite gives its WAL the same
    mode) and any folder made for it 0700. The ledger's events/private_files.py rule,
    kept here because the kit imports nothing of the ledger."""
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    for created in missing:
        os.chmod(created, 0o700)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
