"""Deliveries through a broker failover: a three-node cluster, the leader of the busiest
partitions SIGKILLed and restarted while deliveries flow (issue 30, item 3).

    .venv/bin/python -m bench.failover                       # 30 s before and after, 2 kills
    .venv/bin/python -m bench.failover --rate 40 --phase-s 20 --failovers 1

Starts ``ledger broker start --nodes 3``'s cluster in a temp dir (node N on
``--broker-port`` + 2(N-1) and the next port), ``--workers`` ``ledger worker`` processes,
and the fake provider WITHOUT dedupe (a double send counts as a second acceptance), all on
127.0.0.1. One publisher (group commit) publishes runs of one webhook at ``--rate`` runs/s
throughout: ``--phase-s`` before, then ``--failovers`` times: SIGKILL the broker leading
the most records of the deliveries topic, ``--down-s`` later restart it and wait until every
replica is in sync again; then ``--phase-s`` after. Per phase (before, during: from each
kill to in sync again, after): deliveries arriving per second, and publish -> arrival p50
and p99 of the runs published in it. At the end: keys accepted twice, keys never
CONFIRMED, publishes the cluster refused (retried with the same run).
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import BENCH_WEBHOOK_SECRET
from clients import DeliverySpec, Publisher
from clients.outcome_signing import new_pair
from config import Settings
from config.settings import changed
from events.delivery_state import DeliveryState, Status
from ledger.broker.cluster import LocalCluster
from ledger.broker.replicas import busiest_leader, partitions, wait_in_sync
from ledger.observe import LedgerObserver
from ledger.simulator import SimulatorConfig
from ledger.simulator.background import BackgroundSimulator
from ledger.stack import settings_env
from ledger.topics import create_topics

PORT = 29792  # node 1 29792/29793, node 2 29794/29795, node 3 29796/29797


@dataclass
class Phase:
    """One stretch of the run: [start, end) in unix seconds."""

    name: str
    start: float
    end: float = 0.0


@dataclass
class Flow:
    """What the publisher did: when each key was published, what it had to retry."""

    published_at: dict[str, float] = field(default_factory=dict)
    retried: int = 0
    refused: list[str] = field(default_factory=list)


async def publish(settings: Settings, receiver: BackgroundSimulator, args: Any, flow: Flow,
                  stop: asyncio.Event, prefix: str) -> None:  # fmt: skip
    """Runs of one webhook at ``args.rate`` per second until ``stop`` (bounded count)."""
    interval = 1.0 / args.rate
    pending: set[asyncio.Task[None]] = set()
    async with Publisher(settings, producer_name="bench-failover") as publisher:

        async def one(n: int) -> None:
            spec = DeliverySpec(
                channel="webhook", recipient=receiver.webhook_url(f"{prefix}{n}"), payload={"n": n}
            )
            at = time.time()
            for attempt in range(10):
                try:
                    requests = await publisher.run_succeeded(f"{prefix}-{n}", "sha256:r", [spec])
                    for request in requests:
                        flow.published_at[request.idempotency_key] = at
                    return
                except Exception as exc:  # counted, retried with the same run
                    flow.retried += 1
                    if attempt == 9:
                        flow.refused.append(f"{prefix}-{n}: {type(exc).__name__}: {exc}")
                    await asyncio.sleep(1.0)

        began = time.monotonic()
        for n in range(args.max_runs):
            if stop.is_set():
                break
            task = asyncio.create_task(one(n))
            pending.add(task)
            task.add_done_callback(pending.discard)
            # Paced from the start, so a stall is followed by a catch-up, as agents would.
            await asyncio.sleep(max(0.0, began + (n + 1) * interval - time.monotonic()))
        await asyncio.gather(*pending)


async def settle(settings: Settings, keys: set[str], timeout_s: float) -> dict[str, DeliveryState]:
    """Wait (bounded) until every key is CONFIRMED; the states folded so far (the ledger's
    own observer, read_committed, folding as the records arrive)."""
    deadline = time.monotonic() + timeout_s
    async with LedgerObserver(settings, only=set(keys)) as observer:
        while time.monotonic() < deadline:
            await observer.poll(timeout_ms=500)
            states = observer.states
            if all(k in states and states[k].status is Status.CONFIRMED for k in keys):
                break
        return dict(observer.states)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0 for none)."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def phase_figures(
    phases: list[Phase], published: dict[str, float], arrived: dict[str, float]
) -> list[dict[str, Any]]:
    """Per phase name: seconds, deliveries arriving per second, p50/p99 publish -> arrival
    (ms) of the runs published in it."""
    out = []
    for name in ("before", "during", "after"):
        mine = [p for p in phases if p.name == name]
        seconds = sum(p.end - p.start for p in mine)
        arrivals = sum(1 for t in arrived.values() if any(p.start <= t < p.end for p in mine))
        latencies = [
            (arrived[k] - t) * 1000
            for k, t in published.items()
            if k in arrived and any(p.start <= t < p.end for p in mine)
        ]
        out.append(
            {
                "phase": name,
                "seconds": round(seconds, 1),
                "delivered_per_s": round(arrivals / seconds, 1) if seconds else 0.0,
                "published": len(latencies),
                "p50_ms": round(percentile(latencies, 50)),
                "p99_ms": round(percentile(latencies, 99)),
                "max_ms": round(max(latencies, default=0.0)),
            }
        )
    return out


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The whole measurement; its summary."""
    tag = uuid.uuid4().hex[:8]
    base = Settings(
        kafka={"broker_port": args.broker_port, "controller_port": args.broker_port + 1},
        channels={"allowed_networks": ["127.0.0.0/8"], "webhook_secret": BENCH_WEBHOOK_SECRET},
        worker={"group": f"bench-failover-{tag}"},
        data_dir=tmp / "data",
    )
    cluster = LocalCluster(base, 3)
    began = time.monotonic()
    await asyncio.to_thread(cluster.start)
    started_s = time.monotonic() - began
    receiver = BackgroundSimulator(
        SimulatorConfig(dedupe=False, webhook_secret=BENCH_WEBHOOK_SECRET.get_secret_value())
    ).start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        # The workers sign their outcome events (on by default) with a pair of this run's.
        signing, verify = new_pair()
        settings = changed(
            receiver.settings(base),
            {
                "kafka.bootstrap_servers": cluster.bootstrap_servers,
                "signing.signing_key": signing,
                "signing.verify_keys": [verify],
            },
        )
        await create_topics(settings)
        topic = settings.kafka.topic_deliveries
        workers += [start_worker(settings, tmp, n) for n in range(args.workers)]
        flow, stop, warmed = Flow(), asyncio.Event(), Flow()
        # Warm up: the workers own their partitions, and what was published arrived.
        warm = asyncio.create_task(publish(settings, receiver, args, warmed, stop, "warm"))
        await asyncio.sleep(5.0)
        stop.set()
        await warm
        for _ in range(1200):
            if len(receiver.requests(method="POST")) >= len(warmed.published_at):
                break
            await asyncio.sleep(0.1)
        stop = asyncio.Event()
        flowing = asyncio.create_task(publish(settings, receiver, args, flow, stop, "run"))
        phases = [Phase("before", time.time())]
        await asyncio.sleep(args.phase_s)
        kills = []
        for _ in range(args.failovers):
            node = busiest_leader(await partitions(cluster.bootstrap_servers, topic))
            victim = cluster.broker(node)
            pid = victim.pid()
            assert pid is not None
            phases[-1].end = time.time()
            phases.append(Phase("during", time.time()))
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(args.down_s)
            restart = time.monotonic()
            await asyncio.to_thread(victim.start)
            restarted_s = time.monotonic() - restart
            await wait_in_sync(cluster.bootstrap_servers, [topic], timeout_s=180.0)
            phases[-1].end = time.time()
            kills.append(
                {
                    "node": node,
                    "restart_s": round(restarted_s, 1),
                    "kill_to_in_sync_s": round(phases[-1].end - phases[-1].start, 1),
                }
            )
            phases.append(Phase("between" if len(kills) < args.failovers else "after", time.time()))
            if len(kills) < args.failovers:
                await asyncio.sleep(args.between_s)
        await asyncio.sleep(args.phase_s)
        phases[-1].end = time.time()
        stop.set()
        await flowing
        keys = set(flow.published_at)
        states = await settle(settings, keys, args.settle_s)
        arrived: dict[str, float] = {}
        twice = 0
        for key in keys:
            accepted = [
                r.at for r in receiver.requests(key=key, method="POST") if r.result == "accepted"
            ]
            if accepted:
                arrived[key] = min(accepted)
            twice += len(accepted) > 1
        not_confirmed = sum(
            1 for k in keys if k not in states or states[k].status is not Status.CONFIRMED
        )
        return {
            "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "load_average": [round(x, 1) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
            "rate": args.rate,
            "workers": args.workers,
            "partitions": settings.kafka.partitions,
            "phase_s": args.phase_s,
            "down_s": args.down_s,
            "cluster_start_s": round(started_s, 1),
            "failovers": kills,
            "phases": phase_figures(phases, flow.published_at, arrived),
            "deliveries": len(keys),
            "accepted_twice": twice,
            "not_confirmed": not_confirmed,
            "never_arrived": len(keys) - len(arrived),
            "publishes_retried": flow.retried,
            "publishes_refused": flow.refused,
            "workers_alive": sum(1 for w in workers if w.poll() is None),
            "dead_workers_said": [
                (tmp / f"worker-{n}.log").read_text(errors="replace")[-1500:]
                for n, w in enumerate(workers)
                if w.poll() is not None
            ],
        }
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        receiver.stop()
        await asyncio.to_thread(cluster.stop, 5.0)


def start_worker(settings: Settings, tmp: Path, n: int) -> subprocess.Popen[bytes]:
    """``ledger worker`` number ``n`` with ``settings``, its log in ``tmp``."""
    with open(tmp / f"worker-{n}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ledger", "worker", "--name", f"w{n}", "-l", "WARNING"],
            env=settings_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def markdown(summary: dict[str, Any]) -> list[str]:
    """The "Broker failover" section of BENCHMARKS.md."""
    kills = ", ".join(
        f"node {k['node']} (restarted in {k['restart_s']} s, in sync {k['kill_to_in_sync_s']} s "
        "after the kill)"
        for k in summary["failovers"]
    )
    lines = [
        f"## Issue 30 item 3: deliveries through a broker failover ({summary['date']})",
        "",
        f"`python -m bench.failover --rate {summary['rate']:g} --phase-s "
        f"{summary['phase_s']:g} --failovers {len(summary['failovers'])} --workers "
        f"{summary['workers']}`: a three-node cluster (`ledger broker start --nodes 3`, rf 3, "
        f"min.insync.replicas 2, {summary['partitions']} partitions; started in "
        f"{summary['cluster_start_s']} s), {summary['workers']} worker(s), the fake provider "
        f"without dedupe, one publisher at {summary['rate']:g} runs/s of one webhook. The "
        f"broker leading the most records was SIGKILLed, restarted {summary['down_s']:g} s "
        f"later and waited for until every replica was in sync: {kills}. Load average at the "
        f"end {summary['load_average']} on {summary['cpus']} cores (other sessions' work).",
        "",
        "| phase | seconds | delivered/s | runs published | publish -> arrival p50 (ms) "
        "| p99 (ms) | max (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p['phase']} | {p['seconds']} | {p['delivered_per_s']} | {p['published']} | "
        f"{p['p50_ms']:,} | {p['p99_ms']:,} | {p['max_ms']:,} |"
        for p in summary["phases"]
    ]
    lines += [
        "",
        f"{summary['deliveries']:,} deliveries: accepted twice {summary['accepted_twice']}, "
        f"not CONFIRMED at the end {summary['not_confirmed']}, never arrived "
        f"{summary['never_arrived']}; publishes retried {summary['publishes_retried']}, "
        f"refused for good {len(summary['publishes_refused'])}; workers alive at the end "
        f"{summary['workers_alive']} of {summary['workers']}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=40.0, help="runs/s")
    parser.add_argument("--phase-s", type=float, default=30.0, help="before and after")
    parser.add_argument("--failovers", type=int, default=2)
    parser.add_argument("--down-s", type=float, default=5.0, help="the killed broker stays down")
    parser.add_argument("--between-s", type=float, default=10.0, help="between failovers")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-runs", type=int, default=100_000)
    parser.add_argument("--settle-s", type=float, default=180.0)
    parser.add_argument("--broker-port", type=int, default=PORT)
    parser.add_argument("--json", type=Path, help="write the summary here too")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    try:
        summary = asyncio.run(run(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print("\n".join(markdown(summary)))


if __name__ == "__main__":
    main()
