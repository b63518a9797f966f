"""Retry policy per channel, and what a send or lookup result allows next.

Backoff is exponential with jitter, and the jitter is deterministic: it is derived from
``sha256(idempotency_key:attempt)``, because the state machine that schedules retries is a
pure fold with no randomness and no clock (replay must give the same ``retry_at``).

For attempt ``n`` (the attempt that just failed, from 1)::

    backoff(n) = min(max_delay_s, base_delay_s * multiplier ** (n - 1))
    delay(n)   = backoff(n) * (1 - jitter * u),  u = sha256(key:n) as a fraction in [0, 1)
    delay(n)   = max(delay(n), min(Retry-After, max_retry_after_s))   if the receiver sent one

so a delay lies in ``[backoff * (1 - jitter), backoff]`` and never undercuts Retry-After.
After ``max_attempts`` attempts, or once ``max_age_s`` has passed since the delivery was
requested, the policy is exhausted and the delivery is FAILED with its last error class.

Defaults:

======== ========== ========== ========= ====== ============ =========== =================
channel  base_delay multiplier max_delay jitter max_attempts max_age     max_retry_after
======== ========== ========== ========= ====== ============ =========== =================
webhook  2 s        2          15 min    0.5    10           24 h        1 h
provider 1 s        2          5 min     0.5    8            6 h         1 h
======== ========== ========== ========= ====== ============ =========== =================
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from events.outcomes import ErrorClass, LookupOutcome
from events.settings import Settings
from streams.channels.base import SendOutcome

_MAX_EXPONENT = 64  # beyond this every realistic max_delay_s has long been reached


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with deterministic jitter, bounded by attempts and by age."""

    base_delay_s: float = 1.0
    multiplier: float = 2.0
    max_delay_s: float = 300.0
    jitter: float = 0.5  # fraction of the backoff that jitter may take away, in [0, 1]
    max_attempts: int = 8
    max_age_s: float = 6 * 3600.0
    max_retry_after_s: float = 3600.0  # a receiver cannot park a delivery for longer

    def __post_init__(self) -> None:
        if not (self.base_delay_s >= 0 and self.multiplier >= 1 and self.max_delay_s >= 0):
            raise ValueError("backoff needs base_delay_s >= 0, multiplier >= 1, max_delay_s >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")
        if self.max_attempts < 1 or self.max_age_s <= 0 or self.max_retry_after_s < 0:
            raise ValueError("max_attempts >= 1, max_age_s > 0 and max_retry_after_s >= 0")

    def backoff_s(self, attempt: int) -> float:
        """The un-jittered backoff after attempt ``attempt`` (1-based)."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return float(min(self.max_delay_s, self.base_delay_s * self.multiplier**exponent))

    def delay_s(self, key: str, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait before the attempt after ``attempt``; same inputs, same answer."""
        delay = self.backoff_s(attempt) * (1.0 - self.jitter * jitter_fraction(key, attempt))
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(retry_after_s, self.max_retry_after_s))
        return delay

    def exhausted(self, attempt: int, first_requested_at: datetime, now: datetime) -> bool:
        """True when no attempt may follow attempt ``attempt`` (count or age limit reached)."""
        age = (now - first_requested_at).total_seconds()
        return attempt >= self.max_attempts or age >= self.max_age_s


def jitter_fraction(key: str, attempt: int) -> float:
    """A fraction in [0, 1) fixed by ``sha256(key:attempt)``: jitter without randomness."""
    digest = hashlib.sha256(f"{key}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


DEFAULT_POLICIES: Mapping[str, RetryPolicy] = {
    # Webhook receivers are often someone's small service: back off further, for longer.
    "webhook": RetryPolicy(
        base_delay_s=2.0, max_delay_s=900.0, max_attempts=10, max_age_s=24 * 3600.0
    ),
    "provider": RetryPolicy(
        base_delay_s=1.0, max_delay_s=300.0, max_attempts=8, max_age_s=6 * 3600.0
    ),
}


def rules_for(
    settings: Settings, overrides: Mapping[str, RetryPolicy] | None = None
) -> Callable[[str], RetryPolicy]:
    """The policy lookup a worker uses: channel name -> RetryPolicy (defaults + overrides).

    ``settings`` is taken so that per-deployment tuning has one place to arrive; today the
    defaults above apply unless ``overrides`` replaces a channel's policy (tests do).
    """
    del settings  # no retry settings yet; see the docstring
    policies = {**DEFAULT_POLICIES, **(overrides or {})}

    def policy(channel: str) -> RetryPolicy:
        try:
            return policies[channel]
        except KeyError:
            raise KeyError(f"no retry policy for channel {channel!r}") from None

    return policy


class Disposition(enum.StrEnum):
    """What a classified result allows next."""

    DONE = "done"  # authoritative confirmation: nothing more to do
    RETRY = "retry"  # retry safe now (after backoff): provably not processed, or deduped
    RECONCILE = "reconcile"  # needs reconciliation: ask the provider by key first
    PERMANENT = "permanent"  # fail with the error class; retrying cannot help
    UNRESOLVED = "unresolved"  # no lookup and no dedupe rule: stays UNKNOWN, for an operator


@dataclass(frozen=True)
class Verdict:
    """A disposition and the reason for it (goes into the event as evidence/safety)."""

    disposition: Disposition
    reason: str


# The receiver said it did not process the request (RFC 9110 / RFC 6585 / RFC 8470).
NOT_PROCESSED = frozenset({ErrorClass.HTTP_408, ErrorClass.HTTP_425, ErrorClass.HTTP_429})


def classify_send(outcome: SendOutcome, error_class: ErrorClass | None) -> Verdict:
    """What a send result allows: retry now, reconcile first, fail, or nothing (done)."""
    label = error_class.value if error_class else "none"
    match outcome:
        case SendOutcome.CONFIRMED:
            return Verdict(Disposition.DONE, "authoritative acknowledgement")
        case SendOutcome.SENT:
            return Verdict(
                Disposition.RECONCILE, "provider accepted; its lookup must confirm delivery"
            )
        case SendOutcome.NOT_SENT:
            return Verdict(
                Disposition.RETRY, f"{label}: failed before any byte of the request was written"
            )
        case SendOutcome.UNKNOWN:
            return Verdict(Disposition.RECONCILE, f"{label}: the request may have been processed")
        case SendOutcome.TRANSIENT if error_class in NOT_PROCESSED:
            return Verdict(Disposition.RETRY, f"{label}: the receiver did not process it")
        case SendOutcome.TRANSIENT if error_class is ErrorClass.HTTP_409:
            return Verdict(
                Disposition.RECONCILE, "http_409: a request with this key exists or is in flight"
            )
        case SendOutcome.TRANSIENT:
            return Verdict(
                Disposition.RECONCILE, f"{label}: may have come after the receiver accepted it"
            )
        case SendOutcome.REJECTED:
            return Verdict(Disposition.PERMANENT, f"{label}: rejected permanently")
    raise ValueError(f"unclassified send outcome {outcome!r}")  # pragma: no cover


def classify_lookup(outcome: LookupOutcome, delivered: bool, *, receiver_dedupes: bool) -> Verdict:
    """What a lookup by idempotency key allows next."""
    if outcome == "found":
        if delivered:
            return Verdict(Disposition.DONE, "lookup found the key delivered")
        return Verdict(Disposition.RECONCILE, "lookup found the key, not yet delivered")
    if outcome == "not_found":
        return Verdict(Disposition.RETRY, "lookup proves the key was not accepted")
    if outcome == "lookup_error":
        return Verdict(Disposition.RECONCILE, "lookup failed; look up again later")
    if receiver_dedupes:
        return Verdict(Disposition.RETRY, "no lookup; safe because the receiver dedupes on the key")
    return Verdict(
        Disposition.UNRESOLVED, "no lookup and no receiver dedupe: cannot prove it did not leave"
    )
