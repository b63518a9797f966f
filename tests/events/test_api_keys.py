"""API key events: a revocation is final, a key is issued once, tokens parse strictly."""

from __future__ import annotations

from clients.api_keys import new_token
from events.api_keys import (
    ApiKey,
    ApiKeyIssued,
    ApiKeyRevoked,
    decode_api_key_event,
    fold,
    secret_digest,
    split_token,
)
from events.base import utc_now
from events.codec import encode


def test_a_revocation_is_final_and_a_key_is_issued_once() -> None:
    key_id, secret, token = new_token()
    assert split_token(token) == (key_id, secret)
    key = ApiKey(
        key_id=key_id,
        agent="bot",
        secret_sha256=secret_digest(secret),
        issued_at=utc_now(),
        issued_by="op",
    )
    issued = ApiKeyIssued(key=key, producer="op")
    assert decode_api_key_event(encode(issued)) == issued
    assert fold(None, issued).accepts(secret)
    assert not fold(None, issued).accepts(secret[:-1] + ("B" if secret.endswith("A") else "A"))
    revoked_key = ApiKey.model_validate({**key.model_dump(), "revoked_at": utc_now()})
    revoked = ApiKeyRevoked(key=revoked_key, producer="op")
    after = fold(fold(None, issued), revoked)
    assert not after.accepts(secret)
    # Read again from the beginning (or a stale issue record): still revoked.
    assert fold(after, issued) == after
    other = ApiKey.model_validate({**key.model_dump(), "agent": "someone-else"})
    assert fold(fold(None, issued), ApiKeyIssued(key=other, producer="op")).agent == "bot"
    for bad in ("", "dlk_", token + "x", token.replace("dlk_", "dlx_"), "Bearer " + token):
        assert split_token(bad) is None
