"""The sender's fence, broker-free: the lease rule at the first byte, revocation, lookups."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from events.delivery import DeliveryFailed, DeliveryNotSent, new_delivery_requested
from events.delivery_state import DeliveryState, Status, apply
from events.outcomes import ErrorClass
from streams.decisions import claim
from streams.metrics import WorkerMetrics
from streams.processor import MemoryStore
from streams.sender import REVOKED, Sender, SendRefusal
from tests.fixtures.core import (
    Appended,
    Clock,
    FakeChannel,
    core_context,
    eventually,
    requested,
)

CTX = core_context()


def sender_for(
    channel: FakeChannel,
    store: MemoryStore,
    clock: Clock,
    appended: Appended,
    *,
    owned: set[int] | None = None,
    concurrency: int = 4,
    max_payload_bytes: int = 256 * 1024,
    deadlines: dict[str, float] | None = None,
    metrics: WorkerMetrics | None = None,
) -> Sender:
    owned = {0} if owned is None else owned
    return Sender(
        channels={"webhook": channel},
        ctx=CTX,
        append=appended,
        clock=clock,
        concurrency=concurrency,
        current=store.get,
        owns=owned.__contains__,
        deadline_s=10.0,
        skew_margin_s=2.0,
        max_payload_bytes=max_payload_bytes,
        deadlines=deadlines,
        metrics=metrics,
    )


def claimed(store: MemoryStore, clock: Clock, n: int = 0) -> DeliveryState:
    state = apply(None, requested(n))
    assert state is not None
    after = apply(state, claim(state, clock(), CTX))
    assert after is not None
    store.put(after.idempotency_key, after)
    return after


async def test_a_send_with_enough_lease_goes_out_once(
    fake_channel: FakeChannel, memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    sender = sender_for(fake_channel, memory_store, clock, appended)
    state = claimed(memory_store, clock)
    assert sender.submit_send(state, 0)
    assert not sender.submit_send(state, 0)  # once per (key, token) per process
    await sender.drain(5)
    assert fake_channel.received == [(state.idempotency_key, 1)]


async def test_too_little_lease_left_writes_nothing_and_says_so(
    fake_channel: FakeChannel, memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    sender = sender_for(fake_channel, memory_store, clock, appended)
    state = claimed(memory_store, clock)
    clock.advance(CTX.lease_s - 11.9)  # 11.9 s left; a send needs more than 10 + 2
    sender.submit_send(state, 0)
    await sender.drain(5)
    assert fake_channel.received == []
    [not_sent] = appended.of(DeliveryNotSent)
    assert "lease has 11.9s left" in not_sent.reason
    after = apply(state, not_sent)
    assert after is not None
    assert after.status.public == "PENDING"  # claimed again, no lookup needed


async def test_the_lease_rule_uses_the_channels_own_deadline(
    fake_channel: FakeChannel, memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    # webhook's own deadline 15 s (the global one 10 s): 16.9 s left is enough for the
    # global rule (10 + 2) but not for the channel's (15 + 2).
    sender = sender_for(fake_channel, memory_store, clock, appended, deadlines={"webhook": 15})
    state = claimed(memory_store, clock)
    clock.advance(CTX.lease_s - 16.9)
    sender.submit_send(state, 0)
    await sender.drain(5)
    assert fake_channel.received == []
    [not_sent] = appended.of(DeliveryNotSent)
    assert "webhook deadline 15s" in not_sent.reason
    # A shorter channel deadline (5 s) lets a claim with 11.9 s left go out.
    short = sender_for(fake_channel, memory_store, clock, appended, deadlines={"webhook": 5})
    second = claimed(memory_store, clock, 1)
    clock.advance(CTX.lease_s - 11.9)
    short.submit_send(second, 0)
    await short.drain(5)
    assert fake_channel.received == [(second.idempotency_key, 1)]


async def test_a_claim_that_moved_on_or_a_lost_partition_is_not_sent(
    fake_channel: FakeChannel, memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    owned = {0}
    sender = sender_for(fake_channel, memory_store, clock, appended, owned=owned)
    moved = claimed(memory_store, clock, 1)
    # Another worker's newer claim is current now (this one's lease ran out meanwhile).
    memory_store.put(moved.idempotency_key, replace(moved, fencing_token=2, claim_worker="w2"))
    sender.submit_send(moved, 0)
    lost = claimed(memory_store, clock, 2)
    owned.clear()
    sender.submit_send(lost, 0)
    await sender.drain(5)
    assert fake_channel.received == []
    reasons = sorted(e.reason for e in appended.of(DeliveryNotSent))
    assert "no longer current" in reasons[0] or "no longer current" in reasons[1]
    assert any("no longer owns partition 0" in r for r in reasons)


async def test_each_refusal_is_counted_under_its_own_reason(
    fake_channel: FakeChannel, memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    """The metric's label is the refusal's type, whatever its evidence says."""
    metrics = WorkerMetrics()
    owned = {0}
    sender = sender_for(fake_channel, memory_store, clock, appended, owned=owned, metrics=metrics)
    moved = claimed(memory_store, clock, 1)
    memory_store.put(moved.idempotency_key, replace(moved, fencing_token=2, claim_worker="w2"))
    sender.submit_send(moved, 0)
    await sender.drain(5)
    short = claimed(memory_store, clock, 2)
    clock.advance(CTX.lease_s - 11.9)
    sender.submit_send(short, 0)
    await sender.drain(5)
    lost = claimed(memory_store, clock, 3)
    owned.clear()
    sender.submit_send(lost, 0)
    await sender.drain(5)
    assert fake_channel.received == []

    def counted(reason: SendRefusal) -> float | None:
        return metrics.registry.get_sample_value(
            "ledger_worker_refused_sends_total", {"reason": reason}
        )

    assert [counted(r) for r in SendRefusal] == [1, 1, 1, None, None, None, None]
    assert [r.value for r in SendRefusal][:3] == ["lease", "partition", "token"]


async def test_revocation_cancels_queued_sends_and_lets_written_ones_finish(
    memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    hold = asyncio.Event()
    channel = FakeChannel(hold=hold)
    sender = sender_for(channel, memory_store, clock, appended, concurrency=1)
    first, second = claimed(memory_store, clock, 1), claimed(memory_store, clock, 2)
    sender.submit_send(first, 0)
    sender.submit_send(second, 0)
    await eventually(lambda: channel.received)  # the first reaches its write...
    assert channel.received == [(first.idempotency_key, 1)]  # ...the second waits for the slot
    stopping = asyncio.ensure_future(sender.stop_partitions({0}, REVOKED))
    await eventually(lambda: appended.of(DeliveryNotSent))  # the cancelled send records itself
    assert [e.idempotency_key for e in appended.of(DeliveryNotSent)] == [second.idempotency_key]
    assert "partition revoked" in appended.of(DeliveryNotSent)[0].reason
    hold.set()
    assert await stopping == 1
    await sender.drain(5)
    assert channel.received == [(first.idempotency_key, 1)]


async def test_no_lookup_while_this_process_has_the_attempt_open(
    memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    hold = asyncio.Event()
    channel = FakeChannel(hold=hold)
    sender = sender_for(channel, memory_store, clock, appended)
    state = claimed(memory_store, clock)
    sender.submit_send(state, 0)
    for _ in range(100):  # bounded: until the request is out and held
        if channel.received:
            break
        await asyncio.sleep(0.01)
    assert not sender.submit_lookup(state, 0)
    hold.set()
    await sender.drain(5)
    clock.advance(timedelta(seconds=60).total_seconds())
    assert sender.submit_lookup(state, 0)
    await sender.drain(5)
    assert channel.looked_up == [state.idempotency_key]


async def test_a_lookup_taken_back_by_a_revocation_may_be_asked_again(
    memory_store: MemoryStore, clock: Clock, appended: Appended
) -> None:
    channel = FakeChannel()
    sender = sender_for(channel, memory_store, clock, appended, concurrency=1)
    blocker = claimed(memory_store, clock, 1)
    channel.hold = asyncio.Event()
    sender.submit_send(blocker, 1)  # holds the only slot
    state = claimed(memory_store, clock, 2)
    assert sender.submit_lookup(state, 0)  # queued behind it
    assert await sender.stop_partitions({0}, REVOKED) == 1
    assert sender.submit_lookup(state, 0), "the cancelled lookup left its marker behind"
    channel.hold.set()
    await sender.drain(5)
    assert channel.looked_up == [state.idempotency_key]


@pytest.mark.parametrize(
    ("recipient", "payload", "says"),
    [
        ("https://admin:s3cr3t@hooks.example/x", {}, "carries credentials (user:password@)"),
        ("https://hooks.example/x?api_key=s3cr3t", {}, "a credential in its query (api_key=...)"),
        ("https://hooks.example/x?a=1&access_token=s3cr3t", {}, "(access_token=...)"),
        ("https://hooks.example/x?client_secret=s3cr3t", {}, "(client_secret=...)"),
        ("https://hooks.example/x", {"blob": "x" * 300}, "over the limit of 256"),
    ],
)
async def test_a_request_the_sdk_would_refuse_fails_unsent_with_the_reason(
    fake_channel: FakeChannel,
    memory_store: MemoryStore,
    clock: Clock,
    appended: Appended,
    recipient: str,
    payload: object,
    says: str,
) -> None:
    """Written by a raw producer (the SDK refuses it): nothing leaves, and the delivery is
    FAILED with why (never the secret), not retried, not left PENDING."""
    state = apply(
        None,
        new_delivery_requested(
            run_id="r",
            event_type="run.succeeded",
            channel="webhook",
            recipient=recipient,
            payload=payload,
            slo_seconds=60,
            producer="raw",
        ),
    )
    assert state is not None
    after = apply(state, claim(state, clock(), CTX))
    assert after is not None
    memory_store.put(after.idempotency_key, after)
    sender = sender_for(fake_channel, memory_store, clock, appended, max_payload_bytes=256)
    assert sender.submit_send(after, 0)
    await sender.drain(5)
    assert fake_channel.received == []
    [failed] = appended.of(DeliveryFailed)
    assert failed.error_class is ErrorClass.REFUSED_REQUEST
    assert says in failed.reason
    assert "s3cr3t" not in failed.reason
    final = apply(after, failed)
    assert final is not None
    assert final.status is Status.FAILED
