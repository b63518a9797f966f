"""The kit installs and imports on its own: no faust, no Kafka client, no ledger code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"faust", "aiokafka", "mode", "events", "streams", "ledger",
                                  "projections", "kafka", "rocksdict"}:
            raise ImportError(f"the receiver kit imported {name}")
sys.meta_path.insert(0, Block())
import receiver, receiver.asgi, receiver.aiohttp_adapter, receiver.postgres
print("ok")
"""


def test_the_kit_imports_without_faust_kafka_or_the_ledger() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
