"""One worker's Chromium, from launch to shutdown: Debian's (never a download), launched
at the first use behind the address guard's proxy (``streams/channels/browser_guard.py``),
sandboxed, never as root, with an empty environment
(``streams/channels/browser_process.py``); relaunched after a crash (counted:
``ledger_worker_browser_restarts``); closed with Playwright when the worker stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from events.addresses import AddressPolicy
from events.channels.browser_targets import BrowserSettings
from streams.channels.browser_errors import NotSubmitted, first_line
from streams.channels.browser_guard import (
    LAUNCH_ARGS,
    BrowserGuard,
    GuardListener,
    proxy_settings,
)
from streams.channels.browser_process import ChromiumProcess

if TYPE_CHECKING:
    from playwright.async_api import Browser, Playwright

    from streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)

CHROMIUM_ARGS = [
    "--headless",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CLOSE_TIMEOUT_S = 3.0
LAUNCH_TIMEOUT_S = 30.0


class Chromium:
    """A worker's one Chromium: ``running()`` launches it when there is none (or it
    crashed), ``watch()`` guards one attempt's connections, ``aclose()`` ends it."""

    def __init__(
        self,
        config: BrowserSettings,
        policy: AddressPolicy,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._launch_lock = asyncio.Lock()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._launches = 0
        # The HTTP channels' address policy, for every connection Chromium makes.
        self._guard = BrowserGuard(policy)
        self._process = ChromiumProcess(
            config.executable_path, run_as=config.run_as, sandbox=config.sandbox
        )

    @property
    def launches(self) -> int:
        """How many times this worker launched Chromium (the first launch included)."""
        return self._launches

    def watch(self) -> AbstractAsyncContextManager[GuardListener]:
        """The address guard of one attempt: its proxy, and what it refused."""
        return self._guard.watch()

    async def running(self) -> Browser:
        """The running browser, launched first if there is none or it went away; raises
        ``NotSubmitted`` when Chromium (or the guard in front of it) does not start."""
        async with self._launch_lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            from playwright.async_api import async_playwright

            if self._browser is not None:
                # It crashed or was closed under us: a new one, and the metrics say so.
                log.warning("browser channel: Chromium went away; launching a new one")
                if self._metrics is not None:
                    self._metrics.browser_restarts.inc()
                with contextlib.suppress(Exception):
                    await self._browser.close()
                self._browser = None
            if self._playwright is None:
                self._playwright = await async_playwright().start()
            try:
                proxy = proxy_settings(await self._guard.start())
                self._browser = await self._playwright.chromium.launch(
                    **self._process.launch_options(),
                    proxy=proxy,
                    args=[*CHROMIUM_ARGS, *LAUNCH_ARGS],
                    timeout=LAUNCH_TIMEOUT_S * 1000,
                )
            except Exception as exc:
                raise NotSubmitted(f"Chromium did not start: {first_line(exc)}") from exc
            self._launches += 1
            return self._browser

    async def aclose(self) -> None:
        """Close the browser and Playwright (the worker is stopping)."""
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._browser.close(), CLOSE_TIMEOUT_S)
            self._browser = None
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._playwright.stop(), CLOSE_TIMEOUT_S)
            self._playwright = None
        await self._guard.aclose()
        self._process.cleanup()
