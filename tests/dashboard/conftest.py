"""A live stack for dashboard tests: real broker, a SQLite projection, the server, Chromium.

The scenario is ``tests.projections.scenarios.incident_log``: three runs covering every
delivery state and every dashboard question, published to Kafka in one transaction and
folded into SQLite with the projections library. The server's clock is fixed an hour
after the scenario, so every number the page shows is known in advance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from playwright.async_api import Browser, async_playwright

from config.settings import Settings, changed
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from projections import open_store
from projections.dashboard import serve
from projections.projector import project
from projections.store import Store
from tests.projections.scenarios import T0, incident_log, publish

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NOW = T0 + timedelta(hours=1)
Events = Sequence[AnyExecutionEvent | AnyDeliveryEvent]


async def project_all(settings: Settings, dsn: str) -> None:
    """Fold everything now in the log into the projection at ``dsn`` (created if empty)."""
    store = open_store(dsn)
    try:
        store.prepare("project")
        await project(settings, store, until="end")
    finally:
        store.close()


@dataclass
class Stack:
    """The published scenario, its projection, and a dashboard serving it."""

    settings: Settings
    dsn: str
    url: str = ""
    store: Store | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def append(self, events: Events, raw: list[tuple[str, bytes]] | None = None) -> None:
        """Append events to the log and fold them into the projection."""
        await publish(self.settings, events, raw)
        await project_all(self.settings, self.dsn)

    def read(self) -> Store:
        """A read-ready store over the projection (close it after use)."""
        store = open_store(self.dsn)
        store.prepare("read")
        return store


async def start_stack(settings: Settings, *, clock_at: datetime = NOW) -> AsyncIterator[Stack]:
    """Publish the scenario, project it, serve the dashboard on a free loopback port."""
    dsn = f"sqlite://{settings.data_dir / 'dashboard.sqlite3'}"
    stack = Stack(changed(settings, {"dashboard.port": 0}), dsn)
    await stack.append(incident_log())
    stack.store = stack.read()
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(
            stack.settings,
            stack.store,
            stack.stop,
            clock=lambda: clock_at,
            ready=listening.set_result,
        )
    )
    try:
        stack.url = await asyncio.wait_for(listening, 30)
        yield stack
    finally:
        stack.stop.set()
        await asyncio.wait_for(server, 30)
        stack.store.close()


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    """The live stack, refreshing every half second so tests see changes quickly."""
    fast = changed(settings, {"dashboard.refresh_s": 0.5})
    async for running in start_stack(fast):
        yield running


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright (never Playwright's own download)."""
    async with async_playwright() as driver:
        chromium = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()
