"""The API's limits: request bodies by size (before they are read whole), and requests per
key by rate (a token bucket per key, per process: N processes allow N times the rate)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class RateLimiter:
    """``rate`` requests per second per key, ``burst`` at once."""

    rate: float
    burst: int
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def wait_s(self, key: str, now: float) -> float:
        """0 if the key may make a request now (one token taken), else how long until
        it may."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate


def retry_after(wait_s: float) -> str:
    """A ``Retry-After`` value (whole seconds, at least 1)."""
    return str(max(1, math.ceil(wait_s)))


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is answered 413 before it is read
    whole (by its Content-Length, or as it streams in)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = 0
                if length > self.limit:
                    await self._refuse(send)
                    return
        seen = 0

        async def counting() -> Message:
            # FastAPI turns any other failure while reading a body into a 400; an
            # HTTPException passes through to the API's handler (api/errors.py).
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, detail=self._too_large)
            return message

        await self.app(scope, counting, send)

    @property
    def _too_large(self) -> str:
        return f"the request body is over the limit of {self.limit} bytes"

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": self._too_large,
                "field": "body",
                "hint": "send fewer or smaller deliveries (LEDGER_API__MAX_BODY_BYTES)",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
