"""A kit handler SIGKILLed mid-``processing`` is reclaimed by the declared rule, across a
restart of the receiver process: an idempotent handler runs once more (one completed run
in all); any other is never run again and its key answers lookups ``stuck``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.receiver.dying_receiver import DyingReceiver
from tests.receiver.support import SECRET_A, signed_headers, signed_lookup

LEASE_S = 2.0  # short, so a dead run's lease runs out within the test


@pytest.fixture
def receivers(tmp_path: Path) -> Iterator[list[DyingReceiver]]:
    made: list[DyingReceiver] = []
    yield made
    for each in made:
        each.stop()


def _post(base: str, key: str, payload: dict[str, float], token: int) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = signed_headers(key, body, SECRET_A, fencing_token=token)
    return httpx.post(f"{base}/hooks/orders", content=body, headers=headers, timeout=30)


def _lookup(base: str, key: str) -> httpx.Response:
    return httpx.get(f"{base}/hooks/lookup/{key}", headers=signed_lookup(key, SECRET_A), timeout=5)


async def _killed_mid_handler(receiver: DyingReceiver, key: str) -> None:
    """POST ``key`` with a handler that sleeps, SIGKILL the receiver inside it, restart."""
    receiver.start()
    first = asyncio.create_task(asyncio.to_thread(_post, receiver.base, key, {"sleep_s": 60}, 1))
    await asyncio.to_thread(receiver.wait_for, f"start {key}")
    receiver.kill()
    with pytest.raises(httpx.TransportError):
        await first  # the connection died with the process: no answer
    receiver.start()
    with sqlite3.connect(receiver.db) as conn:
        [(expires_at,)] = conn.execute(
            "SELECT lease_expires_at FROM receiver_keys WHERE key = ?", (key,)
        ).fetchall()
    conn.close()
    live = _lookup(receiver.base, key)
    if time.time() < expires_at:  # answered before the lease ran out (a slow restart: after)
        # While the dead run's lease lasts, nobody can tell it from a live one.
        assert (live.status_code, live.json()["status"]) == (202, "processing")


def _after_the_lease(receiver: DyingReceiver, key: str, status: str) -> httpx.Response:
    deadline = time.monotonic() + 10 * LEASE_S
    while True:
        answer = _lookup(receiver.base, key)
        if answer.json().get("status") != "processing" or time.monotonic() > deadline:
            assert answer.json()["status"] == status, answer.text
            return answer
        time.sleep(0.2)


async def test_a_killed_idempotent_handler_runs_once_more_and_completes_once(
    tmp_path: Path, receivers: list[DyingReceiver]
) -> None:
    receiver = DyingReceiver(tmp_path, SECRET_A, lease_s=LEASE_S, idempotent=True)
    receivers.append(receiver)
    await _killed_mid_handler(receiver, "order-1")
    # The lease ran out with no renewal: a retry is safe (the handler is idempotent).
    failed = _after_the_lease(receiver, "order-1", "failed")
    assert failed.status_code == 404
    redelivered = await asyncio.gather(
        *(asyncio.to_thread(_post, receiver.base, "order-1", {"sleep_s": 0.5}, 2) for _ in range(3))
    )
    # Three redeliveries at once: one re-run, the others wait for it (or are told to).
    assert 200 in {r.status_code for r in redelivered}
    waited = [r.json() for r in redelivered if r.status_code != 200]
    assert all(w["status"] == "processing" for w in waited), waited  # told to come back
    assert {r.json()["id"] for r in redelivered if r.status_code == 200} == {"made-order-1"}
    done = _lookup(receiver.base, "order-1")
    assert (done.status_code, done.json()) == (
        200,
        {"status": "done", "id": "made-order-1", "webhook_id": "order-1"},
    )
    again = _post(receiver.base, "order-1", {"sleep_s": 0}, 3)
    assert (again.status_code, again.json()["duplicate"]) == (200, True)
    stale = _post(receiver.base, "order-1", {"sleep_s": 0}, 1)  # the dead run's token
    assert stale.status_code == 409
    assert receiver.lines() == ["start order-1", "start order-1", "done order-1"]


async def test_a_killed_handler_not_declared_idempotent_is_stuck_and_never_runs_again(
    tmp_path: Path, receivers: list[DyingReceiver]
) -> None:
    receiver = DyingReceiver(tmp_path, SECRET_A, lease_s=LEASE_S, idempotent=False)
    receivers.append(receiver)
    await _killed_mid_handler(receiver, "order-2")
    stuck = _after_the_lease(receiver, "order-2", "stuck")
    assert (stuck.status_code, stuck.json()) == (
        409,
        {"status": "stuck", "webhook_id": "order-2"},
    )
    redelivered = _post(receiver.base, "order-2", {"sleep_s": 0}, 2)
    assert redelivered.status_code == 409  # not a success, and nothing ran
    assert redelivered.json()["status"] == "stuck"
    receiver.stop()
    receiver.start()  # a restart does not unstick it either
    assert _lookup(receiver.base, "order-2").json()["status"] == "stuck"
    assert _post(receiver.base, "order-2", {"sleep_s": 0}, 3).status_code == 409
    assert receiver.lines() == ["start order-2"]
