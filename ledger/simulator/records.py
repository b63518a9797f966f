"""What the simulator saw: every request received, every logical event accepted, per key."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_REQUESTS = 1_000_000  # the request log is bounded; counts per key are not affected


@dataclass
class RequestRecord:
    """One HTTP request as the simulator handled it."""

    seq: int
    at: float  # unix seconds when it arrived
    method: str
    path: str
    key: str | None  # idempotency key it carried (header, query or path), if any
    fault: str | None = None
    status: int | None = None  # None while in progress, or when no response was sent
    result: str = "in_progress"  # accepted | duplicate | rejected | unauthorized | invalid | ...
    signature_ok: bool | None = None  # webhooks only
    fencing_token: int | None = None  # the Fencing-Token header, if it carried one
    ended: float | None = None  # unix seconds when its answer was finished (or it was cut)


@dataclass
class AcceptedEvent:
    """One logical event, by idempotency key: how often it was accepted and with what."""

    key: str
    channel: str  # "webhook" or "provider"
    path: str
    payload: Any
    receiver_id: str
    accepted: int = 1  # times processed as new: 1 with dedupe on, one per request with it off
    received: int = 1  # valid requests that carried this key (duplicates included)
    conflicts: int = 0  # repeats whose payload differed from the first
    first_at: float = field(default_factory=time.time)
    monotonic_at: float = field(default_factory=time.monotonic)
    status_override: str | None = None  # the provider's status for it, when forced ("failed")


class Recorder:
    """Thread-safe store of requests and accepted events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)
        self.requests: deque[RequestRecord] = deque(maxlen=MAX_REQUESTS)
        self.events: dict[str, AcceptedEvent] = {}

    def reset(self) -> None:
        """Forget everything seen so far."""
        with self._lock:
            self.requests.clear()
            self.events.clear()

    def received(self, method: str, path: str, key: str | None) -> RequestRecord:
        """Log a request on arrival; the handler fills in fault, status and result."""
        with self._lock:
            record = RequestRecord(next(self._seq), time.time(), method, path, key)
            self.requests.append(record)
            return record

    def finish(self, record: RequestRecord, result: str, status: int | None) -> None:
        """Set what became of a logged request."""
        with self._lock:
            record.result = result
            record.status = status
            record.ended = time.time()

    def ended(self, record: RequestRecord) -> None:
        """The request's connection is done (its answer written, or cut)."""
        with self._lock:
            record.ended = time.time()

    def in_progress(self, key: str, *, method: str = "POST") -> bool:
        """A request for ``key`` was received and is still being processed."""
        with self._lock:
            return any(
                r.key == key and r.method == method and r.result == "in_progress"
                for r in self.requests
            )

    def max_concurrent(self, key: str, *, method: str = "POST") -> int:
        """The most requests for ``key`` that were open at the same moment."""
        with self._lock:
            now = time.time()
            spans = [
                (r.at, r.ended if r.ended is not None else now)
                for r in self.requests
                if r.key == key and r.method == method
            ]
        edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
        open_now = most = 0
        for _, step in edges:
            open_now += step
            most = max(most, open_now)
        return most

    def accept(
        self, key: str, channel: str, path: str, payload: Any, *, dedupe: bool, id_prefix: str
    ) -> tuple[AcceptedEvent, bool]:
        """Record a valid request for ``key``; True if it was processed as new."""
        with self._lock:
            event = self.events.get(key)
            if event is None:
                event = AcceptedEvent(
                    key, channel, path, payload, f"{id_prefix}_{next(self._ids):08d}"
                )
                self.events[key] = event
                return event, True
            event.received += 1
            if payload != event.payload:
                event.conflicts += 1
            if dedupe:
                return event, False
            event.accepted += 1
            return event, True

    def repeated(self, key: str, payload: Any) -> None:
        """A valid request for ``key`` that a deduping receiver answered without processing."""
        with self._lock:
            event = self.events.get(key)
            if event is None:
                return
            event.received += 1
            if payload != event.payload:
                event.conflicts += 1

    def event(self, key: str) -> AcceptedEvent | None:
        """The accepted event for ``key``, if any."""
        with self._lock:
            return self.events.get(key)

    def snapshot(self) -> tuple[list[RequestRecord], dict[str, AcceptedEvent]]:
        """Copies of the request log and the accepted events."""
        with self._lock:
            requests = [RequestRecord(**asdict(r)) for r in self.requests]
            events = {k: AcceptedEvent(**asdict(e)) for k, e in self.events.items()}
            return requests, events
