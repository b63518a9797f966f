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
from tests.fixtures.worker import WorkerProcess, wait_for
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import Stack, plain_receiver
from tests.streams.matrix import posts, publish, settled_once, until


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
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    settings = webhook.configure({"channels.send_concurrency": 2})
    w1, w2 = webhook.workers.start("w1"), webhook.workers.start("w2")
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
    await until(webhook.view, keys, {Status.CONFIRMED}, [w2], "w2 settled w1's claims", receiver)
    os.kill(w1.process.pid, signal.SIGCONT)
    await settled_once(webhook.view, receiver, webhook.projection, keys, [w1, w2])


async def test_a_worker_joining_while_the_send_queue_outlasts_the_lease(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    settings = webhook.configure({"channels.send_concurrency": 2})
    w1 = webhook.workers.start("w1")
    receiver.fault("delay", count=30, delay_s=1.0)  # 30 sends, 2 at a time: a 15 s queue
    keys = await publish(settings, "run-join", hooks(receiver, 30, "j"))
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 1, 60)
    w2 = webhook.workers.start("w2")  # joins: a rebalance while most sends are queued
    await settled_once(webhook.view, receiver, webhook.projection, keys, [w1, w2])


async def test_a_receiver_that_processes_after_the_client_gave_up(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    keys = await publish(
        webhook.settings,
        "run-slow",
        [
            DeliverySpec(channel="webhook", recipient=receiver.webhook_url("slow"), payload={}),
            DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={"to": "s"}),
        ],
    )
    for key in keys:  # read at once, processed 3 s later; the client gives up after 1.5 s
        receiver.fault("delay", key=key, delay_s=3.0, accept_first=False)
    worker = webhook.workers.start("w1")
    states = await settled_once(webhook.view, receiver, webhook.projection, keys, [worker])
    for key in keys:
        assert states[key].attempt == 1, "found by the lookup after the settle window"


async def test_a_body_trickled_past_the_lease_is_cut_at_the_deadline(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    keys = await publish(webhook.settings, "run-trickle", hooks(receiver, 3, "t"))
    for key in keys:
        receiver.fault("trickle", key=key, delay_s=8.0)  # longer than the 4 s lease
    worker = webhook.workers.start("w1")
    await settled_once(webhook.view, receiver, webhook.projection, keys, [worker])
    for key in keys:
        [request] = receiver.requests(key=key, method="POST")
        assert request.ended is not None
        held = request.ended - request.at
        assert held < webhook.settings.channels.send_deadline_s + 1.0, f"request held {held:.1f}s"


@plain_receiver(delivered_after_s=None)  # the provider alone; it stays "queued"
async def test_sent_is_not_forever_and_a_provider_failure_is_final(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    settings = webhook.configure(
        {
            "worker.max_sent_polls": 3,
            "worker.lookup_backoff_s": 0.3,
            "worker.lookup_backoff_max_s": 1.0,
        }
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
    worker = webhook.workers.start("w1")
    await until(webhook.view, [queued], {Status.UNKNOWN}, [worker], "SENT given up")
    states = await until(webhook.view, [failed], {Status.FAILED}, [worker], "provider failure")
    states = await webhook.view()
    assert states[queued].last_error_class == "sent_unconfirmed"
    assert "polling gave up" in (states[queued].last_reason or "")
    assert states[failed].last_error_class == "provider_failed"
    assert "failed" in (states[failed].last_reason or "")
    for key in keys:
        assert receiver.accepted(key) == 1
        assert posts(receiver, key) == 1
    await webhook.matches()


@plain_receiver(delivered_after_s=6.0)  # the provider alone
async def test_an_unknown_found_queued_is_polled_until_delivered(
    webhook: Stack[WebhookDriver],
) -> None:
    # The provider takes the message at once, answers after the 1.5 s deadline (UNKNOWN),
    # and reports it "queued" for 6 s: the first lookup (after the 2 s settle window)
    # finds it queued, which makes it SENT; polling must then go on until "delivered".
    receiver = webhook.driver.receiver
    spec = DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={"to": "q"})
    keys = await publish(webhook.settings, "run-found-queued", [spec])
    receiver.fault("delay", key=keys[0], delay_s=3.0)
    worker = webhook.workers.start("w1")
    states = await until(webhook.view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED by polling")
    state = states[keys[0]]
    assert state.attempt == 1
    assert receiver.accepted(keys[0]) == 1
    assert posts(receiver, keys[0]) == 1
    answers = [r.result for r in receiver.requests(key=keys[0], method="GET")]
    assert answers[0] == "found", answers  # queued: it became SENT
    assert len(answers) >= 2, answers  # polled on until delivered
    await webhook.matches()
