"""Holds before a claim (streams/gates.py), broker-free: a held delivery makes no attempt,
its hold is recorded once with its reason, and released deliveries are claimed in request
order."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path

from events.codec import encode
from events.delivery import DeliveryClaimed
from events.delivery_state import DeliveryState, Status, apply
from events.waiting import DeliveryHeld, WaitReason
from streams.gates import Gates, Hold, OpenGate
from streams.processor import MemoryStore, Record
from streams.timers import DueIndex
from tests.fixtures.core import T0, Appended, Clock, requested
from tests.streams.test_processor import CTX, processor_for


class Switch:
    """A gate an operator flips: holds every delivery as ``reason`` while on."""

    def __init__(self, reason: WaitReason | None = WaitReason.PAUSED) -> None:
        self.on = True
        self.reason = reason
        self.asked = 0

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        self.asked += 1
        if not self.on:
            return None
        return Hold(now + timedelta(seconds=5), "endpoint paused by ana", self.reason)


async def test_a_held_delivery_is_recorded_once_makes_no_attempt_and_goes_out_in_order(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    due = DueIndex(tmp_path / "due")
    switch = Switch()
    store = MemoryStore()
    processor = processor_for(store, clock, appended, due)
    processor._gate = Gates([switch])
    # Requested in the order 3, 1, 2 (their times), read in the order 1, 2, 3.
    times = {1: T0 + timedelta(seconds=2), 2: T0 + timedelta(seconds=3), 3: T0}
    requests = {n: requested(n, at=at) for n, at in times.items()}
    for offset, n in enumerate((1, 2, 3)):
        r = requests[n]
        await processor.handle(Record("t", 0, offset, r.idempotency_key.encode(), encode(r)))
    held = appended.of(DeliveryHeld)
    assert [h.reason for h in held] == [WaitReason.PAUSED] * 3
    assert appended.of(DeliveryClaimed) == []
    # Read back, the holds mark the states; more ticks while paused record nothing more.
    for offset, h in enumerate(held, start=10):
        await processor.handle(Record("t", 0, offset, h.idempotency_key.encode(), encode(h)))
    states = [store.get(r.idempotency_key) for r in requests.values()]
    assert all(s is not None and s.waiting is WaitReason.PAUSED for s in states)
    assert all(s is not None and s.status is Status.PENDING and s.attempt == 0 for s in states)
    for _ in range(3):
        clock.advance(6)
        await processor.tick({0})
    assert len(appended.of(DeliveryHeld)) == 3, "a hold is recorded once per reason"
    assert appended.of(DeliveryClaimed) == []
    # Resumed: every one is claimed, in the order it was requested.
    switch.on = False
    clock.advance(6)
    await processor.tick({0})
    claims = appended.of(DeliveryClaimed)
    assert [c.run_id for c in claims] == ["run-3", "run-1", "run-2"]
    assert all(c.attempt == 1 for c in claims)
    # The claim ends the wait.
    for offset, c in enumerate(claims, start=20):
        await processor.handle(Record("t", 0, offset, c.idempotency_key.encode(), encode(c)))
        state = store.get(c.idempotency_key)
        assert state is not None
        assert state.waiting is None
    due.close()


async def test_an_unrecorded_hold_waits_without_an_event(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    # A rate limit's hold: the delivery waits as an ordinary PENDING, nothing is written.
    due = DueIndex(tmp_path / "due")
    store = MemoryStore()
    processor = processor_for(store, clock, appended, due)
    switch = Switch(reason=None)
    processor._gate = Gates([OpenGate(), switch])
    r = requested(7)
    await processor.handle(Record("t", 0, 0, r.idempotency_key.encode(), encode(r)))
    clock.advance(CTX.claim_grace_s + 6)
    await processor.tick({0})
    assert appended.events == []
    assert switch.asked == 2, "asked at the request and again at its due timer"
    switch.on = False
    clock.advance(6)
    await processor.tick({0})
    assert len(appended.of(DeliveryClaimed)) == 1
    due.close()


def test_the_fold_takes_a_hold_only_before_a_claim() -> None:
    state = apply(None, requested(1))
    assert state is not None
    hold = DeliveryHeld(
        idempotency_key=state.idempotency_key,
        run_id=state.run_id,
        producer="w",
        reason=WaitReason.CIRCUIT_OPEN,
        detail="circuit open",
        occurred_at=T0 + timedelta(seconds=1),
    )
    waiting = apply(state, hold)
    assert waiting is not None
    assert (waiting.waiting, waiting.waiting_since) == (WaitReason.CIRCUIT_OPEN, hold.occurred_at)
    claimed = apply(
        waiting,
        DeliveryClaimed(
            idempotency_key=state.idempotency_key,
            run_id=state.run_id,
            producer="w",
            attempt=1,
            fencing_token=1,
            worker_id="w",
            lease_expires_at=T0 + timedelta(seconds=60),
        ),
    )
    assert claimed is not None
    assert claimed.waiting is None
    late = hold.model_copy(update={"event_id": uuid.uuid4()})  # a hold read after the claim
    after = apply(claimed, late)
    assert after is not None
    assert (after.status, after.waiting) == (Status.CLAIMED, None), "a claimed one does not wait"
    assert state.agent == "test-agent", "the agent is the request's producer (send budgets)"


class Broken:
    """A gate with a bug: it raises for one delivery."""

    def __init__(self, key: str) -> None:
        self.key = key

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        if state.idempotency_key == self.key:
            raise ZeroDivisionError("a bug in a gate")
        return None


async def test_a_gate_that_raises_holds_that_delivery_and_the_worker_goes_on(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    due = DueIndex(tmp_path / "due")
    store = MemoryStore()
    processor = processor_for(store, clock, appended, due)
    bad, good = requested(1), requested(2)
    processor._gate = Gates([Broken(bad.idempotency_key)])
    for offset, r in enumerate((bad, good)):
        await processor.handle(Record("t", 0, offset, r.idempotency_key.encode(), encode(r)))
    clock.advance(CTX.claim_grace_s + 11)
    await processor.tick({0})
    claimed = {c.idempotency_key for c in appended.of(DeliveryClaimed)}
    assert claimed == {good.idempotency_key}, "the other delivery is claimed as usual"
    state = store.get(bad.idempotency_key)
    assert state is not None
    assert (state.status, state.attempt) == (Status.PENDING, 0), "held, visible, not sent"
    due.close()
