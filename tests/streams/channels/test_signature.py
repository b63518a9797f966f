"""Standard Webhooks signing (the adapter over the official library) and the receiver
kit's verification (the library, as a receiver runs it; the simulator verifies with the
kit too), against the spec's published vector."""

import base64
import time
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook

from receiver.verification import SignatureVerifier
from streams.channels.signature import signature_header, signer

# The published Standard Webhooks test vector.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_adapter_reproduces_the_spec_vector() -> None:
    assert signature_header([signer(SecretStr(SECRET))], MSG_ID, TIMESTAMP, BODY) == EXPECTED


def fresh_headers(secret: str, body: bytes = BODY) -> dict[str, str]:
    now = int(time.time())
    return {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(now),
        "webhook-signature": signature_header([signer(SecretStr(secret))], MSG_ID, now, body),
    }


def test_the_kit_accepts_a_fresh_signature_among_several() -> None:
    headers = fresh_headers(SECRET)
    headers["webhook-signature"] = "v1,bm9wZQ== " + headers["webhook-signature"]
    assert SignatureVerifier([SECRET]).problem(headers, BODY, now=time.time()) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"body": b'{"test": 2432232315}'}, "no v1 signature"),
        ({"webhook-id": "msg_other"}, "no v1 signature"),
        ({"webhook-signature": "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}, "no v1"),
        ({"webhook-signature": "v1"}, "malformed"),
        ({"later_s": 301.0}, "tolerance"),
        ({"webhook-timestamp": "soon"}, "integer"),
        ({"webhook-signature": ""}, "missing"),
    ],
)
def test_the_kit_rejects_tampering(change: dict[str, object], reason: str) -> None:
    headers = fresh_headers(SECRET)
    headers.update({k: str(v) for k, v in change.items() if k.startswith("webhook-")})
    body = change.get("body", BODY)
    later_s = change.get("later_s", 0.0)
    assert isinstance(body, bytes)
    assert isinstance(later_s, float)
    now = time.time() + later_s
    problem = SignatureVerifier([SECRET], tolerance_s=300).problem(headers, body, now=now)
    assert problem is not None
    assert reason in problem


def test_secret_parsing_is_the_librarys_and_refusals_never_echo_the_secret() -> None:
    raw = b"a-twenty-six-byte-key-here"  # base64 of 26 bytes ends in one "=": unpadded below
    padded = "whsec_" + base64.b64encode(raw).decode()
    unpadded = padded.rstrip("=")
    assert unpadded != padded
    for secret in (padded, unpadded, padded.removeprefix("whsec_")):
        header = signature_header([signer(SecretStr(secret))], MSG_ID, TIMESTAMP, BODY)
        at = datetime.fromtimestamp(TIMESTAMP, tz=UTC)
        assert header == Webhook(raw).sign(MSG_ID, at, BODY.decode())
    for bad in ("whsec_", "whsec_abcde"):
        with pytest.raises(ValueError, match="webhook secret") as caught:
            signer(SecretStr(bad))
        assert "abcde" not in str(caught.value)


def test_every_active_secret_signs_and_each_verifies_alone() -> None:
    next_secret = "whsec_" + base64.b64encode(b"the-next-secret-24-bytes").decode()
    old, new = SecretStr(SECRET), SecretStr(next_secret)
    now = int(time.time())
    header = signature_header([signer(old), signer(new)], MSG_ID, now, BODY)
    assert header.count("v1,") == 2
    assert " " in header
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(now), "webhook-signature": header}
    for secret in (old, new):
        Webhook(secret.get_secret_value()).verify(BODY, headers)
    with pytest.raises(Exception, match="No matching signature"):
        Webhook("whsec_" + base64.b64encode(b"other").decode()).verify(BODY, headers)
