"""The three answers, read from the projection, for every front that asks them: the HTTP
API's reads (api/reads.py) and the MCP server (ledger/mcp_server). No HTTP here: a read that
cannot be answered is a ``ReadRefused`` (a status, one line, the field, a hint).

Did execution finish, did each delivery leave (UNKNOWN stays "unknown"), and which key
identifies it at the receiver. Recipients' credentials are redacted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from api.models import DeliveryAnswer, Execution, RunAnswer
from events.errors import LedgerError
from events.redaction import redacted_url
from projections.backends import open_store
from projections.fold import Row
from projections.incident import LEFT, run_not_found, run_view
from projections.store import Store

T = TypeVar("T")
SHOWN = 500
SUMMARY = {
    None: "no execution events (the run never reported)",
    "RUNNING": "not finished (running)",
    "SUCCEEDED": "finished: succeeded",
    "FAILED": "finished: failed",
    "UNKNOWN": "unknown (marked unknown)",
}


class ReadRefused(Exception):
    """A read not answered: ``status`` as HTTP would say it (404 not in the projection,
    503 the projection not answering), one line, the field, a hint."""

    def __init__(
        self, status: int, error: str, *, field: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.hint = hint


async def read_projection(dsn: str, work: Callable[[Store], T]) -> T:
    """``work`` on the projection at ``dsn``, in a thread (a store opened for this read)."""

    def reading() -> T:
        try:
            store = open_store(dsn)
        except LedgerError as exc:
            raise ReadRefused(503, exc.message, hint=exc.hint) from None
        try:
            try:
                store.prepare("read")
            except LedgerError as exc:
                # No projection yet (or not ours): nothing is known of anything there.
                raise ReadRefused(
                    404, f"not in the projection: {exc.message}", hint=exc.hint
                ) from None
            return work(store)
        except store.system_errors as exc:
            raise ReadRefused(
                503, f"the projection database did not answer: {type(exc).__name__}"
            ) from None
        finally:
            store.close()

    return await asyncio.to_thread(reading)


def delivery_answer(row: Row) -> DeliveryAnswer:
    """One projected delivery as it is shown (the recipient's credentials redacted)."""
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


def _execution(run: Row | None) -> Execution:
    status = run["status"] if run is not None else None
    return Execution(
        status=status,
        finished=status in ("SUCCEEDED", "FAILED"),
        summary=SUMMARY[status],
        result_hash=run["result_hash"] if run is not None else None,
        agent=run["agent"] if run is not None else None,
    )


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


def run_answer(
    store: Store, run_id: str, *, limit: int = SHOWN, agent: str | None = None
) -> RunAnswer:
    """The three answers for one run (its first ``limit`` deliveries); ``ReadRefused``
    (404) when the projection knows nothing of it, or, given ``agent``, when another agent
    published it (said as of a run not there: an API key learns nothing of others' runs)."""
    try:
        if agent is not None and publisher_of_run(store, run_id) != agent:
            raise run_not_found(run_id)
        view = run_view(store, run_id, limit=limit)
    except LedgerError as exc:
        raise ReadRefused(404, exc.message, field="run_id", hint=exc.hint) from None
    return RunAnswer(
        run_id=run_id,
        execution=_execution(view.run),
        deliveries=[delivery_answer(d.delivery) for d in view.deliveries],
        total_deliveries=view.total_deliveries,
    )


def delivery_row(store: Store, key: str, *, agent: str | None = None) -> Row:
    """The projected delivery of idempotency key ``key``; ``ReadRefused`` (404) if none,
    or, given ``agent``, if another agent asked for it (said as of a key not there)."""
    rows = store.rows("SELECT * FROM deliveries WHERE idempotency_key = ?", (key,))
    if not rows or (agent is not None and rows[0]["agent"] != agent):
        raise ReadRefused(
            404,
            f"no delivery with key {key} in the projection",
            field="key",
            hint="check the key, or that 'ledger project' has caught up",
        )
    return rows[0]


def key_answer(store: Store, key: str) -> RunAnswer:
    """The three answers for the one delivery of ``key``: its run's execution, and it."""
    row = delivery_row(store, key)
    runs = store.rows("SELECT * FROM agent_runs WHERE run_id = ?", (row["run_id"],))
    return RunAnswer(
        run_id=row["run_id"],
        execution=_execution(runs[0] if runs else None),
        deliveries=[delivery_answer(row)],
        total_deliveries=1,
    )
