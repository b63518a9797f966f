"""The receiver alone: how many signed webhooks per second the verifying receiver takes
on this machine, and its CPU per request. That is the ceiling of any sender here.

The load generator is as cheap as it can be, so that it takes as little of the shared
CPUs as possible: every request is built and signed (``standardwebhooks``' own
``Webhook.sign``) before the clock starts, then C keep-alive connections (asyncio streams,
no HTTP client library) write the ready bytes and read each response by its
``content-length``, one request in flight per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from standardwebhooks.webhooks import Webhook

from bench.common import cpu_seconds
from events.keys import canonical_json


def signed_requests(base: str, secret: str, count: int, tag: str) -> list[bytes]:
    """``count`` ready-to-write POSTs to ``base``/hooks/load, each signed for its own id."""
    webhook = Webhook(secret)
    host = urlsplit(base).netloc
    now = datetime.now(UTC)
    stamp = str(int(now.timestamp()))
    out = []
    for i in range(count):
        ident = f"load-{tag}-{i}"
        body = canonical_json({"run": i, "text": "report ready"})
        signature = webhook.sign(ident, now, body.decode())
        head = (
            f"POST /hooks/load HTTP/1.1\r\nhost: {host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"webhook-id: {ident}\r\nwebhook-timestamp: {stamp}\r\n"
            f"webhook-signature: {signature}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


async def _connection(
    host: str, port: int, requests: list[bytes], next_index: list[int], statuses: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while next_index[0] < len(requests):
            index = next_index[0]
            next_index[0] += 1
            writer.write(requests[index])
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            statuses.append(int(head.split(b" ", 2)[1]))
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def load_round(
    base: str,
    receiver_pid: int,
    secret: str,
    count: int,
    concurrency: int,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Post ``count`` signed requests over ``concurrency`` connections; requests/s, the
    receiver's and the generator's CPU ms per request, and how many were not 200."""
    requests = signed_requests(base, secret, count, uuid.uuid4().hex[:8])
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    next_index: list[int] = [0]
    statuses: list[int] = []
    receiver_before, self_before = cpu_seconds(receiver_pid), cpu_seconds(os.getpid())
    began = time.perf_counter()
    async with asyncio.timeout(timeout_s):
        await asyncio.gather(
            *(_connection(host, port, requests, next_index, statuses) for _ in range(concurrency))
        )
    seconds = time.perf_counter() - began
    receiver_cpu = cpu_seconds(receiver_pid) - receiver_before
    self_cpu = cpu_seconds(os.getpid()) - self_before
    return {
        "requests": count,
        "requests_per_s": count / seconds,
        "receiver_cpu_ms_per_request": receiver_cpu * 1000 / count,
        "generator_cpu_ms_per_request": self_cpu * 1000 / count,
        "not_ok": sum(1 for s in statuses if s != 200),
        "answered": len(statuses),
    }
