"""One test per aiokafka behaviour clients/aiokafka_internals.py relies on, on the real broker.

After an aiokafka upgrade the one that fails names what changed, before any client,
worker or CLI test does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import ProducerFenced
from aiokafka.protocol.metadata import MetadataRequest

from clients.aiokafka_internals import (
    fetch_options,
    refresh_metadata,
    send_admin_request,
    set_fetch_options,
    transaction_failed_fatally,
)
from config.settings import Settings

TopicFactory = Callable[[str, int], Awaitable[str]]


@pytest.fixture
async def consumer(settings: Settings) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer built (read_uncommitted, aiokafka's default), not started."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    yield consumer
    await consumer.stop()


async def test_a_metadata_refresh_finds_a_topic_nobody_subscribed_to(
    consumer: AIOKafkaConsumer, topic_factory: TopicFactory
) -> None:
    """``_client.force_metadata_update``: a consumer learns about a topic it never asked for."""
    await consumer.start()
    topic = await topic_factory("metadata", 3)
    assert consumer.partitions_for_topic(topic) is None
    for _ in range(50):  # a new topic reaches every broker's metadata in a moment
        await refresh_metadata(consumer)
        if consumer.partitions_for_topic(topic) is not None:
            break
        await asyncio.sleep(0.1)
    assert consumer.partitions_for_topic(topic) == {0, 1, 2}


async def test_the_fetch_options_set_before_start_are_the_fetchers(
    consumer: AIOKafkaConsumer, settings: Settings, topic_factory: TopicFactory
) -> None:
    """``_isolation_level`` (and the fetch wait beside it) set after the consumer was built
    are taken by its fetcher in ``start()``: an open transaction's record stays unseen."""
    topic = await topic_factory("isolation", 1)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        transactional_id=f"test-{uuid.uuid4().hex}",
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"open", key=b"k")
        set_fetch_options(
            consumer, isolation_level="read_committed", fetch_min_bytes=1, fetch_max_wait_ms=100
        )
        assert fetch_options(consumer) == ("read_committed", 1, 100)
        await consumer.start()
        part = TopicPartition(topic, 0)
        consumer.assign([part])
        assert not (await consumer.getmany(part, timeout_ms=1500)).get(part)
        await producer.commit_transaction()
        records = (await consumer.getmany(part, timeout_ms=5000)).get(part, [])
        assert [r.value for r in records] == [b"open"]
    finally:
        await producer.stop()


async def one_transaction(producer: AIOKafkaProducer, topic: str) -> None:
    """Write one record in a transaction of its own."""
    await producer.begin_transaction()
    await producer.send_and_wait(topic, b"v")
    await producer.commit_transaction()


async def test_a_fenced_producers_transaction_failed_fatally(
    settings: Settings, topic_factory: TopicFactory
) -> None:
    """``_txn_manager.is_fatal_error``: a producer fenced by a newer one with its
    transactional id can never commit again; the newer one can."""
    topic = await topic_factory("fenced", 1)
    txid = f"test-{uuid.uuid4().hex}"
    old = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, transactional_id=txid
    )
    new = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, transactional_id=txid
    )
    await old.start()
    try:
        assert not transaction_failed_fatally(old)
        await new.start()
        with pytest.raises(ProducerFenced):
            await one_transaction(old, topic)
        assert transaction_failed_fatally(old)
        assert not transaction_failed_fatally(new)
        idempotent = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        assert not transaction_failed_fatally(idempotent)  # no transactions at all
        await idempotent.stop()  # never started; closed, so no warning at collection
    finally:
        await old.stop()
        await new.stop()


async def test_an_admin_client_sends_a_request_it_has_no_method_for(settings: Settings) -> None:
    """``_client.send`` and ``get_random_node``: the response of any broker."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        response = await send_admin_request(admin, MetadataRequest([]))
    finally:
        await admin.close()
    assert response.brokers
