"""``ledger budgets``: set, clear, show and release agents' send budgets (events/budgets.py).

Thin: parse, read the budgets topic (what every worker folds), append one signed operator
event, print. What is held now comes from the projection (deliveries waiting
``over_budget``, per agent); what is spent comes from the topic.

Exit codes: 0 done, 2 bad input (nothing was appended), 1 a runtime failure.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.console import Console

from clients.budget_actions import PRODUCER, BudgetActions, ReadBook, read_book
from clients.operator_actions import check_operator, check_reason
from config.settings import Settings
from events.budgets import (
    AGENT_PATTERN,
    MAX_LIMIT,
    Budget,
    BudgetCleared,
    BudgetOperatorEvent,
    BudgetReleased,
    BudgetSet,
    parse_window,
    window_text,
)
from events.errors import LedgerError
from ledger.commands.operator_options import OperatorName, Reason
from ledger.errors import UsageError
from projections.backends import default_dsn, reading
from projections.queries import held_over_budget
from projections.schema import timestamp

out = Console(highlight=False)
app = typer.Typer(no_args_is_help=True, help="Agents' send budgets: set, clear, show, release.")

AgentArg = Annotated[str, typer.Argument(help="The agent: its deliveries' producer name.")]
ChannelOpt = Annotated[
    str | None,
    typer.Option("--channel", help="One channel's budget (default: every channel's)."),
]
Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="Projection database the held deliveries are counted in (default: "
        "LEDGER_PROJECTION__DSN, else the SQLite file in the data dir).",
        show_default=False,
    ),
]


def _agent(text: str) -> str:
    if not re.match(AGENT_PATTERN, text):
        raise UsageError(
            "the agent must be 1-200 printable characters",
            "give the producer name its deliveries carry (LEDGER_PUBLISHER__PRODUCER_NAME)",
        )
    return text


def _channel(text: str | None) -> str | None:
    if text is not None and not 1 <= len(text.strip()) <= 64:
        raise UsageError(
            "--channel must be 1-64 characters", "give a channel name, or leave it out"
        )
    return None if text is None else text.strip()


@app.command("set")
def set_command(
    agent: AgentArg,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", help="Deliveries per window (0 holds every one).", show_default=False
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option("--window", help="The window: 30s, 15m, 1h, 1d...", show_default=False),
    ] = None,
    channel: ChannelOpt = None,
    reason: Reason = None,
    operator: OperatorName = None,
) -> None:
    """At most --limit deliveries of AGENT per --window (for one --channel, or all);
    deliveries beyond it wait as over_budget until the window ends or a release."""
    if limit is None:
        raise UsageError("budgets set needs --limit", "e.g. --limit 100 --window 1h")
    if not 0 <= limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be between 0 and {MAX_LIMIT}", "e.g. --limit 100")
    if window is None:
        raise UsageError("budgets set needs --window", "e.g. --window 1h (s, m, h or d)")
    try:
        window_s = parse_window(window)
    except ValueError as exc:
        raise UsageError(str(exc), "e.g. --window 1h") from None
    event = BudgetSet(
        agent=_agent(agent),
        channel=_channel(channel),
        limit=limit,
        window_s=window_s,
        operator=check_operator(operator),
        reason=check_reason(reason),
        producer=PRODUCER,
    )
    _append(Settings(), event)
    scope = f" on {event.channel}" if event.channel else ""
    out.print(f"budget set: {agent}{scope}: {limit} per {window_text(window_s)}")


@app.command("clear")
def clear_command(
    agent: AgentArg,
    channel: ChannelOpt = None,
    reason: Reason = None,
    operator: OperatorName = None,
) -> None:
    """Remove AGENT's budget (for one --channel, or the every-channel one): what it held
    goes out."""
    who, name, scope = check_operator(operator), _agent(agent), _channel(channel)
    settings = Settings()
    found = _read(settings)
    if (name, scope) not in found.book.budgets:
        raise UsageError(_no_budget(name, scope), "'ledger budgets show' lists the budgets")
    event = BudgetCleared(
        agent=name,
        channel=scope,
        operator=who,
        reason=check_reason(reason or "budget cleared"),
        producer=PRODUCER,
    )
    _append(settings, event)
    out.print(f"budget cleared: {name}{f' on {scope}' if scope else ''}")


@app.command("release")
def release_command(
    agent: AgentArg,
    count: Annotated[
        int | None,
        typer.Option(
            "--count",
            help="How many held deliveries may go (default: all held now, as the projection "
            "shows them).",
            show_default=False,
        ),
    ] = None,
    channel: ChannelOpt = None,
    reason: Reason = None,
    operator: OperatorName = None,
    dsn: Dsn = None,
) -> None:
    """Let AGENT's deliveries held over budget go: --count of them, oldest first, or all."""
    if count is not None and not 1 <= count <= MAX_LIMIT:
        raise UsageError(f"--count must be between 1 and {MAX_LIMIT}", "e.g. --count 10")
    who, why = check_operator(operator), check_reason(reason)
    name, scope = _agent(agent), _channel(channel)
    settings = Settings()
    found = _read(settings)
    if (name, scope) not in found.book.budgets:
        raise UsageError(_no_budget(name, scope), "'ledger budgets show' lists the budgets")
    if count is None:
        held = _held(settings, dsn, name)
        if held is None:
            raise UsageError(
                "cannot count the held deliveries: no projection to read",
                "pass --count N, or --dsn of the live projection",
            )
        if held == 0:
            raise UsageError(
                f"nothing of {name} is held over budget now",
                "pass --count N to allow N more in this window anyway",
            )
        count = held
    event = BudgetReleased(
        agent=name, channel=scope, count=count, operator=who, reason=why, producer=PRODUCER
    )
    _append(settings, event)
    out.print(f"released: {count} of {name}'s held deliveries may go")


@app.command("show")
def show_command(
    agent: Annotated[str | None, typer.Argument(help="One agent (default: every one).")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    dsn: Dsn = None,
) -> None:
    """Each budget: its terms, what is spent in the current window, and what is held."""
    settings = Settings()
    name = None if agent is None else _agent(agent)
    found = _read(settings)
    now = datetime.now(UTC)  # the CLI decides what "now" is; the library never does
    held = _held_rows(settings, dsn, name)
    budgets = [
        _shown(b, now, held)
        for (who, _), b in sorted(
            found.book.budgets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
        )
        if name is None or who == name
    ]
    report: dict[str, Any] = {
        "now": timestamp(now),
        "budgets": budgets,
        "held": held,
        "refused_records": found.refused,
    }
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    if not budgets:
        out.print(f"no budgets{f' for {name}' if name else ''}")
    for b in budgets:
        # One line per budget, whole names (for grep and copy, at any terminal width).
        held_now = "unknown" if b["held"] is None else str(b["held"])
        out.print(
            f"{b['agent']} on {b['channel'] or 'every channel'}: {b['spent']} of "
            f"{b['allowed']} spent in the window of {b['window']} ending {b['window_end']} "
            f"(limit {b['limit']}); held now: {held_now}",
            soft_wrap=True,
        )
    if held is None:
        out.print("held now: unknown (no projection to read; pass --dsn)")
    if found.refused:
        out.print(f"skipped {found.refused} budget record(s) not signed as they must be")


def _shown(budget: Budget, now: datetime, held: list[dict[str, Any]] | None) -> dict[str, Any]:
    start = budget.window_of(now)
    use = budget.windows.get(start)
    spent = 0 if use is None else len(use.granted)
    allowance = 0 if use is None else use.allowance
    end = start + timedelta(seconds=budget.window_s)
    held_n = None if held is None else sum(r["held"] for r in held if r["agent"] == budget.agent)
    return {
        "agent": budget.agent,
        "channel": budget.channel,
        "limit": budget.limit,
        "window": window_text(budget.window_s),
        "window_start": timestamp(start),
        "window_end": timestamp(end),
        "spent": spent,
        "allowed": budget.limit + allowance,
        "held": held_n,
    }


def _no_budget(agent: str, channel: str | None) -> str:
    return f"{agent} has no budget{f' on {channel}' if channel else ''}"


def _read(settings: Settings) -> ReadBook:
    found = asyncio.run(read_book(settings))
    if not found.topic_exists:
        raise LedgerError(
            f"the budgets topic {settings.kafka.topic_budgets} does not exist",
            "run 'ledger topics create'",
        )
    return found


def _append(settings: Settings, event: BudgetOperatorEvent) -> None:
    async def append() -> None:
        async with BudgetActions(settings) as actions:
            await actions.append([event])

    asyncio.run(append())


def _held_rows(
    settings: Settings, dsn: str | None, agent: str | None
) -> list[dict[str, Any]] | None:
    """Deliveries held over budget per agent, from the projection (None: none to read)."""
    try:
        with reading(dsn or default_dsn(settings)) as store:
            return held_over_budget(store, agent)
    except LedgerError:
        if dsn is not None:
            raise
        return None


def _held(settings: Settings, dsn: str | None, agent: str) -> int | None:
    rows = _held_rows(settings, dsn, agent)
    return None if rows is None else sum(r["held"] for r in rows)
