"""The JSON API and the command as a user runs it: numbers, search, token, refusals."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
from datetime import timedelta

import httpx
from pydantic import SecretStr

from clients.endpoint_registry import append_endpoint_event
from config.settings import Settings, changed
from events.endpoints import EndpointSecret, EndpointSpec, open_circuit, pause, register
from events.waiting import DeliveryHeld, WaitReason
from ledger.stack import settings_env
from projections import status_report
from projections.dashboard.models import Budgets, SearchAnswer
from tests.dashboard.conftest import NOW, Stack, project_all, start_stack
from tests.projections.scenarios import T0, found_later, requested


async def test_overview_matches_the_projection_library(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        data = (await http.get("/api/overview")).json()
    store = stack.read()
    try:
        report = status_report(store, NOW)
    finally:
        store.close()
    counters = {c["name"]: c["value"] for c in data["counters"]}
    assert counters == {
        "overdue_pending": len(report.overdue_pending),
        "overdue_sent": len(report.overdue_sent),
        "unknown": len(report.unknown),
        "confirmed_without_result": len(report.confirmed_without_result),
        "duplicate_conflicts": len(report.duplicate_conflicts),
        "failed_attempts": sum(
            r["attempts"] for r in report.attempts_by_channel if r["error_class"] is not None
        ),
    }
    assert counters == {
        "overdue_pending": 1,
        "overdue_sent": 0,
        "unknown": 1,
        "confirmed_without_result": 1,
        "duplicate_conflicts": 1,
        "failed_attempts": 4,
    }
    assert data["now"] == "2026-01-05T10:00:00.000000Z"
    # Pending now beside the past-SLO counters: run-b's delivery, requested at T0+100s.
    assert data["backlog"] == report.backlog.to_json() == {
        "pending_now": 1,
        "oldest_requested_at": "2026-01-05T09:01:40.000000Z",
        "oldest_age_seconds": 3500.0,
        "by_channel": [
            {"channel": "webhook", "pending": 1,
             "oldest_requested_at": "2026-01-05T09:01:40.000000Z", "oldest_age_seconds": 3500.0}
        ],
    }  # fmt: skip
    assert data["deliveries_by_status"] == {
        "PENDING": 1, "SENT": 0, "UNKNOWN": 1, "CONFIRMED": 3, "FAILED": 1,
    }  # fmt: skip
    assert [r["run_id"] for r in data["unknown"]] == [r["run_id"] for r in report.unknown]
    assert [r["idempotency_key"] for r in data["overdue_pending"]] == [
        r["idempotency_key"] for r in report.overdue_pending
    ]
    # Latency: a1 and c1 confirmed 3 s after the request, a2 after 13 s (timeout + retry).
    assert data["latency"]["count"] == 3
    assert data["latency"]["counts"][data["latency"]["labels"].index("≤5s")] == 2
    assert data["latency"]["counts"][data["latency"]["labels"].index("≤30s")] == 1
    assert abs(data["latency"]["sum_seconds"] - 19.0) < 0.01
    nine = next(h for h in data["by_hour"] if h["hour"] == "2026-01-05T09:00Z")
    assert (nine["CONFIRMED"], nine["PENDING"], nine["UNKNOWN"], nine["FAILED"]) == (3, 1, 1, 1)
    assert len(data["by_hour"]) == 24

    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        limited = (await http.get("/api/overview", params={"limit": 0})).json()
        assert limited["unknown"] == []
        assert limited["counters"] == data["counters"]
        assert (await http.get("/api/overview", params={"limit": "x"})).status_code == 400


async def test_run_and_search_endpoints(stack: Stack) -> None:
    key = requested("run-a", 2, 1).idempotency_key
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        run = (await http.get("/api/runs/run-a")).json()
        assert run["answers"]["execution_finished"] == "finished: succeeded"
        by_key = {d["idempotency_key"]: d for d in run["answers"]["deliveries"]}
        assert by_key[key]["left_system"] == "yes (confirmed)"
        assert by_key[key]["provider_message_id"] == f"msg-{key[:6]}-2"
        assert run["timeline"][0]["what"] == "run started by reporter"

        missing = await http.get("/api/runs/nope")
        assert missing.status_code == 404
        assert missing.json()["error"] == "run nope is not in the projection"

        found = (await http.get("/api/search", params={"q": key})).json()["matches"]
        assert [(m["kind"], m["run_id"], m["idempotency_key"]) for m in found] == [
            ("delivery", "run-a", key)
        ]
        prefix = (await http.get("/api/search", params={"q": key[:8].upper()})).json()
        assert [m["idempotency_key"] for m in prefix["matches"]] == [key]
        runs = (await http.get("/api/search", params={"q": "run-"})).json()["matches"]
        assert [m["run_id"] for m in runs] == ["run-a", "run-b", "run-c"]
        assert (await http.get("/api/search", params={"q": "zz"})).json()["matches"] == []
        # The answers are what the OpenAPI document says (its models validate them).
        SearchAnswer.model_validate(prefix)
        Budgets.model_validate((await http.get("/api/budgets")).json())
        document = (await http.get("/api/openapi.json")).json()
        assert document["info"]["title"] == "delivery-ledger dashboard"
        release = document["paths"]["/api/budgets/{agent}/release"]["post"]
        assert release["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ReleaseRequest"
        }
        assert "ReleaseRequest" in document["components"]["schemas"]
        assert {"/api/overview", "/api/runs/{run_id}", "/metrics"} <= set(document["paths"])
        head = await http.head("/api/runs/run-a")
        assert (head.status_code, head.content) == (200, b"")


async def test_a_token_guards_the_data_but_not_the_shell(settings: Settings) -> None:
    token = secrets.token_urlsafe(32)
    guarded = changed(settings, {"dashboard.token": SecretStr(token)})
    async for stack in start_stack(guarded, clock_at=T0 + timedelta(hours=1)):
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
            assert (await http.get("/")).status_code == 200
            assert (await http.get("/static/app.js")).status_code == 200
            for path in ("/api/overview", "/api/runs/run-a", "/api/search?q=run", "/metrics"):
                refused = await http.get(path)
                assert refused.status_code == 401, path
                assert refused.headers["WWW-Authenticate"].startswith("Bearer")
                wrong = await http.get(path, headers={"Authorization": "Bearer nope"})
                assert wrong.status_code == 401, path
                ok = await http.get(path, headers={"Authorization": f"Bearer {token}"})
                assert ok.status_code == 200, path


def ledger(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_beyond_loopback_without_a_token_is_refused_in_one_line(settings: Settings) -> None:
    done = ledger(settings, "dashboard", "--host", "0.0.0.0")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[0] == (
        "error: refusing to serve the dashboard on 0.0.0.0 (not loopback) without a bearer token"
    )
    assert lines[1].startswith("hint: set LEDGER_DASHBOARD__TOKEN")
    assert "Traceback" not in done.stderr

    missing = ledger(settings, "dashboard", "--dsn", f"sqlite://{settings.data_dir}/none.db")
    assert missing.returncode == 1
    assert "error: no projection at" in missing.stderr


async def test_the_command_serves_until_sigterm(stack: Stack) -> None:
    env = settings_env(stack.settings)
    process = subprocess.Popen(
        [sys.executable, "-m", "ledger", "dashboard", "--dsn", stack.dsn, "--port", "0"],
        env={**env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)
        assert line.startswith("dashboard on http://127.0.0.1:"), line
        url = line.split()[2]
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.get("/healthz")).text == "ok\n"
            data = (await http.get("/api/overview")).json()
        assert {c["name"]: c["value"] for c in data["counters"]}["unknown"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "dashboard stopped" in out
    assert os.environ.get("LEDGER_DASHBOARD__TOKEN") is None


async def test_overview_lists_sent_deliveries_past_their_slo(stack: Stack) -> None:
    a3 = requested("run-a", 3, 1)  # UNKNOWN; its SLO ended at T0+61s, long before NOW
    await stack.append([found_later(a3, 300)])
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        data = (await http.get("/api/overview")).json()
    counters = {c["name"]: c for c in data["counters"]}
    assert (counters["overdue_sent"]["value"], counters["overdue_sent"]["level"]) == (1, "alert")
    assert counters["overdue_sent"]["title"] == "sent past SLO, not confirmed"
    assert [
        (r["run_id"], r["idempotency_key"], r["provider_message_id"]) for r in data["overdue_sent"]
    ] == [("run-a", a3.idempotency_key, f"msg-{a3.idempotency_key[:6]}-found")]


async def test_the_endpoints_list_shows_each_endpoints_state_and_no_secret(stack: Stack) -> None:
    spec = EndpointSpec(channel="webhook", address="https://hooks.test/acme/")
    token = "gAAAA-not-a-real-token"
    added = register(
        "acme",
        spec,
        (EndpointSecret(ciphertext=token, added_at=T0),),
        actor="ana",
        producer="test",
        at=T0,
        existing=None,
    )
    paused = pause(added.endpoint, "maintenance", actor="ana", producer="test", at=T0)
    tripped = open_circuit(
        paused.endpoint, failures=10, sends=10, reason="down", producer="test", at=T0
    )
    for event in (added, paused, tripped, added):  # the stale re-read changes nothing
        await append_endpoint_event(stack.settings.kafka, event)
    await project_all(stack.settings, stack.dsn)
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        answer = await http.get("/api/endpoints")
    assert answer.status_code == 200
    data = answer.json()
    shown = [
        (
            e["endpoint_id"],
            e["state"],
            e["circuit"],
            e["stopped_by"],
            e["stopped_reason"],
            e["secrets"],
        )
        for e in data["endpoints"]
    ]
    assert shown == [("acme", "paused", "open", "ana", "maintenance", 1)]
    assert token not in answer.text
    assert isinstance(data["waiting"], dict)


async def _paused_hooks(stack: Stack) -> None:
    """The registry's "hooks" endpoint covers the scenario's webhook recipients; it is
    paused, and run-b's delivery waits for it."""
    added = register(
        "hooks",
        EndpointSpec(channel="webhook", address="http://127.0.0.1:9/hooks/"),
        (),
        actor="ana",
        producer="test",
        at=T0,
        existing=None,
    )
    await append_endpoint_event(stack.settings.kafka, added)
    paused = pause(added.endpoint, "maintenance", actor="ana", producer="test", at=T0)
    await append_endpoint_event(stack.settings.kafka, paused)
    await stack.append([held_for_pause()])


def held_for_pause() -> DeliveryHeld:
    b1 = requested("run-b", 1, 100, slo=30)
    return DeliveryHeld(
        idempotency_key=b1.idempotency_key,
        run_id="run-b",
        producer="test",
        reason=WaitReason.PAUSED,
        detail="endpoint hooks paused by ana: maintenance",
        occurred_at=T0 + timedelta(seconds=101),
    )


async def test_health_answers_per_endpoint_in_json_and_in_metrics(stack: Stack) -> None:
    await _paused_hooks(stack)
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        answer = await http.get("/api/health")
        text = (await http.get("/metrics")).text
    assert answer.status_code == 200
    data = answer.json()
    hooks = next(e for e in data["endpoints"] if e["endpoint"] == "hooks")
    assert (hooks["state"], hooks["breaker"], hooks["pending"]) == ("paused", "closed", 1)
    assert hooks["waiting"] == {"paused": 1}
    assert hooks["success"] == {"1h": 0.6667, "all": 0.6667}  # the clock: T0 + 1 h
    assert hooks["latency"]["all"] == {"count": 2, "p50": 2.5, "p99": 2.99}
    assert data["endpoints_total"] == 3
    labels = 'channel="webhook",endpoint="hooks"'
    assert f'ledger_endpoint_success_ratio{{{labels},window="all"}} 0.6667' in text
    assert f'ledger_endpoint_latency_seconds{{{labels},quantile="0.99",window="all"}} 2.99' in text
    assert f'ledger_endpoint_waiting{{{labels},reason="paused"}} 1.0' in text
    assert f'ledger_endpoint_status{{breaker="closed",{labels},state="paused"}} 1.0' in text
