"""A property test that tries to stop a partition (issue 23, item 3).

Hypothesis builds events of every type with extreme values in their fields
(tests/streams/hostile.py) and writes them, raw, interleaved with valid deliveries
published through the SDK, to a real broker. One real worker and one live projector read
them all. Each example requires: both processes still running; every valid delivery
arrives exactly once at a receiver that does NOT dedupe; no hostile delivery arrives twice;
every record the decoder refuses is dead-lettered exactly once, by the reader that owns its
topic (the worker for ``ledger.deliveries``, the projector for ``ledger.runs``); no reader
dead-letters a record twice; and ``ledger verify`` says identical. Each example also
writes a run record of the record mode whose second entry has extreme fields: if the
record decodes, its first entry's delivery arrives exactly once and the second's at most
once, while the worker fans out (and dead-letters what it refuses) and keeps running.

Run with ``--hypothesis-show-statistics`` to see the event types and field kinds reached.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections import Counter

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events import DeadLetter
from events.codec import EventDecodeError, decode
from events.model import ALL_EVENT_TYPES
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, WorkerProcess, wait_for
from tests.streams.hostile import KINDS, HostileRecord, hostile_records

EXAMPLES = 5
TAGS = itertools.count()


class Harness:
    """One worker, one live projector and a receiver, shared by every example."""

    def __init__(
        self,
        worker_factory: WorkerFactory,
        receiver: BackgroundSimulator,
        live_projection: LiveProjection,
        read_topic: ReadTopic,
    ) -> None:
        self.settings: Settings = receiver.settings(worker_factory.settings)
        worker_factory.settings = self.settings
        live_projection.settings = self.settings
        self.receiver = receiver
        self.projection = live_projection
        self.read_topic = read_topic
        self.worker: WorkerProcess = worker_factory.start("w1")
        live_projection.start()
        self.valid: list[str] = []
        self.hostile_keys: set[str] = set()
        self.written: dict[tuple[str, int, int], HostileRecord] = {}
        self.reached: Counter[str] = Counter()

    def alive(self) -> None:
        assert self.worker.alive(), self.worker.output()[-3000:]
        process = self.projection.process
        assert process is not None
        assert process.poll() is None, self.projection.log.read_text()

    async def write(self, records: list[HostileRecord]) -> None:
        """The hostile records, raw, each between valid deliveries published by the SDK."""
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka.bootstrap_servers,
            max_request_size=2 * 1024 * 1024,
        )
        await producer.start()
        try:
            for record in records:
                topic = (
                    self.settings.kafka.topic_runs
                    if record.topic == "runs"
                    else self.settings.kafka.topic_deliveries
                )
                meta = await producer.send_and_wait(topic, record.value, key=record.key)
                self.written[(topic, meta.partition, meta.offset)] = record
                if record.topic == "deliveries":
                    self.hostile_keys.add(record.key.decode("utf-8", "replace"))
                if record.fanned and _decodes(record.value):
                    # A run record's valid entry is fanned out and arrives once; its
                    # hostile entry is refused (one dead letter) or arrives at most once.
                    self.valid.append(record.fanned[0])
                    self.hostile_keys.update(record.fanned[1:])
        finally:
            await producer.stop()
        async with Publisher(self.settings) as publisher:
            for n in range(2):
                run_id = f"valid-{len(self.valid)}-{n}"
                url = self.receiver.webhook_url(run_id)
                requests = await publisher.run_succeeded(
                    run_id, "h", [DeliverySpec(channel="webhook", recipient=url, payload={})]
                )
                self.valid.append(requests[0].idempotency_key)

    def refused_by_decoder(self) -> dict[tuple[str, int, int], str]:
        """Every written record the decoder refuses, with the reader that must dead-letter it."""
        refused = {}
        for where, record in self.written.items():
            try:
                decoded = decode(record.value)
            except EventDecodeError:
                refused[where] = (
                    "runs" if where[0] == self.settings.kafka.topic_runs else "deliveries"
                )
                continue
            key = getattr(decoded, "idempotency_key", None) or decoded.run_id
            if record.key != key.encode():
                refused[where] = (
                    "runs" if where[0] == self.settings.kafka.topic_runs else "deliveries"
                )
        return refused

    async def letters(self) -> list[DeadLetter]:
        raw = await self.read_topic(self.settings.kafka.topic_deadletter, raw=True)
        return [DeadLetter.model_validate_json(m.value) for m in raw]

    async def settle(self) -> None:
        """Wait until every valid delivery arrived and every refused record is dead-lettered."""
        refused = self.refused_by_decoder()

        async def done() -> bool:
            self.alive()
            letters = {
                (d.original_topic, d.original_partition, d.original_offset)
                for d in await self.letters()
            }
            arrived = all(self.receiver.accepted(k) >= 1 for k in self.valid)
            return arrived and set(refused) <= letters

        await wait_for(done, 120, "valid deliveries to arrive and refused records dead-lettered")
        await asyncio.sleep(2)  # anything that would go wrong late has a moment to show

    async def check(self) -> None:
        """The promise, after an example: nothing stopped, nothing twice, nothing lost."""
        self.alive()
        refused = self.refused_by_decoder()
        letters = await self.letters()
        # Dead letters are at least once: a rebalance before the worker's commit sends one
        # again (seen under load). A reader's letters for one record must say the same.
        by_reader: dict[tuple[bool, str, int, int], set[tuple[str, str | None]]] = {}
        for d in letters:
            reader = (d.detected_by == "projector", d.original_topic, d.original_partition)
            by_reader.setdefault((*reader, d.original_offset), set()).add(
                (d.reason, d.original_value_b64)
            )
        differing = [w for w, said in by_reader.items() if len(said) > 1]
        assert differing == [], "a reader dead-lettered one record twice, differently"
        mine = {
            (d.original_topic, d.original_partition, d.original_offset): d
            for d in letters
            if (d.detected_by == "projector")
            == (d.original_topic == self.settings.kafka.topic_runs)
        }
        for where in refused:
            assert where in mine, f"refused record {where} has no dead letter from its reader"
            letter = mine[where]
            assert letter.original_value_b64 == base64.b64encode(self.written[where].value).decode()
            assert "\n" not in letter.reason
        guarded = [d.reason for d in letters if " refused " in d.reason]
        for reason in guarded:
            event(f"record guard fired: {reason.split(': ', 1)[-1][:60]}")
        for key in self.valid:
            assert self.receiver.accepted(key) == 1, key
        for key in self.hostile_keys:
            assert self.receiver.accepted(key) <= 1, key
        await self.projection.verify()


def _decodes(value: bytes) -> bool:
    try:
        decode(value)
    except EventDecodeError:
        return False
    return True


@pytest.fixture
def harness(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> Harness:
    return Harness(worker_factory, receiver_factory(dedupe=False), live_projection, read_topic)


@pytest.mark.timeout(900)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_no_hostile_record_stops_a_partition(harness: Harness, data: st.DataObject) -> None:
    records = data.draw(
        hostile_records(str(next(TAGS)), harness.receiver.webhook_url("hostile").rstrip("/"))
    )
    for record in records:
        if record.field:
            event(f"event type: {record.event_type}")
            event(f"field kind: {record.kind}")
            harness.reached[record.event_type] += 1
            harness.reached[record.kind] += 1

    async def example() -> None:
        await harness.write(records)
        await harness.settle()
        await harness.check()

    asyncio.run(example())
    # Every event type and every field kind is reached by every example.
    assert set(ALL_EVENT_TYPES) | {*KINDS.values(), "text"} <= set(harness.reached)
