"""The contract every channel adapter keeps: send with the idempotency key, look up by it.

A send never raises for delivery problems: it returns a ``SendResult`` whose ``outcome``
says what we now know, and whose ``error_class`` names why (recorded in the log).

An adapter is the heavy half of a channel plugin (``events.channels.plugin``): the
plugin's ``adapter`` is an ``AdapterFactory``, called once per worker with an
``AdapterBuild``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from config.parts import ChannelSettings, WorkerSettings
    from streams.metrics import WorkerMetrics

import httpx
from pydantic import BaseModel, JsonValue

from events.channels.plugin import ChannelPlugin
from events.contract import FENCING_TOKEN_HEADER as FENCING_TOKEN_HEADER
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.write_guard import WriteGuard


class SendOutcome(enum.StrEnum):
    """What a single send attempt proved."""

    CONFIRMED = "confirmed"  # authoritative acknowledgement (receiver 2xx / provider delivered)
    SENT = "sent"  # provider accepted (e.g. "queued"), not yet authoritative
    UNKNOWN = "unknown"  # the request may have left (timeout/reset after write)
    NOT_SENT = "not_sent"  # provably nothing left (connection refused, DNS failure)
    TRANSIENT = "transient"  # 429 / 5xx: the receiver answered "not now"; may have accepted
    REJECTED = "rejected"  # permanent 4xx


@dataclass(frozen=True)
class OutboundDelivery:
    """What an adapter needs to send one attempt of one logical delivery."""

    idempotency_key: str
    run_id: str
    event_type: str
    channel: str
    recipient: str
    payload: JsonValue
    attempt: int
    fencing_token: int
    # When the delivery was requested: no attempt of it can be older, so a lookup that
    # lists messages by time (Slack's conversations.history) starts here.
    requested_at: datetime | None = None
    # The provider's id from an earlier answer of this delivery (a SENT, or a lookup that
    # found it): a channel that can only look messages up by id (``Lookup.BY_PROVIDER_ID``)
    # polls with it.
    provider_message_id: str | None = None
    # The W3C trace context to send the receiver (a ``traceparent`` header, where the
    # channel has headers): the send's span, or the request's context when tracing is off.
    traceparent: str | None = None


@dataclass(frozen=True)
class SendResult:
    """The classified result of one attempt."""

    outcome: SendOutcome
    evidence: str
    error_class: ErrorClass | None = None
    http_status: int | None = None
    provider_message_id: str | None = None
    provider_status: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True)
class LookupResult:
    """What the receiver/provider says about an idempotency key."""

    outcome: LookupOutcome
    evidence: str
    provider_message_id: str | None = None
    provider_status: str | None = None
    delivered: bool = False  # authoritative: the logical event reached its recipient


# FENCING_TOKEN_HEADER (imported above from events.contract, re-exported for the channels)
# carries the attempt's fencing token on every request (README): it grows per key, so a
# receiver that remembers the highest token per key can refuse a stale attempt, the one
# fence a paused process cannot slip past.


class Channel(Protocol):
    """A delivery channel adapter."""

    name: str

    def receiver_dedupes(self, recipient: str) -> bool:
        """True when this recipient's receiver is declared to dedupe on the idempotency key,
        which makes a retry after UNKNOWN safe without a lookup."""
        ...

    def settle_s(self, recipient: str) -> float | None:
        """How long after an UNKNOWN this recipient may still be processing (None: default)."""
        ...

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """Make one attempt, with the idempotency key and the fencing token; ``guard`` runs
        right before the first byte; classify what happened (never raises for delivery)."""
        ...

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """Ask the receiver/provider whether it accepted this idempotency key."""
        ...


@dataclass(frozen=True)
class AdapterBuild:
    """What a channel's adapter factory gets from the worker that builds it."""

    plugin: ChannelPlugin
    # The one pooled client every channel shares: its transport enforces the address
    # policy and runs the ``WriteGuard`` right before the first byte (the lease rule).
    client: httpx.AsyncClient
    # The settings an adapter may read: every channel's part (deadlines, the address
    # policy, webhook endpoints), the worker's (clock skew, lookup timing), the data dir.
    channels: ChannelSettings
    worker: WorkerSettings
    data_dir: Path
    # The channel's LEDGER_CHANNELS__SETTINGS entry, validated by ``plugin.settings_model``.
    config: BaseModel | None
    # The worker's metrics, for what an adapter counts itself (a browser restarted).
    metrics: WorkerMetrics | None = None

    @property
    def deadline_s(self) -> float:
        """This channel's hard total deadline per send or lookup (LEDGER_CHANNELS__SEND_DEADLINES,
        else LEDGER_CHANNELS__SEND_DEADLINE_S); the sender's lease rule uses the same one."""
        return self.channels.deadline_for(self.plugin.name)


class AdapterFactory(Protocol):
    """Builds a channel's adapter at worker start; raise ``ConfigError`` to refuse."""

    def __call__(self, build: AdapterBuild, /) -> Channel:
        """The adapter for ``build.plugin``."""
        ...
