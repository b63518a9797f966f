"""Requests signed by the official ``standardwebhooks`` library (not the ledger's signer),
and the kit served on 127.0.0.1 by real servers: aiohttp in the test's loop, uvicorn in a
thread of its own."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import uvicorn
from aiohttp import web
from standardwebhooks import Webhook

from events.contract import fencing_token_signature, lookup_headers, secret_key
from events.ports import free_port
from receiver import ReceivedWebhook, WebhookReceiver
from receiver.aiohttp_adapter import aiohttp_app, app_runner
from receiver.asgi import asgi_app
from receiver.records import LeaseTerms
from receiver.store import IdempotencyStore
from receiver.uvicorn_server import uvicorn_config

SECRET_A = "whsec_" + base64.b64encode(b"receiver-kit-tests-secret-a").decode()
SECRET_B = "whsec_" + base64.b64encode(b"receiver-kit-tests-secret-b").decode()
# The servers' header read timeout in tests: short, so a slow-header test is quick.
TEST_HEADER_TIMEOUT_S = 1.0
UNKNOWN_SECRET = "whsec_" + base64.b64encode(b"a-secret-nobody-configured").decode()


def signed_headers(
    key: str,
    body: bytes,
    *secrets: str,
    timestamp: int | None = None,
    fencing_token: int | None = None,
    sign_token: bool = True,
) -> dict[str, str]:
    """Standard Webhooks headers: one ``v1,`` signature per secret, by the official library;
    the fencing token (if any) signed per the kit's contract unless ``sign_token`` is off."""
    at = int(time.time()) if timestamp is None else timestamp
    when = datetime.fromtimestamp(at, tz=UTC)
    signatures = " ".join(Webhook(s).sign(key, when, body.decode()) for s in secrets)
    headers = {
        "content-type": "application/json",
        "webhook-id": key,
        "webhook-timestamp": str(at),
        "webhook-signature": signatures,
    }
    if fencing_token is not None:
        headers["fencing-token"] = str(fencing_token)
        if sign_token:
            keys = [secret_key(s) for s in secrets]
            headers["fencing-token-signature"] = fencing_token_signature(
                keys, key, at, fencing_token
            )
    return headers


def signed_lookup(key: str, *secrets: str, timestamp: int | None = None) -> dict[str, str]:
    """The headers of a lookup of ``key`` signed with ``secrets`` (the worker's way)."""
    at = int(time.time()) if timestamp is None else timestamp
    return lookup_headers([secret_key(s) for s in secrets], key, at)


def lease(
    *, now: float | None = None, lease_s: float = 30.0, idempotent_handler: bool = False
) -> LeaseTerms:
    """The lease terms of one admission: a holder of its own, taken ``now``."""
    at = time.time() if now is None else now
    return LeaseTerms(uuid.uuid4().hex, at, lease_s, idempotent_handler)


def body_of(payload: Any) -> bytes:
    return json.dumps(payload).encode()


class CountingHandler:
    """The user's handler: counts runs per key, may sleep (a slow handler) or raise."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.runs: Counter[str] = Counter()
        self.delay_s = delay_s
        self.fail_next: set[str] = set()
        self.seen: list[ReceivedWebhook] = []

    async def __call__(self, event: ReceivedWebhook) -> str:
        self.runs[event.webhook_id] += 1
        self.seen.append(event)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if event.webhook_id in self.fail_next:
            self.fail_next.discard(event.webhook_id)
            raise RuntimeError("the order service is down")
        return f"order-{event.webhook_id}-{self.runs[event.webhook_id]}"


def kit(handler: CountingHandler, store: IdempotencyStore, **options: Any) -> WebhookReceiver:
    options.setdefault("secrets", [SECRET_A])
    return WebhookReceiver(handler, store=store, **options)


@asynccontextmanager
async def aiohttp_server(receiver: WebhookReceiver, prefix: str = "/hooks") -> AsyncIterator[str]:
    """Serve ``receiver`` with aiohttp on 127.0.0.1; yields the base URL."""
    runner = app_runner(aiohttp_app(receiver, prefix), header_timeout_s=TEST_HEADER_TIMEOUT_S)
    await runner.setup()
    port = free_port()
    # A backlog for 1,000 connections opened at once (the default 128 drops SYNs).
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=2048)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class UvicornServer:
    """``asgi_app(receiver)`` under uvicorn on 127.0.0.1, in its own thread and loop."""

    def __init__(self, receiver: WebhookReceiver, prefix: str = "/hooks") -> None:
        self.port = free_port()
        config = uvicorn_config(
            asgi_app(receiver, prefix),
            host="127.0.0.1",
            port=self.port,
            header_timeout_s=TEST_HEADER_TIMEOUT_S,
            lifespan="on",
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornServer:
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise AssertionError("uvicorn did not start within 10 s")

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
