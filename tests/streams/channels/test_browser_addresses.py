"""The browser channel under the HTTP channels' address policy, and Chromium's confinement.

Real Chromium, built by the channel's own adapter from the worker's settings; the fake form
on 127.0.0.1, the only address these settings allow; a server on 127.0.0.2 (loopback, so
refused) that records every connection. Each way a target could make Chromium reach it — a
redirect, the page's own requests (iframe, image, fetch POST, WebSocket), a start URL, a
search page — must leave that server untouched and out of the screenshot.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings, changed
from events.channels import builtin
from events.channels.browser_targets import BrowserSettings
from events.outcomes import ErrorClass
from streams.channels.base import AdapterBuild, OutboundDelivery, SendOutcome
from streams.channels.browser import BrowserChannel, adapter
from streams.channels.http import create_http_client
from tests.fixtures.form import TARGET, BackgroundFakeForm, form_target, search_lookup
from tests.streams.channels.browser_support import (
    MAGENTA,
    RefusedServer,
    chromium_of_this_process,
    newest,
    png_pixels,
)
from tests.streams.channels.support import outbound

# The form's exact address only: 127.0.0.2 is loopback, outside it, so refused.
ONLY_THE_FORM = Settings(
    channels={"send_deadline_s": 6.0, "http_timeout_s": 1.0, "allowed_networks": ["127.0.0.1"]}
)
SHOT = re.compile(r"\(screenshot (\S+\.png)\)")


@pytest.fixture
async def refused() -> AsyncIterator[RefusedServer]:
    server = await RefusedServer().start()
    yield server
    await server.stop()


@pytest.fixture
def lured(fake_form: BackgroundFakeForm) -> Iterator[BackgroundFakeForm]:
    yield fake_form
    fake_form.app.lure()


@asynccontextmanager
async def channel_for(
    target: dict[str, Any], data_dir: Path, **browser: Any
) -> AsyncIterator[BrowserChannel]:
    """The channel as a worker builds it (its adapter, the worker's settings)."""
    settings = changed(ONLY_THE_FORM, {"data_dir": data_dir})
    config = BrowserSettings.model_validate({"targets": {TARGET: target}, **browser})
    async with create_http_client(settings.channels) as http:
        channel = adapter(
            AdapterBuild(
                builtin.browser, http, settings.channels, settings.worker, settings.data_dir, config
            )
        )
        try:
            yield channel
        finally:
            await channel.aclose()


def delivery() -> OutboundDelivery:
    base = outbound(TARGET, "browser", payload={"title": "disk full", "body": "on db-1"})
    return dataclasses.replace(base, fencing_token=3)


def assert_not_shown(evidence: str) -> None:
    """The attempt's screenshot exists and does not show the refused server's page."""
    found = SHOT.search(evidence)
    assert found, evidence
    colours = png_pixels(Path(found.group(1)))
    assert MAGENTA not in colours, f"the screenshot shows the refused server's page: {evidence}"


async def test_a_redirect_to_a_refused_address_is_not_followed(
    lured: BackgroundFakeForm, refused: RefusedServer, tmp_path: Path
) -> None:
    lured.app.lure(redirect=f"{refused.url}/admin")
    async with channel_for(form_target(lured.app.url), tmp_path) as channel:
        result = await channel.send(delivery())
    assert refused.connections == 0, f"Chromium followed the redirect: {refused.seen()}"
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.BLOCKED_ADDRESS,
    ), result
    assert "127.0.0.2" in result.evidence, result.evidence
    assert_not_shown(result.evidence)
    assert lured.app.posts == 0


async def test_the_pages_own_requests_to_a_refused_address_never_leave(
    lured: BackgroundFakeForm, refused: RefusedServer, tmp_path: Path
) -> None:
    # The form's page holds an iframe and an image from 127.0.0.2, POSTs the key there with
    # fetch and opens a WebSocket to it. The form itself is allowed and still submits.
    lured.app.lure(reach=refused.url)
    target = form_target(lured.app.url)
    async with channel_for(target, tmp_path) as channel:
        sent = await channel.send(delivery())
        # The same page again, made to fail before the submit: its screenshot.
        target["steps"].append({"wait": "#never-there"})
    async with channel_for(target, tmp_path, step_timeout_s=1) as failing:
        failed = await failing.send(delivery())
    assert refused.connections == 0, f"the page reached the refused server: {refused.seen()}"
    assert sent.outcome is SendOutcome.CONFIRMED, sent
    assert (failed.outcome, failed.error_class) == (
        SendOutcome.NOT_SENT,
        ErrorClass.PAGE_STEP_FAILED,
    ), failed
    assert_not_shown(failed.evidence)


async def test_a_slow_page_whose_iframe_was_refused_is_a_failed_step_not_a_blocked_address(
    lured: BackgroundFakeForm, refused: RefusedServer, tmp_path: Path
) -> None:
    # Seen in CI on a busy machine: the page's iframe was refused, then its load outlasted the
    # step timeout, and the attempt was called REJECTED blocked_address, as if the form itself
    # were at a refused address. The form was allowed; only its load was slow.
    lured.app.lure(reach=refused.url, slow_load_s=4)
    async with channel_for(form_target(lured.app.url), tmp_path, step_timeout_s=1) as channel:
        result = await channel.send(delivery())
    assert refused.connections == 0, f"the page reached the refused server: {refused.seen()}"
    assert (result.outcome, result.error_class) == (
        SendOutcome.NOT_SENT,
        ErrorClass.PAGE_STEP_FAILED,
    ), result
    assert "127.0.0.2" in result.evidence, "the refusals stay in the evidence"
    assert lured.app.posts == 0


async def test_a_start_url_at_a_refused_address_is_not_opened(
    fake_form: BackgroundFakeForm, refused: RefusedServer, tmp_path: Path
) -> None:
    target = {**form_target(fake_form.app.url), "start_url": f"{refused.url}/form"}
    async with channel_for(target, tmp_path) as channel:
        result = await channel.send(delivery())
    assert refused.connections == 0, f"Chromium opened the start URL: {refused.seen()}"
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.BLOCKED_ADDRESS,
    ), result
    assert "127.0.0.2" in result.evidence, result.evidence
    assert_not_shown(result.evidence)


async def test_a_search_page_at_a_refused_address_is_not_opened(
    fake_form: BackgroundFakeForm, refused: RefusedServer, tmp_path: Path
) -> None:
    target = {**form_target(fake_form.app.url), "lookup": search_lookup(refused.url)}
    async with channel_for(target, tmp_path, step_timeout_s=1) as channel:
        result = await channel.lookup(delivery())
    assert refused.connections == 0, f"Chromium opened the search page: {refused.seen()}"
    assert result.outcome == "lookup_error", result
    assert "127.0.0.2" in result.evidence, result


async def test_chromium_runs_sandboxed_unprivileged_without_our_environment(
    fake_form: BackgroundFakeForm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_WEBHOOK_SECRET_PROBE", "a-secret-chromium-must-not-hold")
    async with channel_for(form_target(fake_form.app.url), tmp_path) as channel:
        assert (await channel.send(delivery())).outcome is SendOutcome.CONFIRMED
        main = newest(chromium_of_this_process())
        environ = Path(f"/proc/{main}/environ").read_bytes().split(b"\0")
        command = Path(f"/proc/{main}/cmdline").read_bytes().split(b"\0")
        status = Path(f"/proc/{main}/status").read_text()
        namespaces = {
            Path(f"/proc/{pid}/ns/user").readlink()
            for pid in sandboxed_children(main)
            if Path(f"/proc/{pid}").exists()
        }
    leaked = [v.split(b"=", 1)[0].decode() for v in environ if v.startswith(b"LEDGER_")]
    assert leaked == [], f"Chromium's environment holds {leaked}"
    assert b"--no-sandbox" not in command
    [uid] = {int(n) for n in re.findall(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)[0]}
    assert uid != 0, "Chromium runs as root"
    assert namespaces, "no zygote or renderer found"
    assert Path("/proc/self/ns/user").readlink() not in namespaces, "Chromium runs unsandboxed"


def sandboxed_children(main: int) -> list[int]:
    """The renderers and the (sandboxed) zygote they fork from, descended from the Chromium
    browser process ``main``: the processes its sandbox confines."""
    parents: dict[int, int] = {}
    renderers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        sandboxed = b"--type=zygote" in command and b"--no-zygote-sandbox" not in command
        if sandboxed or b"--type=renderer" in command:
            renderers.append(int(entry.name))

    def under_main(pid: int) -> bool:
        for _ in range(5):
            pid = parents.get(pid, 0)
            if pid == main:
                return True
        return False

    return [pid for pid in renderers if under_main(pid)]


async def test_a_failed_attempt_without_a_screenshot_says_why_in_its_evidence(
    fake_form: BackgroundFakeForm, refused: RefusedServer, tmp_path: Path
) -> None:
    """The screenshot is evidence too: when it cannot be taken (here its directory is a
    file), the attempt's evidence says so, instead of only a log line."""
    not_a_dir = tmp_path / "shots"
    not_a_dir.write_text("a file where the screenshots would go")
    target = {**form_target(fake_form.app.url), "start_url": f"{refused.url}/form"}
    async with channel_for(target, tmp_path, screenshots_dir=str(not_a_dir)) as channel:
        result = await channel.send(delivery())
    assert result.error_class is ErrorClass.BLOCKED_ADDRESS, result
    assert SHOT.search(result.evidence) is None, result.evidence
    assert "(no screenshot: " in result.evidence, result.evidence
