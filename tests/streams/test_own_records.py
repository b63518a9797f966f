"""The worker's own records, taken back without a second decode and signature check
(streams/own_records.py): only its exact bytes with its own signature, once; everything
else is decoded, validated and verified where it enters, as before. Broker-free."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.outcome_signing import (
    OutcomeSigner,
    OutcomeVerifier,
    new_pair,
    private_key,
    public_key,
)
from events.codec import encode
from events.delivery import DeliveryClaimed
from events.delivery_state import Status
from streams.own_records import OwnRecords
from streams.processor import MemoryStore, Record
from streams.timers import DueIndex
from tests.fixtures.core import Appended, Clock, requested
from tests.streams.test_processor import processor_for, record_of

SIGNING, VERIFY = new_pair()
OTHER_SIGNING, _ = new_pair()


async def test_only_the_worker_s_own_signed_bytes_skip_the_decode_and_only_once(
    tmp_path: Path, clock: Clock, appended: Appended, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, own = MemoryStore(), OwnRecords()
    letters: list[str] = []

    async def dead_letter(_record: Record, reason: str) -> None:
        letters.append(reason)

    processor = processor_for(
        store,
        clock,
        appended,
        DueIndex(tmp_path / "due"),
        dead_letter=dead_letter,
        verifier=OutcomeVerifier([public_key(VERIFY)]),
        own=own,
    )
    signer, forger = OutcomeSigner(private_key(SIGNING)), OutcomeSigner(private_key(OTHER_SIGNING))
    request = requested(1)
    key = request.idempotency_key.encode()
    await processor.handle(record_of(request, 0))
    claim = appended.of(DeliveryClaimed)[0]
    value = encode(claim)
    signed = tuple(signer.headers(value))
    own.remember(value, claim, signed)

    def no_decode(_data: bytes | None) -> None:
        raise AssertionError("the worker's own record was decoded again")

    with monkeypatch.context() as patched:
        patched.setattr("streams.processor.decode", no_decode)
        await processor.handle(Record("ledger.deliveries", 0, 1, key, value, signed))
    state = store.get(request.idempotency_key)
    assert state is not None
    assert state.status is Status.CLAIMED
    assert (letters, len(own)) == ([], 0)
    # The same bytes again, unsigned: the entry is used up, so the full path refuses it.
    await processor.handle(Record("ledger.deliveries", 0, 2, key, value, ()))
    # Remembered, but read back with another key's signature, or under another record key.
    for offset, headers, record_key in [
        (3, tuple(forger.headers(value)), key),
        (4, signed, b"another-key"),
    ]:
        own.remember(value, claim, signed)
        await processor.handle(Record("ledger.deliveries", 0, offset, record_key, value, headers))
    assert letters == [
        "delivery.claimed carries no outcome signature",
        "delivery.claimed has an outcome signature no verify key accepts (outcome keys)",
        "record key does not match the event's idempotency_key",
    ]


def test_entries_are_bounded_oldest_first() -> None:
    own = OwnRecords(limit=2)
    events = [requested(n) for n in range(3)]
    for event in events:
        own.remember(encode(event), event, None)
    assert len(own) == 2
    assert own.known(encode(events[0])) is None
    assert own.known(encode(events[2])) is events[2]
