"""The provider channel against the simulator: SENT vs CONFIRMED, dedupe, lookup, failures."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from config.settings import Settings
from events.outcomes import ErrorClass
from ledger.simulator.background import BackgroundSimulator
from streams.channels.base import SendOutcome
from streams.channels.http import create_http_client
from streams.channels.provider import ProviderChannel
from tests.streams.channels.support import outbound, read_request

FAST = Settings(
    channels={
        "http_timeout_s": 0.5,
        "http_connect_timeout_s": 0.5,
        "allowed_networks": ["127.0.0.0/8"],
    }
)


@pytest.fixture
async def channel() -> AsyncIterator[ProviderChannel]:
    async with create_http_client(FAST.channels) as http:
        yield ProviderChannel(http, deadline_s=FAST.channels.send_deadline_s)


async def test_queued_is_sent_and_lookup_confirms_once_delivered(
    receiver_factory: Callable[..., BackgroundSimulator], channel: ProviderChannel
) -> None:
    provider = receiver_factory(delivered_after_s=0.3)
    delivery = outbound(provider.provider_url, "provider")
    result = await channel.send(delivery)
    assert (result.outcome, result.provider_status) == (SendOutcome.SENT, "queued")
    assert result.provider_message_id is not None
    early = await channel.lookup(delivery)
    assert (early.outcome, early.delivered, early.provider_status) == ("found", False, "queued")
    for _ in range(50):  # bounded: the provider delivers after 0.3 s
        late = await channel.lookup(delivery)
        if late.delivered:
            break
        await asyncio.sleep(0.05)
    assert (late.outcome, late.delivered) == ("found", True)
    assert late.provider_message_id == result.provider_message_id
    assert provider.accepted(delivery.idempotency_key) == 1


async def test_delivered_in_the_response_confirms(
    receiver_factory: Callable[..., BackgroundSimulator], channel: ProviderChannel
) -> None:
    provider = receiver_factory(delivered_after_s=0)
    result = await channel.send(outbound(provider.provider_url, "provider"))
    assert (result.outcome, result.provider_status) == (SendOutcome.CONFIRMED, "delivered")


async def test_repeat_returns_the_same_message_and_is_accepted_once(
    receiver: BackgroundSimulator, channel: ProviderChannel
) -> None:
    delivery = outbound(receiver.provider_url, "provider")
    first = await channel.send(delivery)
    second = await channel.send(delivery)
    assert first.provider_message_id == second.provider_message_id
    assert (first.http_status, second.http_status) == (201, 200)
    event = receiver.event(delivery.idempotency_key)
    assert event is not None
    assert (event.accepted, event.received) == (1, 2)


async def test_lookup_not_found_and_error(
    receiver: BackgroundSimulator, channel: ProviderChannel
) -> None:
    delivery = outbound(receiver.provider_url, "provider")
    assert (await channel.lookup(delivery)).outcome == "not_found"
    receiver.fault("delay", delay_s=2.0, method="GET", path="/provider/messages")
    slow = await channel.lookup(delivery)
    assert slow.outcome == "lookup_error"
    assert "ReadTimeout" in slow.evidence


async def test_transport_failures_classify_like_webhooks(
    receiver: BackgroundSimulator, channel: ProviderChannel
) -> None:
    timed_out = outbound(receiver.provider_url, "provider")
    receiver.fault("delay", delay_s=2.0, key=timed_out.idempotency_key)
    result = await channel.send(timed_out)
    assert (result.outcome, result.error_class) == (
        SendOutcome.UNKNOWN,
        ErrorClass.TIMEOUT_AFTER_WRITE,
    )
    assert receiver.accepted(timed_out.idempotency_key) == 1
    error = outbound(receiver.provider_url, "provider")
    receiver.fault("error_after_accept", status=502, key=error.idempotency_key)
    result = await channel.send(error)
    assert (result.outcome, result.error_class) == (SendOutcome.TRANSIENT, ErrorClass.HTTP_5XX)
    receiver.refuse()
    refused = await channel.send(outbound(receiver.provider_url, "provider"))
    assert (refused.outcome, refused.error_class) == (
        SendOutcome.NOT_SENT,
        ErrorClass.CONNECT_REFUSED,
    )


async def test_missing_idempotency_key_is_refused_by_the_provider(
    receiver: BackgroundSimulator,
) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.post(receiver.provider_url, json={"text": "x"})
    assert answer.status_code == 400
    assert receiver.events() == {}


@pytest.mark.parametrize(
    ("body", "outcome", "error"),
    [
        (b'{"id": "m1", "status": "failed"}', SendOutcome.REJECTED, ErrorClass.PROVIDER_FAILED),
        (b'{"id": "m1", "status": "sending"}', SendOutcome.SENT, None),
        (b"accepted!", SendOutcome.SENT, ErrorClass.PROTOCOL_ERROR),
    ],
)
async def test_provider_answers_beyond_the_simulator(
    body: bytes,
    outcome: SendOutcome,
    error: ErrorClass | None,
    raw_server: Callable[[Callable[[socket.socket], None]], str],
    channel: ProviderChannel,
) -> None:
    def answer(conn: socket.socket) -> None:
        read_request(conn)
        head = f"HTTP/1.1 202 Accepted\r\nContent-Length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)

    result = await channel.send(outbound(raw_server(answer) + "/messages", "provider"))
    assert (result.outcome, result.error_class) == (outcome, error)


def test_provider_does_not_claim_receiver_dedupe() -> None:
    # Retries after UNKNOWN go through the lookup, not through the provider's dedupe window.
    channel = ProviderChannel(httpx.AsyncClient(), deadline_s=1.0)
    assert channel.receiver_dedupes("http://127.0.0.1:1/provider/messages") is False
