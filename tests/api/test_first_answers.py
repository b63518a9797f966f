"""The first-answers contract (api/idempotency), run on each backend: SQLite and PostgreSQL.
Two stores on one database stand for two API processes; tests/api/test_shared_answers.py
races two real ``ledger api`` processes over one PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from api.idempotency import AnswersUnavailable, Claim, FirstAnswers, open_answers
from tests.fixtures.own_postgres import OwnPostgres
from tests.fixtures.postgres import BACKENDS, _url, _with_dbname

STALE_S = 30.0
AGENT = "agent-a"
BODY = {"result_hash": "h1", "deliveries": "d1"}
ANSWER = {"run_id": "r", "deliveries": [{"idempotency_key": "k"}]}
Stores = Callable[[], FirstAnswers]


@pytest.fixture(scope="module")
def answers_database(postgres_dsn: str) -> Iterator[str]:
    """One PostgreSQL database for the module (each test claims run ids of its own)."""
    name = f"ledger_answers_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield _url(_with_dbname(postgres_dsn, name))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    """Opened stores on one database of the backend (closed after the test)."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("answers_database")
    else:
        dsn = f"sqlite://{tmp_path / 'api.sqlite3'}"
    opened: list[FirstAnswers] = []

    def store() -> FirstAnswers:
        answers = open_answers(dsn, STALE_S)
        opened.append(answers)
        return answers

    yield store
    for answers in opened:
        await answers.close()


async def opened(stores: Stores) -> FirstAnswers:
    answers = stores()
    await answers.open()
    return answers


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


async def test_the_same_request_replays_and_a_different_one_conflicts(stores: Stores) -> None:
    answers = await opened(stores)
    run = run_id()
    assert await answers.claim(run, "complete", AGENT, BODY, 100.0) == Claim("new")
    await answers.answered(run, "complete", 201, ANSWER)
    for _ in range(2):
        assert await answers.claim(run, "complete", AGENT, BODY, 101.0) == Claim(
            "replay", status=201, answer=ANSWER
        )
    other = {**BODY, "result_hash": "h2"}
    assert await answers.claim(run, "complete", AGENT, other, 102.0) == Claim(
        "conflict", fields=("result_hash",)
    )
    assert await answers.claim(run, "complete", "agent-b", BODY, 103.0) == Claim(
        "conflict", agent=AGENT
    )
    # Another event of the same run is answered on its own.
    assert await answers.claim(run, "start", AGENT, {}, 104.0) == Claim("new")
    # The record is the database's: another process (store) answers the same.
    second = await opened(stores)
    assert await second.claim(run, "complete", AGENT, BODY, 105.0) == Claim(
        "replay", status=201, answer=ANSWER
    )


async def test_in_flight_abandoned_and_stale_claims(stores: Stores) -> None:
    first, second = await opened(stores), await opened(stores)
    run = run_id()
    assert await first.claim(run, "complete", AGENT, BODY, 100.0) == Claim("new")
    assert await second.claim(run, "complete", AGENT, BODY, 101.0) == Claim("in_flight")
    other = {**BODY, "deliveries": "d2"}
    assert await second.claim(run, "complete", AGENT, other, 101.0) == Claim(
        "conflict", fields=("deliveries",)
    )
    # A publish that failed forgets its record: the retry publishes afresh.
    await first.abandon(run, "complete")
    assert await second.claim(run, "complete", AGENT, BODY, 102.0) == Claim("new")
    # The process holding it died: once stale, the same request takes it over, once.
    later = 102.0 + STALE_S
    assert await first.claim(run, "complete", AGENT, BODY, later - 1) == Claim("in_flight")
    assert await first.claim(run, "complete", AGENT, other, later) == Claim(
        "conflict", fields=("deliveries",)
    )
    assert await first.claim(run, "complete", AGENT, BODY, later) == Claim("new")
    assert await second.claim(run, "complete", AGENT, BODY, later) == Claim("in_flight")
    await first.answered(run, "complete", 201, ANSWER)
    # An answer, once kept, is not abandoned by a late failure report.
    await second.abandon(run, "complete")
    assert await second.claim(run, "complete", AGENT, BODY, later) == Claim(
        "replay", status=201, answer=ANSWER
    )


async def test_of_concurrent_first_requests_from_two_stores_exactly_one_is_new(
    stores: Stores,
) -> None:
    first, second = await opened(stores), await opened(stores)
    for _ in range(3):
        run = run_id()
        claims = await asyncio.gather(
            *(
                store.claim(run, "complete", AGENT, BODY, 100.0)
                for _ in range(8)
                for store in (first, second)
            )
        )
        assert sorted(c.kind for c in claims) == ["in_flight"] * 15 + ["new"]


async def test_a_postgresql_restart_is_ridden_out(own_postgres: OwnPostgres) -> None:
    """The connection a restart cut is replaced at the next call: no request fails for it;
    while the server is down, a call is AnswersUnavailable (503), not a hang."""
    answers = open_answers(own_postgres.dsn, STALE_S)
    await answers.open()
    try:
        assert await answers.claim("r1", "complete", AGENT, BODY, 100.0) == Claim("new")
        await asyncio.to_thread(own_postgres.restart)
        assert await answers.claim("r1", "complete", AGENT, BODY, 101.0) == Claim("in_flight")
        await answers.answered("r1", "complete", 201, ANSWER)
        await asyncio.to_thread(own_postgres.stop)
        with pytest.raises(AnswersUnavailable, match="idempotency database did not answer"):
            await answers.claim("r2", "complete", AGENT, BODY, 102.0)
        await asyncio.to_thread(own_postgres.start)
        assert await answers.claim("r1", "complete", AGENT, BODY, 103.0) == Claim(
            "replay", status=201, answer=ANSWER
        )
    finally:
        await answers.close()
