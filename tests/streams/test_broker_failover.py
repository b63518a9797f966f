"""A three-broker cluster loses nothing when a partition leader dies mid-send (issue 30,
item 3).

``ledger broker start --nodes 3``'s cluster, a real worker, a receiver that does not
dedupe, the live projection: while deliveries flow, the broker leading the most records
of the deliveries topic is SIGKILLed, restarted, and waited for until every replica is
back in sync; twice. Every delivery is accepted exactly once, every one reaches
CONFIRMED, and the live projection equals a rebuild (``ledger verify``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from clients import DeliverySpec
from config.settings import Settings
from events.delivery_state import Status
from ledger.broker.cluster import LocalCluster
from ledger.broker.replicas import busiest_leader, partitions, wait_in_sync
from tests.fixtures.cluster import clients_of
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.streams.matrix import posts, publish, until, use

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster")]

FAILOVERS = 2
MAX_RUNS = 400  # bounded however slow the machine is
DOWN_S = 2.0  # how long the killed broker stays down


@pytest.fixture(scope="module")
def broker(cluster: LocalCluster) -> Settings:
    """Every test of this module runs on the three-node cluster."""
    return clients_of(cluster)


async def test_a_leader_killed_twice_loses_and_doubles_nothing(
    cluster: LocalCluster,
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = use(worker_factory, receiver, live_projection)
    topic = settings.kafka.topic_deliveries
    await _replicated_three_ways(settings, topic)
    worker = worker_factory.start("w1")
    keys: list[str] = []
    retried = 0
    stop = asyncio.Event()

    async def flow() -> None:
        nonlocal retried
        for n in range(MAX_RUNS):
            if stop.is_set():
                return
            spec = DeliverySpec(
                channel="webhook", recipient=receiver.webhook_url(f"r{n}"), payload={"n": n}
            )
            # A publish the cluster could not take is retried as an agent would: the same
            # run, so the same key (the ledger folds a repeated request into one).
            for attempt in range(5):
                try:
                    published = await publish(settings, f"run-{n}", [spec])
                    break
                except Exception:
                    if attempt == 4:
                        raise
                    retried += 1
                    await asyncio.sleep(1.0)
            keys.extend(published)
            await asyncio.sleep(0.1)

    flowing = asyncio.create_task(flow())
    try:
        await _delivered_some(receiver, 10)
        failovers = []
        for _ in range(FAILOVERS):
            failovers.append(await _fail_over(cluster, settings, [topic]))
            assert worker.alive(), worker.output()[-3000:]
        await asyncio.sleep(2.0)  # some flow after the last restart
    finally:
        stop.set()
        await flowing
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "all CONFIRMED", receiver)
    for key in keys:
        assert receiver.accepted(key) == 1, (key, states[key])
        assert posts(receiver, key) == 1, (key, states[key])
    await live_projection.matches(states)
    print(
        f"{len(keys)} deliveries, publishes retried {retried}; failovers (killed node, "
        f"back in sync after s): {failovers}"
    )


async def _replicated_three_ways(settings: Settings, topic: str) -> None:
    """The ledger created its topic with 3 copies and min.insync.replicas 2."""
    views = await partitions(settings.kafka.bootstrap_servers, topic)
    assert views
    assert all(len(v.replicas) == 3 for v in views), views
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        described = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    configs = {entry[0]: entry[1] for entry in described[0].resources[0][4]}
    assert configs["min.insync.replicas"] == "2", configs


async def _delivered_some(receiver: object, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(receiver.requests(method="POST")) >= count:  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"fewer than {count} deliveries arrived in {timeout_s:.0f}s")


async def _fail_over(
    cluster: LocalCluster, settings: Settings, topics: list[str]
) -> tuple[int, float]:
    """SIGKILL the broker leading the busiest partitions, restart it after DOWN_S, wait
    until every replica is in sync again; (node, seconds until in sync)."""
    node = busiest_leader(await partitions(settings.kafka.bootstrap_servers, topics[0]))
    victim = cluster.broker(node)
    pid = victim.pid()
    assert pid is not None, f"node {node} is not running"
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(DOWN_S)
    began = time.monotonic()
    await asyncio.to_thread(victim.start)
    await wait_in_sync(settings.kafka.bootstrap_servers, topics)
    return node, round(time.monotonic() - began, 1)
