"""The operator's buttons: Resolve and Redrive, as JSON endpoints that append signed events.

    POST /api/deliveries/{key}/resolve  {"operator", "reason", "outcome", "receiver_id"?, "seen"?}
    POST /api/deliveries/{key}/redrive  {"operator", "reason", "seen"?}

The server's guard has already checked where the request comes from (its own page) and
its token. Here: JSON only, the operator's name and reason, the delivery's current state
re-read from the projection, the fold's own rule (``operator_refusal``, asked through
``clients.operator_actions``), then the event appended to the log. Nothing here writes a
table: the worker folds the event, and the projection shows it once it has caught up.

``seen`` is what the page showed (``{"status": "FAILED", "fencing_token": 3}``): when the
delivery has moved on since, the action is refused as stale, as the fold would refuse it,
rather than applied to a state the operator never looked at.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from aiokafka.errors import KafkaError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from clients.operator_actions import (
    Action,
    OperatorLog,
    ResolveOutcome,
    check_operator,
    check_reason,
    redrive_action,
    resolve_action,
)
from clients.signed_log import SignedLog
from config.settings import Settings
from events.delivery_state import DeliveryState, operator_refusal
from events.errors import ConfigError, LedgerError
from events.operator import OperatorEvent
from projections.dashboard.errors import Refused, json_answer

ReadState = Callable[[str], Awaitable[DeliveryState | None]]

MAX_BODY = 16 * 1024
OUTCOMES: tuple[ResolveOutcome, ...] = ("delivered", "not_delivered", "abandoned")
SEEN_STATUSES = ("UNKNOWN", "SENT", "FAILED")
# How long an append may take before the operator is told it may or may not have landed.
APPEND_BUDGET_S = 30.0
SCOPE = "key (dashboard)"
_log = logging.getLogger("ledger.dashboard")


@dataclass(frozen=True)
class Context:
    """What an action needs from the server: settings (to sign and append), the server's
    clock, and the projection's current state of a delivery."""

    settings: Settings
    now: datetime
    read_state: ReadState


async def resolve(request: Request, ctx: Context) -> Response:
    """Settle a delivery as delivered, not delivered, or abandoned (202 with the event id)."""

    async def build(body: dict[str, Any], state: DeliveryState, who: str, why: str) -> Action:
        outcome = body.get("outcome")
        if outcome not in OUTCOMES:
            raise Refused(
                400,
                "outcome must be delivered, not_delivered or abandoned",
                "choose what the receiver's evidence says",
            )
        receiver_id = body_text(body, "receiver_id") or None
        return resolve_action(
            state,
            operator=who,
            outcome=cast(ResolveOutcome, outcome),
            reason=why,
            scope=SCOPE,
            receiver_id=receiver_id.strip() if receiver_id else None,
            now=ctx.now,
        )

    return await _act(request, ctx, "resolve", build)


async def redrive(request: Request, ctx: Context) -> Response:
    """Send a FAILED delivery again, or reconcile an UNKNOWN afresh (202 with the event id)."""

    async def build(body: dict[str, Any], state: DeliveryState, who: str, why: str) -> Action:
        return redrive_action(state, operator=who, reason=why, scope=SCOPE, now=ctx.now)

    return await _act(request, ctx, "redrive", build)


Build = Callable[[dict[str, Any], DeliveryState, str, str], Awaitable[Action]]


async def _act(request: Request, ctx: Context, what: str, build: Build) -> Response:
    key: str = request.path_params["key"]
    try:
        body = await read_body(request)
        who, why = who_and_why(body)
        seen = _seen(body)
        state = await ctx.read_state(key)
        if state is None:
            raise Refused(
                404,
                f"no delivery with key {key[:200]} in the projection",
                "check the key, or that 'ledger project' has caught up",
            )
        try:
            action = await build(body, state, who, why)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise Refused(400, f"{field}: {first['msg']}", "correct it and try again") from None
        refusal = _refusal(action, seen)
        if refusal is not None:
            raise Refused(409, refusal, "reload: the page shows the delivery as it is now")
        event = await _append(ctx.settings, action)
    except Refused as no:  # the projection unavailable (503) included
        return no.response()
    except Exception:  # noqa: BLE001 - an answer, never a traceback; details in the log
        _log.exception("operator %s of %s failed", what, key[:200])
        return Refused(500, f"the {what} failed unexpectedly", "see the dashboard's log").response()
    return json_answer(
        {
            "event_id": str(event.event_id),
            "action": what,
            "idempotency_key": event.idempotency_key,
            "run_id": event.run_id,
            "operator": event.operator,
            "note": "appended to the log; the run's timeline shows it once projected",
        },
        202,
    )


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (bounded), else ``Refused`` (415, 413, 400)."""
    media_type = request.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise Refused(
            415, "operator actions take a JSON body", "send Content-Type: application/json"
        )
    too_big = Refused(413, f"the body is over {MAX_BODY} bytes", "send the action only")
    declared = request.headers.get("Content-Length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY:
        raise too_big
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise too_big  # the rest is never read
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, "the body is not JSON", "send a JSON object") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body is not a JSON object", "send a JSON object")
    return body


def body_text(body: dict[str, Any], name: str) -> str | None:
    """The body's text field ``name`` (None if absent), else ``Refused`` (400)."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise Refused(400, f"{name} must be a string", "send it as text")
    return value


def who_and_why(body: dict[str, Any]) -> tuple[str, str]:
    """The operator's name and reason from the body, checked as the CLI checks them."""
    try:
        who = check_operator(body_text(body, "operator"))
    except ConfigError as exc:
        raise Refused(400, exc.message, "type your name once: it goes into the event") from None
    try:
        why = check_reason(body_text(body, "reason"))
    except ConfigError as exc:
        raise Refused(400, exc.message, "say why, for the record") from None
    return who, why


def _seen(body: dict[str, Any]) -> tuple[str, int] | None:
    seen = body.get("seen")
    if seen is None:
        return None
    status = seen.get("status") if isinstance(seen, dict) else None
    token = seen.get("fencing_token") if isinstance(seen, dict) else None
    if status not in SEEN_STATUSES or not isinstance(token, int) or isinstance(token, bool):
        raise Refused(
            400,
            "seen must be {status: UNKNOWN|SENT|FAILED, fencing_token: integer}",
            "send what the page showed, or leave seen out",
        )
    return status, token


def _refusal(action: Action, seen: tuple[str, int] | None) -> str | None:
    """The fold's refusal of the action as built from the current state, or, when the
    page showed an older state, of the action as the operator issued it (stale)."""
    if action.refusal is not None or action.event is None or seen is None:
        return action.refusal
    status, token = seen
    issued = action.event.model_copy(update={"seen_status": status, "fencing_token": token})
    return operator_refusal(action.state, issued)


async def _append(settings: Settings, action: Action) -> OperatorEvent:
    """Sign and append the action's event; return it once the log has acknowledged it."""
    event = action.event
    assert event is not None
    await append_signed(
        OperatorLog(settings),
        event,
        what="the action",
        hint="check the run's timeline before acting again (a repeated action is refused as "
        "stale, never applied twice)",
    )
    return event


async def append_signed(log: SignedLog[Any], event: Any, *, what: str, hint: str) -> None:
    """Append ``event`` through ``log`` (it signs), within ``APPEND_BUDGET_S``; a 503 naming
    ``what`` with ``hint`` if the log did not acknowledge it (appended or not: unknown)."""
    try:
        async with asyncio.timeout(APPEND_BUDGET_S):
            async with log:
                await log.append([event])
    except LedgerError as exc:
        raise Refused(503, exc.message, exc.hint) from None
    except (TimeoutError, KafkaError) as exc:
        raise Refused(
            503,
            f"the log did not acknowledge {what} ({type(exc).__name__}); it may or may not "
            "have been appended",
            hint,
        ) from None
