"""The tracing test's other processes, each configured by OTEL_* like any of ours.

``python -m tests.streams.tracing_apps agent``: an agent that opens its own span
``agent.run`` per run in $TRACE_RUNS (JSON: run id, recipient, payload) and publishes the
run inside it; prints one JSON line per run (its key and trace id).

``python -m tests.streams.tracing_apps receiver``: a receiver-kit app on 127.0.0.1:$PORT
(prefix ``/hooks``, SQLite store $RECEIVER_DB, secret $WEBHOOK_SECRET) whose handler sleeps
``sleep_s`` of the payload.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from clients.tracing import configure_tracing, shutdown_tracing, tracer


def agent() -> None:
    """Publish each run of $TRACE_RUNS under an ``agent.run`` span of its own."""
    from clients import DeliverySpec, Publisher
    from config.settings import Settings

    configure_tracing("test-agent")
    runs = json.loads(os.environ["TRACE_RUNS"])

    async def publish() -> None:
        async with Publisher(Settings(), producer_name="test-agent") as publisher:
            for run in runs:
                spec = DeliverySpec(
                    channel="webhook", recipient=run["recipient"], payload=run["payload"]
                )
                with tracer().start_as_current_span("agent.run") as span:
                    requests = await publisher.run_succeeded(run["run_id"], "sha256:r", [spec])
                trace_id = f"{span.get_span_context().trace_id:032x}"
                key = requests[0].idempotency_key
                print(json.dumps({"run_id": run["run_id"], "key": key, "trace_id": trace_id}))

    asyncio.run(publish())
    shutdown_tracing()


def receiver() -> None:
    """Serve the kit until terminated."""
    import uvicorn

    from receiver import ReceivedWebhook, SqliteStore, WebhookReceiver
    from receiver.asgi import asgi_app
    from receiver.uvicorn_server import uvicorn_config

    configure_tracing("test-receiver")

    async def handler(event: ReceivedWebhook) -> str:
        await asyncio.sleep(float(event.payload.get("sleep_s", 0)))
        return f"made-{event.webhook_id[:12]}"

    kit = WebhookReceiver(
        handler,
        secrets=[os.environ["WEBHOOK_SECRET"]],
        store=SqliteStore(os.environ["RECEIVER_DB"]),
    )
    config = uvicorn_config(
        asgi_app(kit, "/hooks"), host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning"
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    {"agent": agent, "receiver": receiver}[sys.argv[1]]()
