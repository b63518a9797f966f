"""The processor's tick, broker-free: each timer decision proposed once, again if it was lost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clients.outcome_signing import OutcomeVerifier
from events.base import Event
from events.codec import encode
from events.delivery import DeliveryClaimed, DeliveryConfirmed, DeliveryRequested
from events.delivery_state import apply
from streams.own_records import OwnRecords
from streams.processor import DeliveryProcessor, MemoryStore, Record
from streams.sender import Append, Sender
from streams.timers import DueIndex
from tests.fixtures.core import (
    T0,
    Appended,
    Clock,
    FakeChannel,
    core_context,
    eventually,
    requested,
)

CTX = core_context()


def processor_for(
    store: MemoryStore,
    clock: Clock,
    append: Append,
    due: DueIndex,
    continuous: Callable[[int], bool] = lambda _p: True,
    dead_letter: Callable[[Record, str], Awaitable[None]] | None = None,
    verifier: OutcomeVerifier | None = None,
    own: OwnRecords | None = None,
) -> DeliveryProcessor:
    sender = Sender(
        channels={"webhook": FakeChannel()},
        ctx=CTX,
        append=append,
        clock=clock,
        concurrency=4,
        current=store.get,
        owns=lambda _p: True,
        deadline_s=10.0,
        skew_margin_s=2.0,
    )

    async def no_dead_letters(record: Record, reason: str) -> None:
        raise AssertionError(reason)

    return DeliveryProcessor(
        ctx=CTX,
        store=store,
        append_claims=append,
        append_outcomes=append,
        dead_letter=dead_letter or no_dead_letters,
        sender=sender,
        due=due,
        clock=clock,
        continuous=continuous,
        verifier=verifier,
        own=own,
    )


async def test_the_tick_proposes_each_claim_once_and_again_after_a_failed_append(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    store = MemoryStore()
    due = DueIndex(tmp_path / "due")
    broken = {"now": True}

    async def append(events: Sequence[Event]) -> None:
        if broken["now"]:
            raise ConnectionError("broker down")
        await appended(events)

    processor = processor_for(store, clock, append, due)
    state = apply(None, requested(0))
    assert state is not None
    store.put(state.idempotency_key, state)
    due.schedule(0, state.idempotency_key, state.requested_at)
    clock.advance(CTX.claim_grace_s + 1)
    with pytest.raises(ConnectionError):
        await processor.tick({0})
    broken["now"] = False
    for _ in range(3):  # the guard timer brings it back; only one claim goes out
        clock.advance(6)
        await processor.tick({0})
    claims = appended.of(DeliveryClaimed)
    assert len(claims) == 1
    due.close()


async def test_claims_wait_for_room_instead_of_expiring_in_a_backlog(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    store = MemoryStore()
    due = DueIndex(tmp_path / "due")
    processor = processor_for(store, clock, appended, due)
    processor._max_open_claims = 2
    for n in range(5):
        request = requested(n)
        await processor.handle(Record("t", 0, n, request.idempotency_key.encode(), encode(request)))
    assert len(appended.of(DeliveryClaimed)) == 2  # the rest stay PENDING
    clock.advance(CTX.claim_grace_s + 1)
    await processor.tick({0})
    assert len(appended.of(DeliveryClaimed)) == 2, "no room until the first claims move on"
    first = appended.of(DeliveryClaimed)[0]
    await processor.handle(Record("t", 0, 9, first.idempotency_key.encode(), encode(first)))
    # Its send runs and finishes (the fake receiver answers at once).
    await eventually(lambda: appended.of(DeliveryConfirmed))
    clock.advance(2)
    await processor.tick({0})
    assert len(appended.of(DeliveryClaimed)) == 3
    due.close()


async def test_the_tick_waits_while_a_partition_may_be_missing_records(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    """A PENDING state read before the rest of its partition (a skip, a stalled stream) may
    lack another worker's claim: claiming from it would reuse that claim's token."""
    store = MemoryStore()
    due = DueIndex(tmp_path / "due")
    follows_log = {0: False}
    processor = processor_for(store, clock, appended, due, continuous=follows_log.__getitem__)
    state = apply(None, requested(0))
    assert state is not None
    store.put(state.idempotency_key, state)
    due.schedule(0, state.idempotency_key, state.requested_at)
    clock.advance(CTX.claim_grace_s + 1)
    assert await processor.tick({0}) == 0
    assert appended.of(DeliveryClaimed) == []
    follows_log[0] = True  # caught up: now the timer acts
    assert await processor.tick({0}) == 1
    assert len(appended.of(DeliveryClaimed)) == 1
    due.close()


async def test_a_delivery_held_back_for_room_is_claimed_as_soon_as_room_frees(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    """Not when its claim-grace timer fires (10 s later): the next record after room frees
    claims it, oldest first, with no tick and no time passing."""
    store = MemoryStore()
    due = DueIndex(tmp_path / "due")
    processor = processor_for(store, clock, appended, due)
    processor._max_open_claims = 2
    requests = [requested(n) for n in range(5)]
    for n, request in enumerate(requests):
        await processor.handle(Record("t", 0, n, request.idempotency_key.encode(), encode(request)))
    claims = appended.of(DeliveryClaimed)
    assert [c.idempotency_key for c in claims] == [r.idempotency_key for r in requests[:2]]
    offset = 10
    for claimed in claims:  # each claim read back, its send done, its outcome read back
        await processor.handle(
            Record("t", 0, offset, claimed.idempotency_key.encode(), encode(claimed))
        )

        def confirmed_of(k: str = claimed.idempotency_key) -> list[DeliveryConfirmed]:
            return [c for c in appended.of(DeliveryConfirmed) if c.idempotency_key == k]

        await eventually(confirmed_of)
        [confirmed] = [
            c
            for c in appended.of(DeliveryConfirmed)
            if c.idempotency_key == claimed.idempotency_key
        ]
        await processor.handle(
            Record("t", 0, offset + 1, confirmed.idempotency_key.encode(), encode(confirmed))
        )
        offset += 2
    claims = appended.of(DeliveryClaimed)
    assert [c.idempotency_key for c in claims] == [r.idempotency_key for r in requests[:4]]
    due.close()


def record_of(event: DeliveryRequested, offset: int) -> Record:
    """``event`` as the agent would hand it over, at ``offset`` of partition 0."""
    return Record("ledger.deliveries", 0, offset, event.idempotency_key.encode(), encode(event))


async def test_a_record_whose_decision_raises_is_refused_alone_and_the_next_one_goes_on(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    """The record guard, for an exception nobody foresaw: a clock at the end of time makes
    the claim's lease overflow inside the pure decision. That record is dead-lettered with
    a one-line reason naming the worker and its position, nothing of it is applied, and the
    next record is claimed as usual."""
    store = MemoryStore()
    letters: list[tuple[Record, str]] = []

    async def dead_letter(record: Record, reason: str) -> None:
        letters.append((record, reason))

    processor = processor_for(
        store, clock, appended, DueIndex(tmp_path / "due"), dead_letter=dead_letter
    )
    first, second = requested(1), requested(2)
    clock.now = datetime.max.replace(tzinfo=UTC)
    await processor.handle(record_of(first, 7))
    clock.now = T0
    await processor.handle(record_of(second, 8))
    assert [(r.offset, reason) for r, reason in letters] == [
        (
            7,
            f"worker {CTX.worker_id} refused ledger.deliveries[0]@7: "
            "OverflowError: date value out of range",
        )
    ]
    assert store.get(first.idempotency_key) is None
    claimed = [e for e in appended.events if isinstance(e, DeliveryClaimed)]
    assert [c.idempotency_key for c in claimed] == [second.idempotency_key]


async def test_a_failing_append_is_not_the_record_s_fault_and_stops_the_worker(
    tmp_path: Path, clock: Clock
) -> None:
    """The other side of the guard: the producer failing is no reason to dead-letter the
    record. It propagates (the agent exits without committing), and nothing is refused."""

    async def broken(events: Sequence[Event]) -> None:
        raise ConnectionError("broker down")

    processor = processor_for(store := MemoryStore(), clock, broken, DueIndex(tmp_path / "due"))
    with pytest.raises(ConnectionError):
        await processor.handle(record_of(requested(3), 1))
    assert store.get(requested(3).idempotency_key) is not None  # applied; the claim was not
