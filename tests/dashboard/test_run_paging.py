"""A run with 20,000 deliveries: its page and its JSON come a page at a time, and the
server keeps answering everyone else meanwhile; a search for any text answers 200.

The projection is filled through the real fold (``Store.apply_records``, as
bench/dashboard.py does), served by the real dashboard on loopback, read over HTTP and
in Chromium."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser

from config.settings import Settings
from events import RunStarted, RunSucceeded
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from events.ports import free_port
from projections import open_store
from projections.dashboard import serve
from projections.fold import Position
from projections.records import LogRecord
from tests.projections.scenarios import P, at, requested

BIG = "run-big"
DELIVERIES = 20_000


def fill(dsn: str) -> list[str]:
    """One run of ``DELIVERIES`` deliveries, folded into an empty projection; their keys
    in the run page's order."""
    store = open_store(dsn)
    store.prepare("rebuild", replace=True)
    events: list[AnyExecutionEvent | AnyDeliveryEvent] = [
        RunStarted(run_id=BIG, agent="bench", producer=P, occurred_at=at(0)),
        RunSucceeded(run_id=BIG, result_hash="h", producer=P, occurred_at=at(1)),
    ]
    wanted = [requested(BIG, n, 2 + n / 1000) for n in range(DELIVERIES)]
    events += wanted
    records = [LogRecord(Position("t", 0, i), e) for i, e in enumerate(events)]
    for start in range(0, len(records), 5000):
        store.apply_records(records[start : start + 5000], frozenset())
    store.close()
    return [r.idempotency_key for r in wanted]


@pytest.fixture(scope="module")
async def big(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, list[str]]]:
    root: Path = tmp_path_factory.mktemp("big-run")
    dsn = f"sqlite://{root / 'projection.sqlite3'}"
    keys = await asyncio.to_thread(fill, dsn)
    settings = Settings(dashboard={"port": free_port()}, data_dir=root)
    store = open_store(dsn)
    store.prepare("read")
    stop = asyncio.Event()
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(settings, store, stop, ready=listening.set_result))
    try:
        yield await asyncio.wait_for(listening, 30), keys
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
        store.close()


@pytest.mark.parametrize(
    "query",
    ["\U0010ffff", "abcd\U0010ffff", "\U0010ffff" * 5, "run-\x00x", "x" * 5000, "run-b"],
)
async def test_a_search_for_any_text_answers(big: tuple[str, list[str]], query: str) -> None:
    url, _ = big
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        answer = await http.get("/api/search", params={"q": query})
    assert answer.status_code == 200, answer.text
    found = answer.json()["matches"]
    assert [m["run_id"] for m in found] == ([BIG] if query == "run-b" else [])


async def test_a_big_run_comes_a_page_at_a_time(big: tuple[str, list[str]]) -> None:
    url, keys = big
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        first = await http.get(f"/api/runs/{BIG}")
        assert first.status_code == 200
        assert len(first.content) < 512 * 1024, len(first.content)
        data = first.json()
        assert data["page"] == {
            "offset": 0,
            "limit": 100,
            "total": DELIVERIES,
            "next_offset": 100,
            "previous_offset": None,
        }
        assert [d["idempotency_key"] for d in data["answers"]["deliveries"]] == keys[:100]
        assert len(data["deliveries"]) == 100
        last = (await http.get(f"/api/runs/{BIG}", params={"offset": 19_950})).json()
        assert [d["delivery"]["idempotency_key"] for d in last["deliveries"]] == keys[19_950:]
        assert (last["page"]["next_offset"], last["page"]["previous_offset"]) == (None, 19_850)
        # A limit beyond the bound is cut to it; a key finds the page that holds it.
        wide = (await http.get(f"/api/runs/{BIG}", params={"limit": 10**6})).json()
        assert len(wide["deliveries"]) == wide["page"]["limit"] == 500
        held = (await http.get(f"/api/runs/{BIG}", params={"key": keys[15_123]})).json()
        assert held["page"]["offset"] == 15_100
        page_keys = [d["delivery"]["idempotency_key"] for d in held["deliveries"]]
        assert keys[15_123] in page_keys
        bad = await http.get(f"/api/runs/{BIG}", params={"offset": "x"})
        assert bad.status_code == 400


async def test_the_server_answers_others_while_big_pages_are_read(
    big: tuple[str, list[str]],
) -> None:
    url, _ = big
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await http.get(f"/api/runs/{BIG}")  # warm
        pages = [
            asyncio.create_task(http.get(f"/api/runs/{BIG}", params={"offset": n * 100}))
            for n in range(4)
        ]
        await asyncio.sleep(0.5)  # the pages are being read
        began = time.monotonic()
        health = await http.get("/healthz")
        search = await http.get("/api/search", params={"q": "run-big"})
        waited = time.monotonic() - began
        answered = await asyncio.gather(*pages)
    assert health.status_code == search.status_code == 200
    assert all(a.status_code == 200 for a in answered)
    assert waited < 2.0, f"others waited {waited:.1f}s behind the big run"


async def test_the_run_page_in_chromium_pages_through_the_deliveries(
    big: tuple[str, list[str]], browser: Browser
) -> None:
    url, keys = big
    page = await browser.new_page()
    try:
        await page.goto(f"{url}runs/{BIG}")
        await page.wait_for_selector("#run-range")
        assert (await page.inner_text("#run-range")).strip() == "deliveries 1\u2013100 of 20,000"
        assert await page.locator("#answer-keys li").count() == 100
        await page.click("#run-next")
        await page.locator("#run-range", has_text="101\u2013200").wait_for()
        shown = await page.locator("#answer-keys code.key").all_inner_texts()
        assert shown == keys[100:200]
    finally:
        await page.close()
