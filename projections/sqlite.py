"""The embedded backend: one SQLite file (WAL) in the data dir."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from projections.store import Store


class SqliteStore(Store):
    """A projection in a SQLite file; readers (``ledger status``) never block the writer."""

    placeholder = "?"

    def __init__(self, dsn: str, path: Path) -> None:
        super().__init__(dsn)
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch and its
        # offsets are exactly one transaction. check_same_thread=False: the projector
        # hands the connection to one worker thread at a time (asyncio.to_thread).
        self._conn = sqlite3.connect(
            path, isolation_level=None, timeout=30.0, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL never corrupts and never splits a transaction; a power cut
        # may lose the last commits, which the projector then re-reads from Kafka.
        self._conn.execute("PRAGMA synchronous=NORMAL")

    def _run(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        cursor = self._conn.execute(sql, params)
        names = [d[0] for d in cursor.description] if cursor.description else []
        return names, cursor.fetchall()

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    def begin(self) -> None:
        """IMMEDIATE takes the write lock now: a second projector waits, then sees our offsets."""
        self._conn.execute("BEGIN IMMEDIATE")

    def begin_read(self) -> None:
        """A deferred transaction: in WAL mode its first read pins a snapshot."""
        self._conn.execute("BEGIN")

    def commit(self) -> None:
        """Commit the open transaction."""
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        """Abandon the open transaction, if any."""
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        """Close the file."""
        self._conn.close()

    def table_names(self) -> set[str]:
        """Tables in the file."""
        rows = self._execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}
