"""Agents that publish over HTTP, the shape of issue 31's Svix comparison: one ``ledger
api`` process, ``clients`` keep-alive connections each posting its share of runs in turn
(32 by default, as the comparison posted to Svix), one webhook delivery per run.

``HttpAgents.publish`` has the signature of bench/peer.py's ``publish``: {idempotency key:
the time its run's request was written}, and runs accepted per second.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rich.progress import Progress

from bench.http_ingest import Api, post_in_turn, run_request, start_api
from clients.api_keys import issue_key
from config import Settings
from config.settings import changed
from events.keys import idempotency_key

CLIENTS = 32
HOOKS = 8  # recipients, as bench/peer.py's
EVENT_TYPE = "run.succeeded"  # the API's default for a delivery


@dataclass
class HttpAgents:
    """A started ``ledger api`` and a key for it."""

    api: Api
    token: str
    clients: int

    @classmethod
    async def start(cls, settings: Settings, work: Path, clients: int = CLIENTS) -> HttpAgents:
        """An API on ``settings`` (its first answers in a SQLite file under ``work``), no
        rate limit per key (the benchmark is the only agent)."""
        own = changed(
            settings,
            {
                "api.port": 0,
                "api.rate_per_key_s": 1e6,
                "api.burst_per_key": 1_000_000,
                "api.dsn": f"sqlite://{work / 'api-answers.sqlite3'}",
            },
        )
        _, token = await issue_key(own.kafka, "bench-http-agents", "bench")
        api = await asyncio.to_thread(start_api, own, work / "api.log")
        return cls(api, token, clients)

    @property
    def pid(self) -> int:
        return self.api.process.pid

    async def publish(
        self,
        base: str,
        runs: int,
        rate: float | None,
        progress: Progress | None,
        label: str,
    ) -> tuple[dict[str, float], float]:
        """``runs`` runs over HTTP (request ``n`` written at ``began + n / rate`` if
        paced); {key: time its request was written}, runs accepted per second."""
        tag = uuid.uuid4().hex[:8]
        address = urlsplit(self.api.url)
        host, port = address.hostname or "127.0.0.1", address.port or 80
        keys: list[str] = []
        shares: list[list[tuple[int, bytes]]] = [[] for _ in range(self.clients)]
        for n in range(runs):
            run_id, recipient = f"peer-http-{tag}-{n}", f"{base}/hooks/p{n % HOOKS}"
            keys.append(idempotency_key(run_id, EVENT_TYPE, "webhook", recipient))
            spec = {"channel": "webhook", "recipient": recipient, "payload": {"run": n}}
            payload = json.dumps({"result_hash": "h", "deliveries": [spec]}).encode()
            wire = run_request(host, port, self.token, run_id, payload)
            shares[n % self.clients].append((n, wire))
        called: dict[str, float] = {}
        task = progress.add_task(label, total=runs) if progress else None
        began = time.monotonic()

        async def before(n: int) -> None:
            if rate is not None and (delay := began + n / rate - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            called[keys[n]] = time.time()
            if progress is not None and task is not None:
                progress.advance(task)

        try:
            async with asyncio.timeout(max(120.0, runs / 10)):
                seconds = await post_in_turn([self.api.url], shares, before)
        finally:
            if progress is not None and task is not None:
                progress.remove_task(task)
        return called, runs / seconds

    def stop(self) -> None:
        self.api.process.terminate()
        try:
            self.api.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.api.process.kill()


def work_dir() -> Path:
    """A temporary directory for the API's log and first answers."""
    return Path(tempfile.mkdtemp(prefix="bench-http-agents-"))
