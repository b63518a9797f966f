"""The webhook channel against the real simulator (and raw sockets): every outcome class."""

from __future__ import annotations

import base64
import json
import select
import socket
import time
from collections.abc import AsyncIterator, Callable
from email.utils import formatdate

import httpx
import pytest

from config.settings import Settings, WebhookEndpoint, changed
from events.errors import LedgerError
from events.keys import canonical_json
from events.outcomes import ErrorClass
from events.ports import free_port
from ledger.simulator.background import BackgroundSimulator
from streams.channels.base import SendOutcome
from streams.channels.http import create_http_client
from streams.channels.webhook import WebhookChannel
from tests.streams.channels.support import AddressInfo, outbound, read_request

FAST = Settings(
    channels={
        "http_timeout_s": 0.5,
        "http_connect_timeout_s": 0.5,
        "allowed_networks": ["127.0.0.0/8"],
    }
)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with create_http_client(FAST.channels) as http:
        yield http


def channel_for(receiver: BackgroundSimulator, client: httpx.AsyncClient) -> WebhookChannel:
    return WebhookChannel(client, receiver.settings(FAST).channels)


async def test_2xx_confirms_with_the_receivers_id_and_a_verified_signature(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    delivery = outbound(receiver.webhook_url("orders"), payload={"text": "héllo", "n": 2})
    result = await channel_for(receiver, client).send(delivery)
    assert result.outcome is SendOutcome.CONFIRMED
    assert result.http_status == 200
    event = receiver.event(delivery.idempotency_key)
    assert event is not None
    assert result.provider_message_id == event.receiver_id
    assert event.payload == {"text": "héllo", "n": 2}
    assert event.accepted == 1
    [request] = receiver.requests(key=delivery.idempotency_key)
    assert request.signature_ok is True
    assert request.path == "/hooks/orders"


async def test_a_repeat_is_deduped_by_webhook_id(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    channel = channel_for(receiver, client)
    delivery = outbound(receiver.webhook_url())
    first = await channel.send(delivery)
    second = await channel.send(delivery)
    assert first.outcome is second.outcome is SendOutcome.CONFIRMED
    assert first.provider_message_id == second.provider_message_id
    event = receiver.event(delivery.idempotency_key)
    assert event is not None
    assert (event.accepted, event.received, event.conflicts) == (1, 2, 0)


async def test_tampered_body_is_rejected_by_the_receiver(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    channel = channel_for(receiver, client)
    delivery = outbound(receiver.webhook_url())
    body, headers = channel.signed_request(delivery, int(time.time()))
    tampered = body.replace(b"report ready", b"report READY")
    answer = await client.post(delivery.recipient, content=tampered, headers=headers)
    assert answer.status_code == 401
    assert receiver.accepted(delivery.idempotency_key) == 0
    [request] = receiver.requests(key=delivery.idempotency_key)
    assert request.signature_ok is False
    # The untouched body with the same headers is accepted: only the tampering failed.
    answer = await client.post(delivery.recipient, content=body, headers=headers)
    assert answer.status_code == 200
    assert receiver.accepted(delivery.idempotency_key) == 1


async def test_endpoint_secret_by_longest_prefix(
    receiver_factory: Callable[..., BackgroundSimulator], client: httpx.AsyncClient
) -> None:
    secret = "whsec_" + base64.b64encode(b"secret-for-team-a-28-bytes!!").decode()
    receiver = receiver_factory(hook_secrets={"team-a": secret})
    settings = changed(
        FAST,
        {
            "channels.webhook_endpoints": {
                f"{receiver.base_url}/hooks/": WebhookEndpoint(),
                f"{receiver.base_url}/hooks/team-a": WebhookEndpoint(secret=secret),
            }
        },
    )
    channel = WebhookChannel(client, settings.channels)
    team_a = await channel.send(outbound(receiver.webhook_url("team-a")))
    other = await channel.send(outbound(receiver.webhook_url("other")))
    assert team_a.outcome is SendOutcome.CONFIRMED
    assert other.outcome is SendOutcome.CONFIRMED
    # Without the endpoint entry the default secret is used, and the receiver says 401.
    wrong = await WebhookChannel(client, FAST.channels).send(
        outbound(receiver.webhook_url("team-a"))
    )
    assert wrong.outcome is SendOutcome.REJECTED
    assert wrong.http_status == 401
    assert wrong.error_class is ErrorClass.HTTP_4XX


def test_bad_secret_fails_at_construction_without_echoing_it() -> None:
    # "abcde" is refused by the standardwebhooks library itself (5 base64 characters).
    settings = Settings(
        channels={"webhook_endpoints": {"http://x/": WebhookEndpoint(secret="whsec_abcde")}}
    )
    with pytest.raises(LedgerError, match="http://x:80/") as caught:
        WebhookChannel(httpx.AsyncClient(), settings.channels)
    assert "abcde" not in str(caught.value)
    assert caught.value.hint


async def test_connection_refused_is_not_sent(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    channel = channel_for(receiver, client)
    await channel.send(outbound(receiver.webhook_url()))  # a pooled keep-alive connection
    receiver.refuse()
    delivery = outbound(receiver.webhook_url())
    result = await channel.send(delivery)
    assert result.outcome is SendOutcome.NOT_SENT
    assert result.error_class is ErrorClass.CONNECT_REFUSED
    receiver.resume()
    assert receiver.requests(key=delivery.idempotency_key) == []
    assert (await channel.send(delivery)).outcome is SendOutcome.CONFIRMED
    assert receiver.accepted(delivery.idempotency_key) == 1


async def test_dns_failure_is_not_sent(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resolver answers "no such host" for this name without leaving the machine (tests
    # use 127.0.0.1 only); httpx's real connect path raises from it.
    real = socket.getaddrinfo

    def resolve(
        host: bytes | str | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> AddressInfo:
        if host == "receiver.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    result = await WebhookChannel(client, FAST.channels).send(
        outbound("http://receiver.invalid/hook")
    )
    assert result.outcome is SendOutcome.NOT_SENT
    assert result.error_class is ErrorClass.DNS_FAILURE


async def test_connect_timeout_is_not_sent(client: httpx.AsyncClient) -> None:
    # A listener that never accepts, with its backlog full: Linux drops further SYNs, so the
    # connect hangs until our connect timeout and nothing is written.
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        # The backlog is full once the first filler's handshake completed (listen(0)
        # queues one); the rest stay unanswered, and so will the channel's connect.
        select.select([], fillers, [], 5.0)
        result = await WebhookChannel(client, FAST.channels).send(
            outbound(f"http://127.0.0.1:{port}/h")
        )
    finally:
        for sock in [*fillers, listener]:
            sock.close()
    assert result.outcome is SendOutcome.NOT_SENT
    assert result.error_class is ErrorClass.CONNECT_TIMEOUT


async def test_delay_past_the_timeout_is_unknown_and_was_accepted(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    delivery = outbound(receiver.webhook_url())
    receiver.fault("delay", delay_s=2.0, key=delivery.idempotency_key)
    result = await channel_for(receiver, client).send(delivery)
    assert result.outcome is SendOutcome.UNKNOWN
    assert result.error_class is ErrorClass.TIMEOUT_AFTER_WRITE
    assert receiver.accepted(delivery.idempotency_key) == 1  # it did arrive


@pytest.mark.parametrize("kind", ["drop", "reset"])
async def test_accept_then_cut_connection_is_unknown(
    kind: str, receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    delivery = outbound(receiver.webhook_url())
    receiver.fault(kind, key=delivery.idempotency_key)
    result = await channel_for(receiver, client).send(delivery)
    assert result.outcome is SendOutcome.UNKNOWN
    assert result.error_class is ErrorClass.RESET_AFTER_WRITE
    assert receiver.accepted(delivery.idempotency_key) == 1
    [request] = receiver.requests(key=delivery.idempotency_key)
    assert request.status is None  # no response was ever sent


async def test_500_after_accepting_is_transient_and_the_receiver_has_it(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    delivery = outbound(receiver.webhook_url())
    receiver.fault("error_after_accept", key=delivery.idempotency_key)
    result = await channel_for(receiver, client).send(delivery)
    assert result.outcome is SendOutcome.TRANSIENT
    assert result.error_class is ErrorClass.HTTP_5XX
    assert result.http_status == 500
    assert receiver.accepted(delivery.idempotency_key) == 1


@pytest.mark.parametrize(
    ("status", "outcome", "error"),
    [
        (400, SendOutcome.REJECTED, ErrorClass.HTTP_4XX),
        (404, SendOutcome.REJECTED, ErrorClass.HTTP_4XX),
        (410, SendOutcome.REJECTED, ErrorClass.HTTP_4XX),
        (408, SendOutcome.TRANSIENT, ErrorClass.HTTP_408),
        (409, SendOutcome.TRANSIENT, ErrorClass.HTTP_409),
        (425, SendOutcome.TRANSIENT, ErrorClass.HTTP_425),
        (503, SendOutcome.TRANSIENT, ErrorClass.HTTP_5XX),
        (301, SendOutcome.REJECTED, ErrorClass.HTTP_3XX),
    ],
)
async def test_status_classes_without_acceptance(
    status: int,
    outcome: SendOutcome,
    error: ErrorClass,
    receiver: BackgroundSimulator,
    client: httpx.AsyncClient,
) -> None:
    delivery = outbound(receiver.webhook_url())
    receiver.fault("reject", status=status, key=delivery.idempotency_key)
    result = await channel_for(receiver, client).send(delivery)
    assert (result.outcome, result.error_class, result.http_status) == (outcome, error, status)
    assert receiver.accepted(delivery.idempotency_key) == 0


async def test_429_retry_after_seconds_and_http_date(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    channel = channel_for(receiver, client)
    first = outbound(receiver.webhook_url())
    receiver.fault("rate_limit", retry_after="7", key=first.idempotency_key)
    result = await channel.send(first)
    assert (result.outcome, result.error_class) == (SendOutcome.TRANSIENT, ErrorClass.HTTP_429)
    assert result.retry_after_s == 7.0
    second = outbound(receiver.webhook_url())
    when = formatdate(time.time() + 120, usegmt=True)
    receiver.fault("rate_limit", retry_after=when, key=second.idempotency_key)
    result = await channel.send(second)
    assert result.retry_after_s is not None
    assert 100 < result.retry_after_s <= 121
    assert (
        receiver.accepted(first.idempotency_key) == receiver.accepted(second.idempotency_key) == 0
    )


async def test_lookup_found_not_found_error_and_unsupported(
    receiver: BackgroundSimulator, client: httpx.AsyncClient
) -> None:
    channel = channel_for(receiver, client)
    sent = outbound(receiver.webhook_url())
    await channel.send(sent)
    found = await channel.lookup(sent)
    assert (found.outcome, found.delivered) == ("found", True)
    accepted = receiver.event(sent.idempotency_key)
    assert accepted is not None
    assert found.provider_message_id == accepted.receiver_id
    # The channel's lookups are signed (the lookup contract); an unsigned one is refused.
    unsigned = await client.get(f"{receiver.webhook_lookup_url}/{sent.idempotency_key}")
    assert unsigned.status_code == 401
    assert "missing lookup-timestamp or lookup-signature" in unsigned.text
    never = outbound(receiver.webhook_url())
    assert (await channel.lookup(never)).outcome == "not_found"
    receiver.fault("reject", status=500, method="GET", path="/hooks/lookup/")
    assert (await channel.lookup(sent)).outcome == "lookup_error"
    receiver.refuse()
    assert (await channel.lookup(sent)).outcome == "lookup_error"
    receiver.resume()
    no_lookup = WebhookChannel(client, receiver.settings(FAST, lookup=False).channels)
    unsupported = await no_lookup.lookup(sent)
    assert unsupported.outcome == "unsupported"
    assert "no lookup URL" in unsupported.evidence
    # Dedupe at the receiver is declared per endpoint, never assumed.
    assert no_lookup.receiver_dedupes(sent.recipient) is False
    declared = changed(
        FAST,
        {
            "channels.webhook_endpoints": {
                receiver.webhook_url(""): WebhookEndpoint(receiver_dedupes=True)
            }
        },
    )
    assert WebhookChannel(client, declared.channels).receiver_dedupes(sent.recipient) is True


async def test_status_then_cut_body_still_confirms(
    raw_server: Callable[[Callable[[socket.socket], None]], str], client: httpx.AsyncClient
) -> None:
    def answer_then_cut(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"id": ')

    base = raw_server(answer_then_cut)
    result = await WebhookChannel(client, FAST.channels).send(outbound(f"{base}/hook"))
    assert result.outcome is SendOutcome.CONFIRMED  # the receiver's 2xx stands
    assert "body read failed" in result.evidence


async def test_garbage_response_is_unknown_protocol_error(
    raw_server: Callable[[Callable[[socket.socket], None]], str], client: httpx.AsyncClient
) -> None:
    seen: list[bytes] = []

    def garbage(conn: socket.socket) -> None:
        seen.append(read_request(conn))
        conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")

    base = raw_server(garbage)
    delivery = outbound(f"{base}/hook")
    result = await WebhookChannel(client, FAST.channels).send(delivery)
    assert result.outcome is SendOutcome.UNKNOWN
    assert result.error_class is ErrorClass.PROTOCOL_ERROR
    # What went over the wire: the Standard Webhooks headers and the canonical JSON body.
    head, _, body = seen[0].partition(b"\r\n\r\n")
    headers = head.decode().lower()
    assert f"webhook-id: {delivery.idempotency_key}" in headers
    assert f"idempotency-key: {delivery.idempotency_key}" in headers
    assert "webhook-signature: v1," in headers
    assert body == canonical_json(delivery.payload)
    assert json.loads(body) == delivery.payload
