"""Gates: what may hold a delivery back before its claim (events/waiting.py).

Before the worker claims a PENDING delivery (a new one, or one whose retry is due) it asks
its gate. A gate that holds answers when to look again and, for the holds an operator must
see (a paused, disabled or open-circuit endpoint, an agent over budget), the reason the
worker records with ``DeliveryHeld``; a rate limit holds without a reason (a delivery
waiting for its endpoint's next token is an ordinary PENDING). A held delivery is never
claimed, so it makes no attempt and is never failed for waiting; when the gate lets it go,
its claim is the next thing that happens to it, in request order.

Gates are consulted on every due timer: ``hold`` must be cheap and must not block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from events.delivery_state import DeliveryState
from events.waiting import WaitReason


@dataclass(frozen=True)
class Hold:
    """Not now: look again at ``recheck_at``. ``reason`` None: wait unrecorded."""

    recheck_at: datetime
    detail: str
    reason: WaitReason | None = None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def next_beat(now: datetime, every: timedelta) -> datetime:
    """The first instant after ``now`` on a grid of ``every`` from the epoch. Holds that
    recheck on the beat fall due together, whenever each was held, so one tick releases
    them all and claims them in request order (a recheck ``now + every`` drifted with
    each delivery's own hold time: released in the order their timers came up)."""
    step = every.total_seconds()
    if step <= 0:
        return now
    beats = (now - _EPOCH).total_seconds() // step + 1
    return _EPOCH + timedelta(seconds=beats * step)


class Gate(Protocol):
    """Whether a delivery may be claimed now."""

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """A hold on ``state`` at ``now``, or None: it may be claimed."""
        ...


class OpenGate:
    """Holds nothing."""

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """Never a hold."""
        return None


class Gates:
    """Several gates in order: the first that holds decides. A gate that grants may spend
    something (a rate-limit token), so the later gates are asked only when the earlier
    ones grant, and the ones that hold come first: put the cheap, reversible ones last."""

    def __init__(self, gates: Sequence[Gate]) -> None:
        self._gates = tuple(gates)

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """The first gate's hold, or None when all grant."""
        for gate in self._gates:
            held = gate.hold(state, now)
            if held is not None:
                return held
        return None
