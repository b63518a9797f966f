"""The publisher's record mode against a real broker, one worker and a live projection for
the module: a publisher SIGKILLed at random points leaves each run whole or absent, the
projection of a run is the same in both modes, a run record's bad entry is dead-lettered
while the rest go out, and a run too large for one record is refused before anything is
written. Every arrival is counted at a receiver that does NOT dedupe.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher, PublishRejected
from config.settings import Settings, changed
from events import DeadLetter
from events.codec import decode, encode
from events.execution import RunSucceeded
from events.keys import idempotency_key
from ledger.simulator import SimulatorConfig
from ledger.simulator.background import BackgroundSimulator
from ledger.stack import settings_env
from projections import open_store
from projections.schema import AGENT_RUNS, DELIVERIES
from tests.fixtures.broker import ReadTopic, fresh_topics
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import signing_secret
from tests.fixtures.worker import WorkerFactory, WorkerProcess, fast_workers, wait_for

pytestmark = pytest.mark.xdist_group("run_records")

DELIVERIES_PER_RUN = 2
# Publishes run after run in the record mode, saying which it began and which were acked.
PUBLISH_UNTIL_KILLED = """
import asyncio, sys
from clients import DeliverySpec, Publisher
from config import Settings

async def main(prefix: str, hook: str) -> None:
    async with Publisher(Settings(), producer_name="killed-agent") as publisher:
        print("ready", flush=True)
        for n in range(40):
            run_id = f"{prefix}-{n}"
            print("begun", run_id, flush=True)
            specs = [DeliverySpec(channel="webhook", recipient=f"{hook}{run_id}-{i}",
                                  payload={"i": i}) for i in range(int(sys.argv[3]))]
            await publisher.run_succeeded(run_id, "h", specs)
            print("acked", run_id, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@dataclass
class RecordStack:
    settings: Settings
    receiver: BackgroundSimulator
    worker: WorkerProcess
    projection: LiveProjection
    tmp: Path

    def alive(self) -> None:
        assert self.worker.alive(), self.worker.output()[-3000:]

    def hook(self) -> str:
        return f"{self.receiver.base_url}/hooks/"

    def keys(self, run_id: str, n: int = DELIVERIES_PER_RUN) -> list[str]:
        return [
            idempotency_key(run_id, "run.succeeded", "webhook", f"{self.hook()}{run_id}-{i}")
            for i in range(n)
        ]

    def specs(self, run_id: str, n: int = DELIVERIES_PER_RUN) -> list[DeliverySpec]:
        return [
            DeliverySpec(channel="webhook", recipient=f"{self.hook()}{run_id}-{i}", payload={})
            for i in range(n)
        ]

    async def arrived_once(self, keys: list[str], what: str) -> None:
        async def done() -> bool:
            self.alive()
            return all(self.receiver.accepted(key) >= 1 for key in keys)

        await wait_for(done, 90, what)
        twice = [key for key in keys if self.receiver.accepted(key) != 1]
        assert twice == [], f"arrived more than once: {twice}"

    def tables(self) -> dict[str, list[tuple[object, ...]]]:
        store = open_store(self.projection.dsn)
        try:
            store.prepare("read")
            return store.dump()
        finally:
            store.close()


@pytest.fixture(scope="module")
async def stack(
    broker: Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RecordStack]:
    tmp = tmp_path_factory.mktemp("run-records")
    receiver = BackgroundSimulator(
        SimulatorConfig(dedupe=False, webhook_secret=signing_secret())
    ).start()
    settings = receiver.settings(fast_workers(await fresh_topics(broker, tmp / "data")))
    settings = changed(settings, {"publisher.mode": "record"})
    workers = WorkerFactory(settings, tmp)
    projection = LiveProjection(settings, f"sqlite://{tmp / 'live.sqlite3'}", tmp / "project.log")
    projection.start()
    try:
        yield RecordStack(settings, receiver, workers.start("w1"), projection, tmp)
    finally:
        workers.stop_all()
        projection.stop()
        receiver.stop()


def publish_until_killed(stack: RecordStack, prefix: str, rng: random.Random) -> str:
    """A publisher process SIGKILLed a random moment after it began publishing; its output."""
    settings, hook = stack.settings, stack.hook()
    process = subprocess.Popen(
        [sys.executable, "-c", PUBLISH_UNTIL_KILLED, prefix, hook, str(DELIVERIES_PER_RUN)],
        env=settings_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).parents[2],
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # bounded: the process prints it or dies
    assert first == b"ready\n", first + process.stdout.read()
    try:
        process.wait(timeout=rng.uniform(0.0, 0.5))
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
    # The rest through the same buffered reader (communicate() would skip what it holds).
    out = first + process.stdout.read()
    process.wait(timeout=30)
    return out.decode(errors="replace")


async def test_a_publisher_killed_at_random_points_leaves_whole_runs_or_none(
    stack: RecordStack, read_topic: ReadTopic
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    begun: list[str] = []
    acked: set[str] = set()
    for round_ in range(3):
        out = await asyncio.to_thread(publish_until_killed, stack, f"killed{round_}", rng)
        begun += [line.split()[1] for line in out.splitlines() if line.startswith("begun ")]
        acked |= {line.split()[1] for line in out.splitlines() if line.startswith("acked ")}
    runs = [decode(m.value) for m in await read_topic(stack.settings.kafka.topic_runs, raw=True)]
    written = {run.run_id for run in runs if run.run_id.startswith("killed")}
    assert acked <= written, f"seed {seed}: acknowledged runs missing: {acked - written}"
    assert written <= set(begun)
    # Every written run whole: its deliveries each arrived exactly once.
    whole = [key for run_id in sorted(written) for key in stack.keys(run_id)]
    await stack.arrived_once(whole, f"seed {seed}: every delivery of {len(written)} runs")
    # A run that never reached the log sent nothing (the worker had time: all the others
    # arrived, and they were published after most of these).
    absent = set(begun) - written
    assert [k for r in absent for k in stack.keys(r) if stack.receiver.accepted(k)] == []
    # Each written as one record carrying its deliveries (the record mode).
    assert all(
        isinstance(r, RunSucceeded) and len(r.deliveries) == DELIVERIES_PER_RUN for r in runs
    )


async def test_a_run_projects_the_same_in_both_modes(
    stack: RecordStack, read_topic: ReadTopic
) -> None:
    modes = {"tx": "transaction", "rec": "record"}
    for run_id, mode in modes.items():
        async with Publisher(stack.settings, mode=mode, producer_name="agent") as publisher:  # type: ignore[arg-type]
            requests = await publisher.run_succeeded(run_id, "sha256:r", stack.specs(run_id))
        assert [r.idempotency_key for r in requests] == stack.keys(run_id)
    # The record mode wrote one record for the run; its requests are the ones it returned.
    [rec] = [
        m for m in await read_topic(stack.settings.kafka.topic_runs, raw=True) if m.key == b"rec"
    ]
    assert len(decode(rec.value).deliveries) == DELIVERIES_PER_RUN  # type: ignore[union-attr]
    await stack.arrived_once(stack.keys("tx") + stack.keys("rec"), "both runs' deliveries")
    # The requests on the topic are the ones the publisher returned, byte for byte.
    on_topic = [m.value for m in await read_topic(stack.settings.kafka.topic_deliveries, raw=True)]
    assert all(encode(r) in on_topic for r in requests)

    # The same rows, but for what names the run and the times.
    run_cols = [AGENT_RUNS.column_names.index(c) for c in ("status", "result_hash", "events")]
    delivery_cols = [
        DELIVERIES.column_names.index(c)
        for c in ("event_type", "channel", "payload_hash", "status", "attempts", "requests")
    ]

    async def projected() -> bool:
        tables = await asyncio.to_thread(stack.tables)
        runs = {row[0]: [row[i] for i in run_cols] for row in tables["agent_runs"]}
        deliveries: dict[object, list[list[object]]] = {}
        for row in tables["deliveries"]:
            deliveries.setdefault(row[1], []).append([row[i] for i in delivery_cols])
        shown = {r: (runs.get(r), sorted(deliveries.get(r, []))) for r in modes}
        return (
            shown["tx"] == shown["rec"]
            and shown["tx"][0] == ["SUCCEEDED", "sha256:r", 1]
            and [d[3] for d in shown["tx"][1]] == ["CONFIRMED"] * DELIVERIES_PER_RUN
        )

    await wait_for(projected, 60, "both runs projected alike")
    await stack.projection.verify()


async def test_a_bad_entry_is_dead_lettered_and_the_rest_go_out(
    stack: RecordStack, read_topic: ReadTopic
) -> None:
    good = stack.specs("hostile", 1)[0]
    entries = [good.model_dump(), {"channel": "webhook", "recipient": "ftp://x", "extra": 1}]
    entries[0].update(slo_seconds=60)
    run = RunSucceeded(run_id="hostile", result_hash="h", producer="x", deliveries=entries)
    producer = AIOKafkaProducer(bootstrap_servers=stack.settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            stack.settings.kafka.topic_runs, encode(run), key=b"hostile"
        )
    finally:
        await producer.stop()
    await stack.arrived_once(stack.keys("hostile", 1), "the good entry's delivery")

    async def letters() -> list[DeadLetter]:
        raw = await read_topic(stack.settings.kafka.topic_deadletter, raw=True)
        found = [DeadLetter.model_validate_json(m.value) for m in raw]
        return [d for d in found if d.original_offset == meta.offset and "runs" in d.original_topic]

    async def lettered() -> bool:
        return bool(await letters())

    await wait_for(lettered, 30, "the run record's dead letter")
    [letter] = {d.reason: d for d in await letters()}.values()  # at least once, one reason
    assert "delivery 2 of 2: entry has unknown fields: extra" in letter.reason
    assert letter.detected_by.startswith("w1@")
    stack.alive()


async def test_a_run_too_large_for_one_record_is_refused_unwritten(
    stack: RecordStack, read_topic: ReadTopic
) -> None:
    big = {"text": "x" * (200 * 1024)}
    specs = [
        DeliverySpec(channel="webhook", recipient=f"{stack.hook()}big-{i}", payload=big)
        for i in range(6)
    ]
    async with Publisher(stack.settings) as publisher:
        with pytest.raises(PublishRejected, match="over the limit of 1048576 bytes one record"):
            await publisher.run_succeeded("big", "h", specs)
    runs = await read_topic(stack.settings.kafka.topic_runs, raw=True)
    assert b"big" not in {m.key for m in runs}
