"""A dashboard over a live stack's projection (workers, ``ledger project``, a receiver): the
server on a free loopback port, behind a token, on the real clock."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from pydantic import SecretStr

from config.settings import Settings, changed
from events.errors import LedgerError
from ledger.stack import settings_env
from projections import open_store
from projections.dashboard import serve
from projections.store import Store
from tests.fixtures.worker import wait_for

TOKEN = secrets.token_urlsafe(32)


@dataclass(frozen=True)
class LiveDashboard:
    """A serving dashboard: its base URL and settings."""

    url: str
    settings: Settings

    @property
    def origin(self) -> str:
        return self.url.rstrip("/")


@asynccontextmanager
async def live_dashboard(settings: Settings, dsn: str) -> AsyncIterator[LiveDashboard]:
    """Serve the projection at ``dsn`` (once ``ledger project`` has created it), refreshing
    every half second, behind ``TOKEN``."""
    ours = changed(
        settings,
        {"dashboard.port": 0, "dashboard.refresh_s": 0.5, "dashboard.token": SecretStr(TOKEN)},
    )
    store: Store | None = None

    async def opened() -> bool:
        nonlocal store
        candidate = open_store(dsn)
        try:
            candidate.prepare("read")
        except LedgerError:  # not created yet by the projector
            candidate.close()
            return False
        store = candidate
        return True

    await wait_for(opened, 60, "the live projection's tables")
    assert store is not None
    stop = asyncio.Event()
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(ours, store, stop, ready=listening.set_result))
    try:
        yield LiveDashboard(await asyncio.wait_for(listening, 30), ours)
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
        store.close()


def ledger(settings: Settings, *args: str) -> str:
    """``ledger ARGS`` as an operator (ana) runs it; its output (it must succeed)."""
    env = settings_env(settings)
    env["LEDGER_OPERATOR"] = "ana"
    done = subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout
