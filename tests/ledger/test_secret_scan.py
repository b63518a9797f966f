"""No secret ever leaves its settings: a demo-sized flow with known, distinctive secrets,
then a scan of everything a user or an attacker with read access could see.

Scanned: every file the processes wrote (worker, projector and dashboard logs, their data
dirs), every record on every topic of the broker (key, value and headers as raw bytes,
uncommitted ones too, dead letters included), ``ledger replay`` in every format, the
dashboard's pages, API and ``/metrics``, the worker's ``/metrics``. A hit is any secret as
configured, its base64 part, or its decoded key bytes. The provider channel has no token.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import SecretStr

from clients import DeliverySpec, Publisher
from clients.aiokafka_internals import refresh_metadata
from config.settings import Settings, WebhookEndpoint, changed
from events.delivery_state import Status
from events.ports import free_port
from ledger.simulator.background import BackgroundSimulator
from ledger.stack import Child, Stack, settings_env
from projections.backends import default_dsn
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for

TAG = uuid.uuid4().hex[:8]
GLOBAL = "whsec_" + base64.b64encode(f"scan-global-{TAG}-key".encode()).decode()
ROTATED_OUT = "whsec_" + base64.b64encode(f"scan-endpoint-old-{TAG}".encode()).decode()
ENDPOINT = "whsec_" + base64.b64encode(f"scan-endpoint-new-{TAG}".encode()).decode()
TOKEN = f"dashboard-token-{TAG}-{uuid.uuid4().hex}"  # 57 bytes
RUNS = 4
REPLAY_FORMATS = ("line", "table", "jsonl", "csv", "parquet")


def needles() -> dict[str, bytes]:
    """Every form in which a secret could leak, by a name for the report."""
    found: dict[str, bytes] = {"dashboard token": TOKEN.encode()}
    for name, secret in (("global", GLOBAL), ("rotated-out", ROTATED_OUT), ("endpoint", ENDPOINT)):
        encoded = secret.removeprefix("whsec_")
        found[f"{name} secret"] = secret.encode()
        found[f"{name} secret, base64 part"] = encoded.encode()
        found[f"{name} secret, key bytes"] = base64.b64decode(encoded)
    return found


@dataclass
class Scan:
    """What was scanned and what was found."""

    needles: dict[str, bytes]
    files: int = 0
    records: int = 0
    responses: int = 0
    outputs: int = 0
    scanned_bytes: int = 0
    hits: list[str] = field(default_factory=list)
    per_topic: dict[str, int] = field(default_factory=dict)

    def blob(self, where: str, data: bytes) -> None:
        self.scanned_bytes += len(data)
        for name, needle in self.needles.items():
            if needle in data:
                self.hits.append(f"{name} in {where}")

    def tree(self, root: Path) -> None:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                self.files += 1
                self.blob(str(path), path.read_bytes())


async def scan_topics(settings: Settings, scan: Scan) -> None:
    """Every record of every topic on the broker, uncommitted ones too, as raw bytes."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        isolation_level="read_uncommitted",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        # The broker's internal topics too (group offsets, transaction state).
        topics = await consumer.topics() | {"__consumer_offsets", "__transaction_state"}
        await refresh_metadata(consumer, topics)
        parts = [
            TopicPartition(topic, n)
            for topic in sorted(topics)
            for n in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        for _ in range(400):
            positions = {tp: await consumer.position(tp) for tp in parts}
            if all(positions[tp] >= ends[tp] for tp in parts):
                break
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, messages in batch.items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        continue
                    scan.records += 1
                    scan.per_topic[tp.topic] = scan.per_topic.get(tp.topic, 0) + 1
                    where = f"{tp.topic}[{tp.partition}]@{message.offset}"
                    scan.blob(where, message.key or b"")
                    scan.blob(where, message.value or b"")
                    for name, value in message.headers:
                        scan.blob(where, name.encode() + b"=" + (value or b""))
        else:
            raise AssertionError("topics not read to their end")
        assert {settings.kafka.topic_runs, settings.kafka.topic_deliveries} <= set(topics)
    finally:
        await consumer.stop()


def ledger_command(settings: Settings, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m ledger ARGS`` as a user runs it, with ``settings`` in the environment."""
    # Wide enough that the table format wraps nothing: a wrapped secret would slip a scan.
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env={**settings_env(settings), "COLUMNS": "4000"},
        capture_output=True,
        timeout=120,
        check=False,
    )


def dashboard_url(child: Child) -> str:
    for _ in range(300):
        for line in child.log.read_text(errors="replace").splitlines():
            if "dashboard on http" in line:
                return line.split("dashboard on ", 1)[1].split()[0]
        assert child.alive(), child.log.read_text(errors="replace")
        time.sleep(0.1)
    raise AssertionError("the dashboard did not say where it listens")


@dataclass
class Flow:
    """The processes and what they were given."""

    settings: Settings
    stack: Stack
    keys: list[str]
    run_ids: list[str]
    worker_metrics: int


def flow_settings(base: Settings, receiver: BackgroundSimulator) -> Settings:
    """The flow's settings: a global secret, an endpoint in rotation, a dashboard token."""
    with_lookup = receiver.settings(base)
    endpoints = {
        **with_lookup.channels.webhook_endpoints,
        f"{receiver.base_url}/hooks/team": WebhookEndpoint(
            secrets=[SecretStr(ROTATED_OUT), SecretStr(ENDPOINT)],
            lookup_url=receiver.webhook_lookup_url,
        ),
    }
    return changed(
        with_lookup,
        {
            "channels.webhook_secret": SecretStr(GLOBAL),
            "channels.webhook_endpoints": endpoints,
            "dashboard.token": SecretStr(TOKEN),
        },
    )


async def publish_runs(
    settings: Settings, receiver: BackgroundSimulator
) -> tuple[list[str], list[str]]:
    keys: list[str] = []
    run_ids = [f"scan-{TAG}-{n}" for n in range(RUNS)]
    async with Publisher(settings, producer_name="scan-agent") as publisher:
        for run_id in run_ids:
            await publisher.run_started(run_id, agent="scan-agent")
            specs = [
                DeliverySpec(
                    channel="webhook",
                    recipient=receiver.webhook_url("team"),
                    payload={"text": f"{run_id} finished"},
                ),
                DeliverySpec(
                    channel="webhook",
                    recipient=receiver.webhook_url("ops"),
                    payload={"run": run_id, "status": "succeeded"},
                ),
                DeliverySpec(
                    channel="provider",
                    recipient=receiver.provider_url,
                    payload={"to": "oncall@example.test", "body": f"{run_id} done"},
                ),
            ]
            requests = await publisher.run_succeeded(run_id, f"sha256:{run_id}", specs)
            keys += [r.idempotency_key for r in requests]
    # A record no one can decode: the worker dead-letters it (the dead letters are scanned).
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(settings.kafka.topic_deliveries, b"\xff not json", key=b"junk")
    finally:
        await producer.stop()
    return keys, run_ids


def replay_outputs(settings: Settings, tmp: Path, scan: Scan) -> Iterator[str]:
    """``ledger replay`` in every format, over every ledger topic; yields what it printed."""
    topics = [
        settings.kafka.topic_runs,
        settings.kafka.topic_deliveries,
        settings.kafka.topic_deadletter,
    ]
    picked = [arg for topic in topics for arg in ("-t", topic)]
    for fmt in REPLAY_FORMATS[:-1]:
        done = ledger_command(settings, "replay", *picked, "-f", fmt)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        scan.outputs += 1
        scan.blob(f"replay -f {fmt}", done.stdout + done.stderr)
        yield done.stdout.decode(errors="replace")
    target = tmp / "replay.parquet"
    done = ledger_command(settings, "replay", *picked, "-f", "parquet", "-o", str(target))
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    scan.outputs += 1
    scan.blob("replay -f parquet (output)", done.stdout + done.stderr)
    scan.blob("replay.parquet (file)", target.read_bytes())
    # Compressed columns would hide a secret from a byte scan: scan the decoded table too.
    table = pq.read_table(target)
    decoded = "\n".join(repr(row) for row in table.to_pylist()).encode()
    scan.blob("replay.parquet (decoded)", decoded)
    yield decoded.decode()


async def dashboard_answers(url: str, run_ids: list[str], scan: Scan) -> str:
    """Every page and API answer of the dashboard, with the token (which must not echo)."""
    seen = []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=10) as client:
        paths = ["/", "/api/overview", "/metrics", "/healthz", f"/api/search?q=scan-{TAG}"]
        paths += [f"/api/runs/{run_id}" for run_id in run_ids]
        paths += [f"/runs/{run_id}" for run_id in run_ids]
        for path in paths:
            for headers in (auth, {}):  # and without it: the 401 must not echo either
                answer = await client.get(url.rstrip("/") + path, headers=headers)
                scan.responses += 1
                raw = (
                    "".join(f"{k}: {v}\n" for k, v in answer.headers.items()).encode()
                    + answer.content
                )
                scan.blob(f"dashboard {path} ({answer.status_code})", raw)
                seen.append(answer.text)
    return "\n".join(seen)


async def test_no_secret_appears_anywhere_a_demo_sized_flow_leaves_traces(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    tmp_path: Path,
) -> None:
    receiver = receiver_factory(webhook_secret=GLOBAL, hook_secrets={"team": ENDPOINT})
    settings = flow_settings(worker_factory.settings, receiver)
    worker_factory.settings = settings
    scan = Scan(needles())
    stack = Stack(tmp_path / "logs")
    try:
        metrics_port = free_port()
        worker = worker_factory.start("scan-w1", changes={"worker.metrics_port": metrics_port})
        keys, run_ids = await publish_runs(settings, receiver)
        projector = stack.start("projector", ["project"], settings)

        async def delivered() -> bool:
            assert worker.alive(), worker.output()[-3000:]
            states = await ledger_view()
            return all(k in states and states[k].status is Status.CONFIRMED for k in keys)

        await wait_for(delivered, 90, f"all {len(keys)} deliveries CONFIRMED")
        assert all(r.signature_ok for r in receiver.requests(path="/hooks/"))

        dsn_file = Path(default_dsn(settings).removeprefix("sqlite://"))
        await wait_for(lambda: asyncio.to_thread(dsn_file.exists), 30, "the projection file")
        dashboard = stack.start("dashboard", ["dashboard", "--port", "0"], settings)
        url = await asyncio.to_thread(dashboard_url, dashboard)

        async def projected() -> bool:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(timeout=5) as client:
                answers = [
                    await client.get(f"{url.rstrip('/')}/api/runs/{r}", headers=auth)
                    for r in run_ids
                ]
            return all(a.status_code == 200 and "CONFIRMED" in a.text.upper() for a in answers)

        await wait_for(projected, 60, "the dashboard showing every run")
        shown = await dashboard_answers(url, run_ids, scan)
        worker_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        scan.responses += 1
        scan.blob("worker /metrics", worker_metrics.content)
        replayed = list(replay_outputs(settings, tmp_path, scan))
        await scan_topics(settings, scan)
        assert projector.alive(), projector.log.read_text(errors="replace")
    finally:
        worker_factory.stop_all()
        stack.stop()
    # The processes' logs and everything they wrote: after they stopped, so it is all there.
    scan.tree(tmp_path)

    # The scan read the real thing: runs, keys and the dead letter are in what it read.
    named = {"dashboard": shown, **dict(zip(REPLAY_FORMATS, replayed, strict=True))}
    for what, text in named.items():
        assert all(run_id in text for run_id in run_ids), (what, text[:2000])
    assert scan.per_topic.get(settings.kafka.topic_deadletter, 0) >= 1, scan.per_topic
    assert scan.records >= RUNS * 5
    assert scan.files >= 4
    assert scan.responses >= 20
    print(
        f"secret scan: {len(scan.needles)} needles, {scan.files} files, {scan.records} records "
        f"on {len(scan.per_topic)} topics, "
        f"{scan.responses} HTTP answers, {scan.outputs} replay outputs, "
        f"{scan.scanned_bytes} bytes, hits {len(scan.hits)}"
    )
    print(f"records per topic: {sorted(scan.per_topic.items())}")
    assert scan.hits == [], scan.hits
    assert (
        os.environ.get("LEDGER_CHANNELS__WEBHOOK_SECRET") != GLOBAL
    )  # the flow's own, not the env's
