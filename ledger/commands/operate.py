"""``ledger resolve`` and ``ledger redrive``: an operator's actions, each a signed event.

Thin: parse, select from the projection (the state the operator sees), ask the fold's own
rule (clients/operator_actions.py) what each action would do, append the ones that apply,
print. Nothing here edits a table: the projection and the worker fold what was appended.

Exit codes: 0 when every action applied or there was nothing to do (a delivery already
CONFIRMED is settled, not refused), 1 when some were refused, 2 for bad input (nothing
was appended).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from clients.operator_actions import (
    Action,
    OperatorLog,
    ResolveOutcome,
    check_operator,
    check_reason,
    redrive_action,
    resolve_action,
)
from clients.outcome_keys import operator_signer_for
from config.settings import Settings
from events.delivery_state import Status
from events.operator import OperatorEvent
from events.redaction import redacted_url
from ledger.commands.operator_options import OperatorName, Reason
from ledger.errors import UsageError, given_time
from projections.backends import default_dsn, reading
from projections.fold import Row, state_of_row
from projections.queries import Selection, known_keys, selected_count, selected_deliveries
from projections.store import Store

out = Console(highlight=False)
err = Console(stderr=True)
app = typer.Typer()

DEFAULT_LIMIT = 1000
# Events per batch appended between two steps of the progress bar.
APPEND_BATCH = 100

REQUESTED, REFUSED, SETTLED = "requested", "refused", "already settled (CONFIRMED)"


class Redrivable(StrEnum):
    """The states a redrive applies to."""

    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="Projection database to select from (default: LEDGER_PROJECTION__DSN, else the "
        "SQLite file in the data dir), as for 'ledger status'.",
        show_default=False,
    ),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Show exactly what would happen; append nothing.")
]


@dataclass(frozen=True)
class Planned:
    """One selected delivery, as the operator sees it, and what the action does to it."""

    row: Row
    action: Action

    @property
    def result(self) -> str:
        """requested, refused or already settled."""
        if self.action.state.status is Status.CONFIRMED:
            return SETTLED
        return REFUSED if self.action.refusal is not None else REQUESTED


@app.command("resolve")
def resolve_command(
    key: Annotated[str, typer.Argument(help="The delivery's idempotency key.")],
    delivered: Annotated[
        bool, typer.Option("--delivered", help="The receiver has it: CONFIRMED.")
    ] = False,
    not_delivered: Annotated[
        bool,
        typer.Option("--not-delivered", help="The receiver lacks it: a new attempt, same key."),
    ] = False,
    abandon: Annotated[
        bool, typer.Option("--abandon", help="Nobody will find out: FAILED, abandoned.")
    ] = False,
    receiver_id: Annotated[
        str | None,
        typer.Option("--receiver-id", help="The receiver's id for it (with --delivered)."),
    ] = None,
    reason: Reason = None,
    operator: OperatorName = None,
    dry_run: DryRun = False,
    dsn: Dsn = None,
) -> None:
    """Settle an UNKNOWN (or a SENT past its SLO) with the receiver's evidence."""
    outcome = _outcome(delivered=delivered, not_delivered=not_delivered, abandon=abandon)
    if receiver_id is not None and outcome != "delivered":
        raise UsageError("--receiver-id goes with --delivered only", "drop --receiver-id")
    if receiver_id is not None and not receiver_id.strip():
        raise UsageError("--receiver-id is empty", "give the receiver's id, or leave it out")
    who, why = check_operator(operator), check_reason(reason)
    settings = _settings(dry_run)
    with reading(dsn or default_dsn(settings)) as store:
        _known(store, [key])
        [row] = selected_deliveries(store, Selection(keys=(key,)), 1)
    state = state_of_row(row)
    action = resolve_action(
        state, operator=who, outcome=outcome, reason=why, scope="key", receiver_id=receiver_id
    )
    code = _carry_out(settings, [Planned(row, action)], dry_run=dry_run, what=f"resolve {outcome}")
    raise typer.Exit(code)


@app.command("redrive")
def redrive_command(
    keys: Annotated[
        list[str] | None,
        typer.Argument(help="Idempotency keys (or select with the options).", show_default=False),
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="The run's deliveries.")] = None,
    channel: Annotated[str | None, typer.Option("--channel", help="One channel's.")] = None,
    recipient: Annotated[
        str | None, typer.Option("--recipient", help="One recipient's (exactly as requested).")
    ] = None,
    states: Annotated[
        list[Redrivable] | None,
        typer.Option(
            "--state",
            help="FAILED or UNKNOWN (repeatable; default with no KEY: both).",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Requested at or after (ISO-8601).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Requested before (ISO-8601).")
    ] = None,
    reason: Reason = None,
    operator: OperatorName = None,
    dry_run: DryRun = False,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="Refuse to act on more deliveries than this.")
    ] = DEFAULT_LIMIT,
    dsn: Dsn = None,
) -> None:
    """Send FAILED deliveries again (new attempt, same key) and reconcile UNKNOWNs afresh.
    Selectors combine: every one given must match."""
    given = tuple(dict.fromkeys(keys or ()))
    selectors = (run_id, channel, recipient, since, until)
    if not given and states is None and all(s is None for s in selectors):
        raise UsageError(
            "redrive needs a selection",
            "give KEY..., or --run, --channel, --recipient, --state, --since/--until",
        )
    begin, end = given_time(since, "--since"), given_time(until, "--until")
    if begin is not None and end is not None and begin >= end:
        raise UsageError("--since must be before --until", "swap them, or widen the window")
    chosen = tuple(dict.fromkeys(s.value for s in states or ()))
    if not chosen and not given:
        chosen = (Redrivable.FAILED.value, Redrivable.UNKNOWN.value)
    who, why = check_operator(operator), check_reason(reason)
    selection = Selection(given, run_id, channel, recipient, chosen, begin, end)
    settings = _settings(dry_run)
    with reading(dsn or default_dsn(settings)) as store:
        _known(store, given)
        rows = selected_deliveries(store, selection, limit + 1)
        if len(rows) > limit:
            found = selected_count(store, selection)
            raise UsageError(
                f"{found} deliveries match ({selection.scope()}), more than --limit {limit}",
                "narrow the selection, or raise --limit; nothing was appended",
            )
        # Deliveries the selection would match but for their state, already CONFIRMED.
        settled = selected_count(store, selection, status="CONFIRMED") if chosen else 0
    scope = selection.scope()
    planned = [
        Planned(row, redrive_action(state_of_row(row), operator=who, reason=why, scope=scope))
        for row in rows
    ]
    if not planned and not settled:
        out.print(f"nothing to do: no delivery matches {scope}", soft_wrap=True)
        raise typer.Exit(0)
    code = _carry_out(settings, planned, dry_run=dry_run, what="redrive", settled=settled)
    raise typer.Exit(code)


def _outcome(*, delivered: bool, not_delivered: bool, abandon: bool) -> ResolveOutcome:
    flags: tuple[tuple[ResolveOutcome, bool], ...] = (
        ("delivered", delivered),
        ("not_delivered", not_delivered),
        ("abandoned", abandon),
    )
    chosen = [name for name, flag in flags if flag]
    if len(chosen) != 1:
        said = "no outcome" if not chosen else "more than one outcome"
        raise UsageError(
            f"resolve needs exactly one outcome, got {said}",
            "pass one of --delivered [--receiver-id ID], --not-delivered, --abandon",
        )
    return chosen[0]


def _settings(dry_run: bool) -> Settings:
    """The settings; unless it is a dry run, the operator key is checked before anything
    is read, so a missing key is said at once."""
    settings = Settings()
    if not dry_run:
        operator_signer_for(settings)
    return settings


def _known(store: Store, keys: Sequence[str]) -> None:
    found = known_keys(store, keys)
    missing = [k for k in keys if k not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(
            f"no delivery with key {missing[0]!r} in the projection{more}",
            "'ledger run RUN_ID' lists a run's keys; a delivery requested just now may not "
            "be projected yet",
        )


def _carry_out(
    settings: Settings, planned: list[Planned], *, dry_run: bool, what: str, settled: int = 0
) -> int:
    """Append the actions that apply (unless a dry run), print what happened; the exit
    code."""
    events = [p.action.event for p in planned if p.action.event is not None]
    if dry_run:
        _print_plan(planned, what)
    elif events:
        asyncio.run(_append(settings, events))
    _print_summary(planned, settled, dry_run=dry_run, what=what)
    return 1 if any(p.result == REFUSED for p in planned) else 0


async def _append(settings: Settings, events: list[OperatorEvent]) -> None:
    with Progress(
        TextColumn("appending"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        disable=not err.is_terminal,  # a bar is for a person watching, never for a log
    ) as bar:
        task = bar.add_task("appending", total=len(events))
        async with OperatorLog(settings) as log:
            for start in range(0, len(events), APPEND_BATCH):
                batch = events[start : start + APPEND_BATCH]
                await log.append(batch)
                bar.advance(task, len(batch))


def _print_plan(planned: list[Planned], what: str) -> None:
    """One line per delivery (whole keys, for grep and copy): what would happen to it."""
    for p in planned:
        row = p.row
        seen = (
            f"{row['status']}, run {row['run_id']}, {row['channel']} "
            f"{redacted_url(row['recipient'])}"
        )
        if p.result == REQUESTED:
            line = f"would {what}: {row['idempotency_key']} ({seen})"
        elif p.result == REFUSED:
            line = f"would refuse: {row['idempotency_key']} ({seen}): {p.action.refusal}"
        else:
            line = f"already settled: {row['idempotency_key']} ({seen})"
        out.print(line, soft_wrap=True)


def _print_summary(planned: list[Planned], settled: int, *, dry_run: bool, what: str) -> None:
    results = Counter(p.result for p in planned)
    refusals = Counter(p.action.refusal for p in planned if p.result == REFUSED)
    title = f"{what}{' (dry run: nothing appended)' if dry_run else ''}"
    table = Table("result", "deliveries", "why", title=title, title_justify="left")
    table.columns[2].overflow = "fold"
    table.add_row("would be requested" if dry_run else REQUESTED, str(results[REQUESTED]), "-")
    for refusal, count in sorted(refusals.items(), key=lambda item: (-item[1], str(item[0]))):
        table.add_row(REFUSED, str(count), refusal or "-")
    if not refusals:
        table.add_row(REFUSED, "0", "-")
    table.add_row(SETTLED, str(results[SETTLED] + settled), "final: nothing to do")
    out.print(table)
    if not dry_run and results[REQUESTED]:
        out.print(
            f"{results[REQUESTED]} {what} event(s) appended; the "
            "workers act on them, 'ledger run RUN_ID' shows the outcome",
            soft_wrap=True,
        )
