"""The dashboard in a real headless Chromium, against a live stack: what an operator sees."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from playwright.async_api import Browser, Page, expect

from tests.dashboard.conftest import Stack
from tests.dashboard.test_api import _paused_hooks
from tests.projections.scenarios import found_later, requested, unknown

COUNTS = {
    "overdue_pending": ("1", "alert"),
    "overdue_sent": ("0", "ok"),
    "unknown": ("1", "alert"),
    "confirmed_without_result": ("1", "alert"),
    "duplicate_conflicts": ("1", "alert"),
    "failed_attempts": ("4", "warn"),  # below its default threshold of 25
}


async def open_page(browser: Browser, url: str) -> Page:
    page = await browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(url)
    page.set_default_timeout(15_000)
    return page


async def test_the_page_shows_the_counts_and_refreshes_in_place(
    stack: Stack, browser: Browser, tmp_path: Path
) -> None:
    page = await open_page(browser, stack.url)
    for name, (value, level) in COUNTS.items():
        counter = page.locator(f"#counter-{name}")
        await expect(counter.locator(".value")).to_have_text(value)
        await expect(counter).to_have_attribute("data-level", level)
    for status, n in {"PENDING": 1, "SENT": 0, "UNKNOWN": 1, "CONFIRMED": 3, "FAILED": 1}.items():
        await expect(page.locator(f'.status-label[data-status="{status}"] b')).to_have_text(str(n))
    # The backlog beside the counters: run-b's delivery, requested an hour before NOW.
    await expect(page.locator("#backlog-pending")).to_have_text("1")
    await expect(page.locator("#backlog-oldest")).to_have_text("58m 20s")
    await expect(page.locator('#backlog-channels li[data-channel="webhook"]')).to_contain_text(
        "1 webhook, oldest 58m 20s"
    )
    await expect(page.locator("#chart-attempts svg rect")).to_have_count(6)
    await expect(page.locator("#chart-attempts")).to_contain_text("reset_after_write")
    await expect(page.locator("#chart-latency")).to_contain_text("3 confirmed")
    unknown_rows = page.locator("#table-unknown tbody tr")
    await expect(unknown_rows).to_have_count(1)
    await expect(unknown_rows.first).to_contain_text("reset_after_write")
    overdue = page.locator("#table-overdue tbody tr")
    await expect(overdue).to_have_count(1)
    await expect(overdue.locator("a.run-link")).to_have_text("run-b")

    screenshot = tmp_path / "dashboard.png"
    await page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    if keep := os.environ.get("LEDGER_DASHBOARD_SCREENSHOT"):
        shutil.copy(screenshot, keep)

    # A marker on the window survives only if the page is never reloaded.
    await page.evaluate("window.__notReloaded = true")
    b1 = requested("run-b", 1, 100, slo=30)
    await stack.append(unknown(b1, 200))  # run-b's delivery: claimed, then UNKNOWN
    await expect(page.locator("#counter-unknown .value")).to_have_text("2")
    await expect(page.locator("#counter-overdue_pending .value")).to_have_text("0")
    await expect(page.locator("#counter-overdue_pending")).to_have_attribute("data-level", "ok")
    await expect(unknown_rows).to_have_count(2)
    await expect(page.locator("#table-overdue")).to_contain_text("no pending delivery")
    await expect(page.locator("#backlog-pending")).to_have_text("0")
    await expect(page.locator("#backlog")).to_contain_text("nothing pending")
    await expect(page.locator("#table-overdue-sent")).to_contain_text("no sent delivery")
    # run-a's UNKNOWN delivery is found at the provider: SENT, long past its SLO.
    await stack.append([found_later(requested("run-a", 3, 1), 300)])
    await expect(page.locator("#counter-overdue_sent .value")).to_have_text("1")
    await expect(page.locator("#counter-overdue_sent")).to_have_attribute("data-level", "alert")
    await expect(page.locator("#counter-unknown .value")).to_have_text("1")
    sent = page.locator("#table-overdue-sent tbody tr")
    await expect(sent).to_have_count(1)
    await expect(sent.locator("a.run-link")).to_have_text("run-a")
    await expect(page.locator("#overdue-sent-title")).to_contain_text("(1)")
    assert await page.evaluate("window.__notReloaded === true")
    await page.close()


async def test_the_run_page_answers_the_three_questions(stack: Stack, browser: Browser) -> None:
    a = [requested("run-a", n, 1) for n in (1, 2, 3, 4)]
    page = await open_page(browser, stack.url)
    await page.locator("#table-unknown a.run-link").first.click()
    await expect(page).to_have_url(f"{stack.url}runs/run-a?key={a[2].idempotency_key}")
    await expect(page.locator("#run-title")).to_have_text("run run-a")
    await expect(page.locator("#answer-execution")).to_have_text("finished: succeeded")
    left = page.locator("#answer-left li")
    await expect(left).to_have_count(4)
    await expect(left.filter(has_text="hooks/1:")).to_contain_text(
        "CONFIRMED, left: yes (confirmed)"
    )
    await expect(left.filter(has_text="hooks/3:")).to_contain_text(
        "unknown (awaiting reconciliation)"
    )
    await expect(left.filter(has_text="hooks/4:")).to_contain_text("FAILED, left: no (failed)")
    keys = page.locator("#answer-keys code.key")
    assert sorted(await keys.all_inner_texts()) == sorted(r.idempotency_key for r in a)
    # The delivery the operator came from is highlighted.
    await expect(page.locator("#answer-keys li.highlight code")).to_have_text(a[2].idempotency_key)
    timeline = page.locator("#timeline li")
    await expect(timeline.first).to_contain_text("run started by reporter")
    await expect(timeline.filter(has_text="attempt 1 unknown: reset_after_write")).to_have_count(1)
    await expect(timeline.filter(has_text="retry scheduled")).to_have_count(2)

    await page.goto(f"{stack.url}runs/run-c")
    await expect(page.locator("#answer-execution")).to_have_text("not finished (running)")
    await expect(page.locator("#answer-left li")).to_contain_text("CONFIRMED")
    await page.goto(f"{stack.url}runs/no-such-run")
    await expect(page.locator("#error")).to_contain_text("run no-such-run is not in the projection")
    await page.close()


async def test_search_finds_a_key_and_a_run(stack: Stack, browser: Browser) -> None:
    target = requested("run-a", 3, 1)
    page = await open_page(browser, stack.url)
    await page.fill("#search", target.idempotency_key[:12])
    await page.press("#search", "Enter")
    results = page.locator("#search-list li")
    await expect(results).to_have_count(1)
    await expect(results).to_contain_text(target.idempotency_key)
    await results.locator("a.run-link").click()
    await expect(page.locator("#run-title")).to_have_text("run run-a")
    await expect(page.locator("#answer-keys li.highlight code")).to_have_text(
        target.idempotency_key
    )

    await page.fill("#search", "run-b")
    await page.press("#search", "Enter")
    await expect(results.first).to_contain_text("run-b")
    await page.fill("#search", "nothing-like-this")
    await page.press("#search", "Enter")
    await expect(page.locator("#search-results")).to_contain_text("nothing found")
    await page.close()


async def test_the_endpoint_health_panel_shows_ratio_latency_and_backlog(
    stack: Stack, browser: Browser
) -> None:
    await _paused_hooks(stack)
    page = await open_page(browser, stack.url)
    await expect(page.locator("#health-title")).to_contain_text("Endpoint health (3 of 3")
    # The busiest first: hooks has 3 attempts and 1 pending, the provider recipients 2 each.
    hooks = page.locator("#table-health tbody tr").first
    await expect(hooks.locator(".health-endpoint")).to_have_text("hooks")
    await expect(hooks.locator(".health-ratio")).to_have_text("66.7% (3)")
    await expect(hooks.locator(".health-p50")).to_have_text("2.50 s")
    await expect(hooks.locator(".health-p99")).to_have_text("2.99 s")
    await expect(hooks.locator(".health-pending")).to_have_text("1")
    await expect(hooks.locator(".health-waiting")).to_have_text("1 paused")
    await expect(hooks).to_contain_text("closed")
    await page.close()
