"""Ingest: a run's execution events, each answered once per run id (api/idempotency.py),
each written through the process's one publisher (one Kafka transaction per run, shared
with concurrent requests by group commit), as the SDK writes them."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.convertors import Convertor, register_url_convertor

from api.auth import Caller
from api.errors import ApiError
from api.idempotency import AnswersUnavailable, Claim, ClaimLost, Ticket
from api.models import (
    CompleteRun,
    FailRun,
    MarkRunUnknown,
    Problem,
    RunAccepted,
    StartRun,
)
from api.services import services
from clients.publisher import PublishFailed, PublishRejected
from events.base import RUN_ID_PATTERN, utc_now
from events.delivery import DeliveryRequested
from events.keys import canonical_json


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
Publish = Callable[[Ticket], Awaitable[None]]
CLAIMS = 3  # a claim lost to another process is claimed again, this many times at most


def fingerprint(body: BaseModel) -> dict[str, str]:
    """A hash of each body field (canonical JSON): what makes a repeat "the same body",
    and names the fields of one that is not."""
    return {
        name: hashlib.sha256(canonical_json(value)).hexdigest()
        for name, value in body.model_dump(mode="json").items()
    }


_ACTIONS = {
    "run.succeeded": "complete",
    "run.started": "start",
    "run.failed": "fail",
    "run.marked_unknown": "unknown",
}


async def publish_once(
    request: Request,
    run_id: str,
    event: str,
    key: Caller,
    body: BaseModel,
    publish: Publish,
    requests: list[DeliveryRequested] | None = None,
) -> JSONResponse:
    """Answer a run's event once: replay the first answer, refuse a different body (409),
    or publish (``requests``: the deliveries it carries) with the answer recorded in the
    same group commit (api/idempotency.py)."""
    held = services(request)
    action = _ACTIONS[event]
    printed = fingerprint(body)
    accepted = [
        {
            "idempotency_key": r.idempotency_key,
            "channel": r.channel,
            "event_type": r.event_type,
            "payload_hash": r.payload_hash,
        }
        for r in requests or ()
    ]

    def answer_of() -> dict[str, Any]:
        # RunAccepted's JSON, built by hand on the hot path (tests/api check the schema).
        return {
            "run_id": run_id,
            "agent": key.agent,
            "event": event,
            "accepted_at": utc_now().isoformat().replace("+00:00", "Z"),
            "deliveries": accepted,
        }

    for _ in range(CLAIMS):
        try:
            claim = await held.answers.claim(
                run_id, action, key.agent, printed, time.time(), answer_of
            )
        except AnswersUnavailable as exc:
            raise ApiError(503, str(exc), hint="nothing was published: retry") from None
        if claim.kind != "new":
            return answered(run_id, action, claim)
        ticket = claim.ticket
        assert ticket is not None
        try:
            await publish(ticket)
        except ClaimLost:
            continue  # another process recorded it since: its record answers
        except AnswersUnavailable as exc:
            raise ApiError(503, str(exc), hint="nothing was published: retry") from None
        except PublishRejected as exc:
            raise ApiError(422, str(exc), field=rejected_field(str(exc))) from None
        except PublishFailed as exc:
            raise ApiError(
                503,
                f"the log did not take run {run_id}: {exc.message}",
                hint="nothing was kept: send the same request again",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            held.answers.release(ticket)
        assert ticket.answer is not None  # committed: the journal made it
        return JSONResponse(ticket.answer, status_code=201)
    raise ApiError(
        503,
        f"run {run_id}: '{action}' is being recorded by another API process",
        hint="retry in a second",
        headers={"Retry-After": "1"},
    )


def answered(run_id: str, action: str, claim: Claim) -> JSONResponse:
    """The answer to a request its run event's record already answers."""
    if claim.kind == "replay":
        assert claim.status is not None
        assert claim.answer is not None
        return JSONResponse(
            claim.answer, status_code=claim.status, headers={"Idempotent-Replayed": "true"}
        )
    if claim.kind == "conflict":
        if claim.agent is not None:
            raise ApiError(
                409,
                f"run {run_id}: '{action}' was already published by another agent",
                field="run_id",
                hint="run ids are global: give each run its own",
            )
        raise ApiError(
            409,
            f"run {run_id}: '{action}' was already published with a different "
            f"{', '.join(claim.fields)}",
            field=claim.fields[0],
            hint="the first request's answer stands; a new run needs a new run id",
        )
    raise ApiError(
        409,
        f"run {run_id}: '{action}' is in flight (the same request, still being published)",
        field="run_id",
        hint="retry in a second: it then answers what that request answered",
        headers={"Retry-After": "1"},
    )


_DELIVERY = re.compile(r"^delivery (\d+)")


def rejected_field(message: str) -> str | None:
    """The request field a ``PublishRejected`` message is about."""
    if found := _DELIVERY.match(message):
        return f"deliveries[{int(found.group(1)) - 1}]"
    for name in ("run_id", "result_hash", "error", "reason"):
        if message.startswith(name):
            return name
    return None


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
    limit = held.settings.api.max_deliveries_per_run
    if len(body.deliveries) > limit:
        raise ApiError(
            413,
            f"{len(body.deliveries)} deliveries in one run, over the limit of {limit}",
            field="deliveries",
            hint="LEDGER_API__MAX_DELIVERIES_PER_RUN",
        )
    publisher = held.publisher
    try:  # checked and built once: what is published is what was checked
        requests = publisher.check_run_succeeded(
            run_id, body.result_hash, body.deliveries, producer=key.agent
        )
    except PublishRejected as exc:
        raise ApiError(422, str(exc), field=rejected_field(str(exc))) from None

    async def publish(ticket: Ticket) -> None:
        await publisher.publish_checked(
            run_id, body.result_hash, requests, producer=key.agent, ticket=ticket
        )

    return await publish_once(request, run_id, "run.succeeded", key, body, publish, requests)


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

    async def publish(ticket: Ticket) -> None:
        await publisher.run_started(run_id, agent=key.agent, producer=key.agent, ticket=ticket)

    return await publish_once(request, run_id, "run.started", key, body or StartRun(), publish)


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

    async def publish(ticket: Ticket) -> None:
        await publisher.run_failed(run_id, body.error, producer=key.agent, ticket=ticket)

    return await publish_once(request, run_id, "run.failed", key, body, publish)


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

    async def publish(ticket: Ticket) -> None:
        await publisher.run_marked_unknown(run_id, body.reason, producer=key.agent, ticket=ticket)

    return await publish_once(request, run_id, "run.marked_unknown", key, body, publish)
