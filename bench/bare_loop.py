"""The bare loop: the worker's work with none of its guarantees, as the e2e baseline.

Consume ``DeliveryRequested`` records (aiokafka, one consumer group, auto-commit), POST
each payload to its recipient with httpx (signed like the webhook channel, so the same
receiver accepts it), and produce a ``DeliveryConfirmed`` for every 2xx. No state, no
claim, no lease, no fencing, no dedupe, no read-back, no lookups, no retries, no
dead letters, fire-and-forget produce with acks=1: if it crashes, work is lost or
repeated. Input is parsed with ``json.loads`` (no validation); the outcome is built with
the event model so the ledger's readers can decode it. It reads committed records
only, like the worker (the benchmark's publish time is the commit).

    python -m bench.bare_loop --bootstrap 127.0.0.1:29692 --topic T --group G
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from config.settings import Settings
from events.codec import encode
from events.delivery import DeliveryConfirmed
from events.keys import canonical_json
from streams.channels.http import create_http_client
from streams.channels.signature import signature_header, signer


async def run(args: argparse.Namespace) -> None:
    secret = (
        Settings().channels.webhook_secret
    )  # from LEDGER_CHANNELS__WEBHOOK_SECRET, as a worker's
    if secret is None:
        raise SystemExit("bare_loop: LEDGER_CHANNELS__WEBHOOK_SECRET is not set")
    signers = [signer(secret)]
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=True,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks=1, linger_ms=5)
    # The worker's own client factory: same pool, timeouts and httpcore workaround.
    client = create_http_client(
        Settings(
            channels={"send_concurrency": args.concurrency, "allowed_networks": ["127.0.0.0/8"]}
        ).channels
    )
    slots = asyncio.Semaphore(args.concurrency)
    tasks: set[asyncio.Task[None]] = set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def deliver(request: dict[str, Any]) -> None:
        try:
            body = canonical_json(request["payload"])
            ident = request["idempotency_key"]
            stamp = int(time.time())
            answer = await client.post(
                request["recipient"],
                content=body,
                headers={
                    "content-type": "application/json",
                    "webhook-id": ident,
                    "webhook-timestamp": str(stamp),
                    "webhook-signature": signature_header(signers, ident, stamp, body),
                    "idempotency-key": ident,
                },
            )
            if 200 <= answer.status_code <= 299:
                outcome = DeliveryConfirmed(
                    idempotency_key=ident,
                    run_id=request["run_id"],
                    producer="bare-loop",
                    attempt=1,
                    fencing_token=1,
                    source="send",
                    provider_message_id=answer.json().get("id"),
                    evidence=f"{answer.status_code}",
                )
                await producer.send(args.topic, encode(outcome), key=ident.encode())
        except httpx.HTTPError:
            pass  # no guarantees: the delivery is simply lost
        finally:
            slots.release()

    await consumer.start()
    await producer.start()
    print("bare loop started", flush=True)
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=500)
            for messages in batches.values():
                for message in messages:
                    record = json.loads(message.value)
                    if record.get("type") != "delivery.requested":
                        continue
                    await slots.acquire()
                    task = asyncio.create_task(deliver(record))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
    finally:
        if tasks:
            await asyncio.wait(set(tasks), timeout=5)
        with contextlib.suppress(Exception):
            await producer.stop()
        with contextlib.suppress(Exception):
            await consumer.stop()
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
