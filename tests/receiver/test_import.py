"""The kit installs and imports on its own: the vocabulary (``events``, for the receiver
contract) and nothing else of the ledger; no faust, no Kafka client, no HTTP client, no
crypto library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = """
import importlib.abc, sys
FORBIDDEN = {"faust", "aiokafka", "mode", "kafka", "rocksdict", "httpx", "cryptography",
             "pydantic_settings", "streams", "ledger", "projections", "clients", "config"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"the receiver kit imported {name}")
sys.meta_path.insert(0, Block())
import receiver, receiver.asgi, receiver.aiohttp_adapter, receiver.postgres
loaded = {name.split(".")[0] for name in sys.modules}
assert "events" in loaded, "the kit takes its contract from events"
assert not loaded & FORBIDDEN, sorted(loaded & FORBIDDEN)
print("ok")
"""


def test_the_kit_imports_the_vocabulary_but_no_faust_kafka_http_client_or_crypto() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
