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

from events.settings import Settings
from projections.backends import open_store
from projections.projector import rebuild
from projections.store import Dump, Offsets
from tests.fixtures.postgres import DsnFactory
from tests.projections.scenarios import fleet, publish


def ledger_env(settings: Settings, faults: list[str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "LEDGER_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "LEDGER_TOPIC_RUNS": settings.topic_runs,
            "LEDGER_TOPIC_DELIVERIES": settings.topic_deliveries,
            "LEDGER_TOPIC_DEADLETTER": settings.topic_deadletter,
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


def snapshot(dsn: str) -> tuple[Offsets, Dump]:
    store = open_store(dsn)
    try:
        store.prepare("read")
        return store.load_offsets(), store.dump()
    finally:
        store.close()


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
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
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
