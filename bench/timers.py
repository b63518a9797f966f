"""Timer tick cost with N open deliveries scheduled, of which a fixed number are due.

Runs the real ``streams.timers.DueIndex`` (rocksdict, on disk) and the real
``DeliveryProcessor.tick`` (due-index scan, state reads, ``on_timer`` decisions, the
appends and the reschedules), with an in-memory StateStore and an appender that collects
the events. N entries spread over 8 partitions: N - DUE are due in 30 days, DUE are due
now (RETRY_SCHEDULED whose retry time has passed: each tick claims them). Before each
tick the DUE entries are put back in the past (the tick reschedules what it acted on).
The store holds only the due states: a tick reads nothing else.
"""

from __future__ import annotations

import hashlib
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.progress import Progress

from bench.memory import open_states
from config import Settings
from events.base import Event
from events.state_codec import loads
from streams.context import worker_context
from streams.processor import DeliveryProcessor, MemoryStore, Record
from streams.sender import Sender
from streams.timers import DueIndex

DUE = 100
PARTITIONS = 8
TICKS = 40


async def one_size(tmp: Path, n: int, progress: Progress | None) -> dict[str, float]:
    """Median tick and median ``DueIndex.due`` with ``n`` scheduled, DUE of them due."""
    path = tmp / f"due-{n}"
    index = DueIndex(path)
    store = MemoryStore()
    appended: list[Event] = []
    now = datetime.now(UTC)
    past = now - timedelta(seconds=1)
    due_keys: list[tuple[int, str]] = []
    task = progress.add_task(f"scheduling {n:,} timers", total=n) if progress else None
    for _, value in open_states(DUE, f"t{n}"):
        state = replace(loads(value), retry_at=past)
        store.put(state.idempotency_key, state)
        due_keys.append((len(due_keys) % PARTITIONS, state.idempotency_key))
        index.schedule(due_keys[-1][0], state.idempotency_key, past)
    later = now + timedelta(days=30)
    for i in range(n - DUE):
        # Only the index sees these: a key-shaped string and a distinct far due time.
        key = hashlib.sha256(f"t{n}-{i}".encode()).hexdigest()
        index.schedule(i % PARTITIONS, key, later + timedelta(milliseconds=i))
        if progress is not None and task is not None and i % 10_000 == 0:
            progress.update(task, completed=i)
    if progress is not None and task is not None:
        progress.remove_task(task)

    async def collect(events: Sequence[Event]) -> None:
        appended.extend(events)

    async def no_dead_letters(record: Record, reason: str) -> None:
        raise AssertionError(reason)

    ctx = worker_context(
        Settings().worker, Settings().channels, worker_id="bench", producer="bench", channels={}
    )
    clock = lambda: datetime.now(UTC)  # noqa: E731
    sender = Sender(
        channels={},
        ctx=ctx,
        append=collect,
        clock=clock,
        concurrency=64,
        current=store.get,
        owns=lambda _partition: True,
        deadline_s=10.0,
        skew_margin_s=2.0,
    )
    processor = DeliveryProcessor(
        ctx=ctx,
        store=store,
        append_claims=collect,
        append_outcomes=collect,
        dead_letter=no_dead_letters,
        sender=sender,
        due=index,
        clock=clock,
    )
    partitions = set(range(PARTITIONS))
    ticks, scans = [], []
    for _ in range(TICKS):
        for partition, key in due_keys:
            index.schedule(partition, key, past)
        began = time.perf_counter()
        found = index.due(partitions, datetime.now(UTC), 1000)
        scans.append(time.perf_counter() - began)
        assert len(found) == DUE, len(found)
        began = time.perf_counter()
        acted = await processor.tick(partitions)
        ticks.append(time.perf_counter() - began)
        assert acted == DUE, acted
    size = index.size
    index.close()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "scheduled": size,
        "due": DUE,
        "tick_ms": statistics.median(ticks) * 1000,
        "due_scan_ms": statistics.median(scans) * 1000,
        "claims_appended": len(appended),
    }


async def measure(
    tmp: Path, sizes: tuple[int, ...], rounds: int, progress: Progress
) -> dict[str, Any]:
    """Every size ``rounds`` times (each round a fresh index); medians of the rounds."""
    out: dict[str, Any] = {}
    for n in sizes:
        runs = [await one_size(tmp, n, progress) for _ in range(rounds)]
        out[str(n)] = {
            "tick_ms": [r["tick_ms"] for r in runs],
            "due_scan_ms": [r["due_scan_ms"] for r in runs],
            "scheduled": runs[0]["scheduled"],
        }
    return out


def rows(results: dict[str, Any], row: Callable[..., None]) -> None:
    """Tick and due-scan at the largest size against the smallest."""
    sizes = sorted(results, key=int)
    small, big = results[sizes[0]], results[sizes[-1]]
    for figure, label in (("tick_ms", "tick"), ("due_scan_ms", "DueIndex.due scan")):
        b, s = statistics.median(big[figure]), statistics.median(small[figure])
        row(
            f"timer {label} (ms, {DUE} due), {int(sizes[-1]):,} vs {int(sizes[0]):,} scheduled",
            f"{b:.2f}",
            f"{s:.2f}",
            f"{b / s:.2f}x",
            "flat",
            b <= 1.5 * s if figure == "tick_ms" else None,
        )


def note(results: dict[str, Any]) -> str:
    """The details line."""
    parts = [
        f"{int(n):,} scheduled: tick {', '.join(f'{x:.2f}' for x in r['tick_ms'])} ms, "
        f"due scan {', '.join(f'{x:.3f}' for x in r['due_scan_ms'])} ms"
        for n, r in sorted(results.items(), key=lambda item: int(item[0]))
    ]
    return (
        f"Timer micro-benchmark (bench/timers.py; {DUE} due per tick, median of {TICKS} ticks "
        "per round; 'flat' = within 1.5x): " + "; ".join(parts) + "."
    )
