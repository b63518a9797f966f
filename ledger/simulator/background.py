"""The simulator in its own thread and event loop, with a blocking API for tests and benches.

Test code may block (``time.sleep``, a synchronous client, a subprocess wait) and the
simulator keeps serving, because nothing it does runs on the caller's loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any, Self, TypeVar

from config.settings import Settings, WebhookEndpoint, changed
from ledger.simulator.control import state
from ledger.simulator.faults import Fault, FaultKind, FaultMix
from ledger.simulator.receiver import SimulatorConfig
from ledger.simulator.records import AcceptedEvent, RequestRecord
from ledger.simulator.server import Simulator
from ledger.simulator.server_thread import ServerThread

T = TypeVar("T")


class BackgroundSimulator:
    """A started ``Simulator`` on a daemon thread; every method is safe from any thread."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.simulator = Simulator(config)
        self._thread = ServerThread(self.simulator, "fake-provider")

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> Self:
        """Start serving; returns once the ports are bound."""
        self._thread.start(timeout_s)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and join the thread."""
        self._thread.stop(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return self._thread.call(make)

    # -- addresses ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The receiver/provider port."""
        return self.simulator.port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return self.simulator.base_url

    def webhook_url(self, name: str = "default") -> str:
        """POST target of webhook endpoint ``name``."""
        return self.simulator.webhook_url(name)

    @property
    def webhook_lookup_url(self) -> str:
        """Lookup base for webhooks: GET {this}/{key}."""
        return self.simulator.webhook_lookup_url

    @property
    def provider_url(self) -> str:
        """The provider's messages URL."""
        return self.simulator.provider_url

    @property
    def control_url(self) -> str:
        """The control API's base URL."""
        return self.simulator.control_url

    def settings(
        self,
        base: Settings | None = None,
        *,
        lookup: bool = True,
        receiver_dedupes: bool = False,
        settle_s: float | None = None,
    ) -> Settings:
        """``base`` with this receiver's webhook endpoints configured: lookup URL (or none),
        and what the endpoint declares (dedupe on webhook-id, its settle window)."""
        base = base or Settings()
        endpoints = dict(base.channels.webhook_endpoints)
        endpoints[f"{self.base_url}/hooks/"] = WebhookEndpoint(
            lookup_url=self.webhook_lookup_url if lookup else None,
            receiver_dedupes=receiver_dedupes,
            settle_s=settle_s,
        )
        return changed(base, {"channels.webhook_endpoints": endpoints})

    # -- faults and behaviour -----------------------------------------------------------------

    def add_fault(self, fault: Fault) -> Fault:
        """Arm a targeted fault."""
        self.simulator.receiver.faults.add(fault)
        return fault

    def fault(self, kind: FaultKind | str, **fields: Any) -> Fault:
        """Arm a targeted fault from keyword fields (count, key, path, status, delay_s, ...)."""
        return self.add_fault(Fault(kind=FaultKind(kind), **fields))

    def set_mix(self, mix: FaultMix | None) -> None:
        """Turn the random fault mix on (or off with None)."""
        self.simulator.receiver.faults.set_mix(mix)

    def configure(self, **changes: Any) -> SimulatorConfig:
        """Change behaviour at run time: dedupe, delivered_after_s, timestamp_tolerance_s."""
        receiver = self.simulator.receiver
        receiver.config = receiver.config.model_validate(
            {**receiver.config.model_dump(), **changes}
        )
        return receiver.config

    def refuse(self, for_s: float | None = None) -> None:
        """Stop listening (connects get ECONNREFUSED) and cut open connections."""
        self._call(lambda: self.simulator.refuse(for_s))

    def resume(self) -> None:
        """Listen on the same port again."""
        self._call(self.simulator.resume)

    def reset(self) -> None:
        """Disarm faults, forget everything seen, listen again."""
        self._call(self.simulator.receiver.reset)
        self.resume()

    # -- observations -------------------------------------------------------------------------

    def event(self, key: str) -> AcceptedEvent | None:
        """The logical event accepted under ``key`` (None if never accepted)."""
        return self.simulator.receiver.recorder.event(key)

    def accepted(self, key: str) -> int:
        """How many times ``key`` was processed as new (exactly once is the goal)."""
        event = self.event(key)
        return event.accepted if event else 0

    def events(self) -> dict[str, AcceptedEvent]:
        """Every accepted logical event, by key."""
        return self.simulator.receiver.recorder.snapshot()[1]

    def requests(
        self, *, key: str | None = None, path: str | None = None, method: str | None = None
    ) -> list[RequestRecord]:
        """The request log, optionally filtered by key, path prefix and method."""
        return [
            r
            for r in self.simulator.receiver.recorder.snapshot()[0]
            if (key is None or r.key == key)
            and (path is None or r.path.startswith(path))
            and (method is None or r.method == method.upper())
        ]

    def state(self) -> dict[str, Any]:
        """The same JSON document as GET /_control/state."""
        return state(self.simulator.receiver, self.simulator)

    def max_concurrent(self, key: str) -> int:
        """The most POSTs for ``key`` that were open at the same moment (1 is right)."""
        return self.simulator.receiver.recorder.max_concurrent(key)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        """Poll ``predicate`` every 20 ms until it holds or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()
