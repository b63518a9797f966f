"""The simulator's listeners: the receiver/provider port (which can refuse) and a control port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import TracebackType
from typing import Self

from aiohttp import web

from events.ports import listen_port
from ledger.simulator.control import control_routes
from ledger.simulator.receiver import Receiver, SimulatorConfig


class Simulator:
    """A receiver + provider simulator on loopback; ``async with`` starts and stops it."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.receiver = Receiver(config or SimulatorConfig())
        self.port = 0
        self.control_port: int | None = None
        self._main: web.AppRunner | None = None
        self._control: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        # While refusing, the port stays bound (not listening: connects are refused), so no
        # other server on this machine can take it before ``resume``.
        self._held: socket.socket | None = None
        self._resume_later: asyncio.Task[None] | None = None

    @property
    def config(self) -> SimulatorConfig:
        """The current configuration."""
        return self.receiver.config

    @property
    def host(self) -> str:
        """The loopback address it listens on."""
        return self.config.host

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the receiver/provider listener."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def webhook_url(self, name: str = "default") -> str:
        """The URL of webhook endpoint ``name`` (POST /hooks/{name})."""
        return f"{self.base_url}/hooks/{name}"

    @property
    def webhook_lookup_url(self) -> str:
        """The webhook lookup base: GET {this}/{idempotency_key}."""
        return f"{self.base_url}/hooks/lookup"

    @property
    def provider_url(self) -> str:
        """The provider API's messages URL (POST to send, GET ?idempotency_key= to look up)."""
        return f"{self.base_url}/provider/messages"

    @property
    def control_url(self) -> str:
        """The control API's base URL (on the control port when there is one)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.control_port or self.port}/_control"

    @property
    def refusing(self) -> bool:
        """True while the receiver port refuses connections."""
        return self._main is not None and self._site is None

    def urls(self) -> dict[str, str]:
        """Every URL a client or an operator needs."""
        return {
            "base": self.base_url,
            "webhook": self.webhook_url("{name}"),
            "webhook_lookup": self.webhook_lookup_url,
            "provider": self.provider_url,
            "control": self.control_url,
        }

    async def start(self) -> None:
        """Bind the receiver port (and the control port) and start serving."""
        await self.receiver.start()
        main = web.Application()
        main.add_routes(self.receiver.routes())
        main.add_routes(control_routes(self.receiver, self))
        # shutdown_timeout bounds how long stop() waits for handlers still sleeping in a
        # delay fault.
        self._main = web.AppRunner(main, access_log=None, shutdown_timeout=0.5)
        await self._main.setup()
        self._site = web.TCPSite(self._main, self.host, listen_port(self.config.port, self.host))
        await self._site.start()
        self.port = int(self._main.addresses[0][1])
        if self.config.control_port is not None:
            control = web.Application()
            control.add_routes(control_routes(self.receiver, self))
            self._control = web.AppRunner(control, access_log=None, shutdown_timeout=0.5)
            await self._control.setup()
            await web.TCPSite(
                self._control, self.host, listen_port(self.config.control_port, self.host)
            ).start()
            self.control_port = int(self._control.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        self._cancel_resume()
        for runner in (self._control, self._main):
            if runner is not None:
                await runner.cleanup()
        self._main = self._control = self._site = None
        self._release_held()
        await self.receiver.stop()

    async def refuse(self, for_s: float | None = None) -> None:
        """Stop listening on the receiver port and cut its open connections (ECONNREFUSED).

        With ``for_s``, listen again after that many seconds.
        """
        self._cancel_resume()
        if self._site is not None:
            await self._site.stop()
            self._site = None
            self._held = _bound(self.host, self.port)
        server = self._main.server if self._main is not None else None
        for handler in server.connections if server is not None else []:
            # A down server also drops its keep-alive connections; otherwise a pooled client
            # would still get through.
            if handler.transport is not None:
                handler.transport.abort()
        # abort() completes on a later loop iteration; a client on this loop must not get a
        # request through first. Bounded: 200 x 5 ms.
        for _ in range(200):
            if server is None or not server.connections:
                break
            await asyncio.sleep(0.005)
        if for_s is not None:
            self._resume_later = asyncio.create_task(self._resume_after(for_s))

    async def resume(self) -> None:
        """Listen on the same receiver port again."""
        self._cancel_resume()
        await self._listen()

    async def _listen(self) -> None:
        if self._main is None or self._site is not None:
            return
        held, self._held = self._held, None
        site: web.BaseSite
        if held is not None:
            site = web.SockSite(self._main, held)  # the port it kept: listens on it again
        else:
            site = web.TCPSite(self._main, self.host, self.port, reuse_address=True)
        await site.start()
        self._site = site

    def _release_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    async def _resume_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._resume_later = None
        await self._listen()

    def _cancel_resume(self) -> None:
        task, self._resume_later = self._resume_later, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(Exception):
            await self.stop()


def _bound(host: str, port: int) -> socket.socket | None:
    """A socket bound to ``host:port`` and not listening (a connect gets ECONNREFUSED), or
    None if the port could not be kept (then ``resume`` binds it again)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock
