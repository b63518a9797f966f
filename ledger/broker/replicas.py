"""A live cluster's view of a topic's partitions: who leads each, which replicas are in
sync, how far each has been written; the broker leading the most records; and a bounded
wait until every replica is back in sync (after a broker died and came back)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError


@dataclass(frozen=True)
class PartitionView:
    """One partition: its leader (-1: none), its in-sync replicas, its end offset."""

    partition: int
    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    end: int

    @property
    def in_sync(self) -> bool:
        return self.leader >= 0 and self.isr == self.replicas


async def partitions(bootstrap_servers: str, topic: str, **options: Any) -> list[PartitionView]:
    """The cluster's view of ``topic``'s partitions (``options``: the clients' security)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **options)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, **options)
    await admin.start()
    try:
        await consumer.start()
        try:
            described = (await admin.describe_topics([topic]))[0]["partitions"]
            ends = await consumer.end_offsets(
                [TopicPartition(topic, p["partition"]) for p in described]
            )
        finally:
            await consumer.stop()
    finally:
        await admin.close()
    return [
        PartitionView(
            p["partition"],
            p["leader"],
            tuple(sorted(p["isr"])),
            tuple(sorted(p["replicas"])),
            ends[TopicPartition(topic, p["partition"])],
        )
        for p in described
    ]


def busiest_leader(views: list[PartitionView]) -> int:
    """The broker leading the most records (the sum of its partitions' end offsets)."""
    load: dict[int, int] = {}
    for view in views:
        if view.leader >= 0:
            load[view.leader] = load.get(view.leader, 0) + view.end
    return max(load, key=lambda node: (load[node], -node))


async def wait_in_sync(
    bootstrap_servers: str, topics: list[str], timeout_s: float = 60.0, **options: Any
) -> float:
    """Wait until every partition of ``topics`` has a leader and all its replicas in sync;
    the seconds it took. A metadata request that fails mid-failover is asked again."""
    began = time.monotonic()
    views: list[PartitionView] = []
    for _ in range(int(timeout_s / 0.5) + 1):
        try:
            views = [
                v for topic in topics for v in await partitions(bootstrap_servers, topic, **options)
            ]
        except KafkaError:
            views = []
        if views and all(v.in_sync for v in views):
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            break
        await asyncio.sleep(0.5)
    raise TimeoutError(f"replicas of {', '.join(topics)} not in sync after {timeout_s:.0f} s")
