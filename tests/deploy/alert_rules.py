"""The shipped Prometheus alert rules and their promtool tests, read as data (for the tests
here and the check against a real scrape in tests/dashboard/test_metrics.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "ledger-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "ledger-alerts.test.yml"
# Labels a scrape adds, or whose values are the deployment's (endpoint ids, topic names).
FREE_LABELS = frozenset({"job", "instance", "channel", "endpoint", "topic", "worker"})
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"\s*,?')


def rules() -> list[dict[str, Any]]:
    """Every alerting rule of the shipped file."""
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def rule_tests() -> list[dict[str, Any]]:
    """The promtool unit tests of the shipped file."""
    tests: list[dict[str, Any]] = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return tests


def metric_names(expr: str) -> set[str]:
    """The ledger's metric names a rule's expression reads."""
    return set(re.findall(r"\b(ledger_[a-z0-9_]+)\b", expr))


def input_series() -> list[tuple[str, dict[str, str]]]:
    """Every input series of the unit tests: its name and its labels."""
    found = []
    for test in rule_tests():
        for entry in test["input_series"]:
            match = _SERIES.match(entry["series"])
            assert match is not None, entry["series"]
            labels = dict(_LABEL.findall(match.group(2)))
            found.append((match.group(1), labels))
    return found
