"""A run published over HTTP is delivered exactly once, to a receiver that does NOT
dedupe, and shows in the projection and the dashboard's run view like an SDK run (the
dashboard served by the same process: ``ledger api --with-dashboard``)."""

from __future__ import annotations

import asyncio

import httpx

from clients import DeliverySpec, Publisher
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, wait_for


async def test_a_run_published_over_http_is_delivered_once_like_an_sdk_run(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    live_projection: LiveProjection,
    api_factory: ApiFactory,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = live_projection.settings = settings
    _, token = await new_key(settings, "agent-http")
    _, sdk_token = await new_key(settings, "agent-sdk")  # the SDK run's producer
    live_projection.start()

    async def projecting() -> bool:
        try:
            await asyncio.to_thread(live_projection.statuses)
        except Exception:  # the projector has not created its tables yet
            return False
        return True

    await wait_for(projecting, 60, "the live projection's tables")
    served = {"projection.dsn": live_projection.dsn, "dashboard.port": 0}
    api = api_factory.start(settings, served, "--with-dashboard")
    worker_factory.start("w1")

    body = {
        "result_hash": "sha256:http",
        "deliveries": [
            {
                "channel": "webhook",
                "recipient": receiver.webhook_url("http"),
                "payload": {"text": "report ready"},
                "event_type": "report.ready",
            }
        ],
    }
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api.url, headers=auth, timeout=30) as http:
        posted = await http.post("/v1/runs/run-http/complete", json=body)
        assert posted.status_code == 201, posted.text
        [accepted] = posted.json()["deliveries"]
        key = accepted["idempotency_key"]
        async with Publisher(settings, producer_name="agent-sdk") as publisher:
            [sdk] = await publisher.run_succeeded(
                "run-sdk",
                "sha256:sdk",
                [
                    DeliverySpec(
                        channel="webhook",
                        recipient=receiver.webhook_url("sdk"),
                        payload={"text": "report ready"},
                        event_type="report.ready",
                    )
                ],
            )

        async def confirmed() -> bool:
            answer = await http.get("/v1/runs/run-http")
            if answer.status_code != 200:
                return False
            deliveries = answer.json()["deliveries"]
            statuses = await asyncio.to_thread(live_projection.statuses)
            return [d["status"] for d in deliveries] == ["CONFIRMED"] and statuses.get(
                sdk.idempotency_key, ("",)
            )[0] == "CONFIRMED"

        await wait_for(confirmed, 90, "both runs' deliveries CONFIRMED")
        run = (await http.get("/v1/runs/run-http")).json()
        assert run["execution"] == {
            "status": "SUCCEEDED",
            "finished": True,
            "summary": "finished: succeeded",
            "result_hash": "sha256:http",
            "agent": None,  # RunStarted names the agent; this run never sent one
        }
        [delivery] = run["deliveries"]
        assert delivery["idempotency_key"] == key
        assert delivery["left_system"] == "yes (confirmed)"
        assert delivery["agent"] == "agent-http"
        one = await http.get(f"/v1/deliveries/{key}")
        assert one.status_code == 200
        assert one.json() == delivery
        missing = await http.get("/v1/deliveries/" + "0" * 64)
        assert (missing.status_code, missing.json()["field"]) == (404, "key")

        # Reads answer the key's own agent only: another agent's run and delivery are not
        # found, in the words used for what is not there at all.
        nowhere = await http.get("/v1/runs/run-nowhere")
        theirs = await http.get("/v1/runs/run-sdk")
        assert (theirs.status_code, theirs.json()["field"]) == (404, "run_id")
        assert theirs.json()["error"] == nowhere.json()["error"].replace("nowhere", "sdk")
        their_delivery = await http.get(f"/v1/deliveries/{sdk.idempotency_key}")
        assert their_delivery.status_code == 404
        assert their_delivery.json()["error"] == missing.json()["error"].replace(
            "0" * 64, sdk.idempotency_key
        )
        # A run with no RunStarted and no deliveries is still its publisher's to read.
        bare = await http.post("/v1/runs/run-bare/complete", json={"result_hash": "h"})
        assert bare.status_code == 201, bare.text
        sdk_auth = {"Authorization": f"Bearer {sdk_token}"}
        async with httpx.AsyncClient(base_url=api.url, headers=sdk_auth, timeout=30) as other:
            mine = await other.get("/v1/runs/run-sdk")
            assert (mine.status_code, mine.json()["execution"]["status"]) == (200, "SUCCEEDED")
            assert (await other.get(f"/v1/deliveries/{sdk.idempotency_key}")).status_code == 200
            assert (await other.get("/v1/runs/run-http")).status_code == 404
            assert (await other.get(f"/v1/deliveries/{key}")).status_code == 404

            async def bare_projected() -> bool:
                return (await http.get("/v1/runs/run-bare")).status_code == 200

            await wait_for(bare_projected, 30, "run-bare readable by its publisher")
            assert (await other.get("/v1/runs/run-bare")).status_code == 404

    # Exactly once at a receiver that does not dedupe: one POST, processed once.
    for each in (key, sdk.idempotency_key):
        assert receiver.accepted(each) == 1
        assert len(receiver.requests(key=each, method="POST")) == 1
    # The dashboard's run view tells the two runs apart by nothing but their ids.
    async with httpx.AsyncClient(base_url=api.dashboard_url, timeout=30) as dashboard:
        pages = [(await dashboard.get(f"api/runs/{r}")).json() for r in ("run-http", "run-sdk")]
    shapes = [
        (
            page["answers"]["execution_finished"],
            [(d["channel"], d["status"], d["left_system"]) for d in page["answers"]["deliveries"]],
            [entry["what"].split(",")[0] for entry in page["timeline"]],
        )
        for page in pages
    ]
    assert shapes[0] == shapes[1]
    await live_projection.verify()
