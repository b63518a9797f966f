"""The projection store: applying records. Loading the rows a batch touches, folding,
upserting and the offsets live here, once, for both backends. A batch of events and the
offsets it consumed commit in ONE database transaction, so each event is applied exactly
once whatever kills the process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from operator import itemgetter

from events.budgets import BudgetEvent
from events.endpoints import EndpointEvent
from events.faults import crash_if_enabled
from events.model import DeliveryEvent
from events.refusal import Refuser, one_line, refusal
from projections.budget_fold import book_of_row, book_row, budget_rows
from projections.fold import Batch, Position, Row, apply
from projections.records import LogRecord
from projections.schema import (
    AGENT_RUNS,
    BUDGET_BOOKS,
    BUDGETS,
    DELIVERIES,
    DELIVERY_ATTEMPTS,
    DUPLICATE_KEYS,
    ENDPOINTS,
    OPERATOR_ACTIONS,
    PROJECTION_OFFSETS,
    SKIPPED_RECORDS,
    Table,
)
from projections.staging import Staging

# Fault-injection point (settings.faults): SIGKILL after a batch's rows are written but
# before its transaction commits.
PROJECTOR_MID_BATCH = "projector.mid_batch"

Offsets = dict[tuple[str, int], int]

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


class Store(Staging):
    """A projection database: its schema and reads (``Database``), its stages
    (``Staging``) and applying records. Use ``open_store(dsn)``; close it when done."""

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
        endpoint_ids: set[str] = set()
        agents: set[str] = set()
        for record in records:
            event = record.event
            if event is None:
                continue
            # isinstance, not getattr with a default: a pydantic model raises (and the
            # default swallows) an AttributeError for every run event.
            if isinstance(event, DeliveryEvent):
                keys.add(event.idempotency_key)
            elif isinstance(event, EndpointEvent):
                endpoint_ids.add(event.endpoint_id)
            elif isinstance(event, BudgetEvent):
                agents.add(event.agent)
            else:
                run_ids.add(event.run_id)
        for row in self._select_in(AGENT_RUNS, "run_id", run_ids):
            batch.runs[row["run_id"]] = row
        for row in self._select_in(DELIVERIES, "idempotency_key", keys):
            batch.deliveries[row["idempotency_key"]] = row
        for row in self._select_in(DELIVERY_ATTEMPTS, "idempotency_key", keys):
            batch.attempts[(row["idempotency_key"], row["attempt"])] = row
        for row in self._select_in(ENDPOINTS, "endpoint_id", endpoint_ids):
            batch.endpoints[row["endpoint_id"]] = row
        for row in self._select_in(BUDGET_BOOKS, "agent", agents):
            batch.budget_books[row["agent"]] = book_of_row(row)

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
        self._upsert(OPERATOR_ACTIONS, batch.operator_actions, update=False)
        self._upsert(ENDPOINTS, [batch.endpoints[k] for k in sorted(batch.dirty_endpoints)])
        self._write_budgets(batch)
        self._upsert(SKIPPED_RECORDS, batch.skipped, update=False)
        self._upsert(
            PROJECTION_OFFSETS,
            [
                {"topic": t, "kafka_partition": p, "next_offset": o}
                for (t, p), o in sorted(offsets.items())
            ],
        )

    def _write_budgets(self, batch: Batch) -> None:
        """Each touched agent's book, and its budgets rows in place of the old ones (a
        cleared budget's row goes)."""
        touched = sorted(batch.dirty_budgets.items())
        if not touched:
            return
        agents = [agent for agent, _ in touched]
        for start in range(0, len(agents), _CHUNK):
            chunk = agents[start : start + _CHUNK]
            marks = ", ".join([self.placeholder] * len(chunk))
            self._execute(f"DELETE FROM {BUDGETS.name} WHERE agent IN ({marks})", chunk)  # noqa: S608
        books = batch.budget_books
        self._upsert(BUDGET_BOOKS, [book_row(a, books[a], at) for a, at in touched])
        self._upsert(BUDGETS, [row for a, at in touched for row in budget_rows(books[a], at)])

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


def _refusal(where: Position, exc: BaseException) -> str:
    return refusal(Refuser.PROJECTOR, where.topic, where.partition, where.offset, exc)
