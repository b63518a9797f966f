"""The write-back transaction: its status, the steps each status allows, what a flush writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings
from events.state_codec import loads
from streams.app import Worker, create_app
from streams.state_transaction import StateTransaction, TransactionStatus, TransactionStatusError
from tests.fixtures.core import applied, requested


@pytest.fixture
async def worker(tmp_path: Path) -> Worker:
    """A worker built, not started: its table and its producer's buffer, no broker."""
    return create_app(
        Settings(channels={"webhook_secret": "whsec_" + "A" * 32}, data_dir=tmp_path), "tx"
    )


def status(tx: StateTransaction) -> TransactionStatus:
    """The status now (read through a call: mypy would narrow ``tx.status`` for good)."""
    return tx.status


STATES = [applied(None, requested(n)) for n in range(3)]


async def test_a_flush_writes_each_key_once_to_the_table_and_its_changelog(worker: Worker) -> None:
    tx = StateTransaction(worker.table)
    assert status(tx) is TransactionStatus.PREPARED
    tx.put("a", 0, STATES[0])
    tx.put("a", 0, STATES[1])  # replaced: only the last state is written
    tx.put("b", 3, STATES[2])
    assert tx.get("a") == STATES[1]
    assert tx.flush() == 2
    assert status(tx) is TransactionStatus.FLUSHED
    assert loads(worker.table.get("a")) == STATES[1]
    assert loads(worker.table.get("b")) == STATES[2]
    assert worker.app.producer.buffer.size == 2  # handed to the producer the commit drains
    tx.commit()
    assert status(tx) is TransactionStatus.COMMITTED


async def test_nothing_is_put_into_a_flushed_transaction(worker: Worker) -> None:
    """A state put after the flush would be committed past without being written."""
    tx = StateTransaction(worker.table)
    tx.flush()
    with pytest.raises(TransactionStatusError, match="cannot put into a flushed"):
        tx.put("a", 0, STATES[0])
    with pytest.raises(TransactionStatusError, match="cannot flush a flushed"):
        tx.flush()


async def test_only_a_flushed_transaction_is_committed(worker: Worker) -> None:
    tx = StateTransaction(worker.table)
    with pytest.raises(TransactionStatusError, match="cannot commit a prepared"):
        tx.commit()
    tx.flush()
    tx.commit()
    with pytest.raises(TransactionStatusError, match="cannot commit a committed"):
        tx.commit()


class RefusingChangelog:
    """A table whose changelog producer refuses every record."""

    def __init__(self, table: Any) -> None:
        self.data = table.data

    def send_changelog(self, partition: int, key: str, value: bytes) -> None:
        raise RuntimeError("producer closed")


async def test_a_flush_that_raises_fails_the_transaction_for_good(worker: Worker) -> None:
    tx = StateTransaction(RefusingChangelog(worker.table))
    tx.put("a", 0, STATES[0])
    with pytest.raises(RuntimeError, match="producer closed"):
        tx.flush()
    assert status(tx) is TransactionStatus.FAILED
    for step in (tx.flush, tx.commit):
        with pytest.raises(TransactionStatusError, match="a failed state transaction"):
            step()
