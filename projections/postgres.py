"""The production backend: PostgreSQL through psycopg 3."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import psycopg

from events.errors import LedgerError
from events.outage import config_problem
from projections.database import DatabaseUnreachable, redacted
from projections.staging import stage_name
from projections.store import Store

# pg_advisory_xact_lock key: one projector writes a database at a time.
_WRITER_LOCK = 0x1ED6E5


class PostgresStore(Store):
    """A projection in a PostgreSQL database (the DSN's current schema)."""

    placeholder = "%s"
    # A lost connection, a server shutting down, a pool problem: never one record's fault.
    system_errors = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        psycopg.InternalError,
        DatabaseUnreachable,
        OSError,
        MemoryError,
    )
    # Byte-order text ("C") and 64-bit integers: the same ordering and range as SQLite.
    column_types = {"TEXT": 'TEXT COLLATE "C"', "INTEGER": "BIGINT"}

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            # autocommit: transactions are explicit BEGIN/COMMIT, exactly one per batch.
            return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if config_problem(exc):
                raise LedgerError(
                    f"cannot connect to {redacted(self.dsn)}: {first}",
                    "check the DSN: its user, password and database",
                ) from None
            raise DatabaseUnreachable(
                f"cannot connect to {redacted(self.dsn)}: {first}",
                "check the DSN and that PostgreSQL is running",
            ) from None

    def reconnect(self) -> None:
        """Close the connection (broken or not) and open a new one."""
        with contextlib.suppress(*self.system_errors):
            self._conn.close()
        self._conn = self._connect()

    def _run(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        cursor = self._conn.execute(sql, params or None)
        if cursor.description is None:
            return [], []
        return [d.name for d in cursor.description], cursor.fetchall()

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        # psycopg 3 pipelines executemany: one round trip per batch, not per row.
        with self._conn.cursor() as cursor:
            cursor.executemany(sql, rows)

    def begin(self) -> None:
        """Start a transaction and take the writer lock (released at commit).

        One lock per schema: the projection lives in the DSN's current schema, and a
        parallel rebuild's workers each write their own staging schema at once."""
        self._conn.execute("BEGIN")
        self._conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(coalesce(current_schema(), '')))",
            (_WRITER_LOCK,),
        )

    def begin_read(self) -> None:
        """A snapshot for the whole transaction."""
        self._conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def commit(self) -> None:
        """Commit the open transaction."""
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        """Abandon the open transaction, if any (a lost connection took it with it)."""
        if not self._conn.closed and not self._conn.broken:
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def table_names(self) -> set[str]:
        """Tables in the connection's current schema."""
        rows = self._execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        return {name for (name,) in rows}

    def index_names(self) -> set[str]:
        """Indexes in the connection's current schema."""
        rows = self._execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
        return {name for (name,) in rows}

    def _relax_durability(self, relaxed: bool) -> None:
        """While relaxed, a commit does not wait for its WAL flush (the server stays
        consistent; a crash loses the last commits, which a rebuild re-reads). The
        commit of the indexes, last, waits again, and flushes everything before it."""
        self._execute(f"SET synchronous_commit = {'off' if relaxed else 'on'}")

    def _bulk_load_done(self) -> None:
        """Nothing to tidy: the durable commit already restored the usual setting."""

    # Staging (a parallel rebuild): a schema per worker in this database.

    def open_stage(self, name: str) -> str:
        """A fresh schema in this database, and this DSN with it as the search path."""
        schema = stage_name(name)
        self._execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        self._execute(f"CREATE SCHEMA {schema}")
        option = "options=" + quote(f"-csearch_path={schema}", safe="")
        return f"{self.dsn}{'&' if '?' in self.dsn else '?'}{option}"

    def drop_stage(self, name: str) -> None:
        """Drop the stage's schema and its tables."""
        self._execute(f"DROP SCHEMA IF EXISTS {stage_name(name)} CASCADE")
