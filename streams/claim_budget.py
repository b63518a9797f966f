"""How many claims a worker may have open at once: what its sends get through in one lease,
and no more than it needs to keep them busy.

A claim read back after its lease has run out can only be refused at the write guard, so
admitting more claims than the sends can get through within one lease only makes work
that expires. And every open claim is a claim a crash turns into an UNKNOWN (a lease to
wait out, a settle window, lookups), so a worker should hold only what keeps its sends
busy. Two bounds, the lower wins:

* by latency: assuming each send slot does one send after another, twice the moving
  average of a send's time, within the usable part of the lease (at most ``MAX_ROUNDS``
  per slot);
* by throughput: the sends this worker completed per second lately, times ``HOLD_S``
  (never more than half the usable lease). Under load a worker's sends are limited by its
  CPU, not by its slots: 64 slots x 16 rounds admitted a thousand claims to a worker that
  sent 40 a second, 25 s of queue, every one of them an UNKNOWN when it was SIGKILLed.

Never below one round (``concurrency``), so an idle worker starts at once and ramps up as
its sends complete.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

MAX_ROUNDS = 16  # at most 16 claims per send slot
SMOOTHING = 0.1  # weight of each new send in the moving average
SAFETY = 2.0  # plan for sends twice as slow as the average
HOLD_S = 2.0  # hold what the sends get through in this long: enough to keep them busy
RATE_WINDOW_S = 2.0  # the send rate is measured over this long
MAX_REMEMBERED = 100_000  # completions remembered for the rate (bounded memory)


class ClaimBudget:
    """The open-claim limit: fixed when configured, else derived from observed sends."""

    def __init__(
        self,
        *,
        concurrency: int,
        lease_s: float,
        deadline_s: float,
        margin_s: float,
        fixed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._concurrency = concurrency
        self._usable_s = max(lease_s - deadline_s - margin_s, 0.0)
        self._fixed = fixed
        self._clock = clock
        self._done: deque[float] = deque(maxlen=MAX_REMEMBERED)
        self.send_s = deadline_s  # the moving average starts at the worst case

    def observe(self, seconds: float) -> None:
        """One send took ``seconds`` from its first byte to its answer."""
        self.send_s += SMOOTHING * (max(seconds, 0.0) - self.send_s)
        self._done.append(self._clock())

    def rate(self) -> float:
        """Sends completed per second over the last ``RATE_WINDOW_S``."""
        since = self._clock() - RATE_WINDOW_S
        while self._done and self._done[0] < since:
            self._done.popleft()
        return len(self._done) / RATE_WINDOW_S

    def limit(self) -> int:
        """How many claims may be open (proposed and not read back, or being sent) now."""
        if self._fixed:
            return self._fixed
        rounds = int(self._usable_s / max(SAFETY * self.send_s, 1e-3))
        by_latency = self._concurrency * min(max(rounds, 1), MAX_ROUNDS)
        horizon = min(HOLD_S, self._usable_s / SAFETY)
        by_rate = math.ceil(self.rate() * horizon)
        return max(self._concurrency, min(by_latency, by_rate))
