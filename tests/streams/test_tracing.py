"""Traces end to end, with real processes exporting OTLP/HTTP to a collector this test runs
(spans decoded with OpenTelemetry's own protocol messages): an agent process publishes a run
under its span, a real ``ledger worker`` delivers it to a receiver-kit app (its own
process), and one trace runs from the agent's span to the kit's handler span, in order,
with the idempotency key and fencing token on the worker's and the kit's spans. A delivery
whose send times out after writing is settled by a lookup: that lookup is a span of the
same trace. With tracing off (``OTEL_SDK_DISABLED=true`` over an endpoint) the worker
exports nothing and loads no SDK, yet passes the agent's context on to the receiver."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from clients.tracing import configure_tracing, tracing_wanted
from config.settings import Settings, WebhookEndpoint, changed
from events.delivery_state import DeliveryState, Status
from events.ports import free_port
from ledger.stack import settings_env
from tests.fixtures.broker import ReadTopic, fresh_topics
from tests.fixtures.secrets import TEST_WEBHOOK_SECRET
from tests.fixtures.worker import (
    LedgerView,
    WorkerFactory,
    fast_workers,
    ledger_view_of,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("tracing")


@dataclass(frozen=True)
class Span:
    """One span as the collector decoded it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


@dataclass
class Collector:
    """An OTLP/HTTP trace collector on 127.0.0.1: POST /v1/traces, protobuf bodies."""

    port: int
    spans: list[Span] = field(default_factory=list)
    services: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def env(self) -> dict[str, str]:
        """What points a process's exporter here, exporting within 0.1 s."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource_spans in request.resource_spans:
                attributes = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                service = str(attributes.get("service.name"))
                self.services.add(service)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            Span(
                                service,
                                span.name,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                span.kind,
                                span.start_time_unix_nano,
                                {a.key: _value(a.value) for a in span.attributes},
                            )
                        )

    def trace(self, trace_id: str) -> dict[str, list[Span]]:
        """The spans of one trace, by name."""
        by_name: dict[str, list[Span]] = {}
        with self.lock:
            for span in self.spans:
                if span.trace_id == trace_id:
                    by_name.setdefault(span.name, []).append(span)
        return by_name


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    made = Collector(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                made.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", made.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield made
    server.shutdown()
    server.server_close()


@dataclass
class KitApp:
    """The receiver-kit app of tracing_apps.py, tracing on."""

    base: str
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def kit_app(collector: Collector, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitApp]:
    tmp = tmp_path_factory.mktemp("kit")
    port = free_port()
    log = tmp / "receiver.log"
    env = os.environ | collector.env
    env |= {
        "PORT": str(port),
        "RECEIVER_DB": str(tmp / "receiver.sqlite3"),
        "WEBHOOK_SECRET": TEST_WEBHOOK_SECRET,
        "PYTHONPATH": str(ROOT),
    }
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.streams.tracing_apps", "receiver"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    app = KitApp(f"http://127.0.0.1:{port}", process, log)
    for _ in range(150):
        try:
            httpx.get(f"{app.base}/hooks/lookup/probe", timeout=1)
            break
        except httpx.TransportError:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
    else:
        raise AssertionError(f"the receiver did not listen: {log.read_text()}")
    yield app
    process.terminate()
    process.wait(10)


def _agent(settings: Settings, collector: Collector, runs: list[dict[str, Any]]) -> list[Any]:
    """Run the agent process; each run's key and trace id."""
    runs = [{"payload": {}} | run for run in runs]
    env = settings_env(settings) | collector.env | {"TRACE_RUNS": json.dumps(runs)}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "tests.streams.tracing_apps", "agent"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _endpoints(factory: WorkerFactory, kit: KitApp) -> None:
    factory.settings = changed(
        factory.settings,
        {
            "channels.webhook_endpoints": {
                f"{kit.base}/hooks/": WebhookEndpoint(lookup_url=f"{kit.base}/hooks/lookup")
            },
            "worker.lookup_backoff_s": 0.5,
            "worker.lookup_backoff_max_s": 1.0,
        },
    )


async def _confirmed(view: LedgerView, keys: list[str], worker: Any) -> None:
    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        states = await view()
        return all(k in states and states[k].status is Status.CONFIRMED for k in keys)

    await wait_for(done, 40, "every delivery CONFIRMED", interval=0.2)


async def _spans(collector: Collector, trace_id: str, names: set[str]) -> dict[str, list[Span]]:
    async def arrived() -> bool:
        return names <= set(collector.trace(trace_id))

    try:
        await wait_for(arrived, 15, f"spans {sorted(names)}", interval=0.2)
    except AssertionError:
        raise AssertionError(
            f"missing {sorted(names - set(collector.trace(trace_id)))} in trace {trace_id}: "
            f"{sorted(collector.trace(trace_id))}"
        ) from None
    return collector.trace(trace_id)


def _one(spans: dict[str, list[Span]], name: str) -> Span:
    assert len(spans[name]) == 1, (name, spans[name])
    return spans[name][0]


def _chain(*spans: Span) -> None:
    """Each span is the child of the one before it, and starts no earlier."""
    for parent, child in itertools.pairwise(spans):
        assert child.parent_id == parent.span_id, f"{child.name}'s parent is not {parent.name}"
        assert child.start_ns >= parent.start_ns, f"{child.name} starts before {parent.name}"


def _marks(span: Span, key: str, token: int) -> None:
    assert span.attributes["ledger.idempotency_key"] == key, span
    assert int(span.attributes["ledger.fencing_token"]) == token, span


async def test_one_trace_from_the_agent_to_the_kits_handler_and_none_from_an_untraced_worker(
    broker: Settings,
    tmp_path: Path,
    read_topic: ReadTopic,
    worker_factory: WorkerFactory,
    collector: Collector,
    kit_app: KitApp,
    ledger_view: LedgerView,
) -> None:
    # Two workers side by side, each on topics of its own (the test's time is one
    # worker's start): one traced, one with an endpoint set but OTEL_SDK_DISABLED=true.
    _endpoints(worker_factory, kit_app)
    untraced = WorkerFactory(fast_workers(await fresh_topics(broker, tmp_path / "off")), tmp_path)
    _endpoints(untraced, kit_app)
    off = collector.env | {"OTEL_SDK_DISABLED": "true", "OTEL_SERVICE_NAME": "worker-off"}
    try:
        traced_worker = worker_factory.start("traced", env=collector.env)
        untraced_worker = untraced.start("untraced", env=off)
        runs, (unseen,) = await asyncio.gather(
            asyncio.to_thread(
                _agent,
                worker_factory.settings,
                collector,
                [
                    {"run_id": "run-traced", "recipient": f"{kit_app.base}/hooks/fast"},
                    # Its handler outlasts the worker's 1.5 s send deadline: UNKNOWN, then
                    # a lookup.
                    {
                        "run_id": "run-looked-up",
                        "recipient": f"{kit_app.base}/hooks/slow",
                        "payload": {"sleep_s": 2.5},
                    },
                ],
            ),
            asyncio.to_thread(
                _agent,
                untraced.settings,
                collector,
                [{"run_id": "run-untraced", "recipient": f"{kit_app.base}/hooks/off"}],
            ),
        )
        fast, slow = runs
        untraced_view = ledger_view_of(read_topic, untraced.settings.kafka.topic_deliveries)
        await asyncio.gather(
            _confirmed(ledger_view, [fast["key"], slow["key"]], traced_worker),
            _confirmed(untraced_view, [unseen["key"]], untraced_worker),
        )
        states = await ledger_view()
        await _traced(collector, kit_app, fast, states)
        await _looked_up(collector, slow, states)
        await _untraced(collector, unseen)
    finally:
        untraced.stop_all()


async def _traced(
    collector: Collector, kit_app: KitApp, fast: dict[str, str], states: dict[str, DeliveryState]
) -> None:
    """The delivery's trace: agent, publish, claim, send, POST, the kit's spans, confirm."""
    names = {
        "agent.run",
        "ledger.publish",
        "ledger.claim",
        "ledger.send",
        "POST",
        "ledger.receiver.receive",
        "ledger.receiver.handler",
        "ledger.confirm",
    }
    spans = await _spans(collector, fast["trace_id"], names)
    agent, publish, claim, send, post, receive, handler, confirm = (
        _one(spans, name)
        for name in (
            "agent.run",
            "ledger.publish",
            "ledger.claim",
            "ledger.send",
            "POST",
            "ledger.receiver.receive",
            "ledger.receiver.handler",
            "ledger.confirm",
        )
    )
    assert agent.parent_id == ""  # the agent's own root span
    _chain(agent, publish, claim, send, post, receive, handler)
    _chain(send, confirm)
    assert {agent.service, publish.service} == {"test-agent"}
    assert {claim.service, send.service, post.service, confirm.service} == {
        "delivery-ledger-worker"
    }
    assert {receive.service, handler.service} == {"test-receiver"}
    token = states[fast["key"]].fencing_token
    for span in (claim, send, confirm, handler):
        _marks(span, fast["key"], token)
    assert fast["key"] in publish.attributes["ledger.idempotency_keys"]
    assert send.attributes["ledger.outcome"] == "confirmed"
    # The instrumentation's conventions: the old ones unless OTEL_SEMCONV_STABILITY_OPT_IN.
    status = post.attributes.get(
        "http.response.status_code", post.attributes.get("http.status_code")
    )
    assert status == 200, post.attributes
    urls = [post.attributes[n] for n in ("url.full", "http.url") if n in post.attributes]
    assert urls == [f"{kit_app.base}/hooks/fast"] * len(urls) != [], post.attributes


async def _looked_up(
    collector: Collector, slow: dict[str, str], states: dict[str, DeliveryState]
) -> None:
    """The send that timed out after writing; the lookup that settled it, in the same trace."""
    names = {"ledger.publish", "ledger.send", "ledger.lookup", "GET", "ledger.receiver.lookup"}
    spans = await _spans(collector, slow["trace_id"], names | {"ledger.confirm"})
    publish = _one(spans, "ledger.publish")
    # The lookup that found it (an earlier one may have found it still processing).
    (lookup,) = [s for s in spans["ledger.lookup"] if s.attributes["ledger.outcome"] == "found"]
    (get,) = [s for s in spans["GET"] if s.parent_id == lookup.span_id]
    _chain(publish, lookup, get)
    (answered,) = [s for s in spans["ledger.receiver.lookup"] if s.parent_id == get.span_id]
    assert answered.attributes["http.response.status_code"] == 200
    confirm = _one(spans, "ledger.confirm")
    _chain(lookup, confirm)
    token = states[slow["key"]].fencing_token
    _marks(lookup, slow["key"], token)
    _marks(confirm, slow["key"], token)
    assert _one(spans, "ledger.send").attributes["ledger.outcome"] == "unknown"


async def _untraced(collector: Collector, run: dict[str, str]) -> None:
    """The untraced worker's delivery: the receiver's span is the publish span's child (the
    worker passed the context on unchanged), and the worker exported nothing at all."""
    names = {"ledger.publish", "ledger.receiver.receive", "ledger.receiver.handler"}
    spans = await _spans(collector, run["trace_id"], names)
    _chain(_one(spans, "ledger.publish"), _one(spans, "ledger.receiver.receive"))
    await asyncio.sleep(0.5)  # a worker exporting every 0.1 s would have posted by now
    assert "worker-off" not in collector.services
    assert {s.service for ss in collector.trace(run["trace_id"]).values() for s in ss} == {
        "test-agent",
        "test-receiver",
    }


README_RUNNER = """
import ast, asyncio
from clients.tracing import shutdown_tracing
from tests.readme import readme_block

code = compile(readme_block("tracing-example"), "README.md", "exec",
               flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

async def main():
    done = eval(code, {})
    if done is not None:
        await done

asyncio.run(main())
shutdown_tracing()
"""


async def test_the_readmes_tracing_example_puts_its_span_on_the_request_record(
    settings: Settings, read_topic: ReadTopic, collector: Collector
) -> None:
    """The README's agent, as written, in a process of its own: its span and the
    publisher's reach the collector, and the request's record carries the publish span's
    ``traceparent`` header."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", README_RUNNER],
        env=settings_env(settings) | collector.env | {"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = await read_topic(settings.kafka.topic_deliveries, raw=True)
    (header,) = [value.decode() for name, value in record.headers if name == "traceparent"]
    _version, trace_id, span_id, _flags = header.split("-")
    spans = await _spans(collector, trace_id, {"agent.run", "ledger.publish"})
    agent, publish = _one(spans, "agent.run"), _one(spans, "ledger.publish")
    _chain(agent, publish)
    assert publish.span_id == span_id
    assert {agent.service, publish.service} == {"my-agent"}
    assert publish.attributes["ledger.run_id"] == "run-43"


def test_the_rule_of_the_otel_variables() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not tracing_wanted({})
    assert tracing_wanted(endpoint)
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing_wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_wanted({**endpoint, "OTEL_SDK_DISABLED": "TRUE"})
    assert not tracing_wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert tracing_wanted({**endpoint, "OTEL_SDK_DISABLED": "false"})
    with pytest.raises(Exception, match="does not ship"):
        configure_tracing("t", {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(Exception, match="not shipped"):
        configure_tracing("t", {**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


PROBE = """
import sys, threading
from clients.tracing import configure_tracing, enabled
on = configure_tracing("probe")
print(on, enabled(), "opentelemetry.sdk" in sys.modules,
      any(t.name.startswith("OtelBatch") for t in threading.enumerate()))
"""


@pytest.mark.parametrize(
    ("env", "seen"),
    [
        ({}, "False False False False"),
        ({"OTEL_SDK_DISABLED": "true"}, "False False False False"),
        ({"OTEL_TRACES_EXPORTER": "none"}, "False False False False"),
        ({}, "True True True True"),
    ],
    ids=["no-endpoint", "sdk-disabled", "exporter-none", "on"],
)
def test_off_no_sdk_provider_nor_exporter_thread_exists(env: dict[str, str], seen: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if env or seen.startswith("True"):
        # An endpoint nobody listens on: nothing is exported before the probe exits.
        base["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=base | env | {"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == seen


API_PROBE = """
import asyncio, httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from api.tracing import RequestSpans

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def hello(request):
    return PlainTextResponse("ok", status_code=201)

app = RequestSpans(Starlette(routes=[Route("/v1/runs/{run_id}/complete", hello, methods=["POST"])]))
parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        await client.post("/v1/runs/run-1/complete", headers={"traceparent": parent})

asyncio.run(main())
(span,) = exporter.get_finished_spans()
print(span.name, f"{span.parent.span_id:016x}", f"{span.context.trace_id:032x}",
      span.attributes["http.response.status_code"], span.attributes["http.route"])
"""


def test_an_api_request_is_a_span_continuing_the_callers_traceparent() -> None:
    done = subprocess.run(
        [sys.executable, "-c", API_PROBE],
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        | {"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [
        "ledger.api",
        "POST",
        "/v1/runs/{run_id}/complete",
        "b7ad6b7169203331",
        "0af7651916cd43dd8448eb211c80319c",
        "201",
        "/v1/runs/{run_id}/complete",
    ]
