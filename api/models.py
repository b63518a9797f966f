"""What the API takes and answers: pydantic models, from which its OpenAPI is generated.

A delivery is the SDK's own ``DeliverySpec`` (clients/publisher.py): one contract for
both ways of publishing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from clients.publisher import DeliverySpec
from events.bounds import MAX_TEXT_CHARS
from events.payload_hashes import PAYLOAD_HASH_PATTERN

STRICT = ConfigDict(extra="forbid", hide_input_in_errors=True)
ExecutionStatus = Literal["RUNNING", "SUCCEEDED", "FAILED", "UNKNOWN"]
DeliveryStatusName = Literal["PENDING", "SENT", "UNKNOWN", "CONFIRMED", "FAILED"]


class CompleteRun(BaseModel):
    """``POST /v1/runs/{run_id}/complete``: the run succeeded with this result, and these
    deliveries follow from it (all of it in one Kafka transaction, or none)."""

    model_config = STRICT

    result_hash: str = Field(min_length=1, max_length=200, description="Identifies the result.")
    deliveries: list[DeliverySpec] = Field(
        default_factory=list, description="The notifications the result calls for."
    )


class StartRun(BaseModel):
    """``POST /v1/runs/{run_id}/start``: the run began (the agent is the key's)."""

    model_config = STRICT


class FailRun(BaseModel):
    """``POST /v1/runs/{run_id}/fail``: the run gave up; no deliveries follow."""

    model_config = STRICT

    error: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class MarkRunUnknown(BaseModel):
    """``POST /v1/runs/{run_id}/unknown``: nobody can tell whether the run finished."""

    model_config = STRICT

    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class AcceptedDelivery(BaseModel):
    """One delivery the run's transaction carries, and the key the receiver will see."""

    idempotency_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    channel: str
    event_type: str
    payload_hash: str = Field(
        pattern=PAYLOAD_HASH_PATTERN, description="RFC 8785 (JCS) SHA-256 of the payload."
    )


class RunAccepted(BaseModel):
    """The first answer for a run's event: committed to the log. The same request again
    gets this same answer (header ``Idempotent-Replayed: true``)."""

    run_id: str
    agent: str
    event: Literal["run.started", "run.succeeded", "run.failed", "run.marked_unknown"]
    accepted_at: datetime
    deliveries: list[AcceptedDelivery] = Field(default_factory=list)


class Problem(BaseModel):
    """Every error: one line (``error``), the request field it is about (``field``, null
    when it is about no one field), and what to do (``hint``)."""

    error: str
    field: str | None = None
    hint: str | None = None


class Execution(BaseModel):
    """Did execution finish?"""

    status: ExecutionStatus | None = Field(description="null: no execution event yet.")
    finished: bool
    summary: str
    result_hash: str | None = None
    agent: str | None = None


class DeliveryAnswer(BaseModel):
    """Did the delivery leave, and which key identifies it at the receiver?"""

    idempotency_key: str
    run_id: str
    channel: str
    recipient: str = Field(description="Credentials in it are redacted.")
    event_type: str
    payload_hash: str
    status: DeliveryStatusName
    left_system: str
    attempts: int
    provider_message_id: str | None = None
    fencing_token: int
    agent: str | None = None
    requested_at: str
    confirmed_at: str | None = None
    failed_at: str | None = None


class RunAnswer(BaseModel):
    """``GET /v1/runs/{run_id}``: the three questions for one run, from the projection."""

    run_id: str
    execution: Execution
    deliveries: list[DeliveryAnswer]
    total_deliveries: int = Field(description="All of the run's deliveries; at most 500 shown.")
