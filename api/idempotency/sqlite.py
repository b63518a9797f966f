"""First answers in SQLite (one file under the data dir, WAL): API processes on one machine.

Called on the event loop itself: each call is one indexed row read or write of tens of
microseconds, less than the hop to a thread and back would cost (bench/http_ingest.py
measured 0.5 ms of CPU per run more with a thread, and a wake-up of that thread per call
on a busy machine). Several API processes may share the file on one machine: a write
holds its lock for one such call, and a call that waits longer than ``BUSY_S`` for it
fails the request with 503.

With the group commit (``SqliteAnswers`` is the ``Journal`` of the API's publisher,
clients/group_commit.py): a request only reads its record (``reserve``: an indexed row,
and this process's own requests in flight, in memory); one SQLite transaction records the
in-flight fingerprints of every run of a Kafka transaction before anything of it is sent
(``prepare``), one more their answers after its commit, before any caller gets one
(``committed``): two write transactions per batch instead of two per request (the profile
and the figures: BENCHMARKS.md, issue 28 item 1). Of two processes that read "new" for the
same run event, ``prepare`` records it for one (``ON CONFLICT DO NOTHING``, a stale takeover
by compare-and-set on ``started_at``); the other's request is reserved again
(``ClaimLost``) and answered from that record.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.idempotency.contract import AnswersUnavailable, Claim, differing, judged

BUSY_S = 1.0
log = logging.getLogger("ledger.api")


class ClaimLost(Exception):
    """Another process recorded the run event between this one's ``reserve`` and its
    batch's ``prepare``: nothing was sent; reserve it again (then its record answers)."""


@dataclass(eq=False)
class Ticket:
    """A request reserved "new": what the batch's writes record for it (the group commit
    carries it beside the run), and its answer once committed."""

    run_id: str
    action: str
    agent: str
    fingerprint: str  # JSON of the per-field hashes
    started_at: float
    answer_of: Callable[[], dict[str, Any]]
    taking_over: float | None = None  # the stale record's started_at it replaces
    status: int = 201
    recorded: bool = False  # its in-flight record is written
    answer: dict[str, Any] | None = None  # set once committed


SCHEMA = """
CREATE TABLE IF NOT EXISTS first_answers (
  run_id TEXT NOT NULL,
  action TEXT NOT NULL,
  agent TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  state TEXT NOT NULL,
  started_at REAL NOT NULL,
  status INTEGER,
  answer TEXT,
  PRIMARY KEY (run_id, action)
)
"""


class SqliteAnswers:
    """The ``first_answers`` table of one SQLite file (``FirstAnswers``)."""

    def __init__(self, dsn: str, stale_s: float) -> None:
        if not dsn.startswith("sqlite://"):
            raise ValueError("a SQLite DSN is sqlite:///path (the API's idempotency database)")
        self._path = Path(dsn.removeprefix("sqlite://"))
        self._stale_s = stale_s
        self._db: sqlite3.Connection | None = None
        # This process's reserved requests: (run_id, action) -> agent, fingerprint.
        self._mine: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}
        self.batches = 0  # write transactions of ``prepare`` (bench, tests)

    async def _call(self, work: Any, *args: Any) -> Any:
        try:
            return work(*args)
        except sqlite3.OperationalError as exc:  # locked past BUSY_S, disk full, ...
            raise AnswersUnavailable(f"the idempotency database did not answer: {exc}") from None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self._path, isolation_level=None, timeout=BUSY_S)
            db.execute("PRAGMA journal_mode=WAL")
            # A commit survives a crash of this process (not of the machine's power): the
            # answer is also in the log, and a lost record only re-publishes, deduped by key.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(SCHEMA)
            self._db = db
        return self._db

    async def open(self) -> None:
        """Create the file and the table if they are not there."""
        await self._call(self._conn)

    async def close(self) -> None:
        """Close the connection."""

        def closing() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        closing()

    async def claim(
        self, run_id: str, action: str, agent: str, fingerprint: dict[str, str], now: float
    ) -> Claim:
        """Record the request in flight, or say why not (see ``Claim``)."""
        result: Claim = await self._call(self._claim, run_id, action, agent, fingerprint, now)
        return result

    def _claim(
        self, run_id: str, action: str, agent: str, fingerprint: dict[str, str], now: float
    ) -> Claim:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT agent, fingerprint, state, started_at, status, answer "
                "FROM first_answers WHERE run_id = ? AND action = ?",
                (run_id, action),
            ).fetchone()
            mine = json.dumps(fingerprint, sort_keys=True)
            if row is None:
                db.execute(
                    "INSERT INTO first_answers VALUES (?, ?, ?, ?, 'in_flight', ?, NULL, NULL)",
                    (run_id, action, agent, mine, now),
                )
                return Claim("new")
            their_agent, theirs, state, started_at, status, answer = row
            verdict = judged(agent, fingerprint, (their_agent, theirs, state, status, answer))
            if verdict is not None:
                return verdict
            if now - started_at < self._stale_s:
                return Claim("in_flight")
            db.execute(
                "UPDATE first_answers SET started_at = ? WHERE run_id = ? AND action = ?",
                (now, run_id, action),
            )
            return Claim("new")
        finally:
            db.execute("COMMIT")

    async def answered(self, run_id: str, action: str, status: int, answer: dict[str, Any]) -> None:
        """Keep the first answer of a run event."""
        await self._call(self._answered, run_id, action, status, json.dumps(answer))

    def _answered(self, run_id: str, action: str, status: int, answer: str) -> None:
        self._conn().execute(
            "UPDATE first_answers SET state = 'done', status = ?, answer = ? "
            "WHERE run_id = ? AND action = ?",
            (status, answer, run_id, action),
        )

    async def abandon(self, run_id: str, action: str) -> None:
        """Forget an in-flight request whose publish failed: a retry publishes afresh."""
        await self._call(self._abandon, run_id, action)

    def _abandon(self, run_id: str, action: str) -> None:
        self._conn().execute(
            "DELETE FROM first_answers WHERE run_id = ? AND action = ? AND state = 'in_flight'",
            (run_id, action),
        )

    async def reserve(
        self,
        run_id: str,
        action: str,
        agent: str,
        fingerprint: dict[str, str],
        now: float,
        answer_of: Callable[[], dict[str, Any]],
    ) -> Claim:
        """``claim`` without a write: what the records say about a new request; for
        "new", a ticket to publish with through the journaled publisher (``answer_of``
        makes its answer once committed), and ``release`` after."""
        mine = self._mine.get((run_id, action))
        if mine is not None:  # this process publishes it right now
            their_agent, theirs = mine
            if their_agent != agent:
                return Claim("conflict", agent=their_agent)
            if fields := differing(theirs, fingerprint):
                return Claim("conflict", fields=fields)
            return Claim("in_flight")
        try:
            row = (
                self._conn()
                .execute(
                    "SELECT agent, fingerprint, state, started_at, status, answer "
                    "FROM first_answers WHERE run_id = ? AND action = ?",
                    (run_id, action),
                )
                .fetchone()
            )
        except sqlite3.Error as exc:  # locked past BUSY_S, disk full, ...
            raise AnswersUnavailable(f"the idempotency database did not answer: {exc}") from None
        taking_over = None
        if row is not None:
            their_agent, theirs, state, started_at, status, answer = row
            verdict = judged(agent, fingerprint, (their_agent, theirs, state, status, answer))
            if verdict is not None:
                return verdict
            if now - started_at < self._stale_s:
                return Claim("in_flight")
            taking_over = started_at
        self._mine[(run_id, action)] = (agent, fingerprint)
        ticket = Ticket(
            run_id,
            action,
            agent,
            json.dumps(fingerprint, sort_keys=True),
            now,
            answer_of,
            taking_over=taking_over,
        )
        return Claim("new", ticket=ticket)

    def prepare(self, tickets: list[Any]) -> dict[int, BaseException]:
        """``Journal.prepare``: the in-flight records of a batch, in one transaction; a
        run event another process recorded since its claim is left out (``ClaimLost``)."""
        lost: dict[int, BaseException] = {}
        try:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                for index, ticket in enumerate(tickets):
                    if ticket.taking_over is None:
                        done = db.execute(
                            "INSERT INTO first_answers VALUES "
                            "(?, ?, ?, ?, 'in_flight', ?, NULL, NULL) ON CONFLICT DO NOTHING",
                            (ticket.run_id, ticket.action, ticket.agent, ticket.fingerprint,
                             ticket.started_at),
                        )  # fmt: skip
                    else:  # only if it is still the stale record the claim read
                        done = db.execute(
                            "UPDATE first_answers SET started_at = ? WHERE run_id = ? AND "
                            "action = ? AND state = 'in_flight' AND started_at = ?",
                            (ticket.started_at, ticket.run_id, ticket.action, ticket.taking_over),
                        )
                    if done.rowcount != 1:
                        lost[index] = ClaimLost(f"run {ticket.run_id}: '{ticket.action}'")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:  # locked past BUSY_S, disk full, ...
            error = AnswersUnavailable(f"the idempotency database did not answer: {exc}")
            return dict.fromkeys(range(len(tickets)), error)
        self.batches += 1
        for index, ticket in enumerate(tickets):
            ticket.recorded = index not in lost
        return lost

    def committed(self, tickets: list[Any]) -> None:
        """``Journal.committed``: the answers of a committed batch, in one transaction,
        before any of its callers gets one. Not recorded (the database failed): the
        callers still get their answers; a repeat then finds the run in flight, and once
        stale publishes it again (the log dedupes its deliveries by key)."""
        for ticket in tickets:
            ticket.answer = ticket.answer_of()
        try:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "UPDATE first_answers SET state = 'done', status = ?, answer = ? "
                    "WHERE run_id = ? AND action = ?",
                    [(t.status, json.dumps(t.answer), t.run_id, t.action) for t in tickets],
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            names = ", ".join(f"{t.run_id} {t.action}" for t in tickets[:5])
            log.warning("answered but not recorded (%s): %s", names, exc)

    def release(self, ticket: Ticket) -> None:
        """The request of ``ticket`` is over: no longer in flight here; not committed, its
        record goes, so a retry publishes afresh (a record that cannot be removed goes
        stale instead)."""
        self._mine.pop((ticket.run_id, ticket.action), None)
        if ticket.answer is not None or not ticket.recorded:
            return
        try:
            self._conn().execute(
                "DELETE FROM first_answers WHERE run_id = ? AND action = ? "
                "AND state = 'in_flight' AND started_at = ?",
                (ticket.run_id, ticket.action, ticket.started_at),
            )
        except sqlite3.Error as exc:
            log.warning("run %s: %s not forgotten: %s", ticket.run_id, ticket.action, exc)
