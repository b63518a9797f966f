"""Watch the deliveries topic and keep the ledger's view of every delivery, as it happens.

Used by the demo and the end-to-end benchmark: the same pure fold the worker uses, over
everything committed, plus when each delivery settled and which went through UNKNOWN.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from clients.committed_log import CommittedLog
from config.settings import Settings
from events.codec import EventDecodeError, decode
from events.delivery import DeliveryReconciled, DeliveryUnknown
from events.delivery_state import DeliveryState, Status, apply

SETTLED = frozenset({Status.CONFIRMED, Status.FAILED})


@dataclass
class LedgerObserver:
    """A read_committed reader of ``ledger.deliveries`` folding every key's state."""

    settings: Settings
    only: set[str] | None = None  # keys to follow (None: all)
    states: dict[str, DeliveryState] = field(default_factory=dict)
    settled_at: dict[str, float] = field(default_factory=dict)
    went_unknown: set[str] = field(default_factory=set)
    reconciled: set[str] = field(default_factory=set)
    # Events folded, by type (``delivery.claimed``, ``delivery.unknown``, ...).
    counts: Counter[str] = field(default_factory=Counter)
    undecodable: int = 0
    _log: CommittedLog | None = None

    async def __aenter__(self) -> Self:
        self._log = CommittedLog(self.settings.kafka)
        await self._log.start()
        try:
            partitions = await self._log.partitions(self.settings.kafka.topic_deliveries)
        except BaseException:
            await self._log.stop()
            raise
        self._log.assign(partitions, dict.fromkeys(partitions, 0))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._log is not None:
            await self._log.stop()

    async def poll(self, timeout_ms: int = 500) -> int:
        """Fold whatever arrived; returns how many records were read."""
        assert self._log is not None, "use 'async with LedgerObserver(...)'"
        batches = await self._log.read(timeout_ms=timeout_ms, max_records=5000)
        read = 0
        for messages in batches.values():
            for message in messages:
                read += 1
                self._fold(message.value)
        return read

    def _fold(self, value: bytes | None) -> None:
        try:
            event = decode(value)
        except EventDecodeError:
            self.undecodable += 1
            return
        key = getattr(event, "idempotency_key", None)
        if key is None or (self.only is not None and key not in self.only):
            return
        state = apply(self.states.get(key), event)
        if state is None:
            return
        self.states[key] = state
        self.counts[event.type] += 1
        if isinstance(event, DeliveryUnknown):
            self.went_unknown.add(key)
        if isinstance(event, DeliveryReconciled):
            self.reconciled.add(key)
        if state.status in SETTLED and key not in self.settled_at:
            self.settled_at[key] = event.occurred_at.timestamp()

    def by_status(self) -> Counter[str]:
        """Deliveries per public status (PENDING, SENT, UNKNOWN, CONFIRMED, FAILED)."""
        return Counter(state.status.public for state in self.states.values())

    def by_channel(self) -> dict[str, Counter[str]]:
        """Deliveries per public status, for each channel."""
        counts: dict[str, Counter[str]] = {}
        for state in self.states.values():
            counts.setdefault(state.channel, Counter())[state.status.public] += 1
        return counts

    @property
    def settled(self) -> int:
        """Deliveries CONFIRMED or FAILED."""
        return len(self.settled_at)

    def unknowns_reconciled(self) -> int:
        """Deliveries that went UNKNOWN and were settled by a lookup, not a blind retry."""
        return sum(1 for k in self.went_unknown if k in self.reconciled and k in self.settled_at)
