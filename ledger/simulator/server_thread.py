"""A fake server on its own thread and event loop, with a blocking start/stop for tests.

Test code may block (``time.sleep``, a synchronous client, a subprocess wait) and the
server keeps serving, because nothing it does runs on the caller's loop. Used by the
fake provider, the fake Slack and the fake email API alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, Self, TypeVar

T = TypeVar("T")
CALL_TIMEOUT_S = 15.0


class AsyncServer(Protocol):
    """What runs on the thread: an async start (ports bound when it returns) and stop."""

    def start(self) -> Awaitable[None]:
        """Bind and serve."""
        ...

    def stop(self) -> Awaitable[None]:
        """Stop serving."""
        ...


class ServerThread:
    """Runs ``server`` on a daemon thread named ``name``; every method is thread-safe."""

    def __init__(self, server: AsyncServer, name: str) -> None:
        self.server = server
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to start() in the caller's thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.server.stop())
        self._loop.close()

    def start(self, timeout_s: float = 10.0) -> Self:
        """Start serving; returns once the ports are bound."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the {self.name} did not start in time")
        if self._error is not None:
            raise RuntimeError(f"the {self.name} failed to start: {self._error}") from self._error
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and join the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)

    def call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        return future.result(CALL_TIMEOUT_S)
