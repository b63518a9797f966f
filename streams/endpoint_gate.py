"""The endpoint gate: a paused or disabled endpoint holds its deliveries (streams/gates.py).

A delivery belongs to the registry's endpoint of its channel whose address is its
recipient (for webhooks, whose URL prefix covers it, the longest winning, as for signing).
While that endpoint is disabled the delivery waits as ``disabled``, while it is paused as
``paused``; it is looked at again every ``recheck_s`` and claimed, in request order, at the
first look after the endpoint is enabled or resumed. The registry is read in memory (the
worker follows it in the background), and each recipient's endpoint is remembered until
the registry changes, so a look costs a dictionary read.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Protocol

from events.delivery_state import DeliveryState
from events.endpoints import EndpointState
from events.waiting import WaitReason
from streams.channels.endpoints import UrlPrefix, endpoint_prefix, recipient_prefix
from streams.gates import Hold, next_beat

REMEMBERED = 10_000


class Registry(Protocol):
    """What the gate reads of the registry (clients/endpoint_registry.py)."""

    @property
    def endpoints(self) -> Mapping[str, EndpointState]:
        """Every endpoint, by id."""
        ...

    @property
    def version(self) -> int:
        """Grows with every change of ``endpoints``."""
        ...

    @property
    def ready(self) -> bool:
        """True once the registry has been read to the end it had when reading began."""
        ...


class EndpointGate:
    """Holds deliveries to paused and disabled endpoints."""

    def __init__(self, registry: Registry, recheck_s: float = 1.0) -> None:
        self._registry = registry
        self._recheck = timedelta(seconds=recheck_s)
        self._version = -1
        self._webhooks: list[tuple[UrlPrefix, str]] = []
        self._exact: dict[tuple[str, str], str] = {}
        self._found: dict[tuple[str, str], str | None] = {}

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """A hold while the delivery's endpoint is disabled or paused, else None. Until
        the registry is read, every delivery waits (unrecorded): a paused endpoint's
        deliveries must not slip out at a worker's start, nor be signed with a secret the
        registry replaces."""
        if not self._registry.ready:
            return Hold(next_beat(now, self._recheck), "the endpoint registry is not read yet")
        endpoint_id = self.endpoint_of(state.channel, state.recipient)
        if endpoint_id is None:
            return None
        endpoint = self._registry.endpoints.get(endpoint_id)
        if endpoint is None:
            return None
        if endpoint.disabled is not None:
            stop, reason = endpoint.disabled, WaitReason.DISABLED
        elif endpoint.paused is not None:
            stop, reason = endpoint.paused, WaitReason.PAUSED
        else:
            return None
        detail = f"endpoint {endpoint_id} {reason.value} by {stop.by}: {stop.reason}"
        return Hold(next_beat(now, self._recheck), detail[:1000], reason)

    def endpoint_of(self, channel: str, recipient: str) -> str | None:
        """The id of the registry's endpoint a recipient of ``channel`` belongs to (the rate
        limits and the circuit breaker ask it too), or None."""
        if self._registry.version != self._version:
            self._reindex()
        key = (channel, recipient)
        if key in self._found:
            return self._found[key]
        found = self._exact.get(key)
        if found is None and channel == "webhook":
            target = recipient_prefix(recipient)
            if target is not None:
                best: UrlPrefix | None = None
                for prefix, endpoint_id in self._webhooks:
                    if prefix.covers(target) and (
                        best is None or len(prefix.segments) > len(best.segments)
                    ):
                        best, found = prefix, endpoint_id
        if len(self._found) >= REMEMBERED:
            self._found.clear()
        self._found[key] = found
        return found

    def _reindex(self) -> None:
        self._version = self._registry.version
        self._found = {}
        self._exact = {}
        self._webhooks = []
        for endpoint_id, endpoint in self._registry.endpoints.items():
            spec = endpoint.spec
            self._exact[(spec.channel, spec.address)] = endpoint_id
            if spec.channel == "webhook":
                try:
                    self._webhooks.append((endpoint_prefix(spec.address), endpoint_id))
                except ValueError:
                    continue  # refused by the CLI; a forged record only holds nothing
