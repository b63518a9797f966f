"""Publisher throughput: runs/s with 1 and with 8 concurrent callers vs raw aiokafka.

A run is the issue's shape: one ``RunSucceeded`` and one webhook ``DeliveryRequested``
(``--deliveries`` for more). The SDK's callers share one ``Publisher``, whose group commit
puts concurrent runs into one transaction. The baselines produce the very same
pre-encoded records with bare transactional AIOKafkaProducers, one transaction per run:
one producer, and 8 producers side by side (one transactional id each, like 8 agents),
so the ratios are the cost of the SDK (validation, keys, hashing, encoding) and what
group commit buys over one transaction per run. Median of --repeat rounds.

    .venv/bin/python -m bench.publisher --runs 2000 --repeat 3 --port 29992
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.common import BROKER_PORT
from clients import DeliverySpec, Publisher
from clients.kafka_security import client_options
from config import Settings
from config.settings import changed
from events import RunSucceeded, encode
from events.topics import record_key
from ledger.broker import LocalBroker
from ledger.broker.process import metadata_ok
from ledger.topics import create_topics

CALLERS = 8
Records = list[tuple[str, bytes, bytes]]


def specs(run: int, deliveries: int) -> list[DeliverySpec]:
    return [
        DeliverySpec(
            channel="webhook",
            recipient=f"http://127.0.0.1:9/hooks/{i}",
            payload={"run": run, "text": "report ready", "i": i},
        )
        for i in range(deliveries)
    ]


async def sdk_round(
    settings: Settings,
    runs: int,
    callers: int,
    deliveries: int,
    counts: dict[str, int] | None = None,
) -> float:
    """Runs/s of ``callers`` tasks sharing one Publisher, each awaiting its run in turn
    (``counts``: its runs and Kafka transactions are added there)."""
    tag = uuid.uuid4().hex[:8]
    all_specs = [specs(n, deliveries) for n in range(runs)]  # built before the clock starts
    async with Publisher(settings, producer_name="bench") as publisher:

        async def caller(c: int) -> None:
            for n in range(c, runs, callers):
                await publisher.run_succeeded(f"bench-{tag}-{n}", "h", all_specs[n])

        began = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(callers)))
        rate = runs / (time.perf_counter() - began)
        if counts is not None:
            counts["runs"] = counts.get("runs", 0) + publisher.runs_committed
            counts["transactions"] = (
                counts.get("transactions", 0) + publisher.transactions_committed
            )
        return rate


def raw_batches(settings: Settings, runs: int, deliveries: int) -> list[Records]:
    publisher = Publisher(settings, producer_name="bench")
    batches = []
    for n in range(runs):
        run_id = f"raw-{uuid.uuid4().hex[:8]}-{n}"
        run = RunSucceeded(run_id=run_id, result_hash="h", producer="bench")
        records = [(settings.kafka.topic_runs, encode(run), record_key(run))]
        records += [
            (settings.kafka.topic_deliveries, encode(r), record_key(r))
            for r in publisher.delivery_requests(run_id, specs(n, deliveries))
        ]
        batches.append(records)
    return batches


async def raw_round(settings: Settings, runs: int, producers: int, deliveries: int) -> float:
    """Runs/s of ``producers`` bare transactional producers side by side, one transaction
    per run, on records encoded before the clock starts (no SDK work)."""
    batches = raw_batches(settings, runs, deliveries)
    started: list[AIOKafkaProducer] = []
    try:
        for _ in range(producers):
            producer = AIOKafkaProducer(
                bootstrap_servers=settings.kafka.bootstrap_servers,
                transactional_id=f"raw-{uuid.uuid4().hex}",
                enable_idempotence=True,
                acks="all",
                linger_ms=0,
                **client_options(settings.kafka),
            )
            await producer.start()
            started.append(producer)

        async def one(producer: AIOKafkaProducer, mine: list[Records]) -> None:
            for records in mine:
                async with producer.transaction():
                    futures = [await producer.send(t, v, key=k) for t, v, k in records]
                    await asyncio.gather(*futures)

        began = time.perf_counter()
        await asyncio.gather(*(one(p, batches[i::producers]) for i, p in enumerate(started)))
        return runs / (time.perf_counter() - began)
    finally:
        for producer in started:
            await producer.stop()


async def measure(
    settings: Settings, runs: int, repeat: int, progress: Any = None, deliveries: int = 1
) -> dict[str, list[float]]:
    """``repeat`` rounds of each figure; runs/s per round: ``raw_1``/``sdk_1`` (one caller)
    and ``raw_8``/``sdk_8`` (8 producers, 8 callers of one publisher)."""
    await create_topics(settings)
    figures: dict[str, list[float]] = {"raw_1": [], "sdk_1": [], "raw_8": [], "sdk_8": []}
    task = progress.add_task("publisher rounds", total=repeat) if progress else None
    for r in range(repeat):
        if progress is not None:
            progress.update(task, completed=r)
        figures["raw_1"].append(await raw_round(settings, runs, 1, deliveries))
        figures["sdk_1"].append(await sdk_round(settings, runs, 1, deliveries))
        figures["raw_8"].append(await raw_round(settings, runs, CALLERS, deliveries))
        figures["sdk_8"].append(await sdk_round(settings, runs, CALLERS, deliveries))
    if progress is not None:
        progress.remove_task(task)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--deliveries", type=int, default=1)
    parser.add_argument("--linger-ms", type=float, default=None, help="publisher.linger_s, in ms")
    parser.add_argument(
        "--port", type=int, default=BROKER_PORT, help="broker port (reused if one runs there)"
    )
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="bench-publisher-") as tmp:
        settings = Settings(
            kafka={
                "broker_port": args.port,
                "controller_port": args.port + 1,
                "topic_runs": f"bench.runs.{tag}",
                "topic_deliveries": f"bench.deliveries.{tag}",
                "topic_deadletter": f"bench.dl.{tag}",
            },
            channels={"allowed_networks": ["127.0.0.0/8"]},
            data_dir=Path(tmp) / "data",
        )
        if args.linger_ms is not None:
            settings = changed(settings, {"publisher.linger_s": args.linger_ms / 1000})
        broker = LocalBroker(settings)
        # A broker that already answers there is used as it is (and left running).
        started = not metadata_ok(settings.kafka.bootstrap_servers, timeout=2.0)
        if started:
            broker.start()
        try:
            figures = asyncio.run(measure(settings, args.runs, args.repeat, None, args.deliveries))
        finally:
            if started:
                broker.stop()
    m = {name: statistics.median(values) for name, values in figures.items()}
    shape = f"1 RunSucceeded + {args.deliveries} DeliveryRequested"
    print(
        f"machine: {platform.machine()} {platform.python_version()} runs/round={args.runs} "
        f"rounds={args.repeat} run={shape} linger_ms={settings.publisher.linger_s}"
    )
    print("| figure | median | baseline (raw aiokafka, 1 txn/run) | ratio |")
    print("|---|---|---|---|")
    print(f"| publisher runs/s, 1 caller | {m['sdk_1']:.0f} | {m['raw_1']:.0f} (1 producer) "
          f"| {m['sdk_1'] / m['raw_1']:.2f}x |")  # fmt: skip
    print(f"| publisher runs/s, {CALLERS} callers | {m['sdk_8']:.0f} | {m['raw_8']:.0f} "
          f"({CALLERS} producers) | {m['sdk_8'] / m['raw_8']:.2f}x |")  # fmt: skip
    print("all rounds " + " ".join(f"{k}={[round(x) for x in v]}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
