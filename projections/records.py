"""Records read from the log: a position, and the decoded event or why it did not decode."""

from __future__ import annotations

from dataclasses import dataclass

from events.codec import EventDecodeError, decode
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from projections.fold import Position


@dataclass(frozen=True)
class LogRecord:
    """One committed record: where it was, and its event or the reason it has none."""

    position: Position
    event: AnyExecutionEvent | AnyDeliveryEvent | None
    reason: str | None = None
    # The original bytes, kept only for an undecodable record (for its dead letter).
    key: bytes | None = None
    value: bytes | None = None


def decode_at(
    topic: str, partition: int, offset: int, value: bytes | None, key: bytes | None = None
) -> LogRecord:
    """Decode one record value; an undecodable one keeps its reason and bytes instead of
    raising."""
    where = Position(topic, partition, offset)
    try:
        return LogRecord(where, decode(value))
    except EventDecodeError as exc:
        return LogRecord(where, None, exc.reason, key, value)
