"""Per-endpoint pacing of sends: a rate limit kept by arrivals, not only by claims.

**Why.** The gate (streams/rate_gate.py) spaces a worker's *claims* of a limited endpoint
at its share of the limit. A claim still travels through the log, is read back and waits
for a send slot before its request leaves, and that trip is uneven: claims spaced exactly
can arrive bunched (a slow answer holding the slots, a log read that returns several
claims at once). So the sender paces too, right before it hands a claimed delivery to its
channel.

**The rule.** Each worker keeps, per limited endpoint, a second token bucket sized like
the gate's (``sized``: its share ``L x owned / total`` of the limit L, updated on every
rebalance together with the gate's, and the same burst), filled ``1 + PACE_MARGIN`` times
slower. A send takes a token at the moment it is handed to its channel; with no token it
waits for the next one, and one endpoint's sends leave a worker in the order they came to
the pacer (one waits at a time). With the default burst (one token) a worker's hand-offs to
an endpoint are at least ``(1 + PACE_MARGIN) / share`` seconds apart, measured from the
moment each actually left (so a late wake-up never shortens the next gap), and in any
window of T seconds it hands over at most ``ceil(share x T)``, as long as the hand-off ->
receiver trip varies by less than ``PACE_MARGIN x T`` (100 ms for 1 s windows). Summed over
the workers: ``L x T`` when every share x T is whole (4 workers on 8 partitions, 20/s: 5
each), else at most one more per worker with a fractional share. A burst above one token
adds its tokens, as at the claim.

**Where.** Inside the send slot, after the request is admitted (a refused payload takes no
token), before the channel builds and writes the request: the pacer is the last wait the
sender controls, so nothing after it can bunch sends again (pacing before the slot would
let sends queued behind a slow one out together). The write guard
(streams/channels/write_guard.py) is still checked right before the first byte, after the
pacer: a send that waited is judged on its lease when it leaves. And a send whose token
comes only after its lease would let it start (``write_by``: the lease's end less the
channel's deadline and the clock-skew margin) does not wait and takes no token: the sender
records it not sent (``lease``), to be claimed again.

The rule is pure (``PaceRule``: the clock is passed in); ``SendPacer`` is its edge: the
per-endpoint order and the sleeping, on the sender's clock (the broker's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from streams.metrics import WorkerMetrics
from streams.rate_gate import RATE_TICK_S, TokenBucket, sized
from streams.rate_limits import RateLimit, RateLimitSource

# Sends are paced this much slower than the share: the room a hand-off -> arrival trip's
# jitter has, as a fraction of the window (0.1: 100 ms in any 1 s window).
PACE_MARGIN = 0.1


@dataclass(frozen=True)
class Turn:
    """A send to a limited endpoint: go now (its token taken), or wait until ``at``; or
    ``late``: its token would come only after ``write_by``, so it does not wait (nothing
    taken)."""

    endpoint: str
    at: datetime
    go: bool
    late: bool = False
    detail: str = ""


@dataclass
class _Paced:
    limit: RateLimit
    bucket: TokenBucket
    fraction: float  # the share the bucket is sized for


class PaceRule:
    """Each limited endpoint's send bucket in this worker: when the next send may go."""

    def __init__(
        self,
        limits: RateLimitSource,
        *,
        margin: float = PACE_MARGIN,
        tick_s: float = RATE_TICK_S,
    ) -> None:
        self._limits = limits
        self._margin = margin
        self._tick_s = tick_s
        self._fraction = 1.0
        self._endpoints: dict[str, _Paced] = {}

    def share(self, owned: int, total: int) -> None:
        """This worker holds ``owned`` of ``total`` partitions (as ``RateGate.share``)."""
        self._fraction = owned / total if total > 0 else 0.0

    def endpoint_of(self, channel: str, recipient: str) -> str | None:
        """The limited endpoint ``recipient`` belongs to, or None without a limit."""
        limit = self._limits.limit_for(channel, recipient)
        return None if limit is None else limit.endpoint

    def turn(
        self, channel: str, recipient: str, now: datetime, write_by: datetime | None = None
    ) -> Turn | None:
        """None without a limit; else this send's turn at ``now``: go (a token taken), wait,
        or late (its token not before ``write_by``, the last moment its lease lets it start)."""
        limit = self._limits.limit_for(channel, recipient)
        if limit is None:
            return None
        paced = self._paced(limit, now)
        at = paced.bucket.due(now)
        if write_by is not None and at >= write_by:
            return Turn(
                limit.endpoint,
                at,
                go=False,
                late=True,
                detail=(
                    f"the rate limit {limit.per_s:g}/s of {limit.endpoint} (this worker's "
                    f"share {paced.bucket.rate:.3g}/s paced) lets it go only "
                    f"{(at - write_by).total_seconds():.1f}s after its lease lets a send start"
                ),
            )
        if at <= now and paced.bucket.take(now):
            return Turn(limit.endpoint, now, go=True)
        return Turn(limit.endpoint, at, go=False)

    def _paced(self, limit: RateLimit, now: datetime) -> _Paced:
        rate, capacity = sized(limit, self._fraction, self._tick_s)
        rate /= 1.0 + self._margin
        paced = self._endpoints.get(limit.endpoint)
        if paced is None:
            paced = _Paced(limit, TokenBucket(rate, capacity, now), self._fraction)
            self._endpoints[limit.endpoint] = paced
        elif paced.fraction != self._fraction or paced.limit != limit:
            paced.bucket.resize(rate, capacity, now)  # at its first use after a rebalance
            paced.fraction = self._fraction
            paced.limit = limit
        return paced


Sleep = Callable[[float], Awaitable[None]]


class SendPacer:
    """The rule at the sender's hand-off: one endpoint's sends wait in turn for their token."""

    def __init__(
        self,
        rule: PaceRule,
        clock: Callable[[], datetime],
        *,
        sleep: Sleep = asyncio.sleep,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._rule = rule
        self._clock = clock
        self._sleep = sleep
        self._metrics = metrics
        self._turns: dict[str, asyncio.Lock] = {}
        self.waiting = 0  # sends waiting in the pacer now

    def share(self, owned: int, total: int) -> None:
        """This worker's share of every limit, from now on (called on every rebalance)."""
        self._rule.share(owned, total)

    async def wait(self, channel: str, recipient: str, write_by: datetime | None) -> str | None:
        """Return when the send may be handed to its channel (None), or at once with the
        reason it may not: its turn comes after ``write_by``. Cancellable while it waits."""
        endpoint = self._rule.endpoint_of(channel, recipient)
        if endpoint is None:
            return None
        turns = self._turns.setdefault(endpoint, asyncio.Lock())
        self.waiting += 1
        waited = False
        try:
            async with turns:  # FIFO: one endpoint's sends go in the order they came
                while True:
                    now = self._clock()
                    turn = self._rule.turn(channel, recipient, now, write_by)
                    if turn is None or turn.go:
                        return None
                    if turn.late:
                        return turn.detail
                    if not waited and self._metrics is not None:
                        self._metrics.rate_paced_sends.inc()
                    waited = True
                    await self._sleep((turn.at - now).total_seconds())
        finally:
            self.waiting -= 1
