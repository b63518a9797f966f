"""A burst shows as a backlog at once, everywhere (issue 24, item 3).

5,000 runs published at once through the Publisher's group commit, no worker running (so
every delivery stays PENDING), a live ``ledger project``: ``ledger status --json``, run as
a user runs it, and the dashboard's ``/metrics`` show all of them pending within seconds,
with the age of the oldest, long before their 300 s SLO makes any of them overdue.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from clients import DeliverySpec, Publisher
from config.settings import Settings, changed
from ledger.stack import settings_env
from projections import open_store
from projections.dashboard import serve
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import wait_for

RUNS = 5_000
# From the last commit to `ledger status` showing all of them: "within seconds".
SHOWN_WITHIN_S = 30.0


def spec(n: int) -> list[DeliverySpec]:
    return [
        DeliverySpec(
            channel="webhook", recipient=f"http://127.0.0.1:9/hooks/{n}", payload={"run": n}
        )
    ]


def ledger_status(settings: Settings, dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", "status", "--dsn", dsn, "--json"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@asynccontextmanager
async def dashboard(live_projection: LiveProjection) -> AsyncIterator[str]:
    """The dashboard over the live projection, on the real clock (as in tests/dashboard,
    with the server's own clock instead of a fixed one); yields its URL."""
    settings = changed(live_projection.settings, {"dashboard.port": 0})
    store = open_store(live_projection.dsn)
    store.prepare("read")
    stop = asyncio.Event()
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(settings, store, stop, ready=listening.set_result))
    try:
        yield await asyncio.wait_for(listening, 30)
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
        store.close()


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


async def test_a_burst_is_pending_at_once_in_status_and_metrics(
    live_projection: LiveProjection,
) -> None:
    settings = live_projection.settings
    live_projection.start()
    began = time.monotonic()
    async with Publisher(settings, producer_name="burst") as publisher:
        await asyncio.gather(
            *(publisher.run_succeeded(f"burst-{n}", "sha256:b", spec(n)) for n in range(RUNS))
        )
        transactions = publisher.transactions_committed
    published = time.monotonic()
    assert transactions < RUNS / 10  # group commit: the burst shares transactions

    seen: dict[str, Any] = {}

    async def status_shows_the_burst() -> bool:
        assert live_projection.process is not None
        assert live_projection.process.poll() is None, live_projection.log.read_text()
        done = await asyncio.to_thread(ledger_status, settings, live_projection.dsn)
        if done.returncode != 0:  # the projector may not have created its tables yet
            seen.clear()
            seen["error"] = done.stderr.strip().splitlines()[:1]
            return False
        seen.clear()
        seen.update(json.loads(done.stdout))
        return bool(seen.get("backlog", {}).get("pending_now") == RUNS)

    try:
        await wait_for(status_shows_the_burst, SHOWN_WITHIN_S, "", interval=0.5)
    except AssertionError:
        last = {k: seen[k] for k in ("error", "backlog") if k in seen}
        overdue = len(seen.get("overdue_pending", []))
        raise AssertionError(
            f"`ledger status --json` did not show {RUNS} pending within {SHOWN_WITHIN_S:.0f}s "
            f"of the burst (last answer: {last or 'no backlog field'}; overdue_pending: "
            f"{overdue})"
        ) from None
    shown = time.monotonic() - published
    status_age = seen["backlog"]["oldest_age_seconds"]
    # Nothing is late yet: before this, `ledger status` showed none of it.
    assert seen["overdue_pending"] == []
    assert status_age > 0
    assert [(c["channel"], c["pending"]) for c in seen["backlog"]["by_channel"]] == [
        ("webhook", RUNS)
    ]

    async with dashboard(live_projection) as url:
        metrics = await scrape(url)
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            page = (await http.get("/api/overview?limit=0")).json()
    read_after = time.monotonic() - published
    assert metrics[("ledger_pending_deliveries", ())] == RUNS
    assert metrics[("ledger_pending_deliveries_by_channel", (("channel", "webhook"),))] == RUNS
    assert metrics[("ledger_overdue_pending_deliveries", ())] == 0
    metrics_age = metrics[("ledger_oldest_pending_delivery_age_seconds", ())]
    # The same oldest delivery, read a little later on the same clock.
    assert status_age <= metrics_age <= status_age + read_after + 1.0, (status_age, metrics_age)
    assert page["backlog"]["pending_now"] == RUNS
    assert page["backlog"]["oldest_requested_at"] == seen["backlog"]["oldest_requested_at"]
    print(
        f"burst of {RUNS} runs: published in {published - began:.1f}s ({transactions} "
        f"transactions), shown by `ledger status` {shown:.1f}s after the last commit"
    )
