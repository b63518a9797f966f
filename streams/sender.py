"""The sender: turns live claims into requests, and due lookups into reconciliations.

It acts only on claims the state machine accepted after reading them back from the log,
and only on claims this worker made. Each (key, token) is sent at most once per process.
Right before the first byte of a send is written (``WriteGuard``), the lease rule is
checked again: the claim is still the current one, this process still owns the
partition, and the lease has more left than the channel's hard deadline
(LEDGER_CHANNELS__SEND_DEADLINES, else the global one) plus the clock-skew margin. A refused or
cancelled send records ``DeliveryNotSent``, so the next attempt needs no lookup. Outcomes
are appended outside the processor's record; the fold dedupes and fences.

A send to a rate-limited endpoint waits for its turn first (``SendPacer``,
streams/send_pacer.py), inside its send slot and before the channel builds the request, so
the guard judges the lease at the moment the send actually leaves; a send whose turn comes
after its lease would let it start is recorded not sent (``lease``) without waiting.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from clients import tracing
from clients.tracing import span
from events.admission import refusal
from events.base import Event
from events.delivery import DeliveryClaimed, DeliveryConfirmed
from events.delivery_state import DeliveryState, Status, lookup_turn
from events.faults import crash_if_enabled
from events.outcomes import ErrorClass, LookupOutcome
from events.refusal import one_line
from streams.channels.base import (
    Channel,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.write_guard import SendRefused, WriteGuard
from streams.decisions import Context, after_lookup, after_send, released
from streams.delivery_spans import attempt_attributes, outcome_attributes
from streams.metrics import WorkerMetrics
from streams.send_pacer import SendPacer

log = logging.getLogger(__name__)

BEFORE_SEND = "worker.before_send"
AFTER_RESPONSE = "worker.after_response"
STARTED_MEMORY = 200_000

Append = Callable[[Sequence[Event]], Awaitable[None]]
CurrentState = Callable[[str], DeliveryState | None]
# What this process started: (key, "send", token) or (key, "lookup", the state's turn).
Marker = tuple[str, str, int | tuple[int, Status, int]]


class SendRefusal(enum.StrEnum):
    """Why a send was not written (the ``reason`` of ``ledger_worker_refused_sends``)."""

    LEASE = "lease"  # too little lease left for the channel's deadline and the skew margin
    PARTITION = "partition"  # this process no longer owns the partition
    TOKEN = "token"  # noqa: S105 - a label: the claim is no longer the current one
    REVOKED = "revoked"  # the partition was revoked before the send began
    SHUTDOWN = "shutdown"  # the worker stopped before the send began
    CLOCK = "clock"  # this worker does not act: its clock is off the broker's
    OTHER = "other"


@dataclass(frozen=True)
class Refusal:
    """A send this process will not write: the typed reason, and the words for evidence."""

    label: SendRefusal
    reason: str


REVOKED = Refusal(SendRefusal.REVOKED, "partition revoked before the send began")
SHUTDOWN = Refusal(SendRefusal.SHUTDOWN, "worker shutting down before the send began")
MOVED_UNREAD = Refusal(
    SendRefusal.REVOKED, "the claim's partition moved to another worker before it was read back"
)
SHUTDOWN_UNREAD = Refusal(
    SendRefusal.SHUTDOWN, "worker shutting down before the claim was read back"
)


@dataclass
class _Work:
    """One send or lookup this process runs, and what it may still do."""

    key: str
    token: int
    partition: int
    kind: Literal["send", "lookup"]
    guard: WriteGuard = field(default_factory=WriteGuard)
    stopped: Refusal | None = None  # why this process took the work back before its write
    refused: Refusal | None = None  # why the lease rule refused the write
    task: asyncio.Task[None] | None = None


class Sender:
    """Bounded-concurrency sends and lookups; many keys in flight per partition."""

    def __init__(
        self,
        *,
        channels: Mapping[str, Channel],
        ctx: Context,
        append: Append,
        clock: Callable[[], datetime],
        concurrency: int,
        current: CurrentState,
        owns: Callable[[int], bool],
        deadline_s: float,
        skew_margin_s: float,
        deadlines: Mapping[str, float] | None = None,
        max_payload_bytes: int = 256 * 1024,
        faults: frozenset[str] = frozenset(),
        metrics: WorkerMetrics | None = None,
        observe: Callable[[float], None] = lambda _seconds: None,
        halted: Callable[[], str | None] = lambda: None,
        judge: Callable[[DeliveryState, SendResult, datetime], None] | None = None,
        pacer: SendPacer | None = None,
    ) -> None:
        # Rate-limited endpoints' sends wait here for their turn (streams/send_pacer.py).
        self._pacer = pacer
        # Told every classified send (the circuit breaker counts them: breaker_gate.py).
        self._judge = judge
        self._observe = observe  # how long admitted sends take (the claim budget learns)
        # Why this worker must not act now (its clock is off the broker's), or None.
        self._halted = halted
        self._channels = channels
        self._ctx = ctx
        self._append = append
        self._clock = clock
        self._slots = asyncio.Semaphore(concurrency)
        self._current = current
        self._owns = owns
        self._deadline_s = deadline_s
        # Per channel, over deadline_s (LEDGER_CHANNELS__SEND_DEADLINES): the lease rule checks the
        # deadline the channel's adapter sends under, not the global one.
        self._deadlines = dict(deadlines or {})
        self._longest_s = max([deadline_s, *self._deadlines.values()])
        self._margin_s = skew_margin_s
        # The SDK's rules, applied again: anyone who can write to the topic can append a
        # request the SDK would have refused (events/admission.py).
        self._max_payload_bytes = max_payload_bytes
        self._faults = faults
        self._metrics = metrics
        # Bounded memory of what this process started: a claim re-read after a rebalance
        # back to this worker must not be sent twice.
        self._started: OrderedDict[Marker, None] = OrderedDict()
        self._work: dict[asyncio.Task[None], _Work] = {}
        self._open_sends: set[tuple[str, int]] = set()
        # Cleared while the worker's partitions are being reassigned: sends wait before
        # their first byte until it is known which partitions stay (streams/app.py).
        self._go = asyncio.Event()
        self._go.set()
        self.failures = 0

    @property
    def in_flight(self) -> int:
        """Sends and lookups not finished yet."""
        return len(self._work)

    def deadline_for(self, channel: str) -> float:
        """The hard total deadline ``channel``'s sends run under."""
        return self._deadlines.get(channel, self._deadline_s)

    def has_open_send(self, key: str, token: int) -> bool:
        """True while this process still has the attempt (key, token) open."""
        return (key, token) in self._open_sends

    def submit_send(
        self, state: DeliveryState, partition: int, trace_parent: str | None = None
    ) -> bool:
        """Start the attempt ``state`` claims, unless this process already started it.
        ``trace_parent``: the claim's span, when this process traced it (else the
        request's context, from the state)."""
        marker = (state.idempotency_key, "send", state.fencing_token)
        if not self._mark(marker):
            return False
        work = _Work(state.idempotency_key, state.fencing_token, partition, "send")
        work.guard = WriteGuard(check=lambda: self._check(state, work))
        self._open_sends.add((work.key, work.token))
        if tracing.enabled():
            send: Awaitable[None] = self._traced_send(state, work, trace_parent)
        else:
            send = self._send(state, work)
        self._spawn(send, work, marker)
        return True

    def submit_lookup(self, state: DeliveryState, partition: int) -> bool:
        """Ask the provider about ``state``'s key, once per (token, lookup number).

        Never while this process still has the attempt open: its own request may be the
        one the receiver is processing, and "not found" would then be no evidence.
        """
        if self.has_open_send(state.idempotency_key, state.fencing_token):
            return False
        # One per lookup the state asks for: the fold says which (its lookup turn).
        marker = (state.idempotency_key, "lookup", lookup_turn(state))
        if not self._mark(marker):
            return False
        work = _Work(state.idempotency_key, state.fencing_token, partition, "lookup")
        lookup = self._traced_lookup(state) if tracing.enabled() else self._lookup(state)
        self._spawn(lookup, work, marker)
        return True

    def _mark(self, marker: Marker) -> bool:
        if marker in self._started:
            return False
        self._started[marker] = None
        if len(self._started) > STARTED_MEMORY:
            self._started.popitem(last=False)
        return True

    def _check(self, claimed: DeliveryState, work: _Work) -> str | None:
        """The write guard's check: why not to write (remembered on ``work``), or None."""
        work.refused = self._refusal(claimed, work)
        return None if work.refused is None else work.refused.reason

    def _write_by(self, claimed: DeliveryState) -> datetime | None:
        """The last moment the lease rule lets ``claimed``'s send start (None: no lease)."""
        if claimed.lease_expires_at is None:
            return None
        needed = self.deadline_for(claimed.channel) + self._margin_s
        return claimed.lease_expires_at - timedelta(seconds=needed)

    def _refusal(self, claimed: DeliveryState, work: _Work) -> Refusal | None:
        """The lease rule, checked right before the first byte; None allows the write."""
        if work.stopped is not None:
            return work.stopped
        if (halted := self._halted()) is not None:
            return Refusal(SendRefusal.CLOCK, f"this worker does not act: {halted}")
        current = self._current(claimed.idempotency_key)
        if (
            current is None
            or current.status is not Status.CLAIMED
            or current.fencing_token != claimed.fencing_token
            or current.claim_worker != self._ctx.worker_id
        ):
            now = (
                "none"
                if current is None
                else f"{current.status} under token {current.fencing_token}"
            )
            return Refusal(
                SendRefusal.TOKEN,
                f"the claim under token {claimed.fencing_token} is no longer current ({now})",
            )
        if not self._owns(work.partition):
            return Refusal(
                SendRefusal.PARTITION, f"this worker no longer owns partition {work.partition}"
            )
        write_by = self._write_by(claimed)
        if write_by is None or claimed.lease_expires_at is None:
            return Refusal(SendRefusal.OTHER, "the claim has no lease")
        at = self._clock()
        if at >= write_by:
            left = (claimed.lease_expires_at - at).total_seconds()
            deadline = self.deadline_for(claimed.channel)
            needed = deadline + self._margin_s
            return Refusal(
                SendRefusal.LEASE,
                f"the lease has {left:.1f}s left; a send needs more than {needed:g}s "
                f"({claimed.channel} deadline {deadline:g}s + clock-skew margin "
                f"{self._margin_s:g}s)",
            )
        return None

    async def stop_partitions(self, partitions: Iterable[int], why: Refusal) -> int:
        """Take back every send and lookup of ``partitions`` not yet written.

        Sends already written finish (their outcomes are recorded and fenced by token);
        the rest are cancelled and record ``DeliveryNotSent``. Returns how many stopped.
        """
        gone = set(partitions)
        stopped = [
            (task, work)
            for task, work in self._work.items()
            if work.partition in gone and not work.guard.written
        ]
        for task, work in stopped:
            work.stopped = why
            task.cancel()
        if stopped:
            await asyncio.wait([task for task, _ in stopped], timeout=self._longest_s)
        in_flight = sum(1 for w in self._work.values() if w.partition in gone and w.guard.written)
        if stopped or in_flight:
            log.info(
                "partitions %s: %d queued send(s)/lookup(s) stopped, %d written send(s) left "
                "to finish (%s)",
                sorted(gone),
                len(stopped),
                in_flight,
                why.reason,
            )
        return len(stopped)

    def hold(self) -> None:
        """Sends not yet written wait before their first byte (a rebalance is under way:
        a partition may come back to this worker, and its sends may then still go)."""
        self._go.clear()

    def resume(self) -> None:
        """Held sends go on: each still passes the write guard (lease, token, owner)."""
        self._go.set()

    async def release(self, claims: Sequence[DeliveryClaimed], why: Refusal) -> int:
        """Claims this process appended and will never read back: it never sends under
        them, and says so (``DeliveryNotSent``), so no lease has to expire into UNKNOWN
        and no lookup is needed. The caller makes sure the claims are in the log first."""
        now = self._clock()
        events: list[Event] = []
        for claim in claims:
            # Never one this process started: that one's outcome is the send's to record.
            if self._mark((claim.idempotency_key, "send", claim.fencing_token)):
                events.append(released(claim, f"not sent: {why.reason}", now, self._ctx))
        if events:
            if self._metrics is not None:
                self._metrics.refused_sends.labels(why.label).inc(len(events))
            await self._append(events)
            log.info("%d claim(s) not read back, recorded not sent (%s)", len(events), why.reason)
        return len(events)

    async def drain(self, timeout_s: float) -> None:
        """Wait for in-flight work (bounded); what does not finish is left to leases."""
        if self._work:
            await asyncio.wait(set(self._work), timeout=timeout_s)

    @property
    def partitions_in_use(self) -> set[int]:
        """Partitions with work in this sender."""
        return {w.partition for w in self._work.values()}

    def _spawn(self, coroutine: Awaitable[None], work: _Work, marker: Marker) -> None:
        task = asyncio.ensure_future(coroutine)
        work.task = task
        self._work[task] = work

        def done(finished: asyncio.Task[None]) -> None:
            self._work.pop(finished, None)
            if work.kind == "send":
                self._open_sends.discard((work.key, work.token))
            failed = not finished.cancelled() and finished.exception() is not None
            if work.kind == "lookup" and (finished.cancelled() or failed):
                # Nothing was recorded: forget the marker, so a later tick may ask again.
                self._started.pop(marker, None)
            if failed:
                # Loud, counted, and safe: the claim's lease expires and the lookup decides.
                self.failures += 1
                log.error("sender task for %s failed", marker, exc_info=finished.exception())

        task.add_done_callback(done)

    def _outbound(self, state: DeliveryState) -> OutboundDelivery:
        # Traced, the current span (the send's or the lookup's) is the receiver's parent;
        # off, the request's own context is passed on unchanged, as the API does.
        traceparent = tracing.current_traceparent() if tracing.enabled() else None
        return OutboundDelivery(
            traceparent=traceparent or state.traceparent,
            idempotency_key=state.idempotency_key,
            run_id=state.run_id,
            event_type=state.event_type,
            channel=state.channel,
            recipient=state.recipient,
            payload=state.payload,
            attempt=state.attempt,
            fencing_token=state.fencing_token,
            requested_at=state.requested_at,
            provider_message_id=state.provider_message_id,
        )

    async def _traced_send(self, state: DeliveryState, work: _Work, parent: str | None) -> None:
        with span("ledger.send", attempt_attributes(state), parent=parent or state.traceparent):
            await self._send(state, work)

    async def _traced_lookup(self, state: DeliveryState) -> None:
        attributes = attempt_attributes(state)
        attributes["ledger.lookup"] = state.lookups + 1
        with span("ledger.lookup", attributes, parent=state.traceparent):
            await self._lookup(state)

    async def _send(self, state: DeliveryState, work: _Work) -> None:
        began = time.perf_counter()
        try:
            async with self._slots:
                crash_if_enabled(BEFORE_SEND, self._faults)
                result = self._inadmissible(state) or await self._paced(state, work)
                # After the pacer: the claim budget learns how long sends take, not waits.
                began = time.perf_counter()
                if result is None:
                    if not self._go.is_set():
                        await self._go.wait()
                        began = time.perf_counter()
                    result = await self._send_admitted(state, work)
        except asyncio.CancelledError:
            if work.stopped is None or work.guard.written:
                raise
            # We took it back before its first byte: say so, so nobody needs to look it up.
            result = SendResult(
                SendOutcome.NOT_SENT,
                f"not sent: {work.stopped.reason}",
                ErrorClass.FENCED,
            )
            work.refused = work.stopped
        crash_if_enabled(AFTER_RESPONSE, self._faults)
        if result.error_class is not ErrorClass.FENCED:
            self._observe(time.perf_counter() - began)
        if self._metrics is not None:
            if result.error_class is ErrorClass.FENCED:
                refused = SendRefusal.OTHER if work.refused is None else work.refused.label
                self._metrics.refused_sends.labels(refused).inc()
            self._metrics.send_seconds.labels(state.channel).observe(time.perf_counter() - began)
            self._metrics.sends.labels(state.channel, str(result.outcome)).inc()
        if result.error_class is ErrorClass.FENCED:
            log.info("send of %s (token %d) refused: %s", work.key, work.token, result.evidence)
        elif self._judge is not None:
            self._judge(state, result, self._clock())
        events = after_send(state, state.fencing_token, result, self._clock(), self._ctx)
        if tracing.enabled():
            outcome_attributes(result.outcome, result.error_class, result.http_status)
        await self._append_outcome(state, events)

    async def _append_outcome(self, state: DeliveryState, events: Sequence[Event]) -> None:
        """Append a send's or a lookup's events; a confirmation is a span of its own."""
        if tracing.enabled() and any(isinstance(e, DeliveryConfirmed) for e in events):
            with span("ledger.confirm", attempt_attributes(state)):
                await self._append(events)
            return
        await self._append(events)

    def _inadmissible(self, state: DeliveryState) -> SendResult | None:
        """A request the SDK would have refused, as its result; None if admissible."""
        why = refusal(state.channel, state.recipient, state.payload, self._max_payload_bytes)
        if why is None:
            return None
        return SendResult(SendOutcome.REJECTED, f"not sent: {why}", ErrorClass.REFUSED_REQUEST)

    async def _paced(self, state: DeliveryState, work: _Work) -> SendResult | None:
        """Wait for the endpoint's turn (None: go now); a turn after the lease lets the send
        start is not waited for: not sent, refused for the lease."""
        if self._pacer is None:
            return None
        late = await self._pacer.wait(state.channel, state.recipient, self._write_by(state))
        if late is None:
            return None
        work.refused = Refusal(SendRefusal.LEASE, late)
        return SendResult(SendOutcome.NOT_SENT, f"not sent: {late}", ErrorClass.FENCED)

    async def _send_admitted(self, state: DeliveryState, work: _Work) -> SendResult:
        try:
            return await self._channels[state.channel].send(self._outbound(state), work.guard)
        except SendRefused as exc:
            return SendResult(SendOutcome.NOT_SENT, f"not sent: {exc.reason}", ErrorClass.FENCED)
        except Exception as exc:  # noqa: BLE001 - the record guard of a send
            # An adapter that raises has a delivery it cannot take (or a bug): recorded
            # with the reason, never left to a lease. Before its first byte nothing left.
            if work.guard.written:
                return SendResult(
                    SendOutcome.UNKNOWN,
                    f"{state.channel} adapter raised after writing: {one_line(exc)}",
                    ErrorClass.PROTOCOL_ERROR,
                )
            return SendResult(
                SendOutcome.REJECTED,
                f"not sent: {state.channel} adapter raised before writing: {one_line(exc)}",
                ErrorClass.REFUSED_REQUEST,
            )

    async def _lookup(self, state: DeliveryState) -> None:
        async with self._slots:
            try:
                result = await self._channels[state.channel].lookup(self._outbound(state))
            except Exception as exc:  # noqa: BLE001 - the record guard of a lookup
                result = LookupResult(
                    LookupOutcome.LOOKUP_ERROR, f"{state.channel} lookup raised: {one_line(exc)}"
                )
            if self._metrics is not None:
                self._metrics.lookups.labels(state.channel, result.outcome).inc()
            if tracing.enabled():
                outcome_attributes(result.outcome)
            await self._append_outcome(state, after_lookup(state, result, self._clock(), self._ctx))
