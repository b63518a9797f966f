"""Acting as an operator: build, check, sign and append resolve and redrive events.

Shared by ``ledger resolve``/``ledger redrive`` and the dashboard's buttons. An action is
built from the state the operator saw (the projection's copy of the worker's fold state):
it carries that state's fencing token and status, so the fold refuses it as stale if the
delivery moved on before the action was read. ``refusal`` asks the fold's own rule
(events/delivery_state.py ``operator_refusal``) before anything is appended; the refusal
of an action that raced with the worker is still recorded, by the projection.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from opentelemetry.trace import StatusCode

from clients.outcome_keys import operator_signer_for
from clients.signed_log import SignedLog
from clients.tracing import KEY_ATTRIBUTE, TOKEN_ATTRIBUTE, tracer
from config.settings import Settings
from events.base import utc_now
from events.codec import encode
from events.delivery_state import DeliveryState, Status, operator_refusal
from events.errors import ConfigError
from events.operator import (
    OPERATOR_PATTERN,
    DeliveryRedriveRequested,
    DeliveryResolved,
    OperatorEvent,
)
from events.topics import record_key

ResolveOutcome = Literal["delivered", "not_delivered", "abandoned"]
PRODUCER = "ledger-operator"
SEEN = {Status.UNKNOWN: "UNKNOWN", Status.SENT: "SENT", Status.FAILED: "FAILED"}


def check_operator(name: str | None) -> str:
    """The operator's name, or ``ConfigError`` (one line and a hint) when there is none or
    it is not printable."""
    if not name or not name.strip():
        raise ConfigError(
            "an operator action needs the operator's name",
            "pass --as NAME or set LEDGER_OPERATOR (it goes into the event, for the record)",
        )
    name = name.strip()
    if not re.match(OPERATOR_PATTERN, name):
        raise ConfigError(
            "the operator's name must be 1-200 printable characters",
            "pass --as NAME or set LEDGER_OPERATOR",
        )
    return name


def check_reason(reason: str | None) -> str:
    """The action's reason, required: ``ConfigError`` when it is missing or blank."""
    if not reason or not reason.strip():
        raise ConfigError(
            "an operator action needs a reason", "pass --reason TEXT: why, for the record"
        )
    if len(reason) > 4000:
        raise ConfigError("the reason is longer than 4000 characters", "shorten --reason")
    return reason.strip()


@dataclass(frozen=True)
class Action:
    """One proposed action on one delivery, and whether the fold would take it now."""

    state: DeliveryState
    event: OperatorEvent | None
    refusal: str | None


def _seen(state: DeliveryState) -> Literal["UNKNOWN", "SENT", "FAILED"]:
    seen = SEEN.get(state.status)
    return "UNKNOWN" if seen is None else seen  # type: ignore[return-value]


def resolve_action(
    state: DeliveryState,
    *,
    operator: str,
    outcome: ResolveOutcome,
    reason: str,
    scope: str = "key",
    receiver_id: str | None = None,
    now: datetime | None = None,
) -> Action:
    """The resolve event for ``state`` as the operator sees it, and its refusal if any."""
    seen = _as_seen(state, operator, reason, scope, now)
    event = DeliveryResolved(**seen, outcome=outcome, receiver_id=receiver_id)
    return _checked(state, event)


def redrive_action(
    state: DeliveryState,
    *,
    operator: str,
    reason: str,
    scope: str = "key",
    now: datetime | None = None,
) -> Action:
    """The redrive event for ``state`` as the operator sees it, and its refusal if any."""
    event = DeliveryRedriveRequested(**_as_seen(state, operator, reason, scope, now))
    return _checked(state, event)


def _as_seen(
    state: DeliveryState, operator: str, reason: str, scope: str, now: datetime | None
) -> dict[str, Any]:
    """The fields every operator event takes from the state the operator saw."""
    return {
        "idempotency_key": state.idempotency_key,
        "run_id": state.run_id,
        "producer": PRODUCER,
        "operator": operator,
        "reason": reason,
        "scope": scope,
        "fencing_token": state.fencing_token,
        "seen_status": _seen(state),
        "occurred_at": now or utc_now(),
    }


def _checked(state: DeliveryState, event: OperatorEvent) -> Action:
    refusal = operator_refusal(state, event)
    if refusal is None and state.status not in SEEN:
        refusal = f"the delivery is {state.status.public}"
    return Action(state, event if refusal is None else None, refusal)


class OperatorLog(SignedLog[OperatorEvent]):
    """Appends signed operator events to ``ledger.deliveries`` (idempotent producer,
    acks from all in-sync replicas): ``async with OperatorLog(settings) as log``."""

    def __init__(self, settings: Settings) -> None:
        topic = settings.kafka.topic_deliveries
        super().__init__(settings, topic, operator_signer_for(settings), encode, record_key)

    async def append(self, events: Sequence[OperatorEvent]) -> None:
        """Sign and append ``events``; each is a span (``ledger.resolve``, ``ledger.redrive``)
        around the append, a child of the caller's current span (a CLI command, a dashboard
        request, an MCP tool's ``clients.tracing.span``)."""
        opened = [
            tracer().start_span(f"ledger.{_ACTIONS[type(event)]}", attributes=_attributes(event))
            for event in events
        ]
        try:
            await super().append(events)
        except BaseException as exc:
            for one in opened:
                one.record_exception(exc)
                one.set_status(StatusCode.ERROR, type(exc).__name__)
            raise
        finally:
            for one in opened:
                one.end()


_ACTIONS: dict[type[OperatorEvent], str] = {
    DeliveryResolved: "resolve",
    DeliveryRedriveRequested: "redrive",
}


def _attributes(event: OperatorEvent) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        KEY_ATTRIBUTE: event.idempotency_key,
        TOKEN_ATTRIBUTE: event.fencing_token,
        "ledger.run_id": event.run_id,
        "ledger.operator": event.operator,
        "ledger.seen_status": event.seen_status,
    }
    if isinstance(event, DeliveryResolved):
        attributes["ledger.resolve_outcome"] = event.outcome
    return attributes
