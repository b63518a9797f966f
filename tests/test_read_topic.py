"""The ``read_topic`` fixture, which many tests poll while a process starts."""

from __future__ import annotations

from tests.fixtures.broker import ReadTopic, unique


async def test_a_topic_not_created_yet_reads_as_empty(read_topic: ReadTopic) -> None:
    # Seen in CI: a test polled the dead-letter topic before the projector had created it,
    # and the poll raised "No partitions are currently assigned" instead of waiting.
    assert await read_topic(unique("not-yet"), raw=True) == []
