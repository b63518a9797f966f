"""``ledger replay``: read the log (read_committed), filter it, print or export it."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TextIO

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from config.settings import Settings
from events.model import ALL_EVENT_TYPES
from ledger.errors import UsageError, given_time
from ledger.render import (
    CsvWriter,
    JsonLinesWriter,
    LineWriter,
    ParquetWriter,
    RecordWriter,
    TableWriter,
)
from ledger.replay import ReplayFilter, ReplayProgress, refused, replay

err = Console(stderr=True)
# A replay at least this long (records to read) gets a progress bar unless told otherwise.
LONG_REPLAY = 10_000


class Format(StrEnum):
    """Output formats."""

    line = "line"
    table = "table"
    jsonl = "jsonl"
    csv = "csv"
    parquet = "parquet"


def _types(given: list[str] | None) -> frozenset[str]:
    wanted = frozenset(given or ())
    unknown = sorted(wanted - set(ALL_EVENT_TYPES))
    if unknown:
        raise UsageError(
            f"unknown event type {unknown[0]!r}", "one of: " + ", ".join(sorted(ALL_EVENT_TYPES))
        )
    return wanted


@contextmanager
def _progress(show: bool | None) -> Iterator[ReplayProgress]:
    bar = Progress(
        TextColumn("replaying"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} records"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    task = bar.add_task("replay", total=None, start=False)
    started = False

    def advance(done: int, total: int) -> None:
        nonlocal started
        if not started:
            # By default only for a person watching a long replay, never into a log.
            if show is False or (show is None and (total < LONG_REPLAY or not err.is_terminal)):
                return
            bar.update(task, completed=done, total=total)
            bar.start()
            started = True
        bar.update(task, completed=done, total=total)

    try:
        yield advance
    finally:
        if started:
            bar.stop()


def _writer(fmt: Format, output: Path | None, stream: TextIO) -> RecordWriter:
    if fmt is Format.parquet:
        if output is None:
            raise UsageError("parquet needs a file", "add --output PATH (-o PATH)")
        return ParquetWriter(output)
    if fmt is Format.jsonl:
        return JsonLinesWriter(stream)
    if fmt is Format.csv:
        return CsvWriter(stream)
    console = Console(file=stream) if output is not None else Console()
    return TableWriter(console) if fmt is Format.table else LineWriter(console)


app = typer.Typer()


@app.command("replay")
def replay_command(
    topic: Annotated[list[str] | None, typer.Option("--topic", "-t")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key.")] = None,
    event_type: Annotated[
        list[str] | None, typer.Option("--type", help="Event type, e.g. delivery.unknown.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Events at or after this time (ISO, UTC).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Events before this time (ISO, UTC).")
    ] = None,
    from_offset: Annotated[
        int | None, typer.Option("--from-offset", min=0, help="Per partition, inclusive.")
    ] = None,
    to_offset: Annotated[
        int | None, typer.Option("--to-offset", min=0, help="Per partition, exclusive.")
    ] = None,
    partition: Annotated[list[int] | None, typer.Option("--partition", "-p", min=0)] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.line,
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format jsonl.")] = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (parquet needs it).")
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help=f"Progress bar on stderr (default: for {LONG_REPLAY:,}+ records).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Read topics (read_committed) and print or export the events that pass the filters."""
    settings = Settings()
    wanted = ReplayFilter(
        run_id=run_id,
        idempotency_key=key,
        event_types=_types(event_type),
        since=given_time(since, "--since"),
        until=given_time(until, "--until"),
        from_offset=from_offset,
        to_offset=to_offset,
        partitions=frozenset(partition or ()),
    )
    _check_ranges(wanted)
    chosen = Format.jsonl if as_json else fmt
    topics = topic or [settings.kafka.topic_runs, settings.kafka.topic_deliveries]
    with _opened(output, chosen) as stream:
        written = asyncio.run(
            _export(settings, topics, wanted, _writer(chosen, output, stream), progress)
        )
    if not written:
        _say_nothing_matched(wanted, key, topics)


def _check_ranges(wanted: ReplayFilter) -> None:
    if wanted.since and wanted.until and wanted.since >= wanted.until:
        raise UsageError(
            "--since must be before --until (--until is exclusive)", "swap them, or drop one"
        )
    if (
        wanted.from_offset is not None
        and wanted.to_offset is not None
        and wanted.from_offset >= wanted.to_offset
    ):
        raise UsageError(
            "--from-offset must be below --to-offset (--to-offset is exclusive)",
            "swap them, or drop one",
        )


def _opened(output: Path | None, fmt: Format) -> AbstractContextManager[TextIO]:
    if output is None or fmt is Format.parquet:
        return nullcontext(sys.stdout)
    try:
        return output.open("w", newline="", encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cannot write {output}: {exc.strerror}", "give --output a writable file path"
        ) from None


def _say_nothing_matched(wanted: ReplayFilter, key: str | None, topics: list[str]) -> None:
    if wanted == ReplayFilter():
        err.print(f"no events in {', '.join(topics)}", highlight=False, soft_wrap=True)
        return
    err.print("no events match the filters", highlight=False)
    if key is not None and not re.fullmatch(r"[0-9a-f]{64}", key):
        err.print(
            "hint: --key takes a whole idempotency key (64 hex characters; 'ledger run RUN_ID' "
            "shows them)",
            highlight=False,
            soft_wrap=True,
        )


async def _export(
    settings: Settings,
    topics: list[str],
    wanted: ReplayFilter,
    writer: RecordWriter,
    show: bool | None,
) -> int:
    """Write every record that passes ``wanted``; return how many were written."""
    written = 0
    try:
        with _progress(show) as advance:
            async for record in replay(settings, topics, wanted, progress=advance):
                try:
                    writer.write(record)
                except Exception as exc:  # noqa: BLE001 - the record guard: shown as refused
                    writer.write(refused(record, exc))
                written += 1
    finally:
        writer.close()
    return written
