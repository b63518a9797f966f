"""The sender: turns live claims into requests, and due lookups into reconciliations.

It acts only on claims the state machine accepted after reading them back from the log,
and only on claims this worker made (a claim read back by another process, e.g. after a
rebalance or a crash, is left to its lease). Each (key, token) is sent at most once per
process. Outcomes are appended outside the processor's transaction; the fold dedupes and
fences them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

from events.base import Event
from events.delivery_state import DeliveryState
from events.faults import crash_if_enabled
from streams.channels.base import Channel, OutboundDelivery
from streams.decisions import Context, after_lookup, after_send
from streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)

BEFORE_SEND = "worker.before_send"
AFTER_RESPONSE = "worker.after_response"
STARTED_MEMORY = 200_000

Append = Callable[[Sequence[Event]], Awaitable[None]]


class Sender:
    """Bounded-concurrency sends and lookups; many keys in flight per partition."""

    def __init__(
        self,
        channels: Mapping[str, Channel],
        ctx: Context,
        append: Append,
        clock: Callable[[], datetime],
        concurrency: int,
        faults: frozenset[str] = frozenset(),
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._channels = channels
        self._metrics = metrics
        self._ctx = ctx
        self._append = append
        self._clock = clock
        self._slots = asyncio.Semaphore(concurrency)
        self._faults = faults
        # Bounded memory of what this process started: a claim re-read after a rebalance
        # back to this worker must not be sent twice.
        self._started: OrderedDict[tuple[str, int, str], None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.counts: Counter[str] = Counter()
        self.failures = 0

    @property
    def in_flight(self) -> int:
        """Sends and lookups not finished yet."""
        return len(self._tasks)

    def submit_send(self, state: DeliveryState) -> bool:
        """Start the attempt ``state`` claims, unless this process already started it."""
        marker = (state.idempotency_key, state.fencing_token, "send")
        if not self._mark(marker):
            return False
        self._spawn(self._send(state), marker)
        return True

    def submit_lookup(self, state: DeliveryState) -> bool:
        """Ask the provider about ``state``'s key, once per (token, lookup number)."""
        marker = (state.idempotency_key, state.fencing_token * 1000 + state.lookups, "lookup")
        if not self._mark(marker):
            return False
        self._spawn(self._lookup(state), marker)
        return True

    def _mark(self, marker: tuple[str, int, str]) -> bool:
        if marker in self._started:
            return False
        self._started[marker] = None
        if len(self._started) > STARTED_MEMORY:
            self._started.popitem(last=False)
        return True

    async def drain(self, timeout_s: float) -> None:
        """Wait for in-flight work (bounded); what does not finish is left to leases."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    def _spawn(self, work: Awaitable[None], marker: tuple[str, int, str]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                # Loud, counted, and safe: the claim's lease expires and the lookup decides.
                self.failures += 1
                log.error("sender task for %s failed", marker, exc_info=finished.exception())

        task.add_done_callback(done)

    def _outbound(self, state: DeliveryState) -> OutboundDelivery:
        return OutboundDelivery(
            idempotency_key=state.idempotency_key,
            run_id=state.run_id,
            event_type=state.event_type,
            channel=state.channel,
            recipient=state.recipient,
            payload=state.payload,
            attempt=state.attempt,
            fencing_token=state.fencing_token,
        )

    async def _send(self, state: DeliveryState) -> None:
        async with self._slots:
            crash_if_enabled(BEFORE_SEND, self._faults)
            began = time.perf_counter()
            result = await self._channels[state.channel].send(self._outbound(state))
            crash_if_enabled(AFTER_RESPONSE, self._faults)
            self.counts[f"send:{state.channel}:{result.outcome}"] += 1
            if self._metrics is not None:
                self._metrics.send_seconds.labels(state.channel).observe(
                    time.perf_counter() - began
                )
                self._metrics.sends.labels(state.channel, str(result.outcome)).inc()
            events = after_send(state, state.fencing_token, result, self._clock(), self._ctx)
            await self._append(events)

    async def _lookup(self, state: DeliveryState) -> None:
        async with self._slots:
            result = await self._channels[state.channel].lookup(self._outbound(state))
            self.counts[f"lookup:{state.channel}:{result.outcome}"] += 1
            if self._metrics is not None:
                self._metrics.lookups.labels(state.channel, result.outcome).inc()
            await self._append(after_lookup(state, result, self._clock(), self._ctx))
