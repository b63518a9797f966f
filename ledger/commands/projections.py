"""Projection commands: project, rebuild, verify, status, run. Thin: parse, call, print."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clients.committed_log import TRANSIENT
from config.settings import Settings
from events.outage import Outage, OutageTooLong
from events.refusal import one_line
from projections.backends import default_dsn, open_store, reading
from projections.database import DatabaseUnreachable, redacted
from projections.deadletters import ProjectorDeadLetters
from projections.heartbeats import worker_clocks
from projections.incident import run_view
from projections.parallel_rebuild import default_workers
from projections.projector import (
    DEFAULT_BATCH_SIZE,
    MAX_RECONNECTS,
    ProgressCallback,
    ProjectionStats,
    project,
    rebuild,
)
from projections.queries import status_report
from projections.store import Store
from projections.verify import verify

out = Console()
err = Console(stderr=True)

Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="Projection database: postgresql://... or sqlite:///path (default: "
        "LEDGER_PROJECTION__DSN, else a SQLite file in the data dir).",
        show_default=False,
    ),
]
# How long the live projector waits for its database before it gives up (then a supervisor,
# such as docker compose's restart policy, starts it again).
OUTAGE_LIMIT_S = 3600.0
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Records per transaction.")]


@contextmanager
def _progress_bar(label: str) -> Iterator[ProgressCallback]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}{task.fields[of]} records"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal,  # a bar is for a person watching, never for a log
    ) as bar:
        task = bar.add_task(label, total=None, of="")

        def advance(done: int, total: int | None) -> None:
            of = "" if total is None else f"/{total:,}"
            bar.update(task, completed=done, total=total, of=of)

        yield advance


app = typer.Typer()


@app.command("project")
def project_command(dsn: Dsn = None, batch_size: BatchSize = DEFAULT_BATCH_SIZE) -> None:
    """Fold the log into the ledger tables until Ctrl-C; resumes where it stopped."""
    settings = Settings()
    target = dsn or default_dsn(settings)
    stats = asyncio.run(_until_signalled(settings, target, batch_size))
    if stats is None:
        out.print("stopped before the database answered", highlight=False)
        return
    out.print(
        f"stopped cleanly: {stats.applied} events applied, {stats.skipped} skipped, "
        f"in {stats.batches} batches",
        highlight=False,
    )


@app.command("rebuild")
def rebuild_command(
    into: Annotated[str, typer.Option("--into", help="An EMPTY projection database DSN.")],
    replace: Annotated[
        bool, typer.Option("--replace", help="Drop existing ledger tables there first.")
    ] = False,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Processes sharing the partitions (default: one per CPU); 1 rebuilds "
            "in this process alone.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Replay both topics from offset 0 into an empty database."""
    settings = Settings()
    began = time.perf_counter()
    with _progress_bar("rebuilding") as progress:
        stats = asyncio.run(
            rebuild(
                settings,
                into,
                replace=replace,
                batch_size=batch_size,
                progress=progress,
                workers=default_workers() if workers is None else workers,
            )
        )
    seconds = time.perf_counter() - began
    rate = stats.records / seconds if seconds > 0 else 0.0
    out.print(
        f"rebuilt {redacted(into)}: {stats.applied} events applied, {stats.skipped} "
        f"skipped, in {seconds:.1f}s ({rate:,.0f} records/s)",
        highlight=False,
    )


@app.command("verify")
def verify_command(
    dsn: Dsn = None,
    against: Annotated[
        str | None,
        typer.Option("--against", help="A rebuilt projection (default: rebuild one now)."),
    ] = None,
) -> None:
    """Compare a projection rebuilt from the log with the live one, row by row, and
    every delivery with the worker's rules applied to the same log."""
    settings = Settings()
    live = dsn or default_dsn(settings)
    with _progress_bar("rebuilding for comparison") as progress:
        report = asyncio.run(verify(settings, live, against, progress=progress))
    lines = [d.line() for d in report.differences]
    for line in lines + [d.line() for d in report.rule_differences]:
        out.print(line, highlight=False, soft_wrap=True)
    if report.differences:
        out.print(f"{len(report.differences)} differences between live and rebuilt")
    if report.rule_differences:
        out.print(
            f"{len(report.rule_differences)} deliveries differ from the worker's rules",
            highlight=False,
        )
    if not report.ok:
        raise typer.Exit(1)
    out.print(
        f"identical: rebuilt equals live ({report.rows} rows), and every delivery "
        "agrees with the worker's rules",
        highlight=False,
        soft_wrap=True,
    )


@app.command("status")
def status_command(
    dsn: Dsn = None, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Pending now and the oldest pending age; operator-settled deliveries, redrives and
    the oldest UNKNOWN's age; deliveries held over their agent's budget; overdue (pending
    or sent), unknown, unexplained, conflicting deliveries; attempts."""
    settings = Settings()
    with reading(dsn or default_dsn(settings)) as store:
        # The only clock read: the CLI decides what "now" is; the library never does.
        report = status_report(store, datetime.now(UTC))
    shown = report.to_json()
    shown["workers"] = _workers(settings)
    shown["clock_skew"] = [w["worker_id"] for w in shown["workers"] if w["clock_skew"]]
    if as_json:
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")
        return
    _print_status(shown)


@app.command("run")
def run_command(
    run_id: Annotated[str, typer.Argument(help="The agent run id.")],
    dsn: Dsn = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    timeline: Annotated[
        bool, typer.Option("--timeline", help="The answers, then one line per step.")
    ] = False,
) -> None:
    """One run's incident view: execution, each delivery's attempts, as a timeline."""
    settings = Settings()
    with reading(dsn or default_dsn(settings)) as store:
        view = run_view(store, run_id)
    if as_json:
        sys.stdout.write(json.dumps(view.to_json(), indent=2) + "\n")
        return
    if timeline:
        from ledger.render import timeline_lines

        for line in timeline_lines(view):
            out.print(line, highlight=False, soft_wrap=True)
        return
    out.print(f"run {run_id}: execution {view.execution}", highlight=False)
    for d in view.deliveries:
        row = d.delivery
        out.print(
            f"  {row['channel']} {row['recipient']}: {row['status']}, "
            f"{row['attempts']} attempt(s), left the system: {d.left_system}\n"
            f"    idempotency key (what the receiver sees): {row['idempotency_key']}\n"
            f"    provider message id: {row['provider_message_id'] or 'none'}",
            highlight=False,
            soft_wrap=True,
        )
    table = Table("time (UTC)", "subject", "what", title="timeline")
    for column in table.columns:
        column.overflow = "fold"  # keys and URLs are evidence: never elide them
    for entry in view.timeline:
        table.add_row(entry.at, entry.subject, entry.what)
    out.print(table)


async def _until_signalled(
    settings: Settings, target: str, batch_size: int
) -> ProjectionStats | None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Finish (commit) the batch in hand, then return: Ctrl-C never splits a batch.
        loop.add_signal_handler(sig, stop.set)
    # One outage at a time, each said in two lines; only a configuration error (or an
    # outage past its limit) ends the projector.
    outage = Outage(
        logging.getLogger("ledger.project"),
        f"projection database {redacted(target)}",
        hint="check that the database is running and reachable; the projector resumes "
        "from its stored offsets when started again",
        limit_s=OUTAGE_LIMIT_S,
    )
    store = await _open_for_projecting(target, outage, stop)
    if store is None:
        return None
    try:
        out.print(
            f"projecting {settings.kafka.topic_runs} + {settings.kafka.topic_deliveries} into "
            f"{redacted(target)} (Ctrl-C stops)",
            highlight=False,
        )
        async with ProjectorDeadLetters(settings.kafka) as dead_letters:
            return await project(
                settings,
                store,
                stop=stop,
                batch_size=batch_size,
                dead_letters=dead_letters,
                outage=outage,
            )
    finally:
        store.close()


async def _open_for_projecting(target: str, outage: Outage, stop: asyncio.Event) -> Store | None:
    """The projection store, ready to project into: waits (with backoff) for a database
    that does not answer yet; a configuration error raises at once."""
    for _ in range(MAX_RECONNECTS):
        store: Store | None = None
        try:
            store = await asyncio.to_thread(open_store, target)
            await asyncio.to_thread(store.prepare, "project")
        except Exception as exc:  # sorted below: only an outage is retried
            unreachable = isinstance(exc, DatabaseUnreachable) or (
                store is not None and isinstance(exc, store.system_errors)
            )
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            if not unreachable:
                raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=outage.failed(exc))
            if stop.is_set():
                return None
            continue
        outage.recovered()
        return store
    raise OutageTooLong(f"{outage.what} never answered", "check that it is running")


def _workers(settings: Settings) -> list[dict[str, Any]]:
    """The workers' last heartbeats: their clocks, and whether they act (empty when the
    broker does not answer: the projection's answers stand on their own)."""
    try:
        clocks = asyncio.run(worker_clocks(settings.kafka, datetime.now(UTC)))
    except TRANSIENT as exc:
        err.print(f"workers: not shown ({one_line(exc)})", highlight=False)
        return []
    return [clock.to_json() for clock in clocks]


def _print_status(report: dict[str, Any]) -> None:
    sections: list[tuple[str, str, list[str]]] = [
        ("overdue_pending", "pending deliveries past their SLO",
         ["run_id", "channel", "recipient", "attempts", "slo_deadline"]),
        ("overdue_sent", "sent deliveries past their SLO, not confirmed",
         ["run_id", "channel", "recipient", "provider_message_id", "slo_deadline"]),
        ("unknown", "unknown deliveries awaiting reconciliation",
         ["run_id", "channel", "recipient", "last_error_class", "unknown_since"]),
        ("confirmed_without_result", "confirmed deliveries with no execution result",
         ["run_id", "channel", "recipient", "run_status", "confirmed_at"]),
        ("duplicate_conflicts", "duplicate-key conflicts",
         ["run_id", "channel", "recipient", "idempotency_key", "occurred_at"]),
        ("attempts_by_channel", "attempts by channel and error class",
         ["channel", "error_class", "attempts"]),
    ]  # fmt: skip
    out.print(f"as of {report['now']}", highlight=False)
    for worker in report["workers"]:
        if not worker["acting"]:
            out.print(
                f"clock_skew: worker {worker['worker_id']} does not act: {worker['why_not']}",
                highlight=False,
            )
    _print_backlog(report["backlog"])
    _print_operators(report["operators"])
    _print_over_budget(report["over_budget"])
    for name, title, columns in sections:
        rows = report[name]
        table = Table(*columns, title=f"{title}: {len(rows)}", title_justify="left")
        for row in rows:
            table.add_row(*("-" if row[c] is None else str(row[c]) for c in columns))
        out.print(table)


def _print_operators(counts: dict[str, Any]) -> None:
    """What operators settled and redrove, and how long the oldest UNKNOWN has waited."""
    settled = ", ".join(f"{k} {v}" for k, v in counts["settled"].items())
    redrives = ", ".join(f"{k} {v}" for k, v in counts["redrives"].items())
    out.print(f"settled by an operator: {settled}", highlight=False, soft_wrap=True)
    out.print(f"redrives: {redrives}", highlight=False, soft_wrap=True)
    if not counts["unknown_now"]:
        out.print("unknown now: 0", highlight=False)
        return
    out.print(
        f"unknown now: {counts['unknown_now']}, the oldest unknown since "
        f"{counts['oldest_unknown_since']} ({counts['oldest_unknown_age_seconds']:.1f}s ago)",
        highlight=False,
        soft_wrap=True,
    )


def _print_over_budget(rows: list[dict[str, Any]]) -> None:
    """Deliveries held because their agent spent its send budget, per agent."""
    held = sum(r["held"] for r in rows)
    per_agent = ", ".join(f"{r['agent']} {r['held']} (since {r['oldest_since']})" for r in rows)
    out.print(
        f"held over budget: {held}" + (f": {per_agent}" if rows else ""),
        highlight=False,
        soft_wrap=True,
    )


def _print_backlog(backlog: dict[str, Any]) -> None:
    """Pending now, late or not: a burst shows here before it passes its SLO."""
    if not backlog["pending_now"]:
        out.print("pending now: 0", highlight=False)
        return
    out.print(
        f"pending now: {backlog['pending_now']}, the oldest requested at "
        f"{backlog['oldest_requested_at']} ({backlog['oldest_age_seconds']:.1f}s ago)",
        highlight=False,
        soft_wrap=True,  # one line, for grep as much as for people
    )
    table = Table(
        "channel", "pending", "oldest requested at", "oldest age (s)",
        title=f"pending by channel: {len(backlog['by_channel'])}", title_justify="left",
    )  # fmt: skip
    for c in backlog["by_channel"]:
        table.add_row(
            c["channel"], str(c["pending"]), c["oldest_requested_at"],
            f"{c['oldest_age_seconds']:.1f}",
        )  # fmt: skip
    out.print(table)
