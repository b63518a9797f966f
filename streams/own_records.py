"""The records this worker appended itself, until it reads them back.

Two of a webhook delivery's three records are the worker's own (its claim and its
outcome): it builds each event (pydantic validates it then), encodes it, signs the bytes,
appends them, and a moment later reads the same bytes back and decodes, upcasts,
validates and verifies them again (issue 31 item 3: about 0.1 ms of CPU a record).

Read back, a record whose value is byte for byte one this worker encoded, and whose
signature header is the one it made over those bytes, is that event: decoding it again
can only give the same event, and the signature check can only pass (the worker's own
public key is always among the verifier's). So the processor takes the event it holds
instead. Anything else (another worker's record, an agent's, a hostile one, a copy of
ours without our signature, anything after a restart) takes the full path: decoded,
validated and verified where it enters, as before. An entry is used once: a second
record with the same bytes is decoded and folded like any other (the fold dedupes it by
event id).
"""

from __future__ import annotations

from collections.abc import Sequence

from clients.outcome_signing import HEADER
from events.base import Event

# Entries of records never read back here (their partition moved to another worker before
# the read-back) are dropped oldest first beyond this many.
LIMIT = 4096


class OwnRecords:
    """Events this worker appended, by their record value, each with its signature."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._events: dict[bytes, tuple[Event, bytes | None]] = {}

    def __len__(self) -> int:
        return len(self._events)

    def remember(
        self, value: bytes, event: Event, headers: Sequence[tuple[str, bytes]] | None
    ) -> None:
        """``value`` is ``event`` as this worker encoded it, appended with ``headers`` (its
        signature, or None when it signs nothing)."""
        signature = next((v for name, v in headers or () if name == HEADER), None)
        events = self._events
        events[value] = (event, signature)
        while len(events) > self._limit:
            del events[next(iter(events))]

    def known(self, value: bytes | None, headers: Sequence[tuple[str, bytes]] = ()) -> Event | None:
        """The event ``value`` encodes, if this worker appended exactly these bytes and the
        record carries the signature it made over them; the entry is used up. None for
        anything else."""
        if value is None:
            return None
        entry = self._events.pop(value, None)
        if entry is None:
            return None
        event, signature = entry
        if signature is not None and (HEADER, signature) not in headers:
            return None
        return event
