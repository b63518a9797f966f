"""docker-compose.yml: valid YAML without duplicate keys, and every long-running service
restarts by itself (issue 24, item 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _no_duplicate_keys(node: yaml.Node) -> None:
    if isinstance(node, yaml.MappingNode):
        keys = [key.value for key, _ in node.value]
        assert len(keys) == len(set(keys)), (sorted(keys), node.start_mark)
        for _, value in node.value:
            _no_duplicate_keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for value in node.value:
            _no_duplicate_keys(value)


def test_every_long_running_service_restarts_on_failure() -> None:
    text = COMPOSE.read_text()
    root = yaml.compose(text)
    assert root is not None, "docker-compose.yml is empty"
    _no_duplicate_keys(root)
    services: dict[str, Any] = yaml.safe_load(text)["services"]
    one_shot = {
        name
        for spec in services.values()
        for name, condition in (spec.get("depends_on") or {}).items()
        if condition.get("condition") == "service_completed_successfully"
    }
    long_running = set(services) - one_shot
    assert long_running >= {"kafka", "postgres", "worker", "projector", "dashboard"}
    for name in sorted(long_running):
        assert services[name].get("restart") in {"on-failure", "unless-stopped", "always"}, name
