"""One aiohttp app served on loopback: what every fake (Slack, email API, form) runs on."""

from __future__ import annotations

from aiohttp import web

from events.ports import listen_port


class AppServer:
    """Serves one ``web.Application``; ``serve`` binds and returns the port, ``stop`` ends it."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None

    async def serve(self, app: web.Application, host: str, port: int) -> int:
        """Bind ``host:port`` (0: a free port outside the ephemeral range) and serve ``app``."""
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, listen_port(port, host)).start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop serving (nothing to do if it never started)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
