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
from typing import Any, cast

from pydantic import BaseModel

from api.idempotency import AnswersUnavailable, Claim, FirstAnswers
from api.idempotency.sqlite import ClaimLost, SqliteAnswers, Ticket
from api.models import AcceptedDelivery, CompleteRun, RunAccepted
from clients.publisher import Publisher, PublishFailed, PublishRejected
from events.base import utc_now
from events.delivery import DeliveryRequested
from events.keys import canonical_json

log = logging.getLogger("ledger.api")
Publish = Callable[[], Awaitable[list[DeliveryRequested]]]
Journaled = Callable[[Ticket], Awaitable[None]]
"""A publish through the publisher whose journal is the SQLite first answers: the run's
records and its first answer go in the same group commit (api/idempotency/sqlite.py)."""
RESERVES = 3  # a reservation lost to another process is made again, this many times at most

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


def not_taken(run_id: str, exc: PublishFailed) -> RunRefused:
    """A run the log did not take (503, nothing kept: the same request may be sent again)."""
    return RunRefused(
        503,
        f"the log did not take run {run_id}: {exc.message}",
        hint="nothing was kept: send the same request again",
        retry_after_s=1,
    )


async def publish_run_once(
    answers: FirstAnswers,
    run_id: str,
    event: str,
    agent: str,
    body: BaseModel,
    publish: Publish,
    *,
    journaled: Journaled | None = None,
    requests: list[DeliveryRequested] | None = None,
) -> Published:
    """Answer a run's event once: replay the first answer, refuse a different body (409),
    or publish and keep the answer. ``journaled`` (with SQLite answers that are the
    publisher's journal): publish that way instead, its record written with the group
    commit; ``requests``: the deliveries it carries, for the answer."""
    if journaled is not None and isinstance(answers, SqliteAnswers):
        return await publish_journaled(
            answers, run_id, event, agent, body, journaled, requests or []
        )
    action = ACTIONS[event]
    try:
        claim = await answers.claim(run_id, action, agent, fingerprint(body), time.time())
    except AnswersUnavailable as exc:
        raise RunRefused(503, str(exc), hint="nothing was published: retry") from None
    if claim.kind != "new":
        return answered(run_id, action, claim)
    done = False
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
        done = True  # committed: whatever happens to its record, this is the answer
        try:
            await answers.answered(run_id, action, 201, answer)
        except AnswersUnavailable as exc:
            # A repeat then finds it in flight, and once stale publishes it again: the
            # log dedupes its deliveries by key. The caller still learns it committed.
            log.warning("run %s: %s answered but not recorded: %s", run_id, action, exc)
    except PublishRejected as exc:
        raise rejected(exc) from None
    except PublishFailed as exc:
        raise not_taken(run_id, exc) from None
    finally:
        if not done:
            with contextlib.suppress(AnswersUnavailable):  # then it goes stale instead
                await answers.abandon(run_id, action)
    return Published(201, answer, replayed=False)


def answered(run_id: str, action: str, claim: Claim) -> Published:
    """The answer to a request its run event's record already answers (a replay), or
    the refusal (a conflict, or in flight)."""
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
    raise AssertionError(f"unexpected claim {claim.kind}")


async def publish_journaled(
    answers: SqliteAnswers,
    run_id: str,
    event: str,
    agent: str,
    body: BaseModel,
    publish: Journaled,
    requests: list[DeliveryRequested],
) -> Published:
    """``publish_run_once`` through the journaled publisher: reserve (a read), publish
    with the ticket (its in-flight record and its answer written with the batch), answer
    what was recorded."""
    action = ACTIONS[event]
    printed = fingerprint(body)
    accepted = [
        {
            "idempotency_key": r.idempotency_key,
            "channel": r.channel,
            "event_type": r.event_type,
            "payload_hash": r.payload_hash,
        }
        for r in requests
    ]

    def answer_of() -> dict[str, Any]:
        # RunAccepted's JSON, made by hand on the hot path (tests/api check the schema).
        return {
            "run_id": run_id,
            "agent": agent,
            "event": event,
            "accepted_at": utc_now().isoformat().replace("+00:00", "Z"),
            "deliveries": accepted,
        }

    for _ in range(RESERVES):
        try:
            claim = await answers.reserve(run_id, action, agent, printed, time.time(), answer_of)
        except AnswersUnavailable as exc:
            raise RunRefused(503, str(exc), hint="nothing was published: retry") from None
        if claim.kind != "new":
            return answered(run_id, action, claim)
        ticket: Ticket = claim.ticket
        try:
            await publish(ticket)
        except ClaimLost:
            continue  # another process recorded it since: its record answers
        except AnswersUnavailable as exc:
            raise RunRefused(503, str(exc), hint="nothing was published: retry") from None
        except PublishRejected as exc:
            raise rejected(exc) from None
        except PublishFailed as exc:
            raise not_taken(run_id, exc) from None
        finally:
            answers.release(ticket)
        assert ticket.answer is not None  # committed: the journal made it
        return Published(201, ticket.answer, replayed=False)
    raise RunRefused(
        503,
        f"run {run_id}: '{action}' is being recorded by another API process",
        hint="retry in a second",
        retry_after_s=1,
    )


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
    try:  # checked and built once: what is published is what was checked
        requests = publisher.check_run_succeeded(
            run_id, body.result_hash, body.deliveries, producer=agent
        )
    except PublishRejected as exc:
        raise rejected(exc) from None

    async def publish() -> list[DeliveryRequested]:
        await publisher.publish_checked(run_id, body.result_hash, requests, producer=agent)
        return requests

    async def journaled(ticket: Ticket) -> None:
        await publisher.publish_checked(
            run_id, body.result_hash, requests, producer=agent, ticket=ticket
        )

    return await publish_run_once(
        answers,
        run_id,
        "run.succeeded",
        agent,
        body,
        publish,
        journaled=journaled if cast(object, publisher.journal) is answers else None,
        requests=requests,
    )
