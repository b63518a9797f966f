"""A rate-limited endpoint against the real broker: two ``ledger worker`` processes share
one endpoint limited to 10/s (each holds half of the partitions, so each sends 5/s); a
receiver that does not dedupe counts every POST.

Tolerance: an endpoint's rate limit is a token bucket (streams/rate_gate.py), so the claims
(the moments a token is taken, on the broker's clock) in any 1 s window are at most the
limit plus the buckets' capacity: the burst, 2 here (1 token per worker), so 12. Arrivals
are measured at the receiver, after the claim's trip through the log and the send, and
the sender paces each worker's sends at its share right before the request
(streams/send_pacer.py, 10% slower than the share): each worker hands over at most 5 in any
1 s window, so the receiver sees at most the limit, 10, as long as the hand-off -> receiver
trip varies by less than 100 ms.
"""

from __future__ import annotations

import itertools
import re

from bench.rate_limit import most_in_a_window
from clients import DeliverySpec, Publisher
from config.settings import WebhookEndpoint, changed
from events.delivery import DeliveryClaimed
from tests.fixtures.broker import ReadTopic
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, wait_for

LIMIT = 10.0
BURST = 2.0
WORKERS = 2
DELIVERIES = 60


def test_most_in_a_window_counts_a_sliding_window() -> None:
    assert most_in_a_window([]) == 0
    assert most_in_a_window([0.0, 0.5, 0.99, 1.0, 1.5]) == 3
    assert most_in_a_window([0.0, 0.1, 0.2, 5.0]) == 3


async def test_two_workers_keep_one_endpoint_within_its_limit_and_deliver_each_once(
    worker_factory: WorkerFactory, receiver_factory: ReceiverFactory, read_topic: ReadTopic
) -> None:
    receiver = receiver_factory(dedupe=False, delivered_after_s=0)
    settings = receiver.settings(worker_factory.settings)
    endpoints = dict(settings.channels.webhook_endpoints)
    hooks = f"{receiver.base_url}/hooks/"
    endpoints[hooks] = WebhookEndpoint(
        **{**endpoints[hooks].model_dump(), "rate_limit_per_s": LIMIT, "rate_limit_burst": BURST}
    )
    settings = changed(settings, {"channels.webhook_endpoints": endpoints})
    worker_factory.settings = settings
    workers = [worker_factory.start(f"w{n}") for n in range(WORKERS)]

    async def both_own_partitions() -> bool:
        for worker in workers:
            assert worker.alive(), worker.output()[-3000:]
        return all(re.search(r"owns partitions \[\d", w.output()) for w in workers)

    await wait_for(both_own_partitions, 40, "both workers owning partitions")
    keys: list[str] = []
    async with Publisher(settings, producer_name="test-agent") as publisher:
        for run in range(DELIVERIES // 10):
            specs = [
                DeliverySpec(
                    channel="webhook", recipient=receiver.webhook_url(f"r{run}-{n}"), payload={}
                )
                for n in range(10)
            ]
            requested = await publisher.run_succeeded(f"run-rate-{run}", "h", specs)
            keys += [r.idempotency_key for r in requested]

    async def all_arrived() -> bool:
        for worker in workers:
            assert worker.alive(), worker.output()[-3000:]
        return all(receiver.accepted(key) >= 1 for key in keys)

    # 60 at 10/s take 6 s; the bound leaves room for a rebalance and a slow machine.
    await wait_for(all_arrived, 40, f"{DELIVERIES} deliveries at the receiver")
    posts = receiver.requests(path="/hooks/", method="POST")
    assert sorted(r.key or "" for r in posts) == sorted(keys), "each delivery arrived exactly once"
    assert all(receiver.accepted(key) == 1 for key in keys)
    times = [r.at for r in posts]
    most = most_in_a_window(times)
    overall = (len(times) - 1) / (max(times) - min(times))
    claims = [
        e.occurred_at.timestamp()
        for e in await read_topic(settings.kafka.topic_deliveries)
        if isinstance(e, DeliveryClaimed)
    ]
    assert len(claims) == DELIVERIES, "one claim each: nothing failed, nothing was re-claimed"
    granted = most_in_a_window(claims)
    print(f"most in 1 s: {most} arrivals, {granted} claims; {overall:.1f}/s; limit {LIMIT:g}/s")
    assert granted <= LIMIT + BURST, f"{granted} claims in one second (limit {LIMIT:g})"
    assert most <= LIMIT, f"{most} arrivals in one second"
    assert overall <= LIMIT * 1.1


SLOW_S = 2.0
PACED = 12


async def test_sends_queued_behind_a_slow_answer_leave_paced_not_together(
    worker_factory: WorkerFactory, receiver_factory: ReceiverFactory
) -> None:
    """The claims keep the limit, but the trip from claim to request may not: here one send
    slot, held 2 s by a slow answer while the gate goes on granting claims at 5/s. Without
    pacing at the send (streams/send_pacer.py) the claims queued behind it all left
    together when the slot freed; paced, the receiver sees at most 5 in any 1 s window."""
    limit = 5.0
    receiver = receiver_factory(dedupe=False, delivered_after_s=0)
    settings = receiver.settings(worker_factory.settings)
    endpoints = dict(settings.channels.webhook_endpoints)
    hooks = f"{receiver.base_url}/hooks/"
    endpoints[hooks] = WebhookEndpoint(
        **{**endpoints[hooks].model_dump(), "rate_limit_per_s": limit}
    )
    worker_factory.settings = changed(
        settings,
        {
            "channels.webhook_endpoints": endpoints,
            "channels.send_concurrency": 1,
            # Room for the slow answer: the deadline over it, and a lease long enough that
            # the claims queued behind it may still be sent (none is refused at the guard).
            "channels.send_deadline_s": 5.0,
            "channels.http_timeout_s": 5.0,
            "worker.lease_s": 20.0,
            "worker.max_open_claims": PACED,
        },
    )
    worker = worker_factory.start("w0")

    async def owns_partitions() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return re.search(r"owns partitions \[\d", worker.output()) is not None

    await wait_for(owns_partitions, 40, "the worker owning partitions")
    receiver.fault("delay", count=1, path="/hooks/", delay_s=SLOW_S)
    async with Publisher(worker_factory.settings, producer_name="test-agent") as publisher:
        specs = [
            DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"s{n}"), payload={})
            for n in range(PACED)
        ]
        keys = [r.idempotency_key for r in await publisher.run_succeeded("run-slow", "h", specs)]

    async def all_arrived() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return all(receiver.accepted(key) >= 1 for key in keys)

    await wait_for(all_arrived, 40, f"{PACED} deliveries at the receiver")
    posts = receiver.requests(path="/hooks/", method="POST")
    assert sorted(r.key or "" for r in posts) == sorted(keys), "each delivery arrived exactly once"
    assert all(receiver.accepted(key) == 1 for key in keys)
    times = sorted(r.at for r in posts)
    most = most_in_a_window(times)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    print(f"most in 1 s: {most} arrivals at {limit:g}/s; gaps between arrivals {gaps}")
    assert most <= limit, f"{most} arrivals in one second (limit {limit:g}/s)"
