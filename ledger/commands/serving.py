"""What every fake server command shares: serve until SIGINT/SIGTERM, and one line (with
the option to change) for a port it cannot listen on."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

from events.errors import LedgerError


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call inside the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run_server(serving: Coroutine[Any, Any, None], ports_hint: str) -> None:
    """Run ``serving`` to its end; a port it cannot take is one line and ``ports_hint``."""
    try:
        asyncio.run(serving)
    except OSError as exc:
        raise LedgerError(f"cannot listen: {exc.strerror or exc}", ports_hint) from None


async def serve_together(stop: asyncio.Event, *servers: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run ``servers`` (each serving until ``stop`` is set) until all have ended, and
    return what each returned; the first that fails sets ``stop`` for the others, and its
    error is raised once they have stopped."""
    tasks = [asyncio.create_task(server) for server in servers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        stop.set()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in ended:
        if isinstance(outcome, BaseException):
            raise outcome
    return ended
