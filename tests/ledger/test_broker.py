"""The project's own broker: durable across stop/start, clear errors when it cannot start."""

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from clients import DeliverySpec, Publisher
from clients.kafka_security import client_options
from config.settings import Settings
from events.errors import LedgerError
from ledger.broker import LocalBroker
from ledger.broker.process import metadata_ok
from ledger.replay import ReplayFilter, replay
from ledger.topics import create_topics
from tests.fixtures.broker import TEST_BROKER_PORT
from tests.fixtures.private import readable_by_others

PORT = TEST_BROKER_PORT + 10  # a broker of its own, beside the suite's


def own_settings(root: Path) -> Settings:
    return Settings(
        kafka={"broker_port": PORT, "controller_port": PORT + 1, "partitions": 2},
        channels={"allowed_networks": ["127.0.0.0/8"]},
        data_dir=root,
    )


async def replayed_run_ids(settings: Settings) -> list[str]:
    topics = [settings.kafka.topic_runs, settings.kafka.topic_deliveries]
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
        # Log segments, the metadata log, server.log, the config: owner only.
        assert readable_by_others(settings.data_dir) == []
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
        settings = Settings(
            kafka={"broker_port": port, "controller_port": port + 1}, data_dir=tmp_path
        )
        with pytest.raises(LedgerError) as caught:
            LocalBroker(settings).start()
    assert f"127.0.0.1:{port} is already in use" in caught.value.message
    assert "LEDGER_KAFKA__BROKER_PORT" in caught.value.hint


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
        LEDGER_KAFKA__BROKER_PORT=str(PORT),
        LEDGER_KAFKA__CONTROLLER_PORT=str(PORT + 1),
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


def outside_address() -> str:
    """An address of this machine that is not loopback (where the network would come
    in), or 127.0.0.2 (not the 127.0.0.1 a loopback listener binds) when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # no packet is sent: this picks a route
            address = str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.2"
    return "127.0.0.2" if address.startswith("127.") else address


def answers(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2.0)
        return sock.connect_ex((host, port)) == 0


@pytest.mark.parametrize("host", ["0.0.0.0", outside_address()])
def test_exposed_broker_keeps_its_unauthenticated_listeners_on_loopback(
    tmp_path: Path, host: str
) -> None:
    base = PORT + 2  # +12..+14 of this worker's 20 ports
    settings = Settings(
        kafka={
            "broker_host": host,
            "broker_port": base,
            "controller_port": base + 1,
            "broker_sasl_ssl_port": base + 2,
            "bootstrap_servers": f"127.0.0.1:{base}",
        },
        channels={"allowed_networks": ["127.0.0.0/8"]},
        data_dir=tmp_path,
    )
    broker = LocalBroker(settings)
    broker.start()
    try:
        outside = outside_address()
        # The authenticated listener faces the network; PLAINTEXT and CONTROLLER
        # (User:ANONYMOUS, a super user) answer on loopback only.
        assert answers(outside, base + 2)
        assert not answers(outside, base), f"PLAINTEXT reachable at {outside}:{base}"
        assert not answers(outside, base + 1), f"CONTROLLER reachable at {outside}:{base + 1}"
        assert answers("127.0.0.1", base)
        assert broker.status().reachable
        properties = broker.layout.server_properties.read_text()
        assert f"listeners=PLAINTEXT://127.0.0.1:{base},CONTROLLER://127.0.0.1:{base + 1}," in (
            properties
        )
        assert f"SASL_SSL://{host}:{base + 2}" in properties
        # An authenticated client still gets in through the exposed listener, by the
        # name it advertises (a wildcard advertises this machine's name).
        users = broker.layout.security.users()
        client = Settings(
            kafka={
                "bootstrap_servers": f"{broker.listeners.sasl_ssl_advertised}:{base + 2}",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "admin",
                "sasl_password": users["admin"],
                "ssl_cafile": broker.layout.security.ca_file,
            },
            data_dir=tmp_path,
        )
        assert metadata_ok(client.kafka.bootstrap_servers, 10.0, client_options(client.kafka))
    finally:
        broker.stop()


def test_cli_refuses_a_non_loopback_broker_without_authentication(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        LEDGER_DATA_DIR=str(tmp_path),
        LEDGER_KAFKA__BROKER_HOST="0.0.0.0",
        LEDGER_KAFKA__BROKER_PORT=str(PORT + 2),
        LEDGER_KAFKA__CONTROLLER_PORT=str(PORT + 3),
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ledger", "broker", "start"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:  # the code before the fix started it: never leave one behind
        LocalBroker(
            Settings(
                kafka={"broker_port": PORT + 2, "controller_port": PORT + 3}, data_dir=tmp_path
            )
        ).stop()
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("error: refusing to bind the local broker to 0.0.0.0 (not loopback)")
    assert lines[1].startswith("hint:")
    assert "LEDGER_KAFKA__BROKER_SASL_SSL_PORT" in lines[1]
    assert len(lines) == 2
    assert not (tmp_path / "kafka" / "config" / "server.properties").exists()
