"""Rebuild speed: events/s folded into SQLite and PostgreSQL vs a raw read-and-decode.

Generates --events events (runs with two deliveries each: one confirmed at once, one
after a timeout, a lookup and a retry; 14 events per run) into fresh topics, then in
the same run measures, over exactly those topics:

* raw: read both topics from offset 0 (read_committed) and decode every record;
* sqlite: ``ledger rebuild`` into an empty SQLite file, with --workers processes (default:
  one per CPU, as ``ledger rebuild``) and, paired in the same rounds, with one (sequential);
* postgres: ``ledger rebuild`` into an empty PostgreSQL database (if a DSN is given).

    .venv/bin/python -m bench.rebuild --events 100000
    .venv/bin/python -m bench.rebuild --events 1000000 --postgres-dsn postgresql://... \
        --append BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.common import produce_batched
from config import Settings
from events import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryReconciled,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    RunStarted,
    RunSucceeded,
    encode,
)
from events.delivery import DeliveryEvent, new_delivery_requested
from events.execution import ExecutionEvent
from events.outcomes import ErrorClass
from events.topics import record_key
from ledger.broker import LocalBroker
from ledger.topics import create_topics
from projections.log import LogReader
from projections.parallel_rebuild import default_workers
from projections.projector import rebuild

EVENTS_PER_RUN = 14
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def run_events(n: int) -> list[ExecutionEvent | DeliveryEvent]:
    """The 14 events of one run."""
    run_id, t = f"bench-{n}", T0 + timedelta(seconds=n)
    p = "bench"
    out: list[ExecutionEvent | DeliveryEvent] = [
        RunStarted(run_id=run_id, agent="bench", producer=p, occurred_at=t),
        RunSucceeded(run_id=run_id, result_hash=f"h{n}", producer=p, occurred_at=t),
    ]
    for i, retried in ((1, False), (2, True)):
        req = new_delivery_requested(
            run_id=run_id,
            event_type="run.succeeded",
            channel="webhook",
            recipient=f"http://127.0.0.1:9/hooks/{i}",
            payload={"run": n, "text": "ready"},
            slo_seconds=300,
            producer=p,
            occurred_at=t,
        )
        c = {"idempotency_key": req.idempotency_key, "run_id": run_id, "producer": p}
        out.append(req)
        attempt = 1
        if retried:
            out += [
                DeliveryClaimed(
                    **c,
                    attempt=1,
                    worker_id="w",
                    fencing_token=1,
                    lease_expires_at=t + timedelta(seconds=30),
                    occurred_at=t,
                ),
                DeliveryUnknown(
                    **c,
                    attempt=1,
                    fencing_token=1,
                    error_class=ErrorClass.TIMEOUT_AFTER_WRITE,
                    reason="read timeout",
                    occurred_at=t,
                ),
                DeliveryReconciled(
                    **c,
                    attempt=1,
                    fencing_token=1,
                    outcome="not_found",
                    evidence="404",
                    occurred_at=t,
                ),
                DeliveryRetryScheduled(
                    **c,
                    attempt=1,
                    next_attempt=2,
                    retry_at=t,
                    error_class=ErrorClass.TIMEOUT_AFTER_WRITE,
                    safety="not found",
                    occurred_at=t,
                ),
            ]
            attempt = 2
        out += [
            DeliveryClaimed(
                **c,
                attempt=attempt,
                worker_id="w",
                fencing_token=attempt,
                lease_expires_at=t + timedelta(seconds=30),
                occurred_at=t,
            ),
            DeliverySent(
                **c,
                attempt=attempt,
                fencing_token=attempt,
                worker_id="w",
                provider_message_id=f"m{n}",
                http_status=202,
                occurred_at=t,
            ),
            DeliveryConfirmed(
                **c,
                attempt=attempt,
                fencing_token=attempt,
                source="send",
                provider_message_id=f"m{n}",
                evidence="ok",
                occurred_at=t,
            ),
        ]
    return out


async def generate(settings: Settings, events: int) -> tuple[int, float]:
    """Produce about ``events`` events with batched sends; (count, seconds)."""

    def records() -> Iterator[tuple[str, bytes, bytes]]:
        for n in range((events + EVENTS_PER_RUN - 1) // EVENTS_PER_RUN):
            for event in run_events(n):
                topic = (
                    settings.kafka.topic_runs
                    if isinstance(event, ExecutionEvent)
                    else settings.kafka.topic_deliveries
                )
                yield topic, record_key(event), encode(event)

    # The default partitioner's choice, so every key stays in one partition.
    return await produce_batched(settings, records())


async def raw_read(settings: Settings) -> tuple[int, float]:
    """Read both topics from 0 to the end and decode every record; (records, seconds)."""
    began = time.perf_counter()
    count = 0
    async with LogReader(settings, batch_size=5000) as reader:
        await reader.start({})
        until = await reader.end_offsets()
        while not await reader.reached(until):
            count += len(await reader.read(timeout_ms=500, until=until))
    return count, time.perf_counter() - began


async def timed_rebuild(
    settings: Settings, dsn: str, batch_size: int, workers: int = 1
) -> tuple[int, float]:
    """Rebuild into ``dsn`` with ``workers`` processes; (records, seconds)."""
    began = time.perf_counter()
    stats = await rebuild(settings, dsn, batch_size=batch_size, workers=workers)
    return stats.records, time.perf_counter() - began


async def figures(
    settings: Settings,
    events: int,
    batch_size: int,
    repeat: int,
    progress: Any = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Generate ``events`` into ``settings``' topics, then ``repeat`` rounds of raw read +
    decode and of rebuild into an empty SQLite file (``workers`` processes, default one
    per CPU as ``ledger rebuild``; with more than one, the same round also rebuilds with
    one, sequentially, for a paired comparison); events/s of every round."""
    workers = default_workers() if workers is None else workers
    await create_topics(settings)
    made, _ = await generate(settings, events)
    raw: list[float] = []
    sqlite: list[float] = []
    sequential: list[float] = []
    task = progress.add_task("rebuild rounds", total=repeat) if progress else None
    for r in range(repeat):
        records, seconds = await raw_read(settings)
        raw.append(records / seconds)
        # Alternate which goes first, so neither always gets the warmer page cache.
        order = [workers, 1] if r % 2 == 0 else [1, workers]
        for n in order if workers > 1 else [1]:
            with tempfile.TemporaryDirectory(prefix="bench-rebuild-") as tmp:
                dsn = f"sqlite://{Path(tmp) / 'rebuilt.sqlite3'}"
                records, seconds = await timed_rebuild(settings, dsn, batch_size, n)
            (sqlite if n == workers else sequential).append(records / seconds)
        if progress is not None:
            progress.update(task, completed=r + 1)
    if progress is not None:
        progress.remove_task(task)
    return {
        "events": made,
        "records": records,
        "workers": workers,
        "raw_per_s": raw,
        "sqlite_per_s": sqlite,
        "sequential_per_s": sequential,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="rebuild processes (default: CPUs)"
    )
    parser.add_argument(
        "--postgres-dsn",
        default=os.environ.get("LEDGER_TEST_POSTGRES_DSN"),
        help="admin DSN; a fresh database is created and dropped",
    )
    parser.add_argument("--append", type=Path, help="append the results to this markdown file")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        kafka={
            "topic_runs": f"bench.runs.{tag}",
            "topic_deliveries": f"bench.deliveries.{tag}",
            "topic_deadletter": f"bench.dl.{tag}",
        },
        channels={"allowed_networks": ["127.0.0.0/8"]},
    )
    broker = LocalBroker(settings)
    started = not broker.start().already_running
    results: list[tuple[str, int, float]] = []
    try:
        asyncio.run(create_topics(settings))
        made, seconds = asyncio.run(generate(settings, args.events))
        print(f"generated {made:,} events in {seconds:.1f}s ({made / seconds:,.0f}/s)", flush=True)
        results.append(("raw read + decode", *asyncio.run(raw_read(settings))))
        print(f"raw: {results[-1][1]:,} records in {results[-1][2]:.1f}s", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-rebuild-") as tmp:
            dsn = f"sqlite://{Path(tmp) / 'rebuilt.sqlite3'}"
            rebuilt = asyncio.run(timed_rebuild(settings, dsn, args.batch_size, args.workers))
            results.append((f"rebuild into SQLite, {args.workers} workers", *rebuilt))
            print(f"sqlite: {results[-1][2]:.1f}s", flush=True)
        if args.postgres_dsn:
            label = f"rebuild into PostgreSQL, {args.workers} workers"
            results.append((label, *postgres_round(settings, args)))
            print(f"postgres: {results[-1][2]:.1f}s", flush=True)
        else:
            print("no --postgres-dsn (or LEDGER_TEST_POSTGRES_DSN): PostgreSQL skipped")
    finally:
        if started:
            broker.stop()
    report = render(results, args)
    print(report)
    if args.append:
        with args.append.open("a", encoding="utf-8") as handle:
            handle.write(report)


def postgres_round(settings: Settings, args: argparse.Namespace) -> tuple[int, float]:
    name = f"ledger_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        info = psycopg.conninfo.conninfo_to_dict(args.postgres_dsn)
        auth = str(info.get("user", "postgres"))
        if info.get("password"):
            auth += f":{info['password']}"
        dsn = f"postgresql://{auth}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{name}"
        return asyncio.run(timed_rebuild(settings, dsn, args.batch_size, args.workers))
    finally:
        with psycopg.connect(args.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def render(results: list[tuple[str, int, float]], args: argparse.Namespace) -> str:
    raw_rate = results[0][1] / results[0][2]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    lines = [
        "",
        "## Rebuild",
        "",
        f"`python -m bench.rebuild --events {args.events} --batch-size {args.batch_size} "
        f"--workers {args.workers}`, "
        f"{datetime.now(UTC):%Y-%m-%d}: {cpu}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, SQLite {__import__('sqlite3').sqlite_version}, "
        "local single-node Kafka, PostgreSQL on 127.0.0.1 (fsync off, throwaway cluster). "
        "Events: runs of 14 (2 run events, 2 deliveries: one confirmed at once, one after "
        "timeout + lookup + retry), 8 partitions per topic.",
        "",
        "| figure | records | seconds | events/s | vs raw |",
        "|---|---|---|---|---|",
    ]
    for label, records, seconds in results:
        rate = records / seconds
        lines.append(
            f"| {label} | {records:,} | {seconds:.1f} | {rate:,.0f} | {rate / raw_rate:.2f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
