"""The send budgets as Prometheus gauges (``/metrics``): per budget, its limit, its use of
the current window, when that resets, and what is held over it (projections/budgets.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from projections.budgets import BudgetUse

LABELS = ["agent", "channel"]
# The label value of an agent's budget for every channel.
EVERY_CHANNEL = "*"


def budget_families(uses: Sequence[BudgetUse]) -> Iterator[Metric]:
    """One series per budget in each family; no family without budgets."""
    if not uses:
        return
    limit = GaugeMetricFamily(
        "ledger_agent_budget_limit",
        'Deliveries an agent may send per window (channel="*": every channel\'s budget)',
        labels=LABELS,
    )
    window = GaugeMetricFamily(
        "ledger_agent_budget_window_seconds", "The length of a budget's window", labels=LABELS
    )
    used = GaugeMetricFamily(
        "ledger_agent_budget_used",
        "Deliveries granted in the budget's current window",
        labels=LABELS,
    )
    allowed = GaugeMetricFamily(
        "ledger_agent_budget_allowed",
        "The limit plus what operators released into the current window",
        labels=LABELS,
    )
    held = GaugeMetricFamily(
        "ledger_agent_budget_held_deliveries",
        "PENDING deliveries waiting over this budget",
        labels=LABELS,
    )
    resets = GaugeMetricFamily(
        "ledger_agent_budget_resets_at_seconds",
        "When the current window ends (Unix time)",
        labels=LABELS,
    )
    for b in uses:
        at = [b.agent, b.channel or EVERY_CHANNEL]
        limit.add_metric(at, b.limit)
        window.add_metric(at, b.window_s)
        used.add_metric(at, b.used)
        allowed.add_metric(at, b.allowed)
        held.add_metric(at, b.held)
        resets.add_metric(at, datetime.fromisoformat(b.resets_at).timestamp())
    yield from (limit, window, used, allowed, held, resets)
