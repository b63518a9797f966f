"""End to end under faults: N deliveries, random receiver faults, two worker SIGKILLs.

Measures what issue 3 asks: logical events accepted twice (must be 0), deliveries lost
(must be 0), requests per delivery (amplification), deliveries per second end to end, and
p50/p99 latency from publish to CONFIRMED. Everything runs on 127.0.0.1: a fresh broker,
the fake provider (dedupe OFF, so a double send would show as a second acceptance), two
`ledger worker` processes, and this script as the agent and the observer.

    .venv/bin/python -m bench.e2e_faults --deliveries 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench.common import (
    BENCH_WEBHOOK_SECRET,
    ReceiverTally,
    fanout_specs,
    stuck_keys,
    with_webhook_lookup,
)
from clients import Publisher
from clients.kafka_security import client_options
from config import Settings
from events.codec import EventDecodeError, decode
from events.delivery import DeliveryEvent
from events.delivery_state import DeliveryState, Status, apply
from ledger.broker import LocalBroker
from ledger.stack import settings_env
from ledger.topics import create_topics

TERMINAL = {Status.CONFIRMED, Status.FAILED}


@dataclass
class Observation:
    published_at: dict[str, float] = field(default_factory=dict)
    states: dict[str, DeliveryState] = field(default_factory=dict)
    settled_at: dict[str, float] = field(default_factory=dict)


def start_simulator(
    tmp: Path, args: argparse.Namespace
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    command = [
        sys.executable,
        "-m",
        "ledger",
        "fake-provider",
        "--port",
        "0",
        "--control-port",
        "0",
        "--no-dedupe",
        "--seed",
        "7",
        "--timeout-pct",
        str(args.timeout_pct),
        "--error-pct",
        str(args.error_pct),
        "--reject-pct",
        str(args.reject_pct),
        "--delay",
        "3",
        "--delivered-after",
        "0.2",
        "--json",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=open(tmp / "sim.log", "w"),  # noqa: SIM115 - lives as long as the process
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    return process, json.loads(line)


def start_worker(settings: Settings, name: str, tmp: Path) -> subprocess.Popen[bytes]:
    log = open(tmp / f"{name}-{uuid.uuid4().hex[:4]}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "ledger", "worker", "--name", name],
        env=settings_env(settings),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def publish(settings: Settings, urls: dict[str, Any], n: int, seen: Observation) -> None:
    runs = (n + 2) // 3
    async with Publisher(settings, producer_name="bench-agent") as publisher:
        made = 0
        for r in range(runs):
            specs = fanout_specs(urls, r, n - made)
            requests = await publisher.run_succeeded(f"bench-{r}", "h", specs)
            now = time.time()
            for request in requests:
                seen.published_at[request.idempotency_key] = now
            made += len(specs)


async def observe(
    settings: Settings,
    seen: Observation,
    n: int,
    deadline: float,
    workers: dict[str, subprocess.Popen[bytes]],
    tmp: Path,
) -> None:
    consumer = AIOKafkaConsumer(
        settings.kafka.topic_deliveries,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        **client_options(settings.kafka),
    )
    await consumer.start()
    kills = {int(n * 0.3): "wa", int(n * 0.6): "wb"}
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
        ) as progress:
            task = progress.add_task("settled", total=n)
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500, max_records=5000)
                for messages in batch.values():
                    for message in messages:
                        try:
                            event = decode(message.value)
                        except EventDecodeError:
                            continue
                        if not isinstance(event, DeliveryEvent):
                            continue
                        key = event.idempotency_key
                        state = apply(seen.states.get(key), event)
                        if state is None:
                            continue
                        seen.states[key] = state
                        if state.status in TERMINAL and key not in seen.settled_at:
                            seen.settled_at[key] = event.occurred_at.timestamp()
                settled = len(seen.settled_at)
                progress.update(task, completed=settled)
                for threshold, name in list(kills.items()):
                    if settled >= threshold:
                        del kills[threshold]
                        workers[name].send_signal(signal.SIGKILL)
                        workers[name].wait()
                        progress.console.print(
                            f"SIGKILLed worker {name} at {settled} settled; restarting it"
                        )
                        workers[name] = start_worker(settings, name, tmp)
                if len(seen.published_at) == n and settled >= n:
                    return
    finally:
        await consumer.stop()


async def run(
    args: argparse.Namespace, settings: Settings, tmp: Path, urls: dict[str, Any]
) -> Observation:
    await create_topics(settings)
    workers = {name: start_worker(settings, name, tmp) for name in ("wa", "wb")}
    seen = Observation()
    deadline = time.monotonic() + args.timeout
    try:
        observer = asyncio.create_task(
            observe(settings, seen, args.deliveries, deadline, workers, tmp)
        )
        await asyncio.sleep(8)  # let both workers join before the load starts
        await publish(settings, urls, args.deliveries, seen)
        await observer
    finally:
        for worker in workers.values():
            worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    return seen


def report(seen: Observation, sim: dict[str, Any], n: int) -> None:
    events = sim["events"]
    tally = ReceiverTally.of(sim)
    posts, twice = tally.posts, len(tally.twice())
    states = seen.states
    by_status: dict[str, int] = {}
    for state in states.values():
        by_status[state.status.value] = by_status.get(state.status.value, 0) + 1
    lost = stuck_keys(seen.published_at, states)
    lying = [
        k
        for k, s in states.items()
        if s.status is Status.CONFIRMED and events.get(k, {}).get("accepted", 0) != 1
    ]
    failed_but_accepted = [
        k
        for k, s in states.items()
        if s.status is Status.FAILED and events.get(k, {}).get("accepted", 0)
    ]
    latencies = sorted(
        seen.settled_at[k] - seen.published_at[k]
        for k, s in states.items()
        if s.status is Status.CONFIRMED and k in seen.settled_at
    )
    first = min(seen.published_at.values())
    last = max(seen.settled_at.values())
    q = statistics.quantiles(latencies, n=100)
    print(f"| deliveries | {n} |")
    print(f"| final states | {by_status} |")
    print(f"| logical events accepted twice by the receiver | {twice} |")
    print(f"| deliveries lost (not CONFIRMED/FAILED/UNKNOWN-with-reason) | {len(lost)} |")
    print(f"| CONFIRMED but receiver count != 1 | {len(lying)} |")
    print(f"| FAILED but receiver accepted it | {len(failed_but_accepted)} |")
    print(f"| requests (POST) per delivery | {posts / n:.3f} |")
    print(f"| deliveries/s end to end | {n / (last - first):.1f} |")
    print(f"| publish -> CONFIRMED p50 / p99 | {q[49] * 1000:.0f} ms / {q[98] * 1000:.0f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deliveries", type=int, default=10_000)
    parser.add_argument("--timeout-pct", type=float, default=10)
    parser.add_argument("--error-pct", type=float, default=5)
    parser.add_argument("--reject-pct", type=float, default=2)
    parser.add_argument("--timeout", type=float, default=1200, help="overall bound, seconds")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    tag = uuid.uuid4().hex[:6]
    base = Settings(
        kafka={
            "broker_port": 29292,
            "controller_port": 29293,
            "topic_runs": f"bench.runs.{tag}",
            "topic_deliveries": f"bench.deliveries.{tag}",
            "topic_deadletter": f"bench.dl.{tag}",
        },
        channels={
            "allowed_networks": ["127.0.0.0/8"],
            "webhook_secret": BENCH_WEBHOOK_SECRET,
            "http_timeout_s": 1.0,
            "send_deadline_s": 2.0,
            "send_concurrency": 128,
        },
        worker={
            "group": f"bench-{tag}",
            "lookup_settle_s": 3.0,
            "lookup_confirm_spacing_s": 1.5,
            "lease_s": 10.0,
        },
        data_dir=tmp / "data",
    )
    broker = LocalBroker(base)
    broker.start()
    simulator, urls = start_simulator(tmp, args)
    try:
        settings = with_webhook_lookup(base, urls)
        began = datetime.now().astimezone()
        seen = asyncio.run(run(args, settings, tmp, urls))
        sim = httpx.get(f"{urls['control']}/state", timeout=60).json()
        print(
            f"run at {began:%Y-%m-%d %H:%M} on {os.cpu_count()} CPUs; "
            f"faults: {args.timeout_pct}% timeouts, "
            f"{args.error_pct}% 500-after-accept, {args.reject_pct}% rejects; 2 workers, 2 SIGKILLs"
        )
        report(seen, sim, args.deliveries)
    finally:
        simulator.send_signal(signal.SIGTERM)
        simulator.wait(timeout=30)
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
