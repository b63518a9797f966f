"""The projector as a process: SIGKILLed mid-batch and restarted, it ends where one that
never died ends; Ctrl-C stops it cleanly between batches. Both backends."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

from clients import Publisher
from config.settings import Settings
from events import DeadLetter
from projections.projector import rebuild
from projections.store import Offsets
from tests.fixtures.broker import ReadTopic
from tests.fixtures.fake_cli import interrupt as stop_with_ctrl_c
from tests.fixtures.postgres import DsnFactory
from tests.fixtures.worker import wait_for
from tests.projections.scenarios import fleet, publish, snapshot


def ledger_env(settings: Settings, faults: list[str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "LEDGER_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "LEDGER_KAFKA__TOPIC_RUNS": settings.kafka.topic_runs,
            "LEDGER_KAFKA__TOPIC_DELIVERIES": settings.kafka.topic_deliveries,
            "LEDGER_KAFKA__TOPIC_DEADLETTER": settings.kafka.topic_deadletter,
            "LEDGER_DATA_DIR": str(settings.data_dir),
            "LEDGER_FAULTS": json.dumps(faults or []),
        }
    )
    return env


def start_projector(
    settings: Settings, dsn: str, faults: list[str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ledger", "project", "--dsn", dsn, "--batch-size", "7"],
        env=ledger_env(settings, faults),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def wait_until_at(dsn: str, offsets: Offsets, process: subprocess.Popen[str]) -> None:
    """Poll (bounded) until the live projection has consumed exactly ``offsets``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if snapshot(dsn)[0] == offsets:
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"projector never reached {offsets}; at {snapshot(dsn)[0]}")


def interrupt(process: subprocess.Popen[str]) -> str:
    stdout = stop_with_ctrl_c(process, timeout_s=30)
    assert "stopped cleanly" in stdout
    return stdout


async def test_sigkill_mid_batch_then_restart_equals_a_projector_that_never_died(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    log = fleet(12)
    await publish(settings, log[:60])
    live, reference = dsn_factory(), dsn_factory()

    # 1. Project the first half, then stop with Ctrl-C.
    await rebuild(settings, reference)
    first_half = snapshot(reference)
    process = start_projector(settings, live)
    await wait_until_at(live, first_half[0], process)
    interrupt(process)
    assert snapshot(live) == first_half

    # 2. More events; a projector that dies after writing a batch's rows, before commit.
    await publish(settings, log[60:])
    process = start_projector(settings, live, faults=["projector.mid_batch"])
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, stderr
    assert "fault injection: SIGKILL at projector.mid_batch" in stderr
    # Nothing of the killed batch is visible: neither rows nor offsets moved.
    assert snapshot(live) == first_half

    # 3. Restart without the fault: it resumes from the stored offsets.
    full = dsn_factory()
    await rebuild(settings, full)
    never_died = snapshot(full)
    process = start_projector(settings, live)
    await wait_until_at(live, never_died[0], process)
    stdout = interrupt(process)
    assert f"{len(log) - 60} events applied" in stdout
    assert snapshot(live) == never_died
    assert len(never_died[1]["deliveries"]) == 24
    assert len(never_died[1]["delivery_attempts"]) == 36


async def test_bad_records_on_the_runs_topic_are_dead_lettered_by_the_live_projector(
    settings: Settings, tmp_path: Path, read_topic: ReadTopic
) -> None:
    """No worker reads ``ledger.runs``: the projector used to skip a bad record there with
    a warning, so nothing but its log said it existed. The live projector dead-letters
    each one (reason, bytes, position) and folds the good runs around them; ``rebuild``
    and ``verify`` re-read the log without sending them again."""
    bad = [
        (b"r-not-json", b"\x00not json"),
        (b"r-deep", b"[" * 5000 + b"]" * 5000),
        (b"r-shape", b'{"type": "run.succeeded", "schema_version": 1}'),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        positions = []
        for key, value in bad:
            sent = await producer.send_and_wait(
                settings.kafka.topic_runs, value, key=key, partition=0
            )
            positions.append((sent.partition, sent.offset))
    finally:
        await producer.stop()
    async with Publisher(settings) as publisher:
        await publisher.run_succeeded("run-after-bad", "h", [])
    dsn = f"sqlite://{tmp_path / 'live.sqlite3'}"
    process = start_projector(settings, dsn)
    try:

        async def dead_lettered() -> bool:
            assert process.poll() is None, process.communicate()
            return len(await read_topic(settings.kafka.topic_deadletter, raw=True)) >= 3

        await wait_for(dead_lettered, 60, "three dead letters from the projector")
        await wait_for(lambda: _has_run(dsn, "run-after-bad"), 60, "the good run in the projection")
    finally:
        interrupt(process)
    letters = [
        DeadLetter.model_validate_json(m.value)
        for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
    ]
    by_position = {(d.original_partition, d.original_offset): d for d in letters}
    assert sorted(by_position) == sorted(positions)
    assert all(d.original_topic == settings.kafka.topic_runs for d in letters)
    assert all(d.detected_by == "projector" for d in letters)
    reasons = [by_position[p].reason for p in positions]
    assert "not JSON" in reasons[0]
    assert "nests deeper than 64 levels" in reasons[1]
    assert "invalid event" in reasons[2]
    assert [by_position[p].original_value() for p in positions] == [v for _, v in bad]
    # A re-read of the log (rebuild, verify) does not dead-letter them again.
    await rebuild(settings, f"sqlite://{tmp_path / 'rebuilt.sqlite3'}")
    assert len(await read_topic(settings.kafka.topic_deadletter, raw=True)) == 3


async def _has_run(dsn: str, run_id: str) -> bool:
    try:
        runs = snapshot(dsn)[1]["agent_runs"]
    except Exception:  # the projector may not have created its tables yet
        return False
    return any(row[0] == run_id for row in runs)
