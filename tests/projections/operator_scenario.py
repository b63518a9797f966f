"""A log with operators' actions, from the real event models, at fixed times: every
resolve outcome applied, redrives applied and refused, and an UNKNOWN nobody settled."""

from __future__ import annotations

from typing import Literal

from events.delivery import DeliveryRequested
from events.execution import RunStarted, RunSucceeded
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from events.operator import DeliveryRedriveRequested, DeliveryResolved
from tests.projections.scenarios import P, at, happy, rejected, requested, unknown

Seen = Literal["UNKNOWN", "SENT", "FAILED"]


def resolved(
    req: DeliveryRequested,
    t: float,
    outcome: Literal["delivered", "not_delivered", "abandoned"],
    token: int = 1,
    seen: Seen = "UNKNOWN",
) -> DeliveryResolved:
    """An operator's resolve of ``req``, issued for ``seen`` under ``token``."""
    return DeliveryResolved(
        idempotency_key=req.idempotency_key,
        run_id=req.run_id,
        producer="ledger-operator",
        operator="ana",
        reason="checked the receiver's log",
        scope="key",
        fencing_token=token,
        seen_status=seen,
        outcome=outcome,
        receiver_id="rcv-1" if outcome == "delivered" else None,
        occurred_at=at(t),
    )


def redriven(
    req: DeliveryRequested, t: float, token: int, seen: Seen = "FAILED"
) -> DeliveryRedriveRequested:
    """An operator's redrive of ``req``, issued for ``seen`` under ``token``."""
    return DeliveryRedriveRequested(
        idempotency_key=req.idempotency_key,
        run_id=req.run_id,
        producer="ledger-operator",
        operator="bo",
        reason="the endpoint is back",
        scope="state=FAILED",
        fencing_token=token,
        seen_status=seen,
        occurred_at=at(t),
    )


# run-o's deliveries: four go UNKNOWN at T0+5s, one FAILED at T0+8s, one CONFIRMED; a
# fifth UNKNOWN (T0+304s) is redriven for a fresh lookup and stays UNKNOWN.
U = [requested("run-o", n, 1) for n in range(1, 5)]
U5 = requested("run-o", 5, 300)
F = requested("run-o", 6, 1)
C = requested("run-o", 7, 1)


def operator_log() -> list[AnyExecutionEvent | AnyDeliveryEvent]:
    """Applied: resolve delivered, not_delivered, abandoned (one each), a redrive of FAILED
    and one of UNKNOWN. Refused: a second redrive of the FAILED (now PENDING), a redrive
    and a resolve of the CONFIRMED. Left: U[3] UNKNOWN since T0+5s, U5 since T0+304s."""
    return [
        RunStarted(run_id="run-o", agent="reporter", producer=P, occurred_at=at(0)),
        RunSucceeded(run_id="run-o", result_hash="sha256:oo", producer=P, occurred_at=at(1)),
        *U,
        F,
        C,
        *(e for req in U for e in unknown(req, 2)),
        *rejected(F, 2),
        *happy(C, 2),
        resolved(U[0], 100, "delivered"),
        resolved(U[1], 101, "not_delivered"),
        resolved(U[2], 102, "abandoned"),
        redriven(F, 110, token=2),
        redriven(F, 111, token=2),  # a second operator, same FAILED: refused (PENDING now)
        redriven(C, 112, token=1, seen="SENT"),  # CONFIRMED: refused
        resolved(C, 113, "delivered", seen="SENT"),  # CONFIRMED: refused
        U5,
        *unknown(U5, 301),
        redriven(U5, 400, token=1, seen="UNKNOWN"),
    ]
