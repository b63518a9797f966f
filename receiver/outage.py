"""The kit's outage rules: capped, jittered backoff and one log line per outage.

The same rules as the ledger's own components (events/outage.py), kept here in a few
lines because the kit imports nothing of the ledger (tests/receiver/test_import.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Fragments of a PostgreSQL connection error that no retry can fix (no SQLSTATE at connect).
_CONFIG_MARKS = (
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "does not exist",  # role or database
    "password is required",
    "no password supplied",
)


@dataclass
class Backoff:
    """``first_s`` doubling up to ``cap_s``, each delay jittered by up to ``jitter``."""

    first_s: float = 0.5
    cap_s: float = 10.0
    jitter: float = 0.25
    _next_s: float = field(default=0.0, init=False, repr=False)

    def next_delay(self) -> float:
        """The delay before the next attempt."""
        base = self.first_s if self._next_s <= 0 else self._next_s
        self._next_s = min(self.cap_s, base * 2)
        spread = base * self.jitter
        return float(min(self.cap_s, max(0.0, base + random.uniform(-spread, spread))))  # noqa: S311 - jitter, not a secret


class OutageLog:
    """Says ``<what> unreachable (<reason>): retrying`` when an outage begins and
    ``<what> back after N s`` when it ends: one pair per outage, however many calls fail."""

    def __init__(
        self, logger: logging.Logger, what: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self.what = what
        self._clock = clock
        self.since: float | None = None
        self.attempts = 0
        self.last_duration_s = 0.0

    def failed(self, exc: BaseException) -> None:
        """Note one failed attempt."""
        if self.since is None:
            self.since = self._clock()
            self.attempts = 0
            self._log.warning("%s unreachable (%s): retrying", self.what, reason(exc))
        self.attempts += 1

    def recovered(self) -> None:
        """Note a success: ends the current outage, if any."""
        if self.since is None:
            return
        self.last_duration_s = self._clock() - self.since
        self.since = None
        self._log.warning(
            "%s back after %.1f s (%d attempts)", self.what, self.last_duration_s, self.attempts
        )


def reason(exc: BaseException) -> str:
    """The first line of ``exc``, short enough for a log line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def config_problem(exc: BaseException) -> bool:
    """Whether a PostgreSQL connection error is the configuration's: no retry fixes it."""
    text = str(exc).lower()
    return any(mark in text for mark in _CONFIG_MARKS)
