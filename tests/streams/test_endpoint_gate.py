"""The endpoint gate and the registry's webhook endpoints, broker-free: holds by reason,
nothing until the registry is read, secrets decrypted only with the configured keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from clients.endpoint_registry import EndpointRegistry
from clients.endpoint_secrets import (
    SecretBox,
    SecretUnreadable,
    new_encryption_key,
    new_webhook_secret,
)
from config.parts import ChannelSettings, KafkaSettings
from events.delivery_state import apply
from events.endpoints import EndpointSecret, EndpointSpec, EndpointState, disable, pause, register
from events.waiting import WaitReason
from streams.channels.endpoints import WebhookEndpoints
from streams.endpoint_gate import EndpointGate
from tests.fixtures.core import requested

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WHO = {"actor": "ana", "producer": "test"}


@dataclass
class Table:
    endpoints: dict[str, EndpointState] = field(default_factory=dict)
    version: int = 0
    ready: bool = True

    def put(self, state: EndpointState) -> None:
        self.endpoints[state.endpoint_id] = state
        self.version += 1


def test_the_gate_holds_a_paused_or_disabled_endpoints_deliveries_only() -> None:
    request = requested(1)
    state = apply(None, request)
    assert state is not None
    prefix = state.recipient.rsplit("/", 1)[0] + "/"
    table = Table()
    gate = EndpointGate(table, recheck_s=1)
    assert gate.hold(state, T0) is None, "no endpoint: no hold"
    spec = EndpointSpec(channel="webhook", address=prefix)
    endpoint = register("acme", spec, (), at=T0, existing=None, **WHO).endpoint
    table.put(endpoint)
    assert gate.hold(state, T0) is None
    table.put(pause(endpoint, "maintenance", at=T0, **WHO).endpoint)
    held = gate.hold(state, T0)
    assert held is not None
    assert (held.reason, held.recheck_at) == (WaitReason.PAUSED, T0 + timedelta(seconds=1))
    assert "paused by ana: maintenance" in held.detail
    # Held at different moments, rechecked on one beat: released in one tick, in order.
    later = [gate.hold(state, T0 + timedelta(seconds=s)) for s in (0.1, 0.5, 0.99)]
    assert {h.recheck_at for h in later if h is not None} == {T0 + timedelta(seconds=1)}
    table.put(disable(table.endpoints["acme"], "gone", at=T0, **WHO).endpoint)
    held = gate.hold(state, T0)
    assert held is not None
    assert held.reason is WaitReason.DISABLED, "disabled wins over paused"
    other = EndpointSpec(channel="webhook", address=prefix + "deeper/")
    table.put(register("deeper", other, (), at=T0, existing=None, **WHO).endpoint)
    assert gate.hold(state, T0) is not None, "a longer prefix that does not cover it: no change"
    table.ready = False
    unread = gate.hold(apply(None, requested(2)) or state, T0)
    assert unread is not None
    assert unread.reason is None, "until the registry is read, everything waits unrecorded"


def test_secrets_are_encrypted_and_only_the_configured_keys_open_them() -> None:
    old_key, new_key = new_encryption_key(), new_encryption_key()
    box = SecretBox([SecretStr(old_key)])
    secret = new_webhook_secret()
    token = box.encrypt(secret)
    assert secret not in token
    rotated = SecretBox([SecretStr(new_key), SecretStr(old_key)])
    assert rotated.decrypt(token).get_secret_value() == secret
    moved = rotated.reencrypted(token)
    assert SecretBox([SecretStr(new_key)]).decrypt(moved).get_secret_value() == secret
    with pytest.raises(SecretUnreadable):
        SecretBox([SecretStr(new_key)]).decrypt(token)


def test_registry_endpoints_sign_beside_the_settings_and_win_for_their_prefix() -> None:
    box = SecretBox([SecretStr(new_encryption_key())])
    registry = EndpointRegistry(KafkaSettings(), box)
    settings = ChannelSettings(
        webhook_secret=SecretStr(new_webhook_secret()),
        webhook_endpoints={"https://hooks.test/acme/": {"lookup_url": "https://hooks.test/old"}},
    )
    endpoints = WebhookEndpoints(settings, registry)
    assert (
        endpoints.for_recipient("https://hooks.test/acme/x").lookup_url == "https://hooks.test/old"
    )
    one, two = new_webhook_secret(), new_webhook_secret()
    now = datetime.now(UTC)
    spec = EndpointSpec(
        channel="webhook", address="https://hooks.test/acme/", lookup_url="https://hooks.test/new"
    )
    secrets = tuple(EndpointSecret(ciphertext=box.encrypt(s), added_at=now) for s in (one, two))
    registry.apply(register("acme", spec, secrets, at=now, existing=None, **WHO))
    resolved = endpoints.for_recipient("https://hooks.test/acme/x")
    assert resolved.lookup_url == "https://hooks.test/new", "the registry wins, without a restart"
    assert len(resolved.signers) == 2, "both secrets of a rotation sign"
    unreadable = EndpointRegistry(KafkaSettings(), None)
    unreadable.apply(register("acme", spec, secrets, at=now, existing=None, **WHO))
    refused = WebhookEndpoints(settings, unreadable).for_recipient("https://hooks.test/acme/x")
    assert refused.signers == (), "a secret this worker cannot read: nothing else signs for it"
