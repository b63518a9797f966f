"""``ledger publish``: a run's RunSucceeded and its deliveries, atomically: in one Kafka
transaction, or one record the workers fan out (``LEDGER_PUBLISHER__MODE=record``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from clients.publisher import DeliverySpec, Publisher, parse_payload
from config.settings import Settings
from ledger import event_loop

out = Console()
app = typer.Typer()


@app.command("publish")
def publish(
    run_id: Annotated[str, typer.Argument(help="The agent run id.")],
    result_hash: Annotated[str, typer.Option("--result-hash", help="Hash of the run's result.")],
    delivery: Annotated[
        list[str], typer.Option("--delivery", "-d", help="CHANNEL:RECIPIENT, repeatable.")
    ],
    payload: Annotated[str, typer.Option(help="JSON payload, or @file.")] = "{}",
) -> None:
    """Publish RunSucceeded and its deliveries atomically (LEDGER_PUBLISHER__MODE)."""
    settings = Settings()
    value = parse_payload(payload)
    specs = [DeliverySpec.parse(spec, value) for spec in delivery]
    # Every check before the first connection: bad input never reaches the broker.
    Publisher(settings).check_run_succeeded(run_id, result_hash, specs)

    async def go() -> list[Any]:
        async with Publisher(settings) as publisher:
            return await publisher.run_succeeded(run_id, result_hash, specs)

    requests = event_loop.run(go(), settings)
    if settings.publisher.mode == "record":
        out.print(
            f"run {run_id}: RunSucceeded carrying {len(requests)} deliveries written "
            "(the workers fan them out)"
        )
    else:
        out.print(f"run {run_id}: RunSucceeded + {len(requests)} DeliveryRequested committed")
    for request in requests:
        out.print(f"  {request.channel}:{request.recipient} key {request.idempotency_key}")
