"""The API application: ``create_app(settings)`` (no module-level app)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from fastapi import FastAPI

from api.bodies import with_body_schemas
from api.errors import install
from api.limits import BodyLimit
from api.reads import router as reads_router
from api.runs import router as runs_router
from api.services import Services
from api.tracing import RequestSpans
from config.settings import Settings

DESCRIPTION = """\
Publish an agent's runs over HTTP: a run's result and its deliveries are written in ONE
Kafka transaction (the SDK's), idempotent by run id (the same request again gets the first
answer; a different one for the same run gets 409 naming the fields). Every error is one
line of JSON naming the field. Authenticate with an API key (`ledger api-keys create`).
"""


def create_app(
    settings: Settings,
    *,
    clock: Callable[[], datetime] | None = None,
    services: Services | None = None,
) -> FastAPI:
    """The API over ``settings``. Its services start and stop with the app, unless they
    are given (``services``): then their owner starts them first and stops them after
    (``serve`` does, so that a broker that does not answer is one line, not a server
    that failed its start)."""
    held = services or Services.of(settings, clock or (lambda: datetime.now(UTC)))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if services is not None:
            yield
            return
        await held.start()
        try:
            yield
        finally:
            await held.stop()

    app = FastAPI(
        title="delivery-ledger ingest API",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.openapi = with_body_schemas(app.openapi)  # type: ignore[method-assign]
    app.state.services = held
    install(app)
    app.include_router(runs_router)
    app.include_router(reads_router)
    app.add_middleware(BodyLimit, limit=settings.api.max_body_bytes)
    app.add_middleware(RequestSpans)  # outermost: the span covers the whole request
    return app
