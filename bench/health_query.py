"""Endpoint health's query speed (``projections/health.py``) at 10k and 100k deliveries.

Fills a fresh SQLite projection with synthetic rows (199 origins, 8 in 10 confirmed after
4 s, 1 failed, 1 pending of which half wait ``circuit_open``; one attempt per settled
delivery), then times ``endpoint_health`` over it, in the same run at both sizes (the
smaller is the baseline: the query should grow no worse than the rows).

    .venv/bin/python -m bench.health_query [--rounds 3]

Target: under 2 s at 100k deliveries on SQLite (what a dashboard refresh can afford).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from projections.backends import open_store
from projections.health import HealthReport, endpoint_health
from projections.schema import DELIVERIES, DELIVERY_ATTEMPTS, timestamp

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
ORIGINS = 199
SIZES = (10_000, 100_000)
TARGET_S = 2.0


def filled_projection(path: Path, deliveries: int) -> str:
    """A SQLite projection of ``deliveries`` synthetic rows over 199 origins; its DSN."""
    dsn = f"sqlite://{path}"
    store = open_store(dsn)
    store.prepare("project")
    store.close()
    stamp = timestamp(T0)
    late = timestamp(T0 + timedelta(seconds=4))
    d_rows, a_rows = [], []
    statuses = ("CONFIRMED",) * 8 + ("FAILED", "PENDING")
    for i in range(deliveries):
        status = statuses[i % len(statuses)]
        d = dict.fromkeys(DELIVERIES.column_names, 0) | {
            "idempotency_key": f"k{i:08d}",
            "run_id": f"r{i // 10}",
            "event_type": "run.succeeded",
            "channel": "webhook",
            "recipient": f"https://h{i % ORIGINS}.test/hooks/{i % 7}",
            "payload_hash": "h",
            "slo_deadline": stamp,
            "status": status,
            "confirmed_at": late if status == "CONFIRMED" else None,
            "created_at": stamp,
            "updated_at": stamp,
            "state": "{}",
            "waiting": "circuit_open" if status == "PENDING" and i % 20 == 9 else None,
            "provider_message_id": None,
            "last_error_class": None,
            "reconciliation": None,
            "next_attempt_at": None,
            "failed_at": None,
            "settled_by": None,
            "waiting_since": None,
        }
        d_rows.append(tuple(d[c] for c in DELIVERIES.column_names))
        if status != "PENDING":
            outcome = "CONFIRMED" if status == "CONFIRMED" else "FAILED"
            a = dict.fromkeys(DELIVERY_ATTEMPTS.column_names) | {
                "idempotency_key": d["idempotency_key"],
                "attempt": 1,
                "run_id": d["run_id"],
                "channel": "webhook",
                "outcome": outcome,
                "finished_at": late,
                "created_at": stamp,
                "updated_at": stamp,
            }
            a_rows.append(tuple(a[c] for c in DELIVERY_ATTEMPTS.column_names))
    with sqlite3.connect(path) as db:
        for table, rows in (("deliveries", d_rows), ("delivery_attempts", a_rows)):
            marks = ", ".join("?" * len(rows[0]))
            db.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    return dsn


def timed_health(dsn: str, now: datetime) -> tuple[float, HealthReport]:
    """One ``endpoint_health`` call over the projection: its seconds and its report."""
    store = open_store(dsn)
    store.prepare("read")
    try:
        started = time.perf_counter()
        report = endpoint_health(store, now)
        return time.perf_counter() - started, report
    finally:
        store.close()


def measure(sizes: tuple[int, ...] = SIZES, rounds: int = 3) -> dict[str, Any]:
    """Seconds per ``endpoint_health`` call, ``rounds`` calls at each size (run_all's
    section): ``{"sizes": [...], "seconds": {size: [...]}}``."""
    now = T0 + timedelta(minutes=30)
    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
        for size in sizes:
            dsn = filled_projection(Path(tmp) / f"p{size}.sqlite3", size)
            seconds[str(size)] = [timed_health(dsn, now)[0] for _ in range(max(1, min(rounds, 20)))]
    return {"sizes": list(sizes), "seconds": seconds}


def rows(results: dict[str, Any], row: Callable[..., None]) -> None:
    """bench/run_all.py's row: the largest size against the smallest, same run."""
    small, large = (str(n) for n in (results["sizes"][0], results["sizes"][-1]))
    big, base = (statistics.median(results["seconds"][n]) for n in (large, small))
    row(
        f"endpoint health query (SQLite), s at {int(large):,} vs {int(small):,} deliveries",
        f"{big:.3f}",
        f"{base:.3f}",
        f"{big / base:.1f}x" if base else "n/a",
        f"< {TARGET_S:g} s",
        big < TARGET_S,
    )


def note(results: dict[str, Any]) -> str:
    """The details line."""
    each = "; ".join(
        f"{int(n):,}: " + ", ".join(f"{t:.3f}" for t in times)
        for n, times in results["seconds"].items()
    )
    return f"Endpoint health (projections/health.py) on synthetic SQLite projections: {each} s."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per size")
    args = parser.parse_args(argv)
    results = measure(SIZES, args.rounds)
    for size, times in results["seconds"].items():
        print(
            f"{int(size):>7,} deliveries: endpoint_health median {statistics.median(times):.3f} s"
            f" (min {min(times):.3f}, max {max(times):.3f}; target < {TARGET_S:g} s at 100k)"
        )


if __name__ == "__main__":
    main()
