"""Faults the simulator injects on command: targeted (next N matching requests) or a seeded mix."""

from __future__ import annotations

import enum
import random
import threading

from pydantic import BaseModel, ConfigDict, Field


class FaultKind(enum.StrEnum):
    """What goes wrong with one request, and whether the receiver accepted it first."""

    DELAY = "delay"  # accept (unless accept_first=False), answer only after delay_s
    DROP = "drop"  # accept, then close the connection (FIN) without any response
    RESET = "reset"  # accept, then abort the connection (RST) without any response
    ERROR_AFTER_ACCEPT = "error_after_accept"  # accept, then answer `status` (500)
    REJECT = "reject"  # answer `status` (400) and do NOT accept
    RATE_LIMIT = "rate_limit"  # answer 429 with Retry-After and do NOT accept
    STALL = "stall"  # sit on the request for delay_s, then answer `status` (503); NOT accepted
    TRICKLE = "trickle"  # accept, answer 200 at once, then trickle the body over delay_s
    PROVIDER_FAILED = "provider_failed"  # accept; the provider reports the message "failed"


class Fault(BaseModel):
    """A fault for the next ``count`` requests that match ``method``, ``key`` and ``path``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    count: int = Field(default=1, ge=1, le=1_000_000)
    key: str | None = None  # only requests carrying this idempotency key
    path: str | None = None  # only requests whose path starts with this
    method: str | None = "POST"  # sends by default; None matches lookups too
    status: int | None = Field(default=None, ge=100, le=599)
    delay_s: float = Field(default=10.0, ge=0, le=300)
    accept_first: bool = True  # DELAY: record acceptance before sleeping (the answer is late)
    retry_after: str = "1"  # RATE_LIMIT: the Retry-After value (seconds or an HTTP date)

    def matches(self, method: str, path: str, key: str | None) -> bool:
        """Does this fault apply to a request?"""
        if self.method is not None and method.upper() != self.method.upper():
            return False
        if self.path is not None and not path.startswith(self.path):
            return False
        return self.key is None or self.key == key

    def response_status(self) -> int:
        """The status this fault answers with (where it answers at all)."""
        defaults = {
            FaultKind.ERROR_AFTER_ACCEPT: 500,
            FaultKind.REJECT: 400,
            FaultKind.RATE_LIMIT: 429,
            FaultKind.STALL: 503,
        }
        return self.status or defaults.get(self.kind, 200)


class FaultMix(BaseModel):
    """Random faults on POSTs by fraction, from a seeded generator (same seed, same sequence)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 0
    timeout: float = Field(default=0.0, ge=0, le=1)  # DELAY past the client timeout
    error_after_accept: float = Field(default=0.0, ge=0, le=1)
    reject: float = Field(default=0.0, ge=0, le=1)
    drop: float = Field(default=0.0, ge=0, le=1)
    reset: float = Field(default=0.0, ge=0, le=1)
    rate_limit: float = Field(default=0.0, ge=0, le=1)
    # Read at once, accepted only after delay_s: the client has given up by then.
    slow_process: float = Field(default=0.0, ge=0, le=1)
    stall: float = Field(default=0.0, ge=0, le=1)
    trickle: float = Field(default=0.0, ge=0, le=1)
    delay_s: float = Field(default=10.0, ge=0, le=300)
    retry_after: str = "1"

    def pick(self, rng: random.Random) -> Fault | None:
        """Draw the fault (or none) for one request."""
        draw = rng.random()
        for kind, share in (
            (FaultKind.DELAY, self.timeout),
            (FaultKind.ERROR_AFTER_ACCEPT, self.error_after_accept),
            (FaultKind.REJECT, self.reject),
            (FaultKind.DROP, self.drop),
            (FaultKind.RESET, self.reset),
            (FaultKind.RATE_LIMIT, self.rate_limit),
            (FaultKind.STALL, self.stall),
            (FaultKind.TRICKLE, self.trickle),
        ):
            if draw < share:
                return Fault(kind=kind, delay_s=self.delay_s, retry_after=self.retry_after)
            draw -= share
        if draw < self.slow_process:
            return Fault(kind=FaultKind.DELAY, delay_s=self.delay_s, accept_first=False)
        return None


class FaultPlan:
    """The faults armed right now; thread-safe (tests arm them from another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targeted: list[tuple[Fault, int]] = []  # (fault, remaining)
        self._mix: FaultMix | None = None
        self._rng = random.Random(0)  # noqa: S311 - fault injection, not security

    def add(self, fault: Fault) -> None:
        """Arm a targeted fault; earlier faults match first."""
        with self._lock:
            self._targeted.append((fault, fault.count))

    def set_mix(self, mix: FaultMix | None) -> None:
        """Replace the random mix (None turns it off) and reseed."""
        with self._lock:
            self._mix = mix
            self._rng = random.Random(mix.seed if mix else 0)  # noqa: S311

    def clear(self) -> None:
        """Disarm everything."""
        self.set_mix(None)
        with self._lock:
            self._targeted.clear()

    def take(self, method: str, path: str, key: str | None) -> Fault | None:
        """The fault for this request, consuming one use of a targeted fault."""
        with self._lock:
            for index, (fault, remaining) in enumerate(self._targeted):
                if fault.matches(method, path, key):
                    if remaining <= 1:
                        del self._targeted[index]
                    else:
                        self._targeted[index] = (fault, remaining - 1)
                    return fault
            if self._mix is not None and method.upper() == "POST":
                return self._mix.pick(self._rng)
        return None

    def describe(self) -> dict[str, object]:
        """What is armed, as JSON-able data."""
        with self._lock:
            return {
                "targeted": [
                    {**fault.model_dump(mode="json"), "remaining": remaining}
                    for fault, remaining in self._targeted
                ],
                "mix": self._mix.model_dump(mode="json") if self._mix else None,
            }
