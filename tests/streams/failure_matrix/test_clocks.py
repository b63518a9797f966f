"""Failure-matrix rows for clocks (issue 24, item 1): one clock for every worker.

Workers run under libfaketime (Debian's ``faketime``) with wall clocks far apart; the
receiver does NOT dedupe. A worker decides on the broker's clock as its heartbeats
measure it (streams/broker_clock.py), so a time one worker wrote means the same to the
next; a worker further off than LEDGER_WORKER__CLOCK_SKEW_LIMIT_S does not act at all.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from events.delivery_state import Status
from events.outcomes import LookupOutcome
from ledger.stack import settings_env
from tests.fixtures.worker import wait_for
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import PLAIN_ONLY, Stack
from tests.streams.failure_matrix.test_windows import hooks, owning
from tests.streams.matrix import publish, settled_once, until

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
pytestmark = pytest.mark.skipif(
    not LIBFAKETIME.exists(), reason="needs Debian's faketime (scripts/test installs it)"
)


def skewed(seconds: int) -> dict[str, str]:
    """A process environment whose wall clock is ``seconds`` off (monotonic time is not)."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


@PLAIN_ONLY
@pytest.mark.timeout(240)
async def test_two_workers_forty_seconds_apart_accept_nothing_twice(
    webhook: Stack[WebhookDriver],
) -> None:
    """Worker A (20 s behind) sends; the receiver reads each request at once but records
    its key only 12 s later, after A gave up (UNKNOWN). Then B (20 s ahead) joins and A
    leaves: B owns the UNKNOWNs and looks them up. On its own clock the 15 s settle window
    A started had passed 25 s ago, so it looked up at once, found nothing twice and sent
    again while the first request was still being processed: accepted twice."""
    receiver = webhook.driver.receiver
    settings = webhook.configure({"worker.lookup_settle_s": 15.0, "worker.lease_s": 6.0})
    keys = await publish(settings, "run-clocks", hooks(receiver, 12, "c"))
    for key in keys:
        receiver.fault("delay", key=key, delay_s=12.0, accept_first=False)
    behind = webhook.workers.start("behind", env=skewed(-20))
    await until(webhook.view, keys, {Status.UNKNOWN}, [behind], "all UNKNOWN after A's attempt")
    ahead = webhook.workers.start("ahead", env=skewed(+20))
    await owning(ahead)
    await asyncio.to_thread(behind.stop)
    states = await settled_once(webhook.view, receiver, webhook.projection, keys, [ahead])
    for key in keys:
        # One POST (settled_once), A's, found by B's lookup after the settle window. (Not
        # ``attempt == 1``: on a loaded machine A's lease rule may refuse its first send,
        # nothing written, and A sends attempt 2; seen once with the suite at load 8.)
        state = states[key]
        assert state.claim_worker is not None
        assert state.claim_worker.startswith("behind@")
        assert state.reconciled is LookupOutcome.FOUND, "found by B's lookup after the window"
    assert "not acting" not in ahead.output()


@PLAIN_ONLY
@pytest.mark.timeout(240)
async def test_a_worker_a_minute_ahead_does_not_act_and_says_so(
    webhook: Stack[WebhookDriver],
) -> None:
    """60 s ahead is past the 30 s limit: the worker claims and sends nothing, and says
    why in its log, in ``ledger status`` and in its metrics; when a worker with a good
    clock takes its partitions, every delivery arrives exactly once."""
    receiver = webhook.driver.receiver
    keys = await publish(webhook.settings, "run-ahead", hooks(receiver, 6, "a"))
    ahead = webhook.workers.start("ahead", env=skewed(+60))
    await owning(ahead)

    async def says_so() -> bool:
        return (
            re.search(r"not acting: its clock is (59|60)\.\d+s ahead of", ahead.output())
            is not None
        )

    await wait_for(says_so, 30, "the worker saying it does not act")
    await asyncio.sleep(4)  # longer than the claim grace: nothing may move meanwhile
    assert receiver.requests(method="POST") == []
    states = await webhook.view()
    assert all(states[k].status is Status.PENDING for k in keys)
    status = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ledger", "status", "--json", "--dsn", webhook.projection.dsn],
        env=settings_env(webhook.settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    [worker] = [w for w in report["workers"] if w["worker_id"].startswith("ahead@")]
    assert report["clock_skew"] == [worker["worker_id"]]
    assert worker["acting"] is False
    assert 59 < -worker["clock_offset_s"] < 61
    good = webhook.workers.start("good")
    await owning(good)
    await asyncio.to_thread(ahead.stop)
    await settled_once(webhook.view, receiver, webhook.projection, keys, [good])
