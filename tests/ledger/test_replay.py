"""``ledger replay`` as an analyst runs it: filters, and exports that read back equal."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaProducer

from config.settings import Settings
from events.base import Event
from events.codec import decode
from events.deadletter import DeadLetter
from tests.fixtures.broker import ReadTopic
from tests.ledger.test_cli import ledger
from tests.projections.scenarios import at, incident_log, publish, requested

GARBAGE = b"\x00not json"


async def published(settings: Settings) -> list[Event]:
    """The incident scenario plus one undecodable record, in one transaction."""
    events = incident_log()
    await publish(settings, events, raw=[(settings.kafka.topic_deliveries, GARBAGE)])
    return list(events)


def ordered(events: Sequence[Event]) -> list[Event]:
    return sorted(events, key=lambda e: str(e.event_id))


async def test_exports_round_trip(
    settings: Settings, tmp_path: Path, read_topic: ReadTopic
) -> None:
    events = await published(settings)
    expected = ordered(events)

    jsonl = ledger(settings, "replay", "--format", "jsonl")
    assert jsonl.returncode == 0, jsonl.stderr
    lines = [json.loads(line) for line in jsonl.stdout.splitlines()]
    decoded = [decode(json.dumps(line["event"]).encode()) for line in lines if "event" in line]
    assert ordered(decoded) == expected
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1
    assert errors[0]["topic"] == settings.kafka.topic_deliveries

    csv_path = tmp_path / "events.csv"
    done = ledger(settings, "replay", "--format", "csv", "-o", str(csv_path))
    assert done.returncode == 0, done.stderr
    with csv_path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(events) + 1
    decoded = [decode(row["event"].encode()) for row in rows if row["event"]]
    assert ordered(decoded) == expected
    for row in rows:
        if row["event"]:
            event = decode(row["event"].encode())
            assert row["type"] == event.type
            assert row["run_id"] == event.run_id
            assert row["idempotency_key"] == (getattr(event, "idempotency_key", None) or "")
    # Positions are the broker's: every record read back directly sits where the export says.
    raw = await read_topic(settings.kafka.topic_deliveries, raw=True)
    where = {(m.partition, m.offset): m.value for m in raw}
    for row in rows:
        if row["topic"] == settings.kafka.topic_deliveries:
            value = where[(int(row["partition"]), int(row["offset"]))]
            assert (row["event"] or None) == (None if value == GARBAGE else value.decode())

    parquet = tmp_path / "events.parquet"
    done = ledger(settings, "replay", "--format", "parquet", "-o", str(parquet))
    assert done.returncode == 0, done.stderr
    table = pq.read_table(parquet).to_pylist()
    assert len(table) == len(events) + 1
    decoded = [decode(row["event"].encode()) for row in table if row["event"]]
    assert ordered(decoded) == expected
    assert {row["error"] for row in table if not row["event"]} != {None}
    assert sorted(r["offset"] for r in table) == sorted(int(r["offset"]) for r in rows)

    needs_file = ledger(settings, "replay", "--format", "parquet")
    assert needs_file.returncode == 2  # bad input
    assert "parquet needs a file" in needs_file.stderr


async def test_filters(settings: Settings) -> None:
    events = await published(settings)

    def types(*args: str) -> list[str]:
        done = ledger(settings, "replay", "--json", *args)
        assert done.returncode == 0, done.stderr
        return sorted(
            json.loads(line)["event"]["type"] if "event" in json.loads(line) else "UNDECODABLE"
            for line in done.stdout.splitlines()
        )

    unknowns = types("--type", "delivery.unknown")
    assert unknowns == ["delivery.unknown"] * 2
    assert types("--type", "run.started", "--type", "run.succeeded") == sorted(
        ["run.started"] * 3 + ["run.succeeded"] * 2
    )
    # run-b's events all happen between T0+99s and T0+100s; run-c's start at T0+199s.
    in_window = types("--since", at(99).isoformat(), "--until", "2026-01-05T09:03:19")
    assert in_window == ["delivery.requested", "run.started", "run.succeeded"]
    assert types("--run-id", "run-c") == sorted(
        ["run.started", "delivery.requested", "delivery.claimed", "delivery.sent",
         "delivery.confirmed"]
    )  # fmt: skip
    key = requested("run-a", 3, 1).idempotency_key
    assert types("--key", key) == sorted(
        ["delivery.requested", "delivery.claimed", "delivery.unknown"]
    )
    everything = types()
    assert len(everything) == len(events) + 1
    assert everything.count("UNDECODABLE") == 1

    # Offsets bound the read per partition: [from, to).
    whole = ledger(settings, "replay", "--json", "-t", settings.kafka.topic_deliveries, "-p", "0")
    offsets = [json.loads(line)["offset"] for line in whole.stdout.splitlines()]
    assert len(offsets) >= 3
    sliced = ledger(
        settings, "replay", "--json", "-t", settings.kafka.topic_deliveries, "-p", "0",
        "--from-offset", str(offsets[1]), "--to-offset", str(offsets[-1]),
    )  # fmt: skip
    assert [json.loads(line)["offset"] for line in sliced.stdout.splitlines()] == offsets[1:-1]

    bad = ledger(settings, "replay", "--type", "delivery.teleported")
    assert bad.returncode == 2
    assert "unknown event type 'delivery.teleported'" in bad.stderr
    bad_time = ledger(settings, "replay", "--since", "yesterday")
    assert bad_time.returncode == 2
    assert "--since 'yesterday' is not an ISO-8601 time" in bad_time.stderr


async def test_table_and_progress(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    await published(settings)
    monkeypatch.setenv("COLUMNS", "220")  # a wide terminal: rich folds table cells to fit
    table = ledger(settings, "replay", "--format", "table", "--run-id", "run-b", "--progress")
    assert table.returncode == 0, table.stderr
    assert "delivery.requested" in table.stdout
    assert "run.succeeded" in table.stdout
    assert "run-b" in table.stdout
    assert "replaying" in table.stderr
    assert "records" in table.stderr
    quiet = ledger(settings, "replay", "--run-id", "run-b")
    assert quiet.stderr == ""  # a short replay has no progress bar
    assert quiet.stdout.count("\n") == 3


async def test_dead_letters_replay_decoded(settings: Settings, tmp_path: Path) -> None:
    """``replay -t ledger.deadletter`` said UNDECODABLE for every dead letter; it shows
    what was refused, where it came from, who refused it and why (never its bytes)."""
    letter = DeadLetter.of(
        reason="value nests deeper than 64 levels",
        topic=settings.kafka.topic_deliveries,
        partition=3,
        offset=41,
        key=b"k",
        value=b"[" * 5000 + b"]" * 5000,
        detected_by="w1@host",
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.kafka.topic_deadletter, letter.model_dump_json().encode(), key=b"k"
        )
    finally:
        await producer.stop()
    origin = (
        f"of {settings.kafka.topic_deliveries}/3@41 by w1@host: value nests deeper than 64 levels"
    )
    line = ledger(settings, "replay", "-t", settings.kafka.topic_deadletter)
    assert line.returncode == 0, line.stderr
    assert f"deadletter {origin}" in line.stdout
    assert "UNDECODABLE" not in line.stdout
    assert "[[[[" not in line.stdout
    jsonl = ledger(settings, "replay", "-t", settings.kafka.topic_deadletter, "--format", "jsonl")
    [record] = [json.loads(x) for x in jsonl.stdout.splitlines()]
    assert DeadLetter.model_validate(record["deadletter"]) == letter
    csv_path = tmp_path / "letters.csv"
    done = ledger(
        settings,
        "replay",
        "-t",
        settings.kafka.topic_deadletter,
        "--format",
        "csv",
        "-o",
        str(csv_path),
    )
    assert done.returncode == 0, done.stderr
    with csv_path.open(newline="", encoding="utf-8") as f:
        [row] = list(csv.DictReader(f))
    assert DeadLetter.model_validate_json(row["deadletter"]) == letter
    assert row["error"] == ""
