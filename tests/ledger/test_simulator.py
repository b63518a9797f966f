"""The fake provider itself: control API, fault targeting, the seeded mix, dedupe, the CLI."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import TypedDict

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from ledger.simulator import FaultMix, SimulatorConfig
from ledger.simulator.background import BackgroundSimulator
from streams.channels.signature import signature_header, signer
from tests.fixtures.secrets import TEST_WEBHOOK_SECRET
from tests.receiver.support import signed_lookup

Factory = Callable[..., BackgroundSimulator]
SIGNERS = [signer(SecretStr(TEST_WEBHOOK_SECRET))]


def lookup(client: httpx.Client, sim: BackgroundSimulator, key: str) -> httpx.Response:
    """A webhook lookup signed as the worker signs it (the lookup contract)."""
    return client.get(
        f"{sim.webhook_lookup_url}/{key}", headers=signed_lookup(key, TEST_WEBHOOK_SECRET)
    )


def post_hook(
    client: httpx.Client, url: str, key: str, payload: object, *, at: int | None = None
) -> httpx.Response:
    """A correctly signed Standard Webhooks POST (synchronous: the simulator has its own loop)."""
    body = json.dumps(payload).encode()
    stamp = int(time.time()) if at is None else at
    headers = {
        "webhook-id": key,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature_header(SIGNERS, key, stamp, body),
        "content-type": "application/json",
    }
    return client.post(url, content=body, headers=headers)


def fresh() -> str:
    return uuid.uuid4().hex


def test_control_api_arms_targeted_faults_and_reports_state(receiver: BackgroundSimulator) -> None:
    hit, spared = fresh(), fresh()
    with httpx.Client(timeout=5) as client:
        armed = client.post(
            f"{receiver.control_url}/faults",
            json=[{"kind": "reject", "status": 422, "key": hit, "count": 2}],
        )
        assert armed.status_code == 200
        assert armed.json()["targeted"][0]["remaining"] == 2
        url = receiver.webhook_url()
        assert post_hook(client, url, spared, {"n": 0}).status_code == 200
        assert post_hook(client, url, hit, {"n": 1}).status_code == 422
        assert post_hook(client, url, hit, {"n": 1}).status_code == 422
        assert post_hook(client, url, hit, {"n": 1}).status_code == 200  # used up
        state = client.get(f"{receiver.control_url}/state").json()
    assert state["events"][hit]["accepted"] == 1
    assert state["events"][spared]["accepted"] == 1
    assert [r["status"] for r in state["requests"] if r["key"] == hit] == [422, 422, 200]
    assert [r["fault"] for r in state["requests"] if r["key"] == hit] == ["reject", "reject", None]
    assert state["faults"]["targeted"] == []


def test_control_api_rejects_bad_faults(receiver: BackgroundSimulator) -> None:
    with httpx.Client(timeout=5) as client:
        answer = client.post(f"{receiver.control_url}/faults", json={"kind": "explode"})
    assert answer.status_code == 400
    assert receiver.state()["faults"]["targeted"] == []


def test_path_targeting_and_reset(receiver: BackgroundSimulator) -> None:
    receiver.fault("reject", status=400, path="/provider/")
    with httpx.Client(timeout=5) as client:
        hook = post_hook(client, receiver.webhook_url(), fresh(), {})
        key = fresh()
        rejected = client.post(receiver.provider_url, json={}, headers={"idempotency-key": key})
        assert (hook.status_code, rejected.status_code) == (200, 400)
        assert client.post(f"{receiver.control_url}/reset").status_code == 200
    assert receiver.events() == {}
    assert receiver.requests() == []


def test_refuse_via_control_port_resumes_by_itself(receiver: BackgroundSimulator) -> None:
    assert receiver.simulator.control_port not in (None, receiver.port)
    with httpx.Client(timeout=2) as client:
        refused = client.post(f"{receiver.control_url}/refuse", json={"for_s": 0.5})
        assert refused.json() == {"refusing": True}
        with pytest.raises(httpx.ConnectError):
            client.get(receiver.provider_url, params={"idempotency_key": "x"})
        assert client.get(f"{receiver.control_url}/state").json()["refusing"] is True
        assert receiver.wait_for(lambda: not receiver.simulator.refusing, timeout_s=3)
        back = client.get(receiver.provider_url, params={"idempotency_key": "x"})
    assert back.status_code == 404


def test_delay_before_accepting_accepts_only_after_the_delay(
    receiver: BackgroundSimulator,
) -> None:
    key = fresh()
    receiver.fault("delay", delay_s=0.6, accept_first=False, key=key)
    with httpx.Client(timeout=0.2) as client, pytest.raises(httpx.ReadTimeout):
        post_hook(client, receiver.webhook_url(), key, {"late": True})
    assert receiver.accepted(key) == 0  # the client gave up before the receiver processed it
    assert receiver.wait_for(lambda: receiver.accepted(key) == 1, timeout_s=3)


def test_without_dedupe_every_request_counts(receiver_factory: Factory) -> None:
    naive = receiver_factory(dedupe=False)
    key = fresh()
    with httpx.Client(timeout=5) as client:
        for _ in range(3):
            post_hook(client, naive.webhook_url(), key, {"a": 1})
        post_hook(client, naive.webhook_url(), key, {"a": 2})
    event = naive.event(key)
    assert event is not None
    assert (event.accepted, event.received, event.conflicts) == (4, 4, 1)


def test_stale_timestamp_is_unauthorized(receiver: BackgroundSimulator) -> None:
    key = fresh()
    with httpx.Client(timeout=5) as client:
        answer = post_hook(client, receiver.webhook_url(), key, {}, at=int(time.time()) - 3600)
    assert answer.status_code == 401
    assert "tolerance" in answer.json()["error"]
    assert receiver.accepted(key) == 0


def test_seeded_mix_is_reproducible_and_near_its_percentages(receiver_factory: Factory) -> None:
    mix = FaultMix(seed=7, error_after_accept=0.3, reject=0.2, rate_limit=0.1)

    def run() -> list[int]:
        provider = receiver_factory()
        provider.set_mix(mix)
        with httpx.Client(timeout=5) as client:
            return [
                client.post(
                    provider.provider_url, json={"i": i}, headers={"idempotency-key": f"k{i}"}
                ).status_code
                for i in range(300)
            ]

    first, second = run(), run()
    assert first == second
    counts = {status: first.count(status) for status in set(first)}
    assert 60 <= counts[500] <= 120
    assert 35 <= counts[400] <= 85
    assert 12 <= counts[429] <= 50
    assert counts[201] == 300 - counts[500] - counts[400] - counts[429]


def test_mix_leaves_lookups_alone(receiver: BackgroundSimulator) -> None:
    receiver.set_mix(FaultMix(seed=1, reject=1.0))
    with httpx.Client(timeout=5) as client:
        sends = client.post(receiver.provider_url, json={}, headers={"idempotency-key": "k"})
        lookup = client.get(receiver.provider_url, params={"idempotency_key": "k"})
    assert (sends.status_code, lookup.status_code) == (400, 404)


def test_config_changes_at_run_time(receiver: BackgroundSimulator) -> None:
    with httpx.Client(timeout=5) as client:
        changed = client.post(f"{receiver.control_url}/config", json={"delivered_after_s": 0})
        assert changed.json()["delivered_after_s"] == 0
        sent = client.post(receiver.provider_url, json={}, headers={"idempotency-key": fresh()})
        refused = client.post(f"{receiver.control_url}/config", json={"port": 1})
    assert sent.json()["status"] == "delivered"
    assert refused.status_code == 400


def test_loopback_only() -> None:
    with pytest.raises(ValidationError, match="loopback"):
        SimulatorConfig(host="0.0.0.0")


def test_cli_serves_until_interrupted() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "ledger", "fake-provider"),
            *("--port", "0", "--control-port", "0", "--json", "--delivered-after", "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        urls = json.loads(process.stdout.readline())
        with httpx.Client(timeout=5) as client:
            sent = client.post(urls["provider"], json={"x": 1}, headers={"idempotency-key": "c1"})
            state = client.get(f"{urls['control']}/state").json()
        assert sent.json()["status"] == "delivered"
        assert state["events"]["c1"]["payload"] == {"x": 1}
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, err
    assert "fake provider stopped" in out


def test_stall_answers_late_and_never_accepts(receiver: BackgroundSimulator) -> None:
    key = fresh()
    receiver.fault("stall", delay_s=0.3, key=key)
    with httpx.Client(timeout=5) as client:
        answer = post_hook(client, receiver.webhook_url(), key, {})
    assert answer.status_code == 503
    assert receiver.accepted(key) == 0
    assert receiver.requests(key=key)[0].result == "stalled"


def test_trickle_answers_the_status_at_once_and_the_body_slowly(
    receiver: BackgroundSimulator,
) -> None:
    key = fresh()
    receiver.fault("trickle", delay_s=1.5, key=key)
    with httpx.Client(timeout=5) as client:
        began = time.monotonic()
        with client.stream("POST", receiver.webhook_url(), **signed(key)) as answer:
            status_after = time.monotonic() - began
            body = answer.read()
        body_after = time.monotonic() - began
    assert answer.status_code == 200
    assert status_after < 0.5
    assert body_after > 1.0
    assert json.loads(body)["webhook_id"] == key
    assert receiver.accepted(key) == 1


def test_fencing_tokens_and_open_requests_are_recorded(receiver_factory: Factory) -> None:
    naive = receiver_factory(dedupe=False)
    key = fresh()
    naive.fault("delay", delay_s=0.5, key=key)
    with httpx.Client(timeout=5) as client:
        first = signed(key, token=1)
        second = signed(key, token=2)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            slow = pool.submit(client.post, naive.webhook_url(), **first)
            assert naive.wait_for(lambda: len(naive.requests(key=key)) == 1)
            client.post(naive.webhook_url(), **second)
            slow.result()
    assert [r.fencing_token for r in naive.requests(key=key)] == [1, 2]
    assert naive.max_concurrent(key) == 2
    assert naive.accepted(key) == 2


def test_provider_can_report_a_message_failed(receiver: BackgroundSimulator) -> None:
    key = fresh()
    receiver.fault("provider_failed", key=key)
    with httpx.Client(timeout=5) as client:
        sent = client.post(
            receiver.provider_url, json={"to": "x"}, headers={"idempotency-key": key}
        )
        looked = client.get(receiver.provider_url, params={"idempotency_key": key})
    assert sent.json()["status"] == "queued"  # accepted; it fails on its way
    assert looked.json()["status"] == "failed"


def test_lookup_says_processing_while_a_request_is_being_processed(
    receiver_factory: Factory,
) -> None:
    kit_like = receiver_factory(lookup_processing=True)
    plain = receiver_factory()
    for sim, expected in ((kit_like, 202), (plain, 404)):
        key = fresh()
        sim.fault("delay", delay_s=1.0, accept_first=False, key=key)
        with httpx.Client(timeout=0.2) as client, pytest.raises(httpx.ReadTimeout):
            post_hook(client, sim.webhook_url(), key, {})
        with httpx.Client(timeout=5) as client:
            during = lookup(client, sim, key)
            assert during.status_code == expected

            def accepted_once(s: BackgroundSimulator = sim, k: str = key) -> bool:
                return s.accepted(k) == 1

            assert sim.wait_for(accepted_once, timeout_s=3)
            assert lookup(client, sim, key).status_code == 200


class SignedPost(TypedDict):
    """httpx keyword arguments of a signed POST."""

    content: bytes
    headers: dict[str, str]


def signed(key: str, payload: object = None, *, token: int | None = None) -> SignedPost:
    """Keyword arguments of a correctly signed Standard Webhooks POST."""
    body = json.dumps({} if payload is None else payload).encode()
    stamp = int(time.time())
    headers = {
        "webhook-id": key,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature_header(SIGNERS, key, stamp, body),
        "content-type": "application/json",
    }
    if token is not None:
        headers["fencing-token"] = str(token)
    return {"content": body, "headers": headers}


def test_a_refusing_receiver_keeps_its_port_from_every_other_server(
    receiver: BackgroundSimulator,
) -> None:
    # Seen in CI: a receiver told to refuse released its port; another test's server, picking
    # a free port, took it, and the first receiver's resume then failed with "address
    # already in use" while its workers' requests reached the other test's receiver.
    port = receiver.port
    for _ in range(2):  # refuse, resume, refuse again: the port is kept each time
        receiver.refuse()
        with pytest.raises(httpx.ConnectError):
            httpx.get(receiver.provider_url, params={"idempotency_key": "x"}, timeout=2)
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # how free_port (events/ports.py) tries a port
        receiver.resume()
        back = httpx.get(receiver.provider_url, params={"idempotency_key": "x"}, timeout=5)
        assert back.status_code == 404, "listening on its port again"
    assert receiver.port == port
