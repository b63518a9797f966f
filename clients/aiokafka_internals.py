"""Every aiokafka private attribute this project touches, behind one named function each.

aiokafka has no public way to ask for a topic's metadata from a consumer, to send an admin
request it has no method for (CreateAcls), to ask a producer whether its transaction
failed for good, or to change a consumer's fetch options after it was built (faust builds
the worker's consumer). An aiokafka upgrade that renames one of these fails here and in
tests/clients/test_aiokafka_internals.py, not somewhere in the worker;
tests/test_private_access.py keeps every other module off aiokafka's private names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient


async def refresh_metadata(consumer: AIOKafkaConsumer, topics: Iterable[str] = ()) -> None:
    """Fetch the cluster's metadata now, for ``topics`` too (a consumer asks only for the
    topics it subscribed to, so ``partitions_for_topic`` knows no other)."""
    wanted = set(topics)
    if wanted:
        consumer._client.set_topics(wanted)
    await consumer._client.force_metadata_update()


async def send_admin_request(admin: AIOKafkaAdminClient, request: Any) -> Any:
    """Send a request the admin client has no method for to any broker; its response."""
    client = admin._client
    return await client.send(client.get_random_node(), request)


def transaction_failed_fatally(producer: AIOKafkaProducer) -> bool:
    """True when the producer's transaction state is fatal (fenced, for one): no later
    transaction of this producer can succeed, as aiokafka's own transaction context checks."""
    manager = producer._txn_manager
    return manager is not None and bool(manager.is_fatal_error())


def set_fetch_options(
    consumer: AIOKafkaConsumer,
    *,
    isolation_level: str,
    fetch_min_bytes: int | None = None,
    fetch_max_wait_ms: int | None = None,
) -> None:
    """Change the fetch options of a consumer that has not started (its fetcher takes them
    in ``start()``)."""
    consumer._isolation_level = isolation_level
    if fetch_min_bytes is not None:
        consumer._fetch_min_bytes = fetch_min_bytes
    if fetch_max_wait_ms is not None:
        consumer._fetch_max_wait_ms = fetch_max_wait_ms


def fetch_options(consumer: AIOKafkaConsumer) -> tuple[str, int, int]:
    """The isolation level, fetch_min_bytes and fetch_max_wait_ms a consumer will fetch with."""
    return (consumer._isolation_level, consumer._fetch_min_bytes, consumer._fetch_max_wait_ms)


def delivery_guarantees(producer: AIOKafkaProducer) -> tuple[bool, int]:
    """(idempotent, acks) of a built producer, as it will send: acks -1 is all in-sync
    replicas (aiokafka keeps neither as a public attribute)."""
    return producer._txn_manager is not None, int(producer._sender._acks)
