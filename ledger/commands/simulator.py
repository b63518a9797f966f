"""``ledger fake-provider``: run the receiver + provider simulator until Ctrl-C."""

from __future__ import annotations

import enum
import json
from typing import Annotated

import typer

from config.settings import Settings
from ledger.commands.serving import run_server, stop_on_signals
from ledger.simulator import FaultMix, Simulator, SimulatorConfig


class Hooks(enum.StrEnum):
    """Which webhook receivers the simulator runs."""

    KIT = "kit"
    PLAIN = "plain"


async def serve(config: SimulatorConfig, mix: FaultMix | None, as_json: bool) -> None:
    """Start the simulator, print its URLs, and serve until SIGINT/SIGTERM."""
    stop = stop_on_signals()
    async with Simulator(config) as simulator:
        simulator.receiver.faults.set_mix(mix)
        urls = simulator.urls()
        if as_json:
            print(json.dumps(urls), flush=True)
        else:
            print("fake provider listening (Ctrl-C stops it)")
            for name, url in urls.items():
                print(f"  {name + ':':<16}{url}")
            if mix is not None:
                print(f"  random faults:  {mix.model_dump_json()}", flush=True)
        await stop.wait()
    print("fake provider stopped", flush=True)


app = typer.Typer()


@app.command("fake-provider")
def fake_provider(
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Receiver/provider port (0: any free).")
    ] = 8780,
    control_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Control API port (0: any).")
    ] = 8781,
    hooks: Annotated[
        Hooks,
        typer.Option(
            help="Webhook receivers: 'kit' = receiver-kit apps (verify, dedupe on "
            "webhook-id, fencing, lookup 200/202/404), 'plain' = the simulator's own."
        ),
    ] = Hooks.PLAIN,
    dedupe: Annotated[
        bool,
        typer.Option(help="Dedupe by idempotency key (with --hooks kit: the provider only)."),
    ] = True,
    delivered_after: Annotated[
        float, typer.Option(help="Seconds a provider message stays queued (-1: forever).")
    ] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the random fault mix.")] = 0,
    timeout_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of sends delayed past timeout.")
    ] = 0,
    error_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of sends: 500 after accepting.")
    ] = 0,
    reject_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of sends rejected with 400.")
    ] = 0,
    drop_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of sends accepted, then dropped.")
    ] = 0,
    delay: Annotated[float, typer.Option(min=0, help="Seconds a delayed answer waits.")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the URLs as JSON.")] = False,
) -> None:
    """Run a webhook receiver + messaging-provider simulator on 127.0.0.1 with faults."""
    # A ValidationError here is bad input: ledger.errors reports it (exit 2).
    secret = Settings().channels.webhook_secret
    config = SimulatorConfig(
        port=port,
        control_port=control_port,
        hooks=hooks.value,
        dedupe=dedupe,
        # The secret the workers sign with, from the same setting (never argv).
        webhook_secret=secret.get_secret_value() if secret is not None else None,
        delivered_after_s=None if delivered_after < 0 else delivered_after,
    )
    shares = (timeout_pct, error_pct, reject_pct, drop_pct)
    mix = (
        FaultMix(
            seed=seed,
            timeout=timeout_pct / 100,
            error_after_accept=error_pct / 100,
            reject=reject_pct / 100,
            drop=drop_pct / 100,
            delay_s=delay,
        )
        if any(shares)
        else None
    )
    if config.webhook_secret is None:
        typer.echo(
            "warning: LEDGER_CHANNELS__WEBHOOK_SECRET is not set: every webhook is answered 401 "
            "(set it to the secret the workers sign with)",
            err=True,
        )
    run_server(serve(config, mix, as_json), "pick other ports with --port/--control-port (0: any)")
