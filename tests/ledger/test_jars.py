"""The broker's jars: the pinned versions are the ones fetched, and the broker works with them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from clients.kafka_security import client_options
from config.settings import Settings
from ledger.broker.jars import EXCLUDED, PINS, REQUIRED_PREFIXES, ensure_jars, missing_jars, pom
from tests.fixtures.broker import unique

NS = {"m": "http://maven.apache.org/POM/4.0.0"}
CODECS = ("lz4", "zstd", "snappy")


def test_the_pom_forces_every_pin_and_drops_the_old_lz4() -> None:
    root = ET.fromstring(pom("4.1.1"))
    managed = {
        (d.findtext("m:artifactId", namespaces=NS), d.findtext("m:version", namespaces=NS))
        for d in root.iterfind("m:dependencyManagement/m:dependencies/m:dependency", NS)
    }
    direct = {
        (d.findtext("m:artifactId", namespaces=NS), d.findtext("m:version", namespaces=NS))
        for d in root.iterfind("m:dependencies/m:dependency", NS)
    }
    for pin in PINS:
        where = {"managed": managed, "direct": direct, "declared": direct}.get(pin.source)
        if where is not None:
            assert (pin.artifact, pin.version) in where, pin
    assert ("jackson-bom", next(p.version for p in PINS if p.source == "bom")) in managed
    excluded = {
        (e.findtext("m:groupId", namespaces=NS), e.findtext("m:artifactId", namespaces=NS))
        for e in root.iterfind("m:dependencies/m:dependency/m:exclusions/m:exclusion", NS)
    }
    assert excluded == set(EXCLUDED)


def test_a_cache_with_an_advised_version_is_incomplete(tmp_path: Path) -> None:
    """A jar set fetched before the pins (or with the old lz4 beside the fork) is fetched anew."""
    libs = tmp_path / "libs"
    libs.mkdir()
    for pin in PINS:
        (libs / pin.jar).touch()
    for prefix in REQUIRED_PREFIXES:
        if not any(pin.jar.startswith(prefix) for pin in PINS):
            (libs / f"{prefix}1.0.jar").touch()
    assert missing_jars(libs) == []
    (libs / "lz4-java-1.8.0.jar").touch()
    (libs / "commons-beanutils-1.11.0.jar").rename(libs / "commons-beanutils-1.9.4.jar")
    assert missing_jars(libs) == [
        "lz4-java-1.11.4.jar (found lz4-java-1.8.0.jar)",
        "commons-beanutils-1.11.0.jar (found commons-beanutils-1.9.4.jar)",
    ]


def test_the_fetched_jars_are_the_pinned_versions(broker: Settings) -> None:
    """What the suite's broker runs on: every pin, and no second copy of a pinned artifact."""
    libs, _ = ensure_jars(broker.cache_dir, broker.kafka.version)
    names = sorted(p.name for p in libs.glob("*.jar"))
    assert missing_jars(libs) == [], names
    for pin in PINS:
        assert pin.jar in names


@pytest.mark.parametrize("codec", CODECS)
async def test_the_broker_recompresses_with_each_pinned_codec(broker: Settings, codec: str) -> None:
    """The codec jars are loaded and work inside the broker, both ways.

    A topic whose ``compression.type`` is the codec makes the broker compress gzip batches
    with it (Java side), and a gzip topic makes it decompress batches the client compressed
    with it; the consumer reads both back intact.
    """
    into_codec, from_codec = unique(f"codec-{codec}-in"), unique(f"codec-{codec}-out")
    admin = AIOKafkaAdminClient(
        bootstrap_servers=broker.kafka.bootstrap_servers, **client_options(broker.kafka)
    )
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(into_codec, 1, 1, topic_configs={"compression.type": codec}),
                NewTopic(from_codec, 1, 1, topic_configs={"compression.type": "gzip"}),
            ]
        )
    finally:
        await admin.close()
    values = [f"{codec}-{n}-".encode() * 50 for n in range(20)]
    for topic, client_codec in ((into_codec, "gzip"), (from_codec, codec)):
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.kafka.bootstrap_servers,
            compression_type=client_codec,
            linger_ms=20,
            **client_options(broker.kafka),
        )
        await producer.start()
        try:
            for value in values:
                await producer.send(topic, value)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **client_options(broker.kafka),
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            while len(got) < len(values):
                batch = await consumer.getmany(timeout_ms=10_000)
                assert batch, f"{topic}: only {len(got)} of {len(values)} records came back"
                got += [m.value for messages in batch.values() for m in messages if m.value]
        finally:
            await consumer.stop()
        assert got == values, topic
