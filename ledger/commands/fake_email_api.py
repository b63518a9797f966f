"""``ledger fake-email-api``: run the fake HTTP email API until Ctrl-C."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from config.channels import channel_config
from config.settings import Settings
from events.channels import channel_plugin
from events.channels.email_api import EmailApiSettings
from ledger.commands.serving import run_server, stop_on_signals
from ledger.simulator.email_api import FakeEmailApi, FakeEmailApiConfig


async def serve(config: FakeEmailApiConfig, as_json: bool) -> None:
    """Start the fake, print its API URL, and serve until SIGINT/SIGTERM."""
    stop = stop_on_signals()
    async with FakeEmailApi(config) as fake:
        if as_json:
            print(json.dumps({"api": fake.api_url}), flush=True)
        else:
            print("fake email API listening (Ctrl-C stops it)")
            print(f"  api:     {fake.api_url}   (LEDGER_CHANNELS__SETTINGS[email_api].api_url)")
            print(f"  dedupe:  {'on' if config.dedupe else 'off'}")
            print(f"  lookup by key: {'on' if config.lookup_by_key else 'off'}", flush=True)
        await stop.wait()
    print("fake email API stopped", flush=True)


app = typer.Typer()


@app.command("fake-email-api")
def fake_email_api(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free).")] = 8783,
    deliver_after: Annotated[
        float, typer.Option(min=0, max=86400, help="Seconds until a message is delivered.")
    ] = 1.0,
    dedupe: Annotated[
        bool, typer.Option(help="Honour Idempotency-Key (off: a repeat is a second email).")
    ] = False,
    lookup_by_key: Annotated[
        bool, typer.Option(help="Offer GET /emails?idempotency_key=K.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the URL as JSON.")] = False,
) -> None:
    """Run a fake HTTP email API on 127.0.0.1 (POST /emails, GET /emails/{id}, by key).

    Its API key is the workers' own: LEDGER_CHANNELS__SETTINGS[email_api].api_key.
    """
    config = channel_config(channel_plugin("email_api"), Settings().channels)  # ConfigError: exit
    keys = []
    if isinstance(config, EmailApiSettings) and config.api_key is not None:
        keys.append(config.api_key.get_secret_value())
    else:
        typer.echo(
            "warning: LEDGER_CHANNELS__SETTINGS has no email_api api_key: every call is "
            "answered 401 (set it to what the workers use)",
            err=True,
        )
    fake_config = FakeEmailApiConfig(
        port=port,
        api_keys=keys,
        deliver_after_s=deliver_after,
        dedupe=dedupe,
        lookup_by_key=lookup_by_key,
    )
    run_server(serve(fake_config, as_json), "pick another port with --port (0: any)")
