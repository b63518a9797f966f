"""A worker refuses, in one line, topics whose partition counts it cannot line up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

from config.settings import Settings, changed
from ledger.stack import settings_env
from ledger.topics import create_topics
from streams.app import create_app
from streams.topic_layout import changelog_topic, layout_error


def test_the_changelog_name_is_the_one_faust_gives_the_table(settings: Settings) -> None:
    worker = create_app(changed(settings, {"worker.group": "layout-name"}), "name")
    assert worker.table.changelog_topic.get_topic_name() == changelog_topic("layout-name")


def test_counts_that_line_up_or_do_not_exist_yet_pass(settings: Settings) -> None:
    kafka = settings.kafka
    changelog = changelog_topic("g")
    assert layout_error(kafka, changelog, {}) is None
    assert layout_error(kafka, changelog, {kafka.topic_deliveries: kafka.partitions}) is None
    assert layout_error(kafka, changelog, {changelog: kafka.partitions}) is None


def test_each_mismatch_names_the_topics_and_their_counts(settings: Settings) -> None:
    kafka = settings.kafka  # 4 partitions
    changelog = changelog_topic("g")
    wrong_topic = layout_error(kafka, changelog, {kafka.topic_deliveries: 8})
    assert wrong_topic is not None
    assert wrong_topic.message.startswith(f"{kafka.topic_deliveries} has 8 partitions")
    assert "LEDGER_KAFKA__PARTITIONS=8" in wrong_topic.hint
    stale = layout_error(kafka, changelog, {kafka.topic_deliveries: 4, changelog: 2})
    assert stale is not None
    assert f"changelog {changelog} has 2 partitions" in stale.message
    assert "LEDGER_WORKER__GROUP" in stale.hint
    # More changelog partitions than the deliveries topic's is faust's PartitionsMismatch.
    assert layout_error(kafka, changelog, {kafka.topic_deliveries: 4, changelog: 8}) is not None


async def test_a_changelog_left_by_another_layout_stops_the_worker_in_one_line(
    settings: Settings,
) -> None:
    """A 2-partition changelog beside 4-partition deliveries: faust crashed with
    "Unrecognized partition" and a traceback; now the worker does not start."""
    group = f"layout-{uuid.uuid4().hex[:8]}"
    settings = changed(settings, {"worker.group": group})
    stale = changelog_topic(group)
    await create_topics(changed(settings, {"kafka.partitions": 2}), (stale,))
    env = settings_env(settings)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ledger", "worker", "--name", "layout"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines[0] == (
        f"error: the worker's changelog {stale} has 2 partitions but "
        f"{settings.kafka.topic_deliveries} has 4: it was left by another layout"
    ), done.stderr
    assert "Traceback" not in done.stderr
