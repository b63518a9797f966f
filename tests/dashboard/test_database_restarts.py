"""The dashboard answers again after its PostgreSQL projection restarts (issue 24, item 2).

The incident scenario projected into a PostgreSQL cluster of this test's own, the
dashboard serving it; the cluster is restarted twice: the dashboard keeps running,
answers 200 or 503 (never a 500) meanwhile, and afterwards the same numbers as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest

from config.settings import Settings, changed
from projections import open_store
from projections.dashboard import serve
from tests.dashboard.conftest import NOW, project_all
from tests.fixtures.own_postgres import OwnPostgres
from tests.projections.scenarios import incident_log, publish


async def _overview(client: httpx.AsyncClient, url: str, answers: list[int]) -> Any:
    """The overview, once the dashboard answers 200 (bounded)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = await client.get(f"{url}api/overview")
        answers.append(reply.status_code)
        assert reply.status_code in (200, 503), reply.text
        if reply.status_code == 200:
            return reply.json()
        await asyncio.sleep(0.3)
    raise AssertionError("the dashboard did not answer again within 30 s")


async def test_the_dashboard_answers_again_after_postgres_restarts(
    settings: Settings, own_postgres: OwnPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ledger.dashboard")
    await publish(settings, incident_log())
    await project_all(settings, own_postgres.dsn)
    store = open_store(own_postgres.dsn)
    store.prepare("read")
    served = changed(settings, {"dashboard.port": 0})
    stop = asyncio.Event()
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(served, store, stop, clock=lambda: NOW, ready=listening.set_result)
    )
    answers: list[int] = []
    try:
        url = await asyncio.wait_for(listening, 30)
        async with httpx.AsyncClient(timeout=30) as client:
            before = await _overview(client, url, answers)
            for _ in range(2):
                # Asked while the database is down: answers wait, or 503, never a 500.
                restarting = asyncio.create_task(asyncio.to_thread(own_postgres.restart, 2.0))
                while not restarting.done():
                    await _overview(client, url, answers)
                    await asyncio.sleep(0.2)
                await restarting
                after = await _overview(client, url, answers)
                assert not server.done()
                after.pop("generated_at", None)
                before.pop("generated_at", None)
                assert after == before
    finally:
        stop.set()
        await server
        store.close()
    said = [r.getMessage() for r in caplog.records if r.name == "ledger.dashboard"]
    assert len([line for line in said if "unreachable (" in line]) == 2, said
    assert len([line for line in said if " back after " in line]) == 2, said
    print(f"answers: {answers}; {said}")
