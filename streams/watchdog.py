"""Catch a worker that is alive but no longer making progress, and make it crash loudly.

faust-streaming has known failure modes where a partition stops being consumed while the
worker stays up (faust-streaming issues #221, #606). A supervisor cannot see that, so the
watchdog compares what the broker has (highwater) with what the agent processed and, when
records wait with no progress for ``stall_seconds``, stops the process with an error so
that whatever supervises it restarts it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

log = logging.getLogger(__name__)

STALL_MIN_WAITING = 10


class Watchdog:
    """Progress monitor for the delivery agent."""

    def __init__(self, lag: ConsumerLag, stall_seconds: float = 120.0) -> None:
        self._lag = lag
        self._stall_seconds = stall_seconds
        self._last_progress = time.monotonic()
        self._ready = False
        self.stalls = 0

    def progressed(self) -> None:
        """The agent processed a record."""
        self._last_progress = time.monotonic()

    def ready(self) -> None:
        """Recovery finished: from now on, waiting records with no progress is a stall."""
        self._ready = True
        self._last_progress = time.monotonic()

    def check(self, in_recovery: bool) -> None:
        """Called from the timer loop; SIGTERMs the process on a stall."""
        if not self._ready or in_recovery:
            self._last_progress = time.monotonic()
            return
        if time.monotonic() - self._last_progress < self._stall_seconds:
            return
        # Offsets past the last record handed to the agent are not all records: every
        # transaction leaves a marker, an aborted one its records too. Only a backlog
        # larger than such a tail counts as records waiting.
        if self._lag.value < STALL_MIN_WAITING:
            self._last_progress = time.monotonic()
            return
        self.stalls += 1
        log.critical(
            "delivery agent made no progress for %.0fs while %d offsets wait: stopping the "
            "worker so it is restarted (faust stall)",
            self._stall_seconds,
            self._lag.value,
        )
        os.kill(os.getpid(), signal.SIGTERM)


class ConsumerLag:
    """Records waiting in the owned partitions: broker highwater minus what was processed."""

    def __init__(self, app: Any, topic: str, continuity: Any, every_s: float = 2.0) -> None:
        self._app = app
        self._topic = topic
        self._continuity = continuity
        self._every_s = every_s
        self._at = 0.0
        self.value = 0

    def refresh(self) -> None:
        """Recompute at most every ``every_s`` seconds (called from the timer loop)."""
        now = time.monotonic()
        if now - self._at < self._every_s:
            return
        self._at = now
        total = 0
        consumer = self._app.consumer
        try:
            assignment = consumer.assignment()
        except Exception:  # noqa: BLE001 - not assigned yet
            return
        for tp in assignment:
            if tp.topic != self._topic:
                continue
            highwater = consumer.highwater(tp)
            last = self._continuity.last_processed(tp.partition)
            if highwater is not None and last is not None:
                total += max(0, highwater - (last + 1))
        self.value = total
