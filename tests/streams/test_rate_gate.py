"""Per-endpoint rate limits (streams/rate_gate.py, streams/rate_limits.py), broker-free: the
bucket, each worker's share by partitions, recheck times, request order, and the gate in the
processor (held deliveries write nothing and go out in order, no faster than the share)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from config.parts import ChannelSettings, WebhookEndpoint
from events.codec import encode
from events.delivery import DeliveryClaimed
from events.delivery_state import DeliveryState, apply
from events.endpoints import EndpointSpec, register
from streams.endpoint_gate import EndpointGate
from streams.gates import Gates
from streams.metrics import WorkerMetrics
from streams.processor import MemoryStore, Record
from streams.rate_gate import STALE_AFTER_S, RateGate, TokenBucket
from streams.rate_limits import (
    FirstRateLimit,
    RateLimit,
    RegistryRateLimits,
    SettingsRateLimits,
)
from streams.timers import DueIndex
from tests.fixtures.core import T0, Appended, Clock, requested
from tests.streams.test_endpoint_gate import WHO, Table
from tests.streams.test_processor import processor_for

ENDPOINT = "https://hooks.example/in/"


class Fixed:
    """One limit for every webhook recipient."""

    def __init__(self, per_s: float, burst: float | None = None, channel: str = "webhook") -> None:
        self.limit = RateLimit(f"{channel}:hooks", per_s, burst)
        self.channel = channel

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        return self.limit if channel == self.channel else None


def state(n: int, at: datetime = T0, channel: str = "webhook") -> DeliveryState:
    made = apply(None, requested(n, channel=channel, at=at))
    assert made is not None
    return made


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_bucket_starts_with_one_token_fills_at_its_rate_and_says_when_the_next_is_due() -> None:
    bucket = TokenBucket(rate=4.0, capacity=2.0, now=T0)
    assert bucket.take(T0)
    assert not bucket.take(T0)
    assert bucket.due(T0) == at(0.25)
    assert bucket.due(T0, nth=3) == at(0.75)
    assert bucket.take(at(0.25))
    # Filled no further than its capacity, however long it was quiet.
    assert [bucket.take(at(100)) for _ in range(3)] == [True, True, False]
    # A clock that steps back fills nothing.
    assert not bucket.take(at(99))


def test_a_workers_share_is_the_limit_times_the_partitions_it_holds() -> None:
    gate = RateGate(Fixed(20.0, burst=4.0), tick_s=0.1)
    gate.share(2, 8)  # a quarter of the partitions: 5/s, a bucket of 1 token
    granted = []
    now = T0
    for n in range(200):
        while gate.hold(state(n), now) is not None:
            now += timedelta(milliseconds=10)
        granted.append(now)
    span = (granted[-1] - granted[0]).total_seconds()
    assert 199 / span == pytest.approx(5.0, rel=0.02)
    # Rebalanced to half the partitions: 10/s, a bucket of 2.
    gate.share(4, 8)
    start = now
    for n in range(200, 400):
        while gate.hold(state(n), now) is not None:
            now += timedelta(milliseconds=10)
    assert 200 / (now - start).total_seconds() == pytest.approx(10.0, rel=0.05)


def test_the_burst_is_the_shares_and_never_less_than_one_token() -> None:
    gate = RateGate(Fixed(20.0, burst=8.0), tick_s=0.5)
    gate.share(2, 8)
    assert gate.hold(state(0), T0) is None  # the one token it starts with
    later = at(60)  # quiet for a minute: the bucket holds 8 x 2/8 = 2 tokens, no more
    assert [gate.hold(state(n), later) is None for n in (1, 2, 3)] == [True, True, False]
    tiny = RateGate(Fixed(1.0, burst=1.0), tick_s=0.5)
    tiny.share(1, 16)  # 1/16 of a token per second, a bucket of 1: it still sends
    assert tiny.hold(state(0), T0) is None
    hold = tiny.hold(state(1), T0)
    assert hold is not None
    assert hold.recheck_at == at(16)


def test_the_default_burst_is_one_looks_worth_so_the_limit_is_reached() -> None:
    # Held deliveries asked again every 0.5 s: a bucket of one token would lose what falls
    # due between two looks and send only 2/s out of 10/s.
    gate = RateGate(Fixed(10.0), tick_s=0.5)
    gate.share(8, 8)
    sent = 0
    for tick in range(1, 21):  # ten seconds of ticks, a long backlog
        now = at(tick * 0.5)
        for n in range(sent, sent + 50):
            if gate.hold(state(n), now) is None:
                sent += 1
            else:
                break
    assert sent == pytest.approx(100, abs=6)


def test_a_held_delivery_is_given_the_time_its_own_token_is_due_and_writes_nothing() -> None:
    gate = RateGate(Fixed(2.0, burst=1.0), tick_s=0.1)
    assert gate.hold(state(0), T0) is None
    holds = [gate.hold(state(n, at=at(n)), T0) for n in (1, 2, 3)]
    assert [h.recheck_at if h else None for h in holds] == [at(0.5), at(1.0), at(1.5)]
    assert all(h is not None and h.reason is None for h in holds), "an ordinary PENDING"
    assert gate.waiting == 3


def test_deliveries_of_one_endpoint_are_granted_in_request_order() -> None:
    gate = RateGate(Fixed(1.0, burst=1.0), tick_s=0.1)
    assert gate.hold(state(0), T0) is None
    # Asked in the order 3, 1, 2; requested in the order 1, 2, 3.
    for n in (3, 1, 2):
        assert gate.hold(state(n, at=at(n)), T0) is not None
    granted: list[int] = []
    now = T0
    while len(granted) < 3:
        now += timedelta(seconds=0.1)
        for n in (3, 2, 1):  # the youngest asks first every time: it must not jump ahead
            if n not in granted and gate.hold(state(n, at=at(n)), now) is None:
                granted.append(n)
    assert granted == [1, 2, 3]
    # A new request never jumps a waiting older one, even when a token is there.
    assert gate.hold(state(9, at=at(9)), at(100)) is None
    gate2 = RateGate(Fixed(1.0, burst=5.0), tick_s=0.1)
    assert gate2.hold(state(0), T0) is None
    assert gate2.hold(state(1, at=at(1)), T0) is not None
    assert gate2.hold(state(2, at=at(2)), at(3)) is not None, "1 waits; 2 is behind it"
    assert gate2.hold(state(1, at=at(1)), at(3)) is None
    assert gate2.hold(state(2, at=at(2)), at(3)) is None


def test_one_claim_asked_again_spends_one_token_and_a_retry_spends_another() -> None:
    gate = RateGate(Fixed(1.0, burst=1.0), tick_s=0.1)
    first = state(0)
    assert gate.hold(first, T0) is None
    assert gate.hold(first, at(0.5)) is None, "the same claim asked again (no room, not read)"
    assert gate.hold(state(1), at(0.5)) is not None
    retry = DeliveryState(**{**first.__dict__, "fencing_token": 1, "attempt": 1})
    assert gate.hold(retry, at(0.5)) is not None, "a retry's claim costs a token of its own"


def test_a_waiter_that_is_not_asked_again_stops_holding_the_others() -> None:
    gate = RateGate(Fixed(1.0, burst=1.0), tick_s=0.1)
    assert gate.hold(state(0), T0) is None
    assert gate.hold(state(1, at=at(1)), T0) is not None  # then claimed elsewhere: never asked
    assert gate.hold(state(2, at=at(2)), at(1.5)) is not None, "1 is still first"
    assert gate.hold(state(2, at=at(2)), at(1.0 + STALE_AFTER_S + 1)) is None
    assert gate.waiting == 0


def test_a_rebalance_forgets_who_waits_and_resizes_the_bucket() -> None:
    gate = RateGate(Fixed(8.0, burst=8.0), tick_s=0.1)
    gate.share(8, 8)
    for n in range(1, 4):
        gate.hold(state(n, at=at(n)), T0)
    gate.share(1, 8)
    assert gate.waiting == 0
    assert gate.hold(state(5), at(10)) is None  # a bucket of max(1, 8 x 1/8) = 1 token
    hold = gate.hold(state(6, at=at(6)), at(10))
    assert hold is not None
    assert hold.recheck_at == at(11)


def test_holds_are_counted() -> None:
    metrics = WorkerMetrics()
    gate = RateGate(Fixed(1.0), tick_s=0.1, metrics=metrics)
    gate.hold(state(0), T0)
    gate.hold(state(1), T0)
    gate.hold(state(2), T0)
    assert metrics.registry.get_sample_value("ledger_worker_rate_limit_holds_total") == 2


def test_unlimited_endpoints_and_channels_are_never_held() -> None:
    gate = RateGate(Fixed(0.001, channel="slack"), tick_s=0.1)
    assert all(gate.hold(state(n), T0) is None for n in range(10))


async def test_in_the_processor_held_deliveries_write_nothing_and_go_out_in_order_at_the_share(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    due = DueIndex(tmp_path / "due")
    store = MemoryStore()
    processor = processor_for(store, clock, appended, due)
    gate = RateGate(Fixed(4.0, burst=1.0), tick_s=0.1)
    gate.share(4, 8)  # 2/s
    processor._gate = Gates([gate])
    # Twenty requests read in reverse order of their request times.
    for offset, n in enumerate(range(20, 0, -1)):
        r = requested(n, at=at(n * 0.001))
        await processor.handle(Record("t", 0, offset, r.idempotency_key.encode(), encode(r)))
    claimed = [(0.0, c.run_id) for c in appended.of(DeliveryClaimed)]
    for step in range(1, 120):  # twelve seconds of 0.1 s ticks
        clock.advance(0.1)
        before = len(appended.of(DeliveryClaimed))
        await processor.tick({0})
        claims = appended.of(DeliveryClaimed)[before:]
        claimed += [(step * 0.1, c.run_id) for c in claims]
    assert [type(e).__name__ for e in appended.events] == ["DeliveryClaimed"] * len(claimed)
    runs = [run for _, run in claimed]
    assert runs[0] == "run-20", "the first read took the one token there was"
    assert runs[1:] == [f"run-{n}" for n in range(1, len(runs))], "then in request order"
    times = [t for t, _ in claimed]
    assert len(claimed) == 20
    assert times[-1] == pytest.approx(19 * 0.5, abs=0.15), "no slower than the share either"
    assert all(later - earlier >= 0.5 - 1e-6 for earlier, later in itertools.pairwise(times))
    due.close()


def test_settings_limits_a_webhook_endpoint_by_its_parsed_url_and_others_by_prefix() -> None:
    channels = ChannelSettings(
        webhook_endpoints={
            ENDPOINT: WebhookEndpoint(rate_limit_per_s=20),
            "https://hooks.example/in/slow/": WebhookEndpoint(
                rate_limit_per_s=1, rate_limit_burst=2
            ),
            "https://other.example/": WebhookEndpoint(),
        },
        rate_limits={"slack:acme/": 3, "slack:acme/C1": {"per_s": 1, "burst": 2}, "email": 50},
    )
    limits = SettingsRateLimits(channels)
    hooks = limits.limit_for("webhook", "https://HOOKS.example:443/in/a?x=1")
    assert hooks == RateLimit("webhook:https://hooks.example:443/in", 20.0)
    assert limits.limit_for("webhook", "https://hooks.example/in/a") is hooks
    slow = limits.limit_for("webhook", "https://hooks.example/in/slow/x")
    assert slow is not None
    assert (slow.per_s, slow.burst) == (1.0, 2.0)
    assert limits.limit_for("webhook", "https://hooks.example/inside") is None
    assert limits.limit_for("webhook", "https://other.example/x") is None
    assert limits.limit_for("slack", "acme/C1") == RateLimit("slack:acme/C1", 1.0, 2.0)
    assert limits.limit_for("slack", "acme/C2") == RateLimit("slack:acme/", 3.0)
    assert limits.limit_for("email", "a@b.example") == RateLimit("email", 50.0)
    assert limits.limit_for("slack", "other/C1") is None
    with pytest.raises(ValidationError):
        ChannelSettings(rate_limits={":x": 1})
    with pytest.raises(ValidationError):
        ChannelSettings(rate_limits={"email": 0})
    with pytest.raises(ValidationError):
        WebhookEndpoint(rate_limit_per_s=5, rate_limit_burst=0.5)


async def test_in_the_processor_the_default_burst_reaches_the_share_with_the_gates_looks(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    # A backlog read over 4 s, the timers run when the gate says a token is due (looked at
    # every 50 ms, as the worker does) and on a 0.5 s tick; a share of 5/s.
    due = DueIndex(tmp_path / "due")
    processor = processor_for(MemoryStore(), clock, appended, due)
    gate = RateGate(Fixed(20.0))
    gate.share(2, 8)
    processor._gate = Gates([gate])
    requests = [requested(n, at=at(n * 0.04)) for n in range(100)]
    read = 0
    for step in range(400):  # twenty seconds in steps of 50 ms
        while read < len(requests) and read * 0.04 <= step * 0.05:
            r = requests[read]
            await processor.handle(Record("t", 0, read, r.idempotency_key.encode(), encode(r)))
            read += 1
        if step % 10 == 0 or gate.recheck_due(clock()):
            await processor.tick({0})
        clock.advance(0.05)
    claims = appended.of(DeliveryClaimed)
    assert len(claims) >= 97, "about 1 + 5/s x 19.5 s"
    assert [c.run_id for c in claims] == [f"run-{n}" for n in range(len(claims))]
    due.close()


def test_the_worker_is_told_when_a_held_deliverys_token_is_due() -> None:
    gate = RateGate(Fixed(4.0, burst=1.0))
    assert gate.hold(state(0), T0) is None
    assert gate.hold(state(1, at=at(1)), T0) is not None  # due at 0.25
    assert gate.hold(state(2, at=at(2)), T0) is not None  # due at 0.5
    assert not gate.recheck_due(at(0.2))
    assert gate.recheck_due(at(0.25))
    assert not gate.recheck_due(at(0.3)), "told once per recheck time"
    assert gate.recheck_due(at(0.6))
    assert not gate.recheck_due(at(5))


def test_the_registrys_limit_comes_first_and_changes_without_a_restart() -> None:
    delivery = state(1)
    prefix = delivery.recipient.rsplit("/", 1)[0] + "/"
    table = Table()
    endpoint_gate = EndpointGate(table)
    settings = SettingsRateLimits(
        ChannelSettings(webhook_endpoints={prefix: WebhookEndpoint(rate_limit_per_s=50)})
    )
    limits = FirstRateLimit([RegistryRateLimits(table, endpoint_gate.endpoint_of), settings])
    assert limits.limit_for("webhook", delivery.recipient) == settings.limit_for(
        "webhook", delivery.recipient
    ), "not registered: the settings' limit"
    spec = EndpointSpec(channel="webhook", address=prefix, rate_limit_per_s=2)
    table.put(register("acme", spec, (), at=T0, existing=None, **WHO).endpoint)
    assert limits.limit_for("webhook", delivery.recipient) == RateLimit("endpoint:acme", 2.0)
    gate = RateGate(limits)
    assert gate.hold(delivery, T0) is None
    hold = gate.hold(state(2), T0)
    assert hold is not None
    assert hold.recheck_at == at(0.5)
    # Updated in the registry: the bucket takes the new rate at its next use.
    faster = EndpointSpec(channel="webhook", address=prefix, rate_limit_per_s=10)
    table.put(register("acme", faster, (), at=T0, existing=None, **WHO).endpoint)
    hold = gate.hold(state(2), T0)
    assert hold is not None
    assert hold.recheck_at == at(0.1)
