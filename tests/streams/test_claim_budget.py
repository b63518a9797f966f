"""The open-claim budget (streams/claim_budget.py): what a worker's sends get through in a
short horizon, never the whole lease's worth of every slot."""

from __future__ import annotations

from streams.claim_budget import ClaimBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def budget(clock: Clock, *, concurrency: int = 64, fixed: int = 0) -> ClaimBudget:
    # The defaults: a 30 s lease, a 10 s deadline, a 2 s clock-skew margin.
    return ClaimBudget(
        concurrency=concurrency, lease_s=30, deadline_s=10, margin_s=2, fixed=fixed, clock=clock
    )


def test_a_cpu_bound_worker_holds_what_it_sends_in_the_horizon_not_16_rounds() -> None:
    # Fast receivers (10 ms a send), but the worker gets through 40 sends a second: the
    # bound by latency alone admitted 64 slots x 16 rounds = 1024 claims, 25 s of queue
    # that a SIGKILL turned into UNKNOWN.
    clock = Clock()
    claims = budget(clock)
    for _ in range(400):
        clock.now += 1 / 40
        claims.observe(0.01)
    assert claims.limit() == 80  # 40/s x 2 s


def test_the_budget_never_falls_below_one_round_and_follows_a_faster_worker() -> None:
    clock = Clock()
    claims = budget(clock, concurrency=8)
    assert claims.limit() == 8  # nothing seen yet: one round of the send slots
    for _ in range(400):
        clock.now += 1 / 100
        claims.observe(0.01)
    assert claims.limit() == 128  # 16 rounds of 8 slots: the latency bound is lower now
    clock.now += 10  # idle: the rate is forgotten, one round again
    assert claims.limit() == 8


def test_a_fixed_budget_wins() -> None:
    assert budget(Clock(), fixed=5).limit() == 5
