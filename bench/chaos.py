"""A randomized nemesis run, in the spirit of Jepsen: does any delivery go out twice, get
lost, or get stuck while processes crash, pause, join, leave and the broker restarts?

Everything runs on 127.0.0.1: a fresh broker (its own ports, restarted by the nemesis),
the fake provider with dedupe OFF (a second send shows as a second acceptance) and a
seeded fault mix, N `ledger worker` processes under a supervisor, a live `ledger project`
into SQLite, and this script as the agent, the nemesis and the observer.

At the end it counts, from the receiver's own records, from the worker's fold of the log
(``events.delivery_state.apply``) and from the projection's tables:

* accepted twice: keys the receiver accepted more than once            (must be 0)
* lost: requested, never accepted, and neither FAILED nor UNKNOWN       (must be 0)
* stuck: neither terminal nor visibly UNKNOWN                           (must be 0)
* disagreements: projection status != the fold's public status         (must be 0)
* UNKNOWN (the honest answer an operator sees), requests per delivery, throughput.

    .venv/bin/python -m bench.chaos --short                  # ~3 minutes, what CI runs
    .venv/bin/python -m bench.chaos --deliveries 20000 --workers 3 --seed 1

Exits 1 if any must-be-0 count is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.common import (
    ReceiverTally,
    fanout_specs,
    fresh_settings,
    local_broker,
    start_receiver,
    stuck_keys,
    visibly_unknown,
    with_webhook_lookup,
)
from bench.nemesis import Nemesis, Supervisor
from clients import Publisher
from config import Settings
from events.delivery_state import DeliveryState, Status
from ledger.broker import LocalBroker
from ledger.observe import LedgerObserver
from ledger.stack import Stack
from ledger.topics import create_topics
from projections.backends import default_dsn

BROKER_PORT = 29392  # and 29393: apart from the suite's broker and e2e_faults'
SHORT = {"deliveries": 300, "nemesis_interval": 5.0, "duration_limit": 160.0, "rate": 6.0}
MUST_BE_ZERO = ("accepted_twice", "lost", "stuck", "disagreements")
# The receiver's faults, as shares of POSTs. "timeout" accepts, then answers after
# delay_s (past the send deadline). The optional kinds are newer simulator faults, armed
# only where the simulator knows them.
FAULT_MIX: dict[str, Any] = {"timeout": 0.06, "error_after_accept": 0.05, "reset": 0.02}
OPTIONAL_FAULTS: dict[str, Any] = {"slow_process": 0.04, "trickle": 0.03}
DELAY_S = 3.0
# The worker's timing: short, so that leases, settle windows and lookups all happen.
WORKER_TIMING: dict[str, Any] = {
    "worker.lease_s": 8.0,
    "channels.http_timeout_s": 1.0,
    "channels.send_deadline_s": 2.0,
    "worker.clock_skew_margin_s": 1.0,
    "worker.lookup_settle_s": 3.0,
    "worker.lookup_confirm_spacing_s": 1.5,
}


async def arm_faults(client: httpx.AsyncClient, control_url: str, seed: int) -> dict[str, Any]:
    """Turn the receiver's seeded fault mix on; returns the mix it accepted."""
    mix = {"seed": seed, "delay_s": DELAY_S, **FAULT_MIX, **OPTIONAL_FAULTS}
    answer = await client.post(f"{control_url}/mix", json=mix)
    if answer.status_code == 400:
        # This simulator predates the optional kinds: run with what it has.
        mix = {k: v for k, v in mix.items() if k not in OPTIONAL_FAULTS}
        answer = await client.post(f"{control_url}/mix", json=mix)
    answer.raise_for_status()
    armed: dict[str, Any] = answer.json()["mix"]
    return armed


async def publish(
    settings: Settings,
    urls: dict[str, Any],
    n: int,
    rate: float,
    published: dict[str, float],
    retries: Counter[str],
) -> None:
    """Publish runs of three deliveries (``rate`` deliveries/s, 0: as fast as it goes); a
    run whose transaction fails (the broker restarting) is published again, as an agent
    would: same keys, so at most a deduplicated repeat."""
    began = time.monotonic()
    publisher: Publisher | None = None
    transactional_id = f"chaos-agent-{uuid.uuid4().hex[:8]}"
    run = 0
    try:
        while len(published) < n:
            specs = fanout_specs(urls, run, n - len(published))
            while True:
                try:
                    if publisher is None:
                        publisher = Publisher(
                            settings, producer_name="chaos-agent", transactional_id=transactional_id
                        )
                        await asyncio.wait_for(publisher.start(), 30)
                    requests = await asyncio.wait_for(
                        publisher.run_succeeded(f"chaos-{run}", "h", specs), 30
                    )
                    break
                except (KafkaError, TimeoutError, OSError):
                    retries["publish"] += 1
                    await _discard(publisher)
                    publisher = None
                    await asyncio.sleep(1.0)
            now = time.time()
            for request in requests:
                published[request.idempotency_key] = now
            run += 1
            if rate:
                await asyncio.sleep(max(0.0, began + len(published) / rate - time.monotonic()))
    finally:
        await _discard(publisher)


async def _discard(publisher: Publisher | None) -> None:
    if publisher is not None:
        with contextlib.suppress(KafkaError, TimeoutError, OSError):
            await asyncio.wait_for(publisher.stop(), 10)


def projection_statuses(settings: Settings) -> dict[str, str] | None:
    """Status per key in the live projection's SQLite file (None before it exists)."""
    path = Path(default_dsn(settings).removeprefix("sqlite://"))
    if not path.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return dict(db.execute("SELECT idempotency_key, status FROM deliveries").fetchall())
    except sqlite3.OperationalError:
        return None  # not created yet, or locked for longer than the default timeout


def disagreements(
    keys: set[str], states: dict[str, DeliveryState], projected: dict[str, str] | None
) -> list[str]:
    """Keys whose projected status differs from the worker fold's public status."""
    projected = projected or {}
    return [
        k for k in keys if projected.get(k) != (states[k].status.public if k in states else None)
    ]


async def nemesis_loop(
    nemesis: Nemesis, interval_s: float, until: float, stop: asyncio.Event, say: Any
) -> None:
    """One action every ``interval_s`` until ``until`` (monotonic) or ``stop``; an action
    is never cut short (a half-done broker restart would leave no broker)."""
    while time.monotonic() + interval_s < until:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        if stop.is_set():
            return
        action = await nemesis.act()
        say(
            f"[yellow]nemesis[/] t+{action.at_s:.0f}s {action.action} {action.target} "
            f"({action.detail}; {action.took_s:.1f}s)"
        )


async def drive(
    args: argparse.Namespace, settings: Settings, nemesis: Nemesis, urls: dict[str, Any]
) -> dict[str, Any]:
    """Publish, unleash the nemesis, watch until everything settled (or the limit)."""
    supervisor = nemesis.supervisor
    began = time.monotonic()
    limit = began + args.duration_limit
    published: dict[str, float] = {}
    retries: Counter[str] = Counter()
    quiet_s = settings.worker.lookup_settle_s + 4 * settings.worker.lookup_confirm_spacing_s + 5
    done = False
    async with LedgerObserver(settings) as observer:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
        ) as progress:
            say = progress.console.print
            task = progress.add_task("settled", total=args.deliveries, info="")
            await asyncio.sleep(8)  # let the workers join before the load starts
            publisher = asyncio.create_task(
                publish(settings, urls, args.deliveries, args.rate, published, retries)
            )
            # The nemesis stops with time left for the system to heal and settle.
            stop = asyncio.Event()
            chaos = asyncio.create_task(
                nemesis_loop(
                    nemesis, args.nemesis_interval, began + args.duration_limit * 0.6, stop, say
                )
            )
            last_read, last_check, last_line = time.monotonic(), 0.0, 0.0
            while time.monotonic() < limit:
                if await observer.poll(timeout_ms=500):
                    last_read = time.monotonic()
                for name in supervisor.revive():
                    say(f"[red]supervisor[/] {name} had exited; restarted")
                states = observer.states
                unknown = sum(1 for s in states.values() if s.status is Status.UNKNOWN)
                info = (
                    f"published {len(published)} · UNKNOWN {unknown} · workers "
                    f"{len(supervisor.workers())} · nemesis {len(nemesis.log)}"
                )
                progress.update(task, completed=observer.settled, info=info)
                if not progress.console.is_terminal and time.monotonic() - last_line > 15:
                    # No live bar in a log file (CI): a line now and then instead.
                    last_line = time.monotonic()
                    say(f"t+{last_line - began:.0f}s settled {observer.settled} · {info}")
                if publisher.done() and publisher.exception() is not None:
                    raise RuntimeError("publishing failed") from publisher.exception()
                if time.monotonic() - last_check < 2 or not publisher.done():
                    continue
                if len(nemesis.log) < args.min_actions and not chaos.done():
                    continue  # settled already: the nemesis has kinds of fault left to show
                last_check = time.monotonic()
                keys = set(published)
                if stuck_keys(keys, states):
                    continue
                settled = all(states[k].status.terminal for k in keys)
                if not settled and time.monotonic() - last_read < quiet_s:
                    continue  # UNKNOWNs may still be reconciled: wait for a quiet log
                if not disagreements(keys, states, projection_statuses(settings)):
                    done = True
                    break
            if not chaos.done():
                say("stopping the nemesis after its current action")
            stop.set()
            await chaos
            nemesis.heal()
            # Quiesce, then read: with the workers stopped the log stops growing, so the
            # fold is final and the projector can catch up with it (its lag is no finding).
            killed = await supervisor.stop_workers()
            if killed:
                say(f"[red]workers that ignored SIGTERM for 30 s[/]: {killed}")
            while await observer.poll(timeout_ms=2000):
                pass
            keys = set(published)
            for _ in range(60):
                if not disagreements(keys, observer.states, projection_statuses(settings)):
                    break
                await asyncio.sleep(1)
    return {
        "done": done,
        "elapsed_s": time.monotonic() - began,
        "published": published,
        "states": dict(observer.states),
        "settled_at": dict(observer.settled_at),
        "went_unknown": len(observer.went_unknown),
        "publish_retries": retries["publish"],
    }


def measure(
    run: dict[str, Any], sim: dict[str, Any], projected: dict[str, str] | None
) -> dict[str, Any]:
    """The figures, from the receiver's records, the worker fold and the projection."""
    published: dict[str, float] = run["published"]
    states: dict[str, DeliveryState] = run["states"]
    keys = set(published)
    n = len(keys)
    tally = ReceiverTally.of(sim)
    twice = [k for k in tally.twice() if k in keys]
    lost = [
        k
        for k in keys
        if not tally.accepted.get(k)
        and not (k in states and states[k].status in (Status.FAILED, Status.UNKNOWN))
    ]
    stuck = stuck_keys(keys, states)
    disagree = disagreements(keys, states, projected)
    by_status = Counter(states[k].status.public for k in keys if k in states)
    failed_but_accepted = [
        k
        for k in keys
        if k in states and states[k].status is Status.FAILED and tally.accepted.get(k)
    ]
    settled = [run["settled_at"][k] for k in keys if k in run["settled_at"]]
    span = (max(settled) - min(published.values())) if settled else 0.0
    return {
        "deliveries": n,
        "accepted_twice": len(twice),
        "lost": len(lost),
        "stuck": len(stuck),
        "disagreements": len(disagree),
        "unknown": by_status.get("UNKNOWN", 0),
        "unknown_without_reason": sum(
            1
            for k in keys
            if k in states and states[k].status is Status.UNKNOWN and not visibly_unknown(states[k])
        ),
        # Why the UNKNOWNs are UNKNOWN (error class / last lookup answer), for the operator.
        "unknown_why": dict(
            Counter(
                f"{states[k].last_error_class}/{states[k].reconciled}/lookups={states[k].lookups}"
                for k in keys
                if k in states and states[k].status is Status.UNKNOWN
            )
        ),
        "by_status": dict(by_status),
        "failed_but_accepted": len(failed_but_accepted),
        "went_unknown": run["went_unknown"],
        "posts": tally.posts,
        "requests_per_delivery": tally.posts / n if n else 0.0,
        "deliveries_per_s": len(settled) / span if span else 0.0,
        "projection_rows": len(projected or {}),
        "stuck_by_status": dict(
            Counter(states[k].status.value if k in states else "never seen" for k in stuck)
        ),
        "disagreements_by_pair": dict(
            Counter(
                f"{(projected or {}).get(k)} vs {states[k].status.public if k in states else None}"
                for k in disagree
            )
        ),
        "stuck_examples": [_brief(states.get(k)) for k in stuck[:3]],
        "examples": {
            "accepted_twice": twice[:5],
            "lost": lost[:5],
            "stuck": stuck[:5],
            "disagreements": disagree[:5],
        },
    }


def _brief(state: DeliveryState | None) -> dict[str, Any] | None:
    """Where a stuck delivery stands, for whoever digs into it."""
    if state is None:
        return None
    fields = ("idempotency_key", "channel", "status", "attempt", "fencing_token")
    more = ("claim_worker", "lease_expires_at", "retry_at", "last_reason", "reconciled")
    return {name: str(getattr(state, name)) for name in (*fields, *more)}


def failing(summary: dict[str, Any]) -> list[str]:
    """The must-be-zero counts that are not."""
    return [f"{name}={summary[name]}" for name in MUST_BE_ZERO if summary[name]]


def table(summary: dict[str, Any]) -> Table:
    """The human version of the summary."""
    out = Table(title=f"chaos: seed {summary['seed']}, {summary['workers']} workers")
    out.add_column("measure")
    out.add_column("value", justify="right")
    for name in MUST_BE_ZERO:
        value = summary[name]
        out.add_row(f"{name} (must be 0)", f"[{'red' if value else 'green'}]{value}[/]")
    out.add_row("stuck, by fold status", json.dumps(summary["stuck_by_status"]))
    out.add_row("disagreements (projection vs fold)", json.dumps(summary["disagreements_by_pair"]))
    out.add_row("UNKNOWN at the end (visible to an operator)", str(summary["unknown"]))
    out.add_row("final statuses", json.dumps(summary["by_status"]))
    out.add_row("FAILED though the receiver accepted it", str(summary["failed_but_accepted"]))
    out.add_row("went through UNKNOWN", str(summary["went_unknown"]))
    out.add_row("requests (POST) per delivery", f"{summary['requests_per_delivery']:.3f}")
    out.add_row(
        "deliveries/s (first publish -> last settled)", f"{summary['deliveries_per_s']:.1f}"
    )
    out.add_row("nemesis actions", json.dumps(summary["nemesis"]))
    out.add_row("supervisor restarts", json.dumps(summary["supervisor_restarts"]))
    out.add_row("publish retries (broker down)", str(summary["publish_retries"]))
    out.add_row("receiver faults", json.dumps(summary["faults"]))
    out.add_row("end condition reached", f"{summary['done']} in {summary['elapsed_s']:.0f}s")
    return out


def markdown(summary: dict[str, Any]) -> list[str]:
    """The "Chaos (nemesis)" section of BENCHMARKS.md."""
    lines = [
        "## Chaos (nemesis)",
        "",
        f"`python -m bench.chaos --deliveries {summary['deliveries']} --workers "
        f"{summary['workers']} --seed {summary['seed']} --nemesis-interval "
        f"{summary['nemesis_interval_s']:g}`: a non-deduping receiver with faults "
        f"{json.dumps(summary['faults'])}, and a nemesis every "
        f"{summary['nemesis_interval_s']:g} s: {json.dumps(summary['nemesis'])}. "
        f"End condition {'reached' if summary['done'] else '**not reached**'} in "
        f"{summary['elapsed_s']:.0f} s.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
    ]
    lines += [f"| {name.replace('_', ' ')} | {summary[name]} | 0 |" for name in MUST_BE_ZERO]
    lines += [
        f"| UNKNOWN at the end (visible) | {summary['unknown']} | |",
        f"| final statuses | {json.dumps(summary['by_status'])} | |",
        f"| requests (POST) per delivery | {summary['requests_per_delivery']:.3f} | |",
        f"| deliveries/s end to end | {summary['deliveries_per_s']:.1f} | |",
        f"| supervisor restarts | {json.dumps(summary['supervisor_restarts'])} | |",
    ]
    return lines


async def run(
    args: argparse.Namespace, base: Settings, broker: LocalBroker, tmp: Path, console: Console
) -> dict[str, Any]:
    """Start everything on ``broker``, drive the run, stop everything; the summary."""
    settings = fresh_settings(base, "chaos", WORKER_TIMING)
    await create_topics(settings)
    stack = Stack(tmp / "logs")
    supervisor = Supervisor(stack, settings)
    try:
        urls = start_receiver(stack, settings, "--no-dedupe", "--delivered-after", "0.2")
        async with httpx.AsyncClient(timeout=120) as client:
            faults = await arm_faults(client, urls["control"], args.seed)
        supervisor.settings = settings = with_webhook_lookup(settings, urls)
        for _ in range(args.workers):
            supervisor.start_worker()
        supervisor.start_projector()
        nemesis = Nemesis(
            random.Random(args.seed),  # a fault schedule, not security
            supervisor,
            broker,
            args.workers,
            pause_s=settings.worker.lease_s + 2,
        )
        console.print(
            f"[bold]chaos[/] broker {settings.kafka.bootstrap_servers}, logs {stack.logs}"
        )
        outcome = await drive(args, settings, nemesis, urls)
        async with httpx.AsyncClient(timeout=120) as client:
            sim = (await client.get(f"{urls['control']}/state")).json()
        summary = measure(outcome, sim, projection_statuses(settings))
    finally:
        supervisor.resume_all()  # a stopped process would not see SIGTERM
        killed = stack.stop()
        if killed:
            console.print(f"had to SIGKILL on shutdown: {killed}")
    return {
        **summary,
        "seed": args.seed,
        "workers": args.workers,
        "nemesis_interval_s": args.nemesis_interval,
        "duration_limit_s": args.duration_limit,
        "done": outcome["done"],
        "elapsed_s": outcome["elapsed_s"],
        "publish_retries": outcome["publish_retries"],
        "faults": {
            k: v for k, v in faults.items() if isinstance(v, float) and v and k != "delay_s"
        },
        "nemesis": nemesis.counts(),
        "nemesis_log": nemesis.records(),
        "supervisor_restarts": dict(supervisor.restarts),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--short`` is the CI preset."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nemesis-interval", type=float, default=10.0, help="seconds")
    parser.add_argument("--duration-limit", type=float, default=3600.0, help="seconds")
    parser.add_argument("--rate", type=float, default=0.0, help="deliveries/s (0: all at once)")
    parser.add_argument("--min-actions", type=int, default=0,
                        help="not done before the nemesis made this many actions (while it "
                        "may still act), however fast the run settles")  # fmt: skip
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT)
    parser.add_argument("--json", type=Path, help="write the JSON summary here (else stdout)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    parser.add_argument("--short", action="store_true", help=f"the CI preset: {json.dumps(SHORT)}")
    args = parser.parse_args(argv)
    if args.short:
        for name, value in SHORT.items():
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, print the table and the JSON summary; 1 if a must-be-zero count is not zero."""
    args = parse(argv)
    # The broker restarts on purpose: our own clients' reconnect chatter is noise here.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so the broker and the children are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    try:
        # The broker's start and stop block (and run their own event loops): outside ours.
        with local_broker(tmp, args.broker_port) as (base, broker):
            summary = asyncio.run(run(args, base, broker, tmp, console))
    finally:
        if args.keep:
            console.print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    console.print(table(summary))
    for action in summary["nemesis_log"]:
        console.print(
            f"  t+{action['at_s']:6.1f}s {action['action']:<15} {action['target']:<8} "
            f"{action['detail']}",
            highlight=False,
        )
    text = json.dumps(summary, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)
    bad = failing(summary)
    if bad:
        console.print(f"[red]FAIL[/]: {', '.join(bad)}")
        return 1
    console.print("[green]OK[/]: nothing accepted twice, lost, stuck or disagreeing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
