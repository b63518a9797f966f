"""What the receiver remembers per idempotency key, and the one decision made on receipt.

The decision is pure (no I/O, no clock: ``now`` is part of the request's ``LeaseTerms``):
every store runs it inside its own transaction, so SQLite and PostgreSQL decide the same
way and the rules are testable on their own.

A request that runs the handler holds the key's *handler lease* (a holder id and an
expiry, renewed while the handler runs). A key still ``processing`` whose lease expired
had its handler die mid-run (a SIGKILL, a lost host): it is *reclaimed*. If the user
declared the handler idempotent, the next request for the key runs it again under a new
lease; otherwise the key is *stuck*: never run again, answered ``stuck`` to lookups, for
an operator to settle.
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
    lease_holder: str | None = None  # the run that holds the handler lease
    lease_expires_at: float | None = None  # unix seconds; None: written without a lease


@dataclass(frozen=True)
class LeaseTerms:
    """What one request asks for if it gets to run the handler: the lease it would hold."""

    holder: str  # this run's id, unique per admission
    now: float  # unix seconds, the receiver's clock
    lease_s: float  # how long the lease lasts unless renewed
    idempotent_handler: bool = False  # may a dead run's key be run again?

    @property
    def expires_at(self) -> float:
        """When a lease taken now ends unless renewed."""
        return self.now + self.lease_s


def lease_expired(record: KeyRecord, now: float) -> bool:
    """True if ``record`` is ``processing`` and its handler's lease has run out: the run
    died. A row without a lease was written by a kit that kept none, before this one
    started: its run is no longer renewed either."""
    if record.status is not KeyStatus.PROCESSING:
        return False
    return record.lease_expires_at is None or record.lease_expires_at <= now


class Admission(enum.StrEnum):
    """What a new request for a key may do."""

    RUN = "run"  # this request owns the key now: run the handler
    DUPLICATE = "duplicate"  # done before: answer the first result, do not run again
    IN_PROGRESS = "in_progress"  # another request is running the handler right now
    STALE = "stale"  # its fencing token is older than one already seen for the key
    STUCK = "stuck"  # a run died mid-handler and the handler is not idempotent: never again


@dataclass(frozen=True)
class Decision:
    """The admission, and the record as it must be stored after it."""

    admission: Admission
    record: KeyRecord
    seen_token: int | None = None  # for STALE: the newer token already seen
    reclaimed: bool = False  # for RUN: the key's previous run died holding the lease


def _newest(seen: int | None, token: int | None) -> int | None:
    if seen is None:
        return token
    if token is None:
        return seen
    return max(seen, token)


def _leased(key: str, token: int | None, terms: LeaseTerms) -> KeyRecord:
    return KeyRecord(
        key,
        KeyStatus.PROCESSING,
        token,
        lease_holder=terms.holder,
        lease_expires_at=terms.expires_at,
    )


def admit(existing: KeyRecord | None, key: str, token: int | None, terms: LeaseTerms) -> Decision:
    """Decide a request for ``key`` carrying fencing ``token`` (None: no fencing header)."""
    if existing is None:
        return Decision(Admission.RUN, _leased(key, token, terms))
    seen = existing.fencing_token
    if token is not None and seen is not None and token < seen:
        return Decision(Admission.STALE, existing, seen_token=seen)
    newest = _newest(seen, token)
    if existing.status is KeyStatus.FAILED:
        return Decision(Admission.RUN, _leased(key, newest, terms))
    expired = lease_expired(existing, terms.now)
    if expired and terms.idempotent_handler:
        return Decision(Admission.RUN, _leased(key, newest, terms), reclaimed=True)
    kept = KeyRecord(
        key,
        existing.status,
        newest,
        existing.result_id,
        existing.error,
        existing.lease_holder,
        existing.lease_expires_at,
    )
    if existing.status is KeyStatus.DONE:
        return Decision(Admission.DUPLICATE, kept)
    if expired:
        return Decision(Admission.STUCK, kept)
    return Decision(Admission.IN_PROGRESS, kept)
