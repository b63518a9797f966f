"""Per-agent send budgets: the events of ``ledger.budgets`` and the one rule that folds them.

An agent (a ``DeliveryRequested``'s ``producer``) may be given a budget: at most ``limit``
deliveries per ``window``, for every channel or for one. Its deliveries are spread over
every partition of ``ledger.deliveries``, owned by different workers, so no worker can
count them alone. The budgets topic, keyed by agent (one partition per agent, so one
order), is the one place where they are counted:

* ``BudgetSet`` / ``BudgetCleared`` (an operator, signed with the operator key): the
  limit and window of one agent, for all its channels (``channel`` None) or for one.
* ``BudgetSpent`` (a worker, signed with the worker key): before a worker claims a
  delivery of a budgeted agent for the first time, it appends one of these, and claims
  only once it has read it back and the rule below grants it.
* ``BudgetReleased`` (an operator, signed): let ``count`` more deliveries of the agent
  go than its budget allows.

Every worker (and ``ledger budgets show``) reads the whole topic and folds it with
``BudgetBook``; the rule reads no clock, only the log, so every reader reaches the same
verdicts in the same order:

1. The budget of a delivery is its agent's budget for its channel if there is one, else
   the agent's budget for every channel, else none (a delivery with no budget is never
   held and spends nothing).
2. Windows are consecutive spans of ``window_s`` seconds starting at the budget's
   anchor: the ``occurred_at`` of the ``BudgetSet`` that gave the window its length (a
   new ``BudgetSet`` with the same window keeps the anchor and the counts; one with
   another window starts afresh). A ``BudgetSpent`` counts in the window containing its
   ``window_start``.
3. Within a window, the first ``limit`` (plus that window's allowance) distinct keys
   spent, in log order, are within budget: granted. A key spent beyond that is over
   budget and waits. A key granted once stays granted (a retry of a delivery is not a new
   delivery), so a repeated ``BudgetSpent`` — at-least-once appends, a worker that
   re-spent before it read its first one back — changes nothing.
4. A ``BudgetReleased`` of ``count`` (counted once, by its ``event_id``) grants the
   oldest over-budget keys not yet granted (oldest window first, log order within it),
   up to ``count``; what is left of ``count`` is allowance added to the window
   containing the release's ``occurred_at`` (the operator's clock), for deliveries held
   without spending (the gate holds a delivery of a full window without appending
   anything, streams/budget_gate.py).
5. ``BudgetCleared`` forgets the budget and its counts; a later ``BudgetSet`` starts
   afresh.

Windows older than ``RETAIN_S`` before the newest one a budget has seen are forgotten, so
the book stays bounded: a delivery retried after that spends again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, ClassVar, Literal
from uuid import UUID

from pydantic import Field, TypeAdapter, ValidationError, field_validator

from events.base import Event, check_key
from events.bounds import MAX_TEXT_CHARS, Moment

# Who acted: a name or an address, printable (as events/operator.py).
OPERATOR_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
AGENT_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
MAX_LIMIT = 10**9
MIN_WINDOW_S = 1
MAX_WINDOW_S = 366 * 24 * 3600
# How far back a book keeps windows (and the keys granted in them).
RETAIN_S = 7 * 24 * 3600
MAX_BUDGET_RECORD_BYTES = 64 * 1024

Agent = Annotated[str, Field(pattern=AGENT_PATTERN)]
Channel = Annotated[str, Field(min_length=1, max_length=64)]


class BudgetEvent(Event):
    """An event of ``ledger.budgets``, keyed by ``agent``."""

    agent: Agent
    channel: Channel | None = None


class BudgetOperatorEvent(BudgetEvent):
    """An operator's action on a budget: who and why, signed with the operator key."""

    operator: str = Field(pattern=OPERATOR_PATTERN)
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class BudgetSet(BudgetOperatorEvent):
    """At most ``limit`` deliveries of ``agent`` (on ``channel``, or all) per ``window_s``."""

    TYPE: ClassVar[str] = "budget.set"
    type: Literal["budget.set"] = "budget.set"
    limit: int = Field(ge=0, le=MAX_LIMIT)
    window_s: int = Field(ge=MIN_WINDOW_S, le=MAX_WINDOW_S)


class BudgetCleared(BudgetOperatorEvent):
    """The agent's budget (on ``channel``, or for all) is gone: nothing of it holds."""

    TYPE: ClassVar[str] = "budget.cleared"
    type: Literal["budget.cleared"] = "budget.cleared"


class BudgetReleased(BudgetOperatorEvent):
    """Let ``count`` more deliveries of the agent go beyond its budget (rule 4)."""

    TYPE: ClassVar[str] = "budget.released"
    type: Literal["budget.released"] = "budget.released"
    count: int = Field(ge=1, le=MAX_LIMIT)


class BudgetSpent(BudgetEvent):
    """A worker asks to spend one of the agent's budget on ``idempotency_key`` (a delivery
    on ``channel``) in the window starting at ``window_start``; the fold judges it."""

    TYPE: ClassVar[str] = "budget.spent"
    type: Literal["budget.spent"] = "budget.spent"
    channel: Channel
    idempotency_key: str
    window_start: Moment

    @field_validator("idempotency_key")
    @classmethod
    def _key(cls, value: str) -> str:
        return check_key(value)


AnyBudgetEvent = BudgetSet | BudgetCleared | BudgetReleased | BudgetSpent
BUDGET_ADAPTER: TypeAdapter[AnyBudgetEvent] = TypeAdapter(
    Annotated[AnyBudgetEvent, Field(discriminator="type")]
)


class BudgetDecodeError(ValueError):
    """Bytes that are not a budget event; the message is one line."""


def encode_budget(event: BudgetEvent) -> bytes:
    """The event as compact JSON bytes."""
    return event.model_dump_json().encode("utf-8")


def decode_budget(data: bytes | None) -> AnyBudgetEvent:
    """One record value of ``ledger.budgets``, or ``BudgetDecodeError`` (one line)."""
    if data is None:
        raise BudgetDecodeError("record has no value (tombstone)")
    if len(data) > MAX_BUDGET_RECORD_BYTES:
        raise BudgetDecodeError(f"record is {len(data)} bytes, over {MAX_BUDGET_RECORD_BYTES}")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BudgetDecodeError(f"value is not JSON: {str(exc)[:200]}") from None
    try:
        return BUDGET_ADAPTER.validate_python(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "value"
        raise BudgetDecodeError(f"invalid budget event: {where}: {first['msg']}"[:300]) from None


def record_key(event: BudgetEvent) -> bytes:
    """The partitioning key: the agent (all of one agent's budget events in one order)."""
    return event.agent.encode("utf-8")


def decode_budget_record(value: bytes | None, key: bytes | None) -> AnyBudgetEvent:
    """One record of ``ledger.budgets`` (value and key) as every reader takes it, or
    ``BudgetDecodeError``: a record keyed other than by its agent is refused too (it would
    sit in another partition, outside the agent's one order). Whether it is signed as it
    must be is the reader's second check (clients/outcome_signing.py)."""
    event = decode_budget(value)
    if key is not None and key != record_key(event):
        raise BudgetDecodeError("record key is not the event's agent")
    return event


_WINDOW = re.compile(r"^\s*(\d{1,9})\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> int:
    """``30s``, ``15m``, ``1h``, ``7d`` as seconds; ``ValueError`` says what is accepted."""
    found = _WINDOW.match(text)
    seconds = int(found.group(1)) * _UNIT_S[found.group(2)] if found else 0
    if not found or not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ValueError(
            f"window {text!r} is not a number and a unit (s, m, h, d) between 1s and 366d"
        )
    return seconds


def window_text(seconds: int) -> str:
    """A window in the largest unit that divides it (``3600`` -> ``1h``)."""
    for unit in ("d", "h", "m"):
        if seconds % _UNIT_S[unit] == 0:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    return f"{seconds}s"


class Verdict(StrEnum):
    """What the book says of one delivery now."""

    UNBUDGETED = "unbudgeted"  # no budget applies: never held
    GRANTED = "granted"  # within budget (rule 3) or released (rule 4)
    OVER = "over"  # spent beyond the budget, or its window is full: it waits
    ROOM = "room"  # not spent yet, and its window has room: spend, then ask again


@dataclass(frozen=True)
class Judgement:
    """A verdict with what it was made against."""

    verdict: Verdict
    limit: int = 0
    used: int = 0
    window_start: datetime | None = None
    window_end: datetime | None = None


@dataclass
class WindowUse:
    """One window of one budget: the keys granted and those over budget, in log order."""

    granted: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)
    allowance: int = 0


@dataclass
class Budget:
    """One budget's terms and its counts (rules 2-5)."""

    agent: str
    channel: str | None
    limit: int
    window_s: int
    anchor: datetime
    windows: dict[datetime, WindowUse] = field(default_factory=dict)
    granted: dict[str, datetime] = field(default_factory=dict)
    over: set[str] = field(default_factory=set)

    def window_of(self, moment: datetime) -> datetime:
        """The start of the window containing ``moment``."""
        steps = (moment - self.anchor) // timedelta(seconds=self.window_s)
        return self.anchor + steps * timedelta(seconds=self.window_s)

    def use(self, start: datetime) -> WindowUse:
        """The counts of the window starting at ``start`` (created empty)."""
        use = self.windows.get(start)
        if use is None:
            use = self.windows[start] = WindowUse()
            self._forget_before(start - timedelta(seconds=max(RETAIN_S, 2 * self.window_s)))
        return use

    def full(self, use: WindowUse) -> bool:
        """Whether a window has granted all it may."""
        return len(use.granted) >= self.limit + use.allowance

    def _forget_before(self, horizon: datetime) -> None:
        for start in [s for s in self.windows if s < horizon]:
            gone = self.windows.pop(start)
            for key in gone.granted:
                if self.granted.get(key) == start:
                    del self.granted[key]
            self.over.difference_update(gone.over)


ScopeKey = tuple[str, str | None]


class BudgetBook:
    """The fold of ``ledger.budgets`` (the rule in this module's docstring). Pure: apply
    events in log order, then ask."""

    def __init__(self) -> None:
        self.budgets: dict[ScopeKey, Budget] = {}
        self.applied = 0
        # Releases are not idempotent by their content: one read twice counts once.
        self.released: set[UUID] = set()

    def apply_all(self, events: Iterable[AnyBudgetEvent]) -> BudgetBook:
        """Apply ``events`` in order; returns self."""
        for event in events:
            self.apply(event)
        return self

    def apply(self, event: AnyBudgetEvent) -> None:
        """Fold one event read from the log."""
        self.applied += 1
        scope = (event.agent, event.channel)
        if isinstance(event, BudgetSet):
            current = self.budgets.get(scope)
            if current is not None and current.window_s == event.window_s:
                current.limit = event.limit  # same windows: the counts stand
            else:
                self.budgets[scope] = Budget(
                    event.agent, event.channel, event.limit, event.window_s, event.occurred_at
                )
        elif isinstance(event, BudgetCleared):
            self.budgets.pop(scope, None)
        elif isinstance(event, BudgetReleased):
            if event.event_id in self.released:
                return
            self.released.add(event.event_id)
            budget = self.budgets.get(scope)
            if budget is not None:
                _release(budget, event.count, event.occurred_at)
        else:
            budget = self.budget_for(event.agent, event.channel)
            if budget is not None:
                _spend(budget, event.idempotency_key, event.window_start)

    def budget_for(self, agent: str, channel: str) -> Budget | None:
        """The budget a delivery of ``agent`` on ``channel`` counts against (rule 1)."""
        return self.budgets.get((agent, channel)) or self.budgets.get((agent, None))

    def judge(self, agent: str | None, channel: str, key: str, now: datetime) -> Judgement:
        """What the log says of delivery ``key`` of ``agent`` on ``channel`` at ``now``."""
        budget = None if agent is None else self.budget_for(agent, channel)
        if budget is None:
            return Judgement(Verdict.UNBUDGETED)
        start = budget.window_of(now)
        end = start + timedelta(seconds=budget.window_s)
        use = budget.windows.get(start) or WindowUse()
        limit = budget.limit + use.allowance
        if key in budget.granted:
            verdict = Verdict.GRANTED
        elif key in use.over or budget.full(use):
            verdict = Verdict.OVER
        else:
            verdict = Verdict.ROOM
        return Judgement(verdict, limit, len(use.granted), start, end)

    def held(self, agent: str) -> int:
        """Keys of ``agent`` spent beyond a budget and not released (held after spending;
        the projection counts every held delivery)."""
        return sum(
            len(b.over - b.granted.keys()) for (a, _), b in self.budgets.items() if a == agent
        )


def _spend(budget: Budget, key: str, window_start: datetime) -> None:
    if key in budget.granted:
        return  # granted once: a repeat or a retry changes nothing (rule 3)
    use = budget.use(budget.window_of(window_start))
    if key in use.over:
        return
    if budget.full(use):
        use.over.append(key)
        budget.over.add(key)
    else:
        start = budget.window_of(window_start)
        use.granted.append(key)
        budget.granted[key] = start


def _release(budget: Budget, count: int, at: datetime) -> None:
    left = count
    for start in sorted(budget.windows):
        use = budget.windows[start]
        for key in use.over:
            if left == 0:
                return
            if key not in budget.granted:
                budget.granted[key] = start
                budget.over.discard(key)
                left -= 1
    if left:
        budget.use(budget.window_of(at)).allowance += left
