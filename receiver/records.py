"""What the receiver remembers per idempotency key, and the one decision made on receipt.

The decision is pure (no I/O, no clock): every store runs it inside its own transaction,
so SQLite and PostgreSQL decide the same way and the rules are testable on their own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class KeyStatus(enum.StrEnum):
    """Where the handling of one idempotency key stands."""

    PROCESSING = "processing"  # recorded at receipt; the handler is running
    DONE = "done"  # the handler returned ``result_id``
    FAILED = "failed"  # the handler raised; the next attempt may run it again


@dataclass(frozen=True)
class KeyRecord:
    """One idempotency key as stored."""

    key: str
    status: KeyStatus
    fencing_token: int | None  # the highest token seen for this key
    result_id: str | None = None
    error: str | None = None


class Admission(enum.StrEnum):
    """What a new request for a key may do."""

    RUN = "run"  # this request owns the key now: run the handler
    DUPLICATE = "duplicate"  # done before: answer the first result, do not run again
    IN_PROGRESS = "in_progress"  # another request is running the handler right now
    STALE = "stale"  # its fencing token is older than one already seen for the key


@dataclass(frozen=True)
class Decision:
    """The admission, and the record as it must be stored after it."""

    admission: Admission
    record: KeyRecord
    seen_token: int | None = None  # for STALE: the newer token already seen


def _newest(seen: int | None, token: int | None) -> int | None:
    if seen is None:
        return token
    if token is None:
        return seen
    return max(seen, token)


def admit(existing: KeyRecord | None, key: str, token: int | None) -> Decision:
    """Decide a request for ``key`` carrying fencing ``token`` (None: no fencing header)."""
    if existing is None:
        return Decision(Admission.RUN, KeyRecord(key, KeyStatus.PROCESSING, token))
    seen = existing.fencing_token
    if token is not None and seen is not None and token < seen:
        return Decision(Admission.STALE, existing, seen_token=seen)
    newest = _newest(seen, token)
    if existing.status is KeyStatus.FAILED:
        return Decision(Admission.RUN, KeyRecord(key, KeyStatus.PROCESSING, newest))
    kept = KeyRecord(key, existing.status, newest, existing.result_id, existing.error)
    if existing.status is KeyStatus.DONE:
        return Decision(Admission.DUPLICATE, kept)
    return Decision(Admission.IN_PROGRESS, kept)
