"""The worker's hot path (issue 31 item 3): CPU ms per webhook delivery of one worker
draining a backlog, and the hot events' codec per event (bench/codec.py).

One ``ledger worker`` per variant, each on topics of its own, over the same broker and
the same receiver (the fake provider); every round produces a backlog of N requests into
each variant's topic in turn and reads the worker's CPU (/proc/PID/stat: user + system,
not wall time, so the other load on a shared machine counts less) while it drains to
CONFIRMED. A variant is a label, or ``label=PATH``: that worker runs the code in PATH (a
detached worktree of another commit: ``git worktree add --detach /tmp/old main``), the
same-run baseline of a change.

    python -m bench.hot_path [--quick] [--variants now old=/tmp/old] [--paced 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from rich.progress import Progress

from bench import codec
from bench.common import (
    BROKER_PORT,
    bench_broker,
    cpu_seconds,
    fresh_settings,
    start_python,
    start_receiver,
    stop_child,
)
from bench.e2e import Confirmations, requests_for, wait_owned
from bench.tracing import _produce
from clients.kafka_security import client_options
from clients.outcome_signing import new_pair
from config import Settings
from events.ports import free_port
from ledger.stack import Child, Stack, settings_env
from ledger.topics import create_topics

TARGET_MS = 1.5  # issue 31: worker CPU per delivery
IDLE_S = 5.0


def _worker(stack: Stack, settings: Settings, label: str, code: str | None, port: int) -> Child:
    env = settings_env(settings)
    if code is not None:
        # That tree's packages first, not the working directory's (PYTHONSAFEPATH).
        env |= {"PYTHONSAFEPATH": "1", "PYTHONPATH": code}
    args = ["-m", "ledger", "worker", "--name", f"hot-{label}", "--metrics-port", str(port)]
    return start_python(stack, f"hot-{label}", args, env)


async def measure(
    base: Settings,
    urls: dict[str, str],
    stack: Stack,
    *,
    backlog: int,
    rounds: int,
    progress: Progress | None = None,
    variants: tuple[str, ...] = ("now",),
    codec_calls: int = 1000,
    paced: float | None = None,
) -> dict[str, Any]:
    """CPU ms per delivery of each variant's worker, every round in turn; the codec table.
    ``paced``: requests per second, instead of the whole backlog at once (a worker's CPU
    per delivery falls as its rate rises, so variants compare at one rate)."""
    signing, verify = new_pair()  # the workers sign their outcomes (on by default)
    pair = {"signing.signing_key": signing, "signing.verify_keys": [verify]}
    labels = [v.partition("=")[0] for v in variants]
    codes = {v.partition("=")[0]: (v.partition("=")[2] or None) for v in variants}
    settings = {label: fresh_settings(base, f"hot-{label}", pair) for label in labels}
    ports = {label: free_port() for label in labels}
    for one in settings.values():
        await create_topics(one)
    workers = {
        label: _worker(stack, settings[label], label, codes[label], ports[label])
        for label in labels
    }
    cpu_ms: dict[str, list[float]] = {label: [] for label in labels}
    rate: dict[str, list[float]] = {label: [] for label in labels}
    idle: dict[str, float] = {}
    idle_share: dict[str, list[float]] = {label: [] for label in labels}
    try:
        for label in labels:
            renamed = Child(workers[label].name + "-x", workers[label].process, workers[label].log)
            await wait_owned([renamed], base.kafka.partitions, ports={"x": ports[label]})
        async with contextlib.AsyncExitStack() as exits:
            seen = {
                label: await exits.enter_async_context(Confirmations(settings[label]))
                for label in labels
            }
            for label in labels:  # warm-up: connections open, code paths hot
                warm = requests_for(urls, f"warm-{uuid.uuid4().hex[:6]}", 64)
                await _produce(settings[label], warm, False)
                await seen[label].wait([k for k, _ in warm], 120.0, progress, f"{label} warm")
            await asyncio.sleep(2)
            # What a worker burns with nothing to do (polls, heartbeats, ticks): a slow drain
            # spreads more of it over each delivery, so each round says its share too.
            idle_before = {label: cpu_seconds(workers[label].process.pid) for label in labels}
            await asyncio.sleep(IDLE_S)
            for label in labels:
                spent = cpu_seconds(workers[label].process.pid) - idle_before[label]
                idle[label] = spent * 1000 / IDLE_S
            for r in range(rounds):
                for label in labels:
                    pid = workers[label].process.pid
                    batch = requests_for(urls, f"h{r}-{uuid.uuid4().hex[:6]}", backlog)
                    before, began = cpu_seconds(pid), time.monotonic()
                    if paced is None:
                        await _produce(settings[label], batch, False)
                    else:
                        await _paced(settings[label], batch, paced)
                    keys = [k for k, _ in batch]
                    wait_s = max(300.0, backlog / 5)
                    await seen[label].wait(keys, wait_s, progress, f"hot {label} {r + 1}/{rounds}")
                    took_s = time.monotonic() - began
                    cpu_ms[label].append((cpu_seconds(pid) - before) * 1000 / backlog)
                    rate[label].append(backlog / took_s)
                    idle_share[label].append(idle[label] * took_s / backlog)
    finally:
        for child in workers.values():
            stop_child(stack, child)
    return {
        "backlog": backlog,
        "paced": paced,
        "cpu_ms_per_delivery": cpu_ms,
        "per_s": rate,
        "idle_cpu_ms_per_s": idle,
        "idle_ms_per_delivery": idle_share,
        "codec_us": await asyncio.to_thread(codec.measure, codec_calls, 3),
    }


async def _paced(settings: Settings, batch: list[tuple[str, bytes]], per_s: float) -> None:
    """``batch`` produced at ``per_s`` records a second, in slices of 50 ms."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        acks=1,
        linger_ms=5,
        **client_options(settings.kafka),
    )
    await producer.start()
    try:
        began, step = time.monotonic(), max(1, int(per_s / 20))
        sent = []
        for start in range(0, len(batch), step):
            ahead = began + start / per_s - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            for key, value in batch[start : start + step]:
                sent.append(
                    await producer.send(settings.kafka.topic_deliveries, value, key=key.encode())
                )
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def rows(results: dict[str, Any], row: Callable[..., None]) -> None:
    """bench/run_all.py's rows: the first variant's worker CPU per delivery (against the
    second's, when there is one) and the decode of a worker-written record."""
    cpu = {v: statistics.median(each) for v, each in results["cpu_ms_per_delivery"].items()}
    (first, value), *rest = cpu.items()
    baseline = f"{rest[0][1]:.2f}" if rest else ""
    row(
        f"hot path: worker CPU ms per webhook delivery, 1 worker draining "
        f"{results['backlog']:,}" + (f" ({first} vs {rest[0][0]})" if rest else ""),
        f"{value:.2f}",
        baseline,
        f"{value / rest[0][1]:.2f}x" if rest else "",
        f"<= {TARGET_MS}",
        value <= TARGET_MS,
    )
    us = results["codec_us"]["delivery.confirmed"]
    row(
        "hot path: a worker-written record read back, us (own record vs decode + verify)",
        f"{us['own record']:.1f}",
        f"{us['decode'] + us['verify']:.1f}",
        f"{us['own record'] / (us['decode'] + us['verify']):.2f}x",
    )


def note(results: dict[str, Any]) -> str:
    """The details line."""
    each = "; ".join(
        f"{v}: " + ", ".join(f"{x:.2f}" for x in xs)
        for v, xs in results["cpu_ms_per_delivery"].items()
    )
    rates = "; ".join(
        f"{v}: " + ", ".join(f"{x:,.0f}" for x in xs) for v, xs in results["per_s"].items()
    )
    idle = "; ".join(
        f"{v}: {results['idle_cpu_ms_per_s'][v]:.0f} ms/s idle, "
        + ", ".join(f"{x:.2f}" for x in xs)
        + " ms of it per delivery"
        for v, xs in results["idle_ms_per_delivery"].items()
    )
    requested = results["codec_us"]["delivery.requested"]
    confirmed = results["codec_us"]["delivery.confirmed"]
    return (
        f"Hot path (bench/hot_path.py), one worker per variant, backlogs of "
        f"{results['backlog']:,} in turn"
        + (f" produced at {results['paced']:,.0f}/s" if results.get("paced") else "")
        + f": CPU ms per delivery {each}; drained per s {rates}; "
        f"the idle worker's share (its CPU at rest x the drain's time) {idle}. "
        f"Codec (bench/codec.py, CPU us): DeliveryRequested decode {requested['decode']:.1f}, "
        f"validate_json {requested['validate_json']:.1f}; DeliveryConfirmed decode "
        f"{confirmed['decode']:.1f}, Ed25519 verify {confirmed['verify']:.1f}, sign "
        f"{confirmed['sign']:.1f}, own record {confirmed['own record']:.1f}."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="backlog 600, 2 rounds")
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paced", type=float, help="requests per second (default: all at once)")
    parser.add_argument(
        "--variants", nargs="+", default=["now"], help="label or label=PATH (code of a worktree)"
    )
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT,
                        help="its own broker on this port and the next")  # fmt: skip
    args = parser.parse_args(argv)
    backlog, rounds = (600, 2) if args.quick else (args.backlog, args.rounds)
    tmp = Path(tempfile.mkdtemp(prefix="bench-hot-"))
    try:
        with bench_broker(tmp, args.broker_port) as settings:
            stack = Stack(tmp / "logs")
            try:
                urls = start_receiver(stack, settings)
                results = asyncio.run(
                    measure(
                        settings,
                        urls,
                        stack,
                        backlog=backlog,
                        rounds=rounds,
                        variants=tuple(args.variants),
                        paced=args.paced,
                    )
                )
            finally:
                stack.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines: list[str] = []
    rows(results, lambda *cells, **_: lines.append(" | ".join(str(c) for c in cells)))
    print("\n".join(lines))
    print(note(results))
    print(codec.table(results["codec_us"]))


if __name__ == "__main__":
    main()
