"""Blast radius (issue 31, item 4): what a dying worker costs the others.

Three ``ledger worker`` processes (default settings) drain a backlog of webhook deliveries
to the fake provider WITHOUT dedupe, three times on one broker, each on topics and a group
of their own:

* ``healthy``: nothing happens to the workers;
* ``kill``: every ``--kill-every`` seconds one of the three (in turn) is SIGKILLed and
  started again at once, as a supervisor would;
* ``rolling``: a rolling restart: every ``--roll-every`` seconds the next of the three gets
  SIGTERM, and its replacement starts when it has exited; one pass, three restarts.

Every scenario drains the same backlog (``--deliveries``: the issue's 20,000, or 6,000
with ``--quick``), so its rate compares with the healthy one's. Per scenario: delivered
per second at the receiver (between its 10th and 90th percentile first arrival), the
drain time (until every delivery settled), claims per delivery, the
UNKNOWN, "not sent" and lookup events in the log, keys the receiver accepted twice (must be
0), the longest gap between two first arrivals (a stall), and the load average.

    .venv/bin/python -m bench.blast_radius --quick
    .venv/bin/python -m bench.blast_radius --baseline-tree /work/wt-old  # and the old worker

Exits 1 if any key was accepted twice or never settled.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from bench.common import (
    ReceiverTally,
    fresh_settings,
    local_broker,
    median,
    produce_keyed,
    start_receiver,
    with_webhook_lookup,
)
from bench.e2e import requests_for, trimmed_rate, wait_owned
from clients.outcome_signing import new_pair
from config import Settings
from ledger.observe import LedgerObserver
from ledger.stack import NEWER_SETTINGS, Child, Stack, _die_with_parent, settings_env
from ledger.topics import create_topics

BROKER_PORT = 29892  # and 29893; the workers' metrics on 29894..29896
SCENARIOS = ("healthy", "kill", "rolling")
WORKERS = ("w1", "w2", "w3")
FULL = {"deliveries": 20_000}
QUICK = {"deliveries": 6000}
# Past this, a scenario stops waiting for its last deliveries (and says so).
SCENARIO_LIMIT_S = 900.0


@dataclass
class Workers:
    """The three workers of one scenario, started from ``tree`` (None: this checkout)."""

    stack: Stack
    settings: Settings
    tree: Path | None
    metrics: dict[str, int]
    children: dict[str, Child] = field(default_factory=dict)
    turn: int = 0
    actions: list[dict[str, Any]] = field(default_factory=list)

    def start(self, name: str, metrics: bool = False) -> None:
        """``ledger worker --name NAME`` (its metrics port only at the first start)."""
        args = ["-m", "ledger", "worker", "--name", name]
        if metrics:
            args += ["--metrics-port", str(self.metrics[name[-1]])]
        self.stack.logs.mkdir(parents=True, exist_ok=True)
        log = self.stack.logs / f"{self.settings.worker.group}-{name}.log"
        env = settings_env(self.settings)
        if self.tree is not None:
            for name_ in NEWER_SETTINGS:
                env.pop(name_, None)
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, *args],
                env=env,
                cwd=self.tree,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        child = Child(name, process, log)
        self.stack.children.append(child)
        self.children[name] = child

    async def fault(self, kind: str, began: float) -> None:
        """The next worker in turn: SIGKILL and restart, or SIGTERM, wait, restart."""
        name = WORKERS[self.turn % len(WORKERS)]
        self.turn += 1
        child = self.children[name]
        at = time.monotonic() - began
        child.process.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        try:
            await asyncio.to_thread(child.process.wait, 60)
        except subprocess.TimeoutExpired:
            child.process.kill()
            await asyncio.to_thread(child.process.wait, 10)
        self.stack.children.remove(child)
        took = time.monotonic() - began - at
        self.start(name)
        self.actions.append(
            {
                "at_s": round(at, 1),
                "worker": name,
                "signal": kind,
                "exit_s": round(took, 1),
                "exit_code": child.process.returncode,
            }
        )


async def scenario(
    kind: str,
    base: Settings,
    urls: dict[str, Any],
    stack: Stack,
    args: argparse.Namespace,
    n: int,
    console: Console,
    tree: Path | None,
) -> dict[str, Any]:
    """One drain of ``n`` deliveries under ``kind``'s faults, by workers run from ``tree``
    (None: this checkout); its figures."""
    signing, verify = new_pair()
    keys_ = {"signing.signing_key": signing, "signing.verify_keys": [verify], **args.set}
    settings = with_webhook_lookup(fresh_settings(base, f"blast-{kind}", keys_), urls)
    await create_topics(settings)
    port = args.broker_port + 2
    metrics = {str(i): port + i for i in range(1, 4)}
    workers = Workers(stack, settings, tree, metrics)
    for name in WORKERS:
        workers.start(name, metrics=True)
    await wait_owned(
        [workers.children[w] for w in WORKERS], settings.kafka.partitions, 120.0, metrics
    )
    batch = requests_for(urls, f"{kind}-{settings.worker.group}", n)
    keys = {k for k, _ in batch}
    load_before = os.getloadavg()
    async with LedgerObserver(settings, only=keys) as observer:
        began = time.monotonic()
        await produce_keyed(
            settings, settings.kafka.topic_deliveries, iter((k.encode(), v) for k, v in batch)
        )
        every = {"kill": args.kill_every, "rolling": args.roll_every}.get(kind)
        next_fault = began + every if every else float("inf")
        limit = began + SCENARIO_LIMIT_S
        last_line = began
        pending: asyncio.Task[None] | None = None
        while time.monotonic() < limit:
            await observer.poll(timeout_ms=500)
            if observer.settled >= n:
                break
            now = time.monotonic()
            passes = kind == "kill" or workers.turn < len(WORKERS)
            if passes and now >= next_fault and (pending is None or pending.done()):
                pending = asyncio.create_task(workers.fault(kind, began))
                next_fault = now + (every or 0.0)
            if now - last_line > 15:
                last_line = now
                console.print(
                    f"  {kind} t+{now - began:.0f}s settled {observer.settled}/{n} "
                    f"{dict(observer.by_status())}",
                    highlight=False,
                )
        if pending is not None:
            await pending
        drained_s = time.monotonic() - began
        load_after = os.getloadavg()
        counts = dict(observer.counts)
        statuses = dict(observer.by_status())
        unsettled = n - observer.settled
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        state = (await client.get(f"{urls['control']}/state")).json()
    for child in list(workers.children.values()):
        child.process.send_signal(signal.SIGTERM)
    for child in list(workers.children.values()):
        try:
            await asyncio.to_thread(child.process.wait, 40)
        except subprocess.TimeoutExpired:
            child.process.kill()
        if child in stack.children:
            stack.children.remove(child)
    return figures(
        kind,
        n,
        keys,
        state,
        counts,
        statuses,
        unsettled,
        drained_s,
        workers,
        (load_before, load_after),
    )


def figures(
    kind: str,
    n: int,
    keys: set[str],
    state: dict[str, Any],
    counts: dict[str, int],
    statuses: dict[str, int],
    unsettled: int,
    drained_s: float,
    workers: Workers,
    load: tuple[tuple[float, ...], tuple[float, ...]],
) -> dict[str, Any]:
    """The scenario's numbers from the receiver's records and the log's event counts."""
    events = {k: e for k, e in state["events"].items() if k in keys}
    arrivals = sorted(e["first_at"] for e in events.values())
    tally = ReceiverTally.of(state)
    posts = sum(1 for r in state["requests"] if r["method"] == "POST" and r["key"] in keys)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return {
        "scenario": kind,
        "deliveries": n,
        "arrived": len(arrivals),
        "delivered_per_s": trimmed_rate(arrivals) if len(arrivals) > 10 else 0.0,
        "drained_s": round(drained_s, 1),
        "claims": counts.get("delivery.claimed", 0),
        "claims_per_delivery": counts.get("delivery.claimed", 0) / n,
        "unknown_events": counts.get("delivery.unknown", 0),
        "not_sent_events": counts.get("delivery.not_sent", 0),
        "lookups": counts.get("delivery.reconciled", 0),
        "posts_per_delivery": posts / n,
        "accepted_twice": sum(1 for k in tally.twice() if k in keys),
        "unsettled": unsettled,
        "longest_gap_s": round(max(gaps), 1) if gaps else 0.0,
        "statuses": statuses,
        "faults": workers.actions,
        "load_before": [round(x, 2) for x in load[0]],
        "load_after": [round(x, 2) for x in load[1]],
    }


def markdown(summary: dict[str, Any]) -> list[str]:
    """The "Blast radius" section of BENCHMARKS.md."""
    healthy = {
        r["tree"]: r["delivered_per_s"] for r in summary["scenarios"] if r["scenario"] == "healthy"
    }
    lines = [
        "## Blast radius (issue 31, item 4)",
        "",
        f"`python -m bench.blast_radius{' --quick' if summary['quick'] else ''}`: three "
        "`ledger worker` processes with default settings drain a backlog of webhook "
        "deliveries to the fake provider without dedupe; `kill`: one worker SIGKILLed (and "
        f"restarted) every {summary['kill_every_s']:g} s; `rolling`: each worker in turn "
        f"SIGTERMed and replaced, {summary['roll_every_s']:g} s apart. Workers from "
        f"{summary['worker_tree'] or 'this checkout'}"
        + (
            f" and, alternately, the baseline {summary['baseline_tree']}"
            if summary["baseline_tree"]
            else ""
        )
        + f"; settings {json.dumps(summary['set'])}; {summary['cpus']} CPUs shared with "
        "whatever else runs (load: the 1-minute average before - after).",
        "",
        "| scenario | deliveries | delivered/s (p10-p90) | vs healthy | all settled in | "
        "claims/delivery | UNKNOWN events | not sent | lookups | accepted twice | longest gap "
        "| faults | load 1 min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["scenarios"]:
        base = healthy.get(r["tree"], 0.0)
        share = f"{r['delivered_per_s'] / base:.0%}" if base else ""
        lines.append(
            f"| {r['scenario']} ({r['tree']}) | {r['deliveries']} | "
            f"{r['delivered_per_s']:.1f} | {share} | {r['drained_s']:.0f} s | "
            f"{r['claims_per_delivery']:.2f} | {r['unknown_events']} | {r['not_sent_events']} "
            f"| {r['lookups']} | {r['accepted_twice']} | {r['longest_gap_s']:.1f} s | "
            f"{len(r['faults'])} | {r['load_before'][0]:.1f}-{r['load_after'][0]:.1f} |"
        )
    return lines


def failing(summary: dict[str, Any]) -> list[str]:
    """What must not happen: a key accepted twice, a delivery that never settled."""
    bad = []
    for r in summary["scenarios"]:
        if r["accepted_twice"]:
            bad.append(f"{r['scenario']} ({r['tree']}): {r['accepted_twice']} accepted twice")
        if r["unsettled"]:
            bad.append(f"{r['scenario']} ({r['tree']}): {r['unsettled']} not settled")
    return bad


async def run(
    args: argparse.Namespace, base: Settings, tmp: Path, console: Console
) -> dict[str, Any]:
    """Every scenario asked for, on one broker and one receiver."""
    stack = Stack(tmp / "logs")
    results: list[dict[str, Any]] = []
    try:
        urls = start_receiver(stack, base, "--no-dedupe")
        trees: list[tuple[str, Path | None]] = [("this", args.worker_tree)]
        if args.baseline_tree is not None:
            # Alternately, scenario by scenario: both see the same broker, receiver, load.
            trees.insert(0, ("baseline", args.baseline_tree))
        for kind in args.scenarios:
            n = args.deliveries
            for label, tree in trees:
                console.print(f"[bold]{kind}[/] ({label}): {n} deliveries")
                result = await scenario(kind, base, urls, stack, args, n, console, tree)
                result["tree"] = label
                console.print(json.dumps({k: v for k, v in result.items() if k != "faults"}))
                results.append(result)
    finally:
        stack.stop()
    return {
        "quick": args.quick,
        "worker_tree": str(args.worker_tree) if args.worker_tree else None,
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "kill_every_s": args.kill_every,
        "roll_every_s": args.roll_every,
        "set": args.set,
        "cpus": os.cpu_count(),
        "scenarios": results,
        "median_rate": median([r["delivered_per_s"] for r in results]),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` is run_all's smaller preset."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes {json.dumps(QUICK)}")
    parser.add_argument("--deliveries", type=int, help="the backlog of every scenario")
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds")
    parser.add_argument("--roll-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--scenarios", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument(
        "--worker-tree", type=Path, help="run the workers from this checkout (an older commit, say)"
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also run each scenario with workers from this checkout, just before",
    )
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a worker setting by dotted name: --set worker.static_membership=false",
    )
    parser.add_argument("--json", type=Path, help="write the JSON summary here (else stdout)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs)")
    args = parser.parse_args(argv)
    args.set = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    sizes = QUICK if args.quick else FULL
    args.deliveries = args.deliveries or int(sizes["deliveries"])
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print the table and the JSON; 1 if a key was accepted twice or not settled."""
    args = parse(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench-blast-"))
    try:
        with local_broker(tmp, args.broker_port) as (base, _broker):
            summary = asyncio.run(run(args, base, tmp, console))
    finally:
        if args.keep:
            console.print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    console.print("\n".join(markdown(summary)), highlight=False)
    text = json.dumps(summary, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)
    bad = failing(summary)
    if bad:
        console.print(f"[red]FAIL[/]: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
