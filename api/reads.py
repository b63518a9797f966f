"""Reads, from the projection (``ledger project``'s tables, as the dashboard reads them):
one run's three answers, and one delivery by the key its receiver sees."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Request

from api.auth import Caller
from api.errors import ApiError
from api.models import DeliveryAnswer, Execution, Problem, RunAnswer
from api.runs import RunId
from api.services import services
from events.errors import LedgerError
from events.redaction import redacted_url
from projections.backends import open_store
from projections.fold import Row
from projections.incident import LEFT, run_not_found, run_view
from projections.store import Store

T = TypeVar("T")
SHOWN = 500
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
SUMMARY = {
    None: "no execution events (the run never reported)",
    "RUNNING": "not finished (running)",
    "SUCCEEDED": "finished: succeeded",
    "FAILED": "finished: failed",
    "UNKNOWN": "unknown (marked unknown)",
}

router = APIRouter(prefix="/v1", tags=["reads"])


async def _read(request: Request, work: Callable[[Store], T]) -> T:
    """``work`` on the projection, in a thread (a store opened for this request)."""
    dsn = services(request).projection_dsn

    def reading() -> T:
        try:
            store = open_store(dsn)
        except LedgerError as exc:
            raise ApiError(503, exc.message, hint=exc.hint) from None
        try:
            try:
                store.prepare("read")
            except LedgerError as exc:
                # No projection yet (or not ours): nothing is known of anything there.
                raise ApiError(
                    404, f"not in the projection: {exc.message}", hint=exc.hint
                ) from None
            return work(store)
        except store.system_errors as exc:
            raise ApiError(
                503, f"the projection database did not answer: {type(exc).__name__}"
            ) from None
        finally:
            store.close()

    return await asyncio.to_thread(reading)


def publisher_of_run(store: Store, run_id: str) -> str | None:
    """The agent that published ``run_id``: the producer of its first execution event, or,
    for a run with deliveries only, of its first delivery request; None if unknown."""
    runs = store.rows("SELECT producer FROM agent_runs WHERE run_id = ?", (run_id,))
    if runs:
        found: str | None = runs[0]["producer"]
        return found
    asked = store.rows(
        "SELECT agent FROM deliveries WHERE run_id = ? ORDER BY created_at, idempotency_key "
        "LIMIT 1",
        (run_id,),
    )
    return asked[0]["agent"] if asked else None


def delivery_answer(row: Row) -> DeliveryAnswer:
    """One projected delivery as the API shows it (the recipient's credentials redacted)."""
    return DeliveryAnswer(
        idempotency_key=row["idempotency_key"],
        run_id=row["run_id"],
        channel=row["channel"],
        recipient=redacted_url(row["recipient"]),
        event_type=row["event_type"],
        payload_hash=row["payload_hash"],
        status=row["status"],
        left_system=LEFT[row["status"]],
        attempts=int(row["attempts"]),
        provider_message_id=row["provider_message_id"],
        fencing_token=int(row["fencing_token"]),
        agent=row.get("agent"),
        requested_at=row["created_at"],
        confirmed_at=row["confirmed_at"],
        failed_at=row["failed_at"],
    )


@router.get(
    "/runs/{run_id:run_id}",
    response_model=RunAnswer,
    responses=READ_ERRORS,
    summary="One run: did execution finish, did delivery leave, which key the receiver sees",
)
async def get_run(request: Request, run_id: RunId, key: Caller) -> RunAnswer:
    """The three answers for one run (its first 500 deliveries), if the key's agent
    published it; another agent's run is not found (404), as if it were not there."""

    def answer(store: Store) -> RunAnswer:
        try:
            if publisher_of_run(store, run_id) != key.agent:
                raise run_not_found(run_id)
            view = run_view(store, run_id, limit=SHOWN)
        except LedgerError as exc:
            raise ApiError(404, exc.message, field="run_id", hint=exc.hint) from None
        run = view.run
        status = run["status"] if run is not None else None
        return RunAnswer(
            run_id=run_id,
            execution=Execution(
                status=status,
                finished=status in ("SUCCEEDED", "FAILED"),
                summary=SUMMARY[status],
                result_hash=run["result_hash"] if run is not None else None,
                agent=run["agent"] if run is not None else None,
            ),
            deliveries=[delivery_answer(d.delivery) for d in view.deliveries],
            total_deliveries=view.total_deliveries,
        )

    return await _read(request, answer)


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
    """Where one delivery stands, if the caller's agent asked for it; another agent's
    delivery is not found (404), as if it were not there."""

    def answer(store: Store) -> DeliveryAnswer:
        rows = store.rows("SELECT * FROM deliveries WHERE idempotency_key = ?", (key,))
        if not rows or rows[0]["agent"] != caller.agent:
            raise ApiError(
                404,
                f"no delivery with key {key} in the projection",
                field="key",
                hint="check the key, or that 'ledger project' has caught up",
            )
        return delivery_answer(rows[0])

    return await _read(request, answer)
