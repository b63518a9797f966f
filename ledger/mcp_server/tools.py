"""What the MCP server's tools do, without MCP: each takes its validated input and returns
an ``Answer`` (words for the model, and the same as data), or raises ``ToolRefused`` (one
line). Publishing is the HTTP API's (api/publishing.py: the SDK's publisher, idempotent by
run id), reads are its answers (api/answers.py), the timeline is the CLI's
(ledger/render.py), operator actions are the CLI's and the dashboard's
(clients/operator_actions.py, signed and appended as events).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.text import Text

from api.answers import SHOWN, ReadRefused, delivery_row, key_answer, read_projection, run_answer
from api.idempotency import open_answers
from api.models import CompleteRun, RunAnswer
from api.publishing import Published, RunRefused, complete_run
from api.services import TRANSACTIONAL_PREFIX, answers_dsn
from clients.operator_actions import Action, OperatorLog, redrive_action, resolve_action
from clients.publisher import DeliverySpec, Publisher
from config.settings import Settings
from events.base import KEY_PATTERN, RUN_ID_PATTERN
from events.errors import LedgerError
from events.operator import OPERATOR_PATTERN
from events.redaction import redacted_data, redacted_text
from ledger.render import timeline_lines
from projections.backends import default_dsn
from projections.dashboard.actions import append_signed
from projections.dashboard.errors import Refused
from projections.incident import key_position, run_view
from projections.queries import UNKNOWN, delivery_state, unknown_awaiting_reconciliation
from projections.store import Store

STRICT = ConfigDict(extra="forbid", hide_input_in_errors=True)
RunId = Field(pattern=RUN_ID_PATTERN.pattern, max_length=200, description="The agent's run id.")
Key = Field(
    pattern=KEY_PATTERN.pattern,
    description="The idempotency key: what identifies the delivery at the receiver (64 hex).",
)
OperatorName = Field(
    pattern=OPERATOR_PATTERN,
    description="Who acts (it goes into the signed event): one of the server's --operator names.",
)
Reason = Field(min_length=1, max_length=4000, description="Why, for the record.")


class ToolRefused(Exception):
    """A tool call not carried out: one line (a hint after a colon, where there is one)."""


@dataclass(frozen=True)
class Answer:
    """A tool's answer: ``text`` for the model to read, ``data`` the same as JSON."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)


# Inputs ----------------------------------------------------------------------------------


class PublishRunResult(BaseModel):
    """The run succeeded with this result, and these deliveries follow from it: all of it in
    one Kafka transaction, or none. The same call again gets the first answer."""

    model_config = STRICT

    run_id: str = RunId
    result_hash: str = Field(min_length=1, max_length=200, description="Identifies the result.")
    deliveries: list[DeliverySpec] = Field(
        default_factory=list, description="The notifications the result calls for."
    )


class Which(BaseModel):
    """A run (all its deliveries) or one delivery, by the key the receiver sees."""

    model_config = STRICT

    run_id: str | None = Field(
        default=None, pattern=RUN_ID_PATTERN.pattern, max_length=200, description="A run id."
    )
    idempotency_key: str | None = Field(
        default=None,
        pattern=KEY_PATTERN.pattern,
        description="A delivery's idempotency key (64 hex), as its receiver sees it.",
    )

    @model_validator(mode="after")
    def _one(self) -> Which:
        if (self.run_id is None) == (self.idempotency_key is None):
            raise ValueError("give run_id or idempotency_key (one of them)")
        return self


class ListUnknown(BaseModel):
    """UNKNOWN deliveries, the oldest first."""

    model_config = STRICT

    limit: int = Field(default=50, ge=1, le=SHOWN, description="At most this many (1-500).")


class Resolve(BaseModel):
    """Settle an UNKNOWN (or a SENT past its SLO) with the receiver's evidence."""

    model_config = STRICT

    idempotency_key: str = Key
    operator: str = OperatorName
    outcome: Literal["delivered", "not_delivered", "abandoned"] = Field(
        description="delivered: CONFIRMED; not_delivered: a new attempt, same key; "
        "abandoned: FAILED."
    )
    reason: str = Reason
    receiver_id: str | None = Field(
        default=None, min_length=1, max_length=200, description="The receiver's id for it."
    )


class Redrive(BaseModel):
    """Send a FAILED delivery again under the same key (an UNKNOWN is looked up first)."""

    model_config = STRICT

    idempotency_key: str = Key
    operator: str = OperatorName
    reason: str = Reason


# The answers in words ---------------------------------------------------------------------

NOT_SUCCESS = (
    "UNKNOWN is not a success: nobody can tell yet whether the receiver got it; a lookup "
    "by its key at the receiver (or an operator with the receiver's evidence) settles it"
)


def status_text(answer: RunAnswer) -> str:
    """The three answers, one delivery per paragraph; UNKNOWN said to be unknown."""
    lines = [f"run {answer.run_id}", f"  did execution finish? {answer.execution.summary}"]
    if not answer.deliveries:
        lines.append("  no deliveries")
    for d in answer.deliveries:
        lines.append(f"  delivery {d.channel} {d.recipient} ({d.event_type}): {d.status}")
        lines.append(f"    did it leave? {d.left_system}")
        lines.append(f"    key at the receiver: {d.idempotency_key}")
        lines.append(f"    receiver's id: {d.provider_message_id or 'none yet'}")
        if d.status == "UNKNOWN":
            lines.append(f"    {NOT_SUCCESS}")
    if answer.total_deliveries > len(answer.deliveries):
        lines.append(f"  ({len(answer.deliveries)} of {answer.total_deliveries} deliveries shown)")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(redacted_text(text).split())


def refusal_text(error: str, hint: str | None) -> str:
    """A refusal as one line: what was wrong, then the hint."""
    return _one_line(f"{error} (hint: {hint})" if hint else error)


# The tools ---------------------------------------------------------------------------------


class LedgerTools:
    """The tools of one server: its settings, the agent it publishes as, the operators it
    lets act (none: resolve and redrive are off). The publisher starts at the first publish,
    so a server that only reads needs no broker."""

    def __init__(self, settings: Settings, *, agent: str, operators: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.agent = agent
        self.operators = operators
        self.dsn = default_dsn(settings)
        self._answers = open_answers(answers_dsn(settings), settings.api.in_flight_stale_s)
        self._publisher: Publisher | None = None
        self._starting = asyncio.Lock()

    async def close(self) -> None:
        """Commit what is queued, disconnect, close the first answers."""
        if self._publisher is not None:
            await self._publisher.stop()
            self._publisher = None
        await self._answers.close()

    async def _started(self) -> Publisher:
        async with self._starting:
            if self._publisher is None:
                publisher = Publisher(
                    self.settings,
                    producer_name=self.agent,
                    # the api role's transactional ids (ledger/acls.py): it publishes as the API
                    transactional_id=f"{TRANSACTIONAL_PREFIX}mcp-{uuid.uuid4().hex[:12]}",
                    mode="transaction",  # as the HTTP API's (api/services.py)
                )
                try:
                    await publisher.start()
                except LedgerError as exc:
                    await publisher.stop()
                    raise ToolRefused(refusal_text(exc.message, exc.hint)) from None
                await self._answers.open()
                self._publisher = publisher
            return self._publisher

    async def publish_run_result(self, given: PublishRunResult) -> Answer:
        """Publish a succeeded run and its deliveries, once per run id."""
        publisher = await self._started()
        body = CompleteRun(result_hash=given.result_hash, deliveries=given.deliveries)
        max_deliveries = self.settings.api.max_deliveries_per_run
        try:
            published = await complete_run(
                publisher, self._answers, max_deliveries, given.run_id, self.agent, body
            )
        except RunRefused as exc:
            hint = exc.hint or ("retry in a second" if exc.retry_after_s else None)
            raise ToolRefused(refusal_text(exc.error, hint)) from None
        return _published(published)

    async def delivery_status(self, which: Which) -> Answer:
        """The three answers for a run, or for one delivery by its key."""

        def ask(store: Store) -> RunAnswer:
            if which.idempotency_key is not None:
                return key_answer(store, which.idempotency_key)
            assert which.run_id is not None
            return run_answer(store, which.run_id)

        answer = await self._read(ask)
        return Answer(status_text(answer), answer.model_dump(mode="json"))

    async def list_unknown(self, given: ListUnknown) -> Answer:
        """The UNKNOWN deliveries: nobody knows yet whether they reached the receiver."""

        def ask(store: Store) -> tuple[int, list[dict[str, Any]]]:
            return UNKNOWN.count(store), unknown_awaiting_reconciliation(store, given.limit)

        total, rows = await self._read(ask)
        shown: list[dict[str, Any]] = redacted_data(rows)
        lines = [
            f"{total} deliveries are UNKNOWN (not a success: not known to have arrived)"
            if total
            else "no delivery is UNKNOWN"
        ]
        for row in shown:
            lines.append(
                f"  {row['idempotency_key']}  run {row['run_id']}  {row['channel']} "
                f"{row['recipient']}  since {row['unknown_since']}  "
                f"({row['last_error_class'] or 'no error class'}, "
                f"lookup: {row['reconciliation'] or 'not yet'})"
            )
        if total > len(shown):
            lines.append(f"  ({len(shown)} shown, the oldest first)")
        return Answer("\n".join(lines), {"total": total, "deliveries": shown})

    async def explain_delivery(self, which: Which) -> Answer:
        """The timeline in words: a run's, or one delivery's (with its run's)."""
        lines = await self._read(lambda store: timeline_text(store, which))
        return Answer("\n".join(lines), {"timeline": lines})

    async def resolve(self, given: Resolve) -> Answer:
        """Settle a delivery as an operator (a signed event in the log)."""
        self._permitted(given.operator, "resolve")
        state = await self._read(lambda store: delivery_state(store, given.idempotency_key))
        if state is None:
            raise ToolRefused(f"no delivery with key {given.idempotency_key} in the projection")
        action = resolve_action(
            state,
            operator=given.operator,
            outcome=given.outcome,
            reason=given.reason.strip(),
            scope="key (mcp)",
            receiver_id=given.receiver_id,
        )
        return await self._act(action, "resolve")

    async def redrive(self, given: Redrive) -> Answer:
        """Send a FAILED delivery again, or reconcile an UNKNOWN afresh, as an operator."""
        self._permitted(given.operator, "redrive")
        state = await self._read(lambda store: delivery_state(store, given.idempotency_key))
        if state is None:
            raise ToolRefused(f"no delivery with key {given.idempotency_key} in the projection")
        action = redrive_action(
            state, operator=given.operator, reason=given.reason.strip(), scope="key (mcp)"
        )
        return await self._act(action, "redrive")

    def refuse_operator_tool(self, name: str) -> None:
        """``ToolRefused`` when operator actions are off on this server."""
        if not self.operators:
            raise ToolRefused(
                f"{name} is off: this server was started without operator permission "
                "(hint: an operator starts it with 'ledger mcp --operator NAME')"
            )

    def _permitted(self, operator: str, name: str) -> None:
        self.refuse_operator_tool(name)
        if operator not in self.operators:
            raise ToolRefused(
                f"operator {operator!r} may not {name} on this server "
                "(hint: it acts only for the names it was started with, --operator NAME)"
            )

    async def _act(self, action: Action, what: str) -> Answer:
        if action.refusal is not None or action.event is None:
            raise ToolRefused(f"{what} refused: {action.refusal}")
        event = action.event
        try:
            await append_signed(
                OperatorLog(self.settings),
                event,
                what=f"the {what}",
                hint="check the run's timeline before acting again",
            )
        except Refused as exc:
            raise ToolRefused(refusal_text(exc.error, exc.hint)) from None
        data = {
            "event_id": str(event.event_id),
            "action": what,
            "idempotency_key": event.idempotency_key,
            "run_id": event.run_id,
            "operator": event.operator,
        }
        text = (
            f"{what} of {event.idempotency_key} by {event.operator} appended to the log "
            f"(event {event.event_id}); the run's timeline shows it once projected"
        )
        return Answer(text, data)

    async def _read(self, work: Any) -> Any:
        try:
            return await read_projection(self.dsn, work)
        except ReadRefused as exc:
            raise ToolRefused(refusal_text(exc.error, exc.hint)) from None


def timeline_text(store: Store, which: Which) -> list[str]:
    """The three answers and every step, in words (the CLI's ``ledger run --timeline``),
    for a run or for one delivery and its run."""
    key = which.idempotency_key
    run_id = which.run_id if key is None else delivery_row(store, key)["run_id"]
    assert run_id is not None
    try:
        if key is None:
            view = run_view(store, run_id, limit=SHOWN)
        else:
            view = run_view(store, run_id, offset=key_position(store, run_id, key) or 0, limit=1)
    except LedgerError as exc:
        raise ReadRefused(404, exc.message, field="run_id", hint=exc.hint) from None
    lines = [Text.from_markup(line).plain.rstrip() for line in timeline_lines(view)]
    if any(d.delivery["status"] == "UNKNOWN" for d in view.deliveries):
        lines.append(f"({NOT_SUCCESS})")
    return lines


def _published(published: Published) -> Answer:
    answer = published.answer
    keys = [
        f"  {d['channel']} {d['event_type']}: key {d['idempotency_key']}"
        for d in answer["deliveries"]
    ]
    first = (
        "the first answer, repeated: nothing was published again"
        if published.replayed
        else ("committed to the log in one transaction")
    )
    text = "\n".join(
        [
            f"run {answer['run_id']} succeeded: {first}; "
            f"{len(keys)} deliveries (keys at the receiver):",
            *keys,
            "ask delivery_status with the run id to learn whether they arrived",
        ]
    )
    return Answer(text, {**answer, "replayed": published.replayed})
