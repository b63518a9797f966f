"""The simulator's control API: arm faults, read what it saw, reset, refuse connections."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, Protocol

from aiohttp import web
from pydantic import ValidationError

from ledger.simulator.faults import Fault, FaultMix
from ledger.simulator.receiver import Receiver


class Listener(Protocol):
    """What the control API needs from the server: the listening socket's lifecycle."""

    @property
    def refusing(self) -> bool: ...

    def urls(self) -> dict[str, str]: ...

    async def refuse(self, for_s: float | None = None) -> None: ...

    async def resume(self) -> None: ...


def state(receiver: Receiver, listener: Listener, *, with_requests: bool = True) -> dict[str, Any]:
    """Everything observable, as JSON-able data."""
    requests, events = receiver.recorder.snapshot()
    return {
        "urls": listener.urls(),
        "refusing": listener.refusing,
        "config": receiver.config.model_dump(
            mode="json", exclude={"webhook_secret", "hook_secrets"}
        ),
        "faults": receiver.faults.describe(),
        "events": {
            key: {**asdict(event), "status": receiver.provider_status(event)}
            for key, event in events.items()
        },
        "requests": [asdict(r) for r in requests] if with_requests else None,
        "request_count": len(requests),
    }


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise web.HTTPBadRequest(text="body is not JSON") from None


def control_routes(receiver: Receiver, listener: Listener) -> list[web.RouteDef]:
    """POST /_control/{faults,mix,config,reset,refuse,resume}, GET /_control/state."""

    def guarded(
        work: Callable[[Any], Awaitable[Any]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                answer = await work(await _json_body(request))
            except (ValidationError, TypeError, ValueError) as exc:
                return web.json_response({"error": str(exc).splitlines()[0]}, status=400)
            return web.json_response(answer if answer is not None else {"ok": True})

        return handle

    async def faults(body: Any) -> Any:
        items = body if isinstance(body, list) else [body]
        armed = [Fault.model_validate(item) for item in items]
        for fault in armed:
            receiver.faults.add(fault)
        return receiver.faults.describe()

    async def mix(body: Any) -> Any:
        receiver.faults.set_mix(FaultMix.model_validate(body) if body else None)
        return receiver.faults.describe()

    async def config(body: Any) -> Any:
        allowed = {"dedupe", "delivered_after_s", "timestamp_tolerance_s"}
        if not isinstance(body, dict) or not set(body) <= allowed:
            raise ValueError(f"config accepts only {sorted(allowed)}")
        receiver.config = receiver.config.model_validate({**receiver.config.model_dump(), **body})
        return receiver.config.model_dump(mode="json", exclude={"webhook_secret", "hook_secrets"})

    async def reset(_body: Any) -> Any:
        await receiver.reset()
        await listener.resume()
        return None

    async def refuse(body: Any) -> Any:
        for_s = body.get("for_s") if isinstance(body, dict) else None
        if for_s is not None and not 0 < float(for_s) <= 600:
            raise ValueError("for_s must be in (0, 600]")
        await listener.refuse(None if for_s is None else float(for_s))
        return {"refusing": True}

    async def resume(_body: Any) -> Any:
        await listener.resume()
        return {"refusing": False}

    async def show(request: web.Request) -> web.StreamResponse:
        with_requests = request.query.get("requests", "1") not in ("0", "false")
        return web.json_response(state(receiver, listener, with_requests=with_requests))

    return [
        web.get("/_control/state", show),
        web.post("/_control/faults", guarded(faults)),
        web.post("/_control/mix", guarded(mix)),
        web.post("/_control/config", guarded(config)),
        web.post("/_control/reset", guarded(reset)),
        web.post("/_control/refuse", guarded(refuse)),
        web.post("/_control/resume", guarded(resume)),
    ]
