"""``ledger demo --once`` end to end, twice: its receiver-kit webhook apps and its provider
process nothing twice, no second send reaches the kit, and the demo stops every process it
started."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from events.settings import Settings
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


def test_demo_once_twice(settings: Settings) -> None:
    env = settings_env(settings)
    marker = str(settings.data_dir)
    for attempt in (1, 2):
        done = subprocess.run(
            [sys.executable, "-m", "ledger", "demo", "--once", "--runs", "8"],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = done.stdout
        assert "reused" in out  # the test broker was already running
        assert re.search(r"deliveries\s*│\s*48\b", out), out  # 8 runs x 6 deliveries
        for channel in ("email_api", "provider", "slack", "smtp", "webhook"):  # at its receiver
            assert re.search(rf"│ {channel}\s*│(\s*\d+\s*│){{5}}\s*0\s*│", out), out
        assert re.search(r"accepted twice\s*│\s*0\b", out), out
        assert "receiver-kit apps" in out
        assert re.search(r"kit absorbed\s*│\s*0\b", out), out
        assert re.search(r"PENDING\s*│\s*0\b", out), out
        assert re.search(r"dashboard\s*│\s*http://127\.0\.0\.1:\d+/", out), out
        assert "SIGKILL demo-w1" in out
        assert processes_with(marker) == [], f"run {attempt} left processes behind"
