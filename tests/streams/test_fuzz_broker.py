"""Fuzzing through the broker: hostile records on both topics, interleaved with valid
traffic, read by a real worker and a real live projector.

Hypothesis draws a corpus of hostile records (random bytes, truncated and deeply nested
JSON, wrong shapes, future schema versions, mutated fields, unicode edge cases, oversized
values, record keys that are not the event's, events on the other topic) and of valid
runs whose payloads hold unicode edge cases. All of it goes onto the topics in one
interleaved stream. Then: every hostile record has exactly one dead letter, from the
reader that owns its topic (the worker for ``ledger.deliveries``, the projector for
``ledger.runs``), with its original bytes; nothing crashed; every valid delivery was
received exactly once, payload intact, by a receiver that does not dedupe, and is
CONFIRMED in the projection; ``ledger verify`` finds rebuilt == live.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from clients import DeliverySpec, Publisher
from events import DeadLetter, EventDecodeError, decode, encode
from events.delivery import DeliveryEvent, new_delivery_requested
from events.execution import RunSucceeded
from events.model import ExecutionEvent
from ledger.simulator.background import BackgroundSimulator
from tests.events.test_codec_fuzz import hostile
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, wait_for

EXAMPLES = 60
UNICODE = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]),  # no lone surrogates: not UTF-8
    max_size=12,
)


@dataclass(frozen=True)
class Hostile:
    """One record to write as is: which topic, its key and value, and its kind."""

    runs: bool
    key: bytes | None
    value: bytes
    kind: str


@dataclass(frozen=True)
class Valid:
    """One run to publish through the SDK, with the payloads of its deliveries."""

    payloads: tuple[dict[str, Any], ...]


def _refused(record: Hostile) -> bool:
    """Hostile by construction, or bytes the decoder refuses (a drawn value can still be
    a valid event: those are left out)."""
    if record.kind != "decoder input":
        return True
    try:
        decode(record.value)
    except EventDecodeError:
        return True
    return False


@st.composite
def hostile_record(draw: Any, receiver_url: str) -> Hostile:
    runs = draw(st.booleans())
    kind = draw(st.sampled_from(["decoder input"] * 3 + ["key not the event's", "other topic"]))
    if kind == "decoder input":
        value = draw(hostile())
        key = draw(st.none() | st.binary(max_size=8))
        return Hostile(runs, key, value, kind)
    # A well-formed, deliverable event, written where the rules refuse it.
    request = new_delivery_requested(
        run_id=f"fuzz-{uuid.uuid4().hex[:8]}",
        event_type="run.succeeded",
        channel="webhook",
        recipient=f"{receiver_url}/hooks/fuzz",
        payload={"text": draw(UNICODE)},
        slo_seconds=60,
        producer="fuzz",
    )
    run = RunSucceeded(run_id=request.run_id, result_hash="h", producer="fuzz")
    if kind == "key not the event's":
        event: DeliveryEvent | ExecutionEvent = run if runs else request
        return Hostile(runs, b"not-" + uuid.uuid4().hex.encode(), encode(event), kind)
    other = request if runs else run
    return Hostile(runs, None, encode(other), kind)


def corpus(receiver_url: str) -> list[Hostile | Valid]:
    """Draw the interleaved stream with hypothesis (no I/O while drawing)."""
    drawn: list[Hostile | Valid] = []
    records = st.lists(hostile_record(receiver_url).filter(_refused), min_size=1, max_size=5)
    payloads = st.lists(st.dictionaries(UNICODE, UNICODE, max_size=3), min_size=1, max_size=2)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(records, payloads)
    def draw(bad: list[Hostile], good: list[dict[str, Any]]) -> None:
        drawn.extend(bad)
        drawn.append(Valid(tuple(good)))

    draw()
    return drawn


async def test_hostile_records_on_both_topics_are_dead_lettered_and_valid_ones_delivered(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> None:
    receiver: BackgroundSimulator = receiver_factory(dedupe=False)
    settings_ = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings_
    live_projection.settings = settings_
    stream = corpus(receiver.base_url)
    hostile_records = [r for r in stream if isinstance(r, Hostile)]
    kinds = Counter(
        (("runs" if r.runs else "deliveries"), r.kind)
        for r in hostile_records
        if isinstance(r, Hostile)
    )
    # The corpus reaches every kind on both topics (else the test guards nothing there).
    for topic in ("runs", "deliveries"):
        for kind in ("decoder input", "key not the event's", "other topic"):
            assert kinds[(topic, kind)] > 0, kinds

    worker = worker_factory.start("w1")
    live_projection.start()
    producer = AIOKafkaProducer(
        bootstrap_servers=settings_.kafka.bootstrap_servers, max_request_size=4 * 1024 * 1024
    )
    positions: dict[tuple[str, int, int], Hostile] = {}
    expected: dict[str, JsonValue] = {}
    too_large = 0
    await producer.start()
    try:
        async with Publisher(settings_) as publisher:
            for index, item in enumerate(stream):
                if isinstance(item, Hostile):
                    topic = (
                        settings_.kafka.topic_runs
                        if item.runs
                        else settings_.kafka.topic_deliveries
                    )
                    try:
                        sent = await producer.send_and_wait(topic, item.value, key=item.key)
                    except MessageSizeTooLargeError:
                        too_large += 1  # over the broker's own limit: never in the log
                        continue
                    positions[(topic, sent.partition, sent.offset)] = item
                    continue
                specs = [
                    DeliverySpec(
                        channel="webhook",
                        recipient=f"{receiver.base_url}/hooks/valid-{index}-{n}",
                        payload=payload,
                    )
                    for n, payload in enumerate(item.payloads)
                ]
                for request in await publisher.run_succeeded(f"valid-{index}", "h", specs):
                    expected[request.idempotency_key] = request.payload
    finally:
        await producer.stop()

    async def letters() -> dict[tuple[str, int, int], list[DeadLetter]]:
        found: dict[tuple[str, int, int], list[DeadLetter]] = {}
        for message in await read_topic(settings_.kafka.topic_deadletter, raw=True):
            letter = DeadLetter.model_validate_json(message.value)
            where = (letter.original_topic, letter.original_partition, letter.original_offset)
            found.setdefault(where, []).append(letter)
        return found

    async def settled() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        assert live_projection.process is not None
        assert live_projection.process.poll() is None, live_projection.log.read_text()[-3000:]
        done = all(receiver.accepted(key) == 1 for key in expected)
        return done and set(positions) <= set(await letters())

    await wait_for(settled, 150, "every hostile record dead-lettered, every valid one received")

    found = await letters()
    repeated = 0
    for where, item in positions.items():
        # At least one dead letter per hostile record (at-least-once: a reader that stops
        # between sending it and committing past the record sends it again), all alike.
        here = found[where]
        letter = here[0]
        repeated += len(here) - 1
        assert {(d.reason, d.original_value()) for d in here} == {(letter.reason, item.value)}
        assert (letter.detected_by == "projector") is item.runs, letter.detected_by
        assert letter.reason
        assert "\n" not in letter.reason
    assert set(found) == set(positions)  # nothing valid was dead-lettered
    for key, payload in expected.items():
        assert len(receiver.requests(key=key)) == 1  # one POST per logical event
        event = receiver.event(key)
        assert event is not None
        assert event.payload == payload
    # Nothing the rules refuse reached the receiver (the well-formed ones were deliverable).
    assert receiver.requests(path="/hooks/fuzz") == []

    async def projected() -> bool:
        statuses = await asyncio.to_thread(live_projection.statuses)
        return all(statuses.get(key, ("",))[0] == "CONFIRMED" for key in expected)

    await wait_for(projected, 60, "every valid delivery CONFIRMED in the projection")
    await live_projection.verify()
    print(  # the counts for the note (pytest -s)
        f"fuzz: {len(hostile_records)} hostile records "
        f"({', '.join(f'{t}/{k}: {n}' for (t, k), n in sorted(kinds.items()))}), "
        f"{too_large} refused by the broker as too large, "
        f"{len(found)} dead-lettered ({repeated} letters repeated), "
        f"{len(expected)} valid deliveries received once, "
        "crashes 0"
    )
