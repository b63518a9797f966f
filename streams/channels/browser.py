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
(``streams/channels/browser_login.py``). The whole attempt runs under the hard send deadline.

One Chromium per worker (Debian's, never a download), launched at the first send and
relaunched after a crash (counted: ``ledger_worker_browser_restarts``); attempts in flight
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
import contextlib
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from pydantic import JsonValue

from config.settings import address_policy
from events.addresses import AddressPolicy
from events.channels.browser_targets import (
    BrowserSettings,
    Click,
    Fill,
    KeyCarrier,
    PageOutcome,
    Target,
    TargetLookup,
    WaitFor,
)
from events.errors import ConfigError
from events.keys import canonical_json
from events.outcomes import ErrorClass, LookupOutcome
from events.private_files import private_dir, private_file
from events.redaction import redacted_text
from streams.channels.base import (
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.browser_guard import (
    LAUNCH_ARGS,
    BrowserGuard,
    GuardListener,
    proxy_settings,
)
from streams.channels.browser_login import LoginPage, check_not_login
from streams.channels.browser_lookup import list_lookup, search_lookup
from streams.channels.browser_process import ChromiumProcess, unprivileged_user
from streams.channels.write_guard import SendRefused, WriteGuard, unguarded

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Playwright

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
POLL_S = 0.05
SCREENSHOT_TIMEOUT_MS = 2000
CLOSE_TIMEOUT_S = 3.0
LAUNCH_TIMEOUT_S = 30.0
REFUSALS_CHARS = 400


class NotSubmitted(Exception):
    """A step before the submit failed: nothing was submitted."""


class PageLost(Exception):
    """The page, its navigation or the browser went away after the submit began."""


class Blocked(NotSubmitted):
    """The address policy refused the page the attempt had to open: nothing submitted."""


def _with_param(url: str, name: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    query.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _field_text(value: JsonValue) -> str:
    return value if isinstance(value, str) else canonical_json(value).decode()


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]


class _Attempt:
    """What one attempt opened, to screenshot and close whatever happened."""

    def __init__(self) -> None:
        self.context: Any = None
        self.page: Page | None = None
        self.guard: GuardListener | None = None

    def refusals(self) -> str:
        """What the address guard refused during the attempt ("" if nothing)."""
        if self.guard is None or not self.guard.refusals:
            return ""
        return "; ".join(dict.fromkeys(self.guard.refusals))[:REFUSALS_CHARS]


def _describe(step: Fill | Click | WaitFor) -> str:
    if isinstance(step, Fill):
        return f"fill {step.fill} with {step.field}"
    if isinstance(step, Click):
        return f"click {step.click}"
    return f"wait for {step.wait}"


def _one_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


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
        self._launch_lock = asyncio.Lock()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._launches = 0
        self._closing = False
        # The HTTP channels' address policy, for every connection Chromium makes.
        self._guard = BrowserGuard(policy)
        self._process = ChromiumProcess(
            config.executable_path, run_as=config.run_as, sandbox=config.sandbox
        )

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
        return self._launches

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
        missing = self._missing_fields(target, delivery.payload)
        if missing is not None:
            return SendResult(
                SendOutcome.REJECTED, f"not sent: {missing}", ErrorClass.REFUSED_REQUEST
            )
        guard = guard if guard is not None else unguarded()
        what = f"browser {delivery.recipient} ({target.start_url})"
        attempt = _Attempt()
        async with self._slots:
            try:
                # Launching Chromium (the first send, or after a crash) submits nothing, so
                # it is outside the attempt's deadline; the lease rule still runs before
                # the submit.
                browser = await self._running_browser()
                async with self._guard.watch() as attempt.guard, asyncio.timeout(self._deadline_s):
                    result = await self._attempt(attempt, browser, target, delivery, guard)
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
            return await self._finish(result, attempt, delivery)

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
        step_s = min(self._config.step_timeout_s, self._deadline_s / 2)
        async with self._slots:
            try:
                browser = await self._running_browser()
                async with self._guard.watch() as listener, asyncio.timeout(self._deadline_s):
                    found = await search_lookup(
                        browser, search, key, step_timeout_s=step_s, proxy=listener.proxy()
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
                    LookupOutcome.LOOKUP_ERROR, f"search {search.url}: {_one_line(exc)}"
                )

    async def aclose(self) -> None:
        """Close the browser and Playwright (the worker is stopping)."""
        self._closing = True
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

    # -- one attempt --------------------------------------------------------------------------

    def _missing_fields(self, target: Target, payload: JsonValue) -> str | None:
        needed = [step.field for step in target.steps if isinstance(step, Fill)]
        if not needed:
            return None
        if not isinstance(payload, dict):
            return f"the payload must be an object with the fields {', '.join(needed)}"
        missing = [name for name in needed if name not in payload]
        return f"the payload has no field {', '.join(missing)}" if missing else None

    async def _running_browser(self) -> Browser:
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
                raise NotSubmitted(f"Chromium did not start: {_one_line(exc)}") from exc
            self._launches += 1
            return self._browser

    async def _attempt(
        self,
        attempt: _Attempt,
        browser: Browser,
        target: Target,
        delivery: OutboundDelivery,
        guard: WriteGuard,
    ) -> SendResult:
        what = f"browser {delivery.recipient} ({target.start_url})"
        try:
            assert attempt.guard is not None
            attempt.context = await browser.new_context(proxy=attempt.guard.proxy())
            step_s = min(self._config.step_timeout_s, self._deadline_s / 2)
            attempt.context.set_default_timeout(step_s * 1000)
            page = attempt.page = await attempt.context.new_page()
            url = target.start_url
            token = str(delivery.fencing_token)
            for carrier, value in (
                (target.key, delivery.idempotency_key),
                (target.fencing_token, token),
            ):
                if carrier is not None and carrier.param is not None:
                    url = _with_param(url, carrier.param, value)
            try:
                response = await page.goto(url)
            except Exception as exc:
                if refused := attempt.refusals():
                    raise Blocked(f"GET {url}: {refused}") from exc
                raise
            await check_not_login(page, target.login)
            if response is not None and not response.ok:
                raise NotSubmitted(f"GET {url} -> {response.status}")
            for number, step in enumerate(target.steps, 1):
                try:
                    await self._step(page, step, delivery.payload)
                except Exception as exc:
                    await check_not_login(page, target.login)
                    raise NotSubmitted(
                        f"step {number} {_describe(step)}: {_one_line(exc)}"
                    ) from exc
            await _put(page, target.key, delivery.idempotency_key, "the idempotency key")
            if target.fencing_token is not None:
                await _put(page, target.fencing_token, token, "the fencing token")
            try:
                await page.wait_for_selector(target.submit, state="visible")
            except Exception as exc:
                await check_not_login(page, target.login)
                raise NotSubmitted(f"submit {target.submit}: {_one_line(exc)}") from exc
            await check_not_login(page, target.login)
        except (NotSubmitted, LoginPage):
            raise
        except TimeoutError:
            raise
        except Exception as exc:
            raise NotSubmitted(_one_line(exc)) from exc
        lost = asyncio.Event()
        why: list[str] = []

        def failed(req: Any) -> None:
            if req.is_navigation_request():
                why.append(f"the submit's navigation failed: {req.failure}")
                lost.set()

        def crashed(*_args: object) -> None:
            why.append("the page crashed")
            lost.set()

        # After the submit only the deadline bounds the wait.
        page.set_default_timeout(self._deadline_s * 1000)
        page.on("requestfailed", failed)
        page.on("crash", crashed)
        browser.on("disconnected", crashed)
        try:
            # The lease rule, right before the one irreversible step (raises SendRefused).
            guard.before_first_byte()
            await page.click(target.submit, no_wait_after=True)
            return await self._after_submit(page, target, lost, why, what)
        finally:
            # The browser outlives the attempt: its listeners must not pile up.
            browser.remove_listener("disconnected", crashed)

    async def _step(self, page: Page, step: Fill | Click | WaitFor, payload: JsonValue) -> None:
        if isinstance(step, Fill):
            assert isinstance(payload, dict)
            await page.fill(step.fill, _field_text(payload[step.field]))
        elif isinstance(step, Click):
            await page.click(step.click)
        else:
            await page.wait_for_selector(step.wait, state="attached")

    async def _after_submit(
        self, page: Page, target: Target, lost: asyncio.Event, why: list[str], what: str
    ) -> SendResult:
        confirmation = target.confirmation
        while True:
            if lost.is_set():
                raise PageLost("; ".join(why))
            with contextlib.suppress(Exception):  # the page is navigating: look again
                found = await page.query_selector(confirmation.selector)
                if found is not None:
                    value = await found.get_attribute(confirmation.attribute)
                    if value:
                        return SendResult(
                            SendOutcome.CONFIRMED,
                            f"{what}: confirmed as {value[:200]} ({confirmation.selector})",
                            provider_message_id=value[:500],
                            provider_status="accepted",
                        )
                for rule in target.errors:
                    if await page.query_selector(rule.selector) is not None:
                        return self._error_page(page, rule.selector, rule.outcome, what)
            if page.url.startswith("chrome-error://"):
                raise PageLost("the browser shows its own error page (no answer)")
            await asyncio.sleep(POLL_S)

    def _error_page(self, page: Page, selector: str, outcome: PageOutcome, what: str) -> SendResult:
        evidence = f"{what}: after the submit the page shows {selector} ({page.url})"
        if outcome is PageOutcome.REJECTED:
            return SendResult(SendOutcome.REJECTED, evidence, ErrorClass.PROVIDER_REJECTED)
        return SendResult(SendOutcome.UNKNOWN, evidence, ErrorClass.ERROR_PAGE)

    def _out_of_time(self, guard: WriteGuard, what: str) -> SendResult:
        deadline = f"{what}: no confirmation within the {self._deadline_s:g}s deadline"
        if guard.written:
            return SendResult(SendOutcome.UNKNOWN, deadline, ErrorClass.TIMEOUT_AFTER_WRITE)
        return SendResult(
            SendOutcome.NOT_SENT, f"{deadline}, before the submit", ErrorClass.DEADLINE_BEFORE_WRITE
        )

    def _lost(self, exc: Exception, guard: WriteGuard, what: str) -> SendResult:
        detail = f"{what}: {_one_line(exc)}"
        if guard.written:
            return SendResult(SendOutcome.UNKNOWN, detail, ErrorClass.RESET_AFTER_WRITE)
        return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.PAGE_STEP_FAILED)

    async def _finish(
        self, result: SendResult, attempt: _Attempt, delivery: OutboundDelivery
    ) -> SendResult:
        """Screenshot a failed attempt (named in the evidence), then close its context.
        The evidence is kept forever: URLs in it (the target's ``start_url``, the page's,
        Playwright's messages) lose their credentials first."""
        refused = attempt.refusals()
        if refused and refused not in result.evidence:
            result = replace(result, evidence=f"{result.evidence} ({refused})")
        result = replace(result, evidence=redacted_text(result.evidence))
        if result.outcome is not SendOutcome.CONFIRMED and attempt.page is not None:
            name = (
                f"{_safe_name(delivery.recipient)}-{delivery.idempotency_key[:16]}"
                f"-t{delivery.fencing_token}-a{delivery.attempt}.png"
            )
            path = self._screenshots / name
            try:
                # A screenshot may show an internal page: owner only.
                private_dir(path.parent)
                await attempt.page.screenshot(path=str(path), timeout=SCREENSHOT_TIMEOUT_MS)
                private_file(path)
            except Exception as exc:  # noqa: BLE001 - the page may be gone with the browser
                log.info("no screenshot of %s: %s", delivery.idempotency_key, _one_line(exc))
            else:
                result = replace(result, evidence=f"{result.evidence} (screenshot {path})")
        if attempt.context is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(attempt.context.close(), CLOSE_TIMEOUT_S)
        return result


async def _put(page: Page, carrier: KeyCarrier, value: str, what: str) -> None:
    """Set a (hidden) input's value; a URL parameter was set with the start URL."""
    if carrier.input is None:
        return
    found = await page.query_selector(carrier.input)
    if found is None:
        raise NotSubmitted(f"no element {carrier.input} for {what}")
    await found.evaluate("(element, value) => { element.value = value; }", value)


def adapter(build: AdapterBuild) -> BrowserChannel:
    """The browser channel's adapter factory (its plugin: events/channels/builtin.py)."""
    config = build.config if isinstance(build.config, BrowserSettings) else BrowserSettings()
    if config.targets:
        try:
            import playwright.async_api  # noqa: F401 - checked at start, used lazily
        except ImportError:
            raise ConfigError(
                "LEDGER_CHANNEL_SETTINGS[browser] declares targets but Playwright is missing",
                "pip install 'delivery-ledger[browser]' (Chromium: scripts/chromium)",
            ) from None
        if not config.executable_path.exists():
            raise ConfigError(
                f"LEDGER_CHANNEL_SETTINGS[browser].executable_path: {config.executable_path} "
                "does not exist",
                "install Debian's chromium (scripts/chromium); no browser is downloaded",
            )
        unprivileged_user(config.run_as)  # root without the user to run Chromium as: stop
    screenshots = config.screenshots_dir or build.settings.data_dir / "browser-screenshots"
    return BrowserChannel(
        build.client,
        config,
        deadline_s=build.deadline_s,
        screenshots=screenshots,
        policy=address_policy(build.settings),
        metrics=build.metrics,
    )
