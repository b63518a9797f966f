"""Where a ``ledger worker`` spends its CPU at saturation: py-spy over a backlog drain.

Starts a broker on 127.0.0.1:29792 (controller 29793; ``--port``), the fake provider and
two workers, warms them up, produces a backlog of --backlog requests and records both
workers with ``py-spy record -f raw`` while it drains; then prints the share of samples
whose stack passes through each area (a sample can count in several areas) and the top
leaf frames. ``--no-spy`` only measures (rate, CPU per delivery); ``--rounds`` and the
``--loops``/``--pools`` lists repeat the drain per combination on the same broker, with
fresh topics each time (``LEDGER_EVENT_LOOP``, ``LEDGER_CHANNELS__HTTP_POOL`` of the workers).
``--variants`` adds worker environments to interleave, e.g. another commit's code against
this one in the same session: ``git archive COMMIT events streams ledger receiver
projections | tar -x -C /tmp/base``, then
``--variants now base:PYTHONSAFEPATH=1,PYTHONPATH=/tmp/base``.

    .venv/bin/python -m bench.profile_worker --backlog 6000 --out /tmp/profile
    .venv/bin/python -m bench.profile_worker --port 29292 --no-spy --rounds 3 \
        --loops asyncio uvloop --pools aiohttp httpcore
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.common import (
    bench_broker,
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
from clients.outcome_signing import new_pair
from config import Settings
from events.ports import free_port
from ledger.stack import Child, Stack
from ledger.topics import create_topics

AREAS = {
    "httpx/httpcore (client side of the send)": ("httpx/", "httpcore/", "h11/", "anyio/"),
    "aiokafka (produce, fetch, protocol)": ("aiokafka/",),
    "faust/mode (stream, table, consumer)": ("faust/", "mode/"),
    "pydantic validation/construction": ("pydantic/", "pydantic_core", "model_validate"),
    "events (decode, keys, encode)": ("events/",),
    "events/state_codec (dumps/loads)": ("state_codec.py",),
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


def start_spy(
    child: Child, seconds: int, out: Path, rate: int = 50, gil: bool = False
) -> subprocess.Popen[bytes]:
    """``py-spy record`` of one child, raw collapsed stacks, ``rate`` Hz; with ``gil``, only
    samples of the thread holding the GIL (Python work: a thread blocked in a socket write
    or descheduled on a busy machine is not counted)."""
    spy = Path(sys.executable).parent / "py-spy"
    command = [str(spy) if spy.exists() else "py-spy", "record", "-f", "raw", "-r", str(rate)]
    command += ["--gil"] if gil else []
    command += ["-d", str(seconds), "-o", str(out / f"{child.name}.txt")]
    command += ["-p", str(child.process.pid)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


@contextlib.contextmanager
def variant_env(variant: str) -> Iterator[str]:
    """``label`` or ``label:NAME=VALUE,NAME=VALUE``: the workers started inside see those
    variables (children inherit the benchmark's environment). Yields the label."""
    label, _, assignments = variant.partition(":")
    saved = dict(os.environ)
    os.environ.update(dict(a.split("=", 1) for a in assignments.split(",") if a))
    try:
        yield label
    finally:
        os.environ.clear()
        os.environ.update(saved)


async def profile(
    args: argparse.Namespace, base: Settings, base_tmp: Path, loop: str, pool: str, variant: str
) -> tuple[float, float]:
    """One drain with the workers on ``loop`` and ``pool``: (deliveries/s, CPU ms each)."""
    out: Path = args.out
    stack = Stack(base_tmp / "logs")
    try:
        with variant_env(variant) as label:
            return await _drain(args, base, stack, loop, pool, label, out)
    finally:
        stack.stop()


async def _drain(
    args: argparse.Namespace,
    base: Settings,
    stack: Stack,
    loop: str,
    pool: str,
    label: str,
    out: Path,
) -> tuple[float, float]:
    urls = start_receiver(stack, base)
    # The workers sign their outcome events (on by default) with a pair of this run's.
    signing, verify = new_pair()
    settings = fresh_settings(
        base,
        "prof",
        {
            "event_loop": loop,
            "channels.http_pool": pool,
            "signing.signing_key": signing,
            "signing.verify_keys": [verify],
        },
    )
    await create_topics(settings)
    children = [start_worker(stack, settings, f"prof-{i}") for i in (1, 2)]
    await wait_owned(children, settings.kafka.partitions)
    async with Confirmations(settings) as seen:
        warm = requests_for(urls, f"warm-{uuid.uuid4().hex[:6]}", 64)
        await produce_keyed(
            settings, settings.kafka.topic_deliveries, iter((k.encode(), v) for k, v in warm)
        )
        await seen.wait([k for k, _ in warm], 120.0, None, "warm-up")
        await asyncio.sleep(2)
        batch = requests_for(urls, f"prof-{uuid.uuid4().hex[:6]}", args.backlog)
        before = [cpu_split(c.process.pid) for c in children]
        spies = (
            []
            if args.no_spy
            else [start_spy(c, args.seconds, out, args.rate, args.gil) for c in children]
        )
        await produce_keyed(
            settings, settings.kafka.topic_deliveries, iter((k.encode(), v) for k, v in batch)
        )
        keys = [k for k, _ in batch]
        await seen.wait(keys, 600.0, None, "drain")
        after = [cpu_split(c.process.pid) for c in children]
        user = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        system = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
        used = user + system
        rate = trimmed_rate([seen.settled[k] for k in keys])
        for spy in spies:
            spy.wait(timeout=args.seconds + 60)
    cpu_ms = used * 1000 / len(keys)
    print(
        f"drain ({label}, {loop} loop, {pool} pool): {rate:,.0f} deliveries/s, "
        f"{cpu_ms:.2f} CPU ms each (user {user * 1000 / len(keys):.2f}, "
        f"system {system * 1000 / len(keys):.2f})",
        flush=True,
    )
    if not args.no_spy:
        for child in children:
            print(summarize(out / f"{child.name}.txt"))
    return rate, cpu_ms


async def profile_all(args: argparse.Namespace, base: Settings, base_tmp: Path) -> None:
    """Every round of every loop x pool, interleaved; then the medians."""
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for _ in range(args.rounds):
        for variant in args.variants:
            for loop in args.loops:
                for pool in args.pools:
                    label = variant.partition(":")[0]
                    drained = await profile(args, base, base_tmp, loop, pool, variant)
                    results[label, loop, pool].append(drained)
    print()
    print(
        "| variant | loop | HTTP pool | deliveries/s | CPU ms per delivery (2 workers) "
        "| rounds (ms) | rounds (/s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for (label, loop, pool), rounds in results.items():
        rate = statistics.median(r for r, _ in rounds)
        cpu = statistics.median(c for _, c in rounds)
        each = ", ".join(f"{c:.2f}" for _, c in rounds)
        rates = ", ".join(f"{r:.0f}" for r, _ in rounds)
        print(f"| {label} | {loop} | {pool} | {rate:,.0f} | {cpu:.2f} | {each} | {rates} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backlog", type=int, default=6000)
    parser.add_argument("--seconds", type=int, default=20, help="py-spy duration")
    parser.add_argument("--out", type=Path, default=Path("/tmp/profile"))
    parser.add_argument("--port", type=int, default=29792, help="broker port (and port + 1)")
    parser.add_argument("--no-spy", action="store_true", help="measure only, no py-spy")
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("--gil", action="store_true", help="py-spy: GIL holder only")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--loops", nargs="+", choices=("asyncio", "uvloop"), default=["asyncio"])
    parser.add_argument("--pools", nargs="+", choices=("aiohttp", "httpcore"), default=["aiohttp"])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["current"],
        help="label or label:NAME=VALUE,... (environment of the workers), interleaved",
    )
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
