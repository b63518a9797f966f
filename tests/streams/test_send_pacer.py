"""The send pacer (streams/send_pacer.py), broker-free: the rule on a clock passed in (the
spacing, each worker's share, the lease's last moment), its edge (one endpoint's sends in
turn, cancellable), and the sender handing over paced sends before the write guard."""

from __future__ import annotations

import asyncio
import itertools
import math
from datetime import datetime, timedelta

import pytest

from bench.rate_limit import most_in_a_window
from events.delivery import DeliveryNotSent
from events.delivery_state import DeliveryState, apply
from streams.decisions import claim
from streams.metrics import WorkerMetrics
from streams.processor import MemoryStore
from streams.rate_limits import RateLimit
from streams.send_pacer import PACE_MARGIN, PaceRule, SendPacer
from streams.sender import Sender, SendRefusal
from tests.fixtures.core import T0, Appended, Clock, FakeChannel, core_context, requested

CTX = core_context()
URL = "https://hooks.example/in/a"


class Fixed:
    """One limit for every webhook recipient."""

    def __init__(self, per_s: float, burst: float | None = None) -> None:
        self.limit = RateLimit("webhook:hooks", per_s, burst)

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        return self.limit if channel == "webhook" else None


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spacing(share_per_s: float) -> float:
    return (1 + PACE_MARGIN) / share_per_s


def test_an_endpoint_without_a_limit_is_not_paced() -> None:
    rule = PaceRule(Fixed(20.0))
    assert rule.turn("slack", "acme/C1", T0) is None
    assert rule.endpoint_of("slack", "acme/C1") is None
    assert rule.endpoint_of("webhook", URL) == "webhook:hooks"


def test_hand_offs_are_spaced_by_the_share_with_its_margin_from_when_each_left() -> None:
    rule = PaceRule(Fixed(20.0))
    rule.share(2, 8)  # 5/s: a hand-off every 0.22 s
    first = rule.turn("webhook", URL, T0)
    assert first is not None
    assert first.go
    waiting = rule.turn("webhook", URL, at(0.1))
    assert waiting is not None
    assert not waiting.go
    assert not waiting.late
    assert waiting.at == at(spacing(5.0))
    second = rule.turn("webhook", URL, waiting.at)
    assert second is not None
    assert second.go
    # The third left late (at 1.0 s): the next gap is counted from then, not from its turn.
    assert rule.turn("webhook", URL, at(1.0)).go  # type: ignore[union-attr]
    fourth = rule.turn("webhook", URL, at(1.0))
    assert fourth is not None
    assert fourth.at == at(1.0 + spacing(5.0))


@pytest.mark.parametrize(("owned", "per_s"), [(2, 20.0), (3, 20.0), (8, 5.0), (1, 100.0)])
def test_in_any_window_a_worker_hands_over_at_most_its_share(owned: int, per_s: float) -> None:
    """Asked every millisecond for 20 s: never more than ceil(share x T) in a window of T,
    and over the whole run the share less its margin."""
    rule = PaceRule(Fixed(per_s))
    rule.share(owned, 8)
    share = per_s * owned / 8
    sent: list[float] = []
    for ms in range(20_000):
        turn = rule.turn("webhook", URL, at(ms / 1000))
        if turn is not None and turn.go:
            sent.append(ms / 1000)
    for window_s in (1.0, 2.5):
        assert most_in_a_window(sent, window_s) <= math.ceil(share * window_s)
    rate = (len(sent) - 1) / (sent[-1] - sent[0])
    assert share / (1 + PACE_MARGIN) * 0.98 <= rate <= share / (1 + PACE_MARGIN)


def test_a_rebalance_resizes_the_pace_at_the_next_send() -> None:
    rule = PaceRule(Fixed(20.0))
    rule.share(2, 8)
    assert rule.turn("webhook", URL, T0).go  # type: ignore[union-attr]
    rule.share(4, 8)  # 10/s from now on; what filled at 5/s before is kept
    filled = 0.05 * 5.0 / (1 + PACE_MARGIN)
    expected = 0.05 + (1 - filled) * spacing(10.0)
    assert rule.turn("webhook", URL, at(0.05)).at == at(round(expected, 6))  # type: ignore[union-attr]
    rule.share(0, 8)  # no partitions: no share; the token filled before is all it has
    assert rule.turn("webhook", URL, at(5.0)).go  # type: ignore[union-attr]
    assert not rule.turn("webhook", URL, at(500.0)).go  # type: ignore[union-attr]


def test_a_burst_lets_a_quiet_endpoints_saved_tokens_go_at_once() -> None:
    rule = PaceRule(Fixed(20.0, burst=8.0))
    rule.share(2, 8)  # 2 tokens of the burst, starting with 1
    assert rule.turn("webhook", URL, T0).go  # type: ignore[union-attr]
    turns = [rule.turn("webhook", URL, at(10.0)) for _ in range(3)]  # quiet for 10 s
    assert [t.go for t in turns if t is not None] == [True, True, False]


def test_a_turn_after_the_leases_last_moment_is_late_and_takes_nothing() -> None:
    rule = PaceRule(Fixed(20.0))
    rule.share(2, 8)
    assert rule.turn("webhook", URL, T0).go  # type: ignore[union-attr]
    late = rule.turn("webhook", URL, at(0.01), write_by=at(0.2))
    assert late is not None
    assert late.late
    assert not late.go
    assert "lets it go only 0.0s after its lease lets a send start" in late.detail
    # Nothing was taken: the next send with lease to spare goes at the same turn.
    assert rule.turn("webhook", URL, at(0.01), write_by=at(5.0)).at == at(spacing(5.0))  # type: ignore[union-attr]
    # A token there now, but the lease's last moment already past: late too.
    assert rule.turn("webhook", URL, at(1.0), write_by=at(1.0)).late  # type: ignore[union-attr]
    assert rule.turn("webhook", URL, at(1.0), write_by=at(1.5)).go  # type: ignore[union-attr]


class VirtualTime:
    """The pacer's clock and sleep: sleeping moves the clock (and yields)."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(max(seconds, 0.0))
        await asyncio.sleep(0)


async def test_one_endpoints_sends_wait_in_turn_in_the_order_they_came() -> None:
    time = VirtualTime()
    metrics = WorkerMetrics()
    rule = PaceRule(Fixed(20.0))
    pacer = SendPacer(rule, time.clock, sleep=time.sleep, metrics=metrics)
    pacer.share(2, 8)
    left: list[tuple[int, datetime]] = []

    async def send(n: int) -> None:
        assert await pacer.wait("webhook", URL, None) is None
        left.append((n, time.clock()))

    await asyncio.gather(*(send(n) for n in range(4)))
    assert [n for n, _ in left] == [0, 1, 2, 3]
    gaps = [(b - a).total_seconds() for (_, a), (_, b) in itertools.pairwise(left)]
    assert gaps == pytest.approx([spacing(5.0)] * 3, abs=1e-5)
    assert pacer.waiting == 0
    paced = metrics.registry.get_sample_value("ledger_worker_rate_paced_sends_total")
    assert paced == 3  # the first went at once
    # Another channel is never paced, however busy the endpoint.
    assert await pacer.wait("slack", "acme/C1", None) is None


async def test_a_send_taken_back_while_it_waits_lets_the_next_one_go() -> None:
    time = VirtualTime()
    gate = asyncio.Event()

    async def sleep(seconds: float) -> None:
        await gate.wait()  # the first waiter sleeps until cancelled
        await time.sleep(seconds)

    pacer = SendPacer(PaceRule(Fixed(20.0)), time.clock, sleep=sleep)
    pacer.share(2, 8)
    assert await pacer.wait("webhook", URL, None) is None  # the token of now
    stopped = asyncio.ensure_future(pacer.wait("webhook", URL, None))
    await asyncio.sleep(0)
    after = asyncio.ensure_future(pacer.wait("webhook", URL, None))
    await asyncio.sleep(0)
    assert pacer.waiting == 2
    stopped.cancel()
    gate.set()
    assert await after is None
    assert stopped.cancelled()
    assert pacer.waiting == 0


def claimed(store: MemoryStore, clock: Clock, n: int) -> DeliveryState:
    state = apply(None, requested(n))
    assert state is not None
    after = apply(state, claim(state, clock(), CTX))
    assert after is not None
    store.put(after.idempotency_key, after)
    return after


class Stamped(list[tuple[str, int]]):
    """``FakeChannel.received`` that notes the clock of each first byte allowed out."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.times: list[datetime] = []

    def append(self, item: tuple[str, int]) -> None:
        self.times.append(self.clock())
        super().append(item)


class StampedChannel(FakeChannel):
    """A fake receiver whose ``times`` are when each attempt was written."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.received = Stamped(clock)

    @property
    def times(self) -> list[datetime]:
        assert isinstance(self.received, Stamped)
        return self.received.times


def paced_sender(
    channel: FakeChannel,
    store: MemoryStore,
    time: VirtualTime,
    appended: Appended,
    per_s: float,
    metrics: WorkerMetrics | None = None,
) -> Sender:
    pacer = SendPacer(PaceRule(Fixed(per_s)), time.clock, sleep=time.sleep)
    pacer.share(8, 8)
    return Sender(
        channels={"webhook": channel},
        ctx=CTX,
        append=appended,
        clock=time.clock,
        concurrency=1,
        current=store.get,
        owns={0}.__contains__,
        deadline_s=10.0,
        skew_margin_s=2.0,
        pacer=pacer,
        metrics=metrics,
    )


async def test_sends_queued_behind_a_slow_one_leave_paced_when_the_slot_frees(
    memory_store: MemoryStore, appended: Appended
) -> None:
    time = VirtualTime()
    channel = StampedChannel(time.clock)
    channel.hold = asyncio.Event()  # the first answer is slow: the one slot stays taken
    sender = paced_sender(channel, memory_store, time, appended, per_s=5.0)
    states = [claimed(memory_store, time.clock, n) for n in range(4)]
    for state in states:
        assert sender.submit_send(state, 0)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(channel.received) == 1  # the others queue for the slot
    time.clock.advance(3.0)  # the slow answer comes 3 s later
    channel.hold.set()
    await sender.drain(5)
    assert [key for key, _ in channel.received] == [s.idempotency_key for s in states]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(channel.times)]
    assert gaps[0] == pytest.approx(3.0)  # the slot freed after the pace was due: at once
    assert gaps[1:] == pytest.approx([spacing(5.0)] * 2, abs=1e-5)


async def test_a_turn_after_the_lease_lets_a_send_start_is_not_waited_for(
    memory_store: MemoryStore, appended: Appended
) -> None:
    time = VirtualTime()
    channel = StampedChannel(time.clock)
    metrics = WorkerMetrics()
    # One send per 22 s: the lease (CTX's) less deadline and margin ends long before.
    sender = paced_sender(channel, memory_store, time, appended, per_s=0.05, metrics=metrics)
    first, second = (claimed(memory_store, time.clock, n) for n in range(2))
    sender.submit_send(first, 0)
    sender.submit_send(second, 0)
    await sender.drain(5)
    assert [key for key, _ in channel.received] == [first.idempotency_key]
    [not_sent] = appended.of(DeliveryNotSent)
    assert not_sent.idempotency_key == second.idempotency_key
    assert "after its lease lets a send start" in not_sent.reason
    assert time.slept == []  # it did not wait
    refused = metrics.registry.get_sample_value(
        "ledger_worker_refused_sends_total", {"reason": SendRefusal.LEASE}
    )
    assert refused == 1
    after = apply(second, not_sent)
    assert after is not None
    assert after.status.public == "PENDING"  # claimed again, no lookup needed
