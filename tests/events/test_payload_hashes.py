"""Payload hashes over RFC 8785: the shared vectors, the refusals, and the comparison of a
hash written before the change with one written after it (no false conflict, none missed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from events.codec import decode, encode
from events.delivery import DeliveryRequested, DuplicateDeliveryRequest, new_delivery_requested
from events.delivery_state import apply
from events.payload_hashes import (
    JCS,
    LEGACY,
    PayloadHashError,
    comparable,
    hash_under,
    jcs_json,
    jcs_refusal,
    matches,
    payload_hash,
    scheme_of,
)
from streams.decisions import on_request
from tests.fixtures.core import T0, core_context
from tests.readme import readme_block

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "contracts" / "payload_hash_vectors.json").read_text())
DATA = Path(__file__).parent / "data"
CTX = core_context()


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_the_shared_vectors(vector: dict[str, Any]) -> None:
    payload = json.loads(vector["json"])
    canonical = bytes.fromhex(vector["canonical_hex"])
    assert canonical == vector["canonical"].encode("utf-8")
    assert jcs_json(payload) == canonical
    assert payload_hash(payload) == vector["payload_hash"]
    assert hash_under(LEGACY, payload) == vector["legacy_payload_hash"]


def test_the_vectors_hold_the_cases_the_issue_names() -> None:
    names = {v["name"] for v in VECTORS["vectors"]}
    assert {"float-one", "float-1e21", "negative-zero", "smallest-subnormal"} <= names
    assert "key-order-utf16-not-code-points" in names
    sources = {v["source"] for v in VECTORS["vectors"]}
    assert sources == {"cyberphone", "rfc8785-appendix-b", "ledger"}
    # Where the two schemes disagree is the point of the change: some vectors must show it.
    differ = [
        v["name"]
        for v in VECTORS["vectors"]
        if v["payload_hash"].removeprefix("jcs-sha256:") != v["legacy_payload_hash"]
    ]
    assert {"float-one", "float-1e21", "key-order-utf16-not-code-points"} <= set(differ)


@pytest.mark.parametrize("refused", VECTORS["refused"], ids=lambda v: v["name"])
def test_the_shared_refusals_name_the_field(refused: dict[str, Any]) -> None:
    payload = json.loads(refused["json"])
    reason = jcs_refusal(payload)
    assert reason is not None
    assert reason.startswith(refused["field"] + " ")
    with pytest.raises(PayloadHashError, match="^" + refused["field"].replace(".", r"\.")):
        payload_hash(payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"a": [1, {"b": float("nan")}]}, "payload.a[1].b is nan: RFC 8785 (JCS) JSON has no NaN"),
        ({"x": float("inf")}, "payload.x is inf: RFC 8785 (JCS) JSON has no NaN or Infinity"),
        ([float("-inf")], "payload[0] is -inf"),
        ({"n": -(2**53)}, "payload.n is -9007199254740992, beyond the exact integer range"),
        ({"k": {"\udc00": 1}}, "payload.k has a key that is not a UTF-8 string"),
    ],
)
def test_a_payload_without_an_rfc8785_form_is_one_line_naming_the_field(
    payload: Any, message: str
) -> None:
    reason = jcs_refusal(payload)
    assert reason is not None
    assert reason.startswith(message)
    assert "\n" not in reason
    with pytest.raises(PayloadHashError) as caught:
        new_delivery_requested(
            run_id="r",
            event_type="e",
            channel="webhook",
            recipient="https://example.test/h",
            payload=payload,
            slo_seconds=60,
            producer="p",
        )
    assert str(caught.value) == reason


def test_the_safe_integer_limit_itself_is_hashed() -> None:
    assert jcs_refusal({"n": 2**53 - 1}) is None
    assert jcs_json([2**53 - 1, -(2**53 - 1)]) == b"[9007199254740991,-9007199254740991]"


def test_the_scheme_is_named_by_the_hash() -> None:
    assert scheme_of(payload_hash({"a": 1})) == JCS
    assert scheme_of(hash_under(LEGACY, {"a": 1})) == LEGACY
    with pytest.raises(ValueError, match="not a payload hash"):
        scheme_of("sha256:" + "0" * 64)


def test_a_stored_v2_request_keeps_its_legacy_hash_and_still_verifies() -> None:
    """Written by the code before this change (1.0 and an astral key: the schemes differ)."""
    event = decode((DATA / "delivery_requested_v2.json").read_bytes())
    assert isinstance(event, DeliveryRequested)
    assert event.schema_version == 3
    assert event.payload_hash == "03f118c2550225d5b046c21702efb549b03e953e3dab37b77abf35aa01ceb324"
    assert scheme_of(event.payload_hash) == LEGACY
    assert payload_hash(event.payload) != "jcs-sha256:" + event.payload_hash
    # Tampering is still caught under the scheme the hash names.
    record = json.loads((DATA / "delivery_requested_v2.json").read_bytes())
    record["payload"]["amount"] = 2.0
    with pytest.raises(ValueError, match="payload_hash does not match"):
        decode(json.dumps(record).encode())


def test_a_v3_request_may_not_claim_a_jcs_hash_of_another_payload() -> None:
    request = json.loads(encode(_request({"amount": 1})))
    assert request["schema_version"] == 3
    assert request["payload_hash"].startswith("jcs-sha256:")
    request["payload"] = {"amount": 2}
    with pytest.raises(ValueError, match="payload_hash does not match"):
        decode(json.dumps(request).encode())


def test_a_stored_v1_duplicate_report_is_upcast_as_it_was() -> None:
    event = decode((DATA / "delivery_duplicate_requested_v1.json").read_bytes())
    assert isinstance(event, DuplicateDeliveryRequest)
    assert (event.schema_version, event.outcome) == (2, "conflict")
    assert event.original_payload_hash == (
        "03f118c2550225d5b046c21702efb549b03e953e3dab37b77abf35aa01ceb324"
    )


def _request(payload: Any) -> DeliveryRequested:
    return new_delivery_requested(
        run_id="run-before-jcs",
        event_type="run.succeeded",
        channel="webhook",
        recipient="https://example.test/hook",
        payload=payload,
        slo_seconds=300,
        producer="agent-7",
    )


def _report(stored: DeliveryRequested, again: DeliveryRequested) -> DuplicateDeliveryRequest:
    state = apply(None, stored)
    assert state is not None
    (report,) = on_request(state, again, apply(state, again), T0, CTX)
    assert isinstance(report, DuplicateDeliveryRequest)
    return report


def test_a_request_stored_before_the_upgrade_and_repeated_after_it_is_a_duplicate() -> None:
    before = decode((DATA / "delivery_requested_v2.json").read_bytes())
    assert isinstance(before, DeliveryRequested)
    again = _request(before.payload)
    assert scheme_of(again.payload_hash) == JCS
    report = _report(before, again)
    assert report.outcome == "deduplicated"
    # Both hashes under one scheme, so a reader sees why: equal exactly when deduplicated.
    assert report.payload_hash == report.original_payload_hash == again.payload_hash


def test_a_producer_in_another_language_repeating_it_is_a_duplicate_too() -> None:
    """1.0 is 1 to JavaScript: the repeat carries 1, and JCS says they are the same."""
    before = decode((DATA / "delivery_requested_v2.json").read_bytes())
    assert isinstance(before, DeliveryRequested)
    assert isinstance(before.payload, dict)
    assert _report(before, _request({**before.payload, "amount": 1})).outcome == "deduplicated"


def test_a_changed_payload_is_still_a_conflict_across_the_upgrade() -> None:
    before = decode((DATA / "delivery_requested_v2.json").read_bytes())
    assert isinstance(before, DeliveryRequested)
    assert isinstance(before.payload, dict)
    report = _report(before, _request({**before.payload, "text": "other"}))
    assert report.outcome == "conflict"
    assert report.payload_hash != report.original_payload_hash


def test_hashes_of_one_scheme_are_compared_as_stored() -> None:
    a, b = hash_under(LEGACY, {"x": 1}), hash_under(LEGACY, {"x": 1.0})
    # Before the upgrade these were different payloads; between two old hashes they stay so.
    assert comparable((a, {"x": 1}), (b, {"x": 1.0})) == (a, b)


def test_a_payload_with_no_jcs_form_is_compared_under_the_legacy_scheme() -> None:
    old = {"id": 2**60}
    stored = hash_under(LEGACY, old)
    again = payload_hash({"id": 1})
    first, second = comparable((again, {"id": 1}), (stored, old))
    assert (scheme_of(first), scheme_of(second)) == (LEGACY, LEGACY)
    assert first != second
    assert comparable((stored, old), (hash_under(LEGACY, old), old)) == (stored, stored)


TEXT = st.text(st.characters(exclude_categories=["Cs"]))  # no lone surrogates: JSON's own rule
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def _as_floats(value: Any) -> Any:
    """The same JSON value with its small integers written as floats (1 -> 1.0): equal
    under RFC 8785, different under the legacy ``json.dumps`` hash."""
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else value
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    return {k: _as_floats(v) for k, v in value.items()}


@given(JSON, st.data())
def test_across_schemes_the_verdict_is_jcs_equality(first: Any, data: st.DataObject) -> None:
    """An old hash against a new one: deduplicated exactly when the payloads' RFC 8785 forms
    are equal (whatever order the two come in). The second payload is another value, the
    same one, or the same one with its integers as floats, so both verdicts are reached."""
    how = data.draw(st.sampled_from(["other", "same", "as floats"]), label="second payload")
    if how == "other":
        second = data.draw(JSON, label="another payload")
    else:
        second = first if how == "same" else _as_floats(first)
    old, new = hash_under(LEGACY, first), payload_hash(second)
    a, b = comparable((new, second), (old, first))
    event(f"second payload: {how}")
    event("deduplicated" if a == b else "conflict")
    assert (a == b) == (jcs_json(first) == jcs_json(second))
    b2, a2 = comparable((old, first), (new, second))
    assert (a2, b2) == (a, b)
    assert matches(old, first)
    assert matches(new, second)


def test_the_readme_example_runs() -> None:
    exec(readme_block("payload-hash-example"), {})  # the README's own example
