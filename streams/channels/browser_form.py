"""One attempt at a browser target's form (``events/channels/browser_targets.py``).

A fresh browser context, the start URL (the key as a URL parameter where the target takes
it so), the declared steps, the key and the fencing token into their inputs, then the
write guard (the lease rule) right before the click on ``submit``, the one irreversible
step. Then the page decides: the confirmation element with its id is CONFIRMED (the id is
the provider message id); an error page is classified by the target's rules (default
UNKNOWN). Anything that fails before the click raises ``NotSubmitted``; the target's login
page in place of its form raises ``LoginPage`` (``streams/channels/browser_login.py``); a
lost page or navigation after the click raises ``PageLost``. A failed attempt leaves a
screenshot under the data dir, named in the evidence; the context is closed either way.
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

from pydantic import JsonValue

from events.channels.browser_targets import (
    Click,
    Fill,
    KeyCarrier,
    PageOutcome,
    Target,
    WaitFor,
)
from events.keys import canonical_json
from events.outcomes import ErrorClass
from events.private_files import private_dir, private_file
from events.redaction import redacted_text
from streams.channels.base import OutboundDelivery, SendOutcome, SendResult
from streams.channels.browser_chromium import CLOSE_TIMEOUT_S
from streams.channels.browser_errors import Blocked, NotSubmitted, PageLost, first_line
from streams.channels.browser_guard import GuardListener
from streams.channels.browser_login import LoginPage, check_not_login
from streams.channels.write_guard import WriteGuard

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

log = logging.getLogger(__name__)

POLL_S = 0.05
# A screenshot waits for the page's fonts and a frame from a busy renderer: 2 s was too
# short on a loaded machine (a clean-clone CI run lost one).
SCREENSHOT_TIMEOUT_MS = 10_000
REFUSALS_CHARS = 400


def _with_param(url: str, name: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    query.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _field_text(value: JsonValue) -> str:
    return value if isinstance(value, str) else canonical_json(value).decode()


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80]


def _describe(step: Fill | Click | WaitFor) -> str:
    if isinstance(step, Fill):
        return f"fill {step.fill} with {step.field}"
    if isinstance(step, Click):
        return f"click {step.click}"
    return f"wait for {step.wait}"


def missing_fields(target: Target, payload: JsonValue) -> str | None:
    """What the payload lacks of the fields the target's steps fill (None: nothing)."""
    needed = [step.field for step in target.steps if isinstance(step, Fill)]
    if not needed:
        return None
    if not isinstance(payload, dict):
        return f"the payload must be an object with the fields {', '.join(needed)}"
    missing = [name for name in needed if name not in payload]
    return f"the payload has no field {', '.join(missing)}" if missing else None


class FormAttempt:
    """One attempt at ``target``'s form for ``delivery``: what it opened, to screenshot
    and close whatever happened."""

    def __init__(
        self,
        target: Target,
        delivery: OutboundDelivery,
        *,
        step_timeout_s: float,
        deadline_s: float,
        screenshots: Path,
    ) -> None:
        self.target = target
        self.delivery = delivery
        self.what = f"browser {delivery.recipient} ({target.start_url})"
        self._step_s = step_timeout_s
        self._deadline_s = deadline_s
        self._screenshots = screenshots
        self.context: Any = None
        self.page: Page | None = None
        self.guard: GuardListener | None = None
        self._navigated: set[tuple[str, int]] = set()  # the main frame's (host, port)s

    def refusals(self) -> str:
        """What the address guard refused during the attempt ("" if nothing)."""
        if self.guard is None or not self.guard.refusals:
            return ""
        return "; ".join(dict.fromkeys(self.guard.refusals))[:REFUSALS_CHARS]

    def navigation_refused(self) -> bool:
        """Whether the address guard refused a place the page itself was navigated to (the
        start URL, or where it redirected): not only something the page asked for. A page
        whose iframe was refused and whose load then timed out is a failed step, not a
        blocked address."""
        if self.guard is None:
            return False
        return not self._navigated.isdisjoint(self.guard.refused_at)

    def _navigating(self, request: Any) -> None:
        if request.is_navigation_request() and request.frame.parent_frame is None:
            self._navigated.add(_host_port(request.url))

    async def submit(self, browser: Browser, guard: WriteGuard) -> SendResult:
        """Fill the form, pass the write guard, submit, and read what the page says."""
        try:
            page = await self._fill(browser)
        except (NotSubmitted, LoginPage):
            raise
        except TimeoutError:
            raise
        except Exception as exc:
            raise NotSubmitted(first_line(exc)) from exc
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
            await page.click(self.target.submit, no_wait_after=True)
            return await self._after_submit(page, lost, why)
        finally:
            # The browser outlives the attempt: its listeners must not pile up.
            browser.remove_listener("disconnected", crashed)

    async def _fill(self, browser: Browser) -> Page:
        """Open the form in a fresh context and fill it, up to a visible submit button."""
        target, delivery = self.target, self.delivery
        assert self.guard is not None
        self.context = await browser.new_context(proxy=self.guard.proxy())
        self.context.set_default_timeout(self._step_s * 1000)
        page: Page = await self.context.new_page()
        self.page = page
        page.on("request", self._navigating)
        url = target.start_url
        token = str(delivery.fencing_token)
        for carrier, value in (
            (target.key, delivery.idempotency_key),
            (target.fencing_token, token),
        ):
            if carrier is not None and carrier.param is not None:
                url = _with_param(url, carrier.param, value)
        # The start URL is a main-frame navigation by definition: known before Playwright
        # reports its request, which may come after a fast failure of ``goto``.
        self._navigated.add(_host_port(url))
        try:
            response = await page.goto(url)
        except Exception as exc:
            if self.navigation_refused():
                raise Blocked(f"GET {url}: {self.refusals()}") from exc
            raise
        await check_not_login(page, target.login)
        if response is not None and not response.ok:
            raise NotSubmitted(f"GET {url} -> {response.status}")
        for number, step in enumerate(target.steps, 1):
            try:
                await _step(page, step, delivery.payload)
            except Exception as exc:
                await check_not_login(page, target.login)
                raise NotSubmitted(f"step {number} {_describe(step)}: {first_line(exc)}") from exc
        await _put(page, target.key, delivery.idempotency_key, "the idempotency key")
        if target.fencing_token is not None:
            await _put(page, target.fencing_token, token, "the fencing token")
        try:
            await page.wait_for_selector(target.submit, state="visible")
        except Exception as exc:
            await check_not_login(page, target.login)
            raise NotSubmitted(f"submit {target.submit}: {first_line(exc)}") from exc
        await check_not_login(page, target.login)
        return page

    async def _after_submit(self, page: Page, lost: asyncio.Event, why: list[str]) -> SendResult:
        target, what = self.target, self.what
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
                        return _error_page(page, rule.selector, rule.outcome, what)
            if page.url.startswith("chrome-error://"):
                raise PageLost("the browser shows its own error page (no answer)")
            await asyncio.sleep(POLL_S)

    async def finish(self, result: SendResult) -> SendResult:
        """Screenshot a failed attempt (named in the evidence), then close its context.
        The evidence is kept forever: URLs in it (the target's ``start_url``, the page's,
        Playwright's messages) lose their credentials first."""
        delivery = self.delivery
        refused = self.refusals()
        if refused and refused not in result.evidence:
            result = replace(result, evidence=f"{result.evidence} ({refused})")
        result = replace(result, evidence=redacted_text(result.evidence))
        if result.outcome is not SendOutcome.CONFIRMED and self.page is not None:
            name = (
                f"{_safe_name(delivery.recipient)}-{delivery.idempotency_key[:16]}"
                f"-t{delivery.fencing_token}-a{delivery.attempt}.png"
            )
            path = self._screenshots / name
            try:
                # A screenshot may show an internal page: owner only.
                private_dir(path.parent)
                await self.page.screenshot(path=str(path), timeout=SCREENSHOT_TIMEOUT_MS)
                private_file(path)
            except Exception as exc:  # noqa: BLE001 - the page may be gone with the browser
                reason = redacted_text(first_line(exc))
                log.info("no screenshot of %s: %s", delivery.idempotency_key, reason)
                result = replace(result, evidence=f"{result.evidence} (no screenshot: {reason})")
            else:
                result = replace(result, evidence=f"{result.evidence} (screenshot {path})")
        if self.context is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.context.close(), CLOSE_TIMEOUT_S)
        return result


async def _step(page: Page, step: Fill | Click | WaitFor, payload: JsonValue) -> None:
    if isinstance(step, Fill):
        assert isinstance(payload, dict)
        await page.fill(step.fill, _field_text(payload[step.field]))
    elif isinstance(step, Click):
        await page.click(step.click)
    else:
        await page.wait_for_selector(step.wait, state="attached")


def _error_page(page: Page, selector: str, outcome: PageOutcome, what: str) -> SendResult:
    evidence = f"{what}: after the submit the page shows {selector} ({page.url})"
    if outcome is PageOutcome.REJECTED:
        return SendResult(SendOutcome.REJECTED, evidence, ErrorClass.PROVIDER_REJECTED)
    return SendResult(SendOutcome.UNKNOWN, evidence, ErrorClass.ERROR_PAGE)


async def _put(page: Page, carrier: KeyCarrier, value: str, what: str) -> None:
    """Set a (hidden) input's value; a URL parameter was set with the start URL."""
    if carrier.input is None:
        return
    found = await page.query_selector(carrier.input)
    if found is None:
        raise NotSubmitted(f"no element {carrier.input} for {what}")
    await found.evaluate("(element, value) => { element.value = value; }", value)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.hostname or "").lower(), port
