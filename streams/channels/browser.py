"""The browser channel: a web form submitted by headless Chromium, declared per target.

The recipient names a target (``events/channels/browser_targets.py``). One attempt: a
fresh browser context, the start URL (the key as a URL parameter where the target takes
it so), the declared steps, the key and the fencing token into their inputs, then the
write guard (the lease rule) right before the click on ``submit``, the one irreversible
step. Then the page decides: the confirmation element with its id is CONFIRMED (the id is
the provider message id); an error page is classified by the target's rules (default
UNKNOWN); a navigation that times out, a lost page or a crashed browser after the click
began is UNKNOWN, settled by the target's lookup (its list URL or its search page:
``streams/channels/browser_lookup.py``). Anything that fails before the click is NOT_SENT
with its reason; the target's login page in place of its form is ``login_page``
(``streams/channels/browser_login.py``). The whole attempt runs under the hard send deadline;
the attempt itself is ``streams/channels/browser_form.py``.

One Chromium per worker (Debian's, never a download), launched at the first send and
relaunched after a crash (counted: ``ledger_worker_browser_restarts``:
``streams/channels/browser_chromium.py``); attempts in flight
bounded by the target settings' ``concurrency``. A failed attempt leaves a screenshot under
the data dir, named in the evidence.

Every connection Chromium makes passes the HTTP channels' address policy
(``streams/channels/browser_guard.py``): a start URL, redirect or search page the policy
refuses is never opened (the attempt is REJECTED ``blocked_address``, nothing submitted),
and a page's own requests to such an address never leave. Chromium runs sandboxed, never
as root, with an empty environment (``streams/channels/browser_process.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from config.settings import address_policy
from events.addresses import AddressPolicy
from events.channels.browser_targets import BrowserSettings, TargetLookup
from events.errors import ConfigError
from events.outcomes import ErrorClass, LookupOutcome
from events.redaction import redacted_text
from streams.channels.base import (
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.browser_chromium import Chromium
from streams.channels.browser_errors import Blocked, NotSubmitted, first_line
from streams.channels.browser_form import FormAttempt, missing_fields
from streams.channels.browser_login import LoginPage
from streams.channels.browser_lookup import list_lookup, search_lookup
from streams.channels.browser_process import unprivileged_user
from streams.channels.write_guard import SendRefused, WriteGuard, unguarded

if TYPE_CHECKING:
    from streams.metrics import WorkerMetrics


class BrowserChannel:
    """Submits declared web forms with Playwright; looks a key up where the target can."""

    name = "browser"

    def __init__(
        self,
        client: httpx.AsyncClient,
        config: BrowserSettings,
        *,
        deadline_s: float,
        screenshots: Path,
        policy: AddressPolicy,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self._deadline_s = deadline_s
        self._screenshots = screenshots
        self._metrics = metrics
        self._slots = asyncio.Semaphore(config.concurrency)
        self._chromium = Chromium(config, policy, metrics)

    # -- the channel contract ---------------------------------------------------------------

    def receiver_dedupes(self, recipient: str) -> bool:
        """False: a form submitted twice is two submissions."""
        del recipient
        return False

    def settle_s(self, recipient: str) -> float | None:
        """The target's declared settle window, else the default."""
        target = self._config.targets.get(recipient)
        return target.settle_s if target is not None else None

    @property
    def launches(self) -> int:
        """How many times this worker launched Chromium (the first launch included)."""
        return self._chromium.launches

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """One attempt at the target's form (see the module docstring for the outcomes)."""
        target = self._config.targets.get(delivery.recipient)
        if target is None:
            known = ", ".join(sorted(self._config.targets)) or "none"
            return SendResult(
                SendOutcome.REJECTED,
                f"not sent: no browser target {delivery.recipient!r} (declared: {known})",
                ErrorClass.INVALID_RECIPIENT,
            )
        missing = missing_fields(target, delivery.payload)
        if missing is not None:
            return SendResult(
                SendOutcome.REJECTED, f"not sent: {missing}", ErrorClass.REFUSED_REQUEST
            )
        guard = guard if guard is not None else unguarded()
        attempt = FormAttempt(
            target,
            delivery,
            step_timeout_s=self._step_s,
            deadline_s=self._deadline_s,
            screenshots=self._screenshots,
        )
        what = attempt.what
        async with self._slots:
            try:
                # Launching Chromium (the first send, or after a crash) submits nothing, so
                # it is outside the attempt's deadline; the lease rule still runs before
                # the submit.
                browser = await self._chromium.running()
                async with (
                    self._chromium.watch() as attempt.guard,
                    asyncio.timeout(self._deadline_s),
                ):
                    result = await attempt.submit(browser, guard)
            except Blocked as exc:
                evidence = f"{what}: not submitted: {exc}"
                result = SendResult(SendOutcome.REJECTED, evidence, ErrorClass.BLOCKED_ADDRESS)
            except TimeoutError:
                result = self._out_of_time(guard, what)
            except LoginPage as exc:
                result = SendResult(
                    SendOutcome.NOT_SENT, f"{what}: not submitted: {exc}", ErrorClass.LOGIN_PAGE
                )
            except SendRefused as exc:
                result = SendResult(
                    SendOutcome.NOT_SENT, f"{what}: not sent: {exc.reason}", ErrorClass.FENCED
                )
            except NotSubmitted as exc:
                result = SendResult(
                    SendOutcome.NOT_SENT,
                    f"{what}: not submitted: {exc}",
                    ErrorClass.PAGE_STEP_FAILED,
                )
            except Exception as exc:  # noqa: BLE001 - playwright's errors: a lost page or browser
                result = self._lost(exc, guard, what)
            return await attempt.finish(result)

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """Ask the target whether it accepted the key: its list URL, or its search page in
        Chromium (``streams/channels/browser_lookup.py``)."""
        target = self._config.targets.get(delivery.recipient)
        if target is None or target.lookup is None:
            return LookupResult(
                LookupOutcome.UNSUPPORTED, f"browser target {delivery.recipient!r}: no lookup"
            )
        found = await self._lookup(target.lookup, delivery.idempotency_key)
        return replace(found, evidence=redacted_text(found.evidence))

    async def _lookup(self, lookup: TargetLookup, key: str) -> LookupResult:
        search = lookup.search
        if search is None:
            return await list_lookup(self._client, lookup, key, deadline_s=self._deadline_s)
        async with self._slots:
            try:
                browser = await self._chromium.running()
                async with self._chromium.watch() as listener, asyncio.timeout(self._deadline_s):
                    found = await search_lookup(
                        browser, search, key, step_timeout_s=self._step_s, proxy=listener.proxy()
                    )
                    if found.outcome == LookupOutcome.LOOKUP_ERROR and listener.refusals:
                        refused = "; ".join(dict.fromkeys(listener.refusals))
                        return replace(found, evidence=f"{found.evidence} ({refused})"[:1000])
                    return found
            except TimeoutError:
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR,
                    f"search {search.url}: no answer within {self._deadline_s:g}s",
                )
            except (NotSubmitted, OSError) as exc:  # Chromium or the guard did not start
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR, f"search {search.url}: {first_line(exc)}"
                )

    async def aclose(self) -> None:
        """Close the browser and Playwright (the worker is stopping)."""
        await self._chromium.aclose()

    # -- outcomes -----------------------------------------------------------------------------

    @property
    def _step_s(self) -> float:
        """How long one page step may take: the target settings' step timeout, at most half
        the deadline."""
        return min(self._config.step_timeout_s, self._deadline_s / 2)

    def _out_of_time(self, guard: WriteGuard, what: str) -> SendResult:
        deadline = f"{what}: no confirmation within the {self._deadline_s:g}s deadline"
        if guard.written:
            return SendResult(SendOutcome.UNKNOWN, deadline, ErrorClass.TIMEOUT_AFTER_WRITE)
        return SendResult(
            SendOutcome.NOT_SENT, f"{deadline}, before the submit", ErrorClass.DEADLINE_BEFORE_WRITE
        )

    def _lost(self, exc: Exception, guard: WriteGuard, what: str) -> SendResult:
        detail = f"{what}: {first_line(exc)}"
        if guard.written:
            return SendResult(SendOutcome.UNKNOWN, detail, ErrorClass.RESET_AFTER_WRITE)
        return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.PAGE_STEP_FAILED)


def adapter(build: AdapterBuild) -> BrowserChannel:
    """The browser channel's adapter factory (its plugin: events/channels/builtin.py)."""
    config = build.config if isinstance(build.config, BrowserSettings) else BrowserSettings()
    if config.targets:
        try:
            import playwright.async_api  # noqa: F401 - checked at start, used lazily
        except ImportError:
            raise ConfigError(
                "LEDGER_CHANNELS__SETTINGS[browser] declares targets but Playwright is missing",
                "pip install 'delivery-ledger[browser]' (Chromium: scripts/chromium)",
            ) from None
        if not config.executable_path.exists():
            raise ConfigError(
                f"LEDGER_CHANNELS__SETTINGS[browser].executable_path: {config.executable_path} "
                "does not exist",
                "install Debian's chromium (scripts/chromium); no browser is downloaded",
            )
        unprivileged_user(config.run_as)  # root without the user to run Chromium as: stop
    screenshots = config.screenshots_dir or build.data_dir / "browser-screenshots"
    return BrowserChannel(
        build.client,
        config,
        deadline_s=build.deadline_s,
        screenshots=screenshots,
        policy=address_policy(build.channels),
        metrics=build.metrics,
    )
