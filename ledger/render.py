"""Renderings of replayed events (one-liners, a table, JSON lines, CSV, Parquet) and of
one run's timeline for the terminal."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from events.deadletter import DeadLetter
from events.redaction import redacted_text
from ledger.errors import UsageError
from ledger.replay import ReplayedRecord
from projections.incident import RunView

SKIP = {
    "type",
    "schema_version",
    "event_id",
    "occurred_at",
    "producer",
    "run_id",
    "idempotency_key",
    "payload",
}


def event_line(record: ReplayedRecord) -> str:
    """``time topic/partition@offset type run key details``."""
    where = f"{record.topic}/{record.partition}@{record.offset}"
    if record.deadletter is not None:
        stamp = record.occurred_at.strftime("%H:%M:%S.%f")[:-3]
        return f"{stamp} {where} deadletter {_letter(record.deadletter)}"
    if record.event is None:
        stamp = datetime.fromtimestamp(record.timestamp_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
        return f"{stamp} {where} UNDECODABLE {record.error}"
    event = record.event
    stamp = event.occurred_at.strftime("%H:%M:%S.%f")[:-3]
    key = getattr(event, "idempotency_key", None)
    details = " ".join(
        f"{name}={value}"
        for name, value in event.model_dump(mode="json").items()
        if name not in SKIP and value is not None
    ).replace(f"payload_hash={getattr(event, 'payload_hash', '')}", "")
    key_part = f" key={key[:12]}" if key else ""
    line = f"{stamp} {where} {event.type} run={event.run_id}{key_part} {details}".rstrip()
    return redacted_text(line)  # events in the log may carry credentials in URLs


# Exports ----------------------------------------------------------------------------

# One flat row per record. ``event`` is the whole event as JSON, so every export can be
# decoded back into the exact event; the other columns are there to filter and sort on.
COLUMNS = (
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "type",
    "occurred_at",
    "run_id",
    "idempotency_key",
    "event_id",
    "error",
    "event",
    "deadletter",
)


def record_row(record: ReplayedRecord) -> dict[str, Any]:
    """The record as a flat row of ``COLUMNS``."""
    event = record.event
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "type": event.type if event else None,
        "occurred_at": event.occurred_at.isoformat() if event else None,
        "run_id": event.run_id if event else None,
        "idempotency_key": getattr(event, "idempotency_key", None),
        "event_id": str(event.event_id) if event else None,
        "error": record.error,
        "event": event.model_dump_json() if event else None,
        "deadletter": record.deadletter.model_dump_json() if record.deadletter else None,
    }


def record_json(record: ReplayedRecord) -> dict[str, Any]:
    """The JSON-lines shape: position, then the event (or the decoding error)."""
    line: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
    }
    if record.event is not None:
        line["event"] = record.event.model_dump(mode="json")
    elif record.deadletter is not None:
        line["deadletter"] = record.deadletter.model_dump(mode="json")
    else:
        line["error"] = record.error
    return line


def _letter(letter: DeadLetter) -> str:
    """What a dead letter says, in one line (not its bytes)."""
    origin = f"{letter.original_topic}/{letter.original_partition}@{letter.original_offset}"
    return f"of {origin} by {letter.detected_by}: {letter.reason}"


class RecordWriter(Protocol):
    """Writes replayed records somewhere; ``close`` flushes."""

    def write(self, record: ReplayedRecord) -> None:
        """Write one record."""

    def close(self) -> None:
        """Flush and finish the output."""


class JsonLinesWriter:
    """One JSON object per line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, record: ReplayedRecord) -> None:
        """Write one record."""
        self._stream.write(json.dumps(record_json(record)) + "\n")

    def close(self) -> None:
        """Flush."""
        self._stream.flush()


class CsvWriter:
    """CSV with a header row of ``COLUMNS``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._csv = csv.DictWriter(stream, fieldnames=COLUMNS)
        self._csv.writeheader()

    def write(self, record: ReplayedRecord) -> None:
        """Write one record."""
        self._csv.writerow(record_row(record))

    def close(self) -> None:
        """Flush."""
        self._stream.flush()


class ParquetWriter:
    """Parquet (pyarrow), written in row groups so memory stays bounded on long replays."""

    GROUP = 50_000

    def __init__(self, path: Path) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(
                "parquet output needs pyarrow: pip install 'delivery-ledger[parquet]'",
                "or choose another --format (jsonl, csv, table, line)",
            ) from None

        self._pa = pa
        self._schema = pa.schema(
            [
                (
                    name,
                    pa.int64() if name in ("partition", "offset", "timestamp_ms") else pa.string(),
                )
                for name in COLUMNS
            ]
        )
        self._writer = pq.ParquetWriter(str(path), self._schema)
        self._rows: list[dict[str, Any]] = []

    def write(self, record: ReplayedRecord) -> None:
        """Buffer one record; a full buffer becomes a row group."""
        self._rows.append(record_row(record))
        if len(self._rows) >= self.GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            table = self._pa.Table.from_pylist(self._rows, schema=self._schema)
            self._writer.write_table(table)
            self._rows = []

    def close(self) -> None:
        """Write the last row group and the footer (an empty replay is a valid empty file)."""
        self._flush()
        self._writer.close()


class LineWriter:
    """The human one-liner per event (``event_line``)."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def write(self, record: ReplayedRecord) -> None:
        """Print one record."""
        self._console.print(event_line(record), highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Nothing buffered."""


class TableWriter:
    """A rich table, printed at the end (columns need every row to size themselves)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._table = Table("time (UTC)", "where", "type", "run", "key", "details")
        for column in self._table.columns:
            column.overflow = "fold"

    def write(self, record: ReplayedRecord) -> None:
        """Add one row."""
        where = f"{record.topic}/{record.partition}@{record.offset}"
        stamp = record.occurred_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        event = record.event
        if record.deadletter is not None:
            self._table.add_row(stamp, where, "deadletter", "-", "-", _letter(record.deadletter))
            return
        if event is None:
            self._table.add_row(stamp, where, "UNDECODABLE", "-", "-", record.error or "")
            return
        key = getattr(event, "idempotency_key", None)
        self._table.add_row(
            stamp, where, event.type, event.run_id, key[:12] if key else "-", _details(event)
        )

    def close(self) -> None:
        """Print the table."""
        self._console.print(self._table)


def _details(event: Any) -> str:
    return redacted_text(
        " ".join(
            f"{name}={value}"
            for name, value in event.model_dump(mode="json").items()
            if name not in SKIP and name != "payload_hash" and value is not None
        )
    )


# One run's timeline, for the terminal ------------------------------------------------


def timeline_lines(view: RunView) -> list[str]:
    """The three answers, then every entry with its offset from the first (rich markup)."""
    lines = [
        f"[bold]run {escape(view.run_id)}[/]",
        f"  did execution finish?  {escape(view.execution)}",
    ]
    for d in view.deliveries:
        row = d.delivery
        lines.append(
            f"  did it leave?          {escape(row['channel'])} {escape(row['recipient'])}: "
            f"{row['status']}, {escape(d.left_system)}"
        )
        lines.append(f"    key at the receiver:  [cyan]{row['idempotency_key']}[/]")
    lines.append("")
    if not view.timeline:
        return [*lines, "  (no timeline entries)"]
    first = _parse(view.timeline[0].at)
    previous = ""
    for entry in view.timeline:
        offset = (_parse(entry.at) - first).total_seconds()
        # The subject is printed when it changes, so each delivery's steps read as a block.
        subject = entry.subject if entry.subject != previous else ""
        previous = entry.subject
        colour = _colour(entry.what)
        lines.append(
            f"  {entry.at[:23].replace('T', ' ')}  [dim]{f'+{offset:.3f}s':>11}[/]  [{colour}]●[/] "
            f"[bold]{escape(subject):<40}[/] [{colour}]{escape(entry.what)}[/]"
        )
    return lines


def _parse(at: str) -> datetime:
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


def _colour(what: str) -> str:
    lowered = what.lower()
    if "confirmed" in lowered or "succeeded" in lowered:
        return "green"
    if "unknown" in lowered or "retry" in lowered or "duplicate" in lowered:
        return "yellow"
    if "failed" in lowered:
        return "red"
    return "blue"
