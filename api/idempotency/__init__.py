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

Two backends keep the ``first_answers`` table, chosen by the DSN's scheme (``open_answers``;
the interface they share is api/idempotency/contract.py):
SQLite (``sqlite:///path``, api/idempotency/sqlite.py: API processes on one machine) and
PostgreSQL (``postgresql://...``, api/idempotency/postgres.py: API processes on several
machines sharing one server). Both hold the same contract (tests/api/test_first_answers.py
runs it on each).
"""

from __future__ import annotations

from api.idempotency.contract import AnswersUnavailable, Claim, FirstAnswers, differing

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


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
