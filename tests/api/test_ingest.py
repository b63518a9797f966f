"""The HTTP ingest API against a real broker, a real ``ledger api`` (uvicorn) process:
Stripe's idempotency by run id, API keys, limits, and every bad input a 4xx naming its
field."""

from __future__ import annotations

import asyncio
import json

import httpx

from clients.api_keys import revoke_key
from config.settings import Settings
from events.execution import RunStarted, RunSucceeded
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import wait_for

HOOK = "https://hooks.example/report"


def complete(result: str = "sha256:r1", recipient: str = HOOK) -> dict[str, object]:
    return {
        "result_hash": result,
        "deliveries": [
            {"channel": "webhook", "recipient": recipient, "payload": {"text": "ready"}}
        ],
    }


async def test_the_same_body_again_gets_the_first_answer_and_is_published_once(
    settings: Settings, api_factory: ApiFactory, read_topic: ReadTopic
) -> None:
    _, token = await new_key(settings, "agent-7")
    api = api_factory.start(settings)
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api.url, headers=auth, timeout=30) as http:
        first = await http.post("/v1/runs/run-1/complete", json=complete())
        assert first.status_code == 201, first.text
        again = await http.post("/v1/runs/run-1/complete", json=complete())
        assert again.status_code == 201
        assert again.json() == first.json()
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in first.headers
        answer = first.json()
        assert answer["agent"] == "agent-7"
        assert answer["event"] == "run.succeeded"
        [delivery] = answer["deliveries"]

        # A different body for the same run: 409, naming what differs.
        other = await http.post("/v1/runs/run-1/complete", json=complete("sha256:r2"))
        assert other.status_code == 409
        assert other.json()["field"] == "result_hash"
        assert "different result_hash" in other.json()["error"]
        moved = await http.post("/v1/runs/run-1/complete", json=complete(recipient=HOOK + "/other"))
        assert moved.status_code == 409
        assert moved.json()["field"] == "deliveries"

        # Concurrent identical requests of a new run: one publish, the others wait or replay.
        answers = await asyncio.gather(
            *(http.post("/v1/runs/run-2/complete", json=complete()) for _ in range(6))
        )
        assert {r.status_code for r in answers} <= {201, 409}
        assert any(r.status_code == 201 for r in answers)
        for refused in (r for r in answers if r.status_code == 409):
            assert "in flight" in refused.json()["error"]
            assert refused.headers["Retry-After"] == "1"

        started = await http.post("/v1/runs/run-3/start")
        assert started.status_code == 201, started.text
        assert started.json()["event"] == "run.started"

    # After a restart (the first answers are in the API's SQLite file): the same body gets
    # the first answer, a different one 409.
    api.stop()
    api = api_factory.start(settings)
    async with httpx.AsyncClient(base_url=api.url, headers=auth, timeout=30) as http:
        after = await http.post("/v1/runs/run-1/complete", json=complete())
        assert after.status_code == 201, after.text
        assert after.json() == first.json()
        assert after.headers["Idempotent-Replayed"] == "true"
        other = await http.post("/v1/runs/run-1/complete", json=complete("sha256:r2"))
        assert other.status_code == 409
        assert other.json()["field"] == "result_hash"

    runs = [e for e in await read_topic(settings.kafka.topic_runs) if isinstance(e, RunSucceeded)]
    assert sorted(r.run_id for r in runs) == ["run-1", "run-2"]
    assert {r.producer for r in runs} == {"agent-7"}
    requests = await read_topic(settings.kafka.topic_deliveries)
    assert sorted(getattr(r, "run_id", "") for r in requests) == ["run-1", "run-2"]
    assert {getattr(r, "producer", "") for r in requests} == {"agent-7"}
    assert delivery["idempotency_key"] in {getattr(r, "idempotency_key", "") for r in requests}
    [begun] = [e for e in await read_topic(settings.kafka.topic_runs) if isinstance(e, RunStarted)]
    assert begun.agent == "agent-7"


async def test_keys_missing_unknown_or_revoked_are_refused(
    settings: Settings, api_factory: ApiFactory
) -> None:
    key_id, token = await new_key(settings, "agent-k")
    _, second = await new_key(settings, "agent-k")  # several keys per agent
    api = api_factory.start(settings)
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
        none = await http.post("/v1/runs/r/complete", json=complete())
        assert none.status_code == 401
        assert none.json()["field"] == "Authorization"
        assert none.headers["WWW-Authenticate"].startswith("Bearer")
        wrong = token[:-4] + "AAAA"
        for bad in ("nonsense", wrong, "dlk_0000000000000000_" + "A" * 43):
            refused = await http.post(
                "/v1/runs/r/complete", json=complete(), headers={"Authorization": f"Bearer {bad}"}
            )
            assert refused.status_code == 401, bad
            assert bad not in refused.text
        ok = await http.post("/v1/runs/r/start", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 201, ok.text

        await revoke_key(settings.kafka, key_id, "test-operator")

        async def refused_now() -> bool:
            answer = await http.post(
                "/v1/runs/r2/start", headers={"Authorization": f"Bearer {token}"}
            )
            return answer.status_code == 401

        await wait_for(refused_now, 20, "the revoked key refused", interval=0.2)
        still = await http.post("/v1/runs/r3/start", headers={"Authorization": f"Bearer {second}"})
        assert still.status_code == 201


async def test_limits_and_bad_input_are_4xx_naming_the_field(
    settings: Settings, api_factory: ApiFactory
) -> None:
    _, token = await new_key(settings)
    api = api_factory.start(
        settings,
        {
            "api.max_body_bytes": 4096,
            "api.max_deliveries_per_run": 2,
            "api.rate_per_key_s": 0.5,
            "api.burst_per_key": 12,
        },
    )
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api.url, headers=auth, timeout=30) as http:
        big = complete()
        big["deliveries"][0]["payload"] = {"text": "x" * 5000}  # type: ignore[index]
        answer = await http.post("/v1/runs/big/complete", json=big)
        assert (answer.status_code, answer.json()["field"]) == (413, "body")
        assert "over the limit of 4096 bytes" in answer.json()["error"]

        many = {
            "result_hash": "h",
            "deliveries": [
                {"channel": "webhook", "recipient": f"{HOOK}/{n}", "payload": {}} for n in range(3)
            ],
        }
        answer = await http.post("/v1/runs/many/complete", json=many)
        assert (answer.status_code, answer.json()["field"]) == (413, "deliveries")

        answer = await http.post(
            "/v1/runs/x/complete",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert (answer.status_code, answer.json()["field"]) == (400, "body")

        answer = await http.post("/v1/runs/x/complete", json={"deliveries": []})
        assert (answer.status_code, answer.json()["field"]) == (422, "result_hash")

        secret = "https://user:hunter2-secret@hooks.example/h"
        answer = await http.post("/v1/runs/x/complete", json=complete(recipient=secret))
        assert answer.status_code == 422
        assert answer.json()["field"] == "deliveries[0].recipient"
        assert "hunter2" not in answer.text

        answer = await http.post("/v1/runs/a:b/complete", json=complete())
        assert (answer.status_code, answer.json()["field"]) == (422, "run_id")

        nested: object = {}
        for _ in range(70):
            nested = {"n": nested}
        deep = complete()
        deep["deliveries"][0]["payload"] = nested  # type: ignore[index]
        answer = await http.post("/v1/runs/deep/complete", json=deep)
        assert (answer.status_code, answer.json()["field"]) == (422, "deliveries[0]")
        assert "nests" in answer.json()["error"]

        answer = await http.post(
            "/v1/runs/nan/complete",
            content=json.dumps(complete()).replace('"ready"', "NaN").encode(),
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code in (400, 422)
        assert answer.json()["field"].startswith(("body", "deliveries[0]"))

        # The rate: a burst of 12 per key, then 0.5/s.
        statuses = [(await http.post(f"/v1/runs/rate-{n}/start")).status_code for n in range(12)]
        assert statuses[-1] == 429
        limited = await http.post("/v1/runs/rate-x/start")
        assert limited.status_code == 429
        assert limited.json()["field"] == "Authorization"
        assert int(limited.headers["Retry-After"]) >= 1
        assert "over its rate" in limited.json()["error"]
