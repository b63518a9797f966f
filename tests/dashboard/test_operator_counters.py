"""The operator counters on the live stack (issue 26, item 5): the dashboard's summary and
``/metrics`` show deliveries settled by an operator, redrives by result and the age of the
oldest UNKNOWN, and follow signed operator events as they are projected."""

from __future__ import annotations

from playwright.async_api import Browser, expect

from events.model import AnyDeliveryEvent
from tests.dashboard.conftest import Stack
from tests.dashboard.test_browser import open_page
from tests.dashboard.test_metrics import scrape
from tests.projections.operator_scenario import redriven, resolved
from tests.projections.scenarios import requested

# incident_log: run-a's third delivery UNKNOWN since T0+5s (NOW is T0+1h), its fourth
# FAILED under token 2, its first CONFIRMED.
A1, A3, A4 = requested("run-a", 1, 1), requested("run-a", 3, 1), requested("run-a", 4, 1)
ACTIONS: list[AnyDeliveryEvent] = [
    resolved(A3, 400, "delivered"),
    redriven(A4, 401, token=2),
    redriven(A4, 402, token=2),  # a second operator: refused, the first made it PENDING
    resolved(A1, 403, "abandoned", seen="SENT"),  # CONFIRMED: refused
]


async def test_metrics_show_the_operator_counters(stack: Stack) -> None:
    m = await scrape(stack)
    for outcome in ("delivered", "not_delivered", "abandoned"):
        assert m[("ledger_operator_settled_total", (("outcome", outcome),))] == 0
    for result in ("applied", "refused"):
        assert m[("ledger_redrives_total", (("result", result),))] == 0
    assert m[("ledger_oldest_unknown_age_seconds", ())] == 3595.0

    await stack.append(ACTIONS)
    m = await scrape(stack)
    assert m[("ledger_operator_settled_total", (("outcome", "delivered"),))] == 1
    assert m[("ledger_operator_settled_total", (("outcome", "abandoned"),))] == 0
    assert m[("ledger_redrives_total", (("result", "applied"),))] == 1
    assert m[("ledger_redrives_total", (("result", "refused"),))] == 1
    assert m[("ledger_oldest_unknown_age_seconds", ())] == 0.0  # the only UNKNOWN, settled
    assert m[("ledger_unknown_deliveries", ())] == 0


async def test_the_page_shows_the_operator_counters(stack: Stack, browser: Browser) -> None:
    page = await open_page(browser, stack.url)
    oldest = page.locator("#operators-oldest-unknown")
    await expect(oldest).to_have_text("59m 55s")
    await expect(oldest).to_have_attribute("title", "unknown since 2026-01-05T09:00:05.000000Z")
    settled = page.locator("#operators-settled")
    await expect(settled.locator('li[data-name="not_delivered"]')).to_have_text("0 not delivered")
    await expect(page.locator('#operators-redrives li[data-name="applied"]')).to_have_text(
        "0 applied"
    )
    await stack.append(ACTIONS)  # the page refreshes in place
    await expect(settled.locator('li[data-name="delivered"]')).to_have_text("1 delivered")
    await expect(page.locator('#operators-redrives li[data-name="applied"]')).to_have_text(
        "1 applied"
    )
    await expect(page.locator('#operators-redrives li[data-name="refused"]')).to_have_text(
        "1 refused"
    )
    await expect(oldest).to_have_text("\u2013")  # an en dash: none unknown
    await page.close()
