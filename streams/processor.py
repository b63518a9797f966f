"""One record at a time: decode, fold, decide, hand live claims to the sender, index timers.

Framework-free on purpose: the faust agent (streams/app.py) feeds it records and gives it
a state store and appenders (claims go out through the agent's producer, outcomes through
a separate idempotent one; both at-least-once), so the same code runs under faust and in
tests.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from clients import tracing
from clients.outcome_signing import OutcomeVerifier
from events.base import Event
from events.codec import EventDecodeError, decode
from events.delivery import DeliveryClaimed, DeliveryEvent, DeliveryRequested
from events.delivery_state import DeliveryState, Status, apply
from events.faults import crash_if_enabled
from events.model import AnyDeliveryEvent
from events.refusal import Refuser, SystemFailure, one_line, refusal
from streams.decisions import Context, TimerAction, claim, due_at, held, on_request, on_timer
from streams.delivery_spans import ClaimSpans
from streams.gates import Gate, Hold, OpenGate
from streams.metrics import WorkerMetrics
from streams.own_records import OwnRecords
from streams.sender import Sender
from streams.timers import DueIndex

log = logging.getLogger(__name__)

# After a timer acts, look again this much later if its event has not been read back.
TIMER_GUARD_S = 5.0
# A claim held back for want of capacity is looked at again this soon.
NO_ROOM_RETRY_S = 1.0
# Deliveries waiting for room in memory, claimed in order as room frees, with no timer:
# a backlog's timers re-read every waiting state from the table each second otherwise (a
# tick of 1000 states took more than its 0.5 s interval and starved the sends). Past this
# many, the claim-grace timer is the backstop (bounded memory).
MAX_WAITING = 20_000
# A gate that raised is asked again this much later.
GATE_FAILED_RETRY_S = 10.0
BEFORE_CLAIM = "worker.before_claim"
AGENT_RAISES = "worker.agent_raises"
TICK_BATCH = 1000


class StateStore(Protocol):
    """The processor's table: one DeliveryState per idempotency key."""

    def get(self, key: str) -> DeliveryState | None:
        """The state of ``key``, if any."""
        ...

    def put(self, key: str, state: DeliveryState) -> None:
        """Replace the state of ``key``."""
        ...


class MemoryStore:
    """A StateStore over a dict: for broker-free tests, benchmarks and tools."""

    def __init__(self) -> None:
        self.states: dict[str, DeliveryState] = {}

    def get(self, key: str) -> DeliveryState | None:
        """The state of ``key``."""
        return self.states.get(key)

    def put(self, key: str, state: DeliveryState) -> None:
        """Replace the state of ``key``."""
        self.states[key] = state


@dataclass(frozen=True)
class Record:
    """A raw record from ``ledger.deliveries`` and where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


Append = Callable[[Sequence[Event]], Awaitable[None]]
DeadLetterSink = Callable[[Record, str], Awaitable[None]]


class _Refused(Exception):
    """A record this worker will not fold, with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Plan:
    """What one record leads to, computed before anything changes."""

    event: AnyDeliveryEvent
    before: DeliveryState | None
    after: DeliveryState
    decided: list[Event]
    claiming: bool
    live_claim: bool
    due: datetime | None


class DeliveryProcessor:
    """The state machine's I/O edge for one worker."""

    def __init__(
        self,
        *,
        ctx: Context,
        store: StateStore,
        append_claims: Append,
        append_outcomes: Append,
        dead_letter: DeadLetterSink,
        sender: Sender,
        due: DueIndex,
        clock: Callable[[], datetime],
        max_open_claims: int | Callable[[], int] = 1_000_000,
        continuous: Callable[[int], bool] = lambda _partition: True,
        faults: frozenset[str] = frozenset(),
        metrics: WorkerMetrics | None = None,
        verifier: OutcomeVerifier | None = None,
        own: OwnRecords | None = None,
        acting: Callable[[], bool] = lambda: True,
        gate: Gate | None = None,
    ) -> None:
        self.ctx = ctx
        # What may hold a delivery back before its claim (streams/gates.py).
        self._gate: Gate = gate if gate is not None else OpenGate()
        # False while this worker must not act (its clock is off the broker's): it claims
        # nothing and its timers wait; records are still folded.
        self._acting = acting
        # Signed outcome events (clients/outcome_signing.py): None when checking is off.
        self._verifier = verifier
        # What this worker appended itself: read back, taken as the event it encoded.
        self._own = own
        # Admission control: claims this worker proposed and has not read back, plus the
        # sends and lookups it runs, stay under this. A claim read back after its lease
        # could only be refused; a backlog of them would expire faster than it is sent.
        self._max_open_claims = max_open_claims
        # Timers act only on partitions whose state follows the log in order (no records
        # known or suspected to be missing): the continuity guard's word.
        self._continuous = continuous
        self._claims_out: set[str] = set()
        # The claims this worker appended and has not read back yet (key -> partition and
        # claim): nothing can have been sent under them, so a worker that will never read
        # them back (it stops, or their partition moved away) records them not sent.
        self._unread: dict[str, tuple[int, DeliveryClaimed]] = {}
        # Stopping (SIGTERM): no new claim, no timer; what is held is released.
        self._stopping = False
        self._metrics = metrics
        self.faults = faults
        self._store = store
        self._append_claims = append_claims
        self._append_outcomes = append_outcomes
        self._dead_letter = dead_letter
        self._sender = sender
        self._due = due
        self._clock = clock
        self._proposed: dict[str, tuple[str, int, int, str]] = {}
        # New deliveries held back for want of room, oldest first (key -> partition): they
        # are claimed as soon as room frees, not when their claim-grace timer fires.
        self._waiting: dict[str, int] = {}
        # PENDING deliveries a gate holds (key -> partition): their timer is the hold's
        # recheck, and a claim is due then, not only at the claim-grace backstop (a new
        # request held by a rate limit would otherwise wait claim_grace_s for its token).
        self._held: dict[str, int] = {}
        # Tracing on: this process's claims as spans, each the parent of its send.
        self._claim_spans = ClaimSpans()

    async def handle(self, record: Record) -> None:
        """Process one record in partition order.

        The record guard (events/refusal.py): an exception in a pure step (decode, fold,
        decide, the due time) refuses this record alone (dead-lettered with the reason,
        nothing of it applied) and the partition goes on. A failure of the table, the
        producer or the disk is no record's fault: it propagates and stops the worker.
        """
        try:
            event = self._admit(record)
            plan = self._plan(record, event, self._state_of(event.idempotency_key))
        except SystemFailure:
            raise
        except _Refused as refused:
            reason = refused.reason
        except Exception as exc:  # noqa: BLE001 - the record guard: any pure failure
            reason = self._refusal(record, exc)
        else:
            await self._carry_out(record, plan)
            return
        await self._reject(record, reason)

    def _state_of(self, key: str) -> DeliveryState | None:
        """The table's state of ``key``: the one step before the plan that is not pure, so
        its failure is the table's, not the record's."""
        try:
            return self._store.get(key)
        except Exception as exc:
            raise SystemFailure("the delivery table", exc) from exc

    def _refusal(self, record: Record, exc: BaseException) -> str:
        return refusal(
            Refuser.WORKER,
            record.topic,
            record.partition,
            record.offset,
            exc,
            instance=self.ctx.worker_id,
        )

    def _admit(self, record: Record) -> AnyDeliveryEvent:
        """The record's event, if this worker may fold it (pure but for the use of an own
        record's entry). A record this worker appended, byte for byte and with its own
        signature, is the event it encoded: not decoded or verified again."""
        own = None if self._own is None else self._own.known(record.value, record.headers)
        if isinstance(own, DeliveryEvent) and (
            record.key is None or record.key == own.idempotency_key.encode()
        ):
            return own  # type: ignore[return-value]  # a DeliveryEvent is one of the union
        try:
            event = decode(record.value)
        except EventDecodeError as exc:
            raise _Refused(exc.reason) from None
        if not isinstance(event, DeliveryEvent):
            raise _Refused(f"{event.type} does not belong on the deliveries topic")
        if record.key is not None and record.key != event.idempotency_key.encode():
            raise _Refused("record key does not match the event's idempotency_key")
        if self._verifier is not None and (
            forged := self._verifier.refuses(event, record.value or b"", record.headers)
        ):
            raise _Refused(forged)
        return event

    def _plan(self, record: Record, event: AnyDeliveryEvent, before: DeliveryState | None) -> _Plan:
        """Everything the record leads to, computed before anything is changed (pure)."""
        after = apply(before, event)
        if after is None:
            raise _Refused(f"{event.type} for a key with no DeliveryRequested")
        # The request's trace context, kept with the delivery for its later spans.
        if (
            before is None
            and record.headers
            and (traceparent := tracing.traceparent_in(record.headers)) is not None
        ):
            # ``after`` is the fresh state of this request (``apply`` made it just now):
            # finished in place, as ``apply`` finishes its own copies (a copy was ~50 us).
            after.__dict__["traceparent"] = traceparent
        now = self._clock()
        decided: list[Event] = []
        if isinstance(event, DeliveryRequested):
            decided = list(on_request(before, event, after, now, self.ctx))
        return _Plan(
            event=event,
            before=before,
            after=after,
            decided=decided,
            claiming=bool(decided) and isinstance(decided[0], DeliveryClaimed),
            live_claim=self._is_my_live_claim(before, after, event),
            due=due_at(after, self.ctx),
        )

    async def _carry_out(self, record: Record, plan: _Plan) -> None:
        """Apply a plan: the table, the appends, the sender, the timer."""
        key = plan.event.idempotency_key
        after = plan.after
        if after != plan.before:
            self._store.put(key, after)
            self._proposed.pop(key, None)  # the state moved: what was proposed landed or is moot
            self._claims_out.discard(key)
            unread = self._unread.get(key)
            if unread is not None and (
                after.fencing_token >= unread[1].fencing_token or after.status.terminal
            ):
                del self._unread[key]  # read back (or moot): the sender decides from here
            if after.status is not Status.PENDING:
                self._held.pop(key, None)
        if self._metrics is not None:
            self._metrics.events.labels(plan.event.type).inc()
        if isinstance(plan.event, DeliveryRequested):
            crash_if_enabled(BEFORE_CLAIM, self.faults)
            if AGENT_RAISES in self.faults:
                raise SystemFailure(f"fault injection: {AGENT_RAISES}")
            hold = self._gate_hold(after, self._clock()) if plan.claiming else None
            if hold is not None:
                # Held before its claim: no attempt; the timer looks again at the recheck.
                await self._hold(after, hold)
                self._held[key] = record.partition
                self._due.schedule(record.partition, key, hold.recheck_at)
                return
            if plan.claiming and (self._waiting or self._room() <= 0):
                # No room now (or others wait first): it stays PENDING in the waiting room,
                # claimed in order as room frees; past MAX_WAITING its claim-grace timer
                # is the backstop.
                if len(self._waiting) < MAX_WAITING:
                    self._waiting[key] = record.partition
                    if self._waiting and self._room() > 0:
                        await self.claim_waiting()
                    return
            elif plan.decided:
                if plan.claiming:
                    self._note_unread(record.partition, plan.decided)
                await self._traced(self._append_claims, [(after, e) for e in plan.decided])
                if plan.claiming:
                    self._claims_out.add(key)
                    # The tick must not propose the same claim again before it is read back.
                    self._proposed[key] = _proposal(after, plan.decided)
        elif plan.live_claim:
            parent = self._claim_spans.parent_of_send(key) if tracing.enabled() else None
            self._sender.submit_send(after, record.partition, parent)
        self._due.schedule(record.partition, key, plan.due)
        if self._waiting and self._room() > 0:
            await self.claim_waiting()

    async def claim_waiting(self) -> int:
        """Claim the deliveries waiting for room, oldest first, as far as room allows;
        returns how many claims were appended."""
        room = self._room()
        if room <= 0 or not self._waiting:
            return 0
        now = self._clock()
        claims: list[tuple[DeliveryState, Event]] = []
        proposed: dict[str, tuple[str, int, int, str]] = {}
        taken: list[tuple[str, int]] = []
        for key, partition in self._waiting.items():
            if len(taken) >= room:
                break
            # Like the timers: a partition that may be missing records waits.
            if self._continuous(partition):
                taken.append((key, partition))
        for key, partition in taken:
            del self._waiting[key]
            state = self._store.get(key)
            if state is None or state.status not in (Status.PENDING, Status.RETRY_SCHEDULED):
                continue  # claimed meanwhile (another worker) or settled
            hold = self._gate_hold(state, now)
            if hold is not None:
                await self._hold(state, hold)
                self._held[key] = partition
                self._due.schedule(partition, key, hold.recheck_at)
                continue
            self._held.pop(key, None)
            try:
                event = claim(state, now, self.ctx)
            except Exception as exc:  # noqa: BLE001 - one key's claim never stops the others
                self._timer_refused(partition, key, exc)
                continue
            if self._proposed.get(key) == _proposal(state, [event]):
                continue
            claims.append((state, event))
            self._note_unread(partition, [event])
            proposed[key] = _proposal(state, [event])
            self._due.schedule(partition, key, now + timedelta(seconds=TIMER_GUARD_S))
        if claims:
            await self._traced(self._append_claims, claims)
            self._proposed.update(proposed)
            self._claims_out.update(proposed)
        return len(claims)

    def _is_my_live_claim(
        self, before: DeliveryState | None, after: DeliveryState, event: Event
    ) -> bool:
        return (
            isinstance(event, DeliveryClaimed)
            and after.status is Status.CLAIMED
            and after.fencing_token == event.fencing_token
            and (before is None or before.fencing_token != after.fencing_token)
            and event.worker_id == self.ctx.worker_id
        )

    async def _reject(self, record: Record, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.dead_lettered.inc()
        log.warning(
            "dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason
        )
        await self._dead_letter(record, reason)

    async def tick(self, partitions: Iterable[int]) -> int:
        """Act on every due timer of the owned partitions; returns how many were due.

        Each decision is proposed once (until the state moves), and all of one tick's
        proposals go out in one append. Partitions that are not ``continuous`` wait.
        """
        if not self._acting() or self._stopping:
            return 0  # timers wait for the clock; nothing is lost, nothing decided
        now = self._clock()
        due = self._due.due([p for p in partitions if self._continuous(p)], now, TICK_BATCH)
        proposals: list[Event] = []
        of: list[tuple[DeliveryState, Event]] = []  # each proposal's state, for its span
        proposed: dict[str, tuple[str, int, int, str]] = {}
        claims: set[str] = set()
        states: list[tuple[int, str, DeliveryState]] = []
        for partition, key in due:
            state = self._store.get(key)
            if state is None or state.status.terminal:
                self._due.schedule(partition, key, None)
                continue
            states.append((partition, key, state))
        # Claims go out in request order: deliveries released together (an endpoint back, a
        # budget renewed) leave in the order they were asked for.
        states.sort(key=lambda entry: entry[2].requested_at)
        for partition, key, state in states:
            try:
                events, action = on_timer(state, now, self.ctx)
                if not events and action is None and self._rechecked(key, state):
                    events = [claim(state, now, self.ctx)]
            except Exception as exc:  # noqa: BLE001 - one key's timer never stops the tick
                self._timer_refused(partition, key, exc)
                continue
            claiming = bool(events) and isinstance(events[0], DeliveryClaimed)
            hold = self._gate_hold(state, now) if claiming else None
            if hold is not None:
                if hold.reason is not None and state.waiting != hold.reason:
                    events = [held(state, hold.reason, hold.detail, hold.recheck_at, now, self.ctx)]
                    if self._proposed.get(key) != _proposal(state, events):
                        proposed[key] = _proposal(state, events)
                        proposals.extend(events)
                        of.extend((state, event) for event in events)
                self._held[key] = partition
                self._due.schedule(partition, key, hold.recheck_at)
                continue
            if claiming:
                self._held.pop(key, None)
            if claiming and self._proposed.get(key) != _proposal(state, events):
                if self._room() - len(claims) <= 0:
                    if len(self._waiting) < MAX_WAITING:
                        # Claimed in order as room frees (claim_waiting), no timer meanwhile.
                        self._waiting[key] = partition
                        self._due.schedule(partition, key, None)
                    else:
                        retry = now + timedelta(seconds=NO_ROOM_RETRY_S)
                        self._due.schedule(partition, key, retry)
                    continue
                claims.add(key)
                self._note_unread(partition, events)
            if events and self._proposed.get(key) != _proposal(state, events):
                proposed[key] = _proposal(state, events)
                proposals.extend(events)
                of.extend((state, event) for event in events)
            if action is TimerAction.LOOKUP:
                self._sender.submit_lookup(state, partition)
            # The decision lands when its event is read back; until then look again later.
            self._due.schedule(partition, key, now + timedelta(seconds=TIMER_GUARD_S))
        if proposals:
            if self._metrics is not None:
                self._metrics.timer_events.inc(len(proposals))
            await self._traced(self._append_outcomes, of)
            # Remembered only once appended: a failed append is proposed again next tick.
            self._proposed.update(proposed)
            self._claims_out.update(claims)
        await self.claim_waiting()
        return len(due)

    async def _traced(self, append: Append, events: Sequence[tuple[DeliveryState, Event]]) -> None:
        """Append ``events`` (each with its delivery's state); tracing on, each claim among
        them is a ``ledger.claim`` span around the append."""
        if not tracing.enabled():
            await append([event for _state, event in events])
            return
        with self._claim_spans.claiming(events):
            await append([event for _state, event in events])

    def _gate_hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """The gate's word on ``state``. A gate that raises holds it (unrecorded) and is asked
        again later: one delivery's bad gate decision never stops the worker, and the
        delivery stays PENDING, visible, rather than going out unchecked."""
        try:
            return self._gate.hold(state, now)
        except Exception as exc:  # noqa: BLE001 - the record guard, for a gate
            if self._metrics is not None:
                self._metrics.timers_refused.inc()
            log.error("gate failed for %s: %s", state.idempotency_key, one_line(exc))
            retry = now + timedelta(seconds=GATE_FAILED_RETRY_S)
            return Hold(retry, f"the gate failed: {one_line(exc)}")

    def _rechecked(self, key: str, state: DeliveryState) -> bool:
        """A gate held this PENDING delivery and its recheck time has come (its timer)."""
        return key in self._held and state.status is Status.PENDING

    async def _hold(self, state: DeliveryState, hold: Hold) -> None:
        """Record a hold the ledger must show (once per reason), outside the tick."""
        if hold.reason is None or state.waiting == hold.reason:
            return
        now = self._clock()
        events: list[Event] = [
            held(state, hold.reason, hold.detail, hold.recheck_at, now, self.ctx)
        ]
        if self._proposed.get(state.idempotency_key) == _proposal(state, events):
            return
        await self._append_outcomes(events)
        self._proposed[state.idempotency_key] = _proposal(state, events)

    def _room(self) -> int:
        """How many more claims this worker may propose now (none while it must not act)."""
        if not self._acting() or self._stopping:
            return 0
        limit = self._max_open_claims
        if callable(limit):
            limit = limit()
        return limit - len(self._claims_out) - self._sender.in_flight

    def _note_unread(self, partition: int, events: Sequence[Event]) -> None:
        """Remember claims before they are appended: a release that runs while their
        append is under way still finds them (and flushes the append before it)."""
        for event in events:
            if isinstance(event, DeliveryClaimed):
                self._unread[event.idempotency_key] = (partition, event)

    def stop_claiming(self) -> None:
        """From now on propose no claim and act on no timer (the worker is stopping)."""
        self._stopping = True

    def unread_claims(self, partitions: Iterable[int] | None = None) -> list[DeliveryClaimed]:
        """Take the claims this worker appended and has not read back, of ``partitions``
        (None: all): it will not read them back, so it never sends under them."""
        wanted = None if partitions is None else set(partitions)
        taken = [
            (key, claim)
            for key, (partition, claim) in self._unread.items()
            if wanted is None or partition in wanted
        ]
        for key, _claim in taken:
            del self._unread[key]
            self._claims_out.discard(key)
        return [claim for _key, claim in taken]

    def reindex(self, partition: int, states: Iterable[DeliveryState]) -> int:
        """Rebuild the timers of a newly assigned partition from its table states."""
        count = 0
        for state in states:
            try:
                due = due_at(state, self.ctx)
            except Exception as exc:  # noqa: BLE001 - one state never stops the rebuild
                self._timer_refused(partition, state.idempotency_key, exc)
                continue
            if due is not None:
                self._due.schedule(partition, state.idempotency_key, due)
                count += 1
        return count

    def _timer_refused(self, partition: int, key: str, exc: BaseException) -> None:
        """A timer decision that raised: its timer is dropped (the delivery stays visible
        in its state, for an operator), and the worker goes on with the other keys."""
        self._due.schedule(partition, key, None)
        if self._metrics is not None:
            self._metrics.timers_refused.inc()
        log.error("timer of %s (partition %d) dropped: %s", key, partition, one_line(exc))

    def forget(self, partition: int) -> None:
        """Drop the timers of a revoked partition (and what this worker proposed there)."""
        self._due.drop_partition(partition)
        for key in [k for k, p in self._waiting.items() if p == partition]:
            del self._waiting[key]
        for key in [k for k, p in self._held.items() if p == partition]:
            del self._held[key]
        self._proposed.clear()  # cheap to rebuild: at worst one repeated proposal per key
        self._claims_out.clear()
        self._claim_spans.forget()


def _proposal(state: DeliveryState, events: Sequence[Event]) -> tuple[str, int, int, str]:
    """What identifies one timer decision for a state: re-proposing it would be a repeat."""
    return (state.status.value, state.fencing_token, state.attempt, type(events[0]).__name__)
