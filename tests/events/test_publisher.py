"""The publisher against the real broker: atomicity (failure matrix row 1), keys, bad input."""

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher, PublishRejected
from config.settings import Settings, changed
from events import RunSucceeded, encode
from events.channels.urls import credentials_in
from events.delivery import DeliveryClaimed
from events.redaction import redacted_url
from events.topics import record_key
from tests.fixtures.broker import ReadTopic, all_deliveries, every

HOOK = "http://127.0.0.1:9/hooks/a"


def specs(n: int = 3) -> list[DeliverySpec]:
    return [
        DeliverySpec(channel="webhook", recipient=f"http://127.0.0.1:9/hooks/{i}", payload={"i": i})
        for i in range(n)
    ]


async def test_run_succeeded_commits_run_and_deliveries(
    settings: Settings, read_topic: ReadTopic
) -> None:
    async with Publisher(settings, producer_name="agent-1") as publisher:
        requests = await publisher.run_succeeded("run-1", "sha256:r1", specs(3))
    runs = await read_topic(settings.kafka.topic_runs)
    deliveries = await read_topic(settings.kafka.topic_deliveries)
    assert [type(e) for e in runs] == [RunSucceeded]
    assert every(runs, RunSucceeded)
    assert runs[0].result_hash == "sha256:r1"
    assert all_deliveries(deliveries)
    assert sorted(d.idempotency_key for d in deliveries) == sorted(
        r.idempotency_key for r in requests
    )
    assert {d.producer for d in deliveries} == {"agent-1"}


async def test_aborted_transaction_leaves_nothing(
    settings: Settings, read_topic: ReadTopic
) -> None:
    publisher = Publisher(settings)
    await publisher.start()
    producer = publisher._producer
    assert producer is not None
    requests = publisher.delivery_requests("run-abort", specs(2))
    await producer.begin_transaction()
    run = RunSucceeded(run_id="run-abort", result_hash="h", producer="t")
    await producer.send_and_wait(settings.kafka.topic_runs, encode(run), key=record_key(run))
    for r in requests:
        await producer.send_and_wait(settings.kafka.topic_deliveries, encode(r), key=record_key(r))
    await producer.abort_transaction()
    await publisher.stop()
    assert await read_topic(settings.kafka.topic_runs) == []
    assert await read_topic(settings.kafka.topic_deliveries) == []
    # The records were written to the log; only the abort hides them.
    assert (
        len(
            await read_topic(
                settings.kafka.topic_deliveries, isolation="read_uncommitted", raw=True
            )
        )
        == 2
    )


PUBLISH_AND_DIE = """
import asyncio
from clients import DeliverySpec, Publisher
from config import Settings
async def main():
    async with Publisher(Settings(), transactional_id=TXID) as p:
        await p.run_succeeded("run-killed", "h", [
            DeliverySpec(channel="webhook", recipient="http://127.0.0.1:9/a", payload={}),
            DeliverySpec(channel="provider", recipient="http://127.0.0.1:9/b", payload={}),
        ])
    print("COMMITTED")
asyncio.run(main())
"""


async def test_publisher_sigkilled_before_commit_leaves_no_outbound_work(
    settings: Settings, read_topic: ReadTopic
) -> None:
    env = dict(os.environ)
    env.update(
        {
            "LEDGER_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "LEDGER_KAFKA__TOPIC_RUNS": settings.kafka.topic_runs,
            "LEDGER_KAFKA__TOPIC_DELIVERIES": settings.kafka.topic_deliveries,
            "LEDGER_FAULTS": '["publisher.before_commit"]',
            "LEDGER_CHANNELS__ALLOWED_NETWORKS": '["127.0.0.0/8"]',
        }
    )
    txid = f"agent-{settings.kafka.topic_runs}"
    script = f"TXID = {txid!r}\n" + PUBLISH_AND_DIE
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "COMMITTED" not in done.stdout
    # Sent but never committed: the log holds the records, read_committed sees none of them.
    assert (
        len(
            await read_topic(
                settings.kafka.topic_deliveries, isolation="read_uncommitted", raw=True
            )
        )
        == 2
    )
    assert await read_topic(settings.kafka.topic_runs) == []
    assert await read_topic(settings.kafka.topic_deliveries) == []
    # The agent restarts with its stable transactional id: that fences the dead producer and
    # aborts its open transaction at once, so consumers are not held back until it times out.
    async with Publisher(settings, transactional_id=txid) as publisher:
        await publisher.run_succeeded("run-again", "h", specs(1))
    runs = await read_topic(settings.kafka.topic_runs)
    assert [e.run_id for e in runs] == ["run-again"]
    deliveries = await read_topic(settings.kafka.topic_deliveries)
    assert [e.run_id for e in deliveries] == ["run-again"]


async def test_all_events_of_one_key_share_a_partition(
    settings: Settings, read_topic: ReadTopic
) -> None:
    async with Publisher(settings) as publisher:
        requests = await publisher.run_succeeded("run-p", "h", specs(6))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for r in requests:
            for token in (1, 2, 3):
                claim = DeliveryClaimed(
                    idempotency_key=r.idempotency_key,
                    run_id=r.run_id,
                    producer="t",
                    attempt=token,
                    worker_id="w",
                    fencing_token=token,
                    lease_expires_at=r.occurred_at,
                )
                await producer.send_and_wait(
                    settings.kafka.topic_deliveries, encode(claim), key=record_key(claim)
                )
    finally:
        await producer.stop()
    raw = await read_topic(settings.kafka.topic_deliveries, raw=True)
    partitions: dict[bytes, set[int]] = defaultdict(set)
    for message in raw:
        partitions[message.key].add(message.partition)
    assert len(partitions) == 6
    assert all(len(p) == 1 for p in partitions.values())
    assert sum(1 for m in raw) == 6 * 4
    assert len({p for ps in partitions.values() for p in ps}) > 1  # keys do spread


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"channel": "pigeon", "recipient": HOOK}, "unknown channel 'pigeon'"),
        ({"channel": "webhook", "recipient": "ftp://x/y"}, "must be an http(s) URL"),
        ({"channel": "webhook", "recipient": "not a url"}, "must be an http(s) URL"),
    ],
)
def test_bad_delivery_is_refused(fields: dict[str, str], message: str) -> None:
    from clients.publisher import build_spec

    with pytest.raises(PublishRejected, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_spec(payload={}, **fields)


def test_cli_delivery_and_payload_parsing(tmp_path: Path) -> None:
    from clients.publisher import parse_payload

    with pytest.raises(PublishRejected, match="not CHANNEL:RECIPIENT"):
        DeliverySpec.parse("webhook", {})
    with pytest.raises(PublishRejected, match="payload is not JSON"):
        parse_payload("{nope")
    (tmp_path / "p.json").write_text('{"ok": true}')
    assert parse_payload(f"@{tmp_path / 'p.json'}") == {"ok": True}
    with pytest.raises(PublishRejected, match="cannot read payload file"):
        parse_payload(f"@{tmp_path / 'missing.json'}")


async def test_rejected_input_writes_nothing(settings: Settings, read_topic: ReadTopic) -> None:
    small = changed(settings, {"publisher.max_payload_bytes": 100})
    async with Publisher(small) as publisher:
        with pytest.raises(PublishRejected, match="over the limit of 100"):
            await publisher.run_succeeded(
                "run-big",
                "h",
                [
                    DeliverySpec(channel="webhook", recipient=HOOK, payload={}),
                    DeliverySpec(channel="webhook", recipient=HOOK + "2", payload={"x": "y" * 200}),
                ],
            )
        with pytest.raises(PublishRejected, match="repeats delivery 1"):
            await publisher.run_succeeded(
                "run-dup",
                "h",
                [
                    DeliverySpec(channel="webhook", recipient=HOOK, payload={}),
                    DeliverySpec(channel="webhook", recipient=HOOK, payload={"other": 1}),
                ],
            )
        with pytest.raises(PublishRejected, match="run_id must be"):
            await publisher.run_succeeded("bad:run", "h", [])
        # No RFC 8785 form, so no payload hash: refused naming the field (events/payload_hashes.py).
        with pytest.raises(PublishRejected, match=r"^delivery 2: payload\.price is inf: RFC 8785"):
            await publisher.run_succeeded(
                "run-inf",
                "h",
                [
                    DeliverySpec(channel="webhook", recipient=HOOK, payload={}),
                    DeliverySpec(
                        channel="webhook", recipient=HOOK + "2", payload={"price": float("inf")}
                    ),
                ],
            )
    assert await read_topic(settings.kafka.topic_runs) == []
    assert await read_topic(settings.kafka.topic_deliveries) == []


async def test_run_lifecycle_events(settings: Settings, read_topic: ReadTopic) -> None:
    async with Publisher(settings) as publisher:
        await publisher.run_started("run-l", agent="agent-9")
        await publisher.run_failed("run-l", "model timed out")
        await publisher.run_marked_unknown("run-m", "agent host vanished")
        with pytest.raises(PublishRejected, match="reason must not be empty"):
            await publisher.run_marked_unknown("run-m", "")
    events = await read_topic(settings.kafka.topic_runs)
    assert sorted(e.type for e in events) == ["run.failed", "run.marked_unknown", "run.started"]
    assert await read_topic(settings.kafka.topic_deliveries) == []


@pytest.mark.parametrize(
    "recipient",
    [
        "https://admin:s3cr3t@hooks.example/x",
        "https://hooks.example/x?api_key=s3cr3t",
        # Names the redaction hid but admission let through before they shared one list.
        "https://hooks.example/x?sig=s3cr3t",
        "https://hooks.example/x?n=1&key=s3cr3t",
        "https://bucket.example/o?X-Amz-Credential=a&X-Amz-Signature=s3cr3t",
        "https://hooks.example/x?a=1;session=s3cr3t",
        "https://hooks.example/x#access_token=s3cr3t",
    ],
)
def test_the_sdk_refuses_credentials_in_a_recipient_before_any_connection(recipient: str) -> None:
    with pytest.raises(ValueError, match="put credentials in the endpoint's settings") as caught:
        DeliverySpec(channel="webhook", recipient=recipient, payload={})
    assert "s3cr3t" not in str(caught.value)


@pytest.mark.parametrize(
    "name",
    ["sig", "key", "X-Amz-Signature", "api_key", "access_token", "password", "page", "monkey"],
)
def test_admission_refuses_exactly_the_names_the_redaction_hides(name: str) -> None:
    url = f"https://hooks.example/x?n=1&{name}=v4lue"
    hidden = redacted_url(url) != url
    refused = credentials_in(url) is not None
    assert hidden == refused, (name, hidden, refused)
    assert hidden == (name not in ("page", "monkey"))


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("[::1]", "::1 is a loopback address"),
        ("0x7f000001", "0x7f000001 is 127.0.0.1, a loopback address"),
        ("2130706433", "2130706433 is 127.0.0.1, a loopback address"),
        ("127.1", "127.1 is 127.0.0.1, a loopback address"),
        ("localhost", "localhost is 127.0.0.1, a loopback address"),
        ("169.254.169.254", "169.254.169.254 is a link-local address"),
        ("10.0.0.5", "10.0.0.5 is a private address"),
        ("[fd00:ec2::254]", "fd00:ec2::254 is a private address"),
        ("0.0.0.0", "0.0.0.0 is an unspecified address"),
        # Tunnels and translators carry an IPv4 address: that one is judged, or refused.
        ("[2002:7f00:1::1]", "2002:7f00:1::1 carries 127.0.0.1, a loopback address"),
        ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe carries 169.254.169.254, a link-local"),
        ("[fec0::1]", "fec0::1 is a site-local address"),
        ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "a Teredo tunnel address"),
        ("[64:ff9b:1::a00:1]", "a local-use NAT64 address"),
    ],
)
async def test_a_recipient_the_worker_would_refuse_is_refused_at_publish(
    settings: Settings, read_topic: ReadTopic, host: str, says: str
) -> None:
    """An address literal (in any spelling a resolver takes) or localhost is known to be
    refused without DNS: the SDK says so before anything is written, naming the setting."""
    closed = changed(settings, {"channels.allowed_networks": [], "channels.allowed_hosts": []})
    spec = DeliverySpec(channel="webhook", recipient=f"http://{host}:8080/hooks", payload={})
    async with Publisher(closed) as publisher:
        with pytest.raises(PublishRejected) as refused:
            await publisher.run_succeeded("run-blocked", "h", [spec])
    assert says in str(refused.value)
    assert "LEDGER_CHANNELS__ALLOWED_NETWORKS" in str(refused.value)
    assert await read_topic(settings.kafka.topic_runs) == []
    assert await read_topic(settings.kafka.topic_deliveries) == []


async def test_an_allowed_network_or_host_may_be_published_to(
    settings: Settings, read_topic: ReadTopic
) -> None:
    by_host = changed(
        settings, {"channels.allowed_networks": [], "channels.allowed_hosts": ["localhost"]}
    )
    async with Publisher(by_host) as publisher:
        await publisher.run_succeeded(
            "run-allowed",
            "h",
            [DeliverySpec(channel="webhook", recipient="http://localhost:8080/h", payload={})],
        )
    async with Publisher(settings) as publisher:  # 127.0.0.0/8 allowed by the tests
        await publisher.run_succeeded("run-allowed-2", "h", specs(1))
    assert len(await read_topic(settings.kafka.topic_deliveries)) == 2
