"""The failure matrix's timing windows: paused workers, joins, slow receivers, SENT forever.

Each row runs real ``ledger worker`` processes against a receiver that does NOT dedupe and
asserts what the receiver saw per key: accepted exactly once, how many requests, never two
open at once. Leases are short (4 s; deadline 1.5 s + margin 0.5 s) to hit the windows.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal

from clients import DeliverySpec
from events.delivery_state import Status
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory, WorkerProcess, wait_for
from tests.streams.matrix import (  # the fixture: every row against plain and kit receivers
    PLAIN_ONLY,
    plain_and_kit_receivers,  # noqa: F401 - the receiver_factory fixture of this module
    posts,
    publish,
    settled_once,
    until,
    use,
)


def hooks(receiver: BackgroundSimulator, n: int, tag: str) -> list[DeliverySpec]:
    url = receiver.webhook_url
    return [
        DeliverySpec(channel="webhook", recipient=url(f"{tag}{i}"), payload={"i": i})
        for i in range(n)
    ]


async def owning(*workers: WorkerProcess) -> None:
    """Wait until every worker has been assigned at least one partition (bounded)."""

    async def assigned() -> bool:
        return all(re.search(r"owns partitions \[\d", w.output()) for w in workers)

    await wait_for(assigned, 60, "every worker owning partitions")


async def test_a_worker_paused_past_its_lease_sends_nothing_when_it_wakes(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(
        worker_factory, receiver, live_projection, changes={"channels.send_concurrency": 2}
    )
    w1, w2 = worker_factory.start("w1"), worker_factory.start("w2")
    await owning(w1, w2)
    receiver.fault("delay", count=32, delay_s=1.0)  # every send in flight for a second
    keys = await publish(settings, "run-pause", hooks(receiver, 32, "p"))

    async def w1_sending() -> bool:
        return "HTTP Request: POST" in w1.output()  # httpx logs each request at INFO

    await wait_for(w1_sending, 60, "w1 sending")
    os.kill(w1.process.pid, signal.SIGSTOP)  # sends in flight and queued, frozen
    # Past the lease (4 s) and the session timeout (10 s): the other worker takes the
    # partitions and settles the frozen claims (lookup after the settle window, retry)
    # before w1 wakes with its stale table and its queue.
    await until(ledger_view, keys, {Status.CONFIRMED}, [w2], "w2 settled w1's claims", receiver)
    os.kill(w1.process.pid, signal.SIGCONT)
    await settled_once(ledger_view, receiver, live_projection, keys, [w1, w2])


async def test_a_worker_joining_while_the_send_queue_outlasts_the_lease(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(
        worker_factory, receiver, live_projection, changes={"channels.send_concurrency": 2}
    )
    w1 = worker_factory.start("w1")
    receiver.fault("delay", count=30, delay_s=1.0)  # 30 sends, 2 at a time: a 15 s queue
    keys = await publish(settings, "run-join", hooks(receiver, 30, "j"))
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 1, 60)
    w2 = worker_factory.start("w2")  # joins: a rebalance while most sends are queued
    await settled_once(ledger_view, receiver, live_projection, keys, [w1, w2])


async def test_a_receiver_that_processes_after_the_client_gave_up(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-slow",
        [
            DeliverySpec(channel="webhook", recipient=receiver.webhook_url("slow"), payload={}),
            DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={"to": "s"}),
        ],
    )
    for key in keys:  # read at once, processed 3 s later; the client gives up after 1.5 s
        receiver.fault("delay", key=key, delay_s=3.0, accept_first=False)
    worker = worker_factory.start("w1")
    states = await settled_once(ledger_view, receiver, live_projection, keys, [worker])
    for key in keys:
        assert states[key].attempt == 1, "found by the lookup after the settle window"


async def test_a_body_trickled_past_the_lease_is_cut_at_the_deadline(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(settings, "run-trickle", hooks(receiver, 3, "t"))
    for key in keys:
        receiver.fault("trickle", key=key, delay_s=8.0)  # longer than the 4 s lease
    worker = worker_factory.start("w1")
    await settled_once(ledger_view, receiver, live_projection, keys, [worker])
    for key in keys:
        [request] = receiver.requests(key=key, method="POST")
        assert request.ended is not None
        held = request.ended - request.at
        assert held < settings.channels.send_deadline_s + 1.0, f"request held {held:.1f}s"


@PLAIN_ONLY  # the provider alone: no webhook receiver in this row
async def test_sent_is_not_forever_and_a_provider_failure_is_final(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False, delivered_after_s=None)  # stays "queued"
    settings = use(
        worker_factory,
        receiver,
        live_projection,
        changes={
            "worker.max_sent_polls": 3,
            "worker.lookup_backoff_s": 0.3,
            "worker.lookup_backoff_max_s": 1.0,
        },
    )
    keys = await publish(
        settings,
        "run-queued",
        [
            DeliverySpec(
                channel="provider",
                recipient=receiver.provider_url,
                payload={"to": q},
                event_type=f"report.{q}",
            )
            for q in ("queued", "failed")
        ],
    )
    queued, failed = keys
    receiver.fault("provider_failed", key=failed)
    worker = worker_factory.start("w1")
    await until(ledger_view, [queued], {Status.UNKNOWN}, [worker], "SENT given up")
    states = await until(ledger_view, [failed], {Status.FAILED}, [worker], "provider failure")
    states = await ledger_view()
    assert states[queued].last_error_class == "sent_unconfirmed"
    assert "polling gave up" in (states[queued].last_reason or "")
    assert states[failed].last_error_class == "provider_failed"
    assert "failed" in (states[failed].last_reason or "")
    for key in keys:
        assert receiver.accepted(key) == 1
        assert posts(receiver, key) == 1
    await live_projection.matches(await ledger_view())


async def test_without_a_lookup_an_unknown_stays_for_an_operator(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection, lookup=False)
    keys = await publish(settings, "run-nolookup", hooks(receiver, 4, "n"))
    late, error, stalled, clean = keys
    receiver.fault("delay", key=late, delay_s=3.0)  # accepted, answered after the deadline
    receiver.fault("error_after_accept", key=error, status=500)
    receiver.fault("stall", key=stalled, delay_s=3.0, status=503)  # not accepted, 503 late
    worker = worker_factory.start("w1")
    await until(ledger_view, [clean], {Status.CONFIRMED}, [worker], "the clean one CONFIRMED")

    async def unresolved() -> bool:
        states = await ledger_view()
        return all(
            states[k].status is Status.UNKNOWN and states[k].reconciled == "unsupported"
            for k in (late, error, stalled)
        )

    await wait_for(unresolved, 60, "UNKNOWN with no lookup to settle it")
    await asyncio.sleep(3)  # past another settle window and spacing: nothing more happens
    states = await ledger_view()
    for key in (late, error, stalled):
        assert states[key].status is Status.UNKNOWN
        assert posts(receiver, key) == 1, "an UNKNOWN without lookup or declared dedupe stays"
    assert [receiver.accepted(k) for k in keys] == [1, 1, 0, 1]
    await live_projection.matches(await ledger_view())


@PLAIN_ONLY  # the provider alone: no webhook receiver in this row
async def test_an_unknown_found_queued_is_polled_until_delivered(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    # The provider takes the message at once, answers after the 1.5 s deadline (UNKNOWN),
    # and reports it "queued" for 6 s: the first lookup (after the 2 s settle window)
    # finds it queued, which makes it SENT; polling must then go on until "delivered".
    receiver = receiver_factory(dedupe=False, delivered_after_s=6.0)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-found-queued",
        [DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={"to": "q"})],
    )
    receiver.fault("delay", key=keys[0], delay_s=3.0)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED by polling")
    state = states[keys[0]]
    assert state.attempt == 1
    assert receiver.accepted(keys[0]) == 1
    assert posts(receiver, keys[0]) == 1
    answers = [r.result for r in receiver.requests(key=keys[0], method="GET")]
    assert answers[0] == "found", answers  # queued: it became SENT
    assert len(answers) >= 2, answers  # polled on until delivered
    await live_projection.matches(await ledger_view())
