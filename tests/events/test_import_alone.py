"""The vocabulary imports alone: no Kafka, HTTP or crypto library, measured in a fresh
process (a module another test imported would hide the load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "aiokafka",
    "kafka",
    "faust",
    "mode",
    "httpx",
    "aiohttp",
    "cryptography",
    "pydantic_settings",
    "rocksdict",
)
MEASURE = """
import importlib, sys
importlib.import_module(sys.argv[1])
loaded = sorted({name.split(".")[0] for name in sys.modules})
print(" ".join(loaded))
"""


@pytest.mark.parametrize("module", ["events", "events.keys", "events.contract"])
def test_the_vocabulary_loads_no_kafka_http_or_crypto_library(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.split())
    assert not loaded & set(FORBIDDEN), f"import {module} loaded {sorted(loaded & set(FORBIDDEN))}"
