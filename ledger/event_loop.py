"""Which asyncio event loop the ledger's own processes run on (``LEDGER_EVENT_LOOP``).

``asyncio`` is the standard library's loop; ``uvloop`` is libuv's (the extra
``delivery-ledger[uvloop]``); ``auto`` takes uvloop when it is installed. The worker
(faust, on mode's loop) and the CLI's publishing commands follow the setting; the
Publisher SDK inside an agent runs on whatever loop the agent runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from config.settings import Settings
from events.errors import ConfigError

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def chosen(settings: Settings) -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop ``settings.event_loop`` names here."""
    available = importlib.util.find_spec("uvloop") is not None
    if settings.event_loop == "uvloop" and not available:
        raise ConfigError(
            "LEDGER_EVENT_LOOP=uvloop but uvloop is not installed",
            "pip install 'delivery-ledger[uvloop]', or set LEDGER_EVENT_LOOP=asyncio",
        )
    if settings.event_loop == "auto":
        return "uvloop" if available else "asyncio"
    return settings.event_loop


def loop_factory(settings: Settings) -> LoopFactory | None:
    """The factory of the chosen loop for ``asyncio.Runner`` (None: asyncio's default)."""
    if chosen(settings) != "uvloop":
        return None
    import uvloop

    return uvloop.new_event_loop


def install(settings: Settings) -> str:
    """Make the chosen loop the one new loops are (for faust/mode, which create their own
    through the policy); returns its name. Call before the app is built."""
    name = chosen(settings)
    if name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return name


def run(main: Coroutine[Any, Any, T], settings: Settings) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        return runner.run(main)
