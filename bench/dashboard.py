"""Dashboard load time with N deliveries in a SQLite projection.

Fills an empty projection through the real fold (``Store.apply_records``, no Kafka) with
generated runs of two deliveries each, in a realistic mix of states spread over the
last 24 hours, then serves it with the dashboard and times, over loopback:

* each JSON endpoint and ``/metrics`` (median of --repeat requests, after one warm-up);
* the page in headless Chromium: navigation until the counters show numbers.

    .venv/bin/python -m bench.dashboard --deliveries 100000
    .venv/bin/python -m bench.dashboard --deliveries 100000 --append BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import async_playwright

from config import Settings
from events import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryFailed,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
    RunStarted,
    RunSucceeded,
)
from events.delivery import DeliveryRetryScheduled, new_delivery_requested
from projections import open_store
from projections.dashboard import overview, serve
from projections.fold import Position
from projections.metrics import projection_numbers
from projections.records import LogRecord

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
P = "bench"


def run_events(n: int, now: datetime, runs: int) -> list[Any]:
    """One run and its two deliveries, in a state picked by ``n``."""
    t = now - timedelta(hours=23) + timedelta(seconds=(23 * 3600) * n / runs)
    run_id = f"bench-{n:07d}"
    out: list[Any] = [
        RunStarted(run_id=run_id, agent="bench", producer=P, occurred_at=t),
        RunSucceeded(run_id=run_id, result_hash=f"sha256:{n}", producer=P, occurred_at=t),
    ]
    for d, channel in enumerate(("webhook", "provider")):
        req = new_delivery_requested(
            run_id=run_id, event_type="run.succeeded", channel=channel,
            recipient=f"https://example.test/{channel}/{d}", payload={"n": n}, slo_seconds=300,
            producer=P, occurred_at=t,
        )  # fmt: skip
        out.append(req)
        common = {"idempotency_key": req.idempotency_key, "run_id": run_id, "producer": P}
        kind = (n * 2 + d) % 100
        if kind < 5:  # PENDING, never claimed: past its SLO unless very recent
            continue
        claim = DeliveryClaimed(
            **common, attempt=1, worker_id="w1", fencing_token=1,
            lease_expires_at=t + timedelta(seconds=31), occurred_at=t + timedelta(seconds=1),
        )  # fmt: skip
        out.append(claim)
        latency = timedelta(seconds=0.2 + (n % 50) * 0.7)
        if kind < 85:
            out += [
                DeliverySent(**common, attempt=1, fencing_token=1, worker_id="w1",
                             provider_message_id=f"m{n}-{d}", http_status=202,
                             occurred_at=t + latency / 2),
                DeliveryConfirmed(**common, attempt=1, fencing_token=1, source="send",
                                  provider_message_id=f"m{n}-{d}", evidence="status delivered",
                                  occurred_at=t + latency),
            ]  # fmt: skip
        elif kind < 93:
            out.append(DeliveryUnknown(**common, attempt=1, fencing_token=1,
                                       error_class="timeout_after_write", reason="read timeout",
                                       occurred_at=t + timedelta(seconds=6)))  # fmt: skip
        elif kind < 97:
            failed_at = t + timedelta(seconds=2)
            out.append(DeliveryFailed(**common, attempts=1, error_class="http_4xx",
                                      reason="400", occurred_at=failed_at))  # fmt: skip
        else:
            out.append(DeliveryRetryScheduled(
                **common, attempt=1, next_attempt=2, retry_at=t + timedelta(seconds=30),
                error_class="http_5xx", safety="receiver dedupes on webhook-id",
                occurred_at=t + timedelta(seconds=2)))  # fmt: skip
        if kind == 0 and n % 7 == 0:
            out.append(DuplicateDeliveryRequest(
                **common, duplicate_event_id=req.event_id, payload_hash="0" * 64,
                original_payload_hash=req.payload_hash, outcome="conflict",
                occurred_at=t + timedelta(seconds=3)))  # fmt: skip
    return out


def fill(dsn: str, deliveries: int, now: datetime) -> tuple[int, float]:
    """Fold generated events into an empty projection; (events, seconds)."""
    store = open_store(dsn)
    store.prepare("rebuild", replace=True)
    runs = deliveries // 2
    began = time.perf_counter()
    batch: list[LogRecord] = []
    offset = events = 0
    for n in range(runs):
        for event in run_events(n, now, runs):
            batch.append(LogRecord(Position("bench", 0, offset), event))
            offset += 1
        if len(batch) >= 5000:
            store.apply_records(batch, frozenset())
            events += len(batch)
            batch = []
    if batch:
        store.apply_records(batch, frozenset())
        events += len(batch)
    store.close()
    return events, time.perf_counter() - began


async def measure(settings: Settings, dsn: str, now: datetime, repeat: int) -> dict[str, float]:
    """Median milliseconds per endpoint, and the browser's page load."""
    store = open_store(dsn)
    store.prepare("read")
    key = store.rows("SELECT idempotency_key FROM deliveries WHERE status = 'UNKNOWN' LIMIT 1")
    prefix = key[0]["idempotency_key"][:10]
    results: dict[str, float] = {}
    # Cold: every query runs (what the first request after a projection change costs).
    for name, work in (
        ("cold: overview() (no cache)", lambda: overview(store, now)),
        (
            "cold: projection numbers for /metrics (no cache)",
            lambda: projection_numbers(store, now, {}),
        ),
    ):
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            work()
            times.append((time.perf_counter() - began) * 1000)
        results[name] = statistics.median(times)
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(settings, store, stop, clock=lambda: now, ready=ready.set_result)
    )
    url = await asyncio.wait_for(ready, 30)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            for name, path in (
                ("GET / (page shell)", "/"),
                ("GET /static/app.js", "/static/app.js"),
                ("warm: GET /api/overview", "/api/overview"),
                ("warm: GET /metrics (Kafka unreachable here)", "/metrics"),
                ("GET /api/runs/{id}", "/api/runs/bench-0000042"),
                ("GET /api/search?q=<key prefix>", f"/api/search?q={prefix}"),
            ):
                (await http.get(path)).raise_for_status()
                times = []
                for _ in range(repeat):
                    began = time.perf_counter()
                    (await http.get(path)).raise_for_status()
                    times.append((time.perf_counter() - began) * 1000)
                results[name] = statistics.median(times)
        async with async_playwright() as driver:
            browser = await driver.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            page = await browser.new_page(viewport={"width": 1300, "height": 1000})
            times = []
            for _ in range(repeat):
                began = time.perf_counter()
                await page.goto(url)
                await page.locator("#counter-unknown .value").wait_for()
                await page.locator("#table-unknown tbody tr").first.wait_for()
                times.append((time.perf_counter() - began) * 1000)
            results["browser: navigate until counters + tables drawn"] = statistics.median(times)
            await browser.close()
    finally:
        stop.set()
        await server
        store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--db", type=Path, help="Reuse (or keep) this SQLite file.")
    parser.add_argument("--reuse", action="store_true", help="Do not refill --db.")
    parser.add_argument("--append", type=Path, help="Append the results to this file.")
    args = parser.parse_args()
    now = datetime.now(UTC).replace(microsecond=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "bench.sqlite3"
        dsn = f"sqlite://{path}"
        if args.reuse and path.exists():
            events, fill_s = 0, 0.0
        else:
            events, fill_s = fill(dsn, args.deliveries, now)
        counts = dict(
            sqlite3.connect(path).execute("SELECT status, COUNT(*) FROM deliveries GROUP BY status")
        )
        settings = Settings(dashboard={"port": 0}, kafka={"bootstrap_servers": "127.0.0.1:1"})
        results = asyncio.run(measure(settings, dsn, now, args.repeat))
    header = (
        f"`python -m bench.dashboard --deliveries {args.deliveries}`, "
        f"{datetime.now(UTC):%Y-%m-%d}: {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, Chromium (Debian) "
        f"headless. Projection: {sum(counts.values()):,} deliveries "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))
        + (f"; filled through the fold in {fill_s:.0f}s ({events:,} events)." if events else ".")
    )
    lines = ["", "| request | median ms |", "|---|---|"]
    lines += [f"| {name} | {ms:.1f} |" for name, ms in results.items()]
    text = header + "\n" + "\n".join(lines) + "\n"
    print(text)
    if args.append:
        with args.append.open("a", encoding="utf-8") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
