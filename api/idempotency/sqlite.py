"""First answers in SQLite (one file under the data dir, WAL): API processes on one machine.

Called on the event loop itself: each call is one indexed row read or write of tens of
microseconds, less than the hop to a thread and back would cost (bench/http_ingest.py
measured 0.5 ms of CPU per run more with a thread, and a wake-up of that thread per call
on a busy machine). Several API processes may share the file on one machine: a write
holds its lock for one such call, and a call that waits longer than ``BUSY_S`` for it
fails the request with 503.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from api.idempotency.contract import AnswersUnavailable, Claim, differing

BUSY_S = 1.0


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
            if their_agent != agent:
                return Claim("conflict", agent=their_agent)
            fields = differing(json.loads(theirs), fingerprint)
            if fields:
                return Claim("conflict", fields=fields)
            if state == "done":
                return Claim("replay", status=status, answer=json.loads(answer))
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
