"""README, "Publishing from any language": its curl and Python examples, as written,
against a live ``ledger api``; the runs they publish are in the log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

from config.settings import Settings
from events.execution import RunSucceeded
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.broker import ReadTopic
from tests.readme import readme_block, readme_shell_block


async def test_the_curl_and_python_examples_publish_their_runs(
    settings: Settings,
    api_factory: ApiFactory,
    read_topic: ReadTopic,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, token = await new_key(settings, "report-bot")
    api = api_factory.start(settings)
    monkeypatch.setenv("LEDGER_API_URL", api.url)
    monkeypatch.setenv("LEDGER_API_KEY", token)

    curl = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", readme_shell_block("http-publish-curl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ),
    )
    assert curl.returncode == 0, curl.stderr
    answer = json.loads(curl.stdout)
    assert (answer["run_id"], answer["agent"]) == ("run-44", "report-bot")

    scope: dict[str, object] = {}
    code = compile(readme_block("http-publish-example"), "README.md", "exec")
    await asyncio.to_thread(exec, code, scope)  # the README's own example: the point
    assert isinstance(scope["key_at_receiver"], str)

    runs = [e for e in await read_topic(settings.kafka.topic_runs) if isinstance(e, RunSucceeded)]
    assert sorted((r.run_id, r.producer) for r in runs) == [
        ("run-43", "report-bot"),
        ("run-44", "report-bot"),
    ]
