"""The kit's servers close connections that dribble their request head (slowloris).

50 raw sockets each send a request line and then one header line every 0.2 s, forever;
half of them first make a complete request, so the dribbled head is a keep-alive
connection's second request. Every one must be closed within the header timeout (plus a
margin), while a handler slower than the timeout still answers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from receiver import SqliteStore
from tests.receiver.conftest import Serve
from tests.receiver.support import (
    SECRET_A,
    TEST_HEADER_TIMEOUT_S,
    CountingHandler,
    body_of,
    kit,
    signed_headers,
)

CONNECTIONS = 50
MARGIN_S = 3.0


async def complete_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One whole GET on the connection, its answer read to the end (keep-alive)."""
    writer.write(b"GET /hooks/lookup/k HTTP/1.1\r\nhost: kit\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await asyncio.wait_for(reader.readexactly(length), 10)


async def test_slow_headers_are_closed_within_the_header_timeout(
    serve: Serve, tmp_path: Path
) -> None:
    handler = CountingHandler(delay_s=TEST_HEADER_TIMEOUT_S + 0.5)
    body = body_of({"order": 1})
    async with serve(kit(handler, SqliteStore(tmp_path / "r.db"))) as url:
        parts = urlsplit(url)
        sockets = []
        for n in range(CONNECTIONS):
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            if n % 2:
                await complete_request(reader, writer)
            writer.write(b"POST /hooks/slow HTTP/1.1\r\nhost: kit\r\n")
            sockets.append((reader, writer))
        started = time.monotonic()
        closed_after: dict[int, float] = {}
        while len(closed_after) < CONNECTIONS:
            if time.monotonic() - started > TEST_HEADER_TIMEOUT_S + MARGIN_S:
                break
            for n, (reader, writer) in enumerate(sockets):
                if n in closed_after:
                    continue
                try:
                    writer.write(b"x-slow: 1\r\n")
                    await writer.drain()
                except ConnectionError:
                    closed_after[n] = time.monotonic() - started
                    continue
                if reader.at_eof() or reader.exception() is not None:
                    closed_after[n] = time.monotonic() - started
            await asyncio.sleep(0.2)
        for _, writer in sockets:
            writer.close()
        # The server still serves, and a handler slower than the header timeout finishes.
        async with httpx.AsyncClient(timeout=10) as client:
            slow = await client.post(
                f"{url}/hooks", content=body, headers=signed_headers("k1", body, SECRET_A)
            )
    still_open = CONNECTIONS - len(closed_after)
    assert still_open == 0, (
        f"{still_open} of {CONNECTIONS} slow-header connections still open "
        f"{TEST_HEADER_TIMEOUT_S + MARGIN_S:.0f}s after they started (header timeout "
        f"{TEST_HEADER_TIMEOUT_S}s)"
    )
    assert max(closed_after.values()) <= TEST_HEADER_TIMEOUT_S + MARGIN_S
    assert slow.status_code == 200
