"""``ledger schema`` against a real log: the schemas it writes accept every record that real
publishers, a real worker and the operator commands append, as a consumer in another
language would check them (the ``jsonschema`` package, JSON Schema 2020-12)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events.delivery_state import Status
from ledger.simulator.background import BackgroundSimulator
from ledger.stack import settings_env
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for

ROOT = Path(__file__).resolve().parents[2]


def ledger(settings: Settings, *args: str) -> str:
    """``ledger ARGS`` as an operator runs it, with this test's settings; its output."""
    env = settings_env(settings)
    env["LEDGER_OPERATOR"] = "ana"
    done = subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def validators(directory: Path) -> dict[tuple[str, int], Draft202012Validator]:
    """Each (type, version) of the index, with its schema's validator."""
    index = json.loads((directory / "index.json").read_text())
    found = {}
    for entry in index["events"]:
        schema = json.loads((directory / entry["file"]).read_text())
        Draft202012Validator.check_schema(schema)
        found[(entry["type"], entry["schema_version"])] = Draft202012Validator(
            schema, format_checker=Draft202012Validator.FORMAT_CHECKER
        )
    return found


async def test_every_record_of_a_real_log_validates_against_the_written_schemas(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
    tmp_path: Path,
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    out = tmp_path / "schemas"
    assert "wrote 32 event schemas and index.json" in await asyncio.to_thread(
        ledger, settings, "schema", "--out", str(out)
    )
    checks = validators(out)

    # Operator commands: an endpoint registered and paused, a budget set (signed records).
    await asyncio.to_thread(
        ledger, settings, "endpoints", "add", "acme", "--channel", "provider",
        "--address", receiver.provider_url,
    )  # fmt: skip
    await asyncio.to_thread(ledger, settings, "endpoints", "pause", "acme", "--reason", "r")
    await asyncio.to_thread(
        ledger, settings, "budgets", "set", "schema-agent", "--limit", "100", "--window", "1h",
        "--reason", "schema test", "--as", "ana",
    )  # fmt: skip

    # The SDK: a run with deliveries (payloads JCS spells differently from Python: 1.0,
    # 1e21, an astral key), the other run outcomes, and the same run again, once with the
    # same payloads (a duplicate) and once with another (a conflict).
    payload = {"amount": 1.0, "big": 1e21, "\U0001f600": "astral", "list": [[], {}]}
    specs = [
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url("ops"), payload=payload),
        DeliverySpec(channel="webhook", recipient=receiver.webhook_url("audit"), payload="text"),
    ]
    async with Publisher(settings, producer_name="schema-agent") as publisher:
        await publisher.run_started("run-schema", agent="schema-agent")
        requests = await publisher.run_succeeded("run-schema", "sha256:r", specs)
        await publisher.run_succeeded("run-schema", "sha256:r", specs[:1])
        changed = DeliverySpec(
            channel="webhook", recipient=receiver.webhook_url("ops"), payload={"other": 2}
        )
        await publisher.run_succeeded("run-schema", "sha256:r", [changed])
        await publisher.run_failed("run-other", "boom")
        await publisher.run_marked_unknown("run-lost", "no heartbeat")
    keys = [r.idempotency_key for r in requests]

    worker = worker_factory.start("w1")

    async def settled() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        states = await ledger_view()
        done = all(k in states and states[k].status is Status.CONFIRMED for k in keys)
        return done and states[keys[0]].duplicates == 1 and states[keys[0]].conflicts == 1

    await wait_for(settled, 90, "both deliveries CONFIRMED, one duplicate and one conflict")
    worker.stop()

    seen: dict[str, int] = {}
    topics = (
        settings.kafka.topic_runs,
        settings.kafka.topic_deliveries,
        settings.kafka.topic_endpoints,
        settings.kafka.topic_budgets,
    )
    for topic in topics:
        for message in await read_topic(topic, raw=True):
            record: dict[str, Any] = json.loads(message.value)
            kind = (record["type"], record["schema_version"])
            assert kind in checks, f"{kind} has no schema in the index"
            problems = [e.message for e in checks[kind].iter_errors(record)]
            assert not problems, f"{kind} at {topic}:{message.offset}: {problems}"
            seen[record["type"]] = seen.get(record["type"], 0) + 1
    expected = {
        "run.started", "run.succeeded", "run.failed", "run.marked_unknown",
        "delivery.requested", "delivery.claimed", "delivery.confirmed",
        "delivery.duplicate_requested", "endpoint.registered", "endpoint.paused",
        "budget.set",
    }  # fmt: skip
    assert expected <= set(seen), sorted(seen)
    assert seen["delivery.duplicate_requested"] == 2
