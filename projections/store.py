"""The projection store: one SQL implementation, two backends (SQLite and PostgreSQL).

Backends differ only in how they connect, lock, spell placeholders and name column
types; loading rows, folding, upserting and the offsets live here, once. A batch of
events and the offsets it consumed commit in ONE database transaction, so each event
is applied exactly once whatever kills the process.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Literal

from events.errors import LedgerError
from events.faults import crash_if_enabled
from events.model import DeliveryEvent
from events.refusal import Refuser, one_line, refusal
from projections.fold import Batch, Position, Row, apply
from projections.records import LogRecord
from projections.schema import (
    AGENT_RUNS,
    DELIVERIES,
    DELIVERY_ATTEMPTS,
    DUPLICATE_KEYS,
    INDEXES,
    PROJECTION_META,
    PROJECTION_OFFSETS,
    SCHEMA_VERSION,
    SKIPPED_RECORDS,
    TABLES,
    Table,
)

# Fault-injection point (settings.faults): SIGKILL after a batch's rows are written but
# before its transaction commits.
PROJECTOR_MID_BATCH = "projector.mid_batch"

Offsets = dict[tuple[str, int], int]
Dump = dict[str, list[tuple[Any, ...]]]
Mode = Literal["project", "rebuild", "read"]

log = logging.getLogger(__name__)

# SQL here is assembled only from the constant table definitions in schema.py (the S608
# no-qa marks below); every value travels as a bound parameter.

# Bound the number of parameters per statement (SQLite's limit is 32766).
_CHUNK = 900


class RecordRefused(Exception):
    """One record the projection cannot fold or write; the batch was rolled back."""

    def __init__(self, record: LogRecord, reason: str) -> None:
        super().__init__(reason)
        self.record = record
        self.reason = reason


class BatchUnwritable(Exception):
    """A batch whose rows the database refused for a reason that is not its own failure;
    rolled back: write its records one at a time to find the record."""


class DatabaseUnreachable(LedgerError):
    """The database did not answer (down, restarting, out of connections): worth another
    try later, unlike a configuration error (a plain ``LedgerError``)."""


class Store(ABC):
    """A projection database. Use ``open_store(dsn)``; close it when done."""

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

    def _drop(self, names: Iterable[str]) -> None:
        self.begin()
        for name in sorted(names):
            self._execute(f"DROP TABLE {name}")
        self.commit()

    # Staging (a parallel rebuild) -------------------------------------------------------

    @abstractmethod
    def open_stage(self, name: str) -> str:
        """Create an empty staging area called ``name`` beside this projection, and return
        a DSN for it: a parallel rebuild's worker builds its share of the tables there
        (projections/parallel_rebuild.py). An old stage of that name is dropped first."""

    @abstractmethod
    def drop_stage(self, name: str) -> None:
        """Remove the staging area ``name``, if it exists."""

    def merge_stages(self, names: Sequence[str]) -> None:
        """Copy every row of the ledger tables of the stages ``names`` (all but
        ``projection_meta``, which ``prepare`` wrote here) into this projection, offsets
        included, in ONE transaction: either all of the rebuild is here or none of it."""
        self._attach_stages(names)
        try:
            self.begin()
            try:
                for name in names:
                    for table in TABLES:
                        if table is PROJECTION_META:
                            continue
                        cols = ", ".join(table.column_names)
                        source = self._stage_table(name, table.name)
                        self._execute(
                            f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {source}"  # noqa: S608
                        )
            except BaseException:
                self.rollback()
                raise
            self.commit()
        finally:
            self._detach_stages(names)

    def _attach_stages(self, names: Sequence[str]) -> None:
        """Make the stages' tables visible to this connection (SQLite attaches files)."""
        return

    def _detach_stages(self, names: Sequence[str]) -> None:
        """Undo ``_attach_stages``."""
        return

    def _stage_table(self, name: str, table: str) -> str:
        """How this connection names ``table`` of stage ``name`` in SQL: an attached
        SQLite database and a PostgreSQL schema are both qualified by the stage's name."""
        return f"{stage_name(name)}.{table}"

    # Applying a batch ---------------------------------------------------------------

    def load_offsets(self) -> Offsets:
        """The next offset to read, per (topic, partition) this projection has consumed."""
        rows = self._execute("SELECT topic, kafka_partition, next_offset FROM projection_offsets")
        return {(topic, part): offset for topic, part, offset in rows}

    def apply_records(
        self,
        records: Sequence[LogRecord],
        faults: frozenset[str],
        refused: Mapping[Position, str] | None = None,
    ) -> Batch:
        """Fold records into the tables and store the offsets they consumed, atomically.

        Records at or past an offset already stored are applied; earlier ones (another
        projector got there first) are dropped inside the transaction. Records in
        ``refused`` are skipped with their reason. The record guard: an exception while
        folding one record rolls the transaction back and raises ``RecordRefused`` naming
        it (the caller applies the batch again with it refused); an exception while
        writing a batch of several records that is not the database's own failure
        (``system_errors``) raises ``BatchUnwritable`` (the caller writes them one by one).
        """
        refused = refused or {}
        self.begin()
        try:
            stored = self.load_offsets()
            fresh = [
                r
                for r in records
                if r.position.offset >= stored.get((r.position.topic, r.position.partition), 0)
            ]
            batch = Batch()
            self._load(batch, fresh)
            offsets: Offsets = {}
            for record in fresh:
                where = record.position
                if where in refused:
                    batch.skip(where, refused[where])
                elif record.event is None:
                    batch.skip(where, record.reason or "undecodable")
                else:
                    try:
                        apply(batch, where, record.event)
                    except Exception as exc:  # noqa: BLE001 - the record guard: a pure fold
                        raise RecordRefused(record, _refusal(where, exc)) from None
                ident = (where.topic, where.partition)
                offsets[ident] = max(offsets.get(ident, 0), where.offset + 1)
            try:
                self._write(batch, offsets)
            except self.system_errors:
                raise
            except Exception as exc:  # noqa: BLE001 - the record guard: what a row cannot hold
                if len(fresh) != 1:
                    raise BatchUnwritable(one_line(exc)) from None
                raise RecordRefused(fresh[0], _refusal(fresh[0].position, exc)) from None
            crash_if_enabled(PROJECTOR_MID_BATCH, faults)
        except BaseException:
            self.rollback()
            raise
        self.commit()
        for row in batch.skipped:
            log.warning("skipped %(topic)s[%(kafka_partition)s]@%(record_offset)s: %(reason)s", row)
        return batch

    def _load(self, batch: Batch, records: Sequence[LogRecord]) -> None:
        run_ids: set[str] = set()
        keys: set[str] = set()
        for record in records:
            event = record.event
            if event is None:
                continue
            # isinstance, not getattr with a default: a pydantic model raises (and the
            # default swallows) an AttributeError for every run event.
            if isinstance(event, DeliveryEvent):
                keys.add(event.idempotency_key)
            else:
                run_ids.add(event.run_id)
        for row in self._select_in(AGENT_RUNS, "run_id", run_ids):
            batch.runs[row["run_id"]] = row
        for row in self._select_in(DELIVERIES, "idempotency_key", keys):
            batch.deliveries[row["idempotency_key"]] = row
        for row in self._select_in(DELIVERY_ATTEMPTS, "idempotency_key", keys):
            batch.attempts[(row["idempotency_key"], row["attempt"])] = row

    def _select_in(self, table: Table, column: str, values: set[str]) -> list[Row]:
        names = table.column_names
        found: list[Row] = []
        ordered = sorted(values)
        for start in range(0, len(ordered), _CHUNK):
            chunk = ordered[start : start + _CHUNK]
            marks = ", ".join([self.placeholder] * len(chunk))
            sql = f"SELECT {', '.join(names)} FROM {table.name} WHERE {column} IN ({marks})"  # noqa: S608
            found += [dict(zip(names, row, strict=True)) for row in self._execute(sql, chunk)]
        return found

    def _write(self, batch: Batch, offsets: Offsets) -> None:
        self._upsert(AGENT_RUNS, [batch.runs[k] for k in sorted(batch.dirty_runs)])
        self._upsert(DELIVERIES, batch.changed_deliveries())
        self._upsert(DELIVERY_ATTEMPTS, [batch.attempts[k] for k in sorted(batch.dirty_attempts)])
        self._upsert(DUPLICATE_KEYS, batch.duplicates, update=False)
        self._upsert(SKIPPED_RECORDS, batch.skipped, update=False)
        self._upsert(
            PROJECTION_OFFSETS,
            [
                {"topic": t, "kafka_partition": p, "next_offset": o}
                for (t, p), o in sorted(offsets.items())
            ],
        )

    def _upsert(self, table: Table, rows: Sequence[Row], *, update: bool = True) -> None:
        if not rows:
            return
        names = table.column_names
        marks = ", ".join([self.placeholder] * len(names))
        changes = [n for n in names if n not in table.key]
        action = (
            "DO UPDATE SET " + ", ".join(f"{n} = excluded.{n}" for n in changes)
            if update and changes
            else "DO NOTHING"
        )
        sql = (
            f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({marks}) "  # noqa: S608
            f"ON CONFLICT ({', '.join(table.key)}) {action}"
        )
        # itemgetter builds each parameter tuple in C (a tuple for two or more names).
        values = itemgetter(*names) if len(names) > 1 else lambda row: (row[names[0]],)
        self._executemany(sql, list(map(values, rows)))

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


def _refusal(where: Position, exc: BaseException) -> str:
    return refusal(Refuser.PROJECTOR, where.topic, where.partition, where.offset, exc)


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


def stage_name(name: str) -> str:
    """A stage name usable as an unquoted SQL identifier (and a file suffix)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise ValueError(f"bad stage name {name!r}")
    return name
