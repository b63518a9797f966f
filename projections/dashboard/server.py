"""The dashboard's web server (aiohttp): the page, its JSON API and ``/metrics``.

It reads the projection only. The store is used from one dedicated thread, so its
connection is never shared between threads and the event loop never waits on SQL.
``now`` is the server's clock (``clock``), handed to the projection functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from clients.committed_log import TRANSIENT
from config.settings import Settings
from events.delivery_state import DeliveryState
from events.errors import LedgerError
from events.outage import Backoff, Outage, reason
from events.ports import listen_port
from events.redaction import redacted_data
from projections.budgets import budget_report, has_budget
from projections.dashboard.actions import Context, redrive, resolve
from projections.dashboard.budgets import ReleaseContext, release
from projections.dashboard.guard import (
    SAFE_METHODS,
    allowed_hosts,
    authorized,
    check_binding,
    cross_site,
    host_allowed,
    misdirected,
    refused,
    unauthorized,
)
from projections.dashboard.lookup import MAX_QUERY, RUN_PAGE, run_page, search
from projections.dashboard.overview import overview
from projections.database import redacted
from projections.health import SHOWN, endpoint_health
from projections.heartbeats import WorkerClock, clock_exposition, worker_clocks
from projections.metrics import CONTENT_TYPE, LogWatcher, exposition, projection_numbers
from projections.queries import AggregateCache, delivery_state, endpoints, waiting_by_reason
from projections.store import Store

T = TypeVar("T")
Clock = Callable[[], datetime]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATIC = Path(str(files("projections.dashboard") / "static"))
MAX_LIMIT = 500
MAX_OFFSET = 10**9
# Data lives behind /api and /metrics; the page shell and its assets hold none.
PROTECTED = ("/api/", "/metrics")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

STORE_KEY = web.AppKey("store", Store)
SETTINGS_KEY = web.AppKey("settings", Settings)
CLOCK_KEY: web.AppKey[Clock] = web.AppKey("clock")
EXECUTOR_KEY = web.AppKey("executor", ThreadPoolExecutor)
WATCHER_KEY = web.AppKey("watcher", LogWatcher)
CACHE_KEY = web.AppKey("cache", AggregateCache)
HOSTS_KEY: web.AppKey[frozenset[str]] = web.AppKey("hosts")
CLOCKS_TTL_S = 5.0


@dataclass
class _Clocks:
    clocks: list[WorkerClock] = field(default_factory=list)
    read_at: datetime | None = None


CLOCKS_KEY = web.AppKey("clocks", _Clocks)
OUTAGE_KEY = web.AppKey("outage", Outage)
# How long one request waits for a projection database that stopped answering (then 503).
REQUEST_BUDGET_S = 3.0
RETRY_AFTER_S = 5
MAX_TRIES = 100


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await _checked(request, handler)
    except web.HTTPException as refused:  # 401, 421, 404...: the same headers
        refused.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
    # The Host first: a rebound name learns nothing, not even whether a token is needed.
    if not host_allowed(
        request.headers.get("Host"), request.app[SETTINGS_KEY].dashboard, request.app[HOSTS_KEY]
    ):
        raise misdirected()
    settings = request.app[SETTINGS_KEY]
    token = settings.dashboard.token.get_secret_value() if settings.dashboard.token else ""
    changes = request.method not in SAFE_METHODS
    # A request that changes something comes from the dashboard's own page, whatever it
    # carries: a forged cross-site one is refused before its token is even looked at.
    if changes and (why := cross_site(request.headers, request.headers.get("Host"))):
        raise refused(
            f"refused: {why}",
            "operator actions are taken from the dashboard's own page (or 'ledger resolve' "
            "and 'ledger redrive')",
        )
    if changes and not token:
        raise refused(
            "operator actions need the dashboard's token, and none is configured",
            "set LEDGER_DASHBOARD__TOKEN and open the dashboard with #token=...; "
            "reading needs no token on loopback",
        )
    if (
        token
        and (changes or request.path.startswith(PROTECTED))
        and not authorized(request.headers.get("Authorization"), token)
    ):
        raise unauthorized()
    return await handler(request)


async def _in_store(request: web.Request, work: Callable[[Store], T]) -> T:
    store = request.app[STORE_KEY]
    outage = request.app[OUTAGE_KEY]
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(
            request.app[EXECUTOR_KEY], _reconnecting, store, outage, work
        )
    except ProjectionUnavailable as exc:
        raise web.HTTPServiceUnavailable(
            text=json.dumps(
                {
                    "error": "the projection database is unavailable",
                    "detail": str(exc),
                    "hint": "it is restarting or unreachable; the dashboard reconnects by itself",
                }
            ),
            content_type="application/json",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None


class ProjectionUnavailable(Exception):
    """The projection database did not answer within one request's budget."""


def _reconnecting(store: Store, outage: Outage, work: Callable[[Store], T]) -> T:
    """``work`` on the store (in the store's thread); on the database's own failure,
    reconnect (with backoff) within ``REQUEST_BUDGET_S``, else ``ProjectionUnavailable``.
    The outage is logged once when it begins and once when it ends."""
    deadline = time.monotonic() + REQUEST_BUDGET_S
    backoff = Backoff()
    for attempt in range(MAX_TRIES):
        try:
            if attempt or outage.ongoing:
                store.reconnect()  # the old connection died with the server
            result = work(store)
        except store.system_errors as exc:
            outage.failed(exc)
            # The first failure may be only a connection the restart left behind: at once.
            delay = 0.0 if attempt == 0 else backoff.next_delay()
            if time.monotonic() + delay >= deadline:
                raise ProjectionUnavailable(reason(exc)) from None
            time.sleep(delay)
            continue
        except LedgerError as exc:  # reconnect refused: a configuration error
            if attempt == 0 and not outage.ongoing:
                raise  # not from reconnecting: the work's own answer (e.g. no such run)
            outage.failed(exc)
            raise ProjectionUnavailable(f"{exc.message} ({exc.hint})") from None
        outage.recovered()
        return result
    raise ProjectionUnavailable("too many attempts")


def _json(data: Any, status: int = 200) -> web.Response:
    # Every answer passes here: no URL from an event leaves with its credentials.
    return web.Response(body=_encoded(data), status=status, content_type="application/json")


def _encoded(data: Any) -> bytes:
    # surrogatepass: a lone surrogate in a query or a row is shown escaped, never a 500.
    text = json.dumps(redacted_data(data), default=str)
    return text.encode("utf-8", "surrogatepass")


async def _json_off_loop(data: Any, status: int = 200) -> web.Response:
    """``_json`` with the redaction and encoding in a thread: a page of a big run must not
    hold up the other requests (the store's own thread stays free for queries)."""
    body = await asyncio.to_thread(_encoded, data)
    return web.Response(body=body, status=status, content_type="application/json")


async def page(request: web.Request) -> web.FileResponse:
    """The page shell; app.js fills it from the API (dashboard or run page by path)."""
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def api_overview(request: web.Request) -> web.Response:
    """``GET /api/overview?limit=N``: counters, charts, UNKNOWN and overdue tables."""
    try:
        limit = max(0, min(MAX_LIMIT, int(request.query.get("limit", "50"))))
    except ValueError:
        return _json({"error": "limit must be an integer"}, 400)
    settings = request.app[SETTINGS_KEY]
    now = request.app[CLOCK_KEY]()
    data = await _in_store(
        request,
        lambda s: overview(
            s, now, settings.dashboard.thresholds, limit, request.app[CACHE_KEY]
        ).to_json(),
    )
    data["refresh_seconds"] = settings.dashboard.refresh_s
    return _json(data)


async def api_run(request: web.Request) -> web.Response:
    """``GET /api/runs/{run_id}?offset=&limit=&key=``: the three answers and the timeline
    of one run, a page of its deliveries at a time (``page`` says where, and what next)."""
    run_id = request.match_info["run_id"]
    try:
        offset = max(0, min(MAX_OFFSET, int(request.query.get("offset", "0"))))
        limit = int(request.query.get("limit", str(RUN_PAGE)))
    except ValueError:
        return await _json_off_loop({"error": "offset and limit must be integers"}, 400)
    key = request.query.get("key") or None
    try:
        data = await _in_store(request, lambda s: run_page(s, run_id, offset, limit, key))
    except LedgerError as exc:
        return _json({"error": exc.message, "hint": exc.hint}, 404)
    return await _json_off_loop(data)


async def api_search(request: web.Request) -> web.Response:
    """``GET /api/search?q=``: runs and deliveries by run id or idempotency key (or prefix)."""
    query = request.query.get("q", "")
    matches = await _in_store(request, lambda s: search(s, query))
    return await _json_off_loop({"query": query[:MAX_QUERY], "matches": matches})


async def api_endpoints(request: web.Request) -> web.Response:
    """``GET /api/endpoints``: the registry's endpoints and their state, and how many
    deliveries wait, by reason."""
    data = await _in_store(
        request, lambda s: {"endpoints": endpoints(s, MAX_LIMIT), "waiting": waiting_by_reason(s)}
    )
    return await _json_off_loop(data)


async def api_health(request: web.Request) -> web.Response:
    """``GET /api/health?limit=N``: per endpoint the success ratio, latency p50/p99,
    breaker and state, pending and waiting by reason (the busiest N, the rest summed as
    ``(other)``); per agent, the deliveries held over budget."""
    try:
        limit = max(0, min(MAX_LIMIT, int(request.query.get("limit", str(SHOWN)))))
    except ValueError:
        return _json({"error": "limit must be an integer"}, 400)
    settings = request.app[SETTINGS_KEY]
    now = request.app[CLOCK_KEY]()
    configured = list(settings.channels.webhook_endpoints)
    data = await _in_store(
        request,
        lambda s: endpoint_health(s, now, configured, limit, request.app[CACHE_KEY]).to_json(),
    )
    return await _json_off_loop(data)


async def api_budgets(request: web.Request) -> web.Response:
    """``GET /api/budgets``: per agent's budget, its limit, its use of the current window,
    when that resets, and how many deliveries are held over it."""
    now = request.app[CLOCK_KEY]()
    return _json(await _in_store(request, lambda s: budget_report(s, now)))


async def api_release(request: web.Request) -> web.Response:
    """``POST /api/budgets/{agent}/release`` (JSON): an operator lets held deliveries go."""

    async def knows(agent: str, channel: str | None) -> bool:
        return await _in_store(request, lambda s: has_budget(s, agent, channel))

    return await release(request, ReleaseContext(request.app[SETTINGS_KEY], knows))


def _acting(request: web.Request) -> Context:
    async def read_state(key: str) -> DeliveryState | None:
        return await _in_store(request, lambda s: delivery_state(s, key))

    return Context(request.app[SETTINGS_KEY], request.app[CLOCK_KEY](), read_state)


async def api_resolve(request: web.Request) -> web.Response:
    """``POST /api/deliveries/{key}/resolve`` (JSON): an operator settles the delivery."""
    return await resolve(request, _acting(request))


async def api_redrive(request: web.Request) -> web.Response:
    """``POST /api/deliveries/{key}/redrive`` (JSON): an operator sends the delivery again."""
    return await redrive(request, _acting(request))


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text format."""
    settings = request.app[SETTINGS_KEY]
    now = request.app[CLOCK_KEY]()
    numbers = await _in_store(
        request,
        lambda s: projection_numbers(
            s, now, settings.dashboard.thresholds, request.app[CACHE_KEY], settings
        ),
    )
    logged = await request.app[WATCHER_KEY].numbers()
    body = exposition(numbers, logged, settings) + clock_exposition(await _clocks(request))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def api_workers(request: web.Request) -> web.Response:
    """``GET /api/workers``: every worker's last heartbeat: its clock, whether it acts."""
    return _json({"workers": [c.to_json() for c in await _clocks(request)]})


async def _clocks(request: web.Request) -> list[WorkerClock]:
    """The workers' heartbeats, read at most every few seconds (none if the broker does
    not answer: the projection's answers stand on their own)."""
    cache = request.app[CLOCKS_KEY]
    now = request.app[CLOCK_KEY]()
    if cache.read_at is None or (now - cache.read_at).total_seconds() > CLOCKS_TTL_S:
        try:
            cache.clocks = await worker_clocks(request.app[SETTINGS_KEY].kafka, now, timeout_s=5.0)
        except TRANSIENT:
            cache.clocks = []
        cache.read_at = now
    return cache.clocks


async def healthz(request: web.Request) -> web.Response:
    """Liveness, without data (no token needed)."""
    return web.Response(text="ok\n")


def create_app(settings: Settings, store: Store, clock: Clock | None = None) -> web.Application:
    """The dashboard application over an opened, read-ready ``store``."""
    check_binding(settings.dashboard)
    app = web.Application(middlewares=[_guard])
    app[SETTINGS_KEY] = settings
    app[HOSTS_KEY] = allowed_hosts(settings.dashboard)
    app[STORE_KEY] = store
    app[CLOCK_KEY] = clock or (lambda: datetime.now(UTC))
    app[CLOCKS_KEY] = _Clocks()
    # One thread owns the connection: SQLite connections must not be used concurrently.
    app[EXECUTOR_KEY] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-store")
    app[WATCHER_KEY] = LogWatcher(settings)
    # Used only from the store's thread, like the connection itself.
    app[CACHE_KEY] = AggregateCache()
    app[OUTAGE_KEY] = Outage(
        logging.getLogger("ledger.dashboard"),
        f"projection database {redacted(store.dsn)}",
        limit_s=math.inf,
    )

    async def cleanup(app: web.Application) -> None:
        await app[WATCHER_KEY].stop()
        app[EXECUTOR_KEY].shutdown(wait=True)

    app.on_cleanup.append(cleanup)
    app.router.add_get("/", page)
    app.router.add_get("/runs/{run_id}", page)
    app.router.add_get("/api/overview", api_overview)
    app.router.add_get("/api/runs/{run_id}", api_run)
    app.router.add_get("/api/search", api_search)
    app.router.add_get("/api/workers", api_workers)
    app.router.add_get("/api/endpoints", api_endpoints)
    app.router.add_get("/api/health", api_health)
    app.router.add_post("/api/deliveries/{key}/resolve", api_resolve)
    app.router.add_post("/api/deliveries/{key}/redrive", api_redrive)
    app.router.add_get("/api/budgets", api_budgets)
    app.router.add_post("/api/budgets/{agent}/release", api_release)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static/", STATIC)
    return app


async def serve(
    settings: Settings,
    store: Store,
    stop: asyncio.Event,
    *,
    clock: Clock | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until ``stop`` is set; ``ready`` gets the URL once listening."""
    app = create_app(settings, store, clock)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(
            runner,
            settings.dashboard.host,
            listen_port(settings.dashboard.port, settings.dashboard.host),
        )
        await site.start()
        if ready is not None:
            ready(url_of(runner, settings))
        await stop.wait()
    finally:
        await runner.cleanup()


def url_of(runner: web.AppRunner, settings: Settings) -> str:
    """The base URL the runner listens on (the real port when 0 was asked for)."""
    port = settings.dashboard.port
    for address in runner.addresses:
        if isinstance(address, tuple):
            port = address[1]
            break
    host = settings.dashboard.host
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"
