"""Fuzzing the decoder: whatever the bytes, ``decode`` returns an event or raises
``EventDecodeError`` with a one-line reason, never anything else (an exception of any
other type stopped the worker at that record for good).

Run with ``--hypothesis-show-statistics`` to see the kinds of input reached."""

from __future__ import annotations

import json

from hypothesis import event, given, settings
from hypothesis import strategies as st

from events import EventDecodeError, decode, encode
from events.codec import MAX_DEPTH
from tests.events.test_codec import every_event

VALID = [encode(e) for e in every_event()]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


def nested(depth: int, kind: str) -> bytes:
    opening, closing = ("[", "]") if kind == "array" else ('{"a":', "}")
    return (opening * depth + "1" + closing * depth).encode()


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """One hostile record value, labelled with its kind."""
    kind = draw(
        st.sampled_from(
            [
                "random bytes",
                "truncated event",
                "deeply nested",
                "wrong shape",
                "future schema",
                "field mutated",
                "unicode edge",
                "oversized",
            ]
        )
    )
    event(kind)
    valid = draw(st.sampled_from(VALID))
    if kind == "random bytes":
        return bytes(draw(st.binary(max_size=200)))
    if kind == "truncated event":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "deeply nested":
        depth = draw(st.sampled_from([MAX_DEPTH, MAX_DEPTH + 1, 500, 5000, 50_000]))
        return nested(depth, draw(st.sampled_from(["array", "object"])))
    record = json.loads(valid)
    if kind == "wrong shape":
        return json.dumps(draw(json_values)).encode()
    if kind == "future schema":
        record["schema_version"] = draw(st.integers(min_value=2, max_value=2**40))
    elif kind == "field mutated":
        field = draw(st.sampled_from(sorted(record)))
        record[field] = draw(json_values)
    elif kind == "unicode edge":
        field = draw(st.sampled_from(sorted(k for k, v in record.items() if isinstance(v, str))))
        record[field] = draw(st.sampled_from(["\ud800", "\x00", "\u202e", "a" * 5000, "\ufeff"]))
        return json.dumps(record, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    elif kind == "oversized":
        record["payload"] = "x" * (1024 * 1024)
    return json.dumps(record).encode()


@settings(max_examples=1500, deadline=None)
@given(hostile())
def test_any_bytes_decode_to_an_event_or_one_error_type(data: bytes) -> None:
    reason = None
    try:
        decoded = decode(data)
    except EventDecodeError as exc:
        reason = exc.reason
    if reason is None:
        assert decoded.type
        event("accepted (still a valid event)")
    else:
        assert reason
        assert "\n" not in reason, reason
        event("refused")
