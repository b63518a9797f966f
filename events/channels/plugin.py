"""What a channel plugin declares: its name, its capabilities, its recipients, its settings.

A plugin has two halves. This one is light (no httpx, no faust, nothing of ``streams``):
the SDK and the CLI use it at publish time, event validation uses it on read, and
``ledger channels`` lists it. The other half, the adapter that sends and looks up, is
built by the worker only; ``adapter`` names it as ``"module:attribute"`` (imported when a
worker starts) or is the factory itself, so a plugin whose module is cheap to import may
keep both halves in one object.

The adapter factory is called with one ``streams.channels.base.AdapterBuild`` (the shared
httpx client, the channels and worker settings parts and the data dir, this plugin and
its validated configuration) and returns a
``streams.channels.base.Channel``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class Lookup(enum.StrEnum):
    """How the channel can learn, after an UNKNOWN, whether a message was accepted."""

    BY_KEY = "by_key"  # ask the receiver/provider by idempotency key
    BY_PROVIDER_ID = "by_provider_id"  # only by the id of an earlier answer (SENT polling)
    NONE = "none"  # no lookup: UNKNOWN stays for an operator unless a dedupe rule applies


class FirstAnswer(enum.StrEnum):
    """What a successful first answer proves."""

    CONFIRMED = "confirmed"  # authoritative: the message is where it was going
    SENT = "sent"  # an acceptance only (a relay, a queue): a lookup must confirm


@dataclass(frozen=True)
class DedupeRule:
    """A receiver's promise to drop a repeated key, which makes a retry after UNKNOWN safe
    without a lookup. Its ``name`` goes into the ``DeliveryRetryScheduled`` it allows.

    Never a default: the adapter applies it only where the recipient's endpoint declares
    it (``Channel.receiver_dedupes``). ``window_s`` is how long the receiver remembers a
    key (None: for good); past it, counted from the request, the rule is not relied on."""

    name: str
    description: str
    window_s: float | None = None

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(f"dedupe rule name {self.name!r} must match {NAME_PATTERN.pattern}")
        if self.window_s is not None and self.window_s <= 0:
            raise ValueError(f"dedupe rule {self.name!r}: window_s must be positive")


@dataclass(frozen=True)
class Capabilities:
    """What a channel promises, as ``ledger channels`` shows it."""

    # How the idempotency key reaches the receiver, e.g. "header webhook-id".
    key_carriers: tuple[str, ...]
    lookup: Lookup
    first_answer: FirstAnswer
    dedupe_rule: DedupeRule | None = None

    def __post_init__(self) -> None:
        if not self.key_carriers:
            raise ValueError("a channel must say how the idempotency key reaches the receiver")


def accept_any(recipient: str) -> str | None:
    """No policy refusal beyond the recipient's form."""
    del recipient
    return None


# The adapter factory; typed loosely here because its argument and result live in
# ``streams`` (streams.channels.base.AdapterFactory is the precise type).
AdapterFactory = Callable[[Any], Any]


@dataclass(frozen=True)
class ChannelPlugin:
    """One channel, as registered under the ``delivery_ledger.channels`` entry-point group.

    ``check_recipient`` decides the form of a recipient and raises ``ValueError`` with a
    one-line reason; it runs on publish and on every read of a ``DeliveryRequested``, so
    it may never get stricter for recipients already in the log. Policy that may change
    goes into ``refuse``: it returns why a recipient must not be requested (or None) and
    runs on publish and again right before each send, never on read.

    ``settings_model`` validates the channel's entry of ``LEDGER_CHANNELS__SETTINGS``
    (declare tokens and secrets as ``SecretStr``); None: the channel takes none.
    """

    name: str
    description: str
    capabilities: Capabilities
    check_recipient: Callable[[str], None]
    adapter: str | AdapterFactory
    refuse: Callable[[str], str | None] = accept_any
    settings_model: type[BaseModel] | None = None
    settings_note: str = ""  # where else its settings come from (webhook: its own)

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(f"channel name {self.name!r} must match {NAME_PATTERN.pattern}")
        if isinstance(self.adapter, str) and ":" not in self.adapter:
            raise ValueError(f"channel {self.name!r}: adapter must be 'module:attribute'")
