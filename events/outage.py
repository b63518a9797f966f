"""Riding out a dependency's outage: capped, jittered backoff, and one log line per outage.

A component whose database restarts (or drops its connections) keeps running: it waits
0.5 s, 1 s, 2 s ... up to 10 s between attempts (each delay jittered, so that many
processes do not reconnect in step), logs ``<what> unreachable (<reason>): retrying``
once when the outage begins and ``<what> back after N s`` once when it ends. Only a
configuration error (``config_problem``) or an outage longer than its limit ends it.

Standard library only: the receiver kit uses it too (receiver/postgres.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from events.errors import LedgerError

# Fragments of a PostgreSQL connection error that no retry can fix: the DSN, the user, the
# password or the database are wrong (libpq reports them without an SQLSTATE at connect).
_CONFIG_MARKS = (
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "does not exist",  # role or database
    "invalid uri",
    "invalid connection option",
    "invalid dsn",
    'missing "="',
    "password is required",
    "no password supplied",
)


@dataclass
class Backoff:
    """Delays between attempts: ``first_s`` doubling up to ``cap_s``, each jittered by
    up to ``jitter`` of itself either way."""

    first_s: float = 0.5
    cap_s: float = 10.0
    factor: float = 2.0
    jitter: float = 0.25
    _next_s: float = field(default=0.0, init=False, repr=False)

    def next_delay(self) -> float:
        """The delay before the next attempt (grows until ``reset``)."""
        base = self.first_s if self._next_s <= 0 else self._next_s
        self._next_s = min(self.cap_s, base * self.factor)
        spread = base * self.jitter
        return float(min(self.cap_s, max(0.0, base + random.uniform(-spread, spread))))  # noqa: S311 - jitter, not a secret

    def reset(self) -> None:
        """Start again from ``first_s`` (the dependency answered)."""
        self._next_s = 0.0


class OutageTooLong(LedgerError):
    """The dependency stayed unreachable past the component's limit."""


class Outage:
    """One dependency's outages, each told in two log lines (begun, ended).

    ``failed(exc)`` after every failed attempt returns how long to wait before the next
    (raising ``OutageTooLong`` past ``limit_s``); ``recovered()`` after a success.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        hint: str = "",
        backoff: Backoff | None = None,
        limit_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self.what = what
        self._hint = hint
        self._backoff = backoff or Backoff()
        self.limit_s = limit_s
        self._clock = clock
        self.since: float | None = None  # when the current outage began (clock), if any
        self.attempts = 0
        self.outages = 0  # how many outages ended so far
        self.last_duration_s = 0.0

    @property
    def ongoing(self) -> bool:
        """Whether the dependency is unreachable right now."""
        return self.since is not None

    def failed(self, exc: BaseException) -> float:
        """Note one failed attempt; the delay before the next one."""
        now = self._clock()
        if self.since is None:
            self.since = now
            self.attempts = 0
            self._log.warning("%s unreachable (%s): retrying", self.what, reason(exc))
        self.attempts += 1
        waited = now - self.since
        if waited >= self.limit_s:
            raise OutageTooLong(
                f"{self.what} unreachable for {waited:.0f} s ({self.attempts} attempts): "
                f"{reason(exc)}",
                self._hint or "check that it is running and reachable, then start again",
            )
        return min(self._backoff.next_delay(), max(0.0, self.limit_s - waited))

    def recovered(self) -> None:
        """Note a success: ends the current outage, if any, with its one line."""
        if self.since is None:
            return
        self.last_duration_s = self._clock() - self.since
        self.since = None
        self.outages += 1
        self._backoff.reset()
        self._log.warning(
            "%s back after %.1f s (%d attempts)", self.what, self.last_duration_s, self.attempts
        )


def reason(exc: BaseException) -> str:
    """The first line of ``exc``, short enough for a log line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def config_problem(exc: BaseException) -> bool:
    """Whether a PostgreSQL connection error is the configuration's (bad DSN, unknown
    user or database, refused credentials): retrying cannot fix it."""
    if type(exc).__name__ == "ProgrammingError":  # psycopg: a DSN it cannot parse
        return True
    text = str(exc).lower()
    return any(mark in text for mark in _CONFIG_MARKS)
