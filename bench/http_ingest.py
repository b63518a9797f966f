"""HTTP ingest: runs/s accepted over HTTP (``ledger api``) with 8 concurrent clients,
beside the SDK's with 8 concurrent callers, in the same invocation on the same broker
(issue 28's target: HTTP at least half the SDK's rate; a ``bench.run_all`` section).

A run is one ``RunSucceeded`` and one webhook ``DeliveryRequested``, as in
bench/publisher.py, whose SDK round (8 tasks sharing one ``Publisher``, group commit) is
the baseline. The HTTP rows post ``/v1/runs/{id}/complete`` to one ``ledger api`` process
(key, rate, body validation, the run id's first answer, its one shared publisher):

* ``http_8``: 8 keep-alive connections of a lean client (asyncio streams, each request's
  bytes made before the clock starts, as the SDK round builds its specs before it): the
  load generator costs ~0.1 ms of CPU per run, so on a 2-core machine it does not take
  the CPU the API and the broker need (the agents are elsewhere in production);
* ``http_32``: 32 such connections, the Svix comparison's 32 concurrent posts (issue 31):
  how far one API process's group commit batches across its callers;
* ``httpx_8``: the same through 8 ``httpx.AsyncClient`` (~1 ms of CPU per run in the
  clients, the figure of before, for comparison);
* ``--api-tree DIR`` (repeatable): ``http_8`` again against a ``ledger api`` started from
  another checkout (e.g. ``git worktree add --detach /tmp/old main``), same broker, same
  rounds, interleaved: before and after in one sitting.

CPU ms per run of the API process, of this process (clients, or the SDK) and of the
broker, per row. Median of --repeat rounds, interleaved, after a warm-up round of each.

    .venv/bin/python -m bench.http_ingest --runs 2000 --repeat 3 --port 27152
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.common import cpu_seconds
from bench.publisher import sdk_round
from clients.api_keys import issue_key
from config import Settings
from config.settings import changed
from ledger.broker import LocalBroker
from ledger.broker.process import metadata_ok
from ledger.stack import settings_env
from ledger.topics import create_topics

CLIENTS = 8
WIDE = 32  # the Svix comparison's concurrent HTTP clients (issue 31)
PORT = 27152
TARGET = 0.5


def body(n: int) -> dict[str, object]:
    """The request of run ``n``: the SDK round's run (bench/publisher.py ``specs``)."""
    return {
        "result_hash": "h",
        "deliveries": [
            {
                "channel": "webhook",
                "recipient": "http://127.0.0.1:9/hooks/0",
                "payload": {"run": n, "text": "report ready", "i": 0},
            }
        ],
    }


def run_request(host: str, port: int, token: str, run_id: str, payload: bytes) -> bytes:
    """The bytes of one ``POST /v1/runs/{run_id}/complete`` with ``payload`` as its body."""
    head = (
        f"POST /v1/runs/{run_id}/complete HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def post_in_turn(
    urls: list[str],
    shares: list[list[tuple[int, bytes]]],
    before: Callable[[int], Awaitable[None]] | None = None,
) -> float:
    """Seconds for ``len(shares)`` keep-alive connections (spread over ``urls`` in turn, as
    SO_REUSEPORT spreads them over processes sharing a port), each posting its share of
    ``(n, request bytes)`` in turn and reading each answer by Content-Length; ``before(n)``
    is awaited right before request ``n`` is written (to pace, or to note the time)."""
    addresses = [(p.hostname or "127.0.0.1", p.port or 80) for p in map(urlsplit, urls)]
    streams = [
        await asyncio.open_connection(*addresses[c % len(addresses)]) for c in range(len(shares))
    ]

    async def client(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mine: list[tuple[int, bytes]]
    ) -> None:
        for n, wire in mine:
            if before is not None:
                await before(n)
            writer.write(wire)
            head = await reader.readuntil(b"\r\n\r\n")
            found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            answer = await reader.readexactly(int(found.group(1)) if found else 0)
            if head[9:12] != b"201":
                raise RuntimeError(f"{head[:12]!r}: {answer[:300]!r}")

    try:
        began = time.perf_counter()
        await asyncio.gather(*(client(r, w, s) for (r, w), s in zip(streams, shares, strict=True)))
        return time.perf_counter() - began
    finally:
        for _, writer in streams:
            writer.close()


async def lean_round(url: str | list[str], token: str, runs: int, clients: int) -> float:
    """Runs/s of ``clients`` keep-alive connections, each posting its share of runs in
    turn; requests made before the clock starts, answers read by Content-Length. Several
    URLs: the connections spread over them in turn."""
    tag = uuid.uuid4().hex[:8]
    urls = [url] if isinstance(url, str) else url
    first = urlsplit(urls[0])
    host, port = first.hostname or "127.0.0.1", first.port or 80

    def request(n: int) -> tuple[int, bytes]:
        payload = json.dumps(body(n)).encode()
        return n, run_request(host, port, token, f"http-{tag}-{n}", payload)

    shares = [[request(n) for n in range(c, runs, clients)] for c in range(clients)]
    return runs / await post_in_turn(urls, shares)


async def httpx_round(url: str, token: str, runs: int, clients: int) -> float:
    """Runs/s of ``clients`` httpx clients (one keep-alive connection each), each posting
    its share of runs in turn."""
    tag = uuid.uuid4().hex[:8]
    headers = {"Authorization": f"Bearer {token}"}

    async def client(c: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            for n in range(c, runs, clients):
                answer = await http.post(f"/v1/runs/http-{tag}-{n}/complete", json=body(n))
                if answer.status_code != 201:
                    raise RuntimeError(f"{answer.status_code}: {answer.text}")

    began = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return runs / (time.perf_counter() - began)


@dataclass
class Api:
    """One ``ledger api`` process (from this checkout, or ``tree``) and its URL."""

    process: subprocess.Popen[bytes]
    url: str


def start_api(settings: Settings, log: Path, tree: Path | None = None) -> Api:
    """A ``ledger api`` process serving ``settings``; from the checkout ``tree`` if given."""
    env = {**settings_env(settings), "COLUMNS": "200"}
    if tree is not None:  # that checkout's code, this venv's libraries
        env |= {"PYTHONSAFEPATH": "1", "PYTHONPATH": str(tree)}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ledger", "api"],
            env=env,
            cwd=tree,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if found := re.search(r"api on (http://[0-9.:]+)", log.read_text()):
            return Api(process, found.group(1))
        if process.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("ledger api did not start")


async def measure(
    settings: Settings,
    runs: int,
    repeat: int,
    progress: Any = None,
    trees: dict[str, Path] | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """``repeat`` interleaved rounds of each row (after a warm-up round of each): runs/s
    in ``rounds[row]``, CPU ms per run of the API / this process / the broker in
    ``cpu[row]``. Rows: ``sdk_8``, ``http_8``, ``httpx_8``, and ``http_8@NAME`` per tree."""
    settings = changed(
        settings,
        {
            "kafka.topic_api_keys": f"bench.api_keys.{uuid.uuid4().hex[:8]}",
            "api.port": 0,
            "api.rate_per_key_s": 1e6,
            "api.burst_per_key": 1_000_000,
        },
    )
    await create_topics(settings)
    _, token = await issue_key(settings.kafka, "bench-agent", "bench")
    broker = LocalBroker(settings).pid()
    work = Path(tempfile.mkdtemp(prefix="bench-http-"))
    apis: dict[str, Api] = {}
    here = None
    sources = {"": here, **{f"@{name}": tree for name, tree in (trees or {}).items()}}
    for suffix, tree in sources.items():
        own = changed(settings, {"api.dsn": f"sqlite://{work / f'api{suffix}.sqlite3'}"})
        apis[suffix] = start_api(own, work / f"api{suffix}.log", tree)
    # N processes of this checkout's API sharing one first-answer file, each its own
    # publisher; the clients' connections spread over them.
    shared = changed(settings, {"api.dsn": f"sqlite://{work / 'api-shared.sqlite3'}"})
    many = [
        start_api(shared, work / f"api-x{i}.log") for i in range(processes if processes > 1 else 0)
    ]
    sdk_counts: dict[str, int] = {}
    Round = Callable[[], Awaitable[float]]
    rows: dict[str, tuple[Round, list[int]]] = {
        "sdk_8": (lambda: sdk_round(settings, runs, CLIENTS, 1, sdk_counts), []),
        **{
            f"http_8{suffix}": (
                lambda url=api.url: lean_round(url, token, runs, CLIENTS),  # type: ignore[misc]
                [api.process.pid],
            )
            for suffix, api in apis.items()
        },
        "httpx_8": (
            lambda: httpx_round(apis[""].url, token, runs, CLIENTS),
            [apis[""].process.pid],
        ),
        # Svix's shape (issue 31): 32 concurrent posts, one API process's group commit.
        f"http_{WIDE}": (
            lambda: lean_round(apis[""].url, token, runs, WIDE),
            [apis[""].process.pid],
        ),
    }
    if many:
        urls = [api.url for api in many]
        rows[f"http_8x{len(many)}"] = (
            lambda: lean_round(urls, token, runs, CLIENTS),
            [api.process.pid for api in many],
        )
    figures: dict[str, Any] = {"runs": runs, "rows": list(rows), "rounds": {}, "cpu": {}}
    task = progress.add_task("http ingest rounds", total=repeat) if progress else None
    try:
        for r in range(-1, repeat):  # round -1: warm-up (connections, keys, the broker's JIT)
            if progress is not None:
                progress.update(task, completed=max(r, 0))
            for name, (one, pids) in rows.items():
                before = (
                    sum(cpu_seconds(pid) for pid in pids),
                    time.process_time(),
                    cpu_seconds(broker) if broker else 0.0,
                )
                rate = await one()
                after = (
                    sum(cpu_seconds(pid) for pid in pids),
                    time.process_time(),
                    cpu_seconds(broker) if broker else 0.0,
                )
                if r < 0:
                    continue
                figures["rounds"].setdefault(name, []).append(rate)
                figures["cpu"].setdefault(name, []).append(
                    [(b - a) / runs * 1000 for a, b in zip(before, after, strict=True)]
                )
    finally:
        if progress is not None:
            progress.remove_task(task)
        for api in [*apis.values(), *many]:
            api.process.terminate()
        for api in [*apis.values(), *many]:
            try:
                api.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                api.process.kill()
        # Runs per Kafka transaction (group commit's batching), warm-up included.
        per_txn = {"sdk_8": ratio_of(sdk_counts.get("runs", 0), sdk_counts.get("transactions", 0))}
        for suffix in [*apis, *(f"-x{i}" for i in range(len(many)))]:
            if found := STOPPED.search((work / f"api{suffix}.log").read_text()):
                runs_done, txns = (int(g.replace(",", "")) for g in found.groups())
                per_txn[f"http{suffix}"] = ratio_of(runs_done, txns)
        figures["runs_per_transaction"] = per_txn
        shutil.rmtree(work, ignore_errors=True)
    return figures


STOPPED = re.compile(r"api stopped \(([\d,]+) runs in ([\d,]+) Kafka transactions\)")


def ratio_of(runs: int, transactions: int) -> float:
    """Runs per transaction (0.0 for none)."""
    return runs / transactions if transactions else 0.0


def cpu_of(results: dict[str, Any], name: str) -> tuple[float, float, float]:
    """Median CPU ms per run of (the API, this process, the broker) in row ``name``."""
    columns = zip(*results["cpu"][name], strict=True)
    api, mine, broker = (statistics.median(c) for c in columns)
    return api, mine, broker


def rows(results: dict[str, Any], row: Callable[..., None]) -> None:
    """bench/run_all.py's rows: HTTP (lean clients, then httpx) against the SDK."""
    m = {name: statistics.median(values) for name, values in results["rounds"].items()}
    sdk = m["sdk_8"]
    for name in results["rows"]:
        if not name.startswith("http"):
            continue
        clients = int(re.split(r"[@x]", name.split("_", 1)[1])[0])
        label = (
            f"runs/s accepted over HTTP, {clients} "
            + ("httpx clients" if name.startswith("httpx") else "lean clients")
            + (f" ({name.split('@', 1)[1]} API)" if "@" in name else "")
            + (f" ({name.split('x', 1)[1]} API processes)" if "_8x" in name else "")
            + f" vs the SDK, {CLIENTS} callers"
        )
        value = m[name]
        met = value >= TARGET * sdk if name == "http_8" else None
        target = f">= {TARGET}x" if met is not None else ""
        row(label, f"{value:,.0f}", f"{sdk:,.0f}", f"{value / sdk:.2f}x", target, met)


def note(results: dict[str, Any]) -> str:
    """The details line: every round, and the CPU per run of each row."""
    parts = [f"HTTP ingest: {results['runs']:,} runs per round"]
    for name in results["rows"]:
        api, mine, broker = cpu_of(results, name)
        rates = ", ".join(f"{v:,.0f}" for v in results["rounds"][name])
        cpu = (
            f"CPU ms/run: SDK process {mine:.2f}, broker {broker:.2f}"
            if name == "sdk_8"
            else f"CPU ms/run: API {api:.2f}, clients {mine:.2f}, broker {broker:.2f}"
        )
        parts.append(f"{name} {rates} runs/s ({cpu})")
    batching = ", ".join(
        f"{name} {value:.1f}" for name, value in results.get("runs_per_transaction", {}).items()
    )
    tail = f". Runs per Kafka transaction (all rounds; http: both HTTP rows): {batching}"
    return "; ".join(parts) + (tail if batching else "") + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=PORT, help="broker port (reused if it runs)")
    parser.add_argument(
        "--api-tree",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="also measure a ledger api started from this checkout (before/after)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="also a row of N API processes sharing the first-answer file (clients spread)",
    )
    args = parser.parse_args()
    trees = {}
    for given in args.api_tree:
        name, _, path = given.rpartition("=")
        trees[name or Path(path).name] = Path(path).resolve()
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
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
        settings = changed(settings, {"projection.dsn": f"sqlite://{Path(tmp) / 'p.sqlite3'}"})
        settings.data_dir.mkdir(parents=True)
        broker = LocalBroker(settings)
        started = not metadata_ok(settings.kafka.bootstrap_servers, timeout=2.0)
        if started:
            broker.start()
        try:
            results = asyncio.run(
                measure(settings, args.runs, args.repeat, None, trees, args.processes)
            )
        finally:
            if started:
                broker.stop()
    print(
        f"machine: {platform.machine()} {platform.python_version()} cores={os.cpu_count()} "
        f"load={os.getloadavg()[0]:.1f} runs/round={args.runs} rounds={args.repeat}"
    )
    print("| figure | median | baseline | ratio | target | met |")
    print("|---|---|---|---|---|---|")

    def row(
        label: str, value: str, base: str, r: str, target: str = "", met: bool | None = None
    ) -> None:
        mark = "" if met is None else ("yes" if met else "**no**")
        print(f"| {label} | {value} | {base} | {r} | {target} | {mark} |")

    rows(results, row)
    print(note(results))
    ratios = [
        h / s for h, s in zip(results["rounds"]["http_8"], results["rounds"]["sdk_8"], strict=True)
    ]
    print(f"per-round ratios http_8/sdk_8 {[round(x, 2) for x in ratios]}")


if __name__ == "__main__":
    main()
