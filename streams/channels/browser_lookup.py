"""The browser channel's lookup by idempotency key: did the target accept this key?

Two ways a target can answer, declared per target (``events/channels/browser_targets.py``):
a URL answering JSON that lists the accepted submissions (``list_lookup``, over HTTP), or a
search page read in Chromium (``search_lookup``). Both only read: nothing is submitted.

A search page proves "not accepted" only by its declared not-found mark; a page that shows
neither results nor the mark (an error page, a login page, a page still rendering) is a
lookup error, so the delivery stays UNKNOWN and is looked up again later.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from events.channels.browser_targets import SearchLookup, TargetLookup
from events.outcomes import LookupOutcome
from streams.channels.base import LookupResult
from streams.channels.outcomes import DeadlineExceeded, request

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, ProxySettings

POLL_S = 0.05
CLOSE_TIMEOUT_S = 3.0


def _found(what: str, ids: list[str]) -> LookupResult:
    twice = f" (accepted {len(ids)} times: {', '.join(ids)})" if len(ids) > 1 else ""
    return LookupResult(
        LookupOutcome.FOUND,
        f"{what}, accepted as {ids[0]}{twice}",
        provider_message_id=ids[0][:500],
        provider_status="accepted",
        delivered=True,
    )


async def list_lookup(
    client: httpx.AsyncClient, spec: TargetLookup, key: str, *, deadline_s: float
) -> LookupResult:
    """GET the target's JSON list of accepted submissions for ``key``."""
    assert spec.url is not None
    url = spec.url.replace("{key}", key)
    what = f"GET {url}"
    try:
        answer = await request(client, "GET", url, deadline_s=deadline_s)
    except (httpx.RequestError, httpx.InvalidURL, DeadlineExceeded) as exc:
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR, f"{what}: {type(exc).__name__}: {exc}"[:1000]
        )
    body = answer.json_object()
    if answer.status != 200 or body is None:
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR, f"{what} -> {answer.status}: {answer.excerpt()}"
        )
    listed = body.get(spec.list_field)
    if not isinstance(listed, list):
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR, f"{what} -> 200 without a {spec.list_field} list"
        )
    ids = [
        str(item.get(spec.id_field))
        for item in listed
        if isinstance(item, dict) and item.get(spec.key_field) == key
    ]
    if not ids:
        return LookupResult(
            LookupOutcome.NOT_FOUND, f"{what} -> 200, the key is not among the accepted"
        )
    return _found(f"{what} -> 200", ids)


async def search_lookup(
    browser: Browser,
    spec: SearchLookup,
    key: str,
    *,
    step_timeout_s: float,
    proxy: ProxySettings | None = None,
) -> LookupResult:
    """Search for ``key`` on the target's search page in a fresh context and read it.

    The caller bounds the whole search with the lookup's deadline; ``step_timeout_s``
    bounds each wait for an element (the search box, the results or the not-found mark).
    ``proxy``: the context's address guard (``streams/channels/browser_guard.py``).
    """
    context = await browser.new_context(proxy=proxy)
    try:
        context.set_default_timeout(step_timeout_s * 1000)
        page = await context.new_page()
        if "{key}" in spec.url:
            url = spec.url.replace("{key}", quote(key, safe=""))
            what = f"search {url}"
            response = await page.goto(url)
        else:
            what = f"search {spec.url} ({spec.fill} = key)"
            response = await page.goto(spec.url)
            if response is not None and response.ok:
                assert spec.fill is not None
                assert spec.submit is not None
                await page.fill(spec.fill, key)
                async with page.expect_navigation():
                    await page.click(spec.submit)
                response = None
        if response is not None and not response.ok:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR, f"{what} -> {response.status} ({page.url})"
            )
        return await _read_results(page, spec, key, what, step_timeout_s)
    except TimeoutError:
        raise
    except Exception as exc:  # noqa: BLE001 - playwright's errors: no page, no answer
        text = (str(exc).strip().splitlines() or [""])[0]
        detail = f"search for the key: {type(exc).__name__}: {text}"
        return LookupResult(LookupOutcome.LOOKUP_ERROR, detail[:1000])
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(context.close(), CLOSE_TIMEOUT_S)


async def _read_results(
    page: Page, spec: SearchLookup, key: str, what: str, step_timeout_s: float
) -> LookupResult:
    """Poll the page until it shows results or the not-found mark (or give up)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + step_timeout_s
    while True:
        results = await page.query_selector_all(spec.result)
        ids: list[str] = []
        others: list[str] = []
        if results:
            for element in results:
                if spec.key_attribute is not None:
                    carried = await element.get_attribute(spec.key_attribute)
                    if carried != key:
                        others.append(str(carried)[:40])
                        continue
                value = await element.get_attribute(spec.attribute)
                if value:
                    ids.append(value)
            if ids:
                return _found(f"{what}: {spec.result}", ids)
        if await _not_found_shown(page, spec):
            return LookupResult(
                LookupOutcome.NOT_FOUND, f"{what}: the page shows {_mark(spec)} ({page.url})"
            )
        if results and others:
            # Results for other keys only: no proof that this key was not accepted.
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR,
                f"{what}: {len(others)} result(s), none with {spec.key_attribute}={key}, "
                "and no not-found mark",
            )
        if loop.time() >= give_up:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR,
                f"{what}: neither a result {spec.result} with {spec.attribute} nor "
                f"{_mark(spec)} within {step_timeout_s:g}s ({page.url})",
            )
        await asyncio.sleep(POLL_S)


async def _not_found_shown(page: Page, spec: SearchLookup) -> bool:
    mark = spec.not_found
    if mark.selector is not None:
        element = await page.query_selector(mark.selector)
        if element is None:
            return False
        return mark.text is None or mark.text in (await element.inner_text())
    assert mark.text is not None
    return mark.text in await page.inner_text("body")


def _mark(spec: SearchLookup) -> str:
    mark = spec.not_found
    parts = [p for p in (mark.selector, repr(mark.text) if mark.text else None) if p]
    return "the not-found mark " + " ".join(parts)
