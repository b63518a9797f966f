"""The hot events' codec (issue 31 item 3): CPU per event to decode and encode the four
records a webhook delivery's worker handles, today's path beside the alternatives.

Per event (``DeliveryRequested``, ``DeliveryClaimed``, ``DeliverySent``,
``DeliveryConfirmed``), microseconds per call (best of ``--repeat`` timings of ``--number``
calls, ``time.process_time``: CPU, not wall, so other load on the machine counts less):

* ``decode``: ``events.codec.decode`` (the worker's path: UTF-8, json.loads, depth and
  value checks, upcast, pydantic ``validate_python`` over the discriminated union);
* ``validate_json``: pydantic's own JSON parser straight into the union (no depth or value
  checks: not a drop-in replacement, only its price);
* ``orjson+validate``: ``orjson.loads`` then ``validate_python`` (if orjson is importable);
* ``orjson+construct``: ``orjson.loads`` then ``model_construct`` (no validation, and no
  type conversion: strings stay strings; the floor of a pydantic model, not usable as is);
* ``msgspec``: ``msgspec.json.decode`` into an equivalent ``Struct`` with the same bounds
  (if msgspec is importable; the fold would need its own model, not measured);
* ``own record``: the worker's record of what it appended itself (streams/own_records.py):
  remembered at the append, taken back by the record's bytes instead of decoding it;
* ``verify`` / ``sign``: the Ed25519 outcome signature every worker-written record carries
  (clients/outcome_signing.py), checked on read and made on write;
* ``encode``: ``events.codec.encode`` (pydantic ``model_dump_json``), against
  ``msgspec.json.encode`` of the Struct.

    python -m bench.codec [--number 2000] [--repeat 5]
    PYTHONPATH=/tmp/libs python -m bench.codec   # with orjson / msgspec installed there
"""

from __future__ import annotations

import argparse
import importlib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Annotated, Any, Literal

from clients.outcome_signing import new_pair, outcome_signer, outcome_verifier
from events.base import Event
from events.codec import decode, encode
from events.delivery import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliverySent,
    new_delivery_requested,
)
from events.model import EVENT_ADAPTER
from streams.own_records import OwnRecords

HOT = ("delivery.requested", "delivery.claimed", "delivery.sent", "delivery.confirmed")


def hot_events() -> dict[str, Event]:
    """One of each hot event, shaped like the peer benchmark's (a small JSON payload)."""
    now = datetime.now(UTC)
    requested = new_delivery_requested(
        run_id=f"codec-{uuid.uuid4().hex[:8]}",
        event_type="run.succeeded",
        channel="webhook",
        recipient="http://127.0.0.1:29000/hooks/b3",
        payload={"run": 17, "text": "report ready"},
        slo_seconds=300,
        producer="bench",
    )
    common = {
        "idempotency_key": requested.idempotency_key,
        "run_id": requested.run_id,
        "producer": "worker-1",
    }
    return {
        "delivery.requested": requested,
        "delivery.claimed": DeliveryClaimed(
            **common,
            attempt=1,
            worker_id="worker-1",
            fencing_token=1,
            lease_expires_at=now + timedelta(seconds=30),
        ),
        "delivery.sent": DeliverySent(
            **common,
            attempt=1,
            fencing_token=1,
            worker_id="worker-1",
            provider_message_id="msg_2f1c",
            provider_status="accepted",
            http_status=202,
        ),
        "delivery.confirmed": DeliveryConfirmed(
            **common,
            attempt=1,
            fencing_token=1,
            source="send",
            provider_message_id="msg_2f1c",
            evidence="HTTP 200 from the receiver with webhook-id echoed",
        ),
    }


def per_call_us(call: Callable[[], object], number: int, repeat: int) -> float:
    """CPU microseconds per call: the best of ``repeat`` timings of ``number`` calls."""
    best = float("inf")
    for _ in range(repeat):
        began = time.process_time()
        for _ in range(number):
            call()
        best = min(best, time.process_time() - began)
    return best * 1e6 / number


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _msgspec_structs(msgspec: Any) -> dict[str, Any]:
    """Structs with the hot events' fields and bounds (what msgspec would have to model);
    built with ``defstruct``, as this module's annotations are strings."""
    meta = msgspec.Meta
    key = Annotated[str, meta(pattern=r"^[0-9a-f]{64}$")]
    run = Annotated[str, meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-/@+=]{0,199}$")]
    ordinal = Annotated[int, meta(ge=1, le=2**53)]
    name = Annotated[str, meta(min_length=1, max_length=200)]
    text = Annotated[str, meta(max_length=2000)] | None
    base = [
        ("schema_version", int),
        ("event_id", uuid.UUID),
        ("occurred_at", datetime),
        ("producer", name),
        ("idempotency_key", key),
        ("run_id", run),
    ]
    fields: dict[str, list[tuple[str, Any] | tuple[str, Any, Any]]] = {
        "delivery.requested": [
            ("event_type", Annotated[str, meta(pattern=r"^[A-Za-z0-9._\-]{1,100}$")]),
            ("channel", Annotated[str, meta(min_length=1, max_length=64)]),
            ("recipient", Annotated[str, meta(min_length=1, max_length=2048)]),
            ("payload", Any),
            ("payload_hash", Annotated[str, meta(pattern=r"^(jcs-sha256:)?[0-9a-f]{64}$")]),
            ("slo_seconds", Annotated[int, meta(ge=1, le=31_536_000)]),
        ],
        "delivery.claimed": [
            ("attempt", ordinal),
            ("worker_id", name),
            ("fencing_token", ordinal),
            ("lease_expires_at", datetime),
        ],
        "delivery.sent": [
            ("attempt", ordinal),
            ("fencing_token", ordinal),
            ("worker_id", name),
            ("provider_message_id", text, None),
            ("provider_status", text, None),
            ("http_status", Annotated[int, meta(ge=0, le=999)] | None, None),
        ],
        "delivery.confirmed": [
            ("attempt", ordinal),
            ("fencing_token", ordinal),
            ("source", Literal["send", "reconciliation"]),
            ("evidence", Annotated[str, meta(min_length=1, max_length=2000)]),
            ("provider_message_id", text, None),
        ],
    }
    return {
        tag: msgspec.defstruct(
            tag.replace(".", "_"),
            [*base, *own],
            frozen=True,
            forbid_unknown_fields=True,
            tag_field="type",
            tag=tag,
        )
        for tag, own in fields.items()
    }


def measure(number: int = 2000, repeat: int = 5) -> dict[str, dict[str, float]]:
    """Microseconds per call of each way, per hot event: {event type: {way: us}}."""
    orjson = _optional("orjson")
    msgspec = _optional("msgspec")
    structs = _msgspec_structs(msgspec) if msgspec is not None else {}
    union = msgspec.json.Decoder(type=structs and _union(structs)) if msgspec else None
    signing, verify = new_pair()
    signer = outcome_signer(signing)
    verifier = outcome_verifier([verify], None)
    assert signer is not None  # keys were just made
    assert verifier is not None
    results: dict[str, dict[str, float]] = {}
    for event_type, event in hot_events().items():
        data = encode(event)
        headers = signer.headers(data)
        own = OwnRecords()
        ways: dict[str, Callable[[], object]] = {
            "decode": partial(decode, data),
            "validate_json": partial(EVENT_ADAPTER.validate_json, data),
            "own record": partial(_own_record, own, data, event, headers),
            "encode": partial(encode, event),
        }
        if event_type != "delivery.requested":
            ways["verify"] = partial(verifier.refuses, event, data, headers)
            ways["sign"] = partial(signer.headers, data)
        if orjson is not None:
            ways["orjson+validate"] = partial(_orjson_validate, orjson, data)
            ways["orjson+construct"] = partial(_orjson_construct, orjson, type(event), data)
        if union is not None:
            ways["msgspec"] = partial(union.decode, data)
            ways["msgspec encode"] = partial(msgspec.json.encode, union.decode(data))
        results[event_type] = {way: per_call_us(call, number, repeat) for way, call in ways.items()}
    return results


def _own_record(own: OwnRecords, data: bytes, event: Event, headers: Any) -> object:
    """Remembered at the append, taken at the read-back: both halves of the own path."""
    own.remember(data, event, headers)
    return own.known(data, headers)


def _orjson_validate(orjson: Any, data: bytes) -> object:
    return EVENT_ADAPTER.validate_python(orjson.loads(data))


def _orjson_construct(orjson: Any, cls: type[Event], data: bytes) -> object:
    return cls.model_construct(**orjson.loads(data))


def _union(structs: dict[str, Any]) -> Any:
    first, *rest = structs.values()
    union = first
    for one in rest:
        union = union | one
    return union


def table(results: dict[str, dict[str, float]]) -> str:
    """A markdown table: one row per way, one column per hot event."""
    ways = list(dict.fromkeys(w for per in results.values() for w in per))
    lines = ["| us per event (CPU) | " + " | ".join(results) + " |"]
    lines.append("|---" * (len(results) + 1) + "|")
    for way in ways:
        cells = [f"{results[t][way]:.1f}" if way in results[t] else "-" for t in results]
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings; the best counts")
    args = parser.parse_args(argv)
    print(table(measure(args.number, args.repeat)))


if __name__ == "__main__":
    main()
