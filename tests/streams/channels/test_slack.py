"""The Slack channel against the fake Slack Web API: what each answer means for a delivery."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Unpack

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from config.settings import Settings, with_channel
from events.outcomes import ErrorClass
from ledger.simulator.slack import BOT_ID
from streams.channels import slack as slack_module
from streams.channels.base import OutboundDelivery, SendOutcome
from streams.channels.http import create_http_client
from streams.channels.slack import SlackChannel, message_arguments
from tests.fixtures.slack import (
    OTHER_APP,
    OTHER_TOKEN,
    TOKEN,
    BackgroundFakeSlack,
    FakeSlackFactory,
)
from tests.streams.channels.support import DeliveryChanges, outbound

FAST = Settings(
    channels={
        "http_timeout_s": 0.5,
        "http_connect_timeout_s": 0.5,
        "send_deadline_s": 1.0,
        "allowed_networks": ["127.0.0.0/8"],
    }
)


@pytest.fixture
async def channel(fake_slack: BackgroundFakeSlack) -> AsyncIterator[SlackChannel]:
    settings = fake_slack.settings(FAST)
    async with create_http_client(settings.channels) as http:
        yield SlackChannel(http, settings.channels, settings.worker)


def delivery(
    fake: BackgroundFakeSlack, channel: str = "C0LEDGER01", **fields: Unpack[DeliveryChanges]
) -> OutboundDelivery:
    base = outbound(fake.recipient(channel), "slack", payload={"text": "report ready"})
    return dataclasses.replace(base, requested_at=datetime.now(UTC), fencing_token=3, **fields)


async def test_ok_with_ts_is_confirmed_and_the_lookup_finds_it(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    d = delivery(fake_slack)
    result = await channel.send(d)
    assert result.outcome is SendOutcome.CONFIRMED, result.evidence
    [message] = fake_slack.fake.messages(d.idempotency_key)
    assert result.provider_message_id == f"C0LEDGER01/{message.ts}"
    assert message.body["text"] == "report ready"
    payload = message.body["metadata"]["event_payload"]
    assert message.body["metadata"]["event_type"] == "ledger_delivery"
    assert (payload["idempotency_key"], payload["fencing_token"]) == (d.idempotency_key, 3)
    found = await channel.lookup(d)
    assert (found.outcome, found.delivered) == ("found", True)
    assert found.provider_message_id == result.provider_message_id
    [history] = fake_slack.fake.calls("conversations.history")
    assert history.http_method == "GET"


async def test_a_payload_without_text_is_sent_as_its_json(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    d = dataclasses.replace(delivery(fake_slack), payload={"n": 1, "run": "r"})
    assert (await channel.send(d)).outcome is SendOutcome.CONFIRMED
    assert fake_slack.fake.messages(d.idempotency_key)[0].body["text"] == '{"n":1,"run":"r"}'


async def test_lookup_not_found_pages_through_history(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slack_module, "PAGE_SIZE", 2)
    target = delivery(fake_slack)
    await channel.send(target)  # the oldest: found only on the last page
    for _ in range(4):
        await channel.send(delivery(fake_slack))
    found = await channel.lookup(target)
    assert found.outcome == "found", found.evidence
    assert "page 3" in found.evidence
    missing = await channel.lookup(delivery(fake_slack))
    assert missing.outcome == "not_found", missing.evidence
    cursors = list(fake_slack.fake.calls("conversations.history"))
    assert len(cursors) == 6  # 3 pages each, every one answered


async def test_lookup_beyond_the_page_bound_is_an_error_not_not_found(
    fake_slack: BackgroundFakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slack_module, "PAGE_SIZE", 1)
    settings = with_channel(fake_slack.settings(FAST), "slack", {"lookup_max_pages": 2})
    async with create_http_client(settings.channels) as http:
        channel = SlackChannel(http, settings.channels, settings.worker)
        for _ in range(3):
            await channel.send(delivery(fake_slack))
        result = await channel.lookup(delivery(fake_slack))
    assert result.outcome == "lookup_error"
    assert "more than 2 pages" in result.evidence


async def test_lookup_starts_at_the_request(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    d = delivery(fake_slack)
    await channel.send(d)
    later = dataclasses.replace(d, requested_at=datetime.now(UTC).replace(year=2100))
    assert (await channel.lookup(later)).outcome == "not_found"


async def test_ratelimited_is_not_processed_with_its_retry_after(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    fake_slack.fake.fault("ratelimited", retry_after=3)
    d = delivery(fake_slack)
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (SendOutcome.TRANSIENT, ErrorClass.HTTP_429)
    assert result.retry_after_s == 3
    assert fake_slack.posted(d.idempotency_key) == 0


@pytest.mark.parametrize("error", ["channel_not_found", "is_archived", "not_in_channel"])
async def test_permanent_errors_fail(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel, error: str
) -> None:
    fake_slack.fake.fault("error", error=error)
    result = await channel.send(delivery(fake_slack))
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.PROVIDER_REJECTED,
    )
    assert error in result.evidence


async def test_a_conversation_that_does_not_exist_fails(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    result = await channel.send(delivery(fake_slack, "C0NOSUCH"))
    assert result.outcome is SendOutcome.REJECTED
    assert "channel_not_found" in result.evidence
    assert (await channel.lookup(delivery(fake_slack, "C0NOSUCH"))).outcome == "lookup_error"


async def test_500_after_post_is_transient_for_the_lookup(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    fake_slack.fake.fault("error_after_post")
    d = delivery(fake_slack)
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (SendOutcome.TRANSIENT, ErrorClass.HTTP_5XX)
    assert (await channel.lookup(d)).outcome == "found"


async def test_timeout_after_post_is_unknown(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    fake_slack.fake.fault("timeout_after_post", delay_s=2)
    d = delivery(fake_slack)
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (
        SendOutcome.UNKNOWN,
        ErrorClass.TIMEOUT_AFTER_WRITE,
    )
    assert fake_slack.posted(d.idempotency_key) == 1


async def test_an_unknown_error_is_unknown_never_a_guess(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    fake_slack.fake.fault("error", error="fatal_error")
    result = await channel.send(delivery(fake_slack))
    assert result.outcome is SendOutcome.UNKNOWN


async def test_a_workspace_without_a_token_is_not_sent(
    fake_slack_factory: FakeSlackFactory,
) -> None:
    fake = fake_slack_factory()
    settings = with_channel(fake.settings(FAST), "slack", {"tokens": {}})
    async with create_http_client(settings.channels) as http:
        result = await SlackChannel(http, settings.channels, settings.worker).send(delivery(fake))
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.INVALID_RECIPIENT,
    )
    assert "LEDGER_CHANNELS__SETTINGS" in result.evidence
    assert fake.fake.calls() == []


async def test_a_wrong_token_fails_and_is_never_shown(fake_slack: BackgroundFakeSlack) -> None:
    settings = with_channel(
        fake_slack.settings(FAST), "slack", {"tokens": {"acme": "xoxb-not-the-right-one"}}
    )
    async with create_http_client(settings.channels) as http:
        result = await SlackChannel(http, settings.channels, settings.worker).send(
            delivery(fake_slack)
        )
    assert result.outcome is SendOutcome.REJECTED
    assert "invalid_auth" in result.evidence
    assert "xoxb" not in result.evidence
    assert TOKEN not in repr(settings)


async def test_another_apps_message_with_the_key_is_not_ours(
    fake_slack: BackgroundFakeSlack, channel: SlackChannel
) -> None:
    # Another app in the conversation copies our metadata (the official SDK, its own token):
    # the lookup must not take it for our post, or an undelivered key turns CONFIRMED.
    d = delivery(fake_slack)
    other = AsyncWebClient(token=OTHER_TOKEN, base_url=fake_slack.api_url)
    metadata = message_arguments(d, "C0LEDGER01")["metadata"]
    assert isinstance(metadata, dict)
    await other.chat_postMessage(channel="C0LEDGER01", text="not yours", metadata=metadata)
    missing = await channel.lookup(d)
    assert missing.outcome == "not_found", missing.evidence
    assert not missing.delivered
    assert f"by bot {OTHER_APP.bot_id}" in missing.evidence  # named for an operator
    [auth] = fake_slack.fake.calls("auth.test")  # our bot learnt from our token
    assert auth.status == 200
    # Our own post of the key is found, and only it: the provider id is our message's.
    sent = await channel.send(d)
    await other.chat_postMessage(channel="C0LEDGER01", text="again", metadata=metadata)
    found = await channel.lookup(d)
    assert (found.outcome, found.delivered) == ("found", True)
    assert found.provider_message_id == sent.provider_message_id
    [ours] = fake_slack.fake.messages(d.idempotency_key, bot_id=BOT_ID)
    assert found.provider_message_id == f"C0LEDGER01/{ours.ts}"
    assert len(fake_slack.fake.messages(d.idempotency_key)) == 3


async def test_our_bot_is_learnt_once_per_workspace(fake_slack: BackgroundFakeSlack) -> None:
    settings = fake_slack.settings(FAST)
    async with create_http_client(settings.channels) as http:
        looker = SlackChannel(
            http, settings.channels, settings.worker
        )  # never posted: asks auth.test, once
        for _ in range(3):
            assert (await looker.lookup(delivery(fake_slack))).outcome == "not_found"
        assert len(fake_slack.fake.calls("auth.test")) == 1
        sender = SlackChannel(
            http, settings.channels, settings.worker
        )  # its post's answer names our bot
        d = delivery(fake_slack)
        await sender.send(d)
        assert (await sender.lookup(d)).outcome == "found"
        assert len(fake_slack.fake.calls("auth.test")) == 1


async def test_a_token_auth_test_refuses_is_a_lookup_error(
    fake_slack: BackgroundFakeSlack,
) -> None:
    fake_slack.fake.fault("error", method="auth.test", error="token_revoked")
    settings = fake_slack.settings(FAST)
    async with create_http_client(settings.channels) as http:
        result = await SlackChannel(http, settings.channels, settings.worker).lookup(
            delivery(fake_slack)
        )
    assert result.outcome == "lookup_error", result.evidence
    assert "token_revoked" in result.evidence
    assert TOKEN not in result.evidence
    assert fake_slack.fake.calls("conversations.history") == []
