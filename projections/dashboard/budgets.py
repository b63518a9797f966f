"""The Send budgets panel's action: release an agent's held deliveries from the page.

    POST /api/budgets/{agent}/release  {"count", "operator", "reason", "channel"?}

The same event as ``ledger budgets release AGENT --count N`` (events/budgets.py
``BudgetReleased``), signed with the operator key and appended the same way
(clients/budget_actions.py). The server's guard has already checked where the request comes
from (its own page) and its token, as for Resolve and Redrive. Here: JSON only, the count,
the operator's name and reason, and that the projection knows the budget; every refusal is
one line and a hint, and appends nothing. What is released is the book's to decide (rule 4:
the oldest held first); the workers see it within seconds.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from clients.budget_actions import PRODUCER, BudgetActions
from config.settings import Settings
from events.budgets import AGENT_PATTERN, MAX_LIMIT, BudgetReleased
from projections.dashboard.actions import append_signed, body_text, read_body, who_and_why
from projections.dashboard.errors import Refused, json_answer

# Whether the projection knows a budget of (agent, channel or None).
KnowsBudget = Callable[[str, str | None], Awaitable[bool]]


@dataclass(frozen=True)
class ReleaseContext:
    """What a release needs from the server: settings (to sign and append) and the
    projection's answer to whether the budget exists."""

    settings: Settings
    knows_budget: KnowsBudget


async def release(request: Request, ctx: ReleaseContext) -> Response:
    """Let ``count`` more of the agent's deliveries go (202 with the event id)."""
    agent: str = request.path_params["agent"]
    try:
        if not re.match(AGENT_PATTERN, agent):
            raise Refused(400, "the agent must be 1-200 printable characters", "check the URL")
        body = await read_body(request)
        count = _count(body)
        channel = _channel(body)
        who, why = who_and_why(body)
        if not await ctx.knows_budget(agent, channel):
            scope = f" on {channel}" if channel else ""
            raise Refused(
                404,
                f"{agent[:200]} has no budget{scope} in the projection",
                "reload: the Send budgets panel lists the budgets ('ledger budgets show')",
            )
        try:
            event = BudgetReleased(
                agent=agent,
                channel=channel,
                count=count,
                operator=who,
                reason=why,
                producer=PRODUCER,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise Refused(400, f"{field}: {first['msg']}", "correct it and try again") from None
        await _append(ctx.settings, event)
    except Refused as no:
        return no.response()
    return json_answer(
        {
            "event_id": str(event.event_id),
            "action": "release",
            "agent": event.agent,
            "channel": event.channel,
            "count": event.count,
            "operator": event.operator,
            "note": "appended to ledger.budgets; the workers let them go within seconds",
        },
        202,
    )


def _count(body: dict[str, Any]) -> int:
    count = body.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_LIMIT:
        raise Refused(
            400,
            f"count must be a whole number between 1 and {MAX_LIMIT}",
            "how many held deliveries may go, e.g. the held count the page shows",
        )
    return count


def _channel(body: dict[str, Any]) -> str | None:
    channel = body_text(body, "channel")
    if channel is None:
        return None
    if not 1 <= len(channel.strip()) <= 64:
        raise Refused(
            400, "channel must be 1-64 characters", "leave it out for the every-channel budget"
        )
    return channel.strip()


async def _append(settings: Settings, event: BudgetReleased) -> None:
    """Sign and append the release; return once the log has acknowledged it."""
    await append_signed(
        BudgetActions(settings),
        event,
        what="the release",
        hint="check 'ledger budgets show' before releasing again: a second release lets more go",
    )
