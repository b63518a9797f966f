"""Forged outcomes are refused by default (issue 23, item 4): a new installation signs.

``ledger init`` writes an Ed25519 pair into the data directory (0700, files 0600); a worker
or a projector with no keys refuses to start, in one line and a hint; turned off on
purpose, each start warns; and with nothing configured but the data directory, a forged
``DeliveryConfirmed`` written by a raw producer moves nothing."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher
from clients.outcome_keys import StoredKeys
from clients.outcome_signing import OutcomeSigner, OutcomeVerifier, private_key, public_key
from config.settings import changed
from events import DeadLetter, encode
from events.operator import DeliveryRedriveRequested
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, wait_for
from tests.streams.test_outcome_signing import forged_confirmation


def ledger(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``ledger ARGS`` with no LEDGER_ variable but the data directory (and ``env``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    base |= {"LEDGER_DATA_DIR": str(data_dir), "LEDGER_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_a_worker_or_projector_without_keys_refuses_to_start(tmp_path: Path) -> None:
    for args, says in (
        (("worker", "--name", "w"), "outcome signing is on but this worker has no signing key"),
        (("project",), "outcome signing is on but this reader has no verify key"),
    ):
        done = ledger(
            tmp_path / "data",
            *args,
            LEDGER_CHANNELS__WEBHOOK_SECRET=os.environ["LEDGER_CHANNELS__WEBHOOK_SECRET"],
        )
        assert done.returncode == 2, done.stderr
        assert f"error: {says}" in done.stderr
        assert "hint: run 'ledger init'" in done.stderr
        assert "Traceback" not in done.stderr


def test_ledger_init_writes_a_private_pair_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = ledger(data, "init")
    assert first.returncode == 0, first.stderr
    assert "wrote new signing pairs" in first.stdout
    stored = StoredKeys.of(data)
    assert stat.S_IMODE(stored.directory.stat().st_mode) == 0o700
    paths = (stored.signing_path, stored.verify_path)
    operator_paths = (stored.operator_signing_path, stored.operator_verify_path)
    for path in (*paths, *operator_paths):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key, operator_key = stored.signing_key(), stored.operator_key()
    assert key is not None
    assert operator_key is not None
    assert key != operator_key
    operator_verify = stored.operator_verify_key()
    assert operator_verify is not None
    # The operators' pair is a pair of its own: the outcome verify key accepts none of it.
    _signs_operator_events(operator_key, operator_verify, outcome_verify=stored.verify_key())
    again = ledger(data, "init")
    assert "kept the signing pairs" in again.stdout
    assert (stored.signing_key(), stored.operator_key()) == (key, operator_key)
    assert stored.operator_verify_key() == operator_verify
    for secret in (key, operator_key):
        assert secret not in first.stdout + first.stderr + again.stdout + again.stderr


def test_ledger_init_adds_the_operator_pair_to_an_older_installation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert ledger(data, "init").returncode == 0
    stored = StoredKeys.of(data)
    key = stored.signing_key()
    # Initialised before operator keys existed: only the outcome pair is there.
    stored.operator_signing_path.unlink()
    stored.operator_verify_path.unlink()
    done = ledger(data, "init")
    assert done.returncode == 0, done.stderr
    assert stored.signing_key() == key  # never overwritten
    operator_key, operator_verify = stored.operator_key(), stored.operator_verify_key()
    assert operator_key is not None
    assert operator_verify is not None
    assert stat.S_IMODE(stored.operator_signing_path.stat().st_mode) == 0o600
    _signs_operator_events(operator_key, operator_verify, outcome_verify=stored.verify_key())


def _signs_operator_events(signing: str, verify: str, outcome_verify: str | None) -> None:
    """``signing`` and ``verify`` are a pair whose signatures an operator event is checked
    against, and the outcome verify key accepts none of them."""
    event = DeliveryRedriveRequested(
        idempotency_key="a" * 64, run_id="r", producer="p", operator="ana", reason="why",
        scope="key", fencing_token=1, seen_status="FAILED",
    )  # fmt: skip
    value = encode(event)
    headers = OutcomeSigner(private_key(signing)).headers(value)
    assert OutcomeVerifier([], [public_key(verify)]).refuses(event, value, headers) is None
    assert outcome_verify is not None
    as_outcome_key = OutcomeVerifier([public_key(outcome_verify)], [public_key(outcome_verify)])
    assert as_outcome_key.refuses(event, value, headers) is not None


def test_signing_turned_off_warns_at_every_start(tmp_path: Path) -> None:
    for _ in range(2):
        done = ledger(tmp_path / "data", "project", LEDGER_SIGNING__OUTCOMES="false")
        assert "outcome signing is OFF (LEDGER_SIGNING__OUTCOMES=false)" in done.stderr
        assert "no Kafka broker answers" in done.stderr  # it went on, to the broker


async def test_with_only_the_data_directory_a_forged_outcome_moves_nothing(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> None:
    """Nothing about signing is configured; ``ledger init`` ran. A forged, unsigned
    ``DeliveryConfirmed`` lands right behind its request, before any worker reads them:
    it is dead-lettered, and the delivery is sent, once, to a receiver that does not
    dedupe (before, the forged event settled it and nothing was sent)."""
    receiver = receiver_factory(dedupe=False)
    settings = changed(
        receiver.settings(worker_factory.settings),
        {"signing.signing_key": None, "signing.verify_keys": []},
    )
    initialised = ledger(settings.data_dir, "init")
    assert initialised.returncode == 0, initialised.stderr
    worker_factory.settings = live_projection.settings = settings
    async with Publisher(settings) as publisher:
        [request] = await publisher.run_succeeded(
            "run-forged-default",
            "h",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("d"), payload={})],
        )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        forged = await producer.send_and_wait(
            settings.kafka.topic_deliveries,
            encode(forged_confirmation(request)),
            key=request.idempotency_key.encode(),
        )
    finally:
        await producer.stop()
    worker = worker_factory.start("w1")
    live_projection.start()

    async def settled() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        try:
            statuses = await asyncio.to_thread(live_projection.statuses)
        except Exception:  # the projector may not have made its tables yet
            return False
        return statuses.get(request.idempotency_key, ("",))[0] == "CONFIRMED"

    await wait_for(settled, 90, "the delivery CONFIRMED by the worker's own signed outcome")
    assert receiver.accepted(request.idempotency_key) == 1
    letters = [
        DeadLetter.model_validate_json(m.value)
        for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
    ]
    # Dead letters are at least once (a rebalance before the worker's commit sends the
    # same one again); a reader dedupes on the original position.
    assert {(d.original_offset, d.original_partition) for d in letters} == {
        (forged.offset, forged.partition)
    }
    assert all("carries no outcome signature" in d.reason for d in letters)
    assert all(d.detected_by.startswith("w1@") for d in letters)
    assert live_projection.statuses()[request.idempotency_key][1] != "forged-id"
    await live_projection.verify()
