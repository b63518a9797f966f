"""HTTP ingest: runs/s accepted over HTTP (``ledger api``) with 8 concurrent clients,
beside the SDK's with 8 concurrent callers, in the same invocation on the same broker.

A run is one ``RunSucceeded`` and one webhook ``DeliveryRequested``, as in
bench/publisher.py. The SDK row: 8 tasks sharing one ``Publisher`` (group commit). The HTTP
row: 8 httpx clients (one keep-alive connection each) posting ``/v1/runs/{id}/complete``
to one ``ledger api`` process, whose one shared publisher group-commits them the same way,
after checking the key, the rate, the body and the run id's first answer (SQLite). Every
process shares the machine's CPUs (the broker, the API, the clients). Median of --repeat
rounds; target: HTTP at least half the SDK's rate.

    .venv/bin/python -m bench.http_ingest --runs 2000 --repeat 3 --port 27152
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.common import cpu_seconds
from bench.publisher import sdk_round
from clients.api_keys import issue_key
from config import Settings
from config.settings import changed
from events.ports import free_port
from ledger.broker import LocalBroker
from ledger.broker.process import metadata_ok
from ledger.stack import settings_env
from ledger.topics import create_topics

CLIENTS = 8
PORT = 27152


async def http_round(url: str, token: str, runs: int, clients: int) -> float:
    """Runs/s of ``clients`` httpx clients, each posting its share of runs in turn."""
    tag = uuid.uuid4().hex[:8]
    headers = {"Authorization": f"Bearer {token}"}

    def body(n: int) -> dict[str, object]:
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

    async def client(c: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            for n in range(c, runs, clients):
                answer = await http.post(f"/v1/runs/http-{tag}-{n}/complete", json=body(n))
                if answer.status_code != 201:
                    raise RuntimeError(f"{answer.status_code}: {answer.text}")

    began = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return runs / (time.perf_counter() - began)


def start_api(settings: Settings, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A ``ledger api`` process and its URL."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ledger", "api"],
            env={**settings_env(settings), "COLUMNS": "200"},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if found := re.search(r"api on (http://[0-9.:]+)", log.read_text()):
            return process, found.group(1)
        if process.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("ledger api did not start")


async def measure(settings: Settings, runs: int, repeat: int) -> dict[str, list[float]]:
    """``repeat`` rounds of each row (runs/s): ``sdk_8`` and ``http_8``."""
    await create_topics(settings)
    _, token = await issue_key(settings.kafka, "bench-agent", "bench")
    process, url = start_api(settings, settings.data_dir / "api.log")
    figures: dict[str, list[float]] = {
        "sdk_8": [],
        "http_8": [],
        "sdk_cpu_ms": [],
        "api_cpu_ms": [],
        "clients_cpu_ms": [],
    }
    try:
        # Warm-up, a round of each: connections, the API's key table, and the broker's JIT
        # (its first thousands of transactions are markedly slower).
        await http_round(url, token, runs, CLIENTS)
        await sdk_round(settings, runs, CLIENTS, 1)
        for _ in range(repeat):
            mine = time.process_time()
            figures["sdk_8"].append(await sdk_round(settings, runs, CLIENTS, 1))
            figures["sdk_cpu_ms"].append((time.process_time() - mine) / runs * 1000)
            mine, api = time.process_time(), cpu_seconds(process.pid)
            figures["http_8"].append(await http_round(url, token, runs, CLIENTS))
            figures["api_cpu_ms"].append((cpu_seconds(process.pid) - api) / runs * 1000)
            figures["clients_cpu_ms"].append((time.process_time() - mine) / runs * 1000)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=PORT, help="broker port (reused if it runs)")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        settings = Settings(
            kafka={
                "broker_port": args.port,
                "controller_port": args.port + 1,
                "topic_runs": f"bench.runs.{tag}",
                "topic_deliveries": f"bench.deliveries.{tag}",
                "topic_deadletter": f"bench.dl.{tag}",
                "topic_api_keys": f"bench.api_keys.{tag}",
            },
            channels={"allowed_networks": ["127.0.0.0/8"]},
            data_dir=Path(tmp) / "data",
        )
        settings = changed(
            settings,
            {
                "api.port": free_port(),
                "api.rate_per_key_s": 1e6,
                "api.burst_per_key": 1_000_000,
                "projection.dsn": f"sqlite://{Path(tmp) / 'projection.sqlite3'}",
            },
        )
        settings.data_dir.mkdir(parents=True)
        broker = LocalBroker(settings)
        started = not metadata_ok(settings.kafka.bootstrap_servers, timeout=2.0)
        if started:
            broker.start()
        try:
            figures = asyncio.run(measure(settings, args.runs, args.repeat))
        finally:
            if started:
                broker.stop()
    m = {name: statistics.median(values) for name, values in figures.items()}
    print(
        f"machine: {platform.machine()} {platform.python_version()} runs/round={args.runs} "
        f"rounds={args.repeat} run=1 RunSucceeded + 1 DeliveryRequested"
    )
    print("| figure | median | baseline | ratio | target | met |")
    print("|---|---|---|---|---|---|")
    ratio = m["http_8"] / m["sdk_8"]
    print(
        f"| runs/s accepted over HTTP, {CLIENTS} clients vs the SDK, {CLIENTS} callers "
        f"| {m['http_8']:.0f} | {m['sdk_8']:.0f} | {ratio:.2f}x | >= 0.5x "
        f"| {'yes' if ratio >= 0.5 else '**no**'} |"
    )
    ratios = [h / s for h, s in zip(figures["http_8"], figures["sdk_8"], strict=True)]
    shown = [round(r, 2) for r in ratios]
    print(f"per-round ratios {shown}, median {statistics.median(ratios):.2f}")
    print(
        f"| CPU ms/run: the API process {m['api_cpu_ms']:.2f}, its 8 httpx clients "
        f"{m['clients_cpu_ms']:.2f}; the SDK's process {m['sdk_cpu_ms']:.2f} | | | | | |"
    )
    print("all rounds " + " ".join(f"{k}={[round(x, 2) for x in v]}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
