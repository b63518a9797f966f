"""The peer benchmark: the shape the Svix comparison of issue 12 measured, on our stack.

N runs of one webhook delivery each, published by P concurrent publishers (P
``events.Publisher`` instances, one transactional id each, like P agents, each in its own
asyncio task of this process), delivered to a signature-verifying receiver in its own
process (``bench/verifying_receiver.py``: ``ThreadingHTTPServer``, backlog 128,
``standardwebhooks`` verification, per-key arrival times, no dedupe). Two systems over the
same broker and the same receiver, in the same run:

* ``worker``: two ``ledger worker`` processes in one group (as bench/e2e.py);
* ``bare``: two ``bench/bare_loop.py`` processes in one group (the same work, no guarantees).

Figures per round: accepted runs/s (first publish call to last commit), delivered/s at
the receiver between the 10th and 90th percentile arrival, publish-to-arrival latency (from
the moment ``run_succeeded`` is called to the receiver's clock at arrival), CPU ms per
delivery of every process (workers, the broker's JVM, the receiver, this publishing
process) from /proc/PID/stat over the round, and the workers' resident memory. Then the
same at half of the system's own peak (publishing paced), and the receiver alone under a
load generator (bench/receiver_load.py): the machine's ceiling.

With ``--independent`` (issue 31, item 1): no bare loop and no receiver alone, but our
workers twice on the same broker and receiver, the P agents publishing in each of the
publisher's modes: ``transaction`` (a Kafka transaction per run: each agent publishes one
run at a time, so group commit has nothing to batch) and ``record`` (one record per run,
no transaction, fanned out by the workers). The machine's load average is noted beside.

    python -m bench.peer [--quick] [--runs 3000] [--publishers 8] [--rounds 2] [--independent]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench import e2e, http_agents, receiver_load
from bench.common import (
    BENCH_WEBHOOK_SECRET,
    bench_broker,
    cpu_seconds,
    fresh_settings,
    median,
    rss_mb,
    start_python,
    stop_child,
)
from bench.http_agents import HttpAgents
from clients import DeliverySpec, Publisher
from config import Settings
from config.settings import WebhookEndpoint, changed
from ledger.broker import LocalBroker
from ledger.stack import Child, Stack, settings_env
from ledger.topics import create_topics

BROKER_PORT = 29592  # this benchmark's own when run alone (run_all passes its broker)
RECEIVER_PORT = 18592
METRICS_PORT = 18595  # and the next free one: the two workers' metrics
SECRET_ENV = "BENCH_PEER_SECRET"
HOOKS = 8
SETTLE_S = 1.0  # after the last arrival, so the outcome events' CPU is counted too
GROUPS = ("workers", "broker", "receiver", "publisher")
Row = Callable[..., None]


@dataclass(frozen=True)
class Shape:
    """How much: runs per round, concurrent publishers, rounds, paced seconds, load."""

    runs: int = 3000
    publishers: int = 8
    rounds: int = 2
    paced_s: float = 20.0
    load_requests: int = 10_000
    load_connections: int = 64


FULL = Shape()
QUICK = Shape(runs=300, rounds=2, paced_s=6.0, load_requests=2000)


def free_port(preferred: int, tries: int = 20) -> int:
    """``preferred`` or one of the next ports that nothing listens on (outside the
    ephemeral range, unlike port 0)."""
    for port in range(preferred, preferred + tries):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {preferred}-{preferred + tries - 1}")


@dataclass
class ArrivalReader:
    """What the receiver recorded, fetched incrementally: first arrival and count per key."""

    base: str
    client: httpx.AsyncClient
    first: dict[str, float] = field(default_factory=dict)
    count: Counter[str] = field(default_factory=Counter)
    total: int = 0

    async def refresh(self) -> None:
        """Fetch the arrivals recorded since the last refresh."""
        answer = await self.client.get(f"{self.base}/_arrivals", params={"since": self.total})
        answer.raise_for_status()
        new = answer.json()["arrivals"]
        for key, at in new:
            self.first.setdefault(key, at)
            self.count[key] += 1
        self.total += len(new)

    async def wait(
        self, keys: list[str], timeout_s: float, progress: Progress | None, label: str
    ) -> None:
        """Until every key arrived (TimeoutError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        task = progress.add_task(label, total=len(keys)) if progress else None
        try:
            while True:
                await self.refresh()
                done = sum(1 for k in keys if k in self.first)
                if progress is not None and task is not None:
                    progress.update(task, completed=done)
                if done == len(keys):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{label}: {len(keys) - done} of {len(keys)} never arrived")
                await asyncio.sleep(0.25)
        finally:
            if progress is not None and task is not None:
                progress.remove_task(task)


def start_receiver(stack: Stack, port: int, secret: str) -> Child:
    """The verifying receiver in its own process, verifying with ``secret``."""
    env = {**os.environ, SECRET_ENV: secret}
    args = ["-m", "bench.verifying_receiver", "--port", str(port), "--secret-env", SECRET_ENV]
    return start_python(stack, "verifying-receiver", args, env)


async def wait_listening(child: Child, base: str, timeout_s: float = 30.0) -> None:
    """Until the receiver answers its stats."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(trust_env=False) as client:
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited: see {child.log}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{base}/_stats")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{child.name} did not listen on {base} in {timeout_s:.0f}s")


# Worker counters that explain a slow or uneven round (summed over labels and workers).
WORKER_COUNTERS = (
    "ledger_worker_sends_total",
    "ledger_worker_timer_events_total",
    "ledger_worker_refused_sends_total",
    "ledger_worker_skipped_records_recovered_total",
    "ledger_worker_lookups_total",
    # States the fold put, and those written to the table's changelog (write-back).
    "ledger_worker_state_puts",
    "ledger_worker_state_writes",
)


async def worker_counters(client: httpx.AsyncClient, ports: dict[str, int]) -> dict[str, float]:
    """``WORKER_COUNTERS`` from the workers' /metrics, summed (a worker that does not
    answer counts nothing: these are diagnostics, not figures)."""
    totals = dict.fromkeys(WORKER_COUNTERS, 0.0)
    for port in ports.values():
        try:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def cpu_by_group(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far, per group of processes."""
    return {group: sum(cpu_seconds(pid) for pid in ids) for group, ids in pids.items()}


async def publish(
    publishers: list[Publisher],
    base: str,
    runs: int,
    rate: float | None,
    progress: Progress | None,
    label: str,
) -> tuple[dict[str, float], float]:
    """``runs`` runs of one webhook each, publisher ``j`` publishing run ``i`` when
    ``i % P == j`` (at ``began + i / rate`` if paced); {key: time of the call}, accepted/s."""
    tag = uuid.uuid4().hex[:8]
    called: dict[str, float] = {}
    task = progress.add_task(label, total=runs) if progress else None
    began = time.monotonic()

    async def agent(j: int, publisher: Publisher) -> None:
        for i in range(j, runs, len(publishers)):
            if rate is not None:
                delay = began + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            spec = DeliverySpec(
                channel="webhook",
                recipient=f"{base}/hooks/p{i % HOOKS}",
                payload={"run": i, "text": "report ready"},
            )
            at = time.time()
            requests = await publisher.run_succeeded(f"peer-{tag}-{i}", "h", [spec])
            called[requests[0].idempotency_key] = at
            if progress is not None and task is not None:
                progress.advance(task)

    try:
        async with asyncio.timeout(max(120.0, runs / 10)), asyncio.TaskGroup() as group:
            for j, publisher in enumerate(publishers):
                group.create_task(agent(j, publisher))
    finally:
        if progress is not None and task is not None:
            progress.remove_task(task)
    return called, runs / (time.monotonic() - began)


def trimmed_rate(times: list[float]) -> float:
    """Arrivals per second between the 10th and the 90th percentile arrival."""
    times = sorted(times)
    lo, hi = int(len(times) * 0.1), int(len(times) * 0.9) - 1
    return (hi - lo) / (times[hi] - times[lo]) if times[hi] > times[lo] else 0.0


# Publishes ``runs`` runs (paced at ``rate`` if given): {key: time of the call}, accepted/s.
Publish = Callable[
    [str, int, float | None, Progress | None, str], Awaitable[tuple[dict[str, float], float]]
]


def sdk_agents(publishers: list[Publisher]) -> Publish:
    """``publish`` over these SDK publishers."""

    async def over(
        base: str, runs: int, rate: float | None, progress: Progress | None, label: str
    ) -> tuple[dict[str, float], float]:
        return await publish(publishers, base, runs, rate, progress, label)

    return over


async def shape_round(
    publishing: Publish,
    base: str,
    reader: ArrivalReader,
    pids: dict[str, list[int]],
    runs: int,
    rate: float | None,
    progress: Progress | None,
    label: str,
) -> dict[str, Any]:
    """One round: publish, wait for every arrival, and the figures of the round."""
    before, began_at = cpu_by_group(pids), time.time()
    called, accepted = await publishing(base, runs, rate, progress, label + " publish")
    keys = list(called)
    await reader.wait(keys, max(60.0, runs / 20), progress, label + " arrivals")
    await asyncio.sleep(SETTLE_S)
    used = cpu_by_group(pids)
    latencies = [reader.first[k] - called[k] for k in keys]
    q = statistics.quantiles(latencies, n=100)
    return {
        "began_at": began_at,
        "runs": runs,
        "offered_per_s": rate,
        "accepted_per_s": accepted,
        "delivered_per_s": trimmed_rate([reader.first[k] for k in keys]),
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "cpu_ms_per_delivery": {g: (used[g] - before[g]) * 1000 / runs for g in GROUPS},
        "latency_deciles_ms": [x * 1000 for x in statistics.quantiles(latencies, n=10)],
        "keys": keys,
    }


async def measure_system(
    kind: str,
    base_settings: Settings,
    base: str,
    stack: Stack,
    pids: dict[str, list[int]],
    shape: Shape,
    progress: Progress | None,
    *,
    publishing: str = "transaction",
    fractions_too: bool = True,
) -> dict[str, Any]:
    """Peak rounds, then paced rounds at half the median delivered/s, of one system, its
    agents publishing in the publisher's mode ``publishing``, or over HTTP (``http``: 32
    connections to one ``ledger api``, bench/http_agents.py; the API's CPU counts as the
    publishing processes')."""
    settings = fresh_settings(base_settings, f"peer-{kind}-{publishing}")
    if publishing != "http":
        settings = changed(settings, {"publisher.mode": publishing})
    await create_topics(settings)
    ports: dict[str, int] = {}
    if kind == "worker":
        ports["1"] = free_port(METRICS_PORT)
        ports["2"] = free_port(ports["1"] + 1)
        children = [e2e.start_worker(stack, settings, f"{kind}-{i}", ports) for i in (1, 2)]
    else:
        env = settings_env(settings)
        args = ["-m", "bench.bare_loop", "--bootstrap", settings.kafka.bootstrap_servers]
        args += ["--topic", settings.kafka.topic_deliveries, "--group", settings.worker.group]
        args += ["--concurrency", str(settings.channels.send_concurrency)]
        children = [start_python(stack, f"{kind}-{i}", args, env) for i in (1, 2)]
    pids = {**pids, "workers": [c.process.pid for c in children]}
    try:
        if kind == "worker":
            await e2e.wait_owned(children, settings.kafka.partitions, ports=ports)
        async with (
            httpx.AsyncClient(trust_env=False, timeout=30) as client,
            contextlib.AsyncExitStack() as publishers_open,
        ):
            if publishing == "http":
                agents = await HttpAgents.start(settings, Path(stack.logs), http_agents.CLIENTS)
                publishers_open.callback(agents.stop)
                pids = {**pids, "publisher": [*pids["publisher"], agents.pid]}
                publishing_by: Publish = agents.publish
            else:
                publishing_by = sdk_agents(
                    [
                        await publishers_open.enter_async_context(
                            Publisher(settings, producer_name=f"peer-agent-{j}")
                        )
                        for j in range(shape.publishers)
                    ]
                )
            reader = ArrivalReader(base, client)
            # Warm-up: group joined, connections open, code paths hot (bare loops have no
            # readiness signal: their first arrivals are it).
            warm = min(200, shape.runs)
            await shape_round(
                publishing_by, base, reader, pids, warm, None, progress, f"{kind} warm"
            )
            await asyncio.sleep(2)
            peaks = [
                await shape_round(
                    publishing_by, base, reader, pids, shape.runs, None, progress,
                    f"{kind} peak {r + 1}/{shape.rounds}",
                )
                for r in range(shape.rounds)
            ]  # fmt: skip
            half = median([p["delivered_per_s"] for p in peaks]) / 2
            paced_runs = max(50, min(shape.runs, int(half * shape.paced_s)))
            paced = [
                await shape_round(
                    publishing_by, base, reader, pids, paced_runs, half, progress,
                    f"{kind} paced {r + 1}/{shape.rounds} @ {half:.0f}/s",
                )
                for r in range(shape.rounds)
            ]  # fmt: skip
            # Part 5 of issue 12: latency at a quarter and at 90% of the own peak too.
            fractions = {}
            for fraction in (0.25, 0.9) if fractions_too else ():
                rate = 2 * half * fraction
                runs = max(50, min(shape.runs, int(rate * shape.paced_s)))
                fractions[f"{fraction:g}"] = await shape_round(
                    publishing_by, base, reader, pids, runs, rate, progress,
                    f"{kind} paced @ {fraction:.0%} of peak ({rate:.0f}/s)",
                )  # fmt: skip
            rss = {
                "rss_mb": [rss_mb(pid) for pid in pids["workers"]],
                "hwm_mb": [rss_mb(pid, "VmHWM") for pid in pids["workers"]],
            }
            await asyncio.sleep(SETTLE_S)
            await reader.refresh()
            counters = await worker_counters(client, ports) if ports else {}
            measured = [k for r in peaks + paced + list(fractions.values()) for k in r.pop("keys")]
            twice = sum(1 for k in measured if reader.count[k] > 1)
            once = sum(1 for k in measured if reader.count[k] == 1)
    finally:
        for child in children:
            stop_child(stack, child)
    return {
        "peak": peaks,
        "paced": paced,
        "half_peak_per_s": half,
        "fractions": fractions,
        "keys": len(measured),
        "exactly_once": once,
        "twice": twice,
        "worker_counters": counters,
        **rss,
    }


async def measure(
    settings: Settings,
    stack: Stack,
    shape: Shape,
    progress: Progress | None = None,
    fractions: bool = True,
) -> dict[str, Any]:
    """The receiver alone, then the bare loop, then our workers, on one receiver."""
    broker_pid = LocalBroker(settings).pid()
    if broker_pid is None:
        raise RuntimeError(f"no local broker of ours runs at {settings.kafka.bootstrap_servers}")
    secret = (settings.channels.webhook_secret or BENCH_WEBHOOK_SECRET).get_secret_value()
    port = free_port(RECEIVER_PORT)
    base = f"http://127.0.0.1:{port}"
    receiver = start_receiver(stack, port, secret)
    try:
        await wait_listening(receiver, base)
        task = progress.add_task("receiver alone", total=shape.rounds) if progress else None
        alone = []
        for _ in range(shape.rounds):
            alone.append(
                await receiver_load.load_round(
                    base,
                    receiver.process.pid,
                    secret,
                    shape.load_requests,
                    shape.load_connections,
                )
            )
            if progress is not None and task is not None:
                progress.advance(task)
        if progress is not None and task is not None:
            progress.remove_task(task)
        configured = _pointed(settings, base, secret)
        pids = {"broker": [broker_pid], "receiver": [receiver.process.pid]}
        pids["publisher"] = [os.getpid()]
        systems = {
            kind: await measure_system(
                kind, configured, base, stack, pids, shape, progress, fractions_too=fractions
            )
            for kind in ("bare", "worker")
        }
        async with httpx.AsyncClient(trust_env=False) as client:
            stats = (await client.get(f"{base}/_stats")).json()
    finally:
        stop_child(stack, receiver)
    return {
        "shape": shape.__dict__,
        "receiver_alone": alone,
        "receiver_rejected": stats["rejected"],
        "receiver_lookups": stats["lookups"],
        **systems,
    }


def _pointed(settings: Settings, base: str, secret: str) -> Settings:
    """``settings`` with the workers pointed at the receiver at ``base``: they sign with the
    endpoint's secret, the receiver verifies with the same."""
    endpoint = WebhookEndpoint(secret=secret, lookup_url=f"{base}/lookup")
    return changed(
        settings,
        {
            "channels.webhook_secret": settings.channels.webhook_secret or BENCH_WEBHOOK_SECRET,
            "channels.webhook_endpoints": {
                **settings.channels.webhook_endpoints,
                f"{base}/hooks/": endpoint,
            },
            "channels.allowed_networks": sorted(
                {*settings.channels.allowed_networks, "127.0.0.0/8"}
            ),
        },
    )


MODES = ("transaction", "record", "http")  # the SDK's two modes, then 32 HTTP clients


async def measure_independent(
    settings: Settings,
    stack: Stack,
    shape: Shape,
    progress: Progress | None = None,
    modes: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    """Our workers with independent agents publishing in each of the publisher's modes, on
    one broker and one receiver, one mode after the other; the load average beside."""
    broker_pid = LocalBroker(settings).pid()
    if broker_pid is None:
        raise RuntimeError(f"no local broker of ours runs at {settings.kafka.bootstrap_servers}")
    secret = (settings.channels.webhook_secret or BENCH_WEBHOOK_SECRET).get_secret_value()
    port = free_port(RECEIVER_PORT)
    base = f"http://127.0.0.1:{port}"
    receiver = start_receiver(stack, port, secret)
    loadavg = [os.getloadavg()]
    try:
        await wait_listening(receiver, base)
        configured = _pointed(settings, base, secret)
        pids = {"broker": [broker_pid], "receiver": [receiver.process.pid]}
        pids["publisher"] = [os.getpid()]
        systems = {}
        for mode in modes:
            systems[mode] = await measure_system(
                "worker", configured, base, stack, pids, shape, progress,
                publishing=mode, fractions_too=False,
            )  # fmt: skip
            loadavg.append(os.getloadavg())
    finally:
        stop_child(stack, receiver)
    return {"shape": shape.__dict__, "independent": True, "loadavg": loadavg, **systems}


def _record_rows(rec: dict[str, Any], tx: dict[str, Any], shape: dict[str, Any], row: Row) -> None:
    """The record mode (value) against the transaction mode (baseline)."""

    def pair(name: str, rv: float, tv: float, fmt: str, target: str = "", met: Any = None) -> None:
        r = f"{rv / tv:.2f}x" if tv else "n/a"
        row(f"independent agents: {name}", fmt.format(rv), fmt.format(tv), r, target, met)

    shown = f"{shape['runs']:,} runs x 1 webhook, {shape['publishers']} agents one run at a time"
    pair(f"accepted runs/s ({shown}; 2 workers)", _figure(rec, "peak", "accepted_per_s"),
         _figure(tx, "peak", "accepted_per_s"), "{:,.0f}", "(Svix 451-528)")  # fmt: skip
    dv = _figure(rec, "peak", "delivered_per_s")
    pair("delivered/s at the receiver, p10-p90", dv, _figure(tx, "peak", "delivered_per_s"),
         "{:,.0f}", ">= 558", dv >= 558)  # fmt: skip
    for q in ("p50", "p99"):
        pair(f"publish -> arrival {q} at peak (ms)", _figure(rec, "peak", f"{q}_ms"),
             _figure(tx, "peak", f"{q}_ms"), "{:,.0f}")  # fmt: skip
    for q, limit in (("p50", None), ("p99", 650)):
        rl = _figure(rec, "paced", f"{q}_ms")
        pair(f"publish -> arrival {q} at half of own peak (ms)", rl,
             _figure(tx, "paced", f"{q}_ms"), "{:,.0f}",
             f"<= {limit}" if limit else "", None if limit is None else rl <= limit)  # fmt: skip
    for groups, name in (
        (("workers", "broker"), "2 workers + broker"),
        (("workers",), "2 workers alone"),
        (("broker",), "broker alone"),
        (("publisher",), "publishing process (8 agents)"),
        (GROUPS, "every process"),
    ):
        pair(f"CPU ms/delivery, {name} (at peak)", _cpu(rec, groups), _cpu(tx, groups), "{:.2f}")
    pair("worker RSS, peak of the two (MB)", max(rec["hwm_mb"]), max(tx["hwm_mb"]), "{:,.0f}")
    pair("keys arriving twice", rec["twice"], tx["twice"], "{:,.0f}", "0", rec["twice"] == 0)


def independent_rows(results: dict[str, Any], row: Row) -> None:
    """The record mode (value) against the transaction mode (baseline), issue 31's targets
    in the target column."""
    if "transaction" not in results:
        return  # every row compares with the transaction mode
    tx = results["transaction"]
    if "record" in results:
        _record_rows(results["record"], tx, results["shape"], row)
    if "http" not in results:
        return
    # Svix's own shape: 32 concurrent HTTP posts, to one ledger api (its group commit).
    web = results["http"]

    def over_http(
        name: str, hv: float, tv: float, fmt: str, target: str = "", met: Any = None
    ) -> None:
        r = f"{hv / tv:.2f}x" if tv else "n/a"
        row(f"32 HTTP clients (value) vs SDK transaction mode: {name}", fmt.format(hv),
            fmt.format(tv), r, target, met)  # fmt: skip

    over_http("accepted runs/s", _figure(web, "peak", "accepted_per_s"),
              _figure(tx, "peak", "accepted_per_s"), "{:,.0f}", "(Svix 451-528)")  # fmt: skip
    hv = _figure(web, "peak", "delivered_per_s")
    over_http("delivered/s at the receiver, p10-p90", hv, _figure(tx, "peak", "delivered_per_s"),
              "{:,.0f}", ">= 558", hv >= 558)  # fmt: skip
    hl = _figure(web, "paced", "p99_ms")
    over_http("publish -> arrival p99 at half of own peak (ms)", hl,
              _figure(tx, "paced", "p99_ms"), "{:,.0f}", "<= 650", hl <= 650)  # fmt: skip
    every = _cpu(web, GROUPS)
    over_http("CPU ms/delivery, every process (the API's included)", every, _cpu(tx, GROUPS),
              "{:.2f}", "<= 3.5", every <= 3.5)  # fmt: skip
    over_http("keys arriving twice", web["twice"], tx["twice"], "{:,.0f}", "0", web["twice"] == 0)


def independent_note(results: dict[str, Any]) -> str:
    """Every round of both modes, and the load average, for the record."""

    def rounds(system: dict[str, Any], phase: str, name: str) -> str:
        return ", ".join(f"{r[name]:,.0f}" for r in system[phase])

    s = results["shape"]
    loads = "; ".join(", ".join(f"{x:.1f}" for x in load) for load in results["loadavg"])
    parts = [
        f"Independent agents: {s['runs']:,} runs of one webhook per round, {s['publishers']} "
        f"Publisher instances in one process (each its own producer), each publishing one run "
        f"at a time, {s['rounds']} rounds per mode, 2 workers, receiver "
        "bench/verifying_receiver.py (no dedupe). Load average (1, 5, 15 min) before, then "
        f"after each of {', '.join(m for m in MODES if m in results)}: {loads}."
    ]
    for mode in (m for m in MODES if m in results):
        system = results[mode]
        parts.append(
            f"{mode}: accepted {rounds(system, 'peak', 'accepted_per_s')}/s, delivered "
            f"{rounds(system, 'peak', 'delivered_per_s')}/s, p50 {rounds(system, 'peak', 'p50_ms')}"
            f" ms, p99 {rounds(system, 'peak', 'p99_ms')} ms; paced at "
            f"{system['half_peak_per_s']:.0f}/s: p50 {rounds(system, 'paced', 'p50_ms')} ms, p99 "
            f"{rounds(system, 'paced', 'p99_ms')} ms; keys arriving twice {system['twice']}."
        )
    return " ".join(parts)


def _figure(system: dict[str, Any], phase: str, name: str) -> float:
    return median([r[name] for r in system[phase]])


def _cpu(system: dict[str, Any], groups: tuple[str, ...]) -> float:
    return median([sum(r["cpu_ms_per_delivery"][g] for g in groups) for r in system["peak"]])


def rows(results: dict[str, Any], row: Row) -> None:
    """The section's rows: ours (value) against the bare loop (baseline), Svix's figure
    and issue 12's target in the target column."""
    w, b = results["worker"], results["bare"]
    shape = results["shape"]

    def pair(name: str, wv: float, bv: float, fmt: str, target: str = "", met: Any = None) -> None:
        r = f"{wv / bv:.2f}x" if bv else "n/a"
        row(f"peer: {name}", fmt.format(wv), fmt.format(bv), r, target, met)

    acc, bacc = _figure(w, "peak", "accepted_per_s"), _figure(b, "peak", "accepted_per_s")
    shown = f"{shape['runs']:,} runs x 1 webhook, {shape['publishers']} publishers"
    pair(
        f"accepted runs/s ({shown}; 2 workers vs 2 bare loops)",
        acc,
        bacc,
        "{:,.0f}",
        ">= 1,000 (Svix 488-565)",
        acc >= 1000,
    )
    dv, bdv = _figure(w, "peak", "delivered_per_s"), _figure(b, "peak", "delivered_per_s")
    pair("delivered/s at the receiver, p10-p90", dv, bdv, "{:,.0f}", ">= 515 (Svix 515-580)",
         dv >= 515)  # fmt: skip
    for q, svix in (("p50", "77-87"), ("p99", "164-216")):
        pair(f"publish -> arrival {q} at peak (ms)", _figure(w, "peak", f"{q}_ms"),
             _figure(b, "peak", f"{q}_ms"), "{:,.0f}", f"(Svix {svix})")  # fmt: skip
    for q, limit in (("p50", 150), ("p99", 650)):
        wl = _figure(w, "paced", f"{q}_ms")
        pair(f"publish -> arrival {q} at half of own peak (ms)", wl,
             _figure(b, "paced", f"{q}_ms"), "{:,.0f}", f"<= {limit}", wl <= limit)  # fmt: skip
    for fraction in ("0.25", "0.9") if w["fractions"] and b["fractions"] else ():
        for q in ("p50", "p99"):
            wf, bf = w["fractions"][fraction], b["fractions"][fraction]
            pair(f"publish -> arrival {q} at {float(fraction):.0%} of own peak (ms)",
                 wf[f"{q}_ms"], bf[f"{q}_ms"], "{:,.0f}")  # fmt: skip
    ours = _cpu(w, ("workers", "broker"))
    pair("CPU ms/delivery, 2 workers + broker (at peak)", ours, _cpu(b, ("workers", "broker")),
         "{:.2f}", "<= 5 (Svix 2.3-2.6)", ours <= 5)  # fmt: skip
    for groups, name in (
        (("workers",), "2 workers alone"),
        (("broker",), "broker alone"),
        (("publisher",), "publisher process"),
        (("receiver",), "receiver"),
        (GROUPS, "every process"),
    ):
        pair(f"CPU ms/delivery, {name}", _cpu(w, groups), _cpu(b, groups), "{:.2f}")
    pair("worker RSS, peak of the two (MB)", max(w["hwm_mb"]), max(b["hwm_mb"]), "{:,.0f}",
         "(Svix 46)")  # fmt: skip
    alone = results["receiver_alone"]
    rps = median([r["requests_per_s"] for r in alone])
    cpu = median([r["receiver_cpu_ms_per_request"] for r in alone])
    row("peer: receiver alone (signed load, no Kafka), requests/s: the ceiling", f"{rps:,.0f}", "",
        "", "")  # fmt: skip
    row("peer: receiver alone, its CPU ms per request", f"{cpu:.2f}", "", "", "")


def note(results: dict[str, Any]) -> str:
    """Every round, for the record."""

    def rounds(system: dict[str, Any], phase: str, name: str, fmt: str = "{:,.0f}") -> str:
        return ", ".join(fmt.format(r[name]) for r in system[phase])

    s, w, b = results["shape"], results["worker"], results["bare"]
    parts = [
        f"Peer shape: {s['runs']:,} runs of one webhook per round, {s['publishers']} "
        f"publishers (one transactional id each), {s['rounds']} rounds, receiver "
        "bench/verifying_receiver.py (standardwebhooks verify, backlog 128, no dedupe)."
    ]
    for name, system in (("worker", w), ("bare", b)):
        parts.append(
            f"{name}: accepted {rounds(system, 'peak', 'accepted_per_s')}/s, delivered "
            f"{rounds(system, 'peak', 'delivered_per_s')}/s, p50 {rounds(system, 'peak', 'p50_ms')}"
            f" ms, p99 {rounds(system, 'peak', 'p99_ms')} ms; paced at "
            f"{system['half_peak_per_s']:.0f}/s ({system['paced'][0]['runs']:,} runs): p50 "
            f"{rounds(system, 'paced', 'p50_ms')} ms, p99 {rounds(system, 'paced', 'p99_ms')} ms; "
            + "".join(
                f" at {float(f):.0%} of peak ({r['runs']:,} runs): p50 {r['p50_ms']:,.0f} ms, "
                f"p99 {r['p99_ms']:,.0f} ms;"
                for f, r in system["fractions"].items()
            )
            + f" RSS {', '.join(f'{x:.0f}' for x in system['rss_mb'])} MB (peak "
            f"{', '.join(f'{x:.0f}' for x in system['hwm_mb'])}); keys arriving twice "
            f"{system['twice']}."
        )
    if w.get("worker_counters"):
        shown = ", ".join(
            f"{name.removeprefix('ledger_worker_').removesuffix('_total')} {value:,.0f}"
            for name, value in w["worker_counters"].items()
        )
        parts.append(f"Worker counters at the end (both workers, warm-up included): {shown}.")
    alone = results["receiver_alone"]
    parts.append(
        f"Receiver alone ({alone[0]['requests']:,} signed requests, "
        f"{s['load_connections']} keep-alive connections): "
        + ", ".join(f"{r['requests_per_s']:,.0f}" for r in alone)
        + " requests/s, receiver "
        + ", ".join(f"{r['receiver_cpu_ms_per_request']:.2f}" for r in alone)
        + f" CPU ms/request. Requests the receiver refused (bad signature): "
        f"{results['receiver_rejected']}; lookups it answered: {results['receiver_lookups']}."
    )
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="300 runs per round")
    parser.add_argument("--runs", type=int, help="runs per round (one webhook each)")
    parser.add_argument("--publishers", type=int, help="concurrent publishers")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--paced-seconds", type=float, help="length of a paced round")
    parser.add_argument("--load-requests", type=int, help="requests per receiver-alone round")
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT,
                        help="own broker on this port and the next")  # fmt: skip
    parser.add_argument("--independent", action="store_true",
                        help="our workers only, agents publishing in each of the publisher's "
                        "modes (transaction, record)")  # fmt: skip
    parser.add_argument("--no-fractions", action="store_true",
                        help="no paced rounds at 25%% and 90%% of the peak")  # fmt: skip
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="with --independent: these shapes only")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    update = {
        "runs": args.runs,
        "publishers": args.publishers,
        "rounds": args.rounds,
        "paced_s": args.paced_seconds,
        "load_requests": args.load_requests,
    }
    shape = Shape(**{**shape.__dict__, **{k: v for k, v in update.items() if v is not None}})
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    with bench_broker(tmp, args.broker_port) as settings:
        console.print(f"[bold]broker[/] {settings.kafka.bootstrap_servers} in {tmp}")
        stack = Stack(tmp / "logs")
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                if args.independent:
                    modes = tuple(args.modes)
                    job = measure_independent(settings, stack, shape, progress, modes)
                else:
                    job = measure(settings, stack, shape, progress, not args.no_fractions)
                results = asyncio.run(job)
        except BaseException:
            console.print(f"[red]failed[/]: logs kept in {tmp}/logs")
            raise
        finally:
            stack.stop()
    if args.keep:
        console.print(f"logs kept in {tmp}/logs")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    columns = "record mode | transaction mode" if args.independent else "ours | bare loop"
    lines = [f"| figure | {columns} | ratio | target | met |", "|---|---|---|---|---|---|"]

    def row(label: str, value: str, base: str, r: str, target: str = "", met: Any = None) -> None:
        mark = "" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {label} | {value} | {base} | {r} | {target} | {mark} |")

    (independent_rows if args.independent else rows)(results, row)
    print("\n".join(lines))
    print((independent_note if args.independent else note)(results))


if __name__ == "__main__":
    main()
