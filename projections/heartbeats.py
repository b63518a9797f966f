"""The workers' clocks, as their heartbeats last said (streams/heartbeat.py).

``ledger status`` and the dashboard read the heartbeats topic (compacted, one latest
record per worker, timestamped by the broker) to show which workers act and which wait
for their clock. A heartbeat older than ``max_age_s`` by the broker's clock belongs to a
worker that stopped: it is not shown. A record that is not a heartbeat is skipped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from clients.committed_log import CommittedLog
from config.parts import KafkaSettings

MAX_RECORDS = 100_000  # a compacted topic of heartbeats: one per worker, bounded anyway
MAX_AGE_S = 60.0  # a heartbeat older than this (by the broker's clock): its worker stopped


@dataclass(frozen=True)
class WorkerClock:
    """One worker's last heartbeat."""

    worker_id: str
    clock_offset_s: float
    clock_skew: bool
    acting: bool
    why_not: str | None
    seen_at: str  # the broker's time of the heartbeat, ISO 8601

    def to_json(self) -> dict[str, Any]:
        """As JSON."""
        return asdict(self)


async def worker_clocks(
    settings: KafkaSettings, now: datetime, max_age_s: float = MAX_AGE_S, timeout_s: float = 10.0
) -> list[WorkerClock]:
    """Every worker that sent a heartbeat within ``max_age_s`` of ``now``, by id."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    async with CommittedLog(settings) as log:
        partitions = await log.partitions(settings.topic_heartbeats, missing_ok=True)
        if not partitions:
            return []
        ends = await log.ends(partitions)
        starts = await log.beginnings(partitions)
        log.assign(partitions, starts)
        remaining = {tp for tp in partitions if ends[tp] > starts[tp]}
        deadline = time.monotonic() + timeout_s
        read = 0
        while remaining and time.monotonic() < deadline and read < MAX_RECORDS:
            for tp, messages in (await log.read(timeout_ms=500, max_records=5000)).items():
                for message in messages:
                    read += 1
                    if message.offset < ends[tp] and message.key is not None:
                        latest[message.key] = (message.timestamp, message.value or b"")
            for tp in list(remaining):
                if await log.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    found = []
    for timestamp_ms, value in latest.values():
        seen = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
        if (now - seen).total_seconds() > max_age_s:
            continue
        clock = _parse(value, seen)
        if clock is not None:
            found.append(clock)
    return sorted(found, key=lambda c: c.worker_id)


def _parse(value: bytes, seen: datetime) -> WorkerClock | None:
    try:
        data = json.loads(value)
        return WorkerClock(
            worker_id=str(data["worker_id"])[:200],
            clock_offset_s=float(data["clock_offset_s"]),
            clock_skew=bool(data["clock_skew"]),
            acting=bool(data["acting"]),
            why_not=None if data.get("why_not") is None else str(data["why_not"])[:500],
            seen_at=seen.isoformat(),
        )
    except (ValueError, KeyError, TypeError):
        return None


def clock_exposition(clocks: list[WorkerClock], *, read: bool = True) -> bytes:
    """The workers' clocks in Prometheus' text format (beside the projection's numbers);
    ``read`` False: the heartbeats could not be read, so no count of workers is given (an
    absent count is not a zero one: no alert that every worker stopped)."""
    skew = GaugeMetricFamily(
        "ledger_worker_clock_skew",
        "1 while a worker does not act: its clock is off the broker's by more than "
        "LEDGER_WORKER__CLOCK_SKEW_LIMIT_S, or not measured.",
        labels=["worker"],
    )
    offset = GaugeMetricFamily(
        "ledger_worker_clock_offset_seconds",
        "The broker's clock minus a worker's, as its heartbeats measure it.",
        labels=["worker"],
    )
    for clock in clocks:
        skew.add_metric([clock.worker_id], float(not clock.acting))
        offset.add_metric([clock.worker_id], clock.clock_offset_s)
    families: list[Metric] = [skew, offset]
    if read:
        # Worker ids are new per process, so a worker that stopped leaves no series to go
        # stale: the count of heartbeats within the age limit is what says one is missing.
        alive = GaugeMetricFamily(
            "ledger_workers_heartbeating",
            f"Workers whose last heartbeat is at most {MAX_AGE_S:g} s old by the broker's clock "
            "(absent while the heartbeats topic cannot be read).",
        )
        alive.add_metric([], len(clocks))
        families.append(alive)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families
