"""Broker cold start: first run with the jar download, then with the cache complete.

The download round uses an empty jar cache AND an empty Maven local repository, so
everything really comes from Maven Central.

    .venv/bin/python -m bench.broker_start
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from config import Settings
from ledger.broker import LocalBroker


def one_start(root: Path, cache: Path) -> tuple[float, bool]:
    settings = Settings(
        kafka={"broker_port": 29392, "controller_port": 29393},
        data_dir=root / "data",
        cache_dir=cache,
    )
    broker = LocalBroker(settings)
    began = time.perf_counter()
    report = broker.start()
    seconds = time.perf_counter() - began
    broker.stop()
    shutil.rmtree(root / "data", ignore_errors=True)
    return seconds, report.downloaded


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    os.environ["MAVEN_OPTS"] = f"-Dmaven.repo.local={root / 'm2'}"
    try:
        cold, downloaded = one_start(root, root / "cache")
        assert downloaded
        warm = [one_start(root, root / "cache")[0] for _ in range(3)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| figure | seconds |")
    print("|---|---|")
    first = "broker start, first run (mvn download into empty caches + format + start)"
    print(f"| {first} | {cold:.1f} |")
    warm.sort()
    cached = "broker start, jars cached (fresh data dir: format + start), median of 3"
    print(f"| {cached} | {warm[1]:.1f} |")


if __name__ == "__main__":
    main()
