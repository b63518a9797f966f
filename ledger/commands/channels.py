"""``ledger channels``: the installed channel plugins and what each promises."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import BaseModel, SecretStr
from rich.console import Console
from rich.table import Table

from config.channels import channel_config
from config.settings import Settings
from events.channels import ChannelPlugin, installed_plugins

_LOOKUP = {"by_key": "by key", "by_provider_id": "by provider id", "none": "none"}


def _settings_fields(model: type[BaseModel] | None) -> list[dict[str, Any]]:
    if model is None:
        return []
    return [
        {"name": name, "secret": info.annotation in (SecretStr, SecretStr | None)}
        for name, info in model.model_fields.items()
    ]


def describe(plugin: ChannelPlugin, settings: Settings) -> dict[str, Any]:
    """One channel as ``--json`` prints it (never a setting's value)."""
    caps = plugin.capabilities
    rule = caps.dedupe_rule
    channel_config(plugin, settings.channels)  # a bad LEDGER_CHANNELS__SETTINGS entry says so here
    return {
        "name": plugin.name,
        "description": plugin.description,
        "key_carriers": list(caps.key_carriers),
        "lookup": str(caps.lookup),
        "first_answer": str(caps.first_answer),
        "dedupe_rule": None
        if rule is None
        else {"name": rule.name, "description": rule.description, "window_s": rule.window_s},
        "settings": _settings_fields(plugin.settings_model),
        "configured": plugin.name in settings.channels.settings,
        "settings_note": plugin.settings_note,
    }


app = typer.Typer()


@app.command("channels")
def channels(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List the installed delivery channels (entry-point group delivery_ledger.channels)
    with their capabilities: how the key travels, the lookup, what the first answer
    proves, the dedupe rule that may make a retry after UNKNOWN safe, the settings."""
    settings = Settings()
    rows = [describe(plugin, settings) for plugin in installed_plugins()]
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    table = Table()
    for column in (
        "channel",
        "key travels as",
        "lookup",
        "first answer",
        "retry after UNKNOWN w/o lookup",
        "settings",
    ):
        table.add_column(column, overflow="fold")
    for row in rows:
        rule = row["dedupe_rule"]
        fields = ", ".join(
            f["name"] + (" (secret)" if f["secret"] else "") for f in row["settings"]
        )
        table.add_row(
            row["name"],
            "\n".join(row["key_carriers"]),
            _LOOKUP[row["lookup"]],
            row["first_answer"].upper(),
            "never" if rule is None else f"dedupe rule {rule['name']}, where declared",
            " ".join(
                part
                for part in (
                    f"LEDGER_CHANNELS__SETTINGS[{row['name']}]: {fields}" if fields else "",
                    row["settings_note"],
                )
                if part
            )
            or "-",
        )
    Console().print(table)
