"""The circuit breaker's rule, per registered endpoint (pure: no I/O, the clock passed in).

**What counts.** Every send to the endpoint this worker makes is one of:

- a *failure*: a transport failure before anything was written (connection refused,
  connect timeout, DNS failure, no connection for another reason), a result the sender
  cannot know (``UNKNOWN``: a timeout or a reset after the request was written), or an
  answer "not now" (``TRANSIENT``: 5xx, 429);
- a *healthy* answer: ``CONFIRMED``, ``SENT``, and also ``REJECTED`` (a 4xx): a permanent
  rejection of one delivery says that delivery is wrong, not that the endpoint is down;
- *not a send*: a write the sender refused (its lease rule, fenced) or a request refused
  before the network (the payload, the recipient) never reached the endpoint.

**When it opens.** Each worker keeps its own sliding window (``window_s``, 60 s by
default) of its sends to each endpoint since the circuit's last transition. When the
window holds at least ``min_sends`` (10) and failures / sends reaches ``failure_ratio``
(0.5), the worker appends ``circuit_opened`` to ``ledger.endpoints``. Every worker folds
that record, so the circuit is open for all of them.

**While it is open** the endpoint's deliveries wait (PENDING, ``circuit_open``): no claim,
no attempt. After ``open_s`` (30 s), the first worker that looks at one of its own waiting
deliveries appends ``circuit_half_opened`` naming that delivery as the probe; only that
worker claims it, every other delivery keeps waiting. The probe's healthy answer closes the
circuit (``circuit_closed``: the waiting deliveries are claimed, in request order); its
failure opens it again for another ``open_s``. A probe with no answer after ``open_s``
(its worker died, its partition moved) is replaced: another worker names a new one.

**Long outages.** When the outage (from its first opening, through every failed probe)
lasts ``auto_disable_s`` (3 days), a worker appends ``auto_disabled``: the endpoint is
disabled, its deliveries keep waiting (as ``disabled``) until an operator enables it.

Every transition is appended with the next version of the endpoint the worker saw, so two
workers deciding at once append one effective transition (events/endpoints.py ``fold``).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from config.parts import BreakerSettings
from events.endpoints import EndpointState
from events.outcomes import ErrorClass
from streams.channels.base import SendOutcome, SendResult

TRANSPORT = frozenset(
    {
        ErrorClass.CONNECT_REFUSED,
        ErrorClass.CONNECT_TIMEOUT,
        ErrorClass.DNS_FAILURE,
        ErrorClass.CONNECT_FAILED,
    }
)
NEVER_SENT = frozenset(
    {ErrorClass.FENCED, ErrorClass.REFUSED_REQUEST, ErrorClass.INVALID_RECIPIENT}
)


class Verdict(enum.Enum):
    """What one send says about its endpoint."""

    HEALTHY = "healthy"
    FAILURE = "failure"


def verdict(result: SendResult) -> Verdict | None:
    """A send's verdict on its endpoint, or None: it never reached it (see the module)."""
    if result.error_class in NEVER_SENT:
        return None
    if result.outcome in (SendOutcome.CONFIRMED, SendOutcome.SENT, SendOutcome.REJECTED):
        return Verdict.HEALTHY
    if result.outcome in (SendOutcome.TRANSIENT, SendOutcome.UNKNOWN):
        return Verdict.FAILURE
    if result.outcome is SendOutcome.NOT_SENT and result.error_class in TRANSPORT:
        return Verdict.FAILURE
    return None


@dataclass
class SendWindow:
    """One worker's recent sends to one endpoint: (when, failed), oldest first."""

    window_s: float
    entries: deque[tuple[datetime, bool]] = field(default_factory=deque)

    def add(self, at: datetime, failed: bool) -> None:
        """Count one send."""
        self.entries.append((at, failed))

    def counts(self, now: datetime, since: datetime | None) -> tuple[int, int]:
        """(failures, sends) within the window before ``now`` and not before ``since``
        (the circuit's last transition: what came before it was judged already)."""
        start = now - timedelta(seconds=self.window_s)
        while self.entries and self.entries[0][0] < start:
            self.entries.popleft()
        if since is not None and since > start:
            start = since
        judged = [failed for at, failed in self.entries if at >= start]
        return sum(judged), len(judged)


class Step(enum.Enum):
    """What a worker does about one of its deliveries to an endpoint."""

    CLAIM = "claim"  # claim it
    HOLD = "hold"  # it waits as circuit_open
    PROBE = "probe"  # it waits, and this worker names it the probe (half-open)
    AUTO_DISABLE = "auto_disable"  # it waits, and this worker disables the endpoint


@dataclass(frozen=True)
class BreakerRule:
    """The rule's numbers (config/parts.py ``BreakerSettings``)."""

    window_s: float = 60.0
    min_sends: int = 10
    failure_ratio: float = 0.5
    open_s: float = 30.0
    auto_disable_s: float = 3 * 86_400.0

    @classmethod
    def of(cls, settings: BreakerSettings) -> BreakerRule:
        """The rule of ``settings``."""
        return cls(
            settings.window_s,
            settings.min_sends,
            settings.failure_ratio,
            settings.open_s,
            settings.auto_disable_s,
        )

    def trips(self, failures: int, sends: int) -> bool:
        """Whether a window of ``sends`` with ``failures`` opens a closed circuit."""
        return sends >= self.min_sends and failures >= self.failure_ratio * sends

    def step(self, endpoint: EndpointState, key: str, worker: str, now: datetime) -> Step:
        """What ``worker`` does about its delivery ``key`` to ``endpoint`` at ``now``."""
        breaker = endpoint.breaker
        if breaker is None or breaker.state == "closed":
            return Step.CLAIM
        outage = breaker.outage_since or breaker.since
        if now - outage >= timedelta(seconds=self.auto_disable_s):
            return Step.AUTO_DISABLE
        if breaker.state == "half_open" and breaker.probe == key:
            return Step.CLAIM if breaker.probe_worker == worker else Step.HOLD
        if now - breaker.since >= timedelta(seconds=self.open_s):
            # Open long enough, or a probe that never answered: name this one.
            return Step.PROBE
        return Step.HOLD

    def after_send(
        self, endpoint: EndpointState, key: str, judged: Verdict, counts: tuple[int, int]
    ) -> str | None:
        """The transition one send's verdict calls for: ``open``, ``close`` or None.
        ``counts``: (failures, sends) of this worker's window, the send included."""
        breaker = endpoint.breaker
        if breaker is not None and breaker.state == "half_open":
            if breaker.probe != key:
                return None  # a straggler sent before the circuit opened: already judged
            return "close" if judged is Verdict.HEALTHY else "open"
        if breaker is not None and breaker.state == "open":
            return None
        return "open" if self.trips(*counts) else None
