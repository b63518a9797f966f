"""Execution events on ``ledger.runs``: did the agent finish the work?"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from events.base import Event, check_run_id
from events.bounds import MAX_TEXT_CHARS


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
    """The agent finished; ``result_hash`` identifies the result it committed."""

    TYPE: ClassVar[str] = "run.succeeded"
    type: Literal["run.succeeded"] = "run.succeeded"
    result_hash: str = Field(min_length=1, max_length=200)


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
