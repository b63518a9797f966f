"""Two real ``ledger api`` processes sharing one PostgreSQL for their first answers: the
same run id sent to both at once is published once (one run record in the log), and
either process answers what the first request got."""

from __future__ import annotations

import asyncio

import httpx

from config.settings import Settings
from events.delivery import DeliveryRequested
from events.execution import RunSucceeded
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.broker import ReadTopic
from tests.fixtures.postgres import DsnFactory

RUNS = ("race-1", "race-2", "race-3")


def complete(result: str = "sha256:race") -> dict[str, object]:
    return {
        "result_hash": result,
        "deliveries": [
            {"channel": "webhook", "recipient": "https://hooks.example/r", "payload": {"n": 1}}
        ],
    }


async def test_two_api_processes_on_one_postgresql_publish_a_run_once(
    settings: Settings,
    api_factory: ApiFactory,
    read_topic: ReadTopic,
    postgres_factory: DsnFactory,
) -> None:
    _, token = await new_key(settings, "agent-race")
    dsn = postgres_factory()
    apis = await asyncio.gather(
        *(asyncio.to_thread(api_factory.start, settings, {"api.dsn": dsn}) for _ in range(2))
    )
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(base_url=apis[0].url, headers=auth, timeout=30) as one,
        httpx.AsyncClient(base_url=apis[1].url, headers=auth, timeout=30) as two,
    ):
        for run in RUNS:
            answers = await asyncio.gather(
                *(http.post(f"/v1/runs/{run}/complete", json=complete()) for http in (one, two) * 4)
            )
            assert {r.status_code for r in answers} <= {201, 409}, [r.text for r in answers]
            firsts = [r for r in answers if r.status_code == 201]
            assert firsts, [r.text for r in answers]
            for refused in (r for r in answers if r.status_code == 409):
                assert "in flight" in refused.json()["error"]
                assert refused.headers["Retry-After"] == "1"
            # Afterwards each process answers the first answer, and refuses another body.
            for http in (one, two):
                again = await http.post(f"/v1/runs/{run}/complete", json=complete())
                assert again.status_code == 201
                assert again.headers["Idempotent-Replayed"] == "true"
                assert again.json() == firsts[0].json()
                other = await http.post(f"/v1/runs/{run}/complete", json=complete("sha256:x"))
                assert (other.status_code, other.json()["field"]) == (409, "result_hash")

    runs = [e for e in await read_topic(settings.kafka.topic_runs) if isinstance(e, RunSucceeded)]
    assert sorted(r.run_id for r in runs) == sorted(RUNS)
    requests = await read_topic(settings.kafka.topic_deliveries)
    asked = [r.run_id for r in requests if isinstance(r, DeliveryRequested)]
    assert sorted(asked) == sorted(RUNS)
    for api in apis:
        assert "Traceback" not in api.output(), api.output()
