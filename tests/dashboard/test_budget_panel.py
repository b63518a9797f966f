"""The Send budgets panel and its Release button, in real headless Chromium, on a real broker,
a real worker, ``ledger project`` and a receiver that does NOT dedupe.

An agent limited to 3 per hour asks for 5 deliveries: the page shows its limit, 3 of 3 used,
2 held and when the window resets. An operator clicks Release: exactly one signed
``BudgetReleased`` of 2 lands on ``ledger.budgets`` (as ``ledger budgets release --count 2``
writes it) and the receiver then gets each of the two held deliveries exactly once. A page
without the token cannot release, and bad input is refused in one line, appending nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from playwright.async_api import Browser, expect

from clients import Publisher
from config.settings import Settings
from events.budgets import BudgetReleased, decode_budget
from events.delivery_state import Status
from events.waiting import WaitReason
from tests.dashboard.live import TOKEN, LiveDashboard, ledger, live_dashboard
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import wait_for
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import Stack, StackPool
from tests.streams.matrix import posts

AGENT = "runaway-agent"
LIMIT = 3
ASKED = 5


@pytest.fixture(scope="module")
def stack_pool(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackPool]:
    pool = StackPool(broker, tmp_path_factory)
    yield pool
    pool.close()


@pytest.fixture
async def budgeted(
    stack_pool: StackPool, read_topic: ReadTopic
) -> AsyncIterator[Stack[WebhookDriver]]:
    """A plain receiver without dedupe, a live projection; no worker started yet."""
    yield await stack_pool.get("budget-panel", WebhookDriver, read_topic, shared=False)
    stack_pool.release()


async def publish_as(stack: Stack[WebhookDriver], agent: str, run_id: str, count: int) -> list[str]:
    specs = [stack.driver.spec(run_id, n) for n in range(count)]
    async with Publisher(stack.settings, producer_name=agent) as publisher:
        requests = await publisher.run_succeeded(run_id, "sha256:r", specs)
    return [r.idempotency_key for r in requests]


async def releases(stack: Stack[WebhookDriver], read_topic: ReadTopic) -> list[BudgetReleased]:
    """Every release on the budgets topic."""
    found = await read_topic(stack.settings.kafka.topic_budgets, raw=True)
    return [e for m in found if isinstance(e := decode_budget(m.value), BudgetReleased)]


async def test_an_operator_releases_held_deliveries_from_the_page(
    budgeted: Stack[WebhookDriver], browser: Browser, read_topic: ReadTopic
) -> None:
    stack, receiver = budgeted, budgeted.driver.receiver
    await asyncio.to_thread(
        ledger, stack.settings, "budgets", "set", AGENT, "--limit", str(LIMIT), "--window", "1h",
        "--reason", "a runaway loop",
    )  # fmt: skip
    stack.workers.start("w1")
    keys = await publish_as(stack, AGENT, "run-over", ASKED)

    async def held_two() -> bool:
        states = await stack.view()
        done = [k for k in keys if k in states and states[k].status is Status.CONFIRMED]
        held = [k for k in keys if k in states and states[k].waiting is WaitReason.OVER_BUDGET]
        return len(done) == LIMIT and len(held) == ASKED - LIMIT

    await wait_for(held_two, 120, f"{LIMIT} CONFIRMED and {ASKED - LIMIT} held over budget")
    held = [k for k in keys if (await stack.view())[k].status is Status.PENDING]
    assert all(posts(receiver, k) == 0 for k in held)

    async with live_dashboard(stack.settings, stack.projection.dsn) as dash:
        page = await browser.new_page(viewport={"width": 1300, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(30_000)
        await page.goto(f"{dash.url}#token={TOKEN}")
        row = page.locator("#table-budgets tbody tr").filter(has_text=AGENT)
        await expect(row).to_have_count(1)
        await expect(row.locator(".budget-channel")).to_have_text("every channel")
        await expect(row.locator(".budget-limit")).to_have_text(f"{LIMIT} per 1h")
        used = row.locator(".budget-used span")
        await expect(used).to_have_text(f"{LIMIT} of {LIMIT}")
        await expect(used).to_have_class("budget-full")
        await expect(row.locator(".budget-held")).to_have_text(str(ASKED - LIMIT))
        resets = await row.locator(".budget-resets time").get_attribute("datetime")
        assert resets is not None
        left = datetime.fromisoformat(resets) - datetime.now(UTC)
        assert timedelta(0) < left <= timedelta(hours=1), "the window the budget was set in"
        await expect(page.locator("#budgets-title")).to_contain_text("held over budget: 2")

        await api_and_metrics_agree(dash, resets)

        # Release: the dialog offers the held count; the operator's name and reason go in.
        await row.locator("button.act-release").click()
        dialog = page.locator("#release-dialog")
        await expect(dialog).to_be_visible()
        await expect(page.locator("#release-agent")).to_have_text(AGENT)
        await expect(page.locator("#release-count")).to_have_value(str(ASKED - LIMIT))
        await page.fill("#release-operator", "Alice Operator")
        await page.fill("#release-reason", "checked: the last two are legitimate")
        await page.click("#release-submit")
        await expect(dialog).to_be_hidden()
        notice = page.locator("#act-notice")
        await expect(notice).to_contain_text(f"release of 2 of {AGENT}'s held deliveries")
        event_id = await notice.get_attribute("data-event-id")

        [released] = await releases(stack, read_topic)
        assert str(released.event_id) == event_id
        assert (released.agent, released.channel, released.count) == (AGENT, None, 2)
        assert (released.operator, released.reason) == (
            "Alice Operator", "checked: the last two are legitimate",
        )  # fmt: skip
        assert released.producer == "ledger-operator"  # as the CLI writes it

        # Each released delivery arrives exactly once, at a receiver that does not dedupe.
        await stack.until(keys, {Status.CONFIRMED}, "the released ones CONFIRMED")
        for key in keys:
            assert receiver.accepted(key) == 1, key
            assert posts(receiver, key) == 1, key
        # The page follows the projection: nothing held, no button left.
        await expect(row.locator(".budget-held")).to_have_text("0")
        await expect(row.locator("button.act-release")).to_have_count(0)
        await asyncio.sleep(2)  # a worker's recheck finds nothing more to send
        assert all(posts(receiver, k) == 1 for k in keys)
        assert errors == []
        await page.close()
        await refused_without_the_token(dash, browser)
        await refused_bad_input(dash)
        assert len(await releases(stack, read_topic)) == 1, "nothing refused was appended"
    await stack.matches()


async def api_and_metrics_agree(dash: LiveDashboard, resets: str) -> None:
    """``GET /api/budgets`` and ``/metrics`` give the page's numbers."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=dash.origin, timeout=30, headers=auth) as http:
        [shown] = (await http.get("/api/budgets")).json()["budgets"]
        text = (await http.get("/metrics")).text
    assert shown["resets_at"] == resets
    assert {k: shown[k] for k in ("agent", "channel", "limit", "window", "used", "held")} == {
        "agent": AGENT, "channel": None, "limit": LIMIT, "window": "1h", "used": LIMIT,
        "held": ASKED - LIMIT,
    }  # fmt: skip
    at = f'{{agent="{AGENT}",channel="*"}}'
    for line in (
        f"ledger_agent_budget_limit{at} {LIMIT}.0",
        f"ledger_agent_budget_used{at} {LIMIT}.0",
        f"ledger_agent_budget_allowed{at} {LIMIT}.0",
        f"ledger_agent_budget_held_deliveries{at} {ASKED - LIMIT}.0",
        f"ledger_agent_budget_window_seconds{at} 3600.0",
    ):
        assert line in text.splitlines(), line
    reset = datetime.fromisoformat(resets).timestamp()
    assert any(
        ln.startswith(f"ledger_agent_budget_resets_at_seconds{at} ")
        and float(ln.split()[-1]) == reset
        for ln in text.splitlines()
    )


async def refused_without_the_token(dash: LiveDashboard, browser: Browser) -> None:
    """A page opened without the token shows no budgets and cannot release."""
    page = await browser.new_page()
    await page.goto(dash.url)
    await expect(page.locator("#error")).to_contain_text("bearer token required")
    await expect(page.locator("button.act-release")).to_have_count(0)
    status, body = await page.evaluate(
        """async (agent) => {
            const r = await fetch("/api/budgets/" + agent + "/release", { method: "POST",
              headers: { "Content-Type": "application/json" },
              body: JSON.stringify({ count: 1, operator: "mallory", reason: "more" }) });
            return [r.status, await r.text()];
        }""",
        AGENT,
    )
    assert status == 401
    assert json.loads(body) == {"error": "bearer token required"}
    await page.close()


async def refused_bad_input(dash: LiveDashboard) -> None:
    """Bad input, and a request from another origin: one line and a hint, nothing appended."""
    path = f"/api/budgets/{AGENT}/release"
    good = {"count": 1, "operator": "ana", "reason": "why"}
    auth = {"Authorization": f"Bearer {TOKEN}", "Origin": dash.origin}
    async with httpx.AsyncClient(base_url=dash.origin, timeout=30) as http:
        cases: list[tuple[dict[str, object], dict[str, str], int, str]] = [
            ({**good, "count": 0}, auth, 400, "count must be a whole number"),
            ({**good, "count": "2"}, auth, 400, "count must be a whole number"),
            ({**good, "count": True}, auth, 400, "count must be a whole number"),
            ({k: v for k, v in good.items() if k != "reason"}, auth, 400, "reason"),
            ({**good, "channel": ""}, auth, 400, "channel must be 1-64 characters"),
            ({**good, "channel": "sms"}, auth, 404, f"{AGENT} has no budget on sms"),
            (good, {**auth, "Origin": "http://evil.test"}, 403, "is not this dashboard"),
        ]
        for body, headers, status, says in cases:
            answer = await http.post(path, json=body, headers=headers)
            assert answer.status_code == status, (body, answer.text)
            error = answer.json()["error"]
            assert says in error, (body, error)
            assert "\n" not in answer.text
        answer = await http.post("/api/budgets/nobody/release", json=good, headers=auth)
        assert (answer.status_code, answer.json()["error"]) == (
            404, "nobody has no budget in the projection",
        )  # fmt: skip
        answer = await http.post(path, content=b"count=1", headers=auth)
        assert answer.status_code == 415
