"""Blast radius (issue 31, item 4): what a stopping or dying worker leaves the others.

A SIGTERM (a rolling restart) leaves no UNKNOWN: the worker stops claiming, records "not
sent" for what never left, finishes what did, and its replacement sends the rest, each
once, at a receiver that does not dedupe. A SIGKILL turns at most the worker's claim
budget into UNKNOWN (what it can send in a short horizon), not its whole backlog.
"""

from __future__ import annotations

import asyncio
import os
import signal

from clients import DeliverySpec
from events.delivery import DeliveryUnknown
from tests.fixtures.broker import ReadTopic
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import PLAIN_ONLY, Stack
from tests.streams.matrix import publish, settled_once

# Sends slow enough (and few enough at once) that claims keep being made while the
# worker is stopped or killed, and a claim's read-back takes a moment (linger).
FLOW = {"channels.send_concurrency": 4, "worker.linger_s": 0.2}


async def unknowns(read_topic: ReadTopic, topic: str, keys: list[str]) -> int:
    """DeliveryUnknown events of ``keys`` in the log."""
    wanted = set(keys)
    return sum(
        1
        for event in await read_topic(topic)
        if isinstance(event, DeliveryUnknown) and event.idempotency_key in wanted
    )


def specs_for(webhook: Stack[WebhookDriver], prefix: str, n: int) -> list[DeliverySpec]:
    receiver = webhook.driver.receiver
    return [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"{prefix}{i}"), payload={})
        for i in range(n)
    ]


@PLAIN_ONLY
async def test_a_sigterm_mid_backlog_leaves_no_unknown_and_sends_each_once(
    webhook: Stack[WebhookDriver], read_topic: ReadTopic
) -> None:
    receiver = webhook.driver.receiver
    webhook.configure(FLOW)
    receiver.fault("delay", count=40, delay_s=0.2)
    first = webhook.workers.start("w1")
    keys = await publish(webhook.settings, "run-term", specs_for(webhook, "t", 40))
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 6, 60)
    assert await asyncio.to_thread(first.stop) == 0  # SIGTERM: a clean exit
    replacement = webhook.workers.start("w1")  # a rolling restart: the same name
    await settled_once(webhook.view, receiver, webhook.projection, keys, [replacement])
    assert await unknowns(read_topic, webhook.settings.kafka.topic_deliveries, keys) == 0


@PLAIN_ONLY
async def test_a_sigkilled_workers_successor_finds_at_most_its_budget_unknown(
    webhook: Stack[WebhookDriver], read_topic: ReadTopic
) -> None:
    receiver = webhook.driver.receiver
    webhook.configure(FLOW)
    doomed = webhook.workers.start("w1")
    keys = await publish(webhook.settings, "run-kill", specs_for(webhook, "k", 60))
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 4, 60)
    os.kill(doomed.process.pid, signal.SIGKILL)
    await asyncio.to_thread(doomed.process.wait, 30)
    successor = webhook.workers.start("w1")
    await settled_once(webhook.view, receiver, webhook.projection, keys, [successor])
    # The old budget admitted 16 rounds of the 4 send slots (all 60 here) whatever the
    # worker got through; now it holds what its sends complete in the horizon, >= 4.
    assert await unknowns(read_topic, webhook.settings.kafka.topic_deliveries, keys) <= 16
