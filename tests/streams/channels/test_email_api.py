"""The email_api channel against the fake email API: what each answer means for a delivery."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Unpack

import httpx
import pytest
from pydantic import JsonValue, ValidationError

from config.settings import Settings
from events.channels import channel_plugin, check_recipient
from events.channels.email_api import IDEMPOTENCY_KEY_DEDUPE, EmailApiSettings
from events.delivery_state import DeliveryState, Status
from events.outcomes import ErrorClass
from streams.channels.base import OutboundDelivery, SendOutcome
from streams.channels.email_api import KEY_HEADER, EmailApiChannel
from streams.channels.http import create_http_client
from streams.context import worker_context
from streams.decisions import remembered
from tests.fixtures.email_api import (
    API_KEY,
    RECIPIENT,
    SENDER,
    BackgroundFakeEmailApi,
    FakeEmailApiFactory,
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

ChannelFor = Callable[..., EmailApiChannel]


@pytest.fixture
async def channel_for() -> AsyncIterator[ChannelFor]:
    """An adapter for a fake, with EmailApiSettings fields."""
    async with create_http_client(FAST.channels) as http:

        def make(fake: BackgroundFakeEmailApi, **fields: JsonValue) -> EmailApiChannel:
            config = EmailApiSettings.model_validate(fake.channel_settings(**fields))
            return EmailApiChannel(http, config, deadline_s=FAST.channels.send_deadline_s)

        yield make


def delivery(**fields: Unpack[DeliveryChanges]) -> OutboundDelivery:
    base = outbound(
        RECIPIENT, "email_api", payload={"subject": "Report ready", "text": "It is ready."}
    )
    return dataclasses.replace(base, requested_at=datetime.now(UTC), fencing_token=3, **fields)


async def test_an_accepted_email_is_sent_and_confirmed_by_its_status(
    fake_email_api_factory: FakeEmailApiFactory, channel_for: ChannelFor
) -> None:
    fake = fake_email_api_factory(deliver_after_s=0.6)
    channel = channel_for(fake)
    d = delivery()
    result = await channel.send(d)
    assert result.outcome is SendOutcome.SENT, result.evidence
    [message] = fake.fake.messages(d.idempotency_key)
    assert result.provider_message_id == message.id
    assert (message.sender, message.to, message.subject) == (SENDER, [RECIPIENT], "Report ready")
    assert message.text == "It is ready."
    assert message.headers == {KEY_HEADER: d.idempotency_key}
    polled = dataclasses.replace(d, provider_message_id=message.id)
    queued = await channel.lookup(polled)
    assert (queued.outcome, queued.delivered, queued.provider_status) == ("found", False, "queued")
    await asyncio.sleep(0.7)
    delivered = await channel.lookup(polled)
    assert (delivered.outcome, delivered.delivered) == ("found", True), delivered.evidence
    assert f"/emails/{message.id}" in delivered.evidence


async def test_an_unknown_is_looked_up_by_key_where_the_api_offers_it(
    fake_email_api: BackgroundFakeEmailApi, channel_for: ChannelFor
) -> None:
    channel = channel_for(fake_email_api)
    d = delivery()
    assert (await channel.lookup(d)).outcome == "not_found"
    await channel.send(d)
    found = await channel.lookup(d)
    assert found.outcome == "found", found.evidence
    assert found.provider_message_id == fake_email_api.fake.messages(d.idempotency_key)[0].id
    without = channel_for(fake_email_api, lookup_by_key=False)
    assert (await without.lookup(d)).outcome == "unsupported"


async def test_the_fake_refuses_a_by_key_lookup_it_does_not_offer(
    fake_email_api_factory: FakeEmailApiFactory, channel_for: ChannelFor
) -> None:
    fake = fake_email_api_factory(lookup_by_key=False)
    # Never "not found": a lookup that is not offered must not allow a retry.
    assert (await channel_for(fake).lookup(delivery())).outcome == "lookup_error"


async def test_a_bounce_fails_with_the_providers_reason(
    fake_email_api_factory: FakeEmailApiFactory, channel_for: ChannelFor
) -> None:
    fake = fake_email_api_factory(deliver_after_s=0.0)
    channel = channel_for(fake)
    d = delivery()
    fake.fake.fault("bounce", key=d.idempotency_key, reason="550 5.1.1 no such user")
    sent = await channel.send(d)
    assert sent.outcome is SendOutcome.SENT
    looked = await channel.lookup(
        dataclasses.replace(d, provider_message_id=sent.provider_message_id)
    )
    assert (looked.outcome, looked.provider_status) == ("failed", "bounced")
    assert "550 5.1.1 no such user" in looked.evidence


async def test_429_is_not_processed_and_carries_retry_after(
    fake_email_api: BackgroundFakeEmailApi, channel_for: ChannelFor
) -> None:
    d = delivery()
    fake_email_api.fake.fault("ratelimited", key=d.idempotency_key, retry_after=7)
    result = await channel_for(fake_email_api).send(d)
    assert (result.outcome, result.error_class) == (SendOutcome.TRANSIENT, ErrorClass.HTTP_429)
    assert result.retry_after_s == 7
    assert fake_email_api.fake.messages(d.idempotency_key) == []


@pytest.mark.parametrize("case", ["reject", "bad-key"])
async def test_422_and_a_bad_api_key_are_permanent(
    fake_email_api: BackgroundFakeEmailApi, channel_for: ChannelFor, case: str
) -> None:
    d = delivery()
    if case == "reject":
        fake_email_api.fake.fault("reject", key=d.idempotency_key, message="invalid `to`")
        channel = channel_for(fake_email_api)
    else:
        channel = channel_for(fake_email_api, api_key="re_wrong")
    result = await channel.send(d)
    assert (result.outcome, result.error_class) == (SendOutcome.REJECTED, ErrorClass.HTTP_4XX)
    assert result.http_status == {"reject": 422, "bad-key": 403}[case]
    assert API_KEY not in result.evidence
    assert "re_wrong" not in result.evidence
    assert fake_email_api.fake.messages(d.idempotency_key) == []


async def test_500_or_a_timeout_after_accepting_leave_it_in_doubt(
    fake_email_api: BackgroundFakeEmailApi, channel_for: ChannelFor
) -> None:
    channel = channel_for(fake_email_api)
    first, second = delivery(), delivery()
    fake_email_api.fake.fault("error_after_accept", key=first.idempotency_key)
    fake_email_api.fake.fault("timeout_after_accept", key=second.idempotency_key, delay_s=3)
    failed = await channel.send(first)
    assert (failed.outcome, failed.error_class) == (SendOutcome.TRANSIENT, ErrorClass.HTTP_5XX)
    late = await channel.send(second)
    assert (late.outcome, late.error_class) == (
        SendOutcome.UNKNOWN,
        ErrorClass.TIMEOUT_AFTER_WRITE,
    )
    for d in (first, second):
        assert len(fake_email_api.fake.messages(d.idempotency_key)) == 1
        assert (await channel.lookup(d)).outcome == "found"


async def test_the_fake_dedupes_only_when_told(
    fake_email_api_factory: FakeEmailApiFactory, channel_for: ChannelFor
) -> None:
    plain, deduping = fake_email_api_factory(), fake_email_api_factory(dedupe=True)
    for fake, expected in ((plain, 2), (deduping, 1)):
        channel = channel_for(fake)
        d = delivery()
        again = dataclasses.replace(d, attempt=2, fencing_token=4)  # same bytes, new token
        ids = {(await channel.send(x)).provider_message_id for x in (d, again)}
        assert len(fake.fake.messages(d.idempotency_key)) == expected
        assert len(ids) == expected


async def test_without_settings_nothing_is_sent() -> None:
    async with create_http_client(FAST.channels) as http:
        channel = EmailApiChannel(http, EmailApiSettings(), deadline_s=1.0)
        result = await channel.send(delivery())
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.INVALID_RECIPIENT,
    )
    assert "LEDGER_CHANNELS__SETTINGS[email_api]" in result.evidence


def test_settings_and_recipients_are_checked() -> None:
    with pytest.raises(ValidationError, match="go together"):
        EmailApiSettings(api_url="https://api.example.org")
    with pytest.raises(ValidationError, match="from_address"):
        EmailApiSettings.model_validate(
            {"api_url": "https://a.example", "api_key": "k", "from_address": "no at sign"}
        )
    shown = repr(
        EmailApiSettings.model_validate(
            {"api_url": "https://a.example", "api_key": "s3cr3t-key", "from_address": SENDER}
        )
    )
    assert "s3cr3t-key" not in shown
    assert check_recipient("email_api", RECIPIENT) == RECIPIENT
    with pytest.raises(ValueError, match="one bare address"):
        check_recipient("email_api", "Ops <ops@example.com>")


async def test_the_24h_key_rule_applies_only_where_declared_and_within_its_window() -> None:
    key_rule = channel_plugin("email_api").capabilities.dedupe_rule
    assert key_rule == IDEMPOTENCY_KEY_DEDUPE
    assert (key_rule.name, key_rule.window_s) == ("idempotency-key-24h", 86400)
    config = {"api_url": "https://mail.example", "api_key": "k", "from_address": SENDER}
    async with httpx.AsyncClient() as http:
        for declared in (False, True):
            settings = EmailApiSettings.model_validate({**config, "provider_dedupes": declared})
            channel = EmailApiChannel(http, settings, deadline_s=1.0)
            ctx = worker_context(
                FAST.worker,
                FAST.channels,
                worker_id="w",
                producer="p",
                channels={"email_api": channel},
            )
            rule = ctx.dedupe_rule("email_api", RECIPIENT)
            assert rule == (key_rule if declared else None)
    assert rule is not None
    requested = datetime.now(UTC)
    state = DeliveryState(
        idempotency_key="k" * 64,
        run_id="run-1",
        event_type="report.ready",
        channel="email_api",
        recipient=RECIPIENT,
        payload={},
        payload_hash="h",
        slo_seconds=60,
        requested_at=requested,
        request_event_id="e1",
        status=Status.UNKNOWN,
        attempt=1,
        fencing_token=1,
    )
    assert remembered(rule, state, requested + timedelta(hours=23, minutes=59))
    assert not remembered(rule, state, requested + timedelta(hours=24))
