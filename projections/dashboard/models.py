"""The shapes of the dashboard's JSON answers, for its OpenAPI document
(``/api/openapi.json``). Where an answer is a dataclass of the projection library
(``WorkerClock``, ``BudgetUse``), the model is that dataclass, so the two cannot drift;
the overview, health and run pages are documented as objects (their shape is their
``to_json``'s, checked by the page's own tests)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from projections.budgets import BudgetUse
from projections.heartbeats import WorkerClock


class Refusal(BaseModel):
    """Every refusal: one line, a hint (and what failed, for an unavailable projection)."""

    error: str
    hint: str | None = None
    detail: str | None = Field(None, description="503 only: why the database did not answer")


class Match(BaseModel):
    """A run or a delivery found by id or prefix."""

    model_config = ConfigDict(extra="allow")
    kind: Literal["run", "delivery"]
    run_id: str
    idempotency_key: str | None = None
    channel: str | None = None
    recipient: str | None = None
    status: str | None = None


class SearchAnswer(BaseModel):
    """``GET /api/search``."""

    query: str
    matches: list[Match]


class Workers(BaseModel):
    """``GET /api/workers``: every worker's last heartbeat."""

    workers: list[WorkerClock]


class Budgets(BaseModel):
    """``GET /api/budgets``."""

    now: str
    budgets: list[BudgetUse]


class ActionTaken(BaseModel):
    """A resolve or redrive appended (202)."""

    event_id: str
    action: Literal["resolve", "redrive"]
    idempotency_key: str
    run_id: str
    operator: str
    note: str


class ReleaseTaken(BaseModel):
    """A budget release appended (202)."""

    event_id: str
    action: Literal["release"]
    agent: str
    channel: str | None
    count: int
    operator: str
    note: str


class Seen(BaseModel):
    """What the page showed of the delivery (an action on a state since changed is stale)."""

    status: Literal["UNKNOWN", "SENT", "FAILED"]
    fencing_token: int


class ResolveRequest(BaseModel):
    """``POST /api/deliveries/{key}/resolve``."""

    operator: str
    reason: str
    outcome: Literal["delivered", "not_delivered", "abandoned"]
    receiver_id: str | None = None
    seen: Seen | None = None


class RedriveRequest(BaseModel):
    """``POST /api/deliveries/{key}/redrive``."""

    operator: str
    reason: str
    seen: Seen | None = None


class ReleaseRequest(BaseModel):
    """``POST /api/budgets/{agent}/release``."""

    count: int = Field(ge=1)
    operator: str
    reason: str
    channel: str | None = Field(None, description="none: the agent's every-channel budget")
