"""The receiver kit's PostgreSQL store rides out its database restarting (issue 24, item 2).

The kit is served by aiohttp over a PostgreSQL cluster of this test's own, which is
restarted twice while signed requests keep arriving (a sender that retries on 503, as the
ledger's worker does): every request is answered 200 or 503 (never a 500), every key's
handler runs exactly once, duplicates are answered from the store, lookups say done, and
the log says one line per outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest

from receiver.postgres import PostgresStore
from tests.fixtures.own_postgres import OwnPostgres
from tests.receiver.support import (
    SECRET_A,
    CountingHandler,
    aiohttp_server,
    body_of,
    kit,
    signed_headers,
    signed_lookup,
)

KEYS_PER_PHASE = 15


async def _deliver(
    client: httpx.AsyncClient, url: str, key: str, answers: list[int]
) -> dict[str, Any]:
    """POST ``key`` until it is answered 200 (bounded), as a sender retrying on 503."""
    body = body_of({"order": key})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = await client.post(
            f"{url}/hooks", content=body, headers=signed_headers(key, body, SECRET_A)
        )
        answers.append(reply.status_code)
        assert reply.status_code in (200, 503), (key, reply.status_code, reply.text)
        if reply.status_code == 200:
            data: dict[str, Any] = reply.json()
            return data
        await asyncio.sleep(0.2)
    raise AssertionError(f"{key} never answered 200")


async def test_the_kit_keeps_serving_across_two_postgres_restarts(
    own_postgres: OwnPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="receiver")
    handler = CountingHandler()
    receiver = kit(handler, PostgresStore(own_postgres.dsn))
    answers: list[int] = []
    keys: list[str] = []
    outages: list[float] = []
    async with aiohttp_server(receiver) as url, httpx.AsyncClient(timeout=30) as client:
        for phase in range(3):
            if phase:
                # Restart while requests are in flight: the requests wait, retry, or get 503.
                restarting = asyncio.create_task(asyncio.to_thread(own_postgres.restart, 2.0))
            phase_keys = [f"p{phase}-k{n}" for n in range(KEYS_PER_PHASE)]
            for key in phase_keys:
                first = await _deliver(client, url, key, answers)
                assert first["duplicate"] is False, first
                await asyncio.sleep(0.15)
            if phase:
                outages.append(await restarting)
            keys += phase_keys
            # Everything recorded so far, including before the restarts, dedupes.
            for key in keys:
                again = await _deliver(client, url, key, answers)
                assert again["duplicate"] is True, (key, again)
                assert again["id"] == f"order-{key}-1"
    assert all(handler.runs[key] == 1 for key in keys), handler.runs
    assert sum(handler.runs.values()) == len(keys)
    async with aiohttp_server(receiver) as url, httpx.AsyncClient(timeout=30) as client:
        for key in keys[::7]:
            found = await client.get(
                f"{url}/hooks/lookup/{key}", headers=signed_lookup(key, SECRET_A)
            )
            assert found.status_code == 200, found.text
            assert found.json()["status"] == "done"
    said = [r.getMessage() for r in caplog.records if r.name == "receiver"]
    unreachable = [line for line in said if "unreachable (" in line]
    back = [line for line in said if " back after " in line]
    assert len(unreachable) == 2, said  # one line per outage
    assert len(back) == 2, said
    print(
        f"restarts took {[round(s, 1) for s in outages]} s; {back}; answers 503: "
        f"{answers.count(503)} of {len(answers)}"
    )
