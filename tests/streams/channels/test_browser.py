"""The browser channel with a real Chromium against the fake form: what each page means."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from config.settings import Settings
from events.addresses import AddressPolicy
from events.channels.browser_targets import BrowserSettings
from events.outcomes import ErrorClass
from streams.channels.base import OutboundDelivery, SendOutcome, SendResult
from streams.channels.browser import BrowserChannel
from streams.channels.http import create_http_client
from streams.channels.write_guard import WriteGuard
from streams.metrics import WorkerMetrics
from tests.fixtures.form import TARGET, BackgroundFakeForm, form_target
from tests.fixtures.private import readable_by_others
from tests.streams.channels.browser_support import chromium_of_this_process
from tests.streams.channels.support import outbound

FAST = Settings(
    channels={"send_deadline_s": 6.0, "http_timeout_s": 1.0, "allowed_networks": ["127.0.0.0/8"]}
)
LOOPBACK = AddressPolicy(["127.0.0.0/8"])
SHOT = re.compile(r"\(screenshot (\S+\.png)\)")


@pytest.fixture
async def channel(fake_form: BackgroundFakeForm, tmp_path: Path) -> AsyncIterator[BrowserChannel]:
    config = BrowserSettings.model_validate({"targets": {TARGET: form_target(fake_form.app.url)}})
    async with create_http_client(FAST.channels) as http:
        browser = BrowserChannel(
            http,
            config,
            deadline_s=FAST.channels.send_deadline_s,
            screenshots=tmp_path / "shots",
            policy=LOOPBACK,
            metrics=WorkerMetrics(),
        )
        yield browser
        await browser.aclose()


def delivery(**fields: Any) -> OutboundDelivery:
    base = outbound(TARGET, "browser", payload={"title": "disk full", "body": "on db-1"})
    fields.setdefault("fencing_token", 3)
    return dataclasses.replace(base, **fields)


async def send_once(
    config: BrowserSettings, screenshots: Path, deadline_s: float = 6.0
) -> SendResult:
    """One delivery through a channel of its own (its own browser), closed after."""
    async with httpx.AsyncClient() as http:
        channel = BrowserChannel(
            http, config, deadline_s=deadline_s, screenshots=screenshots, policy=LOOPBACK
        )
        try:
            return await channel.send(delivery())
        finally:
            await channel.aclose()


def screenshot(evidence: str) -> Path:
    found = SHOT.search(evidence)
    assert found, evidence
    path = Path(found.group(1))
    assert path.stat().st_size > 0
    return path


async def test_the_confirmation_id_is_confirmed_and_the_lookup_finds_it(
    channel: BrowserChannel, fake_form: BackgroundFakeForm
) -> None:
    d = delivery()
    result = await channel.send(d)
    assert result.outcome is SendOutcome.CONFIRMED, result
    [accepted] = fake_form.app.accepted(d.idempotency_key)
    assert result.provider_message_id == accepted.id
    assert accepted.fencing_token == 3
    assert accepted.fields == {"title": "disk full", "body": "on db-1"}
    found = await channel.lookup(d)
    assert (found.outcome, found.provider_message_id) == ("found", accepted.id)
    assert (await channel.lookup(delivery())).outcome == "not_found"


async def test_a_rejection_page_fails_with_a_screenshot(
    channel: BrowserChannel, fake_form: BackgroundFakeForm
) -> None:
    d = delivery()
    fake_form.app.fault("reject", key=d.idempotency_key)
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.PROVIDER_REJECTED,
    )
    shot = screenshot(result.evidence)
    # It may show an internal page: owner only, its folder too.
    assert readable_by_others(shot.parent) == []
    assert fake_form.app.accepted(d.idempotency_key) == []


@pytest.mark.parametrize(
    ("fault", "error_class"),
    [("crash", ErrorClass.RESET_AFTER_WRITE), ("error", ErrorClass.ERROR_PAGE)],
)
async def test_after_the_submit_a_lost_answer_or_error_page_is_unknown(
    channel: BrowserChannel, fake_form: BackgroundFakeForm, fault: str, error_class: ErrorClass
) -> None:
    d = delivery()
    fake_form.app.fault(fault, key=d.idempotency_key)
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (SendOutcome.UNKNOWN, error_class), result
    screenshot(result.evidence)
    [accepted] = fake_form.app.accepted(d.idempotency_key)
    assert (await channel.lookup(d)).provider_message_id == accepted.id


async def test_a_slow_submit_past_the_deadline_is_unknown(
    channel: BrowserChannel, fake_form: BackgroundFakeForm
) -> None:
    d = delivery()
    fake_form.app.fault("slow", key=d.idempotency_key, delay_s=8)
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (
        SendOutcome.UNKNOWN,
        ErrorClass.TIMEOUT_AFTER_WRITE,
    )
    assert len(fake_form.app.accepted(d.idempotency_key)) == 1


async def test_failures_before_the_submit_submit_nothing(
    channel: BrowserChannel, fake_form: BackgroundFakeForm, tmp_path: Path
) -> None:
    refused = WriteGuard(check=lambda: "the lease has 1s left")
    result = await channel.send(delivery(), refused)
    assert (result.outcome, result.error_class) == (SendOutcome.NOT_SENT, ErrorClass.FENCED)
    # A target whose page lacks a declared selector: not submitted, with the reason.
    target = form_target(fake_form.app.url)
    target["steps"].append({"click": "#no-such-button"})
    # 3 s a step: the page's own load must not be what times out on a loaded machine (1 s
    # did once in CI: "Page.goto: Timeout 1000ms exceeded"), only the missing button.
    broken = BrowserSettings.model_validate({"targets": {TARGET: target}, "step_timeout_s": 3})
    result = await send_once(broken, tmp_path, deadline_s=10.0)
    assert (result.outcome, result.error_class) == (
        SendOutcome.NOT_SENT,
        ErrorClass.PAGE_STEP_FAILED,
    )
    assert "#no-such-button" in result.evidence
    missing = await channel.send(delivery(payload={"title": "no body"}))
    assert missing.outcome is SendOutcome.REJECTED
    assert "no field body" in missing.evidence
    assert fake_form.app.posts == 0


async def test_a_browser_crash_after_the_submit_is_unknown_and_it_is_relaunched(
    channel: BrowserChannel, fake_form: BackgroundFakeForm
) -> None:
    d = delivery()
    fake_form.app.fault("slow", key=d.idempotency_key, delay_s=8)
    # An earlier test's Chromium may still be exiting under load: only this channel's counts.
    earlier = set(chromium_of_this_process())
    sending = asyncio.create_task(channel.send(d))
    while fake_form.app.posts == 0:  # the submit is at the target: now the browser dies
        await asyncio.sleep(0.05)
    [browser] = set(chromium_of_this_process()) - earlier
    os.kill(browser, signal.SIGKILL)
    result = await sending
    assert (result.outcome, result.error_class) == (
        SendOutcome.UNKNOWN,
        ErrorClass.RESET_AFTER_WRITE,
    ), result
    assert (await channel.lookup(d)).outcome == "found"
    assert (await channel.send(delivery())).outcome is SendOutcome.CONFIRMED
    assert channel.launches == 2
    metrics = channel._metrics
    assert metrics is not None
    assert metrics.browser_restarts._value.get() == 1
    assert len(fake_form.app.accepted(d.idempotency_key)) == 1


async def test_the_fencing_token_travels_and_a_stale_one_is_refused(
    channel: BrowserChannel, fake_form: BackgroundFakeForm
) -> None:
    newer = delivery(fencing_token=5, attempt=2)
    assert (await channel.send(newer)).outcome is SendOutcome.CONFIRMED
    stale = dataclasses.replace(newer, fencing_token=4, attempt=1)
    result = await channel.send(stale)
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.PROVIDER_REJECTED,
    )
    assert "#stale" in result.evidence
    assert [s.fencing_token for s in fake_form.app.accepted(newer.idempotency_key)] == [5]


async def test_attempts_beyond_the_concurrency_wait_for_a_slot(
    fake_form: BackgroundFakeForm, tmp_path: Path
) -> None:
    config = BrowserSettings.model_validate(
        {"targets": {TARGET: form_target(fake_form.app.url)}, "concurrency": 1}
    )
    first, second = delivery(), delivery()
    fake_form.app.fault("slow", key=first.idempotency_key, delay_s=1.5)
    async with httpx.AsyncClient() as http:
        channel = BrowserChannel(
            http, config, deadline_s=6.0, screenshots=tmp_path, policy=LOOPBACK
        )
        try:
            results = await asyncio.gather(channel.send(first), channel.send(second))
        finally:
            await channel.aclose()
    assert [r.outcome for r in results] == [SendOutcome.CONFIRMED] * 2
    [a] = fake_form.app.accepted(first.idempotency_key)
    [b] = fake_form.app.accepted(second.idempotency_key)
    assert b.at - a.at >= 1.5, "the second attempt began only when the first one ended"


def search_channel(
    fake_form: BackgroundFakeForm, tmp_path: Path, http: httpx.AsyncClient, **search: Any
) -> BrowserChannel:
    """A channel whose target's lookup is the fake form's search page (``search`` overrides
    fields of it; ``box``: typed into the search box instead of a URL template)."""
    box = bool(search.pop("box", False))
    target = form_target(fake_form.app.url, lookup="search-box" if box else "search")
    target["lookup"]["search"].update(search)
    target["lookup"]["search"] = {k: v for k, v in target["lookup"]["search"].items() if v}
    # 3 s a step: under a loaded CI machine a page step of the submit took over 1 s once.
    config = BrowserSettings.model_validate({"targets": {TARGET: target}, "step_timeout_s": 3})
    return BrowserChannel(http, config, deadline_s=10.0, screenshots=tmp_path, policy=LOOPBACK)


@pytest.mark.parametrize("box", [False, True], ids=["url", "search-box"])
async def test_the_search_page_finds_an_accepted_key_and_proves_a_missing_one(
    fake_form: BackgroundFakeForm, tmp_path: Path, box: bool
) -> None:
    async with httpx.AsyncClient() as http:
        channel = search_channel(fake_form, tmp_path, http, box=box)
        try:
            d = delivery()
            assert (await channel.send(d)).outcome is SendOutcome.CONFIRMED
            [accepted] = fake_form.app.accepted(d.idempotency_key)
            found = await channel.lookup(d)
            missing = await channel.lookup(delivery())
        finally:
            await channel.aclose()
    assert (found.outcome, found.provider_message_id, found.delivered) == (
        "found",
        accepted.id,
        True,
    ), found
    assert missing.outcome == "not_found", missing
    assert "#no-results" in missing.evidence
    assert fake_form.app.posts == 1, "a lookup submits nothing"


async def test_a_search_result_of_another_key_counts_only_without_key_attribute(
    fake_form: BackgroundFakeForm, tmp_path: Path
) -> None:
    # The fake's search matches substrings: a key that is a prefix of an accepted key finds
    # that other key's submission. key_attribute tells them apart; without it, a false "found".
    async with httpx.AsyncClient() as http:
        checked = search_channel(fake_form, tmp_path, http)
        unchecked = search_channel(fake_form, tmp_path, http, key_attribute=None)
        try:
            d = delivery()
            assert (await checked.send(d)).outcome is SendOutcome.CONFIRMED
            prefix = dataclasses.replace(d, idempotency_key=d.idempotency_key[:20])
            careful = await checked.lookup(prefix)
            careless = await unchecked.lookup(prefix)
        finally:
            await checked.aclose()
            await unchecked.aclose()
    assert careful.outcome == "lookup_error", careful
    assert "none with data-key=" in careful.evidence
    assert careless.outcome == "found", "the documented hazard of leaving key_attribute out"


async def test_a_search_page_without_results_or_the_mark_is_a_lookup_error(
    fake_form: BackgroundFakeForm, tmp_path: Path
) -> None:
    async with httpx.AsyncClient() as http:
        channel = search_channel(
            fake_form, tmp_path, http, not_found={"selector": "#nothing-found"}
        )
        try:
            result = await channel.lookup(delivery())
        finally:
            await channel.aclose()
    assert result.outcome == "lookup_error", result
    assert "neither a result li.result" in result.evidence


@pytest.mark.parametrize(
    "login",
    [{"selector": "form#login"}, {"url": r"/login(\?|$)"}],
    ids=["selector", "url"],
)
async def test_a_login_page_before_the_submit_is_not_sent_with_a_screenshot(
    fake_form: BackgroundFakeForm, tmp_path: Path, login: dict[str, str]
) -> None:
    fake_form.app.login_required(True)  # the form redirects to /login
    target = {**form_target(fake_form.app.url), "login": login}
    config = BrowserSettings.model_validate({"targets": {TARGET: target}})
    result = await send_once(config, tmp_path)
    assert (result.outcome, result.error_class) == (
        SendOutcome.NOT_SENT,
        ErrorClass.LOGIN_PAGE,
    ), result
    assert "/login" in result.evidence
    screenshot(result.evidence)
    assert (fake_form.app.posts, fake_form.app.accepted()) == (0, [])


async def test_credentials_in_a_start_url_stay_out_of_the_evidence(
    fake_form: BackgroundFakeForm, tmp_path: Path
) -> None:
    """A target's ``start_url`` (and the lookup's URL) may be a signed link; the evidence,
    kept forever and shown everywhere, names it without the signature."""
    secret = "s3cr3tSIGNATURE"
    target = form_target(fake_form.app.url)
    target["start_url"] += f"?X-Amz-Signature={secret}&sig={secret}&lang=en"
    target["lookup"]["url"] += f"&access_token={secret}"
    config = BrowserSettings.model_validate({"targets": {TARGET: target}})
    async with create_http_client(FAST.channels) as http:
        channel = BrowserChannel(
            http, config, deadline_s=6.0, screenshots=tmp_path, policy=LOOPBACK
        )
        try:
            confirmed = await channel.send(delivery())
            assert confirmed.outcome is SendOutcome.CONFIRMED, confirmed
            rejected = delivery()
            fake_form.app.fault("reject", key=rejected.idempotency_key)
            refused = await channel.send(rejected)
            assert refused.outcome is SendOutcome.REJECTED, refused
            looked = await channel.lookup(delivery())
        finally:
            await channel.aclose()
    for evidence in (confirmed.evidence, refused.evidence, looked.evidence):
        assert secret not in evidence, evidence
    assert "X-Amz-Signature=REDACTED" in confirmed.evidence
    assert "lang=en" in confirmed.evidence
    assert "access_token=REDACTED" in looked.evidence, looked.evidence
