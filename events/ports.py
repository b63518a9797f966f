"""Listening ports outside the kernel's ephemeral range.

A server we start on a port the kernel also hands out to outgoing connections can find
its port taken by some client's own socket (or take one a client is about to get). So
"any free port" (0) means a free port below the ephemeral range here, never the kernel's
pick.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default ephemeral range starts at 32768; the range read below wins when lower.
LOWEST = 20000
DEFAULT_EPHEMERAL_LOW = 32768
TRIES = 200


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; a safe default elsewhere)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now, below the ephemeral range (bounded tries)."""
    high = max(LOWEST + 1000, ephemeral_low())
    picker = random.Random()  # noqa: S311 - spreading ports, not security
    for _ in range(TRIES):
        port = picker.randrange(LOWEST, high)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port on {host} between {LOWEST} and {high} after {TRIES} tries")


def listen_port(requested: int, host: str = "127.0.0.1") -> int:
    """``requested``, or for 0 a free port outside the ephemeral range."""
    return requested if requested else free_port(host)


def listening_socket(host: str, port: int) -> socket.socket:
    """A server's socket, bound (port 0: a free one below the ephemeral range). Made with
    proto=IPPROTO_TCP, as asyncio's own servers make theirs: asyncio sets TCP_NODELAY on
    accepted connections only when the socket says it is TCP, and without it every
    keep-alive answer written in two parts (uvicorn: headers, then body) waited out the
    client's delayed ACK (~40 ms)."""
    sock = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, listen_port(port, host)))
    except OSError:
        sock.close()
        raise
    return sock


def base_url(host: str, port: int) -> str:
    """``http://host:port`` (an IPv6 address in brackets)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"
