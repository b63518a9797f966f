"""What every benchmark of the suite shares: the broker, child processes, machine facts.

Everything runs on 127.0.0.1 on ports outside the ephemeral range, in temp dirs, and
every process started here is stopped again (children also die with their parent).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2
from pydantic import SecretStr

from clients import DeliverySpec
from clients.kafka_security import client_options
from clients.outcome_keys import StoredKeys
from config import Settings
from config.settings import WebhookEndpoint, changed
from events.delivery_state import DeliveryState, Status
from ledger.broker import LocalBroker
from ledger.stack import Child, Stack, _die_with_parent, read_json_line

BROKER_PORT = 29692
# The bench's own signing secret (its workers sign, its fake provider verifies): known,
# explicit, and nothing outside bench/ uses it.
BENCH_WEBHOOK_SECRET = SecretStr("whsec_" + base64.b64encode(b"ledger-bench-only-secret").decode())


def median(values: list[float]) -> float:
    """The median (0.0 for no values)."""
    return statistics.median(values) if values else 0.0


def partition_for(key: bytes, partitions: int) -> int:
    """The partition aiokafka's default partitioner picks for ``key``."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


def fresh_settings(
    base: Settings, label: str, changes: Mapping[str, object] | None = None
) -> Settings:
    """``base`` with topics and a worker group no earlier round has used (and
    ``changes``, by dotted name)."""
    tag = f"{label}-{uuid.uuid4().hex[:6]}"
    return changed(
        base,
        {
            "kafka.topic_runs": f"bench.runs.{tag}",
            "kafka.topic_deliveries": f"bench.deliveries.{tag}",
            "kafka.topic_deadletter": f"bench.dl.{tag}",
            "worker.group": f"bench-{tag}",
            **(changes or {}),
        },
    )


@contextlib.contextmanager
def local_broker(tmp: Path, port: int = BROKER_PORT) -> Iterator[tuple[Settings, LocalBroker]]:
    """A fresh local broker on ``port`` and ``port + 1`` (and its handle, for restarts),
    stopped afterwards."""
    settings = Settings(
        kafka={"broker_port": port, "controller_port": port + 1},
        channels={"allowed_networks": ["127.0.0.0/8"], "webhook_secret": BENCH_WEBHOOK_SECRET},
        data_dir=tmp / "data",
    )
    # As `ledger init` would: the workers sign their outcomes with the pair in the data dir.
    StoredKeys.of(settings.data_dir).create()
    broker = LocalBroker(settings)
    try:
        # Inside the try: a start that times out has spawned a JVM all the same.
        if broker.start().already_running:
            raise RuntimeError(f"a broker already runs on {settings.kafka.bootstrap_servers}")
        yield settings, broker
    finally:
        broker.stop()


@contextlib.contextmanager
def bench_broker(tmp: Path, port: int = BROKER_PORT) -> Iterator[Settings]:
    """A fresh local broker on the bench ports (``port`` and ``port + 1``), stopped afterwards."""
    with local_broker(tmp, port) as (settings, _broker):
        yield settings


def start_python(stack: Stack, name: str, args: list[str], env: dict[str, str]) -> Child:
    """``python ARGS`` as a child of ``stack`` (stopped by ``stack.stop()``)."""
    stack.logs.mkdir(parents=True, exist_ok=True)
    log = stack.logs / f"{name}.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
    child = Child(name, process, log)
    stack.children.append(child)
    return child


def start_receiver(stack: Stack, settings: Settings, *options: str) -> dict[str, str]:
    """The fake provider (no faults and dedupe on, unless ``options`` say otherwise); its URLs."""
    child = stack.start(
        "fake-provider",
        ["fake-provider", "--port", "0", "--control-port", "0", "--json", *options],
        settings,
        stdout=subprocess.PIPE,
    )
    return read_json_line(child)


def with_webhook_lookup(settings: Settings, urls: dict[str, Any]) -> Settings:
    """``settings`` with the simulator's webhook endpoints declared, lookup URL included."""
    endpoints = {
        **settings.channels.webhook_endpoints,
        f"{urls['base']}/hooks/": WebhookEndpoint(lookup_url=urls["webhook_lookup"]),
    }
    return changed(settings, {"channels.webhook_endpoints": endpoints})


def fanout_specs(urls: dict[str, Any], run: int, limit: int = 3) -> list[DeliverySpec]:
    """The deliveries of bench run ``run``: two webhooks and one provider message (the first
    ``limit`` of them), so every run exercises both channels."""
    return [
        DeliverySpec(channel="webhook", recipient=f"{urls['base']}/hooks/ops", payload={"r": run}),
        DeliverySpec(
            channel="webhook", recipient=f"{urls['base']}/hooks/audit", payload={"r": run}
        ),
        DeliverySpec(channel="provider", recipient=urls["provider"], payload={"r": run}),
    ][:limit]


def visibly_unknown(state: DeliveryState) -> bool:
    """UNKNOWN with a reason an operator can read: the one honest non-terminal end."""
    return state.status is Status.UNKNOWN and bool(state.last_reason)


def stuck_keys(keys: Iterable[str], states: dict[str, DeliveryState]) -> list[str]:
    """Keys neither terminal nor visibly UNKNOWN (never folded at all counts as stuck)."""
    return [
        k
        for k in keys
        if k not in states or not (states[k].status.terminal or visibly_unknown(states[k]))
    ]


@dataclass(frozen=True)
class ReceiverTally:
    """What the receiver itself recorded: sends (POSTs) and acceptances per key."""

    posts: int
    accepted: dict[str, int]

    @classmethod
    def of(cls, state: dict[str, Any]) -> ReceiverTally:
        """From the simulator's ``/_control/state`` document."""
        posts = sum(1 for r in state["requests"] if r["method"] == "POST")
        accepted = {key: int(event["accepted"]) for key, event in state["events"].items()}
        return cls(posts, accepted)

    def twice(self) -> list[str]:
        """Keys the receiver accepted more than once (dedupe off makes a double send show)."""
        return [key for key, count in self.accepted.items() if count > 1]


def stop_child(stack: Stack, child: Child, timeout_s: float = 30.0) -> bool:
    """SIGTERM one child and wait (SIGKILL after ``timeout_s``); True if it had to be killed."""
    killed = False
    if child.alive():
        child.process.terminate()
        try:
            child.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait(timeout=10)
            killed = True
    if child in stack.children:
        stack.children.remove(child)
    return killed


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of ``pid`` from /proc (MB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_for_log(
    child: Child, needle: str, timeout_s: float, count: int = 1, poll_s: float = 0.5
) -> list[str]:
    """Lines of ``child``'s log that contain ``needle``, once there are ``count`` of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = [
            line for line in child.log.read_text(errors="replace").splitlines() if needle in line
        ]
        if len(lines) >= count:
            return lines
        if not child.alive():
            raise RuntimeError(f"{child.name} exited: see {child.log}")
        await asyncio.sleep(poll_s)
    raise TimeoutError(f"{child.name}: no {needle!r} within {timeout_s:.0f}s: see {child.log}")


async def produce_keyed(
    settings: Settings,
    topic: str,
    records: Iterator[tuple[bytes, bytes]],
    partition_of: Callable[[bytes], int] | None = None,
    **config: Any,
) -> tuple[int, float]:
    """Produce (key, value) records to one topic, fast; see ``produce_batched``."""
    return await produce_batched(
        settings, ((topic, key, value) for key, value in records), partition_of, **config
    )


async def produce_batched(
    settings: Settings,
    records: Iterator[tuple[str, bytes, bytes]],
    partition_of: Callable[[bytes], int] | None = None,
    **config: Any,
) -> tuple[int, float]:
    """Produce (topic, key, value) records fast, in big batches, in the partition the
    default partitioner picks for the key (or ``partition_of(key)``); (count, seconds)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        acks=1,
        linger_ms=20,
        max_batch_size=1024 * 1024,
        max_request_size=8 * 1024 * 1024,
        **config,
        **client_options(settings.kafka),
    )
    await producer.start()
    began = time.perf_counter()
    count = 0
    try:
        open_batches: dict[tuple[str, int], Any] = {}
        pending: list[asyncio.Future[Any]] = []

        async def flush(topic: str, partition: int) -> None:
            batch = open_batches.pop((topic, partition), None)
            if batch is not None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))

        for topic, key, value in records:
            partition = (
                partition_of(key) if partition_of else partition_for(key, settings.kafka.partitions)
            )
            while True:
                batch = open_batches.get((topic, partition))
                if batch is None:
                    batch = open_batches[(topic, partition)] = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is not None:
                    break
                await flush(topic, partition)
            count += 1
            if len(pending) > 64:
                await asyncio.gather(*pending)
                pending.clear()
        for topic, partition in list(open_batches):
            await flush(topic, partition)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count, time.perf_counter() - began


@dataclass(frozen=True)
class Machine:
    """Where the suite ran."""

    cpu: str
    cores: int
    ram_gb: float
    versions: dict[str, str]

    def line(self) -> str:
        """One markdown paragraph."""
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return f"{self.cpu}, {self.cores} cores, {self.ram_gb:.1f} GB RAM; {versions}"


def machine(settings: Settings) -> Machine:
    """CPU model, cores, RAM, and the versions that matter."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    versions = {"Python": platform.python_version(), "Kafka": settings.kafka.version}
    for dist in ("aiokafka", "faust-streaming", "httpx", "pydantic", "rocksdict"):
        versions[dist] = version(dist)
    return Machine(cpu, os.cpu_count() or 0, mem_kb / 1024 / 1024, versions)


def dump(path: Path, data: object) -> None:
    """Raw results next to the report, for whoever wants every round."""
    path.write_text(json.dumps(data, indent=2, default=str))


def run_detached(module: str, options: list[str], tmp: Path) -> dict[str, Any]:
    """``python -m MODULE OPTIONS --json FILE`` in a process of its own (a run that starts,
    kills and restarts its own brokers shares nothing with the caller's); its summary,
    pass or fail. Its output goes to a log beside the summary."""
    name = module.rsplit(".", 1)[-1]
    summary, log = tmp / f"{name}.json", tmp / f"{name}.log"
    with open(log, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", module, *options, "--json", str(summary)],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if not summary.exists():
        raise RuntimeError(f"the {name} run wrote no summary (exit {done.returncode}): {log}")
    result: dict[str, Any] = json.loads(summary.read_text())
    return result
