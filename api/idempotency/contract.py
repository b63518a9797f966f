"""What every first-answers backend is and answers: ``FirstAnswers``, ``Claim``,
``AnswersUnavailable`` (the semantics: api/idempotency/__init__.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol


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
    ticket: Any = None  # "new" from a journaled reserve (api/idempotency/sqlite.py)


def differing(first: dict[str, str], second: dict[str, str]) -> tuple[str, ...]:
    """The body fields whose hashes differ between two fingerprints."""
    return tuple(sorted(k for k in first.keys() | second.keys() if first.get(k) != second.get(k)))


def judged(
    agent: str,
    fingerprint: dict[str, str],
    record: tuple[str, str, str, int | None, str | None],
) -> Claim | None:
    """What an existing record (its agent, fingerprint JSON, state, status, answer JSON)
    says of a new request: a conflict, the first answer again, or None while the record
    is in flight (each backend judges staleness itself)."""
    their_agent, theirs, state, status, answer = record
    if their_agent != agent:
        return Claim("conflict", agent=their_agent)
    fields = differing(json.loads(theirs), fingerprint)
    if fields:
        return Claim("conflict", fields=fields)
    if state == "done":
        return Claim("replay", status=status, answer=json.loads(answer or "null"))
    return None


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
