"""``ledger demo --once`` end to end, twice (the second time smaller, on what the first left:
the demo must run again from its own leftovers, and CI time is dear): its receiver-kit
webhook apps and its provider process nothing twice, no second send reaches the kit, its
browser deliveries (Chromium against the fake form, under the browser's own deadline) all
end and none is accepted twice, and the demo stops every process it started."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import Settings
from ledger.stack import settings_env


def processes_with(marker: str) -> list[int]:
    """Pids whose environment mentions ``marker`` (our data dir): what the demo started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# (runs, deliveries, browser forms): 6 deliveries a run, and a browser form every sixth run
# (run 0 of 6; run 0 of 2).
ROUNDS = ((6, 37, 1), (2, 13, 1))


# Two demos, each bounded by its own 400 s below; a loaded machine took 179 s for both.
@pytest.mark.timeout(500)
def test_demo_once_twice(settings: Settings) -> None:
    env = settings_env(settings)
    marker = str(settings.data_dir)
    for attempt, (runs, deliveries, forms) in enumerate(ROUNDS, start=1):
        done = subprocess.run(
            [sys.executable, "-m", "ledger", "demo", "--once", "--runs", str(runs)],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = done.stdout
        assert "reused" in out  # the test broker was already running
        assert re.search(rf"deliveries\s*│\s*{deliveries}\b", out), out
        # Each channel counted at its own receiver: none accepted twice (the last column).
        for channel in ("browser", "email_api", "provider", "slack", "smtp", "webhook"):
            assert re.search(rf"│ {channel}\s*│(\s*\d+\s*│){{5}}\s*0\s*│", out), out
        # Every browser delivery reached a final state (CONFIRMED or FAILED), and the fake
        # form, which does not dedupe, accepted none twice.
        browser = re.search(r"│ browser\s*│" + r"\s*(\d+)\s*│" * 6, out)
        assert browser is not None, out
        confirmed, failed, unknown, sent, pending, twice = map(int, browser.groups())
        assert (confirmed + failed, unknown, sent, pending, twice) == (forms, 0, 0, 0, 0), out
        assert re.search(r"accepted twice\s*│\s*0\b", out), out
        assert "receiver-kit apps" in out
        assert re.search(r"kit absorbed\s*│\s*0\b", out), out
        assert re.search(r"PENDING\s*│\s*0\b", out), out
        assert re.search(r"dashboard\s*│\s*http://127\.0\.0\.1:\d+/", out), out
        assert "SIGKILL demo-w1" in out
        assert processes_with(marker) == [], f"run {attempt} left processes behind"
