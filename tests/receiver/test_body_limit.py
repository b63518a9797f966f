"""An oversized POST is refused 413 while it arrives, by both adapters, never buffered whole.

The request is written over a raw socket: a declared 128 MiB body (refused on its
Content-Length) and a chunked one with no length (refused once the bytes read pass the
limit). The client writes at most 4 MiB; a server that waits for the whole body before
answering never answers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from receiver import SqliteStore
from receiver.kit import MAX_BODY_BYTES
from tests.receiver.conftest import Serve
from tests.receiver.support import SECRET_A, CountingHandler, kit, signed_headers

CHUNK = 64 * 1024
MOST_SENT = 4 * 1024 * 1024  # bounded: the old ASGI adapter would read all of it and wait


async def post_until_answered(url: str, *, chunked: bool) -> tuple[bytes, int]:
    """Write a huge signed POST until the server answers; the answer's first bytes, bytes sent."""
    parts = urlsplit(url)
    headers = signed_headers("big", b"{}", SECRET_A)
    if chunked:
        headers["transfer-encoding"] = "chunked"
    else:
        headers["content-length"] = str(128 * 1024 * 1024)
    head = f"POST /hooks/big HTTP/1.1\r\nhost: {parts.netloc}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    sent = 0
    try:
        writer.write(head.encode() + b"\r\n")
        answer = asyncio.create_task(reader.read(4096))
        piece = b"x" * CHUNK
        if chunked:
            piece = f"{CHUNK:x}\r\n".encode() + piece + b"\r\n"
        while sent < MOST_SENT and not answer.done():
            try:
                writer.write(piece)
                await asyncio.wait_for(writer.drain(), 5)
            except (ConnectionError, TimeoutError):
                break  # the server stopped reading or closed: look at its answer
            sent += CHUNK
            await asyncio.sleep(0)
        try:
            first = await asyncio.wait_for(answer, 10)
        except TimeoutError:
            pytest.fail(f"no answer within 10 s after {sent} body bytes were written")
        return first, sent
    finally:
        writer.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_oversized_post_is_refused_413_before_it_is_read_whole(
    serve: Serve, tmp_path: Path, chunked: bool
) -> None:
    handler = CountingHandler()
    async with serve(kit(handler, SqliteStore(tmp_path / "r.db"))) as url:
        for _ in range(3):
            try:
                first, sent = await post_until_answered(url, chunked=chunked)
                break
            except ConnectionResetError:
                # The server answered and closed while we still wrote: its RST can reach
                # us before our loop read the answer (seen once on a loaded machine). The
                # attempt shows nothing either way; another one is made.
                continue
        else:
            pytest.fail("three attempts in a row were reset before their answer was read")
    # The body never ended (128 MiB declared, or a chunked body with no last chunk): an
    # answer at all means the server did not wait to buffer it whole.
    assert first.startswith(b"HTTP/1.1 413"), first[:200]
    assert sent > MAX_BODY_BYTES or not chunked
    assert not handler.runs
