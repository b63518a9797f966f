"""The shipped alert rules load in Prometheus' own tool and pass their unit tests
(``promtool`` from Debian's ``prometheus`` package; scripts/test installs it). That their
metrics are the ones ``/metrics`` writes is checked against a real scrape in
tests/dashboard/test_metrics.py."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.alert_rules import RULE_TESTS, RULES, rule_tests, rules

SEVERITIES = {"warning", "critical"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: install Debian's prometheus package (scripts/test does)")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, check=False)


def test_the_rules_load_in_promtool() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    ran = promtool("test", "rules", str(RULE_TESTS))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SUCCESS" in ran.stdout


def test_every_alert_fires_in_a_test_and_none_when_healthy() -> None:
    alerts = [rule["alert"] for rule in rules()]
    fired = {
        check["alertname"]
        for test in rule_tests()
        for check in test["alert_rule_test"]
        if check["exp_alerts"]
    }
    assert sorted(set(alerts) - fired) == []
    [healthy] = [t for t in rule_tests() if t["name"] == "a healthy ledger fires nothing"]
    quiet = {c["alertname"] for c in healthy["alert_rule_test"] if c["exp_alerts"] == []}
    assert quiet == set(alerts)
    assert len({c["eval_time"] for c in healthy["alert_rule_test"]}) >= 2


def test_every_alert_waits_has_a_severity_and_says_what_to_do() -> None:
    for rule in rules():
        name = rule["alert"]
        assert "for" in rule, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["annotations"]["summary"].strip(), name
        # The runbook action: a ledger command, or another alert that names one.
        assert "`ledger " in rule["annotations"]["description"], name
