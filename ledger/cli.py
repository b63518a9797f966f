"""The ``ledger`` command line: parse, call the library, print. Errors are one line + a hint.

The root app only: every command lives in a module of ``ledger/commands`` as a
module-level ``typer.Typer()`` app, added here; nothing there imports this module.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import version as package_version
from typing import Annotated

import typer
from rich.console import Console

from ledger.commands import (
    acls,
    broker,
    channels,
    dashboard,
    demo,
    fake_email_api,
    fake_form,
    fake_mail,
    fake_slack,
    keys,
    projections,
    publish,
    replay,
    simulator,
    topics,
    worker,
)
from ledger.errors import run_app

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="delivery-ledger: did the user receive exactly one correct notification?",
)
# Added without a name, an app's commands join the root's, listed in this order; the
# named groups follow them.
for commands in (
    publish.app,
    demo.app,
    channels.app,
    dashboard.app,
    fake_email_api.app,
    fake_form.app,
    fake_mail.app,
    fake_slack.app,
    keys.app,
    projections.app,
    replay.app,
    simulator.app,
    worker.app,
):
    app.add_typer(commands)
app.add_typer(broker.app, name="broker")
app.add_typer(topics.app, name="topics")
app.add_typer(acls.app, name="acls")

out = Console()


def _version(show: bool) -> None:
    if show:
        out.print(f"delivery-ledger {package_version('delivery-ledger')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """delivery-ledger: did the user receive exactly one correct notification?"""


def main() -> None:
    """Console-script entry point: every failure is one line + a hint (``ledger.errors``)."""
    # aiokafka logs every refused connection while we probe for a broker; the CLI
    # reports connection problems itself, in one line.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    sys.exit(run_app(app))
