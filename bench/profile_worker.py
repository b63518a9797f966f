"""Where a ``ledger worker`` spends its CPU at saturation: py-spy over a backlog drain.

Starts a broker on 127.0.0.1:29792 (controller 29793; ``--port``), the fake provider and
two workers, warms them up, produces a backlog of --backlog requests and records both
workers with ``py-spy record -f raw`` while it drains; then prints the share of samples
whose stack passes through each area (a sample can count in several areas) and the top
leaf frames. ``--no-spy`` only measures (rate, CPU per delivery); ``--rounds`` and the
``--loops``/``--pools`` lists repeat the drain per combination on the same broker, with
fresh topics each time (``LEDGER_EVENT_LOOP``, ``LEDGER_HTTP_POOL`` of the workers).

    .venv/bin/python -m bench.profile_worker --backlog 6000 --out /tmp/profile
    .venv/bin/python -m bench.profile_worker --port 29292 --no-spy --rounds 3 \
        --loops asyncio uvloop --pools aiohttp httpcore
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bench.common import (
    bench_broker,
    cpu_seconds,
    fresh_settings,
    produce_keyed,
    start_receiver,
)
from bench.e2e import (
    METRICS_PORTS,
    Confirmations,
    requests_for,
    start_worker,
    trimmed_rate,
    wait_owned,
)
from events import Settings
from events.ports import free_port
from ledger.stack import Child, Stack
from ledger.topics import create_topics

AREAS = {
    "httpx/httpcore (client side of the send)": ("httpx/", "httpcore/", "h11/", "anyio/"),
    "aiokafka (produce, fetch, protocol)": ("aiokafka/",),
    "faust/mode (stream, table, consumer)": ("faust/", "mode/"),
    "pydantic validation/construction": ("pydantic/", "pydantic_core", "model_validate"),
    "events (decode, keys, encode)": ("events/",),
    "streams/state_codec (dumps/loads)": ("state_codec.py",),
    "events/delivery_state.py (fold)": ("events/delivery_state.py",),
    "streams/timers.py (DueIndex)": ("streams/timers.py",),
    "prometheus_client": ("prometheus_client/",),
    "asyncio event loop": ("asyncio/",),
}


def summarize(raw: Path, top: int = 25) -> str:
    """Area shares and top leaf frames of one py-spy raw (collapsed) file."""
    areas: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        for area, needles in AREAS.items():
            if any(n in stack for n in needles):
                areas[area] += count
        leaves[stack.split(";")[-1]] += count
    lines = [f"{raw.name}: {total} samples"]
    lines += [f"  {100 * n / total:5.1f}%  {area}" for area, n in areas.most_common()]
    lines.append("  top leaf frames:")
    lines += [f"  {100 * n / total:5.1f}%  {leaf}" for leaf, n in leaves.most_common(top)]
    return "\n".join(lines)


def start_spy(child: Child, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    """``py-spy record`` of one child, raw collapsed stacks, 50 Hz."""
    command = [str(Path(sys.executable).parent / "py-spy"), "record", "-f", "raw", "-r", "50"]
    command += ["-d", str(seconds), "-o", str(out / f"{child.name}.txt")]
    command += ["-p", str(child.process.pid)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def profile(
    args: argparse.Namespace, base: Settings, base_tmp: Path, loop: str, pool: str
) -> tuple[float, float]:
    """One drain with the workers on ``loop`` and ``pool``: (deliveries/s, CPU ms each)."""
    out: Path = args.out
    stack = Stack(base_tmp / "logs")
    try:
        urls = start_receiver(stack, base)
        settings = fresh_settings(base, "prof", event_loop=loop, http_pool=pool)
        await create_topics(settings)
        children = [start_worker(stack, settings, f"prof-{i}") for i in (1, 2)]
        await wait_owned(children, settings.partitions)
        async with Confirmations(settings) as seen:
            warm = requests_for(urls, f"warm-{uuid.uuid4().hex[:6]}", 64)
            await produce_keyed(
                settings, settings.topic_deliveries, iter((k.encode(), v) for k, v in warm)
            )
            await seen.wait([k for k, _ in warm], 120.0, None, "warm-up")
            await asyncio.sleep(2)
            batch = requests_for(urls, f"prof-{uuid.uuid4().hex[:6]}", args.backlog)
            before = sum(cpu_seconds(c.process.pid) for c in children)
            spies = [] if args.no_spy else [start_spy(c, args.seconds, out) for c in children]
            await produce_keyed(
                settings, settings.topic_deliveries, iter((k.encode(), v) for k, v in batch)
            )
            keys = [k for k, _ in batch]
            await seen.wait(keys, 600.0, None, "drain")
            used = sum(cpu_seconds(c.process.pid) for c in children) - before
            rate = trimmed_rate([seen.settled[k] for k in keys])
            for spy in spies:
                spy.wait(timeout=args.seconds + 60)
        cpu_ms = used * 1000 / len(keys)
        print(
            f"drain ({loop} loop, {pool} pool): {rate:,.0f} deliveries/s, {cpu_ms:.2f} CPU ms each"
        )
        if not args.no_spy:
            for child in children:
                print(summarize(out / f"{child.name}.txt"))
        return rate, cpu_ms
    finally:
        stack.stop()


async def profile_all(args: argparse.Namespace, base: Settings, base_tmp: Path) -> None:
    """Every round of every loop x pool, interleaved; then the medians."""
    results: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for _ in range(args.rounds):
        for loop in args.loops:
            for pool in args.pools:
                results[loop, pool].append(await profile(args, base, base_tmp, loop, pool))
    print()
    print("| loop | HTTP pool | deliveries/s | CPU ms per delivery (2 workers) | rounds (ms) |")
    print("|---|---|---|---|---|")
    for (loop, pool), rounds in results.items():
        rate = statistics.median(r for r, _ in rounds)
        cpu = statistics.median(c for _, c in rounds)
        each = ", ".join(f"{c:.2f}" for _, c in rounds)
        print(f"| {loop} | {pool} | {rate:,.0f} | {cpu:.2f} | {each} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backlog", type=int, default=6000)
    parser.add_argument("--seconds", type=int, default=20, help="py-spy duration")
    parser.add_argument("--out", type=Path, default=Path("/tmp/profile"))
    parser.add_argument("--port", type=int, default=29792, help="broker port (and port + 1)")
    parser.add_argument("--no-spy", action="store_true", help="measure only, no py-spy")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--loops", nargs="+", choices=("asyncio", "uvloop"), default=["asyncio"])
    parser.add_argument("--pools", nargs="+", choices=("aiohttp", "httpcore"), default=["aiohttp"])
    args = parser.parse_args()
    # Not e2e's fixed metrics ports: another benchmark's workers may hold them (and would
    # answer the readiness check in place of ours).
    METRICS_PORTS.update({"1": free_port(), "2": free_port()})
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-prof-"))
    try:
        with bench_broker(tmp, port=args.port) as base:
            asyncio.run(profile_all(args, base, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
