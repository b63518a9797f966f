"""The Endpoints and Endpoint health panels in real headless Chromium, over real data: endpoints
registered, paused and disabled with ``ledger endpoints``, deliveries published to a real
broker and held by a real worker, ``ledger project`` folding them.

The page says which endpoint is paused (by whom, why), which is disabled, each one's circuit,
and how many deliveries wait and why; once the paused endpoint is resumed, its deliveries
arrive exactly once at a receiver that does NOT dedupe, and the page shows nothing waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from playwright.async_api import Browser, expect

from config.settings import Settings
from events.delivery_state import Status
from events.waiting import WaitReason
from tests.dashboard.live import TOKEN, ledger, live_dashboard
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import wait_for
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import Stack, StackPool
from tests.streams.matrix import posts, publish

HELD = 3


@pytest.fixture(scope="module")
def stack_pool(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackPool]:
    pool = StackPool(broker, tmp_path_factory)
    yield pool
    pool.close()


@pytest.fixture
async def registry(
    stack_pool: StackPool, read_topic: ReadTopic
) -> AsyncIterator[Stack[WebhookDriver]]:
    """A plain receiver without dedupe, a live projection; no worker started yet."""
    yield await stack_pool.get("endpoints-panel", WebhookDriver, read_topic, shared=False)
    stack_pool.release()


async def test_the_page_shows_a_paused_endpoint_and_what_waits_for_it(
    registry: Stack[WebhookDriver], browser: Browser
) -> None:
    stack, receiver = registry, registry.driver.receiver
    settings = stack.configure({"endpoints.recheck_s": 0.5})
    hooks = f"{receiver.base_url}/hooks/"

    def endpoints(*args: str) -> str:
        return ledger(settings, "endpoints", *args)

    await asyncio.to_thread(
        endpoints, "add", "acme", "--channel", "webhook", "--address", hooks,
        "--lookup-url", receiver.webhook_lookup_url, "--no-secret",
    )  # fmt: skip
    await asyncio.to_thread(
        endpoints, "add", "spare", "--channel", "webhook", "--address",
        "http://127.0.0.1:9/spare/", "--no-secret",
    )  # fmt: skip
    await asyncio.to_thread(
        endpoints, "add", "gone", "--channel", "webhook", "--address",
        "http://127.0.0.1:9/gone/", "--no-secret",
    )  # fmt: skip
    await asyncio.to_thread(endpoints, "pause", "acme", "--reason", "receiver maintenance")
    await asyncio.to_thread(endpoints, "disable", "gone", "--reason", "customer left")
    stack.workers.start("w1")
    keys = await publish(
        settings, "run-held", [stack.driver.spec("run-held", n) for n in range(HELD)]
    )

    async def all_waiting() -> bool:
        states = await stack.view()
        return all(k in states and states[k].waiting is WaitReason.PAUSED for k in keys)

    await wait_for(all_waiting, 60, "every delivery waiting for the paused endpoint")
    assert all(posts(receiver, k) == 0 for k in keys)

    async with live_dashboard(stack.settings, stack.projection.dsn) as dash:
        page = await browser.new_page(viewport={"width": 1400, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(30_000)
        await page.goto(f"{dash.url}#token={TOKEN}")

        title = page.locator("#endpoints-title")
        await expect(title).to_have_text(f"Endpoints (3) · waiting: {HELD} paused")
        rows = page.locator("#table-endpoints tbody tr")
        await expect(rows).to_have_count(3)
        acme = rows.filter(has_text="acme")
        await expect(acme.locator(".endpoint-paused")).to_have_text("paused")
        await expect(acme.locator(".circuit-closed")).to_have_text("closed")
        await expect(acme).to_contain_text("ana")
        await expect(acme).to_contain_text("receiver maintenance")
        await expect(acme).to_contain_text(hooks)
        gone = rows.filter(has_text="gone")
        await expect(gone.locator(".endpoint-disabled")).to_have_text("disabled")
        await expect(gone).to_contain_text("customer left")
        await expect(rows.filter(has_text="spare").locator(".endpoint-active")).to_have_text(
            "active"
        )
        # Endpoint health: the paused one first (its traffic), its backlog by reason.
        health = page.locator("#table-health tbody tr").filter(has_text="acme")
        await expect(health.locator(".endpoint-paused")).to_have_text("paused")
        await expect(health.locator(".health-pending")).to_have_text(str(HELD))
        await expect(health.locator(".health-waiting")).to_have_text(f"{HELD} paused")

        # Resumed: each arrives exactly once, and the page shows nothing waiting.
        await asyncio.to_thread(endpoints, "resume", "acme")
        await stack.until(keys, {Status.CONFIRMED}, "the held ones CONFIRMED")
        for key in keys:
            assert receiver.accepted(key) == 1, key
            assert posts(receiver, key) == 1, key
        await expect(title).to_have_text("Endpoints (3)")
        await expect(acme.locator(".endpoint-active")).to_have_text("active")
        await expect(health.locator(".health-waiting")).to_have_text("\u2013")  # nothing waits
        await expect(health.locator(".health-ratio")).to_have_text(f"100.0% ({HELD})")
        assert errors == []
        await page.close()
    await stack.matches()
