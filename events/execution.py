"""Execution events on ``ledger.runs``: did the agent finish the work?"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, JsonValue, field_validator

from events.base import Event, check_run_id
from events.bounds import MAX_RUN_DELIVERIES, MAX_TEXT_CHARS


class ExecutionEvent(Event):
    """An event about one agent run, keyed by ``run_id``."""

    run_id: str

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        return check_run_id(value)


class RunStarted(ExecutionEvent):
    """The agent began the run."""

    TYPE: ClassVar[str] = "run.started"
    type: Literal["run.started"] = "run.started"
    agent: str | None = Field(default=None, max_length=200)


class RunSucceeded(ExecutionEvent):
    """The agent finished; ``result_hash`` identifies the result it committed.

    ``deliveries`` (version 2; upcast from 1 as none): the run's deliveries carried in this
    one record, written without a Kafka transaction (the publisher's record mode) and atomic
    by construction. Each entry is a ``DeliveryRequested`` less what the run supplies
    (``event_type``, ``channel``, ``recipient``, ``payload``, ``slo_seconds``); a worker
    fans them out to ``ledger.deliveries`` as ``DeliveryRequested`` events with ids derived
    from this event's (events/fan_out.py). Entries are checked one by one there, so one bad
    entry is refused alone, as one bad ``DeliveryRequested`` record is. Empty when the
    requests were written beside the run in a Kafka transaction (the transaction mode).
    """

    TYPE: ClassVar[str] = "run.succeeded"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["run.succeeded"] = "run.succeeded"
    schema_version: int = 2
    result_hash: str = Field(min_length=1, max_length=200)
    deliveries: tuple[JsonValue, ...] = Field(default=(), max_length=MAX_RUN_DELIVERIES)


class RunFailed(ExecutionEvent):
    """The agent gave up with an error."""

    TYPE: ClassVar[str] = "run.failed"
    type: Literal["run.failed"] = "run.failed"
    error: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class RunMarkedUnknown(ExecutionEvent):
    """Nobody can tell whether the run finished (e.g. the agent vanished)."""

    TYPE: ClassVar[str] = "run.marked_unknown"
    type: Literal["run.marked_unknown"] = "run.marked_unknown"
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
