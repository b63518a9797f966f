"""The dashboard's web server (FastAPI on uvicorn): the page, its JSON API and ``/metrics``.

It reads the projection only, through one store thread (``store_thread``): the event loop
never waits on SQL. ``now`` is the server's clock (``clock``), handed to the projection
functions. Every request passes the ``Guard`` first; every refusal is one line and a hint
(``errors``). The JSON routes are described at ``/api/openapi.json`` (behind the token,
like all of ``/api/``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clients.committed_log import TRANSIENT
from config.settings import Settings
from events.delivery_state import DeliveryState
from events.errors import LedgerError
from events.ports import base_url, listening_socket
from events.redaction import redacted_data
from projections.budgets import budget_report, has_budget
from projections.dashboard.actions import Context, redrive, resolve
from projections.dashboard.budgets import ReleaseContext, release
from projections.dashboard.errors import Refused, install
from projections.dashboard.guard import Guard, check_binding
from projections.dashboard.lookup import MAX_QUERY, RUN_PAGE, run_page, search
from projections.dashboard.models import (
    ActionTaken,
    Budgets,
    RedriveRequest,
    Refusal,
    ReleaseRequest,
    ReleaseTaken,
    ResolveRequest,
    SearchAnswer,
    Workers,
)
from projections.dashboard.overview import overview
from projections.dashboard.store_thread import StoreThread
from projections.health import SHOWN, endpoint_health
from projections.heartbeats import WorkerClock, clock_exposition, worker_clocks
from projections.metrics import CONTENT_TYPE, LogWatcher, exposition, projection_numbers
from projections.queries import delivery_state, endpoints, waiting_by_reason
from projections.store import Store
from receiver.uvicorn_server import header_timeout_protocol, serve_on

Clock = Callable[[], datetime]

STATIC = Path(str(files("projections.dashboard") / "static"))
MAX_LIMIT = 500
MAX_OFFSET = 10**9
CLOCKS_TTL_S = 5.0
DESCRIPTION = """\
The dashboard's data: the projection's answers (overview, one run, search, endpoints,
health, budgets, workers) and the operator's actions (resolve, redrive, release a budget),
each appended to the log as a signed event. With LEDGER_DASHBOARD__TOKEN set, everything
under /api/ and /metrics needs `Authorization: Bearer <token>`, and an action must come
from the dashboard's own page (Origin). Every refusal is one line of JSON and a hint.
"""


@dataclass
class _Clocks:
    clocks: list[WorkerClock] = field(default_factory=list)
    read_at: datetime | None = None
    read: bool = False  # whether the last attempt read the heartbeats


@dataclass
class Held:
    """What one dashboard holds while it serves."""

    settings: Settings
    clock: Clock
    store: StoreThread
    watcher: LogWatcher
    clocks: _Clocks = field(default_factory=_Clocks)

    def acting(self) -> Context:
        """What an operator action needs: settings, now, the projection's state of a key."""

        async def read_state(key: str) -> DeliveryState | None:
            return await self.store.run(lambda s: delivery_state(s, key))

        return Context(self.settings, self.clock(), read_state)

    async def worker_clocks(self) -> list[WorkerClock]:
        """The workers' heartbeats, read at most every few seconds (none if the broker
        does not answer: the projection's answers stand on their own)."""
        cache = self.clocks
        now = self.clock()
        if cache.read_at is None or (now - cache.read_at).total_seconds() > CLOCKS_TTL_S:
            try:
                cache.clocks = await worker_clocks(self.settings.kafka, now, timeout_s=5.0)
                cache.read = True
            except TRANSIENT:
                cache.clocks, cache.read = [], False
            cache.read_at = now
        return cache.clocks


def _held(request: Request) -> Held:
    found: Held = request.app.state.held
    return found


def _encoded(data: Any) -> bytes:
    # Every answer of data passes here: no URL from an event leaves with its credentials.
    # surrogatepass: a lone surrogate in a query or a row is shown escaped, never a 500.
    text = json.dumps(redacted_data(data), default=str)
    return text.encode("utf-8", "surrogatepass")


def _json(data: Any) -> Response:
    return Response(_encoded(data), media_type="application/json")


async def _json_off_loop(data: Any) -> Response:
    """``_json`` with the redaction and encoding in a thread: a page of a big run must not
    hold up the other requests (the store's own thread stays free for queries)."""
    return Response(await asyncio.to_thread(_encoded, data), media_type="application/json")


class _HeadAsGet:
    """HEAD answered as GET without its body (FastAPI's routes take only the methods
    they name; the page, the data and /healthz answer HEAD, as they did on aiohttp)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headless(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headless)


Limit = Annotated[int, Query(description=f"rows per table, cut to 0..{MAX_LIMIT}")]
REFUSALS: dict[int | str, dict[str, Any]] = {
    status: {"model": Refusal} for status in (400, 401, 421, 503)
}
ACTION_REFUSALS: dict[int | str, dict[str, Any]] = {
    status: {"model": Refusal} for status in (400, 401, 403, 404, 409, 413, 415, 503)
}


def _action(
    app: FastAPI, path: str, answer: type[BaseModel], body: type[BaseModel]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An operator action's route: 202 with ``answer``; its JSON ``body`` described in the
    OpenAPI document but read and checked by the action itself, so that each refusal keeps
    its own status and words."""
    ref = {"$ref": f"#/components/schemas/{body.__name__}"}
    return app.post(
        path,
        status_code=202,
        response_model=answer,
        responses=ACTION_REFUSALS,
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}
        },
    )


BODIES = (ResolveRequest, RedriveRequest, ReleaseRequest)


def _routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    @app.get("/runs/{run_id}", include_in_schema=False)
    async def page() -> FileResponse:
        """The page shell; app.js fills it from the API (dashboard or run page by path)."""
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/overview", responses=REFUSALS)
    async def api_overview(request: Request, limit: Limit = 50) -> Response:
        """Counters, charts, UNKNOWN and overdue tables."""
        held = _held(request)
        settings, now, cut = held.settings, held.clock(), max(0, min(MAX_LIMIT, limit))
        data = await held.store.run(
            lambda s: overview(
                s, now, settings.dashboard.thresholds, cut, held.store.cache
            ).to_json()
        )
        data["refresh_seconds"] = settings.dashboard.refresh_s
        return _json(data)

    @app.get("/api/runs/{run_id}", responses={**REFUSALS, 404: {"model": Refusal}})
    async def api_run(
        request: Request,
        run_id: str,
        offset: Annotated[int, Query(description="the first delivery shown")] = 0,
        limit: Annotated[int, Query(description="deliveries per page")] = RUN_PAGE,
        key: Annotated[str | None, Query(description="the page holding this key")] = None,
    ) -> Response:
        """The three answers and the timeline of one run, a page of its deliveries at a
        time (``page`` says where, and what next)."""
        start = max(0, min(MAX_OFFSET, offset))
        try:
            data = await _held(request).store.run(
                lambda s: run_page(s, run_id, start, limit, key or None)
            )
        except LedgerError as exc:
            raise Refused(404, exc.message, exc.hint) from None
        return await _json_off_loop(data)

    @app.get("/api/search", response_model=SearchAnswer, responses=REFUSALS)
    async def api_search(request: Request, q: str = "") -> Response:
        """Runs and deliveries by run id or idempotency key (or prefix)."""
        matches = await _held(request).store.run(lambda s: search(s, q))
        return await _json_off_loop({"query": q[:MAX_QUERY], "matches": matches})

    @app.get("/api/workers", response_model=Workers, responses=REFUSALS)
    async def api_workers(request: Request) -> Response:
        """Every worker's last heartbeat: its clock, whether it acts."""
        clocks = await _held(request).worker_clocks()
        return _json({"workers": [c.to_json() for c in clocks]})

    @app.get("/api/endpoints", responses=REFUSALS)
    async def api_endpoints(request: Request) -> Response:
        """The registry's endpoints and their state, and how many deliveries wait, by
        reason."""
        data = await _held(request).store.run(
            lambda s: {"endpoints": endpoints(s, MAX_LIMIT), "waiting": waiting_by_reason(s)}
        )
        return await _json_off_loop(data)

    @app.get("/api/health", responses=REFUSALS)
    async def api_health(request: Request, limit: Limit = SHOWN) -> Response:
        """Per endpoint the success ratio, latency p50/p99, breaker and state, pending and
        waiting by reason (the busiest N, the rest summed as ``(other)``); per agent, the
        deliveries held over budget."""
        held = _held(request)
        now, cut = held.clock(), max(0, min(MAX_LIMIT, limit))
        configured = list(held.settings.channels.webhook_endpoints)
        data = await held.store.run(
            lambda s: endpoint_health(s, now, configured, cut, held.store.cache).to_json()
        )
        return await _json_off_loop(data)

    @_action(app, "/api/deliveries/{key}/resolve", ActionTaken, ResolveRequest)
    async def api_resolve(request: Request, key: str) -> Response:
        """An operator settles an UNKNOWN delivery: delivered, not delivered, abandoned."""
        return await resolve(request, _held(request).acting())

    @_action(app, "/api/deliveries/{key}/redrive", ActionTaken, RedriveRequest)
    async def api_redrive(request: Request, key: str) -> Response:
        """An operator sends a FAILED delivery again (an UNKNOWN is reconciled first)."""
        return await redrive(request, _held(request).acting())

    @app.get("/api/budgets", response_model=Budgets, responses=REFUSALS)
    async def api_budgets(request: Request) -> Response:
        """Per agent's budget, its limit, its use of the current window, when that
        resets, and how many deliveries are held over it."""
        held = _held(request)
        now = held.clock()
        return _json(await held.store.run(lambda s: budget_report(s, now)))

    @_action(app, "/api/budgets/{agent}/release", ReleaseTaken, ReleaseRequest)
    async def api_release(request: Request, agent: str) -> Response:
        """An operator lets an agent's held deliveries go."""
        held = _held(request)

        async def knows(agent: str, channel: str | None) -> bool:
            return await held.store.run(lambda s: has_budget(s, agent, channel))

        return await release(request, ReleaseContext(held.settings, knows))

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE: {}}}},
    )
    async def metrics(request: Request) -> Response:
        """Prometheus text format."""
        held = _held(request)
        settings, now = held.settings, held.clock()
        numbers = await held.store.run(
            lambda s: projection_numbers(
                s, now, settings.dashboard.thresholds, held.store.cache, settings
            )
        )
        logged = await held.watcher.numbers()
        clocks = await held.worker_clocks()
        body = exposition(numbers, logged, settings) + clock_exposition(
            clocks, read=held.clocks.read
        )
        return Response(body, headers={"Content-Type": CONTENT_TYPE})

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> PlainTextResponse:
        """Liveness, without data (no token needed)."""
        return PlainTextResponse("ok\n")


def _with_bodies(app: FastAPI) -> None:
    """The actions' bodies as components of the OpenAPI document."""
    generated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generated()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in BODIES:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings, store: Store, clock: Clock | None = None) -> FastAPI:
    """The dashboard application over an opened, read-ready ``store``; its store thread
    and log watcher stop with the app (its lifespan)."""
    check_binding(settings.dashboard)
    held = Held(
        settings,
        clock or (lambda: datetime.now(UTC)),
        StoreThread(store),
        LogWatcher(settings),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await held.watcher.stop()
            held.store.close()

    app = FastAPI(
        title="delivery-ledger dashboard",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/api/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.held = held
    install(app)
    _routes(app)
    _with_bodies(app)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(Guard, settings=settings.dashboard)
    app.add_middleware(_HeadAsGet)
    return app


async def serve(
    settings: Settings,
    store: Store,
    stop: asyncio.Event,
    *,
    clock: Clock | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until ``stop`` is set; ``ready`` gets the URL once listening.

    Over h11 with the receiver kit's header read timeout: a connection that trickles its
    request head is closed, and h11 refuses what the guard should never see (an HTTP/1.1
    request without Host, a head over its 16 KiB)."""
    app = create_app(settings, store, clock)
    host = settings.dashboard.host
    sock = listening_socket(host, settings.dashboard.port)
    await serve_on(
        app,
        sock,
        stop,
        ready=None if ready is None else lambda port: ready(base_url(host, port) + "/"),
        http=header_timeout_protocol(),
        lifespan="on",
    )
