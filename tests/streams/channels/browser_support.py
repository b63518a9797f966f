"""Helpers for the browser channel's tests: its Chromium processes, a server the address
policy refuses (it records whatever reaches it), and reading a screenshot's colours."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import zlib
from pathlib import Path

from events.ports import free_port

# The refused server's pages are this colour, so a screenshot that shows one is plain.
MAGENTA = (255, 0, 255)
PAGE = (
    b"<!doctype html><html><body style='background:#ff00ff;margin:0'>"
    b"<h1 id='internal'>internal admin page</h1></body></html>"
)
HEAD_LIMIT = 65536


def chromium_of_this_process() -> list[int]:
    """The main Chromium processes (no ``--type=``) descended from this test process."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def ours(pid: int) -> bool:
        for _ in range(10):
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [
        pid
        for pid, command in commands.items()
        if "chromium" in command and "--type=" not in command and ours(pid)
    ]


class RefusedServer:
    """An HTTP server on an address the test's policy refuses (127.0.0.2): it records every
    connection and request line that reaches it and answers a magenta page."""

    def __init__(self, host: str = "127.0.0.2") -> None:
        self.host = host
        self.port = 0
        self.connections = 0
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        """Its origin, ``http://127.0.0.2:PORT``."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> RefusedServer:
        """Listen (a port outside the ephemeral range)."""
        self.port = free_port(self.host)
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 3)

    def seen(self) -> str:
        """What reached it, for an assertion's message."""
        return f"{self.connections} connection(s), requests {self.requests}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head.split(b"\r\n", 1)[0].decode(errors="replace")[:200])
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\n"
                b"access-control-allow-origin: *\r\nconnection: close\r\n"
                + f"content-length: {len(PAGE)}\r\n\r\n".encode()
                + PAGE
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()


def png_pixels(path: Path) -> set[tuple[int, int, int]]:
    """The distinct RGB colours of an 8-bit, non-interlaced RGB/RGBA PNG (Chromium's
    screenshots): enough to tell whether a page of one colour is in it."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    offset, idat = 8, b""
    width = height = channels = 0
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, interlace, colour in (2, 6)) == (8, 0, True), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    colours: set[tuple[int, int, int]] = set()
    for row in range(height):
        start = row * (stride + 1)
        filter_type, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if filter_type == 1:
                line[i] = (line[i] + left) & 0xFF
            elif filter_type == 2:
                line[i] = (line[i] + up) & 0xFF
            elif filter_type == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif filter_type == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + best) & 0xFF
        for i in range(0, stride, channels):
            colours.add((line[i], line[i + 1], line[i + 2]))
        previous = line
    return colours


def newest(pids: list[int]) -> int:
    """The most recently started of ``pids`` (a test's own Chromium, when an earlier test's
    is still shutting down beside it)."""
    assert pids, "no Chromium process found"

    def started(pid: int) -> int:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, in ticks

    return max(pids, key=started)
