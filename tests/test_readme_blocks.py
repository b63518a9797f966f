"""Every Python and TypeScript block of the README runs as a test; the publishing example
runs here.

The other blocks run where they are used: the channel plugin's two halves in
``tests/streams/test_channel_plugin.py``, the receiver in
``tests/receiver/test_readme_example.py``.
"""

from __future__ import annotations

import ast
import re

import pytest

from config.settings import Settings
from events.delivery import DeliveryRequested
from events.execution import RunSucceeded
from ledger.stack import settings_env
from tests.fixtures.broker import ReadTopic
from tests.readme import ROOT, python_blocks, readme_block, typescript_blocks


def test_every_python_block_is_marked_and_run_by_a_test() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4
    assert [code[:40] for marker, code in blocks if marker is None] == []
    asked = set()
    for path in (ROOT / "tests").rglob("*.py"):
        asked |= set(re.findall(r'readme_block\("([a-z-]+)"\)', path.read_text()))
    assert {marker for marker, _ in blocks} <= asked


def test_every_typescript_block_is_marked_and_run_by_a_test() -> None:
    """The TypeScript blocks run in tests/typescript/test_typescript.py (compiled by tsc)."""
    blocks = typescript_blocks()
    assert len(blocks) >= 2
    assert [code[:40] for marker, code in blocks if marker is None] == []
    asked = set()
    for path in (ROOT / "tests").rglob("*.py"):
        asked |= set(re.findall(r'readme_typescript_block\("([a-z-]+)"\)', path.read_text()))
    assert {marker for marker, _ in blocks} <= asked


async def test_the_publishing_example_writes_its_run(
    settings: Settings, read_topic: ReadTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As written (top-level ``await``, ``Settings()`` from the environment), against this
    test's broker and topics."""
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    code = compile(
        readme_block("publish-example"), "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    done = eval(code, {})  # the README's own example: the point of the test
    if done is not None:
        await done
    runs = [e for e in await read_topic(settings.kafka.topic_runs) if isinstance(e, RunSucceeded)]
    assert [(r.run_id, r.result_hash) for r in runs] == [("run-42", "sha256:9f2c...")]
    requests = await read_topic(settings.kafka.topic_deliveries)
    assert [(type(r), r.run_id, getattr(r, "recipient", None)) for r in requests] == [
        (DeliveryRequested, "run-42", "https://example.test/hook")
    ]
