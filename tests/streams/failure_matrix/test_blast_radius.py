"""Blast radius (issue 31, item 4): what a stopping or dying worker leaves the others.

A SIGTERM (a rolling restart) leaves no UNKNOWN: the worker stops claiming, records "not
sent" for what never left, finishes what did, and its replacement sends the rest, each
once, at a receiver that does not dedupe. What a SIGKILL turns into UNKNOWN is bounded by
the claim budget (tests/streams/test_claim_budget.py; measured by bench.blast_radius):
a SIGKILL here cost the suite 15 s and passed on the code before the budget changed.
"""

from __future__ import annotations

import asyncio

from clients import DeliverySpec
from events.delivery import DeliveryUnknown
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import WorkerProcess
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import PLAIN_ONLY, Stack
from tests.streams.matrix import publish, settled_once

# Few sends at once, and a claim read back only after the worker's producer lingered for
# company: a worker stopped or killed mid-backlog holds claims it has not read back (under
# load the consumer's lag does the same).
SLOTS, LINGER_S = 8, 1.0
FLOW = {"channels.send_concurrency": SLOTS, "worker.linger_s": LINGER_S}


async def unknowns_of(
    read_topic: ReadTopic, webhook: Stack[WebhookDriver], keys: list[str], worker: WorkerProcess
) -> int:
    """DeliveryUnknown events of ``keys`` left by ``worker``'s claims (a lease that expired
    names its worker, whose id holds the process id)."""
    wanted, pid = set(keys), f":{worker.process.pid}:"
    return sum(
        1
        for event in await read_topic(webhook.settings.kafka.topic_deliveries)
        if isinstance(event, DeliveryUnknown)
        and event.idempotency_key in wanted
        and pid in event.reason
    )


def specs_for(webhook: Stack[WebhookDriver], prefix: str, n: int) -> list[DeliverySpec]:
    receiver = webhook.driver.receiver
    return [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"{prefix}{i}"), payload={})
        for i in range(n)
    ]


@PLAIN_ONLY
async def test_a_rolling_restart_leaves_no_unknown(
    webhook: Stack[WebhookDriver], read_topic: ReadTopic
) -> None:
    receiver = webhook.driver.receiver
    webhook.configure(FLOW)
    first = webhook.workers.start("w1")
    keys = await publish(webhook.settings, "run-blast", specs_for(webhook, "b", 32))
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 8, 60)
    # The first round arrived; its outcomes linger (LINGER_S), then the next round's claims
    # are proposed and linger unread as long: the SIGTERM lands in that window.
    await asyncio.sleep(1.5 * LINGER_S)
    assert await asyncio.to_thread(first.stop) == 0  # SIGTERM mid-backlog: a clean exit
    successor = webhook.workers.start("w1")  # its replacement (a rolling restart: same name)
    await settled_once(webhook.view, receiver, webhook.projection, keys, [successor])
    # The SIGTERMed worker's claims: each sent, or recorded not sent; none left to a lease.
    assert await unknowns_of(read_topic, webhook, keys, first) == 0
