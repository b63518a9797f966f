"""Traces' cost (issue 29): worker CPU per delivery with tracing off and on, side by side.

Three ``ledger worker`` processes, each on topics of its own, over the same broker and the
same receiver (the fake provider), measured in turn in every round:

* ``off``: no ``OTEL_*`` variable, requests without a trace context (the baseline);
* ``off, context``: tracing off, every request carries a ``traceparent`` header (the worker
  keeps it and passes it on to the receiver: the cost of an agent that traces when the
  ledger does not);
* ``on``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, every request with a ``traceparent``: claim,
  send, HTTP client and confirm spans per delivery, batched and exported over OTLP/HTTP to a
  sink in this process (it decodes and counts the spans; its CPU is not the worker's).

A round produces a backlog of N requests at once into each worker's topic in turn and
measures the worker's CPU (/proc/PID/stat) while it drains to CONFIRMED.

    python -m bench.tracing [--backlog 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from rich.progress import Progress

from bench.common import (
    BROKER_PORT,
    bench_broker,
    cpu_seconds,
    fresh_settings,
    start_python,
    start_receiver,
    stop_child,
)
from bench.e2e import Confirmations, requests_for, wait_owned
from clients.kafka_security import client_options
from clients.outcome_signing import new_pair
from config import Settings
from events.ports import free_port
from ledger.stack import Child, Stack, settings_env
from ledger.topics import create_topics

VARIANTS = ("off", "off, context", "on")
PORTS = {"off": 29791, "off, context": 29792, "on": 29793}
# Off or on: the worker's CPU per delivery may grow by at most this share.
TARGET_OFF = 0.03


class SpanSink:
    """An OTLP/HTTP trace endpoint on 127.0.0.1 that decodes and counts what it gets."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                sink.spans += sum(
                    len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans
                )
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _traceparent(rng: random.Random) -> bytes:
    return f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01".encode()


async def _produce(settings: Settings, batch: list[tuple[str, bytes]], traced: bool) -> None:
    """The backlog, at once; each record with a ``traceparent`` header if ``traced``."""
    rng = random.Random()
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        acks=1,
        linger_ms=20,
        max_batch_size=1024 * 1024,
        **client_options(settings.kafka),
    )
    await producer.start()
    try:
        sent = [
            await producer.send(
                settings.kafka.topic_deliveries,
                value,
                key=key.encode(),
                headers=[("traceparent", _traceparent(rng))] if traced else None,
            )
            for key, value in batch
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def _worker(stack: Stack, settings: Settings, variant: str, sink: SpanSink) -> Child:
    env = {k: v for k, v in settings_env(settings).items() if not k.startswith("OTEL_")}
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread (a stalled worker)
    if variant == "on":
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.port}"}
    name = "trace-" + variant.replace(", ", "-")
    port = PORTS[variant]
    args = ["-m", "ledger", "worker", "--name", name, "--metrics-port", str(port)]
    return start_python(stack, name, args, env)


async def measure(
    base: Settings,
    urls: dict[str, str],
    stack: Stack,
    *,
    backlog: int,
    rounds: int,
    progress: Progress | None = None,
    variants: tuple[str, ...] = VARIANTS,
) -> dict[str, Any]:
    """CPU ms per delivery of each variant's worker, every round, in turn."""
    sink = SpanSink()
    # The workers sign their outcome events (on by default) with a pair of this run's.
    signing, verify = new_pair()
    pair = {"signing.signing_key": signing, "signing.verify_keys": [verify]}
    settings = {v: fresh_settings(base, "trace-" + v.replace(", ", "-"), pair) for v in variants}
    for one in settings.values():
        await create_topics(one)
    workers = {v: _worker(stack, settings[v], v, sink) for v in variants}
    cpu_ms: dict[str, list[float]] = {v: [] for v in variants}
    rate: dict[str, list[float]] = {v: [] for v in variants}
    stalled: dict[str, str] = {}
    try:
        for variant in variants:
            only = {"x": PORTS[variant]}
            await wait_owned([_renamed(workers[variant])], base.kafka.partitions, ports=only)
        async with contextlib.AsyncExitStack() as exits:
            seen = {
                v: await exits.enter_async_context(Confirmations(settings[v])) for v in variants
            }
            for variant in variants:  # warm-up: connections open, code paths hot
                warm = requests_for(urls, f"warm-{uuid.uuid4().hex[:6]}", 64)
                await _produce(settings[variant], warm, variant != "off")
                await seen[variant].wait([k for k, _ in warm], 120.0, progress, f"{variant} warm")
            await asyncio.sleep(2)
            spans_before = sink.spans
            for r in range(rounds):
                for variant in variants:
                    if variant in stalled:
                        continue  # its backlog is still draining: no fair round now
                    pid = workers[variant].process.pid
                    batch = requests_for(urls, f"t{r}-{uuid.uuid4().hex[:6]}", backlog)
                    before, began = cpu_seconds(pid), time.monotonic()
                    await _produce(settings[variant], batch, variant != "off")
                    keys = [k for k, _ in batch]
                    label = f"tracing {variant} {r + 1}/{rounds}"
                    try:
                        await seen[variant].wait(keys, max(300.0, backlog / 5), progress, label)
                    except TimeoutError as exc:
                        stalled[variant] = f"round {r + 1}: {exc}"  # recorded, not hidden
                        continue
                    cpu_ms[variant].append((cpu_seconds(pid) - before) * 1000 / backlog)
                    rate[variant].append(backlog / (time.monotonic() - began))
            await asyncio.sleep(1.0)  # the last batch of spans (exported every 5 s at most)
            for _ in range(60):
                if sink.spans - spans_before >= 4 * backlog * rounds:
                    break
                await asyncio.sleep(0.5)
            spans = sink.spans - spans_before
    finally:
        for child in workers.values():
            stop_child(stack, child)
        sink.close()
    return {
        "backlog": backlog,
        "cpu_ms_per_delivery": cpu_ms,
        "per_s": rate,
        "spans_per_delivery": spans / (backlog * rounds),
        "stalled": stalled,
    }


def _renamed(child: Child) -> Child:
    """``child`` under a name whose last character is ``x`` (wait_owned's port lookup)."""
    return Child(child.name + "-x", child.process, child.log)


def rows(results: dict[str, Any], row: Callable[..., None]) -> None:
    """bench/run_all.py's rows: off with a context and on, each against off."""
    cpu = {v: statistics.median(results["cpu_ms_per_delivery"][v]) for v in VARIANTS}
    base = cpu["off"]
    row(
        "tracing off, requests with a trace context: worker CPU ms per delivery (vs off, none)",
        f"{cpu['off, context']:.2f}",
        f"{base:.2f}",
        f"{cpu['off, context'] / base:.2f}x",
        f"<= {1 + TARGET_OFF:.2f}x",
        cpu["off, context"] <= base * (1 + TARGET_OFF),
    )
    row(
        "tracing on (OTLP/HTTP, 4 spans per delivery): worker CPU ms per delivery (vs off)",
        f"{cpu['on']:.2f}",
        f"{base:.2f}",
        f"{cpu['on'] / base:.2f}x",
    )


def note(results: dict[str, Any]) -> str:
    """The details line."""
    each = "; ".join(
        f"{v}: " + ", ".join(f"{x:.2f}" for x in results["cpu_ms_per_delivery"][v])
        for v in VARIANTS
    )
    rates = "; ".join(
        f"{v}: " + ", ".join(f"{x:,.0f}" for x in results["per_s"][v]) for v in VARIANTS
    )
    stalled = "".join(
        f" **{v} did not drain in time, {why}**;" for v, why in results.get("stalled", {}).items()
    )
    return (
        f"Tracing (bench/tracing.py),{stalled} one worker per variant, backlogs of "
        f"{results['backlog']:,} in turn: CPU ms per delivery {each}; drained per s {rates}; "
        f"{results['spans_per_delivery']:.1f} spans exported per delivery when on."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=VARIANTS, help="only these variants")
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT,
                        help="its own broker on this port and the next")  # fmt: skip
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    with bench_broker(tmp, args.broker_port) as settings:
        stack = Stack(tmp / "logs")
        try:
            urls = start_receiver(stack, settings)
            results = asyncio.run(
                measure(
                    settings,
                    urls,
                    stack,
                    backlog=args.backlog,
                    rounds=args.rounds,
                    variants=tuple(args.only or VARIANTS),
                )
            )
        finally:
            stack.stop()
    print(results)
    lines: list[str] = []
    rows(results, lambda *cells, **_: lines.append(" | ".join(str(c) for c in cells)))
    print("\n".join(lines))
    print(note(results))


if __name__ == "__main__":
    main()
