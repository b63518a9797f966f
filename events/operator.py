"""Operator events on ``ledger.deliveries``: a person settling what the ledger cannot.

An UNKNOWN that no lookup can settle, a FAILED whose endpoint has since been fixed: the
ledger shows them, and an operator acts on them by appending one of these, never by
editing a table. They fold by the one transition table (events/delivery_state.py), in the
worker, the projection and ``verify`` alike, so an action is a fact of the log like any
outcome: replayed, rebuilt and audited with it.

Each names who acted (``operator``), why (``reason``, required), under which selection
(``scope``: one key, a run, a recipient and state...), and what the operator saw (the
attempt's ``fencing_token`` and ``seen_status``): when the delivery has moved on since,
the action is refused as stale rather than applied to a state nobody looked at. Operator
events are signed with an operator key (clients/outcome_signing.py); a forged one is
dead-lettered like a forged outcome.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from events.bounds import MAX_ID_CHARS, MAX_TEXT_CHARS, Counter
from events.delivery import DeliveryEvent

# Who acted: a name or an address, printable, no control characters.
OPERATOR_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
SeenStatus = Literal["UNKNOWN", "SENT", "FAILED"]


class OperatorEvent(DeliveryEvent):
    """An operator's action on one delivery."""

    operator: str = Field(pattern=OPERATOR_PATTERN)
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    scope: str = Field(min_length=1, max_length=1000)
    # What the operator saw: the current attempt's token and the delivery's status.
    fencing_token: Counter
    seen_status: SeenStatus


class DeliveryResolved(OperatorEvent):
    """An operator settles an UNKNOWN (or a SENT past its SLO) with evidence.

    ``delivered``: the receiver has it (``receiver_id``, or the evidence in ``reason``) and
    the delivery is CONFIRMED, settled by the operator. ``not_delivered``: the receiver does
    not have it, so a new attempt is made under a new fencing token, same idempotency key.
    ``abandoned``: nobody will find out; FAILED, ``abandoned_by_operator``.
    """

    TYPE: ClassVar[str] = "delivery.resolved"
    type: Literal["delivery.resolved"] = "delivery.resolved"
    outcome: Literal["delivered", "not_delivered", "abandoned"]
    receiver_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)


class DeliveryRedriveRequested(OperatorEvent):
    """An operator asks for a FAILED delivery to be sent again (a new attempt, new fencing
    token, same key, the retry policy restarted), or for an UNKNOWN to be reconciled afresh
    (a lookup now; a retry only on the evidence rules of any other UNKNOWN)."""

    TYPE: ClassVar[str] = "delivery.redrive_requested"
    type: Literal["delivery.redrive_requested"] = "delivery.redrive_requested"
