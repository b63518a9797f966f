"""The project's own broker: durable across stop/start, clear errors when it cannot start."""

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from events import DeliverySpec, Publisher
from events.errors import LedgerError
from events.settings import Settings
from ledger.broker import LocalBroker
from ledger.replay import ReplayFilter, replay
from ledger.topics import create_topics
from tests.fixtures.broker import TEST_BROKER_PORT

PORT = TEST_BROKER_PORT + 10  # a broker of its own, beside the suite's


def own_settings(root: Path) -> Settings:
    return Settings(
        broker_port=PORT,
        controller_port=PORT + 1,
        data_dir=root,
        partitions=2,
        allowed_networks=["127.0.0.0/8"],
    )


async def replayed_run_ids(settings: Settings) -> list[str]:
    topics = [settings.topic_runs, settings.topic_deliveries]
    return [r.event.run_id async for r in replay(settings, topics, ReplayFilter()) if r.event]


def test_stop_then_start_keeps_every_record(tmp_path: Path) -> None:
    settings = own_settings(tmp_path / "ledger")
    broker = LocalBroker(settings)
    first = broker.start()
    try:
        assert not first.already_running
        assert broker.status().reachable
        asyncio.run(create_topics(settings))

        async def publish() -> None:
            async with Publisher(settings) as publisher:
                for n in range(5):
                    await publisher.run_succeeded(
                        f"run-{n}",
                        "h",
                        [
                            DeliverySpec(
                                channel="webhook",
                                recipient="http://127.0.0.1:9/x",
                                payload={"n": n},
                            )
                        ],
                    )

        asyncio.run(publish())
        before = asyncio.run(replayed_run_ids(settings))
        assert sorted(before) == sorted([f"run-{n}" for n in range(5)] * 2)

        pid, _, killed = broker.stop()
        assert pid == first.pid
        assert not killed, "SIGTERM should stop the broker cleanly"
        assert not broker.status().reachable

        again = broker.start()
        assert again.pid != first.pid
        assert not again.downloaded  # the jar cache is complete: nothing is fetched again
        after = asyncio.run(replayed_run_ids(settings))
        assert sorted(after) == sorted(before)
        # Starting a running broker reports it instead of starting a second one.
        assert broker.start().already_running
    finally:
        broker.stop()
    assert broker.pid() is None


def test_taken_port_is_one_clear_error(tmp_path: Path) -> None:
    port = PORT + 5  # still within this worker's 20 ports
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        settings = Settings(broker_port=port, controller_port=port + 1, data_dir=tmp_path)
        with pytest.raises(LedgerError) as caught:
            LocalBroker(settings).start()
    assert f"127.0.0.1:{port} is already in use" in caught.value.message
    assert "LEDGER_BROKER_PORT" in caught.value.hint


def test_corrupt_data_dir_is_one_clear_error(tmp_path: Path) -> None:
    settings = own_settings(tmp_path)
    data = tmp_path / "kafka" / "data"
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("garbage\n")
    with pytest.raises(LedgerError) as caught:
        LocalBroker(settings).start()
    assert "is corrupt" in caught.value.message
    assert "mv " in caught.value.hint


def test_cli_without_java_says_so(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PATH=str(Path(sys.executable).parent),
        LEDGER_DATA_DIR=str(tmp_path),
        LEDGER_BROKER_PORT=str(PORT),
        LEDGER_CONTROLLER_PORT=str(PORT + 1),
    )
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "broker", "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "error: Java is not installed" in done.stderr
    assert "hint:" in done.stderr
    assert "Traceback" not in done.stderr
