"""The peer benchmark (bench.peer) at a tiny size, against its own real broker: it must
produce sane figures, and the receiver must have seen every run's webhook exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.broker import TEST_BROKER_PORT

ROOT = Path(__file__).resolve().parents[2]
RUNS, LOAD = 40, 300


@pytest.mark.timeout(210)
def test_tiny_peer_run_sees_every_delivery_once_and_measures_it(tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    log = tmp_path / "peer.log"
    args = ["--runs", str(RUNS), "--publishers", "4", "--rounds", "1"]
    args += ["--paced-seconds", "2", "--load-requests", str(LOAD), "--json", str(out)]
    # Its own broker on this test process's ports (+2, +3 are free in its block of 20), not
    # bench.peer's fixed 29592, which another run on the machine may hold.
    args += ["--broker-port", str(TEST_BROKER_PORT + 2)]
    # The rounds at 25% and 90% of the peak are the paced round again at other rates.
    args += ["--no-fractions"]
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.peer", *args],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            process.wait(timeout=170)
        except subprocess.TimeoutExpired:
            # SIGINT unwinds the run, so its broker, workers and receiver are stopped too.
            process.send_signal(signal.SIGINT)
            process.wait(timeout=25)
            pytest.fail(f"the tiny peer run took over 170 s: see {log}")
    assert process.returncode == 0, log.read_text(errors="replace")[-3000:]
    results = json.loads(out.read_text())
    assert results["receiver_rejected"] == 0
    for alone in results["receiver_alone"]:
        assert alone["answered"] == LOAD
        assert alone["not_ok"] == 0
        assert alone["requests_per_s"] > 0
    for kind in ("worker", "bare"):
        system = results[kind]
        # Every measured run's webhook arrived (the run waits for each key) exactly once.
        assert system["keys"] == system["exactly_once"] > 0, (kind, system)
        assert system["twice"] == 0
        for phase in ("peak", "paced"):
            for figures in system[phase]:
                assert figures["accepted_per_s"] > 0
                assert figures["delivered_per_s"] > 0
                assert 0 < figures["p50_ms"] <= figures["p99_ms"]
                cpu = figures["cpu_ms_per_delivery"]
                assert cpu["workers"] > 0
                assert cpu["broker"] > 0
        assert all(mb > 20 for mb in system["hwm_mb"])
