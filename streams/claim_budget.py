"""How many claims a worker may have open at once: what its sends can finish in one lease.

A claim read back after its lease has run out can only be refused at the write guard, so
admitting more claims than the sends can get through within one lease only makes work
that expires. Assuming every send takes the full deadline (the bound before anything has
been seen) allows ``send_concurrency`` claims, one round per slot: with fast receivers
that idles the worker, each claim a Kafka round trip behind the last. So the budget
follows the sends it observes (twice their moving average, never below one round, at
most ``MAX_ROUNDS``); a receiver turning slow shrinks it again, and whatever was
admitted meanwhile is refused before its first byte, never sent late.
"""

from __future__ import annotations

MAX_ROUNDS = 16  # at most 16 claims per send slot
SMOOTHING = 0.1  # weight of each new send in the moving average
SAFETY = 2.0  # plan for sends twice as slow as the average


class ClaimBudget:
    """The open-claim limit: fixed when configured, else derived from observed sends."""

    def __init__(
        self,
        *,
        concurrency: int,
        lease_s: float,
        deadline_s: float,
        margin_s: float,
        fixed: int = 0,
    ) -> None:
        self._concurrency = concurrency
        self._usable_s = max(lease_s - deadline_s - margin_s, 0.0)
        self._fixed = fixed
        self.send_s = deadline_s  # the moving average starts at the worst case

    def observe(self, seconds: float) -> None:
        """One send (or lookup) took ``seconds`` from its first byte to its answer."""
        self.send_s += SMOOTHING * (max(seconds, 0.0) - self.send_s)

    def limit(self) -> int:
        """How many claims may be open (proposed and not read back, or being sent) now."""
        if self._fixed:
            return self._fixed
        rounds = int(self._usable_s / max(SAFETY * self.send_s, 1e-3))
        return self._concurrency * min(max(rounds, 1), MAX_ROUNDS)
