"""The embedded backend: one SQLite file (WAL) in the data dir."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from events.private_files import private_dir, private_file
from projections.staging import stage_name
from projections.store import Store

# A rebuild's page cache (KiB): the batch's lookups and upserts touch pages all over the
# tables, and SQLite's default of 2 MB sends most of them back to the OS.
_BULK_CACHE_KIB = 256 * 1024


class SqliteStore(Store):
    """A projection in a SQLite file; readers (``ledger status``) never block the writer."""

    placeholder = "?"
    rebuild_writes_in_thread = False
    # Locks, I/O, a closed connection: the database's failures, not a record's.
    system_errors = (
        sqlite3.OperationalError,
        sqlite3.InterfaceError,
        sqlite3.InternalError,
        OSError,
        MemoryError,
    )

    def __init__(self, dsn: str, path: Path) -> None:
        super().__init__(dsn)
        # The projection holds payloads and recipients: owner only (the WAL and shared
        # memory files SQLite makes beside it take the database file's mode).
        if str(path) != ":memory:":  # SQLite's in-memory database is no file
            private_dir(path.parent, ours=False)
            private_file(path)
        self._path = path
        self._conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch and its
        # offsets are exactly one transaction. check_same_thread=False: the projector
        # hands the connection to one worker thread at a time (asyncio.to_thread).
        conn = sqlite3.connect(
            self._path, isolation_level=None, timeout=30.0, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL never corrupts and never splits a transaction; a power cut
        # may lose the last commits, which the projector then re-reads from Kafka.
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

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

    def reconnect(self) -> None:
        """Close the file and open it again (after a lock timeout or an I/O error)."""
        with contextlib.suppress(*self.system_errors):
            self._conn.close()
        self._conn = self._connect()

    def table_names(self) -> set[str]:
        """Tables in the file."""
        rows = self._execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}

    def index_names(self) -> set[str]:
        """Indexes in the file."""
        rows = self._execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        return {name for (name,) in rows}

    def _relax_durability(self, relaxed: bool) -> None:
        """While relaxed, commits and checkpoints are not synced (the WAL still makes each
        commit atomic, and a crashed process loses nothing: only a power cut can) and more
        pages stay in memory. FULL syncs the WAL at the next commit; ``_bulk_load_done``
        syncs the database file, which unsynced checkpoints wrote to."""
        if relaxed:
            self._conn.execute("PRAGMA synchronous=OFF")
            self._conn.execute(f"PRAGMA cache_size=-{_BULK_CACHE_KIB}")
        else:
            self._conn.execute("PRAGMA synchronous=FULL")

    def _bulk_load_done(self) -> None:
        """Move the log into the file, sync the file, go back to the usual settings."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # The checkpoint syncs the file too, unless a reader kept it from finishing: sync
        # it ourselves, so pages that relaxed checkpoints wrote are on disk either way.
        fd = os.open(self._path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA cache_size=-2000")

    # Staging (a parallel rebuild): a file beside this one per worker, attached to merge.

    def _stage_path(self, name: str) -> Path:
        return self._path.with_name(f"{self._path.name}.{stage_name(name)}")

    def open_stage(self, name: str) -> str:
        """A fresh file beside this one: its own writer lock, so workers never wait on
        each other's commits."""
        self.drop_stage(name)
        return f"sqlite://{self._stage_path(name)}"

    def drop_stage(self, name: str) -> None:
        """Delete the stage's file (and its WAL)."""
        path = self._stage_path(name)
        for suffix in ("", "-wal", "-shm", "-journal"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)

    def _attach_stages(self, names: Sequence[str]) -> None:
        # ATTACH is refused inside a transaction: attach them all before it begins.
        for name in names:
            self._conn.execute(
                f"ATTACH DATABASE ? AS {stage_name(name)}", (str(self._stage_path(name)),)
            )

    def _detach_stages(self, names: Sequence[str]) -> None:
        attached = {row[1] for row in self._conn.execute("PRAGMA database_list")}
        for name in names:
            if stage_name(name) in attached:
                self._conn.execute(f"DETACH DATABASE {stage_name(name)}")
