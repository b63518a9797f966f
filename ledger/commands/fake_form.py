"""``ledger fake-form``: run the browser channel's target app until Ctrl-C."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ledger.commands.serving import run_server, stop_on_signals
from ledger.simulator.form import FakeForm, FakeFormConfig


async def serve(config: FakeFormConfig, as_json: bool) -> None:
    """Start the app, print its URLs, and serve until SIGINT/SIGTERM."""
    stop = stop_on_signals()
    async with FakeForm(config) as app:
        urls = {
            "form": f"{app.url}/form",
            "accepted": f"{app.url}/accepted",
            "search": f"{app.url}/search",
        }
        if as_json:
            print(json.dumps(urls), flush=True)
        else:
            print("fake form listening (Ctrl-C stops it)")
            print(f"  form:      {urls['form']}")
            print(f"  accepted:  {urls['accepted']}?key=KEY   (the lookup)")
            print(f"  search:    {urls['search']}?q=KEY   (the search-page lookup)")
            if config.login_required:
                print("  login required: the form redirects to /login", flush=True)
        await stop.wait()
    print("fake form stopped", flush=True)


app = typer.Typer()


@app.command("fake-form")
def fake_form(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free).")] = 8783,
    seed: Annotated[int, typer.Option(help="Seed of the random fault mix.")] = 0,
    slow_pct: Annotated[
        float,
        typer.Option(min=0, max=100, help="% of submissions answered only after --delay."),
    ] = 0,
    crash_pct: Annotated[
        float,
        typer.Option(
            min=0, max=100, help="% of submissions accepted, then the connection dropped."
        ),
    ] = 0,
    error_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of submissions accepted, then a 500 page.")
    ] = 0,
    reject_pct: Annotated[
        float,
        typer.Option(min=0, max=100, help="% of submissions rejected (422), not accepted."),
    ] = 0,
    delay: Annotated[
        float, typer.Option(min=0, max=300, help="Seconds a slow answer waits.")
    ] = 10.0,
    login_required: Annotated[
        bool,
        typer.Option(
            "--login-required",
            help="Redirect the form to a login page (POST /switches turns it off).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the URLs as JSON.")] = False,
) -> None:
    """Run the browser channel's target app on 127.0.0.1: a form, a confirmation page
    with an id, GET /accepted?key=K and GET /search?q=K; no dedupe, so a double submit
    shows."""
    if slow_pct + crash_pct + error_pct + reject_pct > 100:
        raise typer.BadParameter("the fault percentages add up to more than 100")
    config = FakeFormConfig(
        port=port,
        seed=seed,
        slow_share=slow_pct / 100,
        crash_share=crash_pct / 100,
        error_share=error_pct / 100,
        reject_share=reject_pct / 100,
        delay_s=delay,
        login_required=login_required,
    )
    run_server(serve(config, as_json), "pick another port with --port (0: any)")
