"""The fan-out of run records (events/fan_out.py, streams/fan_out.py), without a broker:
the same requests on every read, one dead letter per run record for its bad entries, and
the records the projector owns left to it."""

from __future__ import annotations

import asyncio
import json

import pytest

from events import DeadLetter
from events.codec import decode, encode
from events.delivery import DeliveryRequested
from events.execution import RunStarted, RunSucceeded
from events.fan_out import EntryRefused, fan_out, request_event_id
from events.topics import record_key
from streams.fan_out import RunFanOut
from streams.processor import Record

HOOK = "https://example.test/hooks/"


def entry(n: int, **changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "event_type": "run.succeeded",
        "channel": "webhook",
        "recipient": f"{HOOK}{n}",
        "payload": {"n": n},
        "slo_seconds": 300,
    }
    return {**base, **changes}


def run(*entries: object) -> RunSucceeded:
    return RunSucceeded(run_id="run-1", result_hash="h", producer="agent", deliveries=entries)


class Sinks:
    """What a ``RunFanOut`` wrote: requests (key, value, headers) and dead letters."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, list[tuple[str, bytes]] | None]] = []
        self.letters: list[tuple[Record, str]] = []
        self.fan_out = RunFanOut(
            send=self.send, flush=self.flush, dead_letter=self.dead_letter, worker_id="w"
        )

    async def send(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None) -> None:
        self.sent.append((key, value, headers))

    async def flush(self) -> None:
        return None

    async def dead_letter(self, record: Record, reason: str) -> None:
        self.letters.append((record, reason))

    def handle(
        self,
        value: bytes,
        key: bytes | None = b"run-1",
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        record = Record("ledger.runs", 2, 7, key, value, headers)
        asyncio.run(self.fan_out.handle(record))


def test_requests_derive_from_the_run_alone() -> None:
    record = run(entry(1), entry(2))
    first, again = fan_out(record), fan_out(decode(encode(record)))  # type: ignore[arg-type]
    assert first == again
    assert all(isinstance(r, DeliveryRequested) for r in first)
    requests = [r for r in first if isinstance(r, DeliveryRequested)]
    assert [encode(r) for r in requests] == [encode(r) for r in again]  # type: ignore[arg-type]
    for request in requests:
        assert request.event_id == request_event_id(record.event_id, request.idempotency_key)
        assert (request.occurred_at, request.producer) == (record.occurred_at, "agent")


def test_a_v1_run_record_is_upcast_with_no_deliveries() -> None:
    stored = {"type": "run.succeeded", "schema_version": 1, "run_id": "r", "result_hash": "h"}
    upcast = decode(json.dumps({**stored, "producer": "p"}).encode())
    assert isinstance(upcast, RunSucceeded)
    assert upcast.deliveries == ()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("not an object", "expected an object"),
        (entry(9, extra=1), "unknown fields: extra"),
        ({"channel": "webhook"}, "lacks event_type"),
        (entry(9, recipient=5), "must be strings"),
        (entry(9, recipient="ftp://example.test/x"), "recipient"),
        (entry(9, slo_seconds=0), "slo_seconds"),
        (entry(1, payload={"other": True}), "repeats delivery 1"),
    ],
)
def test_a_bad_entry_is_refused_alone(bad: object, why: str) -> None:
    out = fan_out(run(entry(1), bad, entry(3)))
    assert isinstance(out[0], DeliveryRequested)
    assert isinstance(out[2], DeliveryRequested)
    assert isinstance(out[1], EntryRefused)
    assert out[1].index == 2
    assert why in out[1].reason


def test_the_worker_writes_the_good_entries_and_one_letter_naming_the_bad() -> None:
    sinks = Sinks()
    value = encode(run(entry(1), entry(2, extra=1), entry(3), "x"))
    trace = ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    sinks.handle(value, headers=(trace, ("other", b"y")))
    assert [json.loads(v)["recipient"] for _, v, _ in sinks.sent] == [f"{HOOK}1", f"{HOOK}3"]
    assert all(headers == [trace] for _, _, headers in sinks.sent)
    for key, value_, _ in sinks.sent:
        request = decode(value_)
        assert isinstance(request, DeliveryRequested)
        assert record_key(request) == key
    [(record, reason)] = sinks.letters
    assert reason.startswith("worker w refused ledger.runs[2]@7: delivery 2 of 4: ")
    assert "delivery 4 of 4: entry is JSON str" in reason
    assert "\n" not in reason
    assert (
        DeadLetter.of(
            reason=reason,
            topic=record.topic,
            partition=2,
            offset=7,
            key=record.key,
            value=record.value,
            detected_by="w",
        ).original_value()
        == value
    )


def test_a_request_over_the_record_limit_is_refused() -> None:
    sinks = Sinks()
    # The run record fits (the decoder's limit); its request, with the key and hash the
    # fan-out adds, would not.
    payload = "x" * (1024 * 1024 - 420)
    value = encode(run(entry(1, payload=payload)))
    assert len(value) <= 1024 * 1024
    sinks.handle(value)
    assert sinks.sent == []
    [(_, reason)] = sinks.letters
    assert "over the limit of 1048576" in reason


def test_records_the_projector_owns_are_skipped() -> None:
    sinks = Sinks()
    sinks.handle(b"{not json")
    sinks.handle(encode(run(entry(1))), key=b"another-run")  # the key is not the run's
    sinks.handle(encode(RunStarted(run_id="run-1", producer="agent")))
    sinks.handle(encode(run()))
    assert (sinks.sent, sinks.letters, sinks.fan_out.skipped) == ([], [], 2)
