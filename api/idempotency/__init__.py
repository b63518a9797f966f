"""First answers by run id: Stripe's idempotency semantics, kept in the API's own database.

Each run event (``complete``, ``start``, ``fail``, ``unknown``) of a run id is answered
once. The request's fingerprint (the agent, and a hash per body field) is recorded
*before* anything is published, as "in flight"; then the answer once the transaction
committed. So:

* the same request again gets the first answer, unpublished a second time;
* a different request for the same run event gets a conflict naming the fields that
  differ (409), and so does one arriving while the first is still in flight ("retry");
* an in-flight record older than ``in_flight_stale_s`` belonged to a process that died
  before answering: the next request takes it over and publishes (the log dedupes the
  deliveries by key if the dead one had committed after all);
* a publish that failed removes its record, so the caller's retry publishes afresh.

Two backends keep the ``first_answers`` table, chosen by the DSN's scheme (``open_answers``):
SQLite (``sqlite:///path``, api/idempotency/sqlite.py: API processes on one machine) and
PostgreSQL (``postgresql://...``, api/idempotency/postgres.py: API processes on several
machines sharing one server). Both hold the same contract (tests/api/test_first_answers.py
runs it on each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class AnswersUnavailable(Exception):
    """The idempotency database could not be read or written (the request is answered
    503, nothing published)."""


@dataclass(frozen=True)
class Claim:
    """What the record of a run event says about a new request for it.

    ``new``: recorded in flight, publish it; ``replay``: answer ``status``/``answer``
    again; ``conflict``: a different request holds it (``fields`` differ, or another
    ``agent``); ``in_flight``: the same request is being published right now.
    """

    kind: Literal["new", "replay", "conflict", "in_flight"]
    status: int | None = None
    answer: dict[str, Any] | None = None
    fields: tuple[str, ...] = ()
    agent: str | None = None


def differing(first: dict[str, str], second: dict[str, str]) -> tuple[str, ...]:
    """The body fields whose hashes differ between two fingerprints."""
    return tuple(sorted(k for k in first.keys() | second.keys() if first.get(k) != second.get(k)))


class FirstAnswers(Protocol):
    """The first answer of each run event: what ``api/runs.py`` asks of a backend.

    Every method raises ``AnswersUnavailable`` when the database does not answer."""

    async def open(self) -> None:
        """Connect, and create the table if it is not there."""

    async def close(self) -> None:
        """Release the connection."""

    async def claim(
        self, run_id: str, action: str, agent: str, fingerprint: dict[str, str], now: float
    ) -> Claim:
        """Record the request in flight, or say why not (see ``Claim``); ``now`` in epoch
        seconds (the in-flight record's age is measured against it)."""

    async def answered(self, run_id: str, action: str, status: int, answer: dict[str, Any]) -> None:
        """Keep the first answer of a run event."""

    async def abandon(self, run_id: str, action: str) -> None:
        """Forget an in-flight request whose publish failed: a retry publishes afresh."""


def open_answers(dsn: str, stale_s: float) -> FirstAnswers:
    """The first answers in the database the DSN names (unopened): ``sqlite:///path`` or
    ``postgresql://...``; ``ValueError`` for any other."""
    if dsn.startswith(POSTGRES_SCHEMES):
        from api.idempotency.postgres import PostgresAnswers

        return PostgresAnswers(dsn, stale_s)
    if dsn.startswith("sqlite://"):
        from api.idempotency.sqlite import SqliteAnswers

        return SqliteAnswers(dsn, stale_s)
    raise ValueError(
        "LEDGER_API__DSN must be sqlite:///path or postgresql://... "
        "(the API's idempotency database)"
    )


__all__ = [
    "AnswersUnavailable",
    "Claim",
    "FirstAnswers",
    "differing",
    "open_answers",
]
