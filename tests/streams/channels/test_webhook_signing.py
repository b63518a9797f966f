"""Which secret signs what: the official library's secret parsing, rotation (every active
secret signs), endpoint matching on the parsed URL, and no secret = nothing signed.

Receivers verify with ``standardwebhooks`` (the simulator, and ``Webhook(secret).verify``
here), so a sender that parses or signs differently shows as a 401 or a raised error.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from config.settings import Settings, WebhookEndpoint, changed
from events.errors import LedgerError
from events.outcomes import ErrorClass
from ledger.simulator.background import BackgroundSimulator
from streams.channels.base import SendOutcome
from streams.channels.http import create_http_client
from streams.channels.webhook import WebhookChannel
from tests.streams.channels.support import outbound


def whsec(raw: bytes) -> str:
    return "whsec_" + base64.b64encode(raw).decode()


GLOBAL = whsec(b"global-signing-secret-for-tests")
CUSTOMER = whsec(b"customer-endpoint-secret")
# 26 bytes: base64 ends in one "=", which this secret leaves out. The library adds
# padding itself, so its receivers accept the secret; the sender must too.
UNPADDED = whsec(b"unpadded-26-byte-key-here!").rstrip("=")
OLD, NEW = whsec(b"rotation-old-secret-24-by"), whsec(b"rotation-new-secret-24-by")
FAST = Settings(
    channels={
        "http_timeout_s": 0.5,
        "http_connect_timeout_s": 0.5,
        "allowed_networks": ["127.0.0.0/8"],
        "webhook_secret": GLOBAL,
    }
)
Factory = Callable[..., BackgroundSimulator]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with create_http_client(FAST.channels) as http:
        yield http


def with_endpoints(**endpoints: WebhookEndpoint) -> Settings:
    return changed(FAST, {"channels.webhook_endpoints": endpoints})


def verifies(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    """Does ``Webhook(secret).verify`` (the official library) accept this request?"""
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


async def test_an_unpadded_secret_the_library_accepts_signs_and_verifies(
    receiver_factory: Factory, client: httpx.AsyncClient
) -> None:
    assert len(UNPADDED.removeprefix("whsec_")) % 4 != 0
    receiver = receiver_factory(webhook_secret=GLOBAL, hook_secrets={"team": UNPADDED})
    settings = changed(
        FAST,
        {
            "channels.webhook_endpoints": {
                f"{receiver.base_url}/hooks/team": WebhookEndpoint(secret=UNPADDED)
            }
        },
    )
    delivery = outbound(receiver.webhook_url("team"))
    result = await WebhookChannel(client, settings.channels).send(delivery)
    assert result.outcome is SendOutcome.CONFIRMED, result.evidence
    [request] = receiver.requests(key=delivery.idempotency_key)
    assert request.signature_ok is True


async def test_during_a_rotation_every_active_secret_signs(
    receiver_factory: Factory, client: httpx.AsyncClient
) -> None:
    # Two receivers of one endpoint: one still on the old secret, one already on the new.
    receiver = receiver_factory(webhook_secret=GLOBAL, hook_secrets={"old": OLD, "new": NEW})
    settings = with_endpoints(
        **{f"{receiver.base_url}/hooks/": WebhookEndpoint(secrets=[OLD, NEW])}
    )
    channel = WebhookChannel(client, settings.channels)
    for name in ("old", "new"):
        result = await channel.send(outbound(receiver.webhook_url(name)))
        assert result.outcome is SendOutcome.CONFIRMED, (name, result.evidence)
    # The header carries one v1 entry per secret, and each secret alone verifies it.
    body, headers = channel.signed_request(outbound(receiver.webhook_url("old")), int(time.time()))
    entries = headers["webhook-signature"].split(" ")
    assert [entry.split(",", 1)[0] for entry in entries] == ["v1", "v1"]
    assert verifies(OLD, body, headers)
    assert verifies(NEW, body, headers)
    assert not verifies(GLOBAL, body, headers)


@pytest.mark.parametrize(
    "recipient",
    [
        "https://api.customer.test@evil.test/x",  # userinfo: the host is evil.test
        "https://api.customer.test.evil.test/x",  # a longer host name
        "http://api.customer.test/x",  # another scheme
        "https://api.customer.test:8443/x",  # another port
        "https://api.customer.testevil/x",
    ],
)
def test_a_lookalike_recipient_is_not_signed_with_the_endpoints_secret(recipient: str) -> None:
    channel = WebhookChannel(
        httpx.AsyncClient(),
        with_endpoints(**{"https://api.customer.test": WebhookEndpoint(secret=CUSTOMER)}).channels,
    )
    body, headers = channel.signed_request(outbound(recipient), int(time.time()))
    assert not verifies(CUSTOMER, body, headers)
    assert verifies(GLOBAL, body, headers)


@pytest.mark.parametrize(
    ("recipient", "customers"),
    [
        ("https://api.customer.test/hooks", True),
        ("https://api.customer.test/hooks/", True),
        ("https://API.Customer.test:443/hooks/a?x=1", True),  # case, default port, query
        ("https://api.customer.test/hooksevil", False),  # not on a segment boundary
        ("https://api.customer.test/hooks/../admin", False),  # is /admin when sent
        ("https://api.customer.test/hooks/%2e%2e/admin", False),
        ("https://api.customer.test/other", False),
    ],
)
def test_a_path_prefix_matches_on_segment_boundaries(recipient: str, customers: bool) -> None:
    channel = WebhookChannel(
        httpx.AsyncClient(),
        with_endpoints(
            **{"https://api.customer.test/hooks": WebhookEndpoint(secret=CUSTOMER)}
        ).channels,
    )
    body, headers = channel.signed_request(outbound(recipient), int(time.time()))
    assert verifies(CUSTOMER, body, headers) is customers
    assert verifies(GLOBAL, body, headers) is not customers


async def test_a_neighbouring_path_gets_its_own_secret_at_a_real_receiver(
    receiver_factory: Factory, client: httpx.AsyncClient
) -> None:
    # /hooks/team has its own secret; /hooks/teamevil is another endpoint (the global one).
    receiver = receiver_factory(webhook_secret=GLOBAL, hook_secrets={"team": CUSTOMER})
    channel = WebhookChannel(
        client,
        with_endpoints(
            **{f"{receiver.base_url}/hooks/team": WebhookEndpoint(secret=CUSTOMER)}
        ).channels,
    )
    for name in ("team", "teamevil"):
        result = await channel.send(outbound(receiver.webhook_url(name)))
        assert result.outcome is SendOutcome.CONFIRMED, (name, result.evidence)


async def test_without_a_global_secret_a_recipient_outside_every_endpoint_is_not_sent(
    receiver_factory: Factory, client: httpx.AsyncClient
) -> None:
    receiver = receiver_factory(webhook_secret=GLOBAL, hook_secrets={"team": CUSTOMER})
    settings = changed(
        FAST,
        {
            "channels.webhook_secret": None,
            "channels.webhook_endpoints": {
                f"{receiver.base_url}/hooks/team": WebhookEndpoint(secret=CUSTOMER)
            },
        },
    )
    channel = WebhookChannel(client, settings.channels)
    assert (await channel.send(outbound(receiver.webhook_url("team")))).outcome is (
        SendOutcome.CONFIRMED
    )
    stray = outbound(receiver.webhook_url("other"))
    result = await channel.send(stray)
    assert result.outcome is SendOutcome.REJECTED
    assert result.error_class is ErrorClass.INVALID_RECIPIENT
    assert "LEDGER_CHANNELS__WEBHOOK_SECRET" in result.evidence
    assert receiver.requests(key=stray.idempotency_key) == []


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("https://user:TopSecret@hooks.example.test/", "has credentials in it"),
        ("https://hooks.example.test/?token=TopSecret", "has a query or fragment"),
        ("ftp://hooks.example.test/TopSecret", "is not an http:// or https:// URL"),
    ],
)
def test_a_bad_endpoint_key_is_refused_at_start_without_repeating_it(key: str, says: str) -> None:
    with pytest.raises(LedgerError) as caught:
        WebhookChannel(httpx.AsyncClient(), with_endpoints(**{key: WebhookEndpoint()}).channels)
    assert says in caught.value.message
    assert "TopSecret" not in caught.value.message + caught.value.hint


def test_two_keys_for_one_endpoint_are_refused() -> None:
    settings = with_endpoints(
        **{
            "https://hooks.example.test/a": WebhookEndpoint(secret=CUSTOMER),
            "https://HOOKS.example.test:443/a/": WebhookEndpoint(secret=OLD),
        }
    )
    with pytest.raises(LedgerError, match="configured twice"):
        WebhookChannel(httpx.AsyncClient(), settings.channels)
