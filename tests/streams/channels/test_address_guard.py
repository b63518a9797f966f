"""The SSRF guard: a delivery cannot make the worker contact an internal address.

Against real listeners on 127.0.0.1 (the "internal service"): without an allow-list the
request never reaches them, whatever spelling of the address the recipient uses; with
127.0.0.0/8 allowed, it does. The worker then records FAILED ``blocked_address``."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from config.settings import Settings, address_policy, changed
from events.addresses import AddressPolicy
from events.outcomes import ErrorClass
from ledger.simulator.background import BackgroundSimulator
from streams.channels.base import SendOutcome
from streams.channels.http import create_http_client
from streams.channels.provider import ProviderChannel
from streams.channels.webhook import WebhookChannel
from tests.streams.channels.support import outbound

BLOCKED = [
    ("127.0.0.1", "loopback"),
    ("10.1.2.3", "private"),
    ("192.168.0.10", "private"),
    ("172.16.5.4", "private"),
    ("169.254.169.254", "link-local"),  # the cloud metadata service
    ("100.64.0.1", "not globally routable"),  # CGNAT
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("::1", "loopback"),
    ("fe80::1", "link-local"),
    ("fd00:ec2::254", "private"),  # the metadata service over IPv6
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:169.254.169.254", "link-local"),
]


@pytest.mark.parametrize(("address", "kind"), BLOCKED)
def test_internal_addresses_are_refused_by_kind(address: str, kind: str) -> None:
    reason = AddressPolicy().refuses("target.example", address)
    assert reason is not None
    assert kind in reason


EMBEDDED = [
    ("2002:7f00:1::1", "which carries 127.0.0.1, a loopback address"),  # 6to4
    ("2002:a9fe:a9fe::1", "which carries 169.254.169.254, a link-local address"),
    ("2002:a00:5::", "which carries 10.0.0.5, a private address"),
    ("64:ff9b::7f00:1", "which carries 127.0.0.1, a loopback address"),  # NAT64
    ("64:ff9b::a00:5", "which carries 10.0.0.5, a private address"),
    ("64:ff9b:1::a00:5", "a local-use NAT64 address"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo tunnel address"),
    ("2001::1", "a Teredo tunnel address"),
    ("fec0::1", "a site-local address"),
    ("fef0:1::1", "a site-local address"),
]


@pytest.mark.parametrize(("address", "says"), EMBEDDED)
def test_tunnel_and_translation_addresses_are_judged_by_what_they_reach(
    address: str, says: str
) -> None:
    reason = AddressPolicy().refuses("target.example", address)
    assert reason is not None
    assert says in reason


def test_a_tunnel_to_a_public_or_allowed_address_passes() -> None:
    assert AddressPolicy().refuses("example.com", "2002:5db8:d70e::1") is None  # 93.184.215.14
    assert AddressPolicy().refuses("example.com", "64:ff9b::5db8:d70e") is None
    # An allowed IPv4 network is allowed through its 6to4 and NAT64 spellings too.
    loopback = AddressPolicy(["127.0.0.0/8"])
    assert loopback.refuses("a", "2002:7f00:1::1") is None
    assert loopback.refuses("a", "64:ff9b::7f00:1") is None


def test_public_addresses_pass_and_allow_lists_open_exactly_what_they_name() -> None:
    assert AddressPolicy().refuses("example.com", "93.184.215.14") is None
    assert AddressPolicy().refuses("example.com", "2606:2800:21f:cb07:6820:80da:af6b:8b2c") is None
    allowed = AddressPolicy(["10.1.0.0/16"], ["hooks.internal.test"])
    assert allowed.refuses("a", "10.1.2.3") is None
    assert allowed.refuses("a", "10.2.0.1") is not None
    assert allowed.refuses("hooks.internal.test.", "10.9.9.9") is None
    assert allowed.refuses("other.internal.test", "10.9.9.9") is not None


def test_a_bad_allow_list_entry_is_named() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an IP network"):
        Settings(channels={"allowed_networks": ["10.0.0.0/33"]})


@pytest.fixture
def internal_service() -> Iterator[tuple[socket.socket, int]]:
    """A listener on 127.0.0.1 standing in for an internal admin service."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.2)
        yield listener, listener.getsockname()[1]


def connections(listener: socket.socket) -> int:
    """How many connections reached the listener (accepting what is queued)."""
    reached = 0
    while True:
        try:
            peer, _ = listener.accept()
        except TimeoutError:
            return reached
        peer.close()
        reached += 1


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "0x7f000001", "127.1"],
)
async def test_no_spelling_of_loopback_reaches_the_internal_service(
    internal_service: tuple[socket.socket, int], host: str
) -> None:
    listener, port = internal_service
    async with create_http_client(
        Settings(channels={"http_connect_timeout_s": 1.0}).channels
    ) as client:
        result = await WebhookChannel(client, Settings().channels).send(
            outbound(f"http://{host}:{port}/admin")
        )
    assert result.outcome is SendOutcome.REJECTED, result
    assert result.error_class is ErrorClass.BLOCKED_ADDRESS, result
    assert "loopback" in result.evidence
    assert connections(listener) == 0


async def test_allowed_explicitly_the_same_receiver_gets_the_delivery(
    receiver: BackgroundSimulator,
) -> None:
    settings = receiver.settings(Settings())
    delivery = outbound(receiver.webhook_url("guarded"))
    async with create_http_client(settings.channels) as client:
        refused = await WebhookChannel(client, settings.channels).send(delivery)
        looked_up = await WebhookChannel(client, settings.channels).lookup(delivery)
        by_provider = await ProviderChannel(
            client, deadline_s=settings.channels.send_deadline_s
        ).send(outbound(receiver.provider_url, channel="provider"))
    assert refused.error_class is ErrorClass.BLOCKED_ADDRESS
    assert looked_up.outcome == "lookup_error"
    assert by_provider.error_class is ErrorClass.BLOCKED_ADDRESS
    assert receiver.requests() == []  # neither the send, the lookup nor the provider call
    allowed = changed(settings, {"channels.allowed_networks": ["127.0.0.1/32"]})
    async with create_http_client(allowed.channels) as client:
        sent = await WebhookChannel(client, allowed.channels).send(delivery)
    assert sent.outcome is SendOutcome.CONFIRMED, sent
    assert receiver.accepted(delivery.idempotency_key) == 1


async def test_an_endpoints_own_allow_list_opens_its_origin_and_nothing_else(
    receiver: BackgroundSimulator, internal_service: tuple[socket.socket, int]
) -> None:
    """An internal receiver allowed for its endpoint alone: its sends and lookups go
    through; the same network on another port (the internal service) stays closed, at the
    worker and at publish."""
    listener, port = internal_service
    base = receiver.settings(Settings())
    endpoints = {
        url: endpoint.model_copy(update={"allowed_networks": ["127.0.0.1/32"]})
        for url, endpoint in base.channels.webhook_endpoints.items()
    }
    settings = changed(base, {"channels.webhook_endpoints": endpoints})
    assert settings.channels.allowed_networks == []
    delivery = outbound(receiver.webhook_url("own"))
    internal = outbound(f"http://127.0.0.1:{port}/admin")
    async with create_http_client(settings.channels) as client:
        sent = await WebhookChannel(client, settings.channels).send(delivery)
        looked_up = await WebhookChannel(client, settings.channels).lookup(delivery)
        refused = await WebhookChannel(client, settings.channels).send(internal)
    assert sent.outcome is SendOutcome.CONFIRMED, sent
    assert looked_up.outcome == "found", looked_up
    assert receiver.accepted(delivery.idempotency_key) == 1
    assert refused.error_class is ErrorClass.BLOCKED_ADDRESS, refused
    assert connections(listener) == 0
    policy = address_policy(settings.channels)
    receiver_port = int(receiver.base_url.rsplit(":", 1)[1])
    assert policy.refuses_literal("127.0.0.1", receiver_port) is None
    assert "loopback" in (policy.refuses_literal("127.0.0.1", port) or "")


def test_a_bad_endpoint_allow_list_entry_is_named() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an IP network"):
        Settings(
            channels={
                "webhook_endpoints": {
                    "https://hooks.internal/": {"allowed_networks": ["10.0.0.0/33"]}
                }
            }
        )
