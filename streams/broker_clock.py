"""One clock for every worker: the broker's, as each worker measures it.

Leases, settle windows and lookup and retry schedules cross workers: one worker writes a
time into an event (a lease's end, an UNKNOWN's moment) and another compares it with its
own ``now`` after a rebalance. Wall clocks drift (a stopped NTP daemon, a VM resumed from
suspend), so no worker decides on its own wall clock. Each measures the offset of the
broker's clock from its own: it writes a small heartbeat record to a topic whose
timestamps the broker sets when it appends (``LogAppendTime``), and the broker's time
lies between the moment the record was handed to the producer and the moment the broker
acknowledged it. The intersection of recent samples bounds the offset; the worker's
``now`` is its wall clock corrected by it, so every worker's times are the broker's, give
or take a few milliseconds.

A worker whose clock is further off than ``limit_s``, or whose offset it cannot measure
(no sample for ``stale_s``), does not act: it claims nothing, sends nothing and runs no
timer until the clock is back (its partitions' work waits, visibly: ``clock_skew`` in
its heartbeat, ``ledger status``, the dashboard and /metrics).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

WINDOW_S = 60.0  # samples older than this no longer bound the offset
MAX_SAMPLES = 64


@dataclass(frozen=True)
class Sample:
    """One heartbeat: handed over at ``sent``, acknowledged at ``acked`` (both on this
    host's wall clock, seconds), appended by the broker at ``broker`` (its clock)."""

    sent: float
    acked: float
    broker: float

    @property
    def low(self) -> float:
        """The least the offset (broker - local) can be."""
        return self.broker - self.acked

    @property
    def high(self) -> float:
        """The most the offset can be."""
        return self.broker - self.sent


class BrokerClock:
    """This worker's estimate of the broker's clock, and whether it may act on it."""

    def __init__(self, limit_s: float, stale_s: float) -> None:
        self.limit_s = limit_s
        self.stale_s = stale_s
        self._samples: deque[Sample] = deque(maxlen=MAX_SAMPLES)
        self._low = float("-inf")
        self._high = float("inf")

    def observe(self, sample: Sample) -> None:
        """Add a heartbeat's sample. Samples that contradict the bounds (the wall clock
        jumped) start the bounds anew from the newest one."""
        if sample.acked < sample.sent:
            return  # the wall clock stepped back during the heartbeat: no bound at all
        self._samples.append(sample)
        horizon = sample.acked - WINDOW_S
        while self._samples and self._samples[0].acked < horizon:
            self._samples.popleft()
        low = max(s.low for s in self._samples)
        high = min(s.high for s in self._samples)
        if low > high:
            self._samples.clear()
            self._samples.append(sample)
            low, high = sample.low, sample.high
        self._low, self._high = low, high

    @property
    def measured(self) -> bool:
        """True when a sample newer than ``stale_s`` bounds the offset."""
        return bool(self._samples) and time.time() - self._samples[-1].acked <= self.stale_s

    @property
    def offset_s(self) -> float:
        """The broker's clock minus this host's, in seconds (0 before any sample)."""
        if not self._samples:
            return 0.0
        return (self._low + self._high) / 2

    @property
    def uncertainty_s(self) -> float:
        """How far the true offset may lie from ``offset_s``."""
        if not self._samples:
            return float("inf")
        return (self._high - self._low) / 2

    @property
    def skewed(self) -> bool:
        """True when this worker must not act: its clock is further off the broker's than
        the limit, or the offset is not measured."""
        return not self.measured or abs(self.offset_s) > self.limit_s

    def why_not(self) -> str | None:
        """Why this worker must not act now, in one line (None: it may)."""
        if not self._samples:
            return "its clock is not measured against the broker's yet"
        if not self.measured:
            return f"its clock has not been measured against the broker's for {self.stale_s:g}s"
        if abs(self.offset_s) > self.limit_s:
            ahead = "behind" if self.offset_s > 0 else "ahead of"
            return (
                f"its clock is {abs(self.offset_s):.1f}s {ahead} the broker's (limit "
                f"{self.limit_s:g}s: LEDGER_WORKER__CLOCK_SKEW_LIMIT_S)"
            )
        return None

    def now(self) -> datetime:
        """The broker's time now, as this worker best knows it."""
        return datetime.now(UTC) + timedelta(seconds=self.offset_s)
