"""A projection database: one SQL implementation, two backends (SQLite and PostgreSQL).

Backends differ only in how they connect, lock, spell placeholders and name column
types; the schema and its version, bulk loading and reading live here, once. Staging for
the parallel rebuild is ``projections/staging.py``; applying records is
``projections/store.py``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

from events.errors import LedgerError
from projections.fold import Row
from projections.schema import (
    INDEXES,
    PROJECTION_META,
    SCHEMA_VERSION,
    TABLES,
    Table,
)

Dump = dict[str, list[tuple[Any, ...]]]
Mode = Literal["project", "rebuild", "read"]

# SQL here is assembled only from the constant table definitions in schema.py (the S608
# no-qa marks below); every value travels as a bound parameter.


class DatabaseUnreachable(LedgerError):
    """The database did not answer (down, restarting, out of connections): worth another
    try later, unlike a configuration error (a plain ``LedgerError``)."""


class Database(ABC):
    """A projection database's connection, schema and reads (``projections/store.py``:
    ``Store``, what ``open_store(dsn)`` returns, adds staging and applying records)."""

    placeholder: str = "?"
    # The database's own failures (connection, disk, locks): never about one record.
    system_errors: tuple[type[BaseException], ...] = (OSError, MemoryError)
    column_types: dict[str, str] = {}
    # Whether a rebuild writes each batch in a thread while the next is read and decoded:
    # worth it when the statements run in another process (a database server), not when
    # they run in ours under the GIL (projections/projector.py: rebuild).
    rebuild_writes_in_thread: bool = True

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    # What each backend provides ---------------------------------------------------

    @abstractmethod
    def _run(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one statement; its column names and rows (both empty for non-queries)."""

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(sql, params)[1]

    @abstractmethod
    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for many parameter rows."""

    @abstractmethod
    def begin(self) -> None:
        """Start a write transaction, holding the projection's writer lock."""

    @abstractmethod
    def begin_read(self) -> None:
        """Start a read-only transaction that sees one consistent snapshot."""

    @abstractmethod
    def commit(self) -> None:
        """Commit the open transaction."""

    @abstractmethod
    def rollback(self) -> None:
        """Abandon the open transaction."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""

    @abstractmethod
    def reconnect(self) -> None:
        """Replace the connection after the database's own failure (``system_errors``):
        raises ``DatabaseUnreachable`` (or a system error) while it still does not answer,
        ``LedgerError`` for a configuration error."""

    @abstractmethod
    def table_names(self) -> set[str]:
        """Tables that exist in the database (or schema)."""

    @abstractmethod
    def index_names(self) -> set[str]:
        """Indexes that exist in the database (or schema)."""

    # Schema and version -------------------------------------------------------------

    def prepare(self, mode: Mode, *, replace: bool = False) -> None:
        """Make the schema ready for ``mode``, or raise ``LedgerError`` saying why not.

        ``project`` creates an empty schema or checks the stored version; ``rebuild``
        needs an empty database (or ``replace`` to drop the ledger tables first);
        ``read`` needs an existing projection of the current version.
        """
        ours = {t.name for t in TABLES} & self.table_names()
        if mode == "rebuild" and ours:
            if not replace:
                raise LedgerError(
                    f"{redacted(self.dsn)} already holds ledger tables",
                    "rebuild into an empty database, or pass --replace to drop them first",
                )
            self._drop(ours)
            ours = set()
        if not ours:
            if mode == "read":
                raise LedgerError(
                    f"no projection at {redacted(self.dsn)}",
                    "build one with 'ledger project' or 'ledger rebuild --into DSN'",
                )
            self._create()
            return
        if PROJECTION_META.name not in ours:
            raise LedgerError(
                f"{redacted(self.dsn)} has ledger tables but no projection_meta",
                "rebuild into an empty database with 'ledger rebuild --into DSN'",
            )
        self.check_version()
        if mode == "project":
            self.ensure_indexes()

    def check_version(self) -> None:
        """Raise a one-line ``LedgerError`` unless the stored schema is ours."""
        found = self.rows("SELECT value FROM projection_meta WHERE name = ?", ("schema_version",))
        stored = found[0]["value"] if found else "none"
        if stored != str(SCHEMA_VERSION):
            raise LedgerError(
                f"projection schema at {redacted(self.dsn)} is version {stored}, this ledger "
                f"needs version {SCHEMA_VERSION}: rebuild it from the log",
                "ledger rebuild --into DSN (add --replace to overwrite this database)",
            )

    def _create(self) -> None:
        self.begin()
        try:
            for table in TABLES:
                self._execute(self._create_sql(table))
            for index in INDEXES:
                self._execute(index)
            self._execute(
                f"INSERT INTO projection_meta (name, value) VALUES ({self.placeholder}, "  # noqa: S608
                f"{self.placeholder})",
                ("schema_version", str(SCHEMA_VERSION)),
            )
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def _create_sql(self, table: Table) -> str:
        return table.create_sql(self.column_types)

    def ensure_indexes(self) -> None:
        """Create any secondary index that is missing (a rebuild that stopped before its
        end leaves them out: see ``start_bulk_load``)."""
        if {_index_name(index) for index in INDEXES} - self.index_names():
            self._create_indexes()

    def _create_indexes(self) -> None:
        self.begin()
        try:
            for index in INDEXES:
                self._execute(index.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
        except BaseException:
            self.rollback()
            raise
        self.commit()

    # Bulk loading (a rebuild into a fresh database) -------------------------------------

    def start_bulk_load(self) -> None:
        """Make the coming batches cheaper to write into this freshly prepared database.

        The secondary indexes are dropped (``finish_bulk_load`` builds them once, in one
        pass over the rows, instead of updating them row by row), and the backend may
        relax per-commit durability: a rebuild that dies is run again from offset 0.
        Every batch still commits with its offsets, so what is written stays exactly-once.
        """
        self.begin()
        try:
            for index in INDEXES:
                self._execute(f"DROP INDEX IF EXISTS {_index_name(index)}")
        except BaseException:
            self.rollback()
            raise
        self.commit()
        self._relax_durability(True)

    def finish_bulk_load(self) -> None:
        """Build the secondary indexes in one durable commit, then let the backend make
        every commit before it durable too."""
        self._relax_durability(False)
        self._create_indexes()
        self._bulk_load_done()

    @abstractmethod
    def _relax_durability(self, relaxed: bool) -> None:
        """Trade per-commit durability for speed while ``relaxed``;
        after ``relaxed=False``, the next commit is durable along with all before it."""

    @abstractmethod
    def _bulk_load_done(self) -> None:
        """Tidy up after the durable commit that ends a bulk load."""

    @contextlib.contextmanager
    def rebuilding(self, *, replace: bool = False) -> Iterator[None]:
        """``prepare("rebuild")``, and if the block then fails (a broker that does not
        answer, a missing verify key, an interrupt), the tables it made are dropped again:
        a rebuild that did not finish leaves no half-filled projection behind, and the
        next one needs no ``--replace``."""
        self.prepare("rebuild", replace=replace)
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.rollback()  # a batch's transaction the failure left open
            with contextlib.suppress(Exception):
                self._drop({t.name for t in TABLES} & self.table_names())
            raise

    def _drop(self, names: Iterable[str]) -> None:
        self.begin()
        for name in sorted(names):
            self._execute(f"DROP TABLE {name}")
        self.commit()

    # Reading ------------------------------------------------------------------------

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run a read-only query written with ``?`` placeholders; rows as dicts."""
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        names, found = self._run(sql, params)
        return [dict(zip(names, row, strict=True)) for row in found]

    def dump(self) -> Dump:
        """Every table's rows, in primary-key order: equal dumps mean equal projections."""
        result: Dump = {}
        # One snapshot: the offsets dumped are exactly those of the rows dumped.
        self.begin_read()
        try:
            for table in TABLES:
                names = table.column_names
                rows = self._execute(f"SELECT {', '.join(names)} FROM {table.name}")  # noqa: S608
                key_at = [names.index(k) for k in table.key]
                result[table.name] = sorted(
                    (tuple(row) for row in rows), key=lambda r: tuple(r[i] for i in key_at)
                )
        finally:
            self.rollback()
        return result


def _index_name(create_sql: str) -> str:
    """``deliveries_run`` from ``CREATE INDEX deliveries_run ON ...``."""
    return create_sql.split()[2]


def redacted(dsn: str) -> str:
    """The DSN without its password, for messages."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or "@" not in rest:
        return dsn
    auth, _, host = rest.rpartition("@")
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in auth else dsn
