"""The simulator with receiver-kit webhook apps: raw requests counted in front of the kit,
handler runs behind it, the simulator's faults still in front. Requests are signed with the
official ``standardwebhooks`` library, not with our signer."""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from events.contract import fencing_token_signature, secret_key
from ledger.simulator import SimulatorConfig
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.secrets import TEST_WEBHOOK_SECRET
from tests.receiver.support import signed_lookup

Factory = Callable[..., BackgroundSimulator]


def lookup(client: httpx.Client, sim: BackgroundSimulator, key: str) -> httpx.Response:
    """A webhook lookup signed as the worker signs it (the lookup contract)."""
    return client.get(
        f"{sim.webhook_lookup_url}/{key}", headers=signed_lookup(key, TEST_WEBHOOK_SECRET)
    )


def post(
    client: httpx.Client, url: str, key: str, payload: object, *, token: int | None = None
) -> httpx.Response:
    body = json.dumps(payload)
    now = datetime.now(UTC)
    headers = {
        "webhook-id": key,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(TEST_WEBHOOK_SECRET).sign(key, now, body),
        "content-type": "application/json",
    }
    if token is not None:
        headers["fencing-token"] = str(token)
        headers["fencing-token-signature"] = fencing_token_signature(
            [secret_key(TEST_WEBHOOK_SECRET)], key, int(now.timestamp()), token
        )
    return client.post(url, content=body.encode(), headers=headers)


def fresh() -> str:
    return uuid.uuid4().hex


def test_repeats_reach_the_kit_but_the_handler_runs_once(receiver_factory: Factory) -> None:
    kit = receiver_factory(hooks="kit")
    key = fresh()
    with httpx.Client(timeout=5) as client:
        first = post(client, kit.webhook_url("orders"), key, {"n": 1})
        again = [post(client, kit.webhook_url("orders"), key, {"n": 1}) for _ in range(3)]
        found = lookup(client, kit, key)
        missing = lookup(client, kit, fresh())
    assert first.status_code == 200
    assert first.json()["duplicate"] is False
    assert {(r.status_code, r.json()["duplicate"]) for r in again} == {(200, True)}
    assert {r.json()["id"] for r in [first, *again]} == {first.json()["id"]}
    assert len(kit.requests(key=key, method="POST")) == 4  # raw requests, counted in front
    assert kit.accepted(key) == 1  # handler runs, counted behind the kit
    accepted = kit.event(key)
    assert accepted is not None
    assert accepted.received == 4
    assert [r.result for r in kit.requests(key=key, method="POST")] == [
        "accepted",
        "duplicate",
        "duplicate",
        "duplicate",
    ]
    assert (found.status_code, found.json()) == (
        200,
        {"status": "done", "id": first.json()["id"], "webhook_id": key},
    )
    assert missing.status_code == 404


def test_plain_hooks_without_dedupe_run_every_repeat(receiver_factory: Factory) -> None:
    """The same requests against the plain receiver: the variant the kit is compared with."""
    plain = receiver_factory(dedupe=False)
    key = fresh()
    with httpx.Client(timeout=5) as client:
        for _ in range(3):
            assert post(client, plain.webhook_url(), key, {}).status_code == 200
    assert plain.accepted(key) == 3


def test_concurrent_duplicates_run_the_handler_once(receiver_factory: Factory) -> None:
    kit = receiver_factory(hooks="kit")
    key = fresh()
    kit.fault("delay", key=key, delay_s=0.5)  # the first answer is late: the others overlap
    with httpx.Client(timeout=10) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(client, kit.webhook_url(), key, {}), range(8)))
    assert {r.status_code for r in answers} == {200}
    assert len({r.json()["id"] for r in answers}) == 1
    assert kit.accepted(key) == 1
    assert len(kit.requests(key=key, method="POST")) == 8


def test_a_stale_fencing_token_is_refused_without_running_the_handler(
    receiver_factory: Factory,
) -> None:
    kit = receiver_factory(hooks="kit")
    key = fresh()
    with httpx.Client(timeout=5) as client:
        # Attempt 2 got there first; attempt 1 (a paused worker) wakes up later.
        assert post(client, kit.webhook_url(), key, {}, token=2).status_code == 200
        stale = post(client, kit.webhook_url(), key, {}, token=1)
    assert stale.status_code == 409
    assert "stale fencing token" in stale.json()["error"]
    assert kit.accepted(key) == 1
    assert [r.result for r in kit.requests(key=key, method="POST")] == ["accepted", "stale"]


def test_faults_stay_in_front_of_the_kit(receiver_factory: Factory) -> None:
    kit = receiver_factory(hooks="kit")
    rejected, errored, processing = fresh(), fresh(), fresh()
    kit.fault("reject", key=rejected, status=422)  # refused before the kit sees it
    kit.fault("error_after_accept", key=errored)  # the kit ran the handler, then a 500
    kit.fault("delay", key=processing, delay_s=1.5, accept_first=False)
    with httpx.Client(timeout=5) as client:
        assert post(client, kit.webhook_url(), rejected, {}).status_code == 422
        assert lookup(client, kit, rejected).status_code == 404
        assert post(client, kit.webhook_url(), errored, {}).status_code == 500
        looked = lookup(client, kit, errored)
        assert (looked.status_code, looked.json()["status"]) == (200, "done")
    assert (kit.accepted(rejected), kit.accepted(errored)) == (0, 1)

    with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=5) as client:
        late = pool.submit(post, client, kit.webhook_url(), processing, {})
        # Read at once, handed to the kit only after the delay: not received yet.
        assert kit.wait_for(lambda: bool(kit.requests(key=processing, method="POST")), 3)
        assert lookup(client, kit, processing).status_code == 404
        assert late.result(10).status_code == 200
    assert kit.accepted(processing) == 1


def test_a_bad_signature_is_401_and_reset_forgets_the_kit_records(
    receiver_factory: Factory,
) -> None:
    kit = receiver_factory(hooks="kit")
    key = fresh()
    with httpx.Client(timeout=5) as client:
        forged = client.post(
            kit.webhook_url(),
            content=b"{}",
            headers={
                "webhook-id": key,
                "webhook-timestamp": str(int(time.time())),
                "webhook-signature": "v1,AAAA",
            },
        )
        assert forged.status_code == 401
        assert post(client, kit.webhook_url(), key, {}).status_code == 200
        kit.reset()
        assert lookup(client, kit, key).status_code == 404
        assert post(client, kit.webhook_url(), key, {}).json()["duplicate"] is False
    assert kit.accepted(key) == 1  # counted since the reset


def test_lookups_are_answered_only_when_signed(receiver_factory: Factory) -> None:
    """Kit and plain hooks alike: the lookup contract's 401 for an unsigned or forged lookup."""
    for sim in (receiver_factory(hooks="kit"), receiver_factory()):
        key = fresh()
        with httpx.Client(timeout=5) as client:
            assert post(client, sim.webhook_url(), key, {"n": 1}).status_code == 200
            unsigned = client.get(f"{sim.webhook_lookup_url}/{key}")
            forged = client.get(
                f"{sim.webhook_lookup_url}/{key}",
                headers=signed_lookup(key, "whsec_" + "Zm9yZ2VkLWxvb2t1cC1zZWNyZXQtMjRi"),
            )
            signed = lookup(client, sim, key)
        assert (unsigned.status_code, forged.status_code, signed.status_code) == (401, 401, 200)
        assert [r.result for r in sim.requests(key=key, method="GET")] == [
            "unauthorized",
            "unauthorized",
            "found",
        ]


def test_the_simulator_refuses_a_short_secret() -> None:
    with pytest.raises(ValueError, match="webhook secret is 1 bytes; at least 24"):
        SimulatorConfig(webhook_secret="whsec_aw==")
    with pytest.raises(ValueError, match=r"hook_secrets\['team'\]: webhook secret is 1 bytes"):
        SimulatorConfig(hook_secrets={"team": "whsec_aw=="})
