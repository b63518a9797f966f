"""Reads, from the projection (``ledger project``'s tables, as the dashboard reads them):
one run's three answers, and one delivery by the key its receiver sees (api/answers.py,
which the MCP server asks too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Request

from api.answers import ReadRefused, delivery_answer, delivery_row, read_projection, run_answer
from api.auth import Caller
from api.errors import ApiError
from api.models import DeliveryAnswer, Problem, RunAnswer
from api.runs import RunId
from api.services import services
from projections.store import Store

T = TypeVar("T")
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": what}
    for status, what in {
        401: "No API key, or not a valid one.",
        404: "Not in the projection (yet: it follows the log within a second or so), or "
        "published by another agent than the key's.",
        422: "A path parameter is not valid.",
        429: "The key is over its rate (Retry-After).",
        503: "The projection database is not there or not answering.",
    }.items()
}

router = APIRouter(prefix="/v1", tags=["reads"])


async def _read(request: Request, work: Callable[[Store], T]) -> T:
    """``work`` on the projection, in a thread; a refusal as the API answers it."""
    try:
        return await read_projection(services(request).projection_dsn, work)
    except ReadRefused as exc:
        raise ApiError(exc.status, exc.error, field=exc.field, hint=exc.hint) from None


@router.get(
    "/runs/{run_id:run_id}",
    response_model=RunAnswer,
    responses=READ_ERRORS,
    summary="One run: did execution finish, did delivery leave, which key the receiver sees",
)
async def get_run(request: Request, run_id: RunId, key: Caller) -> RunAnswer:
    """The three answers for one run (its first 500 deliveries), if the key's agent
    published it; another agent's run is not found (404), as if it were not there."""
    return await _read(request, lambda store: run_answer(store, run_id, agent=key.agent))


Key = Annotated[
    str,
    Path(pattern=r"^[0-9a-f]{64}$", description="The idempotency key (64 lowercase hex)."),
]


@router.get(
    "/deliveries/{key}",
    response_model=DeliveryAnswer,
    responses=READ_ERRORS,
    summary="One delivery, by the idempotency key its receiver sees",
)
async def get_delivery(request: Request, key: Key, caller: Caller) -> DeliveryAnswer:
    """Where one delivery stands, if the key's agent asked for it; another agent's
    delivery is not found (404), as if it were not there."""
    return await _read(
        request, lambda store: delivery_answer(delivery_row(store, key, agent=caller.agent))
    )
