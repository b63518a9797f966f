"""End to end: deliveries/s at saturation, then publish-to-CONFIRMED latency at half of it.

Two systems over the same broker and the same receiver (the fake provider, no faults):

* ``worker``: two ``ledger worker`` processes in one group, as in the demo;
* ``bare``: two ``bench/bare_loop.py`` processes in one group (the same work, no guarantees).

Peak: a backlog of N ``DeliveryRequested`` is produced at once; the rate is measured
between the 10th and the 90th percentile of the CONFIRMED times (ramp-up and tail cut).
Latency: runs of 3 deliveries published with the real ``Publisher`` (one transaction per
run), paced at half of that system's median peak; latency is from the publisher's commit
to the ``occurred_at`` of the first ``DeliveryConfirmed`` of the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer
from rich.progress import Progress

from bench.common import (
    cpu_seconds,
    fresh_settings,
    median,
    produce_keyed,
    start_python,
    stop_child,
)
from clients import DeliverySpec, Publisher
from clients.kafka_security import client_options
from config import Settings
from events import encode
from events.delivery import new_delivery_requested
from ledger.stack import Child, Stack, settings_env
from ledger.topics import create_topics

HOOKS = 8


@dataclass
class Confirmations:
    """Reads the deliveries topic and keeps when each key was first CONFIRMED."""

    settings: Settings
    settled: dict[str, float] = field(default_factory=dict)
    claimed: dict[str, float] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Confirmations:
        consumer = AIOKafkaConsumer(
            self.settings.kafka.topic_deliveries,
            bootstrap_servers=self.settings.kafka.bootstrap_servers,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
            **client_options(self.settings.kafka),
        )
        await consumer.start()
        self._task = asyncio.create_task(self._run(consumer))
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                batches = await consumer.getmany(timeout_ms=200, max_records=5000)
                for messages in batches.values():
                    for message in messages:
                        # Cheap on purpose: this reader shares the CPUs with the measured system.
                        value = message.value
                        if b'"delivery.confirmed"' in value:
                            into = self.settled
                        elif b'"delivery.claimed"' in value:
                            into = self.claimed
                        else:
                            continue
                        record = json.loads(value)
                        key = record["idempotency_key"]
                        if key not in into:
                            into[key] = datetime.fromisoformat(record["occurred_at"]).timestamp()
        finally:
            await consumer.stop()

    async def wait(
        self, keys: list[str], timeout_s: float, progress: Progress | None, label: str
    ) -> None:
        """Until every key is CONFIRMED (TimeoutError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        task = progress.add_task(label, total=len(keys)) if progress else None
        while time.monotonic() < deadline:
            done = sum(1 for k in keys if k in self.settled)
            if progress is not None and task is not None:
                progress.update(task, completed=done)
            if done == len(keys):
                if progress is not None and task is not None:
                    progress.remove_task(task)
                return
            await asyncio.sleep(0.25)
        raise TimeoutError(f"{label}: {len(keys) - done} of {len(keys)} not confirmed")


def requests_for(urls: dict[str, str], tag: str, n: int) -> list[tuple[str, bytes]]:
    """``n`` encoded DeliveryRequested (one per run), as (key, value)."""
    out = []
    for i in range(n):
        event = new_delivery_requested(
            run_id=f"{tag}-{i}",
            event_type="run.succeeded",
            channel="webhook",
            recipient=f"{urls['base']}/hooks/b{i % HOOKS}",
            payload={"run": i, "text": "report ready"},
            slo_seconds=300,
            producer="bench",
        )
        out.append((event.idempotency_key, encode(event)))
    return out


def trimmed_rate(times: list[float]) -> float:
    """Completions per second between the 10th and 90th percentile completion."""
    times = sorted(times)
    lo, hi = int(len(times) * 0.1), int(len(times) * 0.9) - 1
    return (hi - lo) / (times[hi] - times[lo])


async def peak_round(
    settings: Settings,
    urls: dict[str, str],
    seen: Confirmations,
    n: int,
    progress: Progress | None,
    label: str,
) -> float:
    """Produce a backlog of ``n`` at once; deliveries/s while it drains."""
    batch = requests_for(urls, f"peak-{uuid.uuid4().hex[:6]}", n)
    await produce_keyed(
        settings, settings.kafka.topic_deliveries, iter((k.encode(), v) for k, v in batch)
    )
    keys = [k for k, _ in batch]
    await seen.wait(keys, timeout_s=max(120.0, n / 20), progress=progress, label=label)
    return trimmed_rate([seen.settled[k] for k in keys])


async def latency_round(
    settings: Settings,
    urls: dict[str, str],
    seen: Confirmations,
    rate: float,
    seconds: float,
    progress: Progress | None,
    label: str,
) -> dict[str, float]:
    """Paced runs of 3 deliveries at ``rate`` deliveries/s; latency percentiles (ms)."""
    tag = f"lat-{uuid.uuid4().hex[:6]}"
    runs = max(10, int(rate * seconds / 3))
    published: dict[str, float] = {}
    task = progress.add_task(label + " publishing", total=runs) if progress else None
    async with Publisher(settings, producer_name="bench-agent") as publisher:
        began = time.monotonic()
        for r in range(runs):
            delay = began + r * 3 / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            specs = [
                DeliverySpec(
                    channel="webhook",
                    recipient=f"{urls['base']}/hooks/b{(r * 3 + i) % HOOKS}",
                    payload={"run": r, "i": i, "text": "report ready"},
                )
                for i in range(3)
            ]
            requests = await publisher.run_succeeded(f"{tag}-{r}", "h", specs)
            now = time.time()
            for request in requests:
                published[request.idempotency_key] = now
            if progress is not None and task is not None:
                progress.update(task, completed=r + 1)
        offered = runs * 3 / (time.monotonic() - began)
    if progress is not None and task is not None:
        progress.remove_task(task)
    keys = list(published)
    await seen.wait(keys, timeout_s=120.0, progress=progress, label=label + " settling")
    latencies = [seen.settled[k] - published[k] for k in keys]
    q = statistics.quantiles(latencies, n=100)
    result = {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "offered_per_s": offered}
    if all(k in seen.claimed for k in keys):
        # Where the worker's time goes: publish -> claim made (the agent read the request),
        # claim made -> CONFIRMED (read back, sent, outcome appended).
        to_claim = statistics.quantiles([seen.claimed[k] - published[k] for k in keys], n=100)
        to_done = statistics.quantiles([seen.settled[k] - seen.claimed[k] for k in keys], n=100)
        result |= {
            "to_claim_p50_ms": to_claim[49] * 1000,
            "to_claim_p99_ms": to_claim[98] * 1000,
            "claim_to_confirmed_p50_ms": to_done[49] * 1000,
            "claim_to_confirmed_p99_ms": to_done[98] * 1000,
        }
    return result


Starter = Callable[[Stack, Settings, str], Child]


METRICS_PORTS = {"1": 29695, "2": 29696}


def start_worker(
    stack: Stack, settings: Settings, name: str, ports: dict[str, int] = METRICS_PORTS
) -> Child:
    """One ``ledger worker`` at its default log level (WARNING: at INFO, httpx logs every
    request), with metrics on a bench port (``ports`` by the name's last character) so
    readiness can be read."""
    port = ports[name[-1]]
    return stack.start(name, ["worker", "--name", name, "--metrics-port", str(port)], settings)


async def wait_owned(
    children: list[Child],
    partitions: int,
    timeout_s: float = 90.0,
    ports: dict[str, int] = METRICS_PORTS,
) -> None:
    """Until every worker owns partitions and together they own all ``partitions``."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(trust_env=False) as client:
        while time.monotonic() < deadline:
            owned = []
            for child in children:
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited: see {child.log}")
                try:
                    text = (
                        await client.get(f"http://127.0.0.1:{ports[child.name[-1]]}/metrics")
                    ).text
                except httpx.HTTPError:
                    owned.append(0.0)
                    continue
                owned += [
                    float(line.split()[1])
                    for line in text.splitlines()
                    if line.startswith("ledger_worker_owned_partitions ")
                ]
            if len(owned) == len(children) and all(owned) and sum(owned) == partitions:
                return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"workers did not take all {partitions} partitions in {timeout_s:.0f}s")


def start_bare(stack: Stack, settings: Settings, name: str) -> Child:
    """One bare loop process."""
    args = ["-m", "bench.bare_loop", "--bootstrap", settings.kafka.bootstrap_servers]
    args += ["--topic", settings.kafka.topic_deliveries, "--group", settings.worker.group]
    args += ["--concurrency", str(settings.channels.send_concurrency)]
    return start_python(stack, name, args, settings_env(settings))


async def measure_system(
    kind: str,
    base: Settings,
    urls: dict[str, str],
    stack: Stack,
    *,
    backlog: int,
    rounds: int,
    latency_s: float,
    progress: Progress | None = None,
    on_ready: Callable[[list[Child]], Any] | None = None,
) -> dict[str, Any]:
    """Peak deliveries/s (``rounds`` backlogs), then latency at half the median peak."""
    settings = fresh_settings(base, kind)
    await create_topics(settings)
    start = start_worker if kind == "worker" else start_bare
    children = [start(stack, settings, f"{kind}-{i}") for i in (1, 2)]
    try:
        async with Confirmations(settings) as seen:
            if kind == "worker":
                await wait_owned(children, settings.kafka.partitions)
            # Warm-up: both group members joined, connections open, code paths hot.
            warm = requests_for(urls, f"warm-{uuid.uuid4().hex[:6]}", 64)
            await produce_keyed(
                settings, settings.kafka.topic_deliveries, iter((k.encode(), v) for k, v in warm)
            )
            await seen.wait([k for k, _ in warm], 120.0, progress, f"{kind} warm-up")
            await asyncio.sleep(2)
            if on_ready is not None:
                await on_ready(children)
            peaks, cpu_ms = [], []
            for r in range(rounds):
                before = sum(cpu_seconds(c.process.pid) for c in children)
                peaks.append(
                    await peak_round(
                        settings, urls, seen, backlog, progress, f"{kind} peak {r + 1}/{rounds}"
                    )
                )
                used = sum(cpu_seconds(c.process.pid) for c in children) - before
                cpu_ms.append(used * 1000 / backlog)
            half = median(peaks) / 2
            latencies = [
                await latency_round(
                    settings,
                    urls,
                    seen,
                    half,
                    latency_s,
                    progress,
                    f"{kind} latency {r + 1}/{rounds} @ {half:.0f}/s",
                )
                for r in range(rounds)
            ]
    finally:
        for child in children:
            stop_child(stack, child)
    return {
        "peak_per_s": peaks,
        "cpu_ms_per_delivery": cpu_ms,
        "p50_ms": [x["p50_ms"] for x in latencies],
        "p99_ms": [x["p99_ms"] for x in latencies],
        "offered_per_s": [x["offered_per_s"] for x in latencies],
        "breakdown_ms": {
            name: [x[name] for x in latencies if name in x]
            for name in (
                "to_claim_p50_ms",
                "to_claim_p99_ms",
                "claim_to_confirmed_p50_ms",
                "claim_to_confirmed_p99_ms",
            )
        },
        "half_peak_per_s": half,
    }
