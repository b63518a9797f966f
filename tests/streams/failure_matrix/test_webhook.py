"""The failure matrix's webhook-only rows (ARCHITECTURE.md rows 1, 2 and 6): the agent or
the worker killed around the claim, and workers rebalancing while sends are in flight.
Rows 1 and 2 run in both of the publisher's modes (transaction and record), and row 2 has
a record-mode variant of its own: the worker killed in the middle of a run's fan-out.

Real broker, real ``ledger worker`` processes (crashes are real SIGKILLs at exact fault
points), the simulator's receiver, plain and receiver-kit. Every test checks the ledger's
final state AND what the receiver saw: each logical event accepted exactly once under its
idempotency key, and nothing lost. The rows every channel has are in ``test_table.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from clients import DeliverySpec, Publisher
from events.codec import decode
from events.delivery import DeliveryRequested
from events.delivery_state import Status
from ledger.stack import settings_env
from projections import open_store
from projections.schema import DELIVERIES
from streams.fan_out import MID_FAN_OUT
from tests.fixtures.broker import ReadTopic
from tests.streams.failure_matrix.drivers import Fault, WebhookDriver
from tests.streams.failure_matrix.stacks import BOTH_MODES, RECORD_MODE, Stack
from tests.streams.matrix import posts, publish, settled_once


@BOTH_MODES
async def test_row1_crash_before_delivery_insert_leaves_no_outbound_work(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver, settings = webhook.driver.receiver, webhook.settings
    webhook.workers.start("w1")
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
    states = await webhook.until([key], {Status.CONFIRMED}, "run-next CONFIRMED")
    assert [s.run_id for s in states.values()] == ["run-next"]
    assert set(receiver.events()) == {key}
    assert receiver.requests(path="/hooks/lost") == []
    await webhook.matches()


@BOTH_MODES
async def test_row2_crash_after_insert_before_claim_is_claimed_after_restart(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    [key] = await webhook.publish("run-2")
    await webhook.killed("worker.before_claim")
    states = await webhook.view()
    assert states[key].status is Status.PENDING  # requested, never claimed
    assert receiver.requests() == []
    webhook.workers.start("w1")
    states = await webhook.until([key], {Status.CONFIRMED}, "CONFIRMED after restart")
    assert states[key].attempt == 1
    assert receiver.accepted(key) == 1
    assert posts(receiver, key) == 1
    await webhook.matches()


@RECORD_MODE
async def test_row2_worker_killed_mid_fan_out_its_successor_fans_out_again(
    webhook: Stack[WebhookDriver], read_topic: ReadTopic
) -> None:
    receiver = webhook.driver.receiver
    none: tuple[Fault | None, ...] = (None, None, None)
    keys = await webhook.publish("run-fan", none)
    await webhook.killed(MID_FAN_OUT)  # after the run's first request was written
    webhook.workers.start("w1")
    await webhook.until(keys, {Status.CONFIRMED}, "CONFIRMED after the fan-out's successor")
    for key in keys:
        assert receiver.accepted(key) == 1
        assert posts(receiver, key) == 1
    # The first request is in the log twice, byte for byte: fanned out again, not anew.
    raw = await read_topic(webhook.settings.kafka.topic_deliveries, raw=True)
    requests = [m.value for m in raw if isinstance(decode(m.value), DeliveryRequested)]
    assert len(requests) == 4
    assert len(set(requests)) == 3
    await webhook.matches()
    store = open_store(webhook.projection.dsn)
    try:
        store.prepare("read")
        tables = store.dump()
    finally:
        store.close()
    assert tables["duplicate_keys"] == []
    requested = DELIVERIES.column_names.index("requests")
    assert [row[requested] for row in tables["deliveries"]] == [1, 1, 1]  # each requested once


async def test_row6_duplicate_worker_claim_during_rebalance_sends_once(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    specs = [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"r{i}"), payload={"i": i})
        for i in range(12)
    ]
    receiver.fault("delay", count=12, delay_s=1.0)  # every send in flight for a second
    w1 = webhook.workers.start("w1")
    keys = await publish(webhook.settings, "run-6", specs)
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 1, 60)
    w2 = webhook.workers.start("w2")  # joins the group: a rebalance while sends are in flight
    states = await settled_once(webhook.view, receiver, webhook.projection, keys, [w1, w2])
    assert all(s.fencing_token == 1 for s in states.values())


async def test_row6_worker_killed_mid_send_other_worker_settles_it(
    webhook: Stack[WebhookDriver],
) -> None:
    receiver = webhook.driver.receiver
    w2 = webhook.workers.start("w2")
    w1 = webhook.workers.start("w1")
    specs = [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url(f"k{i}"), payload={"i": i})
        for i in range(8)
    ]
    receiver.fault("delay", count=8, delay_s=1.0)
    keys = await publish(webhook.settings, "run-6b", specs)
    assert await asyncio.to_thread(receiver.wait_for, lambda: len(receiver.requests()) >= 2, 60)
    os.kill(w1.process.pid, signal.SIGKILL)
    await settled_once(webhook.view, receiver, webhook.projection, keys, [w2])
