"""The ``ledger`` command line: parse, call the library, print. Errors are one line + a hint.

The root app only: every command lives in a module of ``ledger/commands`` as a
module-level ``typer.Typer()`` app; nothing there imports this module. The root knows
each command by name and imports its module when the command is used (``COMMANDS``):
``ledger worker`` loads no dashboard and ``ledger status`` no Kafka admin client — each
module's imports cost up to a second of CPU at every start of the CLI.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import warnings
from importlib.metadata import version as package_version
from typing import Annotated, TextIO

import typer
from rich.console import Console
from typer._click import Command, Context  # typer's own click (vendored since 0.20)
from typer.core import TyperGroup

from ledger.errors import run_app

# Each root command -> (its module in ledger/commands, whether the module's app is added
# whole under that name, as a group). Listed in the order ``ledger --help`` shows them.
COMMANDS: dict[str, tuple[str, bool]] = {
    "publish": ("publish", False),
    "demo": ("demo", False),
    "channels": ("channels", False),
    "dashboard": ("dashboard", False),
    "api": ("api", False),
    "mcp": ("mcp", False),
    "api-keys": ("api_keys", True),
    "fake-email-api": ("fake_email_api", False),
    "fake-form": ("fake_form", False),
    "fake-mail": ("fake_mail", False),
    "fake-slack": ("fake_slack", False),
    "init": ("keys", False),
    "outcome-keys": ("keys", False),
    "project": ("projections", False),
    "rebuild": ("projections", False),
    "verify": ("projections", False),
    "status": ("projections", False),
    "run": ("projections", False),
    "resolve": ("operate", False),
    "redrive": ("operate", False),
    "budgets": ("budgets", True),
    "replay": ("replay", False),
    "schema": ("schema", False),
    "fake-provider": ("simulator", False),
    "worker": ("worker", False),
    "broker": ("broker", True),
    "topics": ("topics", True),
    "acls": ("acls", True),
    "endpoints": ("endpoints", True),
}


def module_commands(module: str, name: str | None = None) -> TyperGroup:
    """The commands of one module's app as the root would add them: its commands at the
    root (``name`` None), or the whole app as the group ``name``."""
    holder = typer.Typer(add_completion=False)
    holder.callback()(lambda: None)  # a group even around a single command
    holder.add_typer(importlib.import_module(f"ledger.commands.{module}").app, name=name)
    group = typer.main.get_command(holder)
    assert isinstance(group, TyperGroup)
    return group


class LazyCommands(TyperGroup):
    """The root group: a command's module is imported when the command is looked up."""

    def list_commands(self, ctx: Context) -> list[str]:
        return [*super().list_commands(ctx), *COMMANDS]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in COMMANDS:
            return found
        module, whole = COMMANDS[cmd_name]
        return module_commands(module, cmd_name if whole else None).get_command(ctx, cmd_name)


app = typer.Typer(
    cls=LazyCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="delivery-ledger: did the user receive exactly one correct notification?",
)

out = Console()


def _version(show: bool) -> None:
    if show:
        out.print(f"delivery-ledger {package_version('delivery-ledger')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """delivery-ledger: did the user receive exactly one correct notification?"""
    # Traces, for every command, as the OTEL_* variables say (clients/tracing.py); a
    # process without any of them loads nothing of OpenTelemetry here.
    if any(name.startswith("OTEL_") for name in os.environ):
        from clients.tracing import configure_tracing

        configure_tracing(f"delivery-ledger-{ctx.invoked_subcommand or 'cli'}")


_SHOW_WARNING = warnings.showwarning
_RENAMED = r"LEDGER_\w+ is deprecated"


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    # A renamed setting is one line for the operator, not a source location of ours.
    if issubclass(category, DeprecationWarning) and re.match(_RENAMED, str(message)):
        print(f"warning: {message}", file=sys.stderr)
        return
    _SHOW_WARNING(message, category, filename, lineno, file, line)


def main() -> None:
    """Console-script entry point: every failure is one line + a hint (``ledger.errors``)."""
    # aiokafka logs every refused connection while we probe for a broker; the CLI
    # reports connection problems itself, in one line.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # An old flat LEDGER_* name still works; the operator sees, once, what to rename it to
    # (a DeprecationWarning is hidden by default outside __main__).
    # By message, not by class: importing config.legacy here would load pydantic-settings
    # for every `--help` (config.legacy.DeprecatedSettingWarning is a DeprecationWarning).
    warnings.filterwarnings("default", message=_RENAMED, category=DeprecationWarning)
    warnings.showwarning = _show_warning
    sys.exit(run_app(app))
