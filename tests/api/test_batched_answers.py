"""SQLite's first answers written with the group commit (api/idempotency/sqlite.py, the
publisher's journal): one SQLite transaction per Kafka transaction, each request its own
answer, and the records right across processes (two API processes sharing the file, a
restart, a dead process). The contract every backend keeps: test_first_answers.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from api.idempotency.sqlite import ClaimLost, SqliteAnswers, Ticket
from clients import DeliverySpec, Publisher
from config.settings import Settings
from events import RunSucceeded
from tests.fixtures.broker import ReadTopic


def answer(run_id: str) -> Any:
    return lambda: {"run_id": run_id, "event": "run.succeeded"}


async def test_a_batch_of_first_requests_commits_once_and_each_gets_its_own_answer(
    settings: Settings, read_topic: ReadTopic, tmp_path: Path
) -> None:
    dsn = f"sqlite://{tmp_path / 'api.sqlite3'}"
    answers = SqliteAnswers(dsn, 60.0)
    await answers.open()
    runs = [f"run-batch-{n}" for n in range(12)]

    async with Publisher(settings, producer_name="api", journal=answers) as publisher:

        async def request(run_id: str) -> Ticket:
            claim = await answers.reserve(
                run_id, "complete", "agent", {"x": run_id}, 1.0, answer(run_id)
            )
            assert claim.kind == "new"
            ticket: Ticket = claim.ticket
            spec = DeliverySpec(channel="webhook", recipient=f"http://127.0.0.1:9/{run_id}")
            requests = publisher.check_run_succeeded(run_id, "h", [spec])
            try:
                await publisher.publish_checked(run_id, "h", requests, ticket=ticket)
            finally:
                answers.release(ticket)
            return ticket

        tickets = await asyncio.gather(*(request(run_id) for run_id in runs))
        assert publisher.transactions_committed == 1
    # One write transaction of in-flight records for the whole batch (and one of answers).
    assert answers.batches == 1
    assert [t.answer and t.answer["run_id"] for t in tickets] == runs
    committed = await read_topic(settings.kafka.topic_runs)
    assert sorted(e.run_id for e in committed if isinstance(e, RunSucceeded)) == sorted(runs)
    await answers.close()

    # Another process on the file (a restart): the first answers, and a conflict.
    again = SqliteAnswers(dsn, 60.0)
    replay = await again.reserve(runs[3], "complete", "agent", {"x": runs[3]}, 2.0, answer("no"))
    assert (replay.kind, replay.status, replay.answer) == ("replay", 201, tickets[3].answer)
    other = await again.reserve(runs[3], "complete", "agent", {"x": "other"}, 2.0, answer("no"))
    assert (other.kind, other.fields) == ("conflict", ("x",))
    await again.close()


async def test_two_processes_claiming_one_run_record_it_once_and_a_dead_ones_goes_stale(
    tmp_path: Path,
) -> None:
    dsn = f"sqlite://{tmp_path / 'api.sqlite3'}"
    first, second = SqliteAnswers(dsn, 5.0), SqliteAnswers(dsn, 5.0)
    printed = {"result_hash": "a"}
    mine = await first.reserve("run-1", "complete", "agent", printed, 10.0, answer("run-1"))
    theirs = await second.reserve("run-1", "complete", "agent", printed, 10.0, answer("run-1"))
    assert mine.ticket is not None
    assert theirs.ticket is not None
    # This process's own second request is in flight without reading the file.
    assert (await first.reserve("run-1", "complete", "agent", printed, 10.0, answer(""))).kind == (
        "in_flight"
    )

    assert first.prepare([mine.ticket]) == {}
    [(index, lost)] = second.prepare([theirs.ticket]).items()
    assert index == 0
    assert isinstance(lost, ClaimLost)
    second.release(theirs.ticket)  # lost: the record stays the first process's
    assert (await second.reserve("run-1", "complete", "agent", printed, 11.0, answer(""))).kind == (
        "in_flight"
    )
    first.committed([mine.ticket])
    first.release(mine.ticket)
    replay = await second.reserve("run-1", "complete", "agent", printed, 12.0, answer(""))
    assert replay.kind == "replay"
    assert replay.answer == {
        "run_id": "run-1",
        "event": "run.succeeded",
    }

    # A process that recorded a run and died: in flight until stale, then taken over once;
    # a different body is a conflict all along.
    dead = await first.reserve("run-2", "complete", "agent", printed, 20.0, answer("run-2"))
    assert dead.ticket is not None
    assert first.prepare([dead.ticket]) == {}
    assert (await second.reserve("run-2", "complete", "agent", printed, 21.0, answer(""))).kind == (
        "in_flight"
    )
    other = await second.reserve(
        "run-2", "complete", "agent", {"result_hash": "b"}, 30.0, answer("")
    )
    assert other.kind == "conflict"
    late = await second.reserve("run-2", "complete", "agent", printed, 30.0, answer("run-2"))
    assert late.ticket is not None
    assert late.ticket.taking_over == 20.0
    assert second.prepare([late.ticket]) == {}
    # The failed publish of the one taking over removes its record: a retry publishes afresh.
    second.release(late.ticket)
    third = SqliteAnswers(dsn, 5.0)
    again = await third.reserve(
        "run-2", "complete", "agent", {"result_hash": "b"}, 31.0, answer("")
    )
    assert again.kind == "new"
    for answers in (first, second, third):
        await answers.close()
