"""``ledger fake-slack``: run the fake Slack Web API until Ctrl-C."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from config.channels import slack_settings
from config.settings import Settings
from ledger.commands.serving import run_server, stop_on_signals
from ledger.simulator.slack import FakeSlack, FakeSlackConfig, check_channel_ids


async def serve(config: FakeSlackConfig, as_json: bool) -> None:
    """Start the fake, print its API URL, and serve until SIGINT/SIGTERM."""
    stop = stop_on_signals()
    async with FakeSlack(config) as fake:
        urls = {"api": fake.api_url}
        if as_json:
            print(json.dumps(urls), flush=True)
        else:
            print("fake Slack listening (Ctrl-C stops it)")
            print(f"  api:            {fake.api_url}   (LEDGER_CHANNELS__SETTINGS)")
            print(f"  workspaces:     {', '.join(sorted(config.tokens)) or '(none)'}")
            print(f"  conversations:  {', '.join(config.channels)}", flush=True)
        await stop.wait()
    print("fake Slack stopped", flush=True)


app = typer.Typer()


@app.command("fake-slack")
def fake_slack(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free).")] = 8782,
    channel: Annotated[
        list[str] | None,
        typer.Option(help="A conversation ID that exists in every workspace (repeatable)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random fault mix.")] = 0,
    timeout_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of posts answered only after --delay.")
    ] = 0,
    error_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of posts answered 500 after posting.")
    ] = 0,
    ratelimit_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of posts answered 429 ratelimited.")
    ] = 0,
    delay: Annotated[float, typer.Option(min=0, help="Seconds a late answer waits.")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the URL as JSON.")] = False,
) -> None:
    """Run a fake Slack Web API on 127.0.0.1 (chat.postMessage, conversations.history).

    Its workspaces and bot tokens are the workers' own: the slack entry's tokens in
    LEDGER_CHANNELS__SETTINGS.
    """
    channels = check_channel_ids(channel or ["C0LEDGER01"])  # ValueError: exit 2
    slack = slack_settings(Settings().channels)  # ConfigError: exit 2
    tokens = {ws: t.get_secret_value() for ws, t in slack.tokens.items()}
    config = FakeSlackConfig(
        port=port,
        tokens=tokens,
        channels=channels,
        seed=seed,
        timeout_share=timeout_pct / 100,
        error_share=error_pct / 100,
        ratelimit_share=ratelimit_pct / 100,
        delay_s=delay,
    )
    if not tokens:
        typer.echo(
            "warning: no slack tokens in LEDGER_CHANNELS__SETTINGS: every call is answered "
            "invalid_auth (set them to the workspaces and tokens the workers use)",
            err=True,
        )
    run_server(serve(config, as_json), "pick another port with --port (0: any)")
