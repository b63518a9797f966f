"""Every failure of a ``ledger`` command becomes one line and a hint on stderr, and an
exit code: 2 for bad input (arguments, options, ``LEDGER_*`` settings, files given),
1 for a runtime failure (a broker that does not answer, a port in use, a bug).

The one place that decides this: ``ledger.cli.main`` runs the typer app through
``run_app``; commands raise and never print their own errors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console
from rich.markup import escape

from events.errors import LedgerError

USAGE = 2
RUNTIME = 1
# Set to 1 to get the traceback of an unexpected error (for a bug report).
TRACEBACK_VAR = "LEDGER_TRACEBACK"
SETTINGS_HINT = "fix or unset that variable (docs/SETTINGS.md lists them)"


class UsageError(LedgerError):
    """Bad input from the person at the terminal: exit code 2, nothing was done."""

    exit_code = USAGE


def given_time(text: str | None, flag: str) -> datetime | None:
    """The time an option gives (ISO 8601; without a zone, UTC, like every time the ledger
    stores), or ``UsageError`` naming the option."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{flag} {text!r} is not an ISO-8601 time", "for example 2026-01-05T09:00:00Z"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Problem:
    """What is printed for a failure: one line, an optional hint, an exit code."""

    def __init__(self, message: str, hint: str = "", exit_code: int = RUNTIME) -> None:
        self.message = _one_line(message)
        self.hint = _one_line(hint)
        self.exit_code = exit_code


def run_app(app: Callable[..., Any]) -> int:
    """Run a typer/click app; return the exit code after printing any failure."""
    try:
        result = app(prog_name="ledger", standalone_mode=False)
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # type: ignore[attr-defined]  # the help, as typer prints it
            return exc.exit_code
        problem = problem_of(exc)
        show(problem)
        return problem.exit_code
    except Exception as exc:
        if os.environ.get(TRACEBACK_VAR) == "1":
            raise
        problem = problem_of(exc)
        show(problem)
        return problem.exit_code
    return result if isinstance(result, int) else 0


def show(problem: Problem) -> None:
    """Print ``problem`` as ``error: ...`` and ``hint: ...`` on stderr."""
    # Colour only on a terminal: rich decides from stderr itself (and honours NO_COLOR).
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    err.print(f"[bold red]error:[/] {escape(problem.message)}")
    if problem.hint:
        err.print(f"[dim]hint:[/] {escape(problem.hint)}")


def problem_of(exc: BaseException) -> Problem:
    """The one line, hint and exit code for ``exc``."""
    if isinstance(exc, typer.TyperException):
        # typer's (vendored click's) usage errors carry the command's context.
        context = getattr(exc, "ctx", None)
        if exc.exit_code == USAGE:
            where = context.command_path if context is not None else "ledger"
            return Problem(exc.format_message(), f"see '{where} --help'", USAGE)
        return Problem(exc.format_message(), "", exc.exit_code)
    if isinstance(exc, typer.Abort):
        return Problem("aborted", "", RUNTIME)
    if isinstance(exc, LedgerError):
        return Problem(exc.message, exc.hint, getattr(exc, "exit_code", RUNTIME))
    from clients.publisher import PublishRejected  # here: most commands never load the SDK

    if isinstance(exc, PublishRejected):
        return Problem(str(exc), "nothing was written; fix the input and try again", USAGE)
    if isinstance(exc, ValidationError):
        return _validation(exc)
    if isinstance(exc, SettingsError):
        return _settings_source(exc)
    if isinstance(exc, RecursionError):
        return Problem("the input nests too deeply", "flatten it (JSON nesting depth)", USAGE)
    if isinstance(exc, ValueError):
        return Problem(str(exc), "check the command's arguments and LEDGER_* settings", USAGE)
    return _runtime(exc)


def _validation(exc: ValidationError) -> Problem:
    first = exc.errors()[0]
    text = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if exc.title != "Settings":
        where = ".".join(str(part) for part in first["loc"])
        return Problem(f"{where + ': ' if where else ''}{text}{more}", "", USAGE)
    loc = first["loc"]
    if not loc:  # a rule across fields: name each field as its variable
        return Problem(f"invalid settings: {_env_names(text)}{more}", SETTINGS_HINT, USAGE)
    # A part's field is its own variable (LEDGER_WORKER__LEASE_S), the rest is inner.
    field = ".".join(str(p) for p in loc[:2]) if _is_part(str(loc[0])) else str(loc[0])
    rest = loc[2:] if "." in field else loc[1:]
    # Inner parts of a location can be URLs (webhook endpoints): only names are shown.
    inner = [str(p) for p in rest if isinstance(p, int) or str(p).isidentifier()]
    where = ": ".join([env_name(field), *inner])
    return Problem(f"{where}: {text}{more}", SETTINGS_HINT, USAGE)


def _settings_source(exc: SettingsError) -> Problem:
    # pydantic-settings says 'error parsing value for field "x" from source "..."'; for a
    # part, "x" is the part: the variable is the one under it that is not JSON.
    field = re.search(r'field "([^"]+)"', str(exc))
    name = _unparsed(field.group(1)) if field else "a LEDGER_ variable"
    return Problem(f"{name}: not valid JSON", SETTINGS_HINT, USAGE)


def _unparsed(field: str) -> str:
    if not _is_part(field):
        return env_name(field)
    part = env_name(field)
    for name, value in sorted(os.environ.items()):
        if name.upper() == part or name.upper().startswith(part + "__"):
            try:
                json.loads(value)
            except ValueError:
                if value.lstrip()[:1] in "[{" or name.upper() in _json_variables(field):
                    return name.upper()
    return f"{part}__*"


def _json_variables(part: str) -> set[str]:
    from config.settings import Settings

    model = Settings.model_fields[part].annotation
    fields = getattr(model, "model_fields", {})
    return {
        env_name(f"{part}.{name}")
        for name, info in fields.items()
        if getattr(info.annotation, "__origin__", None) in (dict, list, frozenset)
    } | {env_name(part)}


def _is_part(field: str) -> bool:
    from config.settings import Settings

    info = Settings.model_fields.get(field)
    return info is not None and hasattr(info.annotation, "model_fields")


def _runtime(exc: BaseException) -> Problem:
    from aiokafka.errors import KafkaConnectionError, KafkaError

    if isinstance(exc, KafkaConnectionError):
        return Problem(
            f"no Kafka broker answers at {_bootstrap()}", "start one with 'ledger broker start'"
        )
    if isinstance(exc, KafkaError):
        return Problem(f"Kafka refused: {exc}", "check 'ledger broker status' and the settings")
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        return Problem(f"{what}" + (f": {exc.filename}" if exc.filename else ""))
    first = str(exc).splitlines()[0] if str(exc) else ""
    return Problem(
        f"unexpected {type(exc).__name__}" + (f": {first[:200]}" if first else ""),
        f"this is a bug: rerun with {TRACEBACK_VAR}=1 and report the traceback",
    )


def env_name(field: str) -> str:
    """The environment variable that sets a ``Settings`` field (``worker.lease_s``:
    ``LEDGER_WORKER__LEASE_S``)."""
    return "LEDGER_" + field.replace(".", "__").upper()


def _env_names(text: str) -> str:
    from config.settings import Settings

    fields = set(Settings.model_fields)
    for part, info in Settings.model_fields.items():
        fields |= {f"{part}.{name}" for name in getattr(info.annotation, "model_fields", {})}
    return re.sub(
        # part.field=, or part.field[channel]=
        r"\b([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)?)(?=(?:\[[^\]]*\])?=)",
        lambda m: env_name(m.group(1)) if m.group(1) in fields else m.group(1),
        text,
    )


def _bootstrap() -> str:
    from config.settings import Settings

    try:
        return Settings().kafka.bootstrap_servers
    except Exception:  # noqa: BLE001 - a broken setting was not the problem reported
        return "the configured bootstrap servers"


def _one_line(text: str) -> str:
    return " ".join(text.split())
