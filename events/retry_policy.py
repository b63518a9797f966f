"""Retry policy per channel: when the next attempt may be made, and when no more may.

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

Which policy a delivery gets (streams/retry.py): its registered endpoint's
``retry_policy`` (``ledger endpoints add|update --retry-policy``) where the registry sets
one, else the channel's from ``LEDGER_CHANNELS__RETRY_POLICIES``, else the channel's
default below.

Defaults:

========= ========== ========== ========= ====== ============ =========== =================
channel   base_delay multiplier max_delay jitter max_attempts max_age     max_retry_after
========= ========== ========== ========= ====== ============ =========== =================
webhook   2 s        2          15 min    0.5    10           24 h        1 h
provider  1 s        2          5 min     0.5    8            6 h         1 h
slack     1 s        2          5 min     0.5    8            6 h         1 h
smtp      60 s       2          30 min    0.5    10           24 h        1 h
email_api 1 s        2          5 min     0.5    8            6 h         1 h
browser   1 s        2          5 min     0.5    8            6 h         1 h
========= ========== ========== ========= ====== ============ =========== =================
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

_MAX_EXPONENT = 64  # beyond this every realistic max_delay_s has long been reached


class RetryPolicy(BaseModel):
    """Exponential backoff with deterministic jitter, bounded by attempts and by age.

    The field defaults are the provider channel's; ``DEFAULT_POLICIES`` has each channel's.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_delay_s: float = Field(default=1.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1)
    max_delay_s: float = Field(default=300.0, ge=0)
    # The fraction of the backoff that jitter may take away.
    jitter: float = Field(default=0.5, ge=0, le=1)
    max_attempts: int = Field(default=8, ge=1)
    max_age_s: float = Field(default=6 * 3600.0, gt=0)
    # A receiver's Retry-After cannot park a delivery for longer than this.
    max_retry_after_s: float = Field(default=3600.0, ge=0)

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
    "provider": RetryPolicy(),  # the field defaults
    # Slack answers a rate limit with Retry-After, which every delay honours anyway.
    "slack": RetryPolicy(),
    # A relay's 4xx is often greylisting, which lets a retry through only after minutes.
    "smtp": RetryPolicy(
        base_delay_s=60.0, max_delay_s=1800.0, max_attempts=10, max_age_s=24 * 3600.0
    ),
    # An email API answers a rate limit with Retry-After too; 6 h of attempts stays well
    # inside the 24 h its Idempotency-Key is remembered.
    "email_api": RetryPolicy(),
    # A browser attempt costs a page load; a retry only follows proof that nothing was
    # submitted (two "not found" lookups) or a failure before the submit.
    "browser": RetryPolicy(),
}


def for_channel(channel: str, given: Mapping[str, object]) -> RetryPolicy:
    """``channel``'s default policy with the fields in ``given`` replaced (settings)."""
    base = DEFAULT_POLICIES.get(channel, RetryPolicy())
    return RetryPolicy.model_validate({**base.model_dump(), **given})
