"""A receiver's answer is input like any other: one that cannot be decoded (60,000 ``[``,
which makes Python's JSON parser raise RecursionError) is classified, never raised, by
every channel that reads JSON answers, in send and in lookup."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from config.settings import Settings, WebhookEndpoint, changed, with_channel
from events.addresses import AddressPolicy
from events.channels.browser_targets import BrowserSettings
from events.channels.email_api import EmailApiSettings
from events.ports import free_port
from streams.channels.base import LookupResult, OutboundDelivery, SendOutcome, SendResult
from streams.channels.browser import BrowserChannel
from streams.channels.email_api import EmailApiChannel
from streams.channels.http import create_http_client
from streams.channels.provider import ProviderChannel
from streams.channels.slack import SlackChannel
from streams.channels.webhook import WebhookChannel
from tests.fixtures.form import TARGET, form_target
from tests.streams.channels.support import outbound

FAST = Settings(
    channels={"send_deadline_s": 4.0, "http_timeout_s": 2.0, "allowed_networks": ["127.0.0.0/8"]}
)
HOSTILE = b"[" * 60_000


@pytest.fixture
async def hostile() -> AsyncIterator[str]:
    """A real HTTP server on 127.0.0.1 answering every request 200 with ``HOSTILE``."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=HOSTILE, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def delivery(recipient: str, channel: str) -> OutboundDelivery:
    base = outbound(recipient, channel, payload={"subject": "s", "text": "report ready"})
    return dataclasses.replace(base, requested_at=datetime.now(UTC))


def classified(result: SendResult | LookupResult) -> None:
    assert "\n" not in result.evidence
    if isinstance(result, SendResult) and result.outcome is not SendOutcome.CONFIRMED:
        assert result.error_class is not None, result


async def test_webhook_send_and_lookup(hostile: str) -> None:
    url = f"{hostile}/hooks/a"
    settings = changed(
        FAST,
        {"channels.webhook_endpoints": {f"{hostile}/hooks/": WebhookEndpoint(lookup_url=hostile)}},
    )
    async with create_http_client(settings.channels) as http:
        channel = WebhookChannel(http, settings.channels)
        sent = await channel.send(delivery(url, "webhook"))
        looked = await channel.lookup(delivery(url, "webhook"))
    # A 2xx from the receiver itself confirms; the unreadable body only lacks an id.
    assert (sent.outcome, sent.provider_message_id) == (SendOutcome.CONFIRMED, None)
    assert looked.outcome == "lookup_error", looked
    classified(sent)
    classified(looked)


async def test_provider_send_and_lookup(hostile: str) -> None:
    url = f"{hostile}/provider/messages"
    async with create_http_client(FAST.channels) as http:
        channel = ProviderChannel(http, deadline_s=FAST.channels.send_deadline_s)
        sent = await channel.send(delivery(url, "provider"))
        looked = await channel.lookup(delivery(url, "provider"))
    assert sent.outcome is SendOutcome.SENT
    assert "unreadable answer" in sent.evidence
    assert looked.outcome == "lookup_error", looked
    classified(sent)
    classified(looked)


async def test_slack_send_and_lookup(hostile: str) -> None:
    settings = with_channel(
        FAST, "slack", {"api_url": f"{hostile}/api/", "tokens": {"acme": "xoxb-test-token"}}
    )
    async with create_http_client(settings.channels) as http:
        channel = SlackChannel(http, settings.channels, settings.worker)
        sent = await channel.send(delivery("acme/C0LEDGER01", "slack"))
        looked = await channel.lookup(delivery("acme/C0LEDGER01", "slack"))
    assert sent.outcome is SendOutcome.UNKNOWN, sent  # 200, but was it posted?
    assert looked.outcome == "lookup_error", looked
    classified(sent)
    classified(looked)


async def test_email_api_send_and_lookup(hostile: str) -> None:
    config = EmailApiSettings.model_validate(
        {"api_url": hostile, "api_key": "k" * 32, "from_address": "ledger@example.org"}
    )
    async with create_http_client(FAST.channels) as http:
        channel = EmailApiChannel(http, config, deadline_s=FAST.channels.send_deadline_s)
        sent = await channel.send(delivery("ops@example.org", "email_api"))
        looked = await channel.lookup(delivery("ops@example.org", "email_api"))
    assert sent.outcome is SendOutcome.SENT
    assert "unreadable answer" in sent.evidence
    assert looked.outcome == "lookup_error", looked
    classified(sent)
    classified(looked)


async def test_browser_list_lookup(hostile: str, tmp_path: Path) -> None:
    config = BrowserSettings.model_validate({"targets": {TARGET: form_target(hostile)}})
    async with create_http_client(FAST.channels) as http:
        channel = BrowserChannel(
            http,
            config,
            deadline_s=FAST.channels.send_deadline_s,
            screenshots=tmp_path,
            policy=AddressPolicy(["127.0.0.0/8"]),
        )
        looked = await channel.lookup(delivery(TARGET, "browser"))
    assert looked.outcome == "lookup_error", looked
    classified(looked)
