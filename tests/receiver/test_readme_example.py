"""The README's receiver example, run as written, receiving from real ``ledger worker``s.

One worker SIGKILLs itself right after the receiver answered (``worker.after_response``):
the delivery is UNKNOWN to the ledger, and the next worker settles it CONFIRMED by the
kit's lookup (``reconciled``), with the id the example's handler returned.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clients import DeliverySpec
from config.settings import WebhookEndpoint, changed
from events.delivery_state import Status
from events.ports import free_port
from tests.fixtures.secrets import TEST_WEBHOOK_SECRET
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.readme import ROOT, readme_block
from tests.receiver.support import signed_lookup
from tests.streams.matrix import publish, until


class ExampleReceiver:
    """The example as a process of its own, on a port outside the ephemeral range."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.db = tmp / "receiver.sqlite3"
        script = tmp / "example_receiver.py"
        script.write_text(readme_block("receiver-example"))
        env = os.environ | {
            "PORT": str(self.port),
            "WEBHOOK_SECRETS": TEST_WEBHOOK_SECRET,
            "RECEIVER_DB": str(self.db),
            "PYTHONPATH": str(ROOT),  # as `pip install -e .[receiver]` of this tree
        }
        self.log = tmp / "example_receiver.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(script)], env=env, cwd=tmp, stdout=out, stderr=out
            )
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(150):
            try:
                httpx.get(f"{self.base}/hooks/lookup/probe", timeout=1)
                return
            except httpx.TransportError:
                assert self.process.poll() is None, self.log.read_text()
                time.sleep(0.1)
        raise AssertionError(f"the README example did not listen: {self.log.read_text()}")

    def records(self) -> list[tuple[str, str, str | None]]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute("SELECT key, status, result_id FROM receiver_keys").fetchall()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def example_receiver(tmp_path: Path) -> Iterator[ExampleReceiver]:
    started = ExampleReceiver(tmp_path)
    yield started
    started.stop()


async def test_a_worker_delivers_to_the_readme_example_and_settles_unknown_by_lookup(
    worker_factory: WorkerFactory, example_receiver: ExampleReceiver, ledger_view: LedgerView
) -> None:
    base = example_receiver.base
    worker_factory.settings = changed(
        worker_factory.settings,
        {
            "channels.webhook_endpoints": {
                f"{base}/hooks/": WebhookEndpoint(lookup_url=f"{base}/hooks/lookup")
            }
        },
    )
    settings = worker_factory.settings
    crashing = worker_factory.start("w1", faults=("worker.after_response",))
    keys = await publish(
        settings,
        "run-kit",
        [DeliverySpec(channel="webhook", recipient=f"{base}/hooks/tickets", payload={"run": 7})],
    )
    await asyncio.to_thread(crashing.process.wait, 60)
    assert crashing.process.returncode == -9, crashing.output()[-2000:]
    assert example_receiver.records() == [(keys[0], "done", "ticket-7")]
    survivor = worker_factory.start("w2")
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [survivor], "CONFIRMED by lookup")
    state = states[keys[0]]
    assert state.reconciled is not None, state  # settled by the lookup, not by a resend
    assert state.provider_message_id == "ticket-7"
    async with httpx.AsyncClient() as client:
        lookup = f"{base}/hooks/lookup/{keys[0]}"
        unsigned = await client.get(lookup)
        found = await client.get(lookup, headers=signed_lookup(keys[0], TEST_WEBHOOK_SECRET))
    assert unsigned.status_code == 401  # only the worker (who holds the secret) looks up
    assert found.json() == {"status": "done", "id": "ticket-7", "webhook_id": keys[0]}
    assert example_receiver.records() == [(keys[0], "done", "ticket-7")]
