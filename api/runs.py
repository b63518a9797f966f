"""Ingest: a run's execution events, each answered once per run id (api/idempotency.py),
each written through the process's one publisher (one Kafka transaction per run, shared
with concurrent requests by group commit), as the SDK writes them."""

from __future__ import annotations

from typing import Annotated, Any, cast

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.convertors import Convertor, register_url_convertor

from api.auth import Caller
from api.errors import ApiError
from api.idempotency.sqlite import Ticket
from api.models import (
    CompleteRun,
    FailRun,
    MarkRunUnknown,
    Problem,
    RunAccepted,
    StartRun,
)
from api.publishing import (
    Journaled,
    Publish,
    Published,
    RunRefused,
    complete_run,
    publish_run_once,
)
from api.services import services
from events.base import RUN_ID_PATTERN
from events.delivery import DeliveryRequested


class RunIdConvertor(Convertor[str]):
    """A run id in a path: anything (FastAPI then checks it and names ``run_id`` in a
    422), slashes included (run ids may hold them), but not ending like a run event's
    path, so that ``GET /v1/runs/x/start`` is a 405, not a read of run ``x/start``."""

    regex = r"(?s:.+)(?<!/complete)(?<!/start)(?<!/fail)(?<!/unknown)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


# Starlette's convertors are one global table: registered once, on import, by name.
register_url_convertor("run_id", RunIdConvertor())

RunId = Annotated[
    str,
    Path(
        pattern=RUN_ID_PATTERN.pattern,
        max_length=200,
        description="The agent's run id: 1-200 letters, digits and ._-/@+= (no ':').",
    ),
]
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": what}
    for status, what in {
        400: "The body is not JSON.",
        401: "No API key, or not a valid one.",
        409: "The run's event was already published with another body, or is in flight.",
        413: "The body, or the deliveries of one run, over the limit.",
        422: "A field is not valid (``field`` names it).",
        429: "The key is over its rate (Retry-After).",
        503: "The log did not take the run (nothing was kept: retry).",
    }.items()
}
ACCEPTED: dict[int | str, dict[str, Any]] = {
    201: {
        "description": "Committed to the log (the first answer; replayed with "
        "Idempotent-Replayed: true).",
        "headers": {
            "Idempotent-Replayed": {
                "description": "Present (true) when this is the first answer, repeated.",
                "schema": {"type": "string"},
            }
        },
    }
}

router = APIRouter(prefix="/v1/runs", tags=["runs"])


def refused(exc: RunRefused) -> ApiError:
    """A refusal as the API answers it (``Retry-After`` when it says when)."""
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return ApiError(exc.status, exc.error, field=exc.field, hint=exc.hint, headers=headers)


async def publish_once(
    request: Request,
    run_id: str,
    event: str,
    key: Caller,
    body: BaseModel,
    publish: Publish,
    journaled: Journaled,
) -> JSONResponse:
    """Answer a run's event once (api/publishing.py), as HTTP: 201, the first answer
    replayed with ``Idempotent-Replayed: true``, or the refusal. ``journaled`` when the
    publisher keeps the first answers with its group commit (SQLite)."""
    held = services(request)
    batched = cast(object, held.publisher.journal) is held.answers
    try:
        published = await publish_run_once(
            held.answers,
            run_id,
            event,
            key.agent,
            body,
            publish,
            journaled=journaled if batched else None,
        )
    except RunRefused as exc:
        raise refused(exc) from None
    return _answer(published)


def _answer(published: Published) -> JSONResponse:
    headers = {"Idempotent-Replayed": "true"} if published.replayed else None
    return JSONResponse(published.answer, status_code=published.status, headers=headers)


@router.post(
    "/{run_id:run_id}/complete",
    status_code=201,
    response_model=RunAccepted,
    responses={**ACCEPTED, **ERRORS},
    summary="The run succeeded: its result and its deliveries, in one Kafka transaction",
)
async def complete(request: Request, run_id: RunId, body: CompleteRun, key: Caller) -> Any:
    """``RunSucceeded`` and one ``DeliveryRequested`` per delivery, atomically (what
    ``Publisher.run_succeeded`` writes), under the key's agent."""
    held = services(request)
    try:
        published = await complete_run(
            held.publisher,
            held.answers,
            held.settings.api.max_deliveries_per_run,
            run_id,
            key.agent,
            body,
        )
    except RunRefused as exc:
        raise refused(exc) from None
    return _answer(published)


@router.post(
    "/{run_id:run_id}/start",
    status_code=201,
    response_model=RunAccepted,
    responses={**ACCEPTED, **ERRORS},
    summary="The run began",
)
async def start(request: Request, run_id: RunId, key: Caller, body: StartRun | None = None) -> Any:
    """``RunStarted`` with the key's agent."""
    publisher = services(request).publisher

    async def publish() -> list[DeliveryRequested]:
        await publisher.run_started(run_id, agent=key.agent, producer=key.agent)
        return []

    async def journaled(ticket: Ticket) -> None:
        await publisher.run_started(run_id, agent=key.agent, producer=key.agent, ticket=ticket)

    return await publish_once(
        request, run_id, "run.started", key, body or StartRun(), publish, journaled
    )


@router.post(
    "/{run_id:run_id}/fail",
    status_code=201,
    response_model=RunAccepted,
    responses={**ACCEPTED, **ERRORS},
    summary="The run failed; no deliveries follow",
)
async def fail(request: Request, run_id: RunId, body: FailRun, key: Caller) -> Any:
    """``RunFailed`` with the error."""
    publisher = services(request).publisher

    async def publish() -> list[DeliveryRequested]:
        await publisher.run_failed(run_id, body.error, producer=key.agent)
        return []

    async def journaled(ticket: Ticket) -> None:
        await publisher.run_failed(run_id, body.error, producer=key.agent, ticket=ticket)

    return await publish_once(request, run_id, "run.failed", key, body, publish, journaled)


@router.post(
    "/{run_id:run_id}/unknown",
    status_code=201,
    response_model=RunAccepted,
    responses={**ACCEPTED, **ERRORS},
    summary="Nobody can tell whether the run finished",
)
async def unknown(request: Request, run_id: RunId, body: MarkRunUnknown, key: Caller) -> Any:
    """``RunMarkedUnknown`` with the reason."""
    publisher = services(request).publisher

    async def publish() -> list[DeliveryRequested]:
        await publisher.run_marked_unknown(run_id, body.reason, producer=key.agent)
        return []

    async def journaled(ticket: Ticket) -> None:
        await publisher.run_marked_unknown(run_id, body.reason, producer=key.agent, ticket=ticket)

    return await publish_once(request, run_id, "run.marked_unknown", key, body, publish, journaled)
