"""Worker resident memory with N open deliveries, and its timer ticks, without hours of load.

Open deliveries are written straight into the worker's table changelog,
``{worker.group}-delivery-state-changelog`` (compacted, ``kafka.partitions``
partitions), exactly as faust writes it: key = the JSON of the idempotency key (faust
serializes a ``str`` table key with json, whatever the app's key serializer), value =
``events.state_codec.dumps(state)`` (raw), partition = the partition of the key in
``ledger.deliveries`` (aiokafka's default partitioner over the raw key), which is the
source partition faust sends a table change to. Every delivery is RETRY_SCHEDULED for
30 days from now (attempt 1 failed with a 503): open, with a timer.

Then one ``ledger worker`` starts on that group (it owns all partitions), recovers the
table and rebuilds its timers (its INFO log says "rebuilt N timers"); once settled, its
VmRSS is read from /proc. The baseline is the same worker on an empty group. The
worker's ``ledger_worker_timer_tick_seconds`` histogram gives the tick cost with N
timers scheduled (none due).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pydantic import JsonValue
from rich.progress import Progress

from bench.common import (
    fresh_settings,
    median,
    partition_for,
    produce_keyed,
    rss_mb,
    stop_child,
    wait_for_log,
)
from clients.kafka_security import client_options
from config import Settings
from events.delivery_state import DeliveryState, Status
from events.keys import idempotency_key
from events.outcomes import ErrorClass
from events.payload_hashes import payload_hash
from events.state_codec import dumps
from ledger.stack import Stack
from ledger.topics import create_topics
from streams.topic_layout import changelog_topic

METRICS_PORT = 29694
REBUILT = re.compile(r"rebuilt (\d+) timers")


def open_states(n: int, tag: str) -> Iterator[tuple[bytes, bytes]]:
    """``n`` RETRY_SCHEDULED states as changelog records (key, value)."""
    now = datetime.now(UTC)
    later = now + timedelta(days=30)
    for i in range(n):
        run_id = f"{tag}-{i}"
        recipient = f"http://127.0.0.1:9/hooks/h{i % 8}"
        key = idempotency_key(run_id, "run.succeeded", "webhook", recipient)
        payload: dict[str, JsonValue] = {"run": i, "text": "report ready"}
        state = DeliveryState(
            idempotency_key=key,
            run_id=run_id,
            event_type="run.succeeded",
            channel="webhook",
            recipient=recipient,
            payload=payload,
            payload_hash=payload_hash(payload),
            slo_seconds=300,
            requested_at=now,
            request_event_id=str(uuid.uuid4()),
            status=Status.RETRY_SCHEDULED,
            attempt=1,
            fencing_token=1,
            claim_worker="bench@host:1:abcdef",
            retry_at=later,
            last_error_class=ErrorClass.HTTP_5XX,
            last_reason="503 Service Unavailable: not processed",
            updated_at=now,
            seen=tuple(str(uuid.uuid4()) for _ in range(3)),
        )
        # A str key of a faust table goes through the json serializer: b'"<key>"'.
        yield json.dumps(key).encode(), dumps(state)


async def create_changelog(settings: Settings) -> str:
    """The table's changelog topic, as faust would create it (compacted)."""
    name = changelog_topic(settings.worker.group)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka.bootstrap_servers, **client_options(settings.kafka)
    )
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    name, settings.kafka.partitions, 1, topic_configs={"cleanup.policy": "compact"}
                )
            ]
        )
    finally:
        await admin.close()
    return name


async def scrape(port: int) -> dict[str, float]:
    """The tick histogram's sum and count."""
    async with httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics", timeout=10)).text
    found = {}
    for line in text.splitlines():
        for name in ("sum", "count"):
            if line.startswith(f"ledger_worker_timer_tick_seconds_{name} "):
                found[name] = float(line.split()[1])
    return found


async def one_worker(
    base: Settings, stack: Stack, n: int, progress: Progress | None
) -> dict[str, float]:
    """Fill the changelog with ``n`` open deliveries, start a worker, measure it."""
    settings = fresh_settings(base, f"mem{n}")
    await create_topics(settings)
    topic = await create_changelog(settings)
    produced = 0.0
    if n:
        task = progress.add_task(f"writing {n:,} open states", total=None) if progress else None
        _, produced = await produce_keyed(
            settings,
            topic,
            open_states(n, uuid.uuid4().hex[:6]),
            # faust sends a table change to the partition of the record being processed:
            # the partition of the raw idempotency key in ledger.deliveries.
            partition_of=lambda key: partition_for(
                json.loads(key).encode(), settings.kafka.partitions
            ),
        )
        if progress is not None and task is not None:
            progress.remove_task(task)
    began = time.monotonic()
    child = stack.start(
        f"mem-{n}",
        ["worker", "--name", f"mem{n}", "-l", "info", "--metrics-port", str(METRICS_PORT)],
        settings,
    )
    try:
        task = progress.add_task(f"worker recovering {n:,}", total=n or 1) if progress else None
        deadline = time.monotonic() + 120 + n / 2000
        rebuilt = 0
        while True:
            lines = await wait_for_log(child, "rebuilt", timeout_s=deadline - time.monotonic())
            rebuilt = sum(int(m.group(1)) for line in lines if (m := REBUILT.search(line)))
            if progress is not None and task is not None:
                progress.update(task, completed=rebuilt if n else 1)
            if rebuilt >= n or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        ready_s = time.monotonic() - began
        if progress is not None and task is not None:
            progress.remove_task(task)
        await asyncio.sleep(5)
        samples = []
        for _ in range(4):
            samples.append(rss_mb(child.process.pid))
            await asyncio.sleep(1)
        first = await scrape(METRICS_PORT)
        await asyncio.sleep(10)
        second = await scrape(METRICS_PORT)
        ticks = second["count"] - first["count"]
        tick_ms = (second["sum"] - first["sum"]) / ticks * 1000 if ticks else 0.0
        return {
            "open": n,
            "rebuilt": rebuilt,
            "produce_s": produced,
            "ready_s": ready_s,
            "rss_mb": median(samples),
            "peak_rss_mb": rss_mb(child.process.pid, "VmHWM"),
            "tick_ms": tick_ms,
            "ticks": ticks,
        }
    finally:
        stop_child(stack, child)


async def measure(
    settings: Settings, stack: Stack, tmp: Path, sizes: tuple[int, ...], progress: Progress
) -> list[dict[str, float]]:
    """The idle worker, then one per size."""
    return [await one_worker(settings, stack, n, progress) for n in (0, *sizes)]


def rows(results: list[dict[str, float]], row: Callable[..., None]) -> None:
    """Table rows: RSS per size against the idle worker; in-worker tick per size."""
    idle = results[0]
    for r in results[1:]:
        row(
            f"worker RSS with {r['open']:,.0f} open deliveries (MB) vs idle worker",
            f"{r['rss_mb']:,.0f}",
            f"{idle['rss_mb']:,.0f}",
            f"{r['rss_mb'] / idle['rss_mb']:.2f}x",
            "< 300 MB" if r["open"] >= 1_000_000 else "",
            r["rss_mb"] < 300 if r["open"] >= 1_000_000 else None,
        )
    small, big = results[1], results[-1]
    if big is not small:
        row(
            f"in-worker timer tick (ms), {big['open']:,.0f} vs {small['open']:,.0f} open",
            f"{big['tick_ms']:.2f}",
            f"{small['tick_ms']:.2f}",
            f"{big['tick_ms'] / small['tick_ms']:.2f}x" if small["tick_ms"] else "n/a",
            "flat",
        )


def note(results: list[dict[str, float]]) -> str:
    """The details line."""
    parts = [
        f"{r['open']:,.0f} open: RSS {r['rss_mb']:,.0f} MB (peak {r['peak_rss_mb']:,.0f} MB), "
        f"ready after {r['ready_s']:.0f} s ({r['rebuilt']:,.0f} timers rebuilt), "
        f"tick {r['tick_ms']:.2f} ms over {r['ticks']:.0f} ticks"
        for r in results
    ]
    return (
        "Worker memory (one worker owning all 8 partitions; states written into the "
        "changelog, see bench/memory.py): " + "; ".join(parts) + "."
    )
