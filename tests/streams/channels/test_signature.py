"""Standard Webhooks signing (adapter) and verification (simulator) against the spec's vector."""

import pytest

from ledger.simulator.verify import verify_signature
from streams.channels.signature import secret_key, sign

# The published Standard Webhooks test vector.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_adapter_reproduces_the_spec_vector() -> None:
    assert sign(secret_key(SECRET), MSG_ID, TIMESTAMP, BODY) == EXPECTED


def test_simulator_accepts_the_spec_vector_among_several_signatures() -> None:
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TIMESTAMP),
        "webhook-signature": f"v1,bm9wZQ== {EXPECTED}",
    }
    assert verify_signature(SECRET, headers, BODY, now=TIMESTAMP, tolerance_s=300) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"body": b'{"test": 2432232315}'}, "no v1 signature"),
        ({"webhook-id": "msg_other"}, "no v1 signature"),
        ({"webhook-signature": EXPECTED.replace("v1,", "v2,")}, "no v1 signature"),
        ({"now": TIMESTAMP + 301}, "tolerance"),
        ({"webhook-timestamp": "soon"}, "integer"),
        ({"webhook-signature": ""}, "missing"),
    ],
)
def test_simulator_rejects_tampering(change: dict[str, object], reason: str) -> None:
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TIMESTAMP),
        "webhook-signature": EXPECTED,
    }
    headers.update({k: str(v) for k, v in change.items() if k.startswith("webhook-")})
    body = change.get("body", BODY)
    now = change.get("now", TIMESTAMP)
    assert isinstance(body, bytes)
    assert isinstance(now, int)
    problem = verify_signature(SECRET, headers, body, now=now, tolerance_s=300)
    assert problem is not None
    assert reason in problem


def test_secret_key_decodes_with_or_without_prefix_and_refuses_garbage() -> None:
    assert secret_key(SECRET) == secret_key(SECRET.removeprefix("whsec_"))
    with pytest.raises(ValueError, match="base64"):
        secret_key("whsec_not base64!")
