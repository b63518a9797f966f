"""Per-endpoint rate limits: a token bucket per endpoint, as a gate before the claim.

The gate bounds claims; the arrivals are bounded by the sender, which paces each worker's
sends to a limited endpoint with a bucket sized the same way (``sized``) right before the
request (streams/send_pacer.py). The gate keeps a flood of claims from sitting in the
send queue (and their leases from running out there).

**The rule.** An endpoint limited to L deliveries per second gets, in each worker, a token
bucket filled at that worker's share of L; a claim (the first, a retry's, a re-claim after
a lease) takes one token. A delivery that finds no token is held (``Hold`` with no reason:
it waits as an ordinary PENDING, nothing is written) until the time its token is due, and
deliveries of one endpoint are granted in request order: one is never granted while an
older one of the same endpoint waits in this worker.

**Several workers.** A worker's share is ``L x owned / total``: the partitions of
``ledger.deliveries`` it holds over all of them (``share``, called on every assignment and
revocation). Deliveries are spread over partitions by their idempotency key, so each worker
sees about its share of an endpoint's deliveries, and the shares add up to L whatever the
number of workers, with no coordination between them. During a rebalance a partition's old
and new owners may both have spent tokens for it: at most one bucket's worth more.

**When.** A held delivery's timer is its recheck time, and a worker with rate limits looks
every ``RATE_TICK_S`` (50 ms) whether a recheck time has come (``recheck_due``); if so it
runs its timers at once instead of at its next tick (``worker.timer_interval_s``, 0.5 s).

**Burst.** A bucket holds at most ``max(1, B x owned / total)`` tokens: the worker's share
of the endpoint's burst B, and never less than one token. The default B is what one look
needs, ``L x RATE_TICK_S``, so for most limits each worker's bucket holds one token and its
claims are spaced by its share exactly (the 1 s windows of bench/rate_limit.py: 20 claims
and 20 arrivals at most for 20/s on 4 workers; a bucket with the fraction of a token left
over between looks as well, 1 + 4 tokens, let 22 claims and 26 arrivals into one second).
A high limit gets room for a look's worth of tokens (200/s on one worker: 10). In any
window of T seconds an endpoint sees at most ``L x T`` plus the buckets' total capacity;
buckets start with one token, not full. A token is taken up to one look (50 ms) after it
is due and the fraction of a token left over is not kept beyond the capacity: a one-token
bucket gives a little less than its share (at 5/s, about 10% less).

**Why not a library.** The gate answers at once (never awaits), on the broker's clock that
the processor passes in (deterministic under test, like the state machine), and says when
the next token is due; it is resized on every rebalance. aiolimiter's ``AsyncLimiter``
awaits ``acquire`` on the event loop's clock, and ``limits`` counts windows on
``time.time()``: neither fits, and the bucket is twenty lines.

A grant is remembered per (delivery, fencing token): the processor may ask again for the
same claim (no room yet, a claim proposed and not yet read back) without spending again.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from events.delivery_state import DeliveryState
from streams.gates import Hold
from streams.metrics import WorkerMetrics
from streams.rate_limits import RateLimit, RateLimitSource

# A waiter not asked again this long after its recheck time is gone (claimed elsewhere,
# settled, its partition moved): it no longer keeps younger deliveries waiting.
STALE_AFTER_S = 2.0
# How long a grant is remembered for the same claim asked again.
GRANT_MEMORY_S = 60.0
# How often waiters and grants are swept for stale entries.
SWEEP_EVERY_S = 1.0
# How often a worker with rate limits looks for waiters whose token is due (streams/app.py):
# finer than the timer tick, so a token is taken within this of its time.
RATE_TICK_S = 0.05
# A token counts as there when float rounding leaves it this short of whole.
EPSILON = 1e-9


def sized(limit: RateLimit, fraction: float, tick_s: float = RATE_TICK_S) -> tuple[float, float]:
    """A worker's rate and bucket capacity for ``limit`` when it holds ``fraction`` of the
    partitions: the gate's claims and the pacer's sends (streams/send_pacer.py) alike."""
    burst = limit.burst if limit.burst is not None else limit.per_s * tick_s
    return limit.per_s * fraction, max(1.0, burst * fraction)


class TokenBucket:
    """Tokens filled at ``rate`` per second up to ``capacity``; a clock is passed in."""

    def __init__(self, rate: float, capacity: float, now: datetime) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = min(1.0, capacity)
        self._at = now

    def _fill(self, now: datetime) -> None:
        elapsed = (now - self._at).total_seconds()
        if elapsed > 0:  # a clock that steps back fills nothing and is not remembered
            self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
            self._at = now

    def resize(self, rate: float, capacity: float, now: datetime) -> None:
        """A new rate and capacity from ``now`` on (what was filled before is kept, up to
        the new capacity)."""
        self._fill(now)
        self.rate = rate
        self.capacity = capacity
        self.tokens = min(self.tokens, capacity)

    def take(self, now: datetime) -> bool:
        """Take one token if there is one."""
        self._fill(now)
        if self.tokens >= 1.0 - EPSILON:
            self.tokens -= 1.0
            return True
        return False

    def due(self, now: datetime, nth: int = 1) -> datetime:
        """When the ``nth`` token from now will be there (``now`` if it already is)."""
        self._fill(now)
        missing = nth - self.tokens
        if missing <= EPSILON:
            return now
        if self.rate <= 0:
            return now + timedelta(seconds=GRANT_MEMORY_S)
        # Up to the clock's microsecond (float noise below a nanosecond aside, which
        # EPSILON forgives): at the time said, the token is there.
        return now + timedelta(microseconds=math.ceil(round(missing / self.rate * 1e6, 3)))


@dataclass
class _Endpoint:
    """One limited endpoint in this worker: its bucket and who waits for it, oldest first."""

    limit: RateLimit
    bucket: TokenBucket
    places: list[tuple[datetime, str]]  # sorted (requested_at, key)
    recheck: dict[str, datetime]  # key -> the recheck time it was given
    fraction: float  # the share the bucket is sized for


class RateGate:
    """The rate limits as a ``Gate`` (streams/gates.py); put it last, it spends tokens."""

    def __init__(
        self,
        limits: RateLimitSource,
        *,
        tick_s: float = RATE_TICK_S,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._limits = limits
        self._tick_s = tick_s
        self._metrics = metrics
        self._fraction = 1.0
        self._endpoints: dict[str, _Endpoint] = {}
        self._granted: dict[tuple[str, int], datetime] = {}
        self._swept: datetime | None = None
        self._rechecks: list[datetime] = []  # a heap of the recheck times given out

    @property
    def waiting(self) -> int:
        """Deliveries held for a token now."""
        return sum(len(e.places) for e in self._endpoints.values())

    def recheck_due(self, now: datetime) -> bool:
        """Whether a recheck time given out has come since this was last asked: the worker
        then runs its timers now, not at its next tick."""
        due = False
        while self._rechecks and self._rechecks[0] <= now:
            heapq.heappop(self._rechecks)
            due = True
        return due

    def share(self, owned: int, total: int) -> None:
        """This worker holds ``owned`` of ``total`` partitions: its share of every limit.
        Who waits is forgotten (they are asked again on their timers, in request order)."""
        self._fraction = owned / total if total > 0 else 0.0
        for endpoint in self._endpoints.values():
            endpoint.places.clear()
            endpoint.recheck.clear()

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """None if ``state``'s endpoint has no limit, or a token for this claim (taken now,
        or already); else a hold until its token is due."""
        limit = self._limits.limit_for(state.channel, state.recipient)
        if limit is None:
            return None
        grant = (state.idempotency_key, state.fencing_token)
        if grant in self._granted:
            return None
        self._sweep(now)
        endpoint = self._endpoint(limit, now)
        key = state.idempotency_key
        place = (state.requested_at, key)
        if key in endpoint.recheck:
            endpoint.places.remove(place)  # asked again: re-placed below (O(n) for n waiters)
            del endpoint.recheck[key]
        ahead = bisect.bisect_left(endpoint.places, place)
        if ahead == 0 and endpoint.bucket.take(now):
            self._granted[grant] = now
            return None
        bisect.insort(endpoint.places, place)
        recheck = endpoint.bucket.due(now, ahead + 1)
        endpoint.recheck[key] = recheck
        heapq.heappush(self._rechecks, recheck)
        if self._metrics is not None:
            self._metrics.rate_limit_holds.inc()
        return Hold(
            recheck,
            f"rate limit {limit.per_s:g}/s of {limit.endpoint} "
            f"(this worker's share {endpoint.bucket.rate:g}/s, {ahead} ahead)",
        )

    def _endpoint(self, limit: RateLimit, now: datetime) -> _Endpoint:
        endpoint = self._endpoints.get(limit.endpoint)
        rate, capacity = sized(limit, self._fraction, self._tick_s)
        if endpoint is None:
            bucket = TokenBucket(rate, capacity, now)
            endpoint = _Endpoint(limit, bucket, [], {}, self._fraction)
            self._endpoints[limit.endpoint] = endpoint
        elif endpoint.fraction != self._fraction or endpoint.limit != limit:
            # Resized at its first use after a rebalance (or a changed limit).
            endpoint.bucket.resize(rate, capacity, now)
            endpoint.fraction = self._fraction
            endpoint.limit = limit
        return endpoint

    def _sweep(self, now: datetime) -> None:
        """Forget waiters that were not asked again and grants too old to be asked for."""
        if self._swept is not None and (now - self._swept).total_seconds() < SWEEP_EVERY_S:
            return
        self._swept = now
        stale = now - timedelta(seconds=STALE_AFTER_S + self._tick_s)
        for endpoint in self._endpoints.values():
            gone = {key for key, at in endpoint.recheck.items() if at < stale}
            if gone:
                endpoint.places[:] = [p for p in endpoint.places if p[1] not in gone]
                for key in gone:
                    del endpoint.recheck[key]
        old = now - timedelta(seconds=GRANT_MEMORY_S)
        for grant in [g for g, at in self._granted.items() if at < old]:
            del self._granted[grant]
