import pytest

from events.keys import canonical_json, idempotency_key
from events.payload_hashes import LEGACY, hash_under, payload_hash

VECTORS = [
    (
        ("run-1", "run.succeeded", "webhook", "https://example.com/hooks/a"),
        "5546ea07256f5d2867889eb50d3692a94f0c230f72a2f964746c58f6162dca22",
    ),
    (
        (
            "run-2024-07-01/alpha",
            "run.succeeded",
            "provider",
            "https://api.example.test/v1/messages",
        ),
        "05b5bea969f7ec941c00ee70f2aef0147aaec51aa668ff7bbb0abf7663c7a445",
    ),
    (
        ("r", "e", "webhook", "http://127.0.0.1:8080/x?y=1"),
        "557abd54ce50f6c133c5e53b366e15156013429d9c1f7de5db40ee565f2464e7",
    ),
    (
        ("émoji-run", "run.succeeded", "webhook", "https://ex.test/☃"),
        "83190e6b4645c12a19737f4eb215c5e9d31218a799ed6f4faf54990f04558d5e",
    ),
]


@pytest.mark.parametrize(("parts", "expected"), VECTORS)
def test_idempotency_key_vectors(parts: tuple[str, str, str, str], expected: str) -> None:
    assert idempotency_key(*parts) == expected


def test_key_ignores_attempt_and_payload() -> None:
    # The key names the logical event: same run/type/channel/recipient, same key.
    first = idempotency_key("run-1", "run.succeeded", "webhook", "https://example.com/hooks/a")
    assert first == VECTORS[0][1]
    assert (
        idempotency_key("run-1", "run.succeeded", "webhook", "https://example.com/hooks/b") != first
    )


def test_canonical_payload_hash_is_order_independent() -> None:
    a = {"z": "é", "a": [1, 2, {"b": None}]}
    b = {"a": [1, 2, {"b": None}], "z": "é"}
    assert canonical_json(a) == '{"a":[1,2,{"b":null}],"z":"é"}'.encode()
    assert payload_hash(a) == payload_hash(b)
    assert payload_hash({"a": [2, 1]}) != payload_hash({"a": [1, 2]})


def test_the_legacy_hash_is_derived_as_before() -> None:
    # The unprefixed hashes records carry from before RFC 8785: the same bytes as ever.
    a = {"z": "é", "a": [1, 2, {"b": None}]}
    assert hash_under(LEGACY, a) == (
        "acc111d72d2ccd251eccb977745481920ebd09afbda7d5430b83359d2d799a1e"
    )
    # Here JCS and the sorted-key JSON agree byte for byte; only the prefix differs.
    assert payload_hash(a) == "jcs-sha256:" + hash_under(LEGACY, a)


def test_canonical_json_refuses_nan() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        canonical_json({"x": float("nan")})
