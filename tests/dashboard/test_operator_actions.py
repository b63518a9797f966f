"""The operator's buttons, in a real headless Chromium on a real broker and projection.

An operator redrives a FAILED delivery and resolves an UNKNOWN one from the dashboard: the
signed events land on the log, and once projected the run's timeline shows who did what,
when and why. A page on another origin cannot do the same (a forged cross-site POST is
refused before its token is looked at), and every malformed, unauthorised or stale request
is refused in one line with a hint, appending nothing.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from aiohttp import web
from playwright.async_api import Browser, Response, expect
from pydantic import SecretStr

from config.settings import Settings, changed
from events.operator import DeliveryRedriveRequested, DeliveryResolved, OperatorEvent
from projections.queries import delivery_state
from tests.dashboard.conftest import Stack, project_all, start_stack
from tests.fixtures.broker import ReadTopic
from tests.projections.scenarios import requested

TOKEN = secrets.token_urlsafe(32)
FAILED_KEY = requested("run-a", 4, 1).idempotency_key
UNKNOWN_KEY = requested("run-a", 3, 1).idempotency_key
CONFIRMED_KEY = requested("run-a", 1, 1).idempotency_key


@pytest.fixture
async def guarded(settings: Settings) -> AsyncIterator[Stack]:
    """The live stack behind a token, refreshing every half second."""
    fast = changed(settings, {"dashboard.refresh_s": 0.5, "dashboard.token": SecretStr(TOKEN)})
    async for running in start_stack(fast):
        yield running


async def operator_events(stack: Stack, read_topic: ReadTopic) -> list[OperatorEvent]:
    found = await read_topic(stack.settings.kafka.topic_deliveries)
    return [e for e in found if isinstance(e, OperatorEvent)]


def origin(stack: Stack) -> str:
    return stack.url.rstrip("/")


async def test_an_operator_redrives_and_resolves_from_the_page(
    guarded: Stack, browser: Browser, read_topic: ReadTopic
) -> None:
    stack = guarded
    page = await browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(15_000)
    await page.goto(f"{stack.url}#token={TOKEN}")

    failed = page.locator("#table-failed tbody tr")
    await expect(failed).to_have_count(1)
    await expect(failed).to_contain_text("run-a")
    await failed.locator("button.act-redrive").click()
    dialog = page.locator("#act-dialog")
    await expect(dialog).to_be_visible()
    await expect(page.locator("#act-outcomes")).to_be_hidden()
    await page.fill("#act-operator", "Alice Operator")
    await page.fill("#act-reason", "the endpoint's 4xx was fixed in deploy 812")
    await page.click("#act-submit")
    await expect(dialog).to_be_hidden()
    await expect(page.locator("#act-notice")).to_contain_text("appended as event")
    redrive_id = await page.locator("#act-notice").get_attribute("data-event-id")

    [redriven] = await operator_events(stack, read_topic)
    assert isinstance(redriven, DeliveryRedriveRequested)
    assert str(redriven.event_id) == redrive_id
    assert redriven.idempotency_key == FAILED_KEY
    assert (redriven.operator, redriven.seen_status) == ("Alice Operator", "FAILED")
    assert redriven.reason == "the endpoint's 4xx was fixed in deploy 812"

    unknown = page.locator("#table-unknown tbody tr")
    await expect(unknown).to_have_count(1)
    await unknown.locator("button.act-resolve").click()
    await expect(dialog).to_be_visible()
    # The name was typed once: the next action remembers it.
    await expect(page.locator("#act-operator")).to_have_value("Alice Operator")
    await page.check("#act-delivered")
    await page.fill("#act-receiver-id", "rcv-42")
    await page.fill("#act-reason", "the receiver's log shows it at 09:00:03")
    await page.click("#act-submit")
    await expect(dialog).to_be_hidden()
    await expect(page.locator("#act-notice")).not_to_have_attribute("data-event-id", redrive_id)

    events = await operator_events(stack, read_topic)
    assert len(events) == 2
    resolved = events[1] if isinstance(events[1], DeliveryResolved) else events[0]
    assert isinstance(resolved, DeliveryResolved)
    assert resolved.idempotency_key == UNKNOWN_KEY
    assert (resolved.outcome, resolved.receiver_id) == ("delivered", "rcv-42")
    assert resolved.operator == "Alice Operator"

    # Projected, both actions are in the run's timeline: who, when, why, applied.
    await project_all(stack.settings, stack.dsn)
    await page.goto(f"{stack.url}runs/run-a")
    actions = page.locator("#timeline li.operator-action")
    await expect(actions).to_have_count(2)
    await expect(
        page.locator('#timeline li.operator-action[data-operator="Alice Operator"]')
    ).to_have_count(2)
    redrive_entry = actions.filter(has_text="redrive")
    await expect(redrive_entry).to_contain_text("operator Alice Operator: redrive")
    await expect(redrive_entry).to_contain_text("deploy 812")
    await expect(redrive_entry).to_contain_text("(applied)")
    await expect(redrive_entry.locator("time")).to_have_text("2026-01-05 10:00:00.000")
    resolve_entry = actions.filter(has_text="resolve as delivered")
    await expect(resolve_entry).to_contain_text("(receiver id rcv-42)")
    await expect(resolve_entry).to_contain_text("09:00:03")
    await expect(resolve_entry).to_have_class("operator-action applied")
    # The page now shows the delivery as settled: CONFIRMED, no button left on it.
    left = page.locator("#answer-left li").filter(has_text="hooks/3:")
    await expect(left).to_contain_text("CONFIRMED")
    await expect(left.locator("button")).to_have_count(0)

    # The redriven one is PENDING again, to be sent by the worker.
    await expect(page.locator("#answer-left li").filter(has_text="hooks/4:")).to_contain_text(
        "PENDING"
    )
    assert errors == []
    await page.close()


async def test_the_run_page_offers_the_buttons_and_shows_a_refusal(
    guarded: Stack, browser: Browser, read_topic: ReadTopic
) -> None:
    stack = guarded
    page = await browser.new_page(viewport={"width": 1300, "height": 1000})
    page.set_default_timeout(15_000)
    await page.goto(f"{stack.url}runs/run-a#token={TOKEN}")
    left = page.locator("#answer-left li")
    await expect(left).to_have_count(4)
    await expect(left.filter(has_text="hooks/1:").locator("button")).to_have_count(0)
    await expect(left.filter(has_text="hooks/3:").locator("button")).to_have_count(2)
    failed = left.filter(has_text="hooks/4:")
    await expect(failed.locator("button")).to_have_text(["Redrive"])
    # The operator opens the dialog; meanwhile someone else redrives the delivery.
    await failed.locator("button.act-redrive").click()
    await expect(page.locator("#act-dialog")).to_be_visible()
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        first = await http.post(
            f"/api/deliveries/{FAILED_KEY}/redrive",
            json={"operator": "bob", "reason": "fixed"},
            headers={"Authorization": f"Bearer {TOKEN}", "Origin": origin(stack)},
        )
    assert first.status_code == 202, first.text
    await project_all(stack.settings, stack.dsn)
    await page.fill("#act-operator", "carol")
    await page.fill("#act-reason", "also fixed")
    await page.click("#act-submit")
    await expect(page.locator("#act-error")).to_contain_text("redrive applies to FAILED")
    await expect(page.locator("#act-dialog")).to_be_visible()
    assert [e.operator for e in await operator_events(stack, read_topic)] == ["bob"]
    await page.close()


ATTACKER_PAGE = """<!doctype html><html><body>
<form id="forged" method="POST" enctype="text/plain" action="{target}">
<input name='{{"operator":"mallory","reason":"x","ignore":"' value='"}}'>
</form>
<script>
window.results = {{}};
const body = JSON.stringify({{operator: "mallory", reason: "x"}});
async function go() {{
  try {{
    const r = await fetch("{target}", {{method: "POST", body,
      headers: {{"Content-Type": "application/json", "Authorization": "Bearer guessed-token"}}}});
    window.results.cors = r.status;
  }} catch (e) {{ window.results.cors = "blocked: " + e.name; }}
  try {{
    const r = await fetch("{target}", {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "text/plain"}}, body}});
    window.results.simple = r.type;
  }} catch (e) {{ window.results.simple = "blocked: " + e.name; }}
  window.results.done = true;
}}
go();
</script></body></html>"""


async def test_a_forged_cross_site_post_is_refused(
    guarded: Stack, browser: Browser, read_topic: ReadTopic
) -> None:
    stack = guarded
    target = f"{stack.url}api/deliveries/{FAILED_KEY}/redrive"
    app = web.Application()

    async def attacker(request: web.Request) -> web.Response:
        return web.Response(text=ATTACKER_PAGE.format(target=target), content_type="text/html")

    app.router.add_get("/", attacker)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    assert port != urlsplit(stack.url).port
    page = await browser.new_page()
    page.set_default_timeout(15_000)
    answers: list[Response] = []
    page.on("response", lambda r: answers.append(r) if r.url == target else None)
    try:
        await page.goto(f"http://127.0.0.1:{port}/")
        await page.wait_for_function("window.results && window.results.done")
        results = await page.evaluate("window.results")
        # With a token it does not have, the browser must ask first (a preflight); the
        # dashboard refuses the preflight, so the POST itself is never sent.
        assert results["cors"] == "blocked: TypeError"
        # A request simple enough to need no preflight reaches the server: refused, 403.
        assert results["simple"] == "opaque"
        # And a plain HTML form, the classic forgery: refused, 403.
        async with page.expect_navigation() as navigation:
            await page.evaluate("document.getElementById('forged').submit()")
        form = await navigation.value
        assert form is not None
        assert form.status == 403
        body = json.loads(await form.text())
        assert body["error"].startswith("refused: Origin 'http://127.0.0.1:")
        assert "operator actions are taken from the dashboard's own page" in body["hint"]
        statuses = [r.status for r in answers]
        assert statuses
        assert set(statuses) == {403}, statuses
        assert len([r for r in answers if r.request.method == "POST"]) >= 2
    finally:
        await page.close()
        await runner.cleanup()
    assert await operator_events(stack, read_topic) == []


async def test_every_bad_request_is_refused_in_one_line(
    guarded: Stack, read_topic: ReadTopic
) -> None:
    stack = guarded
    own = origin(stack)
    ok = {"Authorization": f"Bearer {TOKEN}", "Origin": own}
    redrive = f"/api/deliveries/{FAILED_KEY}/redrive"
    resolve = f"/api/deliveries/{UNKNOWN_KEY}/resolve"
    body = {"operator": "dana", "reason": "fixed"}
    store = stack.read()
    try:
        failed = delivery_state(store, FAILED_KEY)
    finally:
        store.close()
    assert failed is not None

    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:

        async def refused(
            path: str, status: int, says: str, *, headers: dict[str, str], **kw: Any
        ) -> None:
            answer = await http.post(path, headers=headers, **kw)
            assert answer.status_code == status, (path, headers, answer.text)
            data = answer.json()
            assert says in data["error"], data
            assert data.get("hint") or status == 401, data
            assert "Traceback" not in answer.text

        await refused(redrive, 401, "bearer token required", headers={"Origin": own}, json=body)
        await refused(
            redrive,
            401,
            "bearer token required",
            headers={"Origin": own, "Authorization": "Bearer wrong"},
            json=body,
        )
        for headers, says in (
            ({**ok, "Origin": "http://attacker.example"}, "Origin 'http://attacker.example'"),
            ({**ok, "Origin": "null"}, "Origin 'null'"),
            ({**ok, "Origin": own.replace("http:", "https:") + "1"}, "is not this dashboard"),
            ({"Authorization": ok["Authorization"]}, "says nothing of where it comes from"),
            (
                {"Authorization": ok["Authorization"], "Sec-Fetch-Site": "cross-site"},
                "Sec-Fetch-Site is 'cross-site'",
            ),
            (
                {"Authorization": ok["Authorization"], "Referer": "http://evil.test/x"},
                "the Referer is not this dashboard",
            ),
        ):
            await refused(redrive, 403, says, headers=headers, json=body)
        await refused(
            redrive,
            415,
            "operator actions take a JSON body",
            headers=ok,
            data={"operator": "dana", "reason": "fixed"},
        )
        await refused(
            redrive,
            415,
            "JSON body",
            headers={**ok, "Content-Type": "text/plain"},
            content=json.dumps(body),
        )
        json_headers = {**ok, "Content-Type": "application/json"}
        await refused(redrive, 400, "not JSON", headers=json_headers, content=b"{nope")
        await refused(redrive, 400, "not a JSON object", headers=json_headers, content=b"[1]")
        await refused(redrive, 400, "operator's name", headers=ok, json={"reason": "x"})
        await refused(redrive, 400, "needs a reason", headers=ok, json={"operator": "dana"})
        await refused(
            resolve, 400, "outcome must be", headers=ok, json={**body, "outcome": "maybe"}
        )
        nowhere = "/api/deliveries/no-such-key/redrive"
        await refused(nowhere, 404, "no delivery with key", headers=ok, json=body)
        # The delivery moved on since the page showed it: stale, by the fold's own rule.
        seen = {"status": "FAILED", "fencing_token": failed.fencing_token - 1}
        await refused(redrive, 409, "stale", headers=ok, json={**body, "seen": seen})
        await refused(
            f"/api/deliveries/{CONFIRMED_KEY}/resolve",
            409,
            "the delivery is CONFIRMED, which is final",
            headers=ok,
            json={**body, "outcome": "delivered"},
        )
        await refused(
            f"/api/deliveries/{FAILED_KEY}/resolve",
            409,
            "resolve applies to UNKNOWN",
            headers=ok,
            json={**body, "outcome": "abandoned"},
        )
        # A CORS preflight from another origin learns nothing either.
        preflight = await http.options(
            redrive,
            headers={"Origin": "http://attacker.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 403
        assert "Access-Control-Allow-Origin" not in preflight.headers
    assert await operator_events(stack, read_topic) == []

    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        seen = {"status": "FAILED", "fencing_token": failed.fencing_token}
        taken = await http.post(redrive, headers=ok, json={**body, "seen": seen})
    assert taken.status_code == 202, taken.text
    [event] = await operator_events(stack, read_topic)
    assert str(event.event_id) == taken.json()["event_id"]
    assert event.scope == "key (dashboard)"


async def test_without_a_token_actions_are_refused_and_reading_works(
    settings: Settings, read_topic: ReadTopic
) -> None:
    async for stack in start_stack(settings):
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
            answer = await http.post(
                f"/api/deliveries/{FAILED_KEY}/redrive",
                json={"operator": "erin", "reason": "fixed"},
                headers={"Origin": origin(stack), "Authorization": "Bearer anything"},
            )
            assert answer.status_code == 403
            assert "none is configured" in answer.json()["error"]
            assert "LEDGER_DASHBOARD__TOKEN" in answer.json()["hint"]
            assert (await http.get("/api/overview")).status_code == 200
            assert (await http.get("/api/runs/run-a")).status_code == 200
        assert await operator_events(stack, read_topic) == []
