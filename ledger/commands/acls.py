"""``ledger acls show|grant ROLE USER``: the Kafka ACLs of one role (ledger/acls.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console

from config.settings import Settings
from ledger.acls import AGENT_TRANSACTIONAL_PREFIX, Acl, Role, grant, role_acls

out = Console(highlight=False)
app = typer.Typer(no_args_is_help=True, help="Kafka ACLs per role (SASL principals).")

RoleArg = Annotated[Role, typer.Argument(help="agent, worker, projector, operator, reader or api.")]
UserArg = Annotated[str, typer.Argument(help="The SASL user name (or User:NAME).")]
PrefixOpt = Annotated[
    str,
    typer.Option(help="The agents' transactional-id prefix (role agent)."),
]


def _rules(settings: Settings, role: Role, user: str, prefix: str) -> list[Acl]:
    principal = user if user.startswith("User:") else f"User:{user}"
    return role_acls(settings, role, principal, transactional_prefix=prefix)


@app.command("show")
def show(role: RoleArg, user: UserArg, prefix: PrefixOpt = AGENT_TRANSACTIONAL_PREFIX) -> None:
    """Print the ALLOW rules of ROLE for USER on the configured topics (no connection)."""
    for acl in _rules(Settings(), role, user, prefix):
        out.print(acl.describe())


@app.command("grant")
def grant_command(
    role: RoleArg, user: UserArg, prefix: PrefixOpt = AGENT_TRANSACTIONAL_PREFIX
) -> None:
    """Create those rules on the brokers (connect as a super user; idempotent)."""
    settings = Settings()
    granted = _rules(settings, role, user, prefix)
    asyncio.run(grant(settings, granted))
    out.print(f"{len(granted)} ACLs granted to {user} ({role})")
