"""The failure matrix (ARCHITECTURE.md), one test per row and variant.

Real broker, real ``ledger worker`` processes (crashes are real SIGKILLs at exact fault
points), the real fake provider. Every test checks the ledger's final state AND what the
receiver saw: each logical event accepted exactly once under its idempotency key, and
nothing lost. Where a double send must be visible, the receiver does NOT dedupe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from clients import DeliverySpec, Publisher
from events.delivery_state import Status
from ledger.simulator.background import BackgroundSimulator
from ledger.stack import settings_env
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.streams.matrix import (  # the fixture: every row against plain and kit receivers
    PLAIN_ONLY,
    plain_and_kit_receivers,  # noqa: F401 - the receiver_factory fixture of this module
    posts,
    publish,
    settled_once,
    until,
    use,
)


async def test_row1_crash_before_delivery_insert_leaves_no_outbound_work(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use(worker_factory, receiver, live_projection)
    worker = worker_factory.start("w1")
    txid = f"agent-{settings.kafka.topic_runs}"
    script = (
        "import asyncio\nfrom clients import DeliverySpec, Publisher\nfrom config import Settings\n"
        "async def main():\n"
        f"    async with Publisher(Settings(), transactional_id={txid!r}) as p:\n"
        f"        await p.run_succeeded('run-lost', 'h', [DeliverySpec(channel='webhook', "
        f"recipient={receiver.webhook_url('lost')!r}, payload={{}})])\n"
        "asyncio.run(main())\n"
    )
    env = settings_env(settings)
    env["LEDGER_FAULTS"] = '["publisher.before_commit"]'
    died = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, timeout=60, check=False
    )
    assert died.returncode == -signal.SIGKILL
    # The agent restarts with its transactional id (aborting the dead transaction) and
    # publishes its next run, which goes through.
    async with Publisher(settings, transactional_id=txid) as publisher:
        requests = await publisher.run_succeeded(
            "run-next",
            "h",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("next"), payload={})],
        )
    key = requests[0].idempotency_key
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "run-next CONFIRMED")
    assert [s.run_id for s in states.values()] == ["run-next"]
    assert set(receiver.events()) == {key}
    assert receiver.requests(path="/hooks/lost") == []
    await live_projection.matches(await ledger_view())


async def test_row2_crash_after_insert_before_claim_is_claimed_after_restart(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-2",
        [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("a"), payload={"n": 1})],
    )
    doomed = worker_factory.start("w1", faults=("worker.before_claim",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    states = await ledger_view()
    assert states[keys[0]].status is Status.PENDING  # requested, never claimed
    assert receiver.requests() == []
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED after restart")
    assert states[keys[0]].attempt == 1
    assert receiver.accepted(keys[0]) == 1
    assert posts(receiver, keys[0]) == 1
    await live_projection.matches(await ledger_view())


async def test_row3_timeout_is_unknown_then_settled_by_lookup(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-3",
        [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("a"), payload={"n": 3})],
    )
    receiver.fault("delay", key=keys[0], delay_s=4.0)  # accepted, answered after the timeout
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED by lookup")
    state = states[keys[0]]
    assert state.attempt == 1, "an UNKNOWN must never be retried when the lookup finds it"
    assert state.last_error_class == "timeout_after_write"
    assert "lookup by idempotency key" in (state.last_reason or "")
    assert receiver.accepted(keys[0]) == 1
    assert posts(receiver, keys[0]) == 1
    assert len(receiver.requests(key=keys[0], method="GET")) >= 1
    await live_projection.matches(await ledger_view())


@PLAIN_ONLY  # the provider alone: no webhook receiver in this row
async def test_row3_timeout_not_found_by_lookup_is_retried_safely(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-3b",
        [DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={"to": "x"})],
    )
    # The provider sits on the request past our deadline and never takes it.
    receiver.fault("stall", key=keys[0], delay_s=4.0, status=503)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED on retry")
    state = states[keys[0]]
    assert state.attempt == 2
    assert state.provider_message_id
    assert receiver.accepted(keys[0]) == 1
    assert posts(receiver, keys[0]) == 2
    # The retry came only after two "not found" answers.
    lookups = [r for r in receiver.requests(key=keys[0], method="GET") if r.status == 404]
    assert len(lookups) >= 2
    await live_projection.matches(await ledger_view())


async def test_row4_permanent_rejection_fails_with_its_class(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-4",
        [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("gone"), payload={})],
    )
    receiver.fault("reject", key=keys[0], status=410)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.FAILED}, [worker], "FAILED")
    assert states[keys[0]].last_error_class == "http_4xx"
    assert "410" in (states[keys[0]].last_reason or "")
    assert receiver.accepted(keys[0]) == 0
    assert posts(receiver, keys[0]) == 1, "a permanent rejection is never retried"
    await live_projection.matches(await ledger_view())


async def test_row4_rate_limit_is_retried_after_retry_after(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-4b",
        [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("busy"), payload={})],
    )
    receiver.fault("rate_limit", key=keys[0], retry_after="2")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED after 429")
    assert states[keys[0]].attempt == 2
    assert receiver.accepted(keys[0]) == 1
    sends = receiver.requests(key=keys[0], method="POST")
    assert len(sends) == 2
    assert (sends[1].at - sends[0].at) >= 1.9  # Retry-After: 2 honoured
    await live_projection.matches(await ledger_view())


async def test_row5_crash_after_provider_accepts_is_settled_by_lookup(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False, delivered_after_s=0)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-5",
        [
            DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={"to": "y"}),
            DeliverySpec(channel="webhook", recipient=receiver.webhook_url("z"), payload={}),
        ],
    )
    doomed = worker_factory.start("w1", faults=("worker.after_response",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    assert sum(receiver.accepted(k) for k in keys) >= 1  # the provider had it when we died
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED after crash")
    for key in keys:
        assert receiver.accepted(key) == 1, "nothing may be sent twice after the crash"
        assert posts(receiver, key) == 1
    provider = states[keys[0]]
    accepted = receiver.event(keys[0])
    assert accepted is not None
    assert provider.provider_message_id == accepted.receiver_id
    await live_projection.matches(await ledger_view())


async def test_row6_duplicate_worker_claim_during_rebalance_sends_once(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    specs = [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"r{i}"), payload={"i": i})
        for i in range(12)
    ]
    receiver.fault("delay", count=12, delay_s=1.0)  # every send in flight for a second
    w1 = worker_factory.start("w1")
    keys = await publish(settings, "run-6", specs)
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 1, 60)
    w2 = worker_factory.start("w2")  # joins the group: a rebalance while sends are in flight
    states = await settled_once(ledger_view, receiver, live_projection, keys, [w1, w2])
    assert all(s.fencing_token == 1 for s in states.values())


async def test_row6_worker_killed_mid_send_other_worker_settles_it(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    w2 = worker_factory.start("w2")
    w1 = worker_factory.start("w1")
    specs = [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"k{i}"), payload={"i": i})
        for i in range(8)
    ]
    receiver.fault("delay", count=8, delay_s=1.0)
    keys = await publish(settings, "run-6b", specs)
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 2, 60)
    os.kill(w1.process.pid, signal.SIGKILL)
    await settled_once(ledger_view, receiver, live_projection, keys, [w2])


async def test_row7_500_after_acceptance_is_looked_up_not_resent(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    keys = await publish(
        settings,
        "run-7",
        [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("a"), payload={})],
    )
    receiver.fault("error_after_accept", key=keys[0], status=500)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED")
    assert states[keys[0]].attempt == 1
    assert states[keys[0]].last_error_class == "http_5xx"
    assert receiver.accepted(keys[0]) == 1
    assert posts(receiver, keys[0]) == 1
    await live_projection.matches(await ledger_view())


async def test_row7_without_lookup_retry_only_where_the_endpoint_declares_dedupe(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
    live_projection: LiveProjection,
) -> None:
    settings = use(worker_factory, receiver, live_projection, lookup=False, receiver_dedupes=True)
    keys = await publish(
        settings,
        "run-7b",
        [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("a"), payload={})],
    )
    receiver.fault("error_after_accept", key=keys[0], status=502)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "CONFIRMED")
    assert states[keys[0]].attempt == 2
    assert posts(receiver, keys[0]) == 2
    assert receiver.accepted(keys[0]) == 1  # the receiver deduped the retry on webhook-id
    events = await read_topic(settings.kafka.topic_deliveries)
    retries = [e for e in events if e.type == "delivery.retry_scheduled"]
    assert len(retries) == 1
    assert "receiver_dedupes=true" in retries[0].safety
    assert retries[0].dedupe_rule == "webhook-id"  # the channel's rule, named in the event
    await live_projection.matches(await ledger_view())
