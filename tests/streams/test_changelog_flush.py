"""The worker's producer flush: an offset is committed only after the table's writes left.

faust commits a consumer offset right after ``producer.flush()``; whatever that flush leaves
behind is lost if the worker stops next, while the offset says it was handled (the next
owner of the partition never sees the delivery again). See streams/transport.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from faust.transport.producer import ProducerBuffer

from config.settings import Settings
from streams.app import create_app

YIELDS = 1_000  # bounded: the buffer's task takes a message within a few loop turns


async def first_taken(buffer: ProducerBuffer, messages: int) -> None:
    """Wait until the buffer's task took the first message (and waits for metadata)."""
    for _ in range(YIELDS):
        if buffer.size < messages:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the buffer's task took nothing of {buffer.size} messages")


@pytest.mark.parametrize("messages", [1, 50])
async def test_flush_returns_when_the_message_being_handed_over_is_with_kafka(
    settings: Settings, topic_factory: Callable[[str, int], Awaitable[str]], messages: int
) -> None:
    """The first send to a topic waits for its metadata (a round trip to the broker): the
    message has left the buffer's queue but is not with aiokafka yet. With one message,
    faust-streaming's own flush returned here, and the offset commit after it ran ahead of
    the write; with fifty, the rest must follow it out."""
    app = create_app(settings, "flush").app
    producer = app.producer
    await producer.start()
    try:
        name = await topic_factory("flush", 1)  # created after the producer started: no metadata
        topic = app.topic(name, key_type=bytes, value_type=bytes, value_serializer="raw")
        futures = [topic.send_soon(key=b"k", value=b"%d" % i) for i in range(messages)]
        await first_taken(producer.buffer, messages)
        await producer.flush()
        await asyncio.sleep(0)  # the record's done-callbacks run on the next loop turn
        written = [f.result().offset for f in futures if f.done()]
        assert written == list(range(messages)), "flush returned before the writes were acked"
    finally:
        await producer.stop()
