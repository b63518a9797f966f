"""Publisher throughput: runs/s (3 deliveries each, one transaction per run) vs raw aiokafka.

The baseline produces the very same pre-encoded records with a bare transactional
AIOKafkaProducer, one transaction per run, so the ratio is the cost of the SDK
(validation, key derivation, hashing, encoding). Median of --repeat rounds.

    .venv/bin/python -m bench.publisher --runs 2000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from events import DeliverySpec, Publisher, RunSucceeded, Settings, encode
from events.kafka_security import client_options
from events.topics import record_key
from ledger.broker import LocalBroker
from ledger.topics import create_topics


def specs(run: int) -> list[DeliverySpec]:
    return [
        DeliverySpec(
            channel="webhook",
            recipient=f"http://127.0.0.1:9/hooks/{i}",
            payload={"run": run, "text": "report ready", "i": i},
        )
        for i in range(3)
    ]


async def sdk_round(settings: Settings, runs: int) -> float:
    async with Publisher(settings, producer_name="bench") as publisher:
        began = time.perf_counter()
        for n in range(runs):
            await publisher.run_succeeded(f"bench-{uuid.uuid4().hex[:8]}-{n}", "h", specs(n))
        return runs / (time.perf_counter() - began)


async def raw_round(settings: Settings, runs: int) -> float:
    # Same records, encoded before the clock starts: the baseline does no SDK work.
    batches = []
    publisher = Publisher(settings, producer_name="bench")
    for n in range(runs):
        run_id = f"raw-{uuid.uuid4().hex[:8]}-{n}"
        run = RunSucceeded(run_id=run_id, result_hash="h", producer="bench")
        records = [(settings.topic_runs, encode(run), record_key(run))]
        records += [
            (settings.topic_deliveries, encode(r), record_key(r))
            for r in publisher.delivery_requests(run_id, specs(n))
        ]
        batches.append(records)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        transactional_id=f"raw-{uuid.uuid4().hex}",
        enable_idempotence=True,
        acks="all",
        linger_ms=0,
        **client_options(settings),
    )
    await producer.start()
    try:
        began = time.perf_counter()
        for records in batches:
            async with producer.transaction():
                futures = [await producer.send(t, v, key=k) for t, v, k in records]
                await asyncio.gather(*futures)
        return runs / (time.perf_counter() - began)
    finally:
        await producer.stop()


async def measure(
    settings: Settings, runs: int, repeat: int, progress: Any = None
) -> tuple[list[float], list[float]]:
    """``repeat`` rounds of each; runs/s of the SDK and of the raw baseline, every round."""
    await create_topics(settings)
    sdk, raw = [], []
    task = progress.add_task("publisher rounds", total=repeat) if progress else None
    for r in range(repeat):
        if progress is not None:
            progress.update(task, completed=r)
        raw.append(await raw_round(settings, runs))
        sdk.append(await sdk_round(settings, runs))
    if progress is not None:
        progress.remove_task(task)
    return sdk, raw


def loop_rounds(settings: Settings, runs: int, repeat: int, loops: list[str]) -> None:
    """The SDK's rounds on each event loop, interleaved: runs/s and this process's CPU per run."""
    import resource

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    asyncio.run(create_topics(settings))
    results: dict[str, list[tuple[float, float]]] = {loop: [] for loop in loops}
    for _ in range(repeat):
        for loop in loops:
            factory = None
            if loop == "uvloop":
                import uvloop

                factory = uvloop.new_event_loop
            began = cpu()
            with asyncio.Runner(loop_factory=factory) as runner:
                rate = runner.run(sdk_round(settings, runs))
            results[loop].append((rate, (cpu() - began) * 1000 / runs))
    print("| loop | publisher runs/s | publisher CPU ms per run | rounds (ms) |")
    print("|---|---|---|---|")
    for loop, rounds in results.items():
        rate = statistics.median(r for r, _ in rounds)
        ms = statistics.median(c for _, c in rounds)
        each = ", ".join(f"{c:.2f}" for _, c in rounds)
        print(f"| {loop} | {rate:.0f} | {ms:.2f} | {each} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=None, help="broker port (and port + 1)")
    parser.add_argument(
        "--loops",
        nargs="+",
        choices=("asyncio", "uvloop"),
        default=None,
        help="compare the SDK on these event loops (CPU per run) instead of the baseline",
    )
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    # With --port: a broker of its own, in a temp data dir.
    ports: dict[str, Any] = {}
    if args.port is not None:
        ports = {
            "broker_port": args.port,
            "controller_port": args.port + 1,
            "data_dir": Path(tempfile.mkdtemp(prefix="bench-pub-")),
        }
    settings = Settings(
        topic_runs=f"bench.runs.{tag}",
        topic_deliveries=f"bench.deliveries.{tag}",
        topic_deadletter=f"bench.dl.{tag}",
        allowed_networks=["127.0.0.0/8"],  # the bench's recipients are on 127.0.0.1
        **ports,
    )
    broker = LocalBroker(settings)
    started = not broker.start().already_running
    try:
        if args.loops:
            loop_rounds(settings, args.runs, args.repeat, args.loops)
            return
        sdk, raw = asyncio.run(measure(settings, args.runs, args.repeat))
    finally:
        if started:
            broker.stop()
        if "data_dir" in ports:
            shutil.rmtree(ports["data_dir"], ignore_errors=True)
    s, r = statistics.median(sdk), statistics.median(raw)
    print(
        f"machine: {platform.machine()} {platform.python_version()} runs/round={args.runs} "
        f"rounds={args.repeat}"
    )
    print("| figure | median | baseline (raw aiokafka txn) | ratio |")
    print("|---|---|---|---|")
    print(f"| publisher runs/s (3 deliveries, 1 txn/run) | {s:.0f} | {r:.0f} | {s / r:.2f}x |")
    print(f"all rounds sdk={[round(x) for x in sdk]} raw={[round(x) for x in raw]}")


if __name__ == "__main__":
    main()
