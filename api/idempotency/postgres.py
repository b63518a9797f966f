"""First answers in PostgreSQL: API processes on several machines sharing one server.

Each call is ONE statement on the process's one connection (psycopg's async connection
queues concurrent requests' statements; a statement is a round trip of a fraction of a
millisecond, so one connection carries the API's rate). A claim is a single
``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``: PostgreSQL inserts the record, or locks
the existing one and returns it as it stands after any concurrent claim committed, so of
two processes claiming one run event at once exactly one gets ``new`` and the other sees
its record in flight; of two taking over one stale record, the second sees the first's
fresh claim.

Each claim carries a random token stored in the record: when the connection breaks under
a statement (a server restart, a failover) the statement is sent once more on a new
connection, and a claim that had in fact committed is then recognised as this request's
own instead of "in flight". The other statements are idempotent as they are. A second
failure, or a server that does not answer within ``CALL_S``, is ``AnswersUnavailable``
(503, nothing published); the next call connects afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import psycopg

from api.idempotency.contract import AnswersUnavailable, Claim, judged
from events.outage import config_problem
from projections.database import redacted

CALL_S = 5.0
CONNECT_S = 5
# pg_advisory_xact_lock key: API processes starting at once create the table one by one
# (CREATE TABLE IF NOT EXISTS races on the catalog otherwise).
_CREATE_LOCK = 0x1ED6A1
_LOST = (psycopg.OperationalError, psycopg.InterfaceError, OSError, TimeoutError)

SCHEMA = """
CREATE TABLE IF NOT EXISTS first_answers (
  run_id TEXT COLLATE "C" NOT NULL,
  action TEXT COLLATE "C" NOT NULL,
  agent TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  state TEXT NOT NULL,
  started_at DOUBLE PRECISION NOT NULL,
  status INTEGER,
  answer TEXT,
  claim TEXT NOT NULL,
  PRIMARY KEY (run_id, action)
)
"""

# The record as it stands after this statement: ours (inserted, or a stale record of the
# same request taken over) when its claim token is ours.
_CLAIM = """
INSERT INTO first_answers AS f
  (run_id, action, agent, fingerprint, state, started_at, claim)
VALUES (%(run_id)s, %(action)s, %(agent)s, %(fingerprint)s, 'in_flight', %(now)s, %(claim)s)
ON CONFLICT (run_id, action) DO UPDATE SET
  started_at = CASE WHEN {takeover} THEN excluded.started_at ELSE f.started_at END,
  claim = CASE WHEN {takeover} THEN excluded.claim ELSE f.claim END
RETURNING f.agent, f.fingerprint, f.state, f.status, f.answer, f.claim
""".format(
    takeover=(
        "(f.state = 'in_flight' AND f.agent = excluded.agent"
        " AND f.fingerprint = excluded.fingerprint"
        " AND f.started_at <= excluded.started_at - %(stale_s)s)"
    )
)
_ANSWERED = (
    "UPDATE first_answers SET state = 'done', status = %s, answer = %s "
    "WHERE run_id = %s AND action = %s"
)
_ABANDON = "DELETE FROM first_answers WHERE run_id = %s AND action = %s AND state = 'in_flight'"


class PostgresAnswers:
    """The ``first_answers`` table of one PostgreSQL database (``FirstAnswers``)."""

    def __init__(self, dsn: str, stale_s: float) -> None:
        self._dsn = dsn
        self._stale_s = stale_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._connecting = asyncio.Lock()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        async with self._connecting:  # concurrent requests after a loss share one connect
            if self._conn is None or self._conn.closed or self._conn.broken:
                try:
                    async with asyncio.timeout(CALL_S):
                        self._conn = await psycopg.AsyncConnection.connect(
                            self._dsn, autocommit=True, connect_timeout=CONNECT_S
                        )
                except (*_LOST, psycopg.ProgrammingError) as exc:
                    raise AnswersUnavailable(self._why(exc, "cannot connect to")) from None
            return self._conn

    def _why(self, exc: BaseException, doing: str) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "check the DSN" if config_problem(exc) else "is PostgreSQL running?"
        where = redacted(self._dsn)
        return f"the idempotency database did not answer ({doing} {where}: {text}; {hint})"

    async def _drop(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._conn is conn:
            self._conn = None
        with contextlib.suppress(*_LOST, psycopg.Error):
            await conn.close()

    async def _run(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        """One statement; its rows. Sent again once on a new connection if the one it
        went out on was lost (see the module's docstring)."""
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                async with asyncio.timeout(CALL_S):
                    cursor = await conn.execute(sql, params)
                    return await cursor.fetchall() if cursor.description else []
            except _LOST as exc:
                await self._drop(conn)
                # A server that did not answer in CALL_S is not waited for twice.
                if attempt == 2 or isinstance(exc, TimeoutError):
                    raise AnswersUnavailable(self._why(exc, "at")) from None
        raise AssertionError("unreachable")

    async def open(self) -> None:
        """Connect, and create the table if it is not there."""
        conn = await self._connection()
        try:
            async with asyncio.timeout(CALL_S), conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
                await conn.execute(SCHEMA)
        except _LOST as exc:
            await self._drop(conn)
            raise AnswersUnavailable(self._why(exc, "at")) from None
        except psycopg.Error as exc:  # no right to create it, ...
            raise AnswersUnavailable(self._why(exc, "creating first_answers at")) from None

    async def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            await self._drop(self._conn)

    async def claim(
        self, run_id: str, action: str, agent: str, fingerprint: dict[str, str], now: float
    ) -> Claim:
        """Record the request in flight, or say why not (see ``Claim``)."""
        mine = uuid.uuid4().hex
        [(their_agent, theirs, state, status, answer, claim)] = await self._run(
            _CLAIM,
            {
                "run_id": run_id,
                "action": action,
                "agent": agent,
                "fingerprint": json.dumps(fingerprint, sort_keys=True),
                "now": now,
                "claim": mine,
                "stale_s": self._stale_s,
            },
        )
        if claim == mine:
            return Claim("new")
        verdict = judged(agent, fingerprint, (their_agent, theirs, state, status, answer))
        return verdict or Claim("in_flight")

    async def answered(self, run_id: str, action: str, status: int, answer: dict[str, Any]) -> None:
        """Keep the first answer of a run event."""
        await self._run(_ANSWERED, (status, json.dumps(answer), run_id, action))

    async def abandon(self, run_id: str, action: str) -> None:
        """Forget an in-flight request whose publish failed: a retry publishes afresh."""
        await self._run(_ABANDON, (run_id, action))
