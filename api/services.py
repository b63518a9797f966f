"""What one API process holds while it serves: one shared publisher (so group commit
batches concurrent requests into few Kafka transactions), the API keys followed from the
log, the first answers, the rate limiter, and where the projection is read."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from fastapi import Request

from api.idempotency import AnswersUnavailable, FirstAnswers, open_answers
from api.idempotency.sqlite import SqliteAnswers
from api.limits import RateLimiter
from clients.api_keys import ApiKeyTable
from clients.publisher import Publisher
from config.settings import Settings
from events.errors import LedgerError
from projections.backends import default_dsn

PRODUCER = "ledger-api"
TRANSACTIONAL_PREFIX = "ledger-api-"  # ledger/acls.py grants the api role this prefix


@dataclass
class Services:
    """The API's parts, built from its settings; ``start`` and ``stop`` them."""

    settings: Settings
    publisher: Publisher
    keys: ApiKeyTable
    answers: FirstAnswers
    limiter: RateLimiter
    projection_dsn: str
    clock: Callable[[], datetime]

    @classmethod
    def of(cls, settings: Settings, clock: Callable[[], datetime]) -> Services:
        """Everything the API needs, unstarted."""
        api = settings.api
        transactional_id = api.transactional_id or f"{TRANSACTIONAL_PREFIX}{uuid.uuid4().hex[:12]}"
        answers = open_answers(answers_dsn(settings), api.in_flight_stale_s)
        return cls(
            settings=settings,
            # SQLite's first answers are written with the group commit: one SQLite
            # transaction per Kafka transaction, not per request (api/idempotency/sqlite.py).
            publisher=Publisher(
                settings,
                producer_name=PRODUCER,
                transactional_id=transactional_id,
                journal=answers if isinstance(answers, SqliteAnswers) else None,
                # Whatever LEDGER_PUBLISHER__MODE says: the journal's one write per Kafka
                # transaction, and the requests the answers name, are the transaction's.
                mode="transaction",
            ),
            keys=ApiKeyTable(settings.kafka),
            answers=answers,
            limiter=RateLimiter(api.rate_per_key_s, api.burst_per_key),
            projection_dsn=default_dsn(settings),
            clock=clock,
        )

    async def start(self) -> None:
        """Open the answers and connect the publisher (a database or a broker that does not
        answer: ``LedgerError``), follow the keys."""
        await open_or_say(self.answers)
        await self.publisher.start()
        self.keys.start()

    async def stop(self) -> None:
        """Commit what is queued, stop following, close."""
        await self.publisher.stop()
        await self.keys.stop()
        await self.answers.close()


async def open_or_say(answers: FirstAnswers) -> None:
    """Open the first answers; a database that does not answer is one line and a hint."""
    try:
        await answers.open()
    except AnswersUnavailable as exc:
        raise LedgerError(
            str(exc), "check LEDGER_API__DSN (ledger api --dsn), and that it is up"
        ) from None


def answers_dsn(settings: Settings) -> str:
    """Where the first answers by run id are kept: one database for every process that
    publishes for agents (the API's and the MCP server's, on this machine with SQLite, on
    any with PostgreSQL), so a run id is answered once whichever way it comes."""
    return settings.api.dsn or f"sqlite://{(settings.data_dir / 'api.sqlite3').resolve()}"


def services(request: Request) -> Services:
    """The running app's services."""
    found: Services = request.app.state.services
    return found
