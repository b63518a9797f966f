"""The last check before the first byte of a request leaves, and the hard total deadline.

httpx's timeouts are per phase (pool, connect, write, each read), so a receiver that
trickles its answer can hold a request open far longer than any of them, past the lease
that made the send safe. Here a request has one deadline for everything, and a guard
that runs inside httpcore at the moment the request headers are about to be written (its
``trace`` extension): the lowest point a client can hook. A guard that refuses raises
``SendRefused`` there, so provably nothing was written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# httpcore's trace events right before the request line and headers are written.
_BEFORE_FIRST_BYTE = frozenset(
    {"http11.send_request_headers.started", "http2.send_request_headers.started"}
)


class SendRefused(Exception):
    """The guard refused to write the first byte; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Returns None to allow the write, or the reason to refuse it.
Check = Callable[[], str | None]


@dataclass
class WriteGuard:
    """One request's guard: ``check`` right before the first byte; remembers whether it left."""

    check: Check | None = None
    written: bool = False
    refused: str | None = None
    _checks: int = field(default=0, repr=False)

    def before_first_byte(self) -> None:
        """Run the check; raise ``SendRefused`` instead of letting the request be written."""
        self._checks += 1
        reason = self.check() if self.check is not None else None
        if reason is not None:
            self.refused = reason
            raise SendRefused(reason)
        self.written = True

    async def trace(self, event_name: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension hook."""
        del info
        if event_name in _BEFORE_FIRST_BYTE:
            self.before_first_byte()


def unguarded() -> WriteGuard:
    """A guard that allows every write (lookups, tests); it still records ``written``."""
    return WriteGuard()
