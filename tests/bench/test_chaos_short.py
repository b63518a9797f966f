"""The short chaos run, the CI version of ``bench.chaos``: a few minutes of SIGKILLs, pauses
past the lease, joins, leaves and a broker restart must leave nothing accepted twice, lost,
stuck, or disagreeing between the worker's fold and the projection."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.chaos import MUST_BE_ZERO, SHORT
from tests.fixtures.broker import TEST_BROKER_PORT

ROOT = Path(__file__).resolve().parents[2]
DELIVERIES = 150
ACTIONS = 5


@pytest.mark.timeout(300)
def test_short_chaos_run_loses_nothing_and_sends_nothing_twice(tmp_path: Path) -> None:
    summary_path = tmp_path / "chaos.json"
    log = tmp_path / "chaos.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "bench.chaos", "--json", str(summary_path)),
                # The --short preset's timing with half its deliveries: the suite is
                # CPU-bound, and 150 still see every kind of nemesis action.
                *("--deliveries", str(DELIVERIES), "--rate", str(SHORT["rate"])),
                *("--nemesis-interval", str(SHORT["nemesis_interval"])),
                *("--duration-limit", str(SHORT["duration_limit"])),
                # Five actions, one of each kind: a run that settles before them (the
                # workers got faster) goes on under the nemesis until it has made them.
                *("--min-actions", str(ACTIONS)),
                # A broker of its own within this xdist worker's ports (bench's default,
                # 29392, is any other session's to take).
                *("--broker-port", str(TEST_BROKER_PORT + 12)),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            process.wait(timeout=270)
        except subprocess.TimeoutExpired:
            # SIGINT unwinds the run, so its broker and workers are stopped too.
            process.send_signal(signal.SIGINT)
            process.wait(timeout=25)
            pytest.fail(f"the short chaos run took over 270 s: see {log}")
    assert summary_path.exists(), log.read_text(errors="replace")[-3000:]
    summary = json.loads(summary_path.read_text())
    counts = {name: summary[name] for name in MUST_BE_ZERO}
    assert counts == dict.fromkeys(MUST_BE_ZERO, 0), (
        f"{counts}; stuck {summary['stuck_by_status']}, disagreements "
        f"{summary['disagreements_by_pair']}, examples {summary['examples']}"
    )
    assert summary["deliveries"] == DELIVERIES
    assert sum(summary["nemesis"].values()) >= ACTIONS, summary["nemesis"]
    assert process.returncode == 0
