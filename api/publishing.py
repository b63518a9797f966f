"""A run's event published once per run id, for every front that publishes for agents: the
HTTP API (api/runs.py) and the MCP server (ledger/mcp_server). No HTTP here: a refusal is a
``RunRefused`` (a status, one line, the field, a hint) that each front words its own way.

The rules are the API's (api/idempotency.py): the same request again gets the first answer
(``replayed``), a different one for the same run event is refused naming the fields that
differ, one still in flight is refused with "retry"; every run goes through the SDK's own
``Publisher`` (one Kafka transaction per run, group commit).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from api.idempotency import AnswersUnavailable, FirstAnswers
from api.models import AcceptedDelivery, CompleteRun, RunAccepted
from clients.publisher import Publisher, PublishFailed, PublishRejected
from events.base import utc_now
from events.delivery import DeliveryRequested
from events.keys import canonical_json

log = logging.getLogger("ledger.api")
Publish = Callable[[], Awaitable[list[DeliveryRequested]]]

ACTIONS = {
    "run.succeeded": "complete",
    "run.started": "start",
    "run.failed": "fail",
    "run.marked_unknown": "unknown",
}


class RunRefused(Exception):
    """A run event not published (or not answered): ``status`` as HTTP would say it, one
    line, the request field it is about, a hint, and when to retry (seconds) if at all."""

    def __init__(
        self,
        status: int,
        error: str,
        *,
        field: str | None = None,
        hint: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.hint = hint
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Published:
    """The answer of a run event: the first one (``replayed`` when this is it, repeated)."""

    status: int
    answer: dict[str, Any]
    replayed: bool


def fingerprint(body: BaseModel) -> dict[str, str]:
    """A hash of each body field (canonical JSON): what makes a repeat "the same body",
    and names the fields of one that is not."""
    return {
        name: hashlib.sha256(canonical_json(value)).hexdigest()
        for name, value in body.model_dump(mode="json").items()
    }


_DELIVERY = re.compile(r"^delivery (\d+)")


def rejected_field(message: str) -> str | None:
    """The request field a ``PublishRejected`` message is about."""
    if found := _DELIVERY.match(message):
        return f"deliveries[{int(found.group(1)) - 1}]"
    for name in ("run_id", "result_hash", "error", "reason"):
        if message.startswith(name):
            return name
    return None


def rejected(exc: PublishRejected) -> RunRefused:
    """A run the publisher refused before writing anything (422, naming the field)."""
    return RunRefused(422, str(exc), field=rejected_field(str(exc)))


async def publish_run_once(
    answers: FirstAnswers,
    run_id: str,
    event: str,
    agent: str,
    body: BaseModel,
    publish: Publish,
) -> Published:
    """Answer a run's event once: replay the first answer, refuse a different body (409),
    or publish and keep the answer."""
    action = ACTIONS[event]
    try:
        claim = await answers.claim(run_id, action, agent, fingerprint(body), time.time())
    except AnswersUnavailable as exc:
        raise RunRefused(503, str(exc), hint="nothing was published: retry") from None
    if claim.kind == "replay":
        assert claim.status is not None
        assert claim.answer is not None
        return Published(claim.status, claim.answer, replayed=True)
    if claim.kind == "conflict":
        if claim.agent is not None:
            raise RunRefused(
                409,
                f"run {run_id}: '{action}' was already published by another agent",
                field="run_id",
                hint="run ids are global: give each run its own",
            )
        raise RunRefused(
            409,
            f"run {run_id}: '{action}' was already published with a different "
            f"{', '.join(claim.fields)}",
            field=claim.fields[0],
            hint="the first request's answer stands; a new run needs a new run id",
        )
    if claim.kind == "in_flight":
        raise RunRefused(
            409,
            f"run {run_id}: '{action}' is in flight (the same request, still being published)",
            field="run_id",
            hint="retry in a second: it then answers what that request answered",
            retry_after_s=1,
        )
    answered = False
    try:
        requests = await publish()
        answer = RunAccepted(
            run_id=run_id,
            agent=agent,
            event=event,
            accepted_at=utc_now(),
            deliveries=[
                AcceptedDelivery(
                    idempotency_key=r.idempotency_key,
                    channel=r.channel,
                    event_type=r.event_type,
                    payload_hash=r.payload_hash,
                )
                for r in requests
            ],
        ).model_dump(mode="json")
        answered = True  # committed: whatever happens to its record, this is the answer
        try:
            await answers.answered(run_id, action, 201, answer)
        except AnswersUnavailable as exc:
            # A repeat then finds it in flight, and once stale publishes it again: the
            # log dedupes its deliveries by key. The caller still learns it committed.
            log.warning("run %s: %s answered but not recorded: %s", run_id, action, exc)
    except PublishRejected as exc:
        raise rejected(exc) from None
    except PublishFailed as exc:
        raise RunRefused(
            503,
            f"the log did not take run {run_id}: {exc.message}",
            hint="nothing was kept: send the same request again",
            retry_after_s=1,
        ) from None
    finally:
        if not answered:
            with contextlib.suppress(AnswersUnavailable):  # then it goes stale instead
                await answers.abandon(run_id, action)
    return Published(201, answer, replayed=False)


async def complete_run(
    publisher: Publisher,
    answers: FirstAnswers,
    max_deliveries: int,
    run_id: str,
    agent: str,
    body: CompleteRun,
) -> Published:
    """``RunSucceeded`` and one ``DeliveryRequested`` per delivery, atomically (what
    ``Publisher.run_succeeded`` writes), under ``agent``, once per run id; every check
    first (413 over ``max_deliveries``, 422 for what the publisher refuses)."""
    if len(body.deliveries) > max_deliveries:
        raise RunRefused(
            413,
            f"{len(body.deliveries)} deliveries in one run, over the limit of {max_deliveries}",
            field="deliveries",
            hint="LEDGER_API__MAX_DELIVERIES_PER_RUN",
        )
    try:
        publisher.check_run_succeeded(run_id, body.result_hash, body.deliveries, producer=agent)
    except PublishRejected as exc:
        raise rejected(exc) from None

    async def publish() -> list[DeliveryRequested]:
        return await publisher.run_succeeded(
            run_id, body.result_hash, body.deliveries, producer=agent
        )

    return await publish_run_once(answers, run_id, "run.succeeded", agent, body, publish)
